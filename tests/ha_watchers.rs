//! Read-your-writes across watcher replicas, in the `ha` overlay's shape: 3 electors, 3 queue
//! replicas, 2 watchers and 4 reconcilers, each its own process. Every reconciler reads from
//! both watchers in turn, so consecutive reconciles of one key are answered by caches that lag
//! one another. 20 Deployments (`SWITCHYARD_HA_DEPLOYMENTS`; `make test-long` runs 200) are
//! created and rolled out twice while one watcher is killed with SIGKILL and started again
//! every 5 s.
//!
//! - No ReplicaSet ever has more active Pods than `replicas + maxSurge` (a watch on the Pods
//!   checks at every event). The most active Pods of one Deployment's ReplicaSets together is
//!   printed beside kube-controller-manager's, not bounded: both controllers bound the sum of
//!   the ReplicaSets' `spec.replicas`, and an old ReplicaSet's Pod may still be deleting when
//!   the new one scales up.
//! - Switchyard creates no more Pods than kube-controller-manager creates for the same script
//!   (run first, on a namespace of its own, without faults): a reconcile that acted on a cache
//!   older than its shard's last write would create Pods twice.
//!
//! A binary of its own: kube-controller-manager's controllers act on every namespace.

#![allow(clippy::unwrap_used)]

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::json;
use switchyard_k8s::{
    Api, DeleteParams, Deployment, Pod,
    kube::{Client, api::ListParams},
};
use switchyard_testenv::{ControlPlane, Etcd, ServiceProcess, TestNamespace, manifests};
use switchyard_tests::{
    fleet::{PodCensus, Spec, await_rolled_out, create_all, set_image_all},
    service_binary,
};
use tokio::sync::Mutex;

/// Enough that watcher kills land among reconciles in flight, and short enough for `make
/// test`, where this runs beside other binaries; `make test-long` sets
/// `SWITCHYARD_HA_DEPLOYMENTS=200`.
const DEFAULT_DEPLOYMENTS: usize = 20;

fn deployments() -> usize {
    match std::env::var("SWITCHYARD_HA_DEPLOYMENTS") {
        Ok(n) => n
            .parse()
            .unwrap_or_else(|_| panic!("SWITCHYARD_HA_DEPLOYMENTS={n:?} is not a count")),
        Err(_) => DEFAULT_DEPLOYMENTS,
    }
}
const REPLICAS: i32 = 2;
const MAX_SURGE: i32 = 1;
/// The images the script rolls through after the first.
const ROLLOUTS: [&str; 2] = ["registry.example/ha:2", "registry.example/ha:3"];
const SHARDS: u32 = 32;
/// A watcher comes back after a relist of a few seconds, so one of the two is often down.
const KILL_EVERY: Duration = Duration::from_secs(5);
const CONVERGE: Duration = Duration::from_secs(420);

fn deployment(name: &str) -> Deployment {
    let strategy = json!({"strategy": {"type": "RollingUpdate",
                           "rollingUpdate": {"maxSurge": MAX_SURGE, "maxUnavailable": 0}}});
    manifests::deployment(name, REPLICAS, strategy)
}

/// What one run of the script measured.
struct Run {
    created: usize,
    worst: (usize, String),
    worst_deployment: (usize, String),
}

/// Creates the Deployments, then rolls them through each image of [`ROLLOUTS`] once the
/// previous one is done; returns when the last rollout is done.
async fn script(client: &Client, namespace: &str) -> Run {
    let started = Instant::now();
    let census = PodCensus::watch(client.clone(), namespace);
    let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let names: Vec<String> = (0..deployments()).map(|i| format!("d{i:03}")).collect();
    create_all(&api, names.iter().map(|n| deployment(n)).collect(), 16).await;
    converge(&api, manifests::IMAGE).await;
    for image in ROLLOUTS {
        set_image_all(&api, &names, image, 16).await;
        converge(&api, image).await;
        println!(
            "{:>6.2}s every Deployment runs {image}",
            started.elapsed().as_secs_f64()
        );
    }
    // Let the watch catch up with the last events before reading it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let census = census.lock().unwrap_or_else(|e| e.into_inner());
    Run {
        created: census.created(),
        worst: census.worst.clone(),
        worst_deployment: census.worst_deployment.clone(),
    }
}

impl Run {
    fn print(&self, under: &str) {
        println!(
            "{under}: {} Pods created; at most {} active Pods of one ReplicaSet ({}), {} of one \
             Deployment ({})",
            self.created,
            self.worst.0,
            self.worst.1,
            self.worst_deployment.0,
            self.worst_deployment.1
        );
    }
}

async fn converge(api: &Api<Deployment>, image: &str) {
    let deployments = deployments();
    if let Err(done) = await_rolled_out(api, image, REPLICAS, deployments, CONVERGE).await {
        panic!("{done} of {deployments} Deployments run {image} after {CONVERGE:?}");
    }
}

/// The `ha` shape on `namespace`; the two watchers come first in the returned list.
async fn start_switchyard(
    plane: &ControlPlane,
    namespace: &str,
    etcd: &Etcd,
) -> (Vec<Spec>, Vec<ServiceProcess>) {
    let config_path = plane.dir().join(format!("watcher-{namespace}.yaml"));
    switchyard_tests::write_watcher_config(&config_path, SHARDS, &[namespace]);
    let kubeconfig = format!("--kubeconfig={}", plane.kubeconfig().display());
    let etcd_env = vec![(
        "SWITCHYARD_ETCD_ENDPOINTS".to_owned(),
        etcd.endpoint().to_owned(),
    )];
    let shards = format!("--shard-count={SHARDS}");

    let mut electors = Vec::new();
    for i in 0..3 {
        let spec = Spec {
            envs: etcd_env.clone(),
            ..Spec::new(
                format!("elector-{i}"),
                service_binary("switchyard-elector"),
                vec![shards.clone(), format!("--elector-id=e{i}")],
            )
        };
        electors.push(spec.start().await);
    }
    // Each client follows one of the electors, as a Service would spread them.
    let elector = |i: usize| format!("--elector-addr={}", electors[i % 3].grpc_addr());

    let mut specs = Vec::new();
    let mut running = Vec::new();
    for i in 0..2 {
        let mut spec = Spec::new(
            format!("watcher-{i}"),
            service_binary("switchyard-watcher"),
            vec![
                kubeconfig.clone(),
                format!("--config={}", config_path.display()),
                elector(i),
            ],
        );
        let process = spec.start().await;
        spec.grpc = Some(process.grpc_addr());
        specs.push(spec);
        running.push(process);
    }
    let watchers = format!(
        "--watcher-addr={},{}",
        running[0].grpc_addr(),
        running[1].grpc_addr()
    );
    for i in 0..3 {
        let spec = Spec {
            envs: etcd_env.clone(),
            ..Spec::new(
                format!("queue-{i}"),
                service_binary("switchyard-queue"),
                vec![format!("--member-id=q{i}"), shards.clone(), elector(i)],
            )
        };
        running.push(spec.start().await);
        specs.push(spec);
    }
    for i in 0..4 {
        let spec = Spec::new(
            format!("reconciler-{i}"),
            service_binary("switchyard-reconciler"),
            vec![
                kubeconfig.clone(),
                elector(i),
                shards.clone(),
                watchers.clone(),
                format!("--worker-id=r{i}"),
            ],
        );
        running.push(spec.start().await);
        specs.push(spec);
    }
    running.extend(electors);
    (specs, running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcilers_reading_from_two_watchers_never_act_on_a_stale_cache() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();

    let kcm = plane
        .start_controller_manager(
            &["deployment-controller", "replicaset-controller"],
            // Its default 20 requests/s would take minutes over what is a count of Pods.
            &["--kube-api-qps=500", "--kube-api-burst=1000"],
        )
        .await
        .expect("kube-controller-manager starts");
    let kcm_ns = TestNamespace::create(plane, &client, "ha-kcm")
        .await
        .unwrap();
    let under_kcm = script(&client, kcm_ns.name()).await;
    drop(kcm);
    under_kcm.print("kube-controller-manager");
    // The Nodes hold 750 Pods: make room for the second run.
    let pods: Api<Pod> = Api::namespaced(client.clone(), kcm_ns.name());
    pods.delete_collection(
        &DeleteParams::default().grace_period(0),
        &ListParams::default(),
    )
    .await
    .unwrap();

    let ns = TestNamespace::create(plane, &client, "ha").await.unwrap();
    let etcd = Etcd::start().await.unwrap();
    let (specs, running) = start_switchyard(plane, ns.name(), &etcd).await;
    let running = Arc::new(Mutex::new(running));
    let script_done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let killer = tokio::spawn({
        let running = running.clone();
        let done = script_done.clone();
        async move {
            let mut kills = 0;
            while !done.load(Ordering::Relaxed) {
                tokio::time::sleep(KILL_EVERY).await;
                if done.load(Ordering::Relaxed) {
                    break;
                }
                let victim = kills % 2;
                let mut running = running.lock().await;
                let _ = running.remove(victim).kill();
                println!(
                    "{:>6.2}s killed {}",
                    started.elapsed().as_secs_f64(),
                    specs[victim].name
                );
                running.insert(victim, specs[victim].start().await);
                kills += 1;
            }
            (kills, specs)
        }
    });
    let under_switchyard = script(&client, ns.name()).await;
    script_done.store(true, Ordering::Relaxed);
    let (kills, specs) = killer.await.unwrap();
    under_switchyard.print(&format!("switchyard, {kills} watcher kills"));

    let (worst, owner) = &under_switchyard.worst;
    assert!(
        *worst <= (REPLICAS + MAX_SURGE) as usize,
        "ReplicaSet {owner} had {worst} active Pods at once, above replicas + maxSurge"
    );
    assert!(kills >= 2, "the script outlived only {kills} watcher kills");
    assert!(
        under_switchyard.created <= under_kcm.created,
        "Switchyard created {} Pods, kube-controller-manager {} for the same script",
        under_switchyard.created,
        under_kcm.created
    );

    let mut unclean = Vec::new();
    let running = std::mem::take(&mut *running.lock().await);
    for (process, spec) in running.into_iter().zip(
        specs
            .iter()
            .map(|s| s.name.clone())
            .chain((0..3).map(|i| format!("elector-{i}"))),
    ) {
        let (status, log) = process.terminate().await.unwrap();
        if !status.success() {
            unclean.push(format!("{spec}: {status}\n{log}"));
        }
    }
    assert!(unclean.is_empty(), "{}", unclean.join("\n"));
}
