//! `make bench-stateful`: the StatefulSet controller under kube-controller-manager and under
//! Switchyard, each run on a fresh control plane (etcd, kube-apiserver, kube-scheduler, kwok
//! with 25 Nodes). Both sides run the same controllers (the benchmarks' shared set,
//! `support::Controllers`), with the same client limits per controller.
//!
//! - `statefulset.ordered_100x10_kcm`, `statefulset.ordered_100x10_sy1` (s): 100
//!   StatefulSets (`SWITCHYARD_BENCH_STATEFULSETS`) of 10 `OrderedReady` Pods, created
//!   together: from the first create until every one reports 10 ready replicas; under
//!   kube-controller-manager (its 5 StatefulSet workers, the default) and one Switchyard
//!   reconciler (10 reconciles at a time); `statefulset.ordered_100x10_<side>_writes_per_set`
//!   (requests): the controller's object writes until then (Pods, ControllerRevisions, the
//!   status), as the apiserver counts them (2xx), per StatefulSet.
//!
//! Each subject runs once per round, the order reversed every other round
//! (`SWITCHYARD_BENCH_ROUNDS`, 2 by default); each figure is the median.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use switchyard_k8s::{Api, k8s_openapi::api::apps::v1::StatefulSet, kube::api::ListParams};

use crate::support::{
    Controllers, Request, Under, apiserver_requests, between, create_all, env_count,
    plane_with_namespace, print_ratios, requests_by_name,
};

const NODES: usize = 25;
const NAMESPACE: &str = "bench";
const REPLICAS: i32 = 10;
const READY_TIMEOUT: Duration = Duration::from_secs(1800);

fn stateful_set(name: &str) -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": REPLICAS,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "db", "image": "registry.example/db:1"}]},
            },
        },
    }))
    .unwrap()
}

/// A write of the StatefulSet controller's: Pods created, updated and deleted,
/// ControllerRevisions, the status; not the benchmark's creates, the scheduler's bindings or
/// kwok's Pod status.
fn statefulset_controller_write(r: &Request) -> bool {
    matches!(r.verb.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
        && r.code.starts_with('2')
        && matches!(
            (r.resource.as_str(), r.subresource.as_str()),
            ("pods" | "controllerrevisions", "") | ("statefulsets", "status")
        )
}

/// Seconds from the first create until every StatefulSet has all its replicas ready.
async fn ordered(name: &str, under: Under, count: usize) -> f64 {
    let (plane, client) = plane_with_namespace(NODES, NAMESPACE).await;
    let controllers = Controllers::start(&plane, under).await;
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), NAMESPACE);
    let before = apiserver_requests(&client).await;
    let start = Instant::now();
    create_all(&api, count, |i| stateful_set(&format!("s{i:03}"))).await;
    loop {
        let list = api.list(&ListParams::default()).await.unwrap();
        let ready = list
            .items
            .iter()
            .filter(|s| {
                s.status
                    .as_ref()
                    .is_some_and(|st| st.ready_replicas == Some(REPLICAS))
            })
            .count();
        if ready == count {
            break;
        }
        assert!(
            start.elapsed() < READY_TIMEOUT,
            "{under:?}: {ready} of {count} StatefulSets ready after {READY_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let took = start.elapsed().as_secs_f64();
    eprintln!("{name}: {count} StatefulSets of {REPLICAS} ready after {took:.1} s");
    let writes = requests_by_name(
        &between(&before, &apiserver_requests(&client).await),
        statefulset_controller_write,
    );
    eprintln!("{name}: writes until ready: {writes:?}");
    let objects: f64 = writes.values().sum();
    println!(
        "bench statefulset.{name}_writes_per_set {:.1} requests",
        objects / count as f64
    );
    controllers.stop().await;
    plane.stop();
    took
}

const RUNS: [(&str, Under); 2] = [
    ("ordered_100x10_kcm", Under::KCM),
    ("ordered_100x10_sy1", Under::switchyard(1, 0)),
];

const RATIOS: [(&str, &str, &str); 1] = [(
    "ordered_sy1_vs_kcm",
    "ordered_100x10_sy1",
    "ordered_100x10_kcm",
)];

async fn run() {
    let sets = env_count("SWITCHYARD_BENCH_STATEFULSETS", 100);
    eprintln!("{sets} StatefulSets of {REPLICAS} per run");
    let took = switchyard_testenv::compare("statefulset", &RUNS, "s", |name, under| {
        ordered(name, under, sets)
    })
    .await;
    for (name, seconds) in &took {
        println!("bench statefulset.{name} {seconds:.1} s");
    }
    print_ratios("statefulset", &took, &RATIOS);
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run());
}
