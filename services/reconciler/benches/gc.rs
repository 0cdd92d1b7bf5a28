//! `make bench-gc`: the garbage collector beside kube-controller-manager's, each measurement
//! on a fresh control plane (etcd, kube-apiserver, kube-scheduler, kwok), every service over
//! mutual TLS as shipped.
//!
//! - `gc.cascade_10k_kcm`, `gc.cascade_10k_sy1`, `gc.cascade_10k_sy4` (s): one ConfigMap owns
//!   10,000 Pods (`SWITCHYARD_BENCH_GC_OBJECTS`); it is deleted (background) and the clock
//!   runs until the last Pod is gone. The Pods are never scheduled (a node selector no Node
//!   matches), so a delete removes them at once and the collector alone bounds the time.
//!   Every collector gets the same client limits (`--kube-api-qps=100 --kube-api-burst=200`,
//!   one client: kube-controller-manager runs with `--use-service-account-credentials=false`)
//!   and 20 concurrent reconciles (kube-controller-manager's `--concurrent-gc-syncs`
//!   default). `sy1` and `sy4` run 1 and 4 reconciler processes; the queue and the watcher
//!   run in this process. Both collectors get 5 s after the last Pod is created before the
//!   owner goes, to take the Pods into their graphs. Each subject runs once per round, the
//!   order reversed every other round (`SWITCHYARD_BENCH_ROUNDS`, 2 by default); each figure
//!   is the median.
//! - `gc.bytes_per_object_sy`, `gc.bytes_per_object_kcm` (bytes): growth of the resident set
//!   of a watcher process keeping only the graph, and of a kube-controller-manager running
//!   only its garbage collector, both started on an empty cluster and measured after
//!   100,000 objects (`SWITCHYARD_BENCH_GC_MEMORY_OBJECTS`) of five kinds were created and
//!   the watcher's graph holds them all (plus 10 s), divided by the object count. Both run on
//!   the same control plane at the same time. `gc.bytes_per_object_sy_vs_kcm` is the ratio.
//!
//! `SWITCHYARD_BENCH_RUNS=cascade_10k_sy1,bytes_per_object` runs only the named measurements.
//! The watcher binary must be built beside this benchmark (`make bench-gc` does it).

#![allow(clippy::unwrap_used)]

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use clap::Parser;
use futures::{StreamExt, stream};
use serde_json::{Value, json};
use switchyard_k8s::{
    Api, Client, DeleteParams, Namespace, Pod, PostParams,
    k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount},
    kube::api::ListParams,
};
use switchyard_runtime::Role;
use switchyard_testenv::{ControlPlane, ControlPlaneOptions, InProcess, Pki, ServiceProcess};

const NAMESPACE: &str = "bench";
const CLIENT_LIMITS: [&str; 2] = ["--kube-api-qps=100", "--kube-api-burst=200"];
/// kube-controller-manager's `--concurrent-gc-syncs` default.
const CONCURRENCY: &str = "--concurrency=20";
const WATCHER_CONFIG: &str = "shardCount: 256\ngarbageCollector: {}\nregistrations: [{serviceAccount: switchyard-reconciler, graph: true}]\n";
const CASCADE_TIMEOUT: Duration = Duration::from_secs(900);
const CREATE_CONCURRENCY: usize = 32;

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// The watcher binary, built beside this benchmark (`target/<profile>/`).
fn watcher_binary() -> PathBuf {
    let path = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("switchyard-watcher");
    assert!(
        path.exists(),
        "{} is missing: `make bench-gc` builds it",
        path.display()
    );
    path
}

async fn fresh_plane() -> (ControlPlane, Client) {
    let plane = ControlPlane::start(ControlPlaneOptions {
        nodes: 1,
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
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    (plane, client)
}

/// A Pod no Node takes, owned by `owner`.
fn pending_pod(name: &str, owner: &Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "bench", "part": name}, "ownerReferences": [owner]},
        "spec": {
            "nodeSelector": {"bench.switchyard.dev/nowhere": "true"},
            "containers": [{"name": "c", "image": "registry.example/app:1"}],
        },
    }))
    .unwrap()
}

async fn create_all<F, Fut>(count: usize, make: F)
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = ()>,
{
    stream::iter(0..count)
        .map(make)
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect::<()>()
        .await;
}

/// Objects of `api`'s kind in the namespace, from one list of one item.
async fn count_pods(api: &Api<Pod>) -> usize {
    let list = api
        .list_metadata(&ListParams::default().limit(1))
        .await
        .unwrap();
    list.items.len() + list.metadata.remaining_item_count.unwrap_or(0) as usize
}

enum Collector {
    Kcm(#[allow(dead_code)] switchyard_testenv::ControllerManager),
    Switchyard {
        queue: InProcess,
        watcher: InProcess,
        reconcilers: Vec<ServiceProcess>,
    },
}

impl Collector {
    async fn start(plane: &ControlPlane, reconcilers: usize) -> Self {
        if reconcilers == 0 {
            let kcm = plane
                .start_controller_manager(
                    &["garbage-collector-controller"],
                    &[
                        CLIENT_LIMITS[0],
                        CLIENT_LIMITS[1],
                        "--use-service-account-credentials=false",
                    ],
                )
                .await
                .unwrap();
            return Self::Kcm(kcm);
        }
        let queue = in_process_queue().await;
        let watcher = in_process_watcher(plane, queue.grpc()).await;
        watcher.wait_ready(Duration::from_secs(60)).await;
        let mut started = Vec::new();
        for i in 0..reconcilers {
            let mut args = vec![
                format!("--kubeconfig={}", plane.kubeconfig().display()),
                format!("--queue-addr={}", queue.grpc()),
                format!("--watcher-addr={}", watcher.grpc()),
                format!("--worker-id=bench-{i}"),
                "--controllers=garbage-collector".to_owned(),
                CONCURRENCY.to_owned(),
            ];
            args.extend(CLIENT_LIMITS.iter().map(|a| (*a).to_owned()));
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

    async fn stop(self) {
        if let Self::Switchyard {
            queue,
            watcher,
            reconcilers,
        } = self
        {
            for reconciler in reconcilers {
                let _ = reconciler.terminate().await;
            }
            watcher.stop().await;
            queue.stop().await;
        }
    }
}

async fn in_process_queue() -> InProcess {
    let flags = ["--log-level=warn".to_owned()]
        .into_iter()
        .chain(Pki::shared().flags(Role::Queue));
    let (rt, grpc) = switchyard_queue::Args::start_local(256, &["garbage-collector"], flags)
        .await
        .unwrap();
    InProcess::spawn(rt, Some(grpc))
}

async fn in_process_watcher(plane: &ControlPlane, queue: std::net::SocketAddr) -> InProcess {
    let config = plane.dir().join("watcher-gc-bench.yaml");
    std::fs::write(&config, WATCHER_CONFIG).unwrap();
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
    .chain(Pki::shared().flags(Role::Watcher));
    let (rt, grpc) = switchyard_watcher::Args::try_parse_from(args)
        .unwrap()
        .start()
        .await
        .unwrap();
    InProcess::spawn(rt, Some(grpc))
}

/// Seconds from the owner's deletion until the last of its `count` Pods is gone.
async fn cascade(reconcilers: usize, count: usize) -> f64 {
    let (plane, client) = fresh_plane().await;
    let collector = Collector::start(&plane, reconcilers).await;
    let owners: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let owner: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap();
    let uid = owners
        .create(&PostParams::default(), &owner)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let reference = json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid});
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let created = Instant::now();
    create_all(count, |i| {
        let (pods, reference) = (pods.clone(), reference.clone());
        async move {
            pods.create(
                &PostParams::default(),
                &pending_pod(&format!("p{i:05}"), &reference),
            )
            .await
            .unwrap();
        }
    })
    .await;
    eprintln!("{count} Pods created in {:?}", created.elapsed());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let start = Instant::now();
    owners
        .delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    loop {
        let left = count_pods(&pods).await;
        if left == 0 {
            break;
        }
        assert!(
            start.elapsed() < CASCADE_TIMEOUT,
            "{left} of {count} Pods left after {CASCADE_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = start.elapsed().as_secs_f64();
    collector.stop().await;
    plane.stop();
    took
}

/// One object of five kinds in turn, half of them owned by `root`.
async fn create_mixed(client: &Client, i: usize, root: &Value) {
    let name = format!("o{i:06}");
    let owners = if i.is_multiple_of(2) {
        json!([root])
    } else {
        json!([])
    };
    let metadata = json!({"name": name, "labels": {"app": "bench", "n": (i % 100).to_string()},
                          "ownerReferences": owners});
    let post = PostParams::default();
    match i % 5 {
        0 => {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
            let object = serde_json::from_value(json!({"metadata": metadata, "data": {"k": "v"}}));
            api.create(&post, &object.unwrap()).await.map(drop)
        }
        1 => {
            let api: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
            let object =
                serde_json::from_value(json!({"metadata": metadata, "stringData": {"k": "v"}}));
            api.create(&post, &object.unwrap()).await.map(drop)
        }
        2 => {
            let api: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
            let object = serde_json::from_value(json!({"metadata": metadata}));
            api.create(&post, &object.unwrap()).await.map(drop)
        }
        3 => {
            let api: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
            let object = serde_json::from_value(json!({"metadata": metadata,
                "spec": {"clusterIP": "None", "ports": [{"port": 80}]}}));
            api.create(&post, &object.unwrap()).await.map(drop)
        }
        _ => {
            let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
            let mut pod = pending_pod(&name, root);
            pod.metadata.owner_references = serde_json::from_value(owners).unwrap();
            api.create(&post, &pod).await.map(drop)
        }
    }
    .unwrap();
}

/// A gauge of the watcher's /metrics.
async fn metric(process: &ServiceProcess, name: &str) -> f64 {
    let (_, text) = process.admin_get("/metrics").await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Bytes per object: (the watcher's, kube-controller-manager's).
async fn bytes_per_object(count: usize) -> (f64, f64) {
    let (plane, client) = fresh_plane().await;
    let queue = in_process_queue().await;
    let config = plane.dir().join("watcher-gc-memory.yaml");
    std::fs::write(&config, WATCHER_CONFIG).unwrap();
    let args = [
        format!("--kubeconfig={}", plane.kubeconfig().display()),
        format!("--config={}", config.display()),
        format!("--queue-addr={}", queue.grpc()),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut watcher =
        ServiceProcess::start(&watcher_binary(), &args, &[("SWITCHYARD_LOG", "warn")])
            .await
            .unwrap();
    watcher.wait_ready().await.unwrap();
    let kcm = plane
        .start_controller_manager(
            &["garbage-collector-controller"],
            &["--use-service-account-credentials=false"],
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let graph_before = metric(&watcher, "switchyard_watcher_graph_objects").await;
    let sy_before = watcher.resident_bytes().unwrap() as f64;
    let kcm_before = switchyard_testenv::resident_bytes(kcm.pid()).unwrap() as f64;

    let roots: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let root: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "root"}})).unwrap();
    let uid = roots
        .create(&PostParams::default(), &root)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let root = json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "root", "uid": uid});
    let created = Instant::now();
    create_all(count, |i| {
        let (client, root) = (client.clone(), root.clone());
        async move { create_mixed(&client, i, &root).await }
    })
    .await;
    eprintln!("{count} objects created in {:?}", created.elapsed());
    let deadline = Instant::now() + Duration::from_secs(300);
    while metric(&watcher, "switchyard_watcher_graph_objects").await < graph_before + count as f64 {
        assert!(
            Instant::now() < deadline,
            "the graph did not take every object in"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let sy = (watcher.resident_bytes().unwrap() as f64 - sy_before) / count as f64;
    let kcm_bytes =
        (switchyard_testenv::resident_bytes(kcm.pid()).unwrap() as f64 - kcm_before) / count as f64;
    eprintln!(
        "resident sets before: watcher {sy_before:.0} B, kube-controller-manager {kcm_before:.0} B"
    );
    drop(kcm);
    let _ = watcher.terminate().await;
    queue.stop().await;
    plane.stop();
    (sy, kcm_bytes)
}

async fn run() {
    let count = env_count("SWITCHYARD_BENCH_GC_OBJECTS", 10_000);
    // Every subject once per round, the order reversed every other round; each figure is
    // the median of its rounds, every run printed on stderr.
    let subjects = [
        ("cascade_10k_kcm", 0),
        ("cascade_10k_sy1", 1),
        ("cascade_10k_sy4", 4),
    ];
    let took = switchyard_testenv::compare("gc", &subjects, "s", |_, reconcilers| {
        cascade(reconcilers, count)
    })
    .await;
    for (name, seconds) in &took {
        println!("bench gc.{name} {seconds:.1} s");
    }
    if let (Some(sy), Some(kcm)) = (took.get("cascade_10k_sy1"), took.get("cascade_10k_kcm")) {
        println!("bench gc.cascade_sy1_vs_kcm {:.2} ratio", sy / kcm);
    }
    if switchyard_testenv::bench_selected("bytes_per_object") {
        let objects = env_count("SWITCHYARD_BENCH_GC_MEMORY_OBJECTS", 100_000);
        let (sy, kcm) = bytes_per_object(objects).await;
        println!("bench gc.bytes_per_object_sy {sy:.0} bytes");
        println!("bench gc.bytes_per_object_kcm {kcm:.0} bytes");
        println!("bench gc.bytes_per_object_sy_vs_kcm {:.2} ratio", sy / kcm);
    }
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run());
}
