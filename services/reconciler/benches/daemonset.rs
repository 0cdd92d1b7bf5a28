//! `make bench-stateful` (its DaemonSet half): the DaemonSet controller under
//! kube-controller-manager and under Switchyard, each run on a fresh control plane (etcd,
//! kube-apiserver, kube-scheduler, kwok with `SWITCHYARD_BENCH_NODES` Nodes, 1,000 by
//! default). Both sides run the same controllers (`support::Controllers`), with the same
//! client limits per controller.
//!
//! - `daemonset.rollout_1k_nodes_<side>` (s): 5 DaemonSets (`maxUnavailable: 10%`) created
//!   and, once every one is available on every Node, given a new image: from the new image
//!   until every one reports every Node updated and available. `…_create` (s): from the
//!   first create until every one is available. `…_writes_per_set` (requests): the
//!   controller's object writes over both phases (Pods, ControllerRevisions, the status), as
//!   the apiserver counts them (2xx), per DaemonSet. Sides: kube-controller-manager (its 2
//!   DaemonSet workers, the default), one Switchyard reconciler (10 reconciles at a time),
//!   and one and four reconcilers whose reconciles each wait 50 ms more, one at a time
//!   (`sy1_50ms`, `sy4_50ms`).
//! - `daemonset.node_churn_p99_<side>` (s): with the 5 DaemonSets available on every Node,
//!   100 Nodes added and 100 taken out of the DaemonSets' node selector (relabelled),
//!   alternately, 10 a second: p99 of the delay from each Node's change until every
//!   DaemonSet has created its Pod for it (or marked its Pod there for deletion), as the
//!   apiserver's watch tells. A Node is relabelled rather than deleted: the Pods of a deleted
//!   Node are the pod garbage collector's, after its 40 s quarantine, on both sides.
//!
//! Each subject runs once per round, the order reversed every other round
//! (`SWITCHYARD_BENCH_ROUNDS`, 2 by default); each figure is the median.
//! `SWITCHYARD_BENCH_DAEMONSET=rollout` (or `churn`) runs one half alone.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use switchyard_k8s::Pod;
use switchyard_k8s::{
    Api, Client, PostParams,
    k8s_openapi::api::{apps::v1::DaemonSet, core::v1::Node},
    kube::api::{ListParams, Patch, PatchParams, WatchEvent, WatchParams},
};
use switchyard_reconciler_core::daemonset::target_node;

use crate::support::{
    Controllers, Request, Under, apiserver_requests, between, create_all, env_count,
    plane_with_namespace, print_ratios, print_timings, requests_by_name,
};

const NAMESPACE: &str = "bench";
const SETS: usize = 5;
const CHURN: usize = 100;
const CHURN_EVERY: Duration = Duration::from_millis(100);
const TIMEOUT: Duration = Duration::from_secs(1800);

fn daemon_set(name: &str) -> DaemonSet {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {"type": "kwok"},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "agent", "image": "registry.example/agent:1"}],
                },
            },
        },
    }))
    .unwrap()
}

/// A write of the DaemonSet controller's: Pods created, patched and deleted,
/// ControllerRevisions, the status; not the benchmark's writes, the scheduler's bindings or
/// kwok's Pod status.
fn daemonset_controller_write(r: &Request) -> bool {
    matches!(r.verb.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
        && r.code.starts_with('2')
        && matches!(
            (r.resource.as_str(), r.subresource.as_str()),
            ("pods" | "controllerrevisions", "") | ("daemonsets", "status")
        )
}

/// Waits until every DaemonSet reports `nodes` Nodes updated and available at its
/// generation.
async fn all_available(api: &Api<DaemonSet>, nodes: i32, what: &str, start: Instant) {
    loop {
        let list = api.list(&ListParams::default()).await.unwrap();
        let done = list
            .items
            .iter()
            .filter(|ds| {
                let s = ds.status.clone().unwrap_or_default();
                s.observed_generation == ds.metadata.generation
                    && s.desired_number_scheduled == nodes
                    && s.updated_number_scheduled == Some(nodes)
                    && s.number_available == Some(nodes)
            })
            .count();
        if done == SETS {
            return;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "{what}: {done} of {SETS} DaemonSets done after {TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Seconds from the new image until every DaemonSet is rolled out.
async fn rollout(name: &str, under: Under, nodes: usize) -> f64 {
    let (plane, client) = plane_with_namespace(nodes, NAMESPACE).await;
    let controllers = Controllers::start(&plane, under).await;
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    let before = apiserver_requests(&client).await;
    let start = Instant::now();
    create_all(&api, SETS, |i| daemon_set(&format!("d{i}"))).await;
    let nodes = i32::try_from(nodes).unwrap();
    all_available(&api, nodes, name, start).await;
    let created = start.elapsed().as_secs_f64();
    println!("bench daemonset.{name}_create {created:.1} s");
    let start = Instant::now();
    for i in 0..SETS {
        let image = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "agent", "image": "registry.example/agent:2"}
        ]}}}});
        api.patch(
            &format!("d{i}"),
            &PatchParams::default(),
            &Patch::Merge(image),
        )
        .await
        .unwrap();
    }
    all_available(&api, nodes, name, start).await;
    let took = start.elapsed().as_secs_f64();
    eprintln!(
        "{name}: {SETS} DaemonSets on {nodes} Nodes created in {created:.1} s, rolled out in {took:.1} s"
    );
    let writes = requests_by_name(
        &between(&before, &apiserver_requests(&client).await),
        daemonset_controller_write,
    );
    eprintln!("{name}: writes: {writes:?}");
    let objects: f64 = writes.values().sum();
    println!(
        "bench daemonset.{name}_writes_per_set {:.1} requests",
        objects / SETS as f64
    );
    controllers.stop().await;
    plane.stop();
    took
}

/// When each Node was changed, and when each DaemonSet acted on it.
#[derive(Default)]
struct Churn {
    changed: HashMap<String, Instant>,
    /// Node -> the DaemonSets that acted on it, and when the last one did.
    acted: HashMap<String, (BTreeMap<String, Instant>, bool)>,
}

/// Follows the namespace's Pods: a Pod created for a Node added, or one marked for deletion
/// on a Node taken out, counts as its DaemonSet acting on that Node.
async fn follow(pods: Api<Pod>, churn: Arc<Mutex<Churn>>) {
    let version = pods
        .list_metadata(&ListParams::default().limit(1))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = pods
        .watch(&WatchParams::default().timeout(290), &version)
        .await
        .unwrap()
        .boxed();
    tokio::spawn(async move {
        while let Ok(Some(event)) = stream.try_next().await {
            let (pod, added) = match event {
                WatchEvent::Added(pod) => (pod, true),
                WatchEvent::Modified(pod) if pod.metadata.deletion_timestamp.is_some() => {
                    (pod, false)
                }
                WatchEvent::Deleted(pod) => (pod, false),
                _ => continue,
            };
            let Some(node) = target_node(&pod).map(str::to_owned) else {
                continue;
            };
            let set = pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app"))
                .cloned()
                .unwrap_or_default();
            let mut churn = churn.lock().unwrap();
            if !churn.changed.contains_key(&node) {
                continue;
            }
            let entry = churn.acted.entry(node).or_default();
            entry.1 = added;
            entry.0.entry(set).or_insert_with(Instant::now);
        }
    });
}

/// p99 of the seconds from each Node's change until every DaemonSet acted on it.
async fn node_churn(name: &str, under: Under, nodes: usize) -> f64 {
    let (plane, client) = plane_with_namespace(nodes, NAMESPACE).await;
    let controllers = Controllers::start(&plane, under).await;
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    let start = Instant::now();
    create_all(&api, SETS, |i| daemon_set(&format!("d{i}"))).await;
    all_available(&api, i32::try_from(nodes).unwrap(), name, start).await;

    let churn = Arc::new(Mutex::new(Churn::default()));
    follow(Api::namespaced(client.clone(), NAMESPACE), churn.clone()).await;
    let before = controllers.timings().await;
    let node_api: Api<Node> = Api::all(client.clone());
    let existing: Vec<String> = plane.nodes().to_vec();
    let mut tick = tokio::time::interval(CHURN_EVERY);
    let churned = CHURN.min(existing.len());
    for i in 0..churned * 2 {
        tick.tick().await;
        if i % 2 == 0 {
            let node = format!("churn-{}", i / 2);
            churn
                .lock()
                .unwrap()
                .changed
                .insert(node.clone(), Instant::now());
            kwok_node(&client, &node).await;
        } else {
            let node = existing[i / 2].clone();
            churn
                .lock()
                .unwrap()
                .changed
                .insert(node.clone(), Instant::now());
            node_api
                .patch(
                    &node,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"type": "gone"}}})),
                )
                .await
                .unwrap();
        }
    }
    // Every Node acted on by every DaemonSet, or the deadline.
    let deadline = Instant::now() + Duration::from_secs(300);
    let delays: Vec<f64> = loop {
        let done = {
            let churn = churn.lock().unwrap();
            let complete = churn
                .changed
                .keys()
                .filter(|n| {
                    churn
                        .acted
                        .get(*n)
                        .is_some_and(|(sets, _)| sets.len() == SETS)
                })
                .count();
            if complete == churn.changed.len() || Instant::now() >= deadline {
                Some(
                    churn
                        .changed
                        .iter()
                        .map(|(node, at)| match churn.acted.get(node) {
                            Some((sets, _)) if sets.len() == SETS => sets
                                .values()
                                .max()
                                .unwrap()
                                .duration_since(*at)
                                .as_secs_f64(),
                            // Never acted on within the deadline: counted at the deadline.
                            _ => deadline.duration_since(*at).as_secs_f64(),
                        })
                        .collect(),
                )
            } else {
                None
            }
        };
        if let Some(delays) = done {
            break delays;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let mut sorted = delays.clone();
    sorted.sort_by(f64::total_cmp);
    let p = |q: f64| sorted[((sorted.len() as f64 * q).ceil() as usize).saturating_sub(1)];
    eprintln!(
        "{name}: {} Node changes: p50 {:.2} s, p99 {:.2} s, max {:.2} s",
        sorted.len(),
        p(0.5),
        p(0.99),
        sorted.last().copied().unwrap_or_default()
    );
    print_timings("churn", &controllers.timings().await, &before);
    controllers.stop().await;
    plane.stop();
    p(0.99)
}

/// A Node kwok plays the kubelet for, matching the DaemonSets' node selector.
async fn kwok_node(client: &Client, name: &str) {
    let node: Node = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "type": "kwok"},
        },
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "250"},
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "250"},
        },
    }))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

const ROLLOUTS: [(&str, Under); 4] = [
    ("rollout_1k_nodes_kcm", Under::KCM),
    ("rollout_1k_nodes_sy1", Under::switchyard(1, 0)),
    ("rollout_1k_nodes_sy1_50ms", Under::switchyard(1, 50)),
    ("rollout_1k_nodes_sy4_50ms", Under::switchyard(4, 50)),
];

const CHURNS: [(&str, Under); 2] = [
    ("node_churn_p99_kcm", Under::KCM),
    ("node_churn_p99_sy1", Under::switchyard(1, 0)),
];

const RATIOS: [(&str, &str, &str); 3] = [
    (
        "rollout_kcm_vs_sy1",
        "rollout_1k_nodes_kcm",
        "rollout_1k_nodes_sy1",
    ),
    (
        "rollout_sy1_vs_sy4_50ms",
        "rollout_1k_nodes_sy1_50ms",
        "rollout_1k_nodes_sy4_50ms",
    ),
    (
        "node_churn_kcm_vs_sy1",
        "node_churn_p99_kcm",
        "node_churn_p99_sy1",
    ),
];

async fn run() {
    let nodes = env_count("SWITCHYARD_BENCH_NODES", 1000);
    // `rollout` or `churn` runs one half alone.
    let only = std::env::var("SWITCHYARD_BENCH_DAEMONSET").unwrap_or_default();
    eprintln!("{SETS} DaemonSets on {nodes} Nodes per run");
    let mut took = BTreeMap::new();
    if only != "churn" {
        took.extend(
            switchyard_testenv::compare("daemonset", &ROLLOUTS, "s", |name, under| {
                rollout(name, under, nodes)
            })
            .await,
        );
    }
    if only != "rollout" {
        took.extend(
            switchyard_testenv::compare("daemonset", &CHURNS, "s", |name, under| {
                node_churn(name, under, nodes)
            })
            .await,
        );
    }
    for (name, seconds) in &took {
        println!("bench daemonset.{name} {seconds:.2} s");
    }
    print_ratios("daemonset", &took, &RATIOS);
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run());
}
