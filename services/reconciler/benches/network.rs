//! `make bench-network`: the EndpointSlice controller under kube-controller-manager and under
//! Switchyard, each run on a fresh control plane (etcd, kube-apiserver, kube-scheduler, kwok
//! with 50 Nodes). Both sides run the same controllers (`support::Controllers`: the
//! EndpointSlice, Endpoints and mirroring controllers among them), with the same client
//! limits per controller. Pods are placed on their Nodes by the benchmark; kwok gives them
//! IPs and readiness.
//!
//! - `network.churn_p99_<side>` (s): 200 Services over 5,000 Pods (25 each); once every
//!   Service's slices list its Pods ready, 2,000 Pods (`SWITCHYARD_BENCH_FLIPS`) turn
//!   unready, one every 40 ms: p99 of the delay from each Pod's status write until its
//!   Service's slice shows it not ready, as the apiserver's watch tells (a flip never shown
//!   within 120 s counts at that). `network.churn_writes_per_flip_<side>` (requests): the
//!   EndpointSlice writes the apiserver took (2xx) meanwhile, per flip. Sides:
//!   kube-controller-manager (its 5 EndpointSlice workers, the default), one Switchyard
//!   reconciler and four (`sy1`, `sy4`; 10 reconciles at a time each).
//! - `network.big_service_<side>` (s): one Service, then 5,000 Pods created for it: from the
//!   first Pod until its slices list all 5,000 ready. `network.big_service_writes_<side>`
//!   (requests): the EndpointSlice writes meanwhile.
//!
//! Each subject runs once per round, the order reversed every other round
//! (`SWITCHYARD_BENCH_ROUNDS`, 2 by default); each figure is the median of its rounds, the
//! writes printed per run. `SWITCHYARD_BENCH_NETWORK=churn` (or `big`) runs one half alone.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use switchyard_k8s::{
    Api, Pod,
    k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice},
    kube::api::{ListParams, Patch, PatchParams, WatchEvent, WatchParams},
};

use crate::support::{
    Controllers, Request, Under, apiserver_requests, between, create_all, env_count,
    plane_with_namespace, print_ratios, requests_by_name,
};

const NAMESPACE: &str = "bench";
const NODES: usize = 50;
const SERVICES: usize = 200;
const PODS: usize = 5000;
const FLIP_EVERY: Duration = Duration::from_millis(40);
const SHOWN_WITHIN: Duration = Duration::from_secs(120);
/// The slowest flips each run names on stderr, with when they began.
const SLOWEST_SHOWN: usize = 12;
const TIMEOUT: Duration = Duration::from_secs(900);
const SLICES_OF: &str = "endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io";

fn service(name: &str, app: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"selector": {"app": app}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }))
    .unwrap()
}

fn pod(name: &str, app: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.example/web:1",
                            "ports": [{"name": "http", "containerPort": 8080}]}],
        },
    }))
    .unwrap()
}

/// A write of an EndpointSlice, taken (2xx).
fn slice_write(r: &Request) -> bool {
    matches!(r.verb.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
        && r.code.starts_with('2')
        && r.resource == "endpointslices"
}

/// Ready endpoints per Service, over the namespace's slices.
async fn ready_per_service(api: &Api<EndpointSlice>) -> BTreeMap<String, usize> {
    let mut ready = BTreeMap::new();
    for slice in api
        .list(&ListParams::default().labels(SLICES_OF))
        .await
        .unwrap()
        .items
    {
        let service = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"))
            .cloned()
            .unwrap_or_default();
        let count = slice
            .endpoints
            .iter()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
            .count();
        *ready.entry(service).or_default() += count;
    }
    ready
}

/// Waits until `services` Services each list `each` ready endpoints.
async fn all_listed(
    api: &Api<EndpointSlice>,
    services: usize,
    each: usize,
    what: &str,
    start: Instant,
) {
    loop {
        let ready = ready_per_service(api).await;
        let done = ready.values().filter(|n| **n == each).count();
        if done == services {
            return;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "{what}: {done} of {services} Services listed after {TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn nodes_of(plane: &switchyard_testenv::ControlPlane) -> Vec<String> {
    plane.nodes().to_vec()
}

/// The flips not yet shown, by Pod: when its status was written.
type Pending = Arc<Mutex<HashMap<String, Instant>>>;

/// Follows the namespace's slices: a flipped Pod listed not ready counts as shown.
/// A flip shown: when it began, and its delay, in seconds; its Pod.
type Shown = Arc<Mutex<Vec<(Instant, f64, String)>>>;

async fn follow(api: Api<EndpointSlice>, pending: Pending, shown: Shown) {
    let version = api
        .list_metadata(&ListParams::default().limit(1))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default().timeout(290), &version)
        .await
        .unwrap()
        .boxed();
    tokio::spawn(async move {
        while let Ok(Some(event)) = stream.try_next().await {
            let (WatchEvent::Added(slice) | WatchEvent::Modified(slice)) = event else {
                continue;
            };
            let now = Instant::now();
            let mut pending = pending.lock().unwrap();
            for endpoint in &slice.endpoints {
                let ready = endpoint.conditions.as_ref().and_then(|c| c.ready);
                let Some(name) = endpoint.target_ref.as_ref().and_then(|t| t.name.as_ref()) else {
                    continue;
                };
                if ready == Some(false)
                    && let Some(at) = pending.remove(name)
                {
                    shown.lock().unwrap().push((
                        at,
                        now.duration_since(at).as_secs_f64(),
                        name.clone(),
                    ));
                }
            }
        }
    });
}

/// p99 of the seconds from a Pod turning unready until its slice shows it.
async fn churn(name: &str, under: Under, flips: usize) -> f64 {
    let (plane, client) = plane_with_namespace(NODES, NAMESPACE).await;
    let controllers = Controllers::start(&plane, under).await;
    let nodes = nodes_of(&plane);
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NAMESPACE);
    let start = Instant::now();
    create_all(&services, SERVICES, |i| {
        service(&format!("s{i}"), &format!("a{i}"))
    })
    .await;
    create_all(&pods, PODS, |i| {
        pod(
            &format!("p{i}"),
            &format!("a{}", i % SERVICES),
            &nodes[i % nodes.len()],
        )
    })
    .await;
    all_listed(&slices, SERVICES, PODS / SERVICES, name, start).await;
    eprintln!(
        "{name}: {SERVICES} Services over {PODS} Pods listed in {:.1} s",
        start.elapsed().as_secs_f64()
    );

    let pending: Pending = Arc::default();
    let shown: Shown = Arc::default();
    follow(slices.clone(), pending.clone(), shown.clone()).await;
    let flipping = Instant::now();
    let before = apiserver_requests(&client).await;
    let mut tick = tokio::time::interval(FLIP_EVERY);
    let unready = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    for i in 0..flips {
        tick.tick().await;
        // Spread over the Services: Pod i*k for a k prime to their count.
        let pod = format!("p{}", (i * 7) % PODS);
        pending.lock().unwrap().insert(pod.clone(), Instant::now());
        pods.patch_status(
            &pod,
            &PatchParams::default(),
            &Patch::Strategic(unready.clone()),
        )
        .await
        .unwrap();
    }
    let deadline = Instant::now() + SHOWN_WITHIN;
    while !pending.lock().unwrap().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Let the last writes land before counting them.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes: f64 = requests_by_name(
        &between(&before, &apiserver_requests(&client).await),
        slice_write,
    )
    .values()
    .sum();
    let mut slowest = shown.lock().unwrap().clone();
    slowest.sort_by(|a, b| b.1.total_cmp(&a.1));
    // Where the tail is: the slowest flips, when they began.
    for (at, delay, pod) in slowest.iter().take(SLOWEST_SHOWN) {
        eprintln!(
            "{name}: slow flip of {pod} {:.1} s in: {:.0} ms",
            at.duration_since(flipping).as_secs_f64(),
            delay * 1e3
        );
    }
    let mut delays: Vec<f64> = slowest.iter().map(|s| s.1).collect();
    let missed = pending.lock().unwrap().len();
    // Never shown within the bound: counted at it.
    delays.extend(std::iter::repeat_n(SHOWN_WITHIN.as_secs_f64(), missed));
    delays.sort_by(f64::total_cmp);
    let p = |q: f64| delays[((delays.len() as f64 * q).ceil() as usize).saturating_sub(1)];
    eprintln!(
        "{name}: {flips} flips: p50 {:.3} s, p99 {:.3} s, max {:.3} s, {missed} not shown, {writes} slice writes",
        p(0.5),
        p(0.99),
        delays.last().copied().unwrap_or_default()
    );
    println!(
        "bench network.churn_writes_per_flip_{} {:.2} requests",
        side(name),
        writes / flips as f64
    );
    controllers.stop().await;
    plane.stop();
    p(0.99)
}

/// Seconds from the first of 5,000 Pods until one Service's slices list them all.
async fn big_service(name: &str, under: Under) -> f64 {
    let (plane, client) = plane_with_namespace(NODES, NAMESPACE).await;
    let controllers = Controllers::start(&plane, under).await;
    let nodes = nodes_of(&plane);
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NAMESPACE);
    create_all(&services, 1, |_| service("big", "big")).await;
    all_listed(&slices, 1, 0, name, Instant::now()).await;
    let before = apiserver_requests(&client).await;
    let start = Instant::now();
    create_all(&pods, PODS, |i| {
        pod(&format!("p{i}"), "big", &nodes[i % nodes.len()])
    })
    .await;
    all_listed(&slices, 1, PODS, name, start).await;
    let took = start.elapsed().as_secs_f64();
    let writes: f64 = requests_by_name(
        &between(&before, &apiserver_requests(&client).await),
        slice_write,
    )
    .values()
    .sum();
    let count = slices
        .list(&ListParams::default().labels(SLICES_OF))
        .await
        .unwrap()
        .items
        .len();
    eprintln!(
        "{name}: {PODS} Pods listed in {took:.1} s over {count} slices, {writes} slice writes"
    );
    println!(
        "bench network.big_service_writes_{} {writes} requests",
        side(name)
    );
    controllers.stop().await;
    plane.stop();
    took
}

/// `kcm` of `churn_p99_kcm`.
fn side(name: &str) -> &str {
    name.rsplit('_').next().unwrap_or(name)
}

const CHURNS: [(&str, Under); 3] = [
    ("churn_p99_kcm", Under::KCM),
    ("churn_p99_sy1", Under::switchyard(1, 0)),
    ("churn_p99_sy4", Under::switchyard(4, 0)),
];

const BIGS: [(&str, Under); 2] = [
    ("big_service_kcm", Under::KCM),
    ("big_service_sy1", Under::switchyard(1, 0)),
];

const RATIOS: [(&str, &str, &str); 3] = [
    ("churn_kcm_vs_sy1", "churn_p99_kcm", "churn_p99_sy1"),
    ("churn_sy1_vs_sy4", "churn_p99_sy1", "churn_p99_sy4"),
    (
        "big_service_kcm_vs_sy1",
        "big_service_kcm",
        "big_service_sy1",
    ),
];

async fn run() {
    let flips = env_count("SWITCHYARD_BENCH_FLIPS", 2000);
    let only = std::env::var("SWITCHYARD_BENCH_NETWORK").unwrap_or_default();
    eprintln!("{SERVICES} Services over {PODS} Pods on {NODES} Nodes, {flips} flips per run");
    let mut measured = BTreeMap::new();
    if only != "big" {
        measured.extend(
            switchyard_testenv::compare("network", &CHURNS, "s", |name, under| {
                churn(name, under, flips)
            })
            .await,
        );
    }
    if only != "churn" {
        measured.extend(
            switchyard_testenv::compare("network", &BIGS, "s", |name, under| {
                big_service(name, under)
            })
            .await,
        );
    }
    for (name, seconds) in &measured {
        println!("bench network.{name} {seconds:.3} s");
    }
    print_ratios("network", &measured, &RATIOS);
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run());
}
