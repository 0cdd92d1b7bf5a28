//! `make bench-e2e`: Deployments converged end to end, under kube-controller-manager and under
//! Switchyard, each run on a fresh control plane (etcd, kube-apiserver, kube-scheduler, kwok
//! with 10 Nodes).
//!
//! A run creates 500 Deployments of 4 replicas (2,000 Pods; `SWITCHYARD_BENCH_DEPLOYMENTS`
//! changes the count) and measures from the first create until every Deployment is Available
//! with all its replicas updated and available. Both sides run the same four controllers:
//! Deployment, ReplicaSet, the garbage collector (with its graph of every deletable resource)
//! and Namespace. Every controller process gets the same client limits (`--kube-api-qps=100
//! --kube-api-burst=200`), which apply per controller on both sides: kube-controller-manager
//! builds a clientset, and so a limiter, for each controller (also with
//! `--use-service-account-credentials=false`, which it runs with here), as a reconciler
//! builds a client for each of its controllers.
//!
//! - `e2e.kcm_converge` (s): kube-controller-manager with those four controllers (5 workers
//!   each for Deployments and ReplicaSets, its defaults);
//! - `e2e.sy1_converge`, `e2e.sy2_converge`, `e2e.sy4_converge` (s): Switchyard with 1, 2 and
//!   4 reconciler processes (a queue and a watcher in this process), in plaintext
//!   (`--insecure-plaintext`) so that they compare with the figures measured before mutual TLS;
//! - `e2e.sy1_converge_mtls` (s): `sy1_converge` with mutual TLS between the services, the
//!   shipped default, run right after it; `e2e.sy1_mtls_vs_plaintext` is the ratio of the two;
//! - `e2e.sy1_converge_slow`, `e2e.sy4_converge_slow` (s): the same with every reconcile
//!   waiting 20 ms first, as if it called an external system (`--simulated-latency`), and one
//!   reconcile at a time per replica (`--concurrency=1`);
//! - `e2e.sy1_converge_slow50`, `e2e.sy4_converge_slow50` (s): the same at 50 ms, where one
//!   replica's time stays above the control plane's floor even divided by four;
//! - `e2e.sy1_vs_kcm`, `e2e.sy4_vs_sy1_slow` and `e2e.sy4_vs_sy1_slow50` (ratios): time against
//!   kube-controller-manager, and the speed-up of 4 reconcilers over 1 with slow reconciles.
//!
//! - `e2e.<run>_object_writes` (requests): the controllers' writes until convergence, as the
//!   apiserver counts them (`apiserver_request_total`, 2xx): Pods, ReplicaSets and their
//!   status, Deployment updates and status, not the benchmark's own creates, the scheduler's
//!   bindings or kwok's Pod status; `e2e.<run>_event_writes`, their Event writes once settled.
//!   The breakdown by resource and verb goes to stderr.
//! - `e2e.<run>_controllers_cpu` (s): CPU time used until convergence by the controller
//!   processes (kube-controller-manager, or the reconcilers) and by this process, which holds
//!   the benchmark's client in every run and Switchyard's queue and watcher in Switchyard's;
//!   `e2e.<run>_plane_cpu` (s): by the control plane (etcd, kube-apiserver, kube-scheduler,
//!   kwok). On this 2-core machine the two share 2 CPU-seconds per second.
//!   `e2e.<run>_bench_process_cpu` (s) is this process's part of the first.
//!
//! `SWITCHYARD_BENCH_RUNS=sy1_converge,kcm_converge` runs only the named measurements;
//! `SWITCHYARD_BENCH_WATCHER_CONFIG=<file>` runs the watcher with that configuration instead
//! of the shipped one (deploy/kustomize/base/watcher-config.yaml).

#![allow(clippy::unwrap_used)]

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

use clap::Parser;
use futures::{StreamExt, stream};
use serde_json::json;
use switchyard_k8s::{
    Api, Deployment, Namespace, PostParams,
    k8s_openapi::api::core::v1::{Event, ServiceAccount},
    kube::api::ListParams,
};
use switchyard_runtime::Role;
use switchyard_testenv::{
    ControlPlane, ControlPlaneOptions, InProcess, Pki, ServiceProcess, manifests,
};

const REPLICAS: i32 = 4;
const NODES: usize = 10;
const NAMESPACE: &str = "bench";
const CLIENT_LIMITS: [&str; 2] = ["--kube-api-qps=100", "--kube-api-burst=200"];
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(900);
/// The shipped watcher configuration: what the built-in controllers watch.
const WATCHER_CONFIG: &str = include_str!("../../../deploy/kustomize/base/watcher-config.yaml");
const CONTROLLERS: &str = "apps/v1/ReplicaSet,apps/v1/Deployment,garbage-collector,v1/Namespace";
/// How long after convergence the Events are counted: both controllers write them in the
/// background, kube-controller-manager's a few seconds behind.
const EVENTS_SETTLE: Duration = Duration::from_secs(15);

#[derive(Clone, Copy, Debug)]
enum Under {
    ControllerManager,
    Switchyard {
        reconcilers: usize,
        latency_ms: u64,
        /// Mutual TLS between the services (the default); plaintext otherwise.
        mtls: bool,
    },
}

impl Under {
    /// In plaintext, as every figure before mutual TLS was measured, so they compare.
    const fn switchyard(reconcilers: usize, latency_ms: u64) -> Self {
        Self::Switchyard {
            reconcilers,
            latency_ms,
            mtls: false,
        }
    }

    const fn switchyard_mtls(reconcilers: usize) -> Self {
        Self::Switchyard {
            reconcilers,
            latency_ms: 0,
            mtls: true,
        }
    }
}

/// The flags that give a service `role`'s certificate, or plaintext.
fn security(mtls: bool, role: Role) -> Vec<String> {
    if mtls {
        Pki::shared().flags(role)
    } else {
        vec!["--insecure-plaintext".to_owned()]
    }
}

fn deployments() -> usize {
    std::env::var("SWITCHYARD_BENCH_DEPLOYMENTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(500)
}

fn deployment(name: &str) -> Deployment {
    manifests::deployment(name, REPLICAS, serde_json::Value::Null)
}

fn available(deployment: &Deployment) -> bool {
    let Some(status) = &deployment.status else {
        return false;
    };
    status.observed_generation >= deployment.metadata.generation
        && status.updated_replicas == Some(REPLICAS)
        && status.available_replicas == Some(REPLICAS)
        && status.replicas == Some(REPLICAS)
}

/// CPU seconds used so far by `pids` and this process.
fn cpu_of(pids: &[u32]) -> f64 {
    pids.iter()
        .chain([&std::process::id()])
        .filter_map(|pid| switchyard_testenv::cpu_seconds(*pid))
        .sum()
}

/// What runs the controllers during one measurement; stopped on drop.
enum Controllers {
    Kcm(switchyard_testenv::ControllerManager),
    Switchyard {
        queue: InProcess,
        watcher: InProcess,
        reconcilers: Vec<ServiceProcess>,
    },
}

impl Controllers {
    /// The controller processes (the queue and the watcher run in this one).
    fn pids(&self) -> Vec<u32> {
        match self {
            Self::Kcm(kcm) => vec![kcm.pid()],
            Self::Switchyard { reconcilers, .. } => reconcilers.iter().map(|r| r.pid()).collect(),
        }
    }

    async fn start(plane: &ControlPlane, under: Under) -> Self {
        match under {
            Under::ControllerManager => Self::Kcm(
                plane
                    .start_controller_manager(
                        // The controllers a Switchyard reconciler runs by default.
                        &[
                            "deployment-controller",
                            "replicaset-controller",
                            "garbage-collector-controller",
                            "namespace-controller",
                        ],
                        &[
                            CLIENT_LIMITS[0],
                            CLIENT_LIMITS[1],
                            "--use-service-account-credentials=false",
                        ],
                    )
                    .await
                    .unwrap(),
            ),
            Under::Switchyard {
                reconcilers,
                latency_ms,
                mtls,
            } => {
                let queue = in_process_queue(mtls).await;
                let watcher = in_process_watcher(plane, queue.grpc(), mtls).await;
                watcher.wait_ready(Duration::from_secs(60)).await;
                let mut started = Vec::new();
                for i in 0..reconcilers {
                    let mut args = vec![
                        format!("--kubeconfig={}", plane.kubeconfig().display()),
                        format!("--queue-addr={}", queue.grpc()),
                        format!("--watcher-addr={}", watcher.grpc()),
                        format!("--worker-id=bench-{i}"),
                        format!("--simulated-latency={latency_ms}ms"),
                        // Slow reconciles run one at a time per replica: a replica's
                        // capacity (50 reconciles/s at 20 ms) stays below what this machine's
                        // control plane absorbs, so replicas, not the apiserver, bound it.
                        format!("--concurrency={}", if latency_ms > 0 { 1 } else { 10 }),
                        "--log-format=json".to_owned(),
                    ];
                    args.extend(CLIENT_LIMITS.iter().map(|a| (*a).to_owned()));
                    args.extend(security(mtls, Role::Reconciler));
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    let mut process = ServiceProcess::start(
                        Path::new(env!("CARGO_BIN_EXE_switchyard-reconciler")),
                        &args,
                        &[("SWITCHYARD_LOG", "warn")],
                    )
                    .await
                    .unwrap();
                    process.wait_ready().await.unwrap();
                    started.push(process);
                }
                Self::Switchyard {
                    queue,
                    watcher,
                    reconcilers: started,
                }
            }
        }
    }

    async fn stop(self) {
        if let Self::Switchyard {
            queue,
            watcher,
            reconcilers,
        } = self
        {
            let mut requests: BTreeMap<String, f64> = BTreeMap::new();
            for reconciler in &reconcilers {
                let (_, text) = reconciler.admin_get("/metrics").await.unwrap();
                for line in text.lines() {
                    let Some(rest) = line.strip_prefix("switchyard_apiserver_requests_total{")
                    else {
                        continue;
                    };
                    if let Some((labels, value)) = rest.rsplit_once("} ") {
                        *requests.entry(labels.to_owned()).or_default() +=
                            value.parse::<f64>().unwrap_or(0.0);
                    }
                }
            }
            eprintln!("reconciler apiserver requests: {requests:?}");
            for reconciler in reconcilers {
                let _ = reconciler.terminate().await;
            }
            watcher.stop().await;
            queue.stop().await;
        }
    }
}

async fn in_process_queue(mtls: bool) -> InProcess {
    let args = [
        "switchyard-queue".to_owned(),
        "--admin-addr=127.0.0.1:0".into(),
        "--grpc-addr=127.0.0.1:0".into(),
        "--shard-count=256".into(),
        format!("--controllers={CONTROLLERS}"),
        "--log-level=warn".into(),
    ]
    .into_iter()
    .chain(security(mtls, Role::Queue));
    let (rt, grpc) = switchyard_queue::Args::try_parse_from(args)
        .unwrap()
        .start()
        .await
        .unwrap();
    InProcess::spawn(rt, Some(grpc))
}

async fn in_process_watcher(
    plane: &ControlPlane,
    queue: std::net::SocketAddr,
    mtls: bool,
) -> InProcess {
    let config = plane.dir().join("watcher-bench.yaml");
    let text = match std::env::var_os("SWITCHYARD_BENCH_WATCHER_CONFIG") {
        Some(file) => std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("SWITCHYARD_BENCH_WATCHER_CONFIG={file:?}: {e}")),
        None => WATCHER_CONFIG.to_owned(),
    };
    std::fs::write(&config, text).unwrap();
    let args = vec![
        "switchyard-watcher".to_owned(),
        "--admin-addr=127.0.0.1:0".into(),
        "--grpc-addr=127.0.0.1:0".into(),
        format!("--kubeconfig={}", plane.kubeconfig().display()),
        format!("--config={}", config.display()),
        format!("--queue-addr={queue}"),
        "--log-level=warn".into(),
    ]
    .into_iter()
    .chain(security(mtls, Role::Watcher));
    let (rt, grpc) = switchyard_watcher::Args::try_parse_from(args)
        .unwrap()
        .start()
        .await
        .unwrap();
    InProcess::spawn(rt, Some(grpc))
}

/// The apiserver's write requests so far (`apiserver_request_total` with a write verb and a
/// 2xx code), by `resource/subresource verb`, for the resources the two controllers write:
/// Pods (not their binding or status, which the scheduler and kwok write), ReplicaSets,
/// Deployments (not their creation, which the benchmark makes) and Events.
async fn controller_writes(client: &switchyard_k8s::Client) -> BTreeMap<String, f64> {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(request).await.unwrap();
    let mut writes = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|l| l.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let (verb, resource, subresource) =
            (label("verb"), label("resource"), label("subresource"));
        if !matches!(verb.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
            || !label("code").starts_with('2')
        {
            continue;
        }
        let counted = match (resource.as_str(), subresource.as_str()) {
            ("pods" | "replicasets" | "events", "") | ("replicasets" | "deployments", "status") => {
                true
            }
            ("deployments", "") => verb != "POST",
            _ => false,
        };
        if counted {
            *writes
                .entry(format!("{resource}/{subresource} {verb}"))
                .or_default() += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    writes
}

/// `after - before`, without the zeros.
fn writes_between(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// Seconds from the first create until every Deployment is Available.
async fn converge(name: &str, under: Under, count: usize) -> f64 {
    let plane = ControlPlane::start(ControlPlaneOptions {
        nodes: NODES,
        dir: None,
    })
    .await
    .unwrap();
    let client = plane.client().await.unwrap();
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    // No serviceaccount controller runs here, and Pods need the namespace's default one.
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let controllers = Controllers::start(&plane, under).await;
    let api: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);

    let writes_before = controller_writes(&client).await;
    let (controllers_cpu, bench_cpu, plane_cpu) = (
        cpu_of(&controllers.pids()),
        cpu_of(&[]),
        plane.cpu_seconds(),
    );
    let start = Instant::now();
    stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &deployment(&format!("d{i:04}")))
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<()>()
        .await;
    let created = start.elapsed();
    loop {
        let done = api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|d| available(d))
            .count();
        if done == count {
            break;
        }
        assert!(
            start.elapsed() < CONVERGE_TIMEOUT,
            "{under:?}: {done} of {count} Deployments Available after {CONVERGE_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let took = start.elapsed().as_secs_f64();
    let controllers_cpu = cpu_of(&controllers.pids()) - controllers_cpu;
    let bench_cpu = cpu_of(&[]) - bench_cpu;
    let plane_cpu = plane.cpu_seconds() - plane_cpu;
    eprintln!("{under:?}: created in {created:?}, all Available after {took:.1} s");
    let run = name.trim_end_matches("_converge");
    println!("bench e2e.{run}_controllers_cpu {controllers_cpu:.1} s");
    println!("bench e2e.{run}_bench_process_cpu {bench_cpu:.1} s");
    println!("bench e2e.{run}_plane_cpu {plane_cpu:.1} s");
    // The writes that converged them, counted by the apiserver for both controllers alike.
    let converged = writes_between(&writes_before, &controller_writes(&client).await);
    let objects: f64 = converged
        .iter()
        .filter(|(k, _)| !k.starts_with("events"))
        .map(|(_, v)| v)
        .sum();
    eprintln!("{under:?}: apiserver writes until converged: {converged:?}");
    println!("bench e2e.{run}_object_writes {objects:.0} requests");
    // The controllers' Events, a write each (a repeat of one, a patch): what their apiserver
    // writes include besides the objects themselves. Read once the writers caught up.
    tokio::time::sleep(EVENTS_SETTLE).await;
    let settled = writes_between(&writes_before, &controller_writes(&client).await);
    let event_writes: f64 = settled
        .iter()
        .filter(|(k, _)| k.starts_with("events"))
        .map(|(_, v)| v)
        .sum();
    println!("bench e2e.{run}_event_writes {event_writes:.0} requests");
    let events: Api<Event> = Api::namespaced(client, NAMESPACE);
    let (mut objects, mut occurrences) = (0, 0);
    for event in events.list(&ListParams::default()).await.unwrap().items {
        if matches!(
            event.involved_object.kind.as_deref(),
            Some("Deployment" | "ReplicaSet")
        ) {
            objects += 1;
            occurrences += i64::from(event.count.unwrap_or(1).max(1));
        }
    }
    eprintln!(
        "{under:?}: {objects} controller Events ({occurrences} occurrences) for {count} Deployments"
    );
    controllers.stop().await;
    plane.stop();
    took
}

/// The measurements, by figure name, in the order they run.
const RUNS: [(&str, Under); 9] = [
    ("kcm_converge", Under::ControllerManager),
    ("sy1_converge", Under::switchyard(1, 0)),
    ("sy1_converge_mtls", Under::switchyard_mtls(1)),
    ("sy2_converge", Under::switchyard(2, 0)),
    ("sy4_converge", Under::switchyard(4, 0)),
    ("sy1_converge_slow", Under::switchyard(1, 20)),
    ("sy4_converge_slow", Under::switchyard(4, 20)),
    ("sy1_converge_slow50", Under::switchyard(1, 50)),
    ("sy4_converge_slow50", Under::switchyard(4, 50)),
];

/// The ratios printed when both of their runs ran: (figure, numerator, denominator).
const RATIOS: [(&str, &str, &str); 5] = [
    ("sy1_vs_kcm", "sy1_converge", "kcm_converge"),
    ("sy1_mtls_vs_kcm", "sy1_converge_mtls", "kcm_converge"),
    ("sy1_mtls_vs_plaintext", "sy1_converge_mtls", "sy1_converge"),
    ("sy4_vs_sy1_slow", "sy1_converge_slow", "sy4_converge_slow"),
    (
        "sy4_vs_sy1_slow50",
        "sy1_converge_slow50",
        "sy4_converge_slow50",
    ),
];

async fn run() {
    let count = deployments();
    eprintln!("{count} Deployments x {REPLICAS} replicas per run");
    let mut took = BTreeMap::new();
    for (name, under) in RUNS {
        if !switchyard_testenv::bench_selected(name) {
            continue;
        }
        let seconds = converge(name, under, count).await;
        println!("bench e2e.{name} {seconds:.1} s");
        took.insert(name, seconds);
    }
    for (name, numerator, denominator) in RATIOS {
        if let (Some(n), Some(d)) = (took.get(numerator), took.get(denominator)) {
            println!("bench e2e.{name} {:.2} ratio", n / d);
        }
    }
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run());
}
