//! Supervision, with every service a real process: a panic injected into each essential task
//! (`--debug-fault-injection`, `POST /debug/panic/<task>`) is either survived by restarting
//! the task (counted in `switchyard_task_restarts_total`) or ends the process with a
//! non-zero status naming the task, so the kubelet restarts it. Work flows after each.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use switchyard_k8s::{
    Api, Deployment, PostParams,
    kube::{Client, api::ListParams},
};
use switchyard_testenv::{ControlPlane, Etcd, ServiceProcess, TestNamespace, manifests};
use switchyard_tests::service_binary;

const SHARDS: u32 = 4;

struct Spec {
    program: &'static str,
    args: Vec<String>,
    envs: Vec<(&'static str, String)>,
    /// Where a restarted process listens: where its clients were told to find it.
    grpc: Option<std::net::SocketAddr>,
}

impl Spec {
    async fn start(&self) -> ServiceProcess {
        let mut args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        args.push("--debug-fault-injection");
        let envs: Vec<(&str, &str)> = self.envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut process =
            ServiceProcess::start_with_grpc(&service_binary(self.program), self.grpc, &args, &envs)
                .await
                .unwrap_or_else(|e| panic!("{} starts: {e}", self.program));
        process
            .wait_ready()
            .await
            .unwrap_or_else(|e| panic!("{} becomes ready: {e}\n{}", self.program, process.log()));
        process
    }
}

async fn restarts(process: &ServiceProcess, task: &str) -> f64 {
    let (_, text) = process.admin_get("/metrics").await.unwrap();
    let prefix = format!("switchyard_task_restarts_total{{task=\"{task}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or(0.0)
}

async fn panic_task(process: &ServiceProcess, task: &str) {
    let (status, body) = process
        .admin_post(&format!("/debug/panic/{task}"))
        .await
        .unwrap();
    assert_eq!(status, 200, "{task}: {body}");
}

/// Creates a Deployment and waits until it is Available: work flows end to end.
async fn converges(client: &Client, namespace: &str, name: &str) {
    let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    api.create(
        &PostParams::default(),
        &manifests::deployment(name, 2, serde_json::json!({})),
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = api.list(&ListParams::default()).await.unwrap();
        let available = listed.items.iter().any(|d| {
            d.metadata.name.as_deref() == Some(name)
                && d.status
                    .as_ref()
                    .is_some_and(|s| s.available_replicas == Some(2))
        });
        if available {
            return;
        }
        assert!(Instant::now() < deadline, "{name} did not become available");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Panics `task` in `process`, which must exit non-zero naming it.
async fn fails(mut process: ServiceProcess, task: &str) {
    panic_task(&process, task).await;
    let (status, log) = process
        .exited(Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("the process goes on after {task} panicked"));
    assert!(
        !status.success(),
        "exit status after {task} panicked: {status}"
    );
    assert!(
        log.contains(&format!("stopped because task {task} panicked")),
        "the log names {task}:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_essential_task_is_restarted_or_fails_the_process() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "supervision")
        .await
        .unwrap();
    let etcd = Etcd::start().await.unwrap();
    let config = plane.dir().join(format!("watcher-{}.yaml", ns.name()));
    switchyard_tests::write_watcher_config(&config, SHARDS, &[ns.name()]);
    let shards = format!("--shard-count={SHARDS}");
    let etcd_env = vec![("SWITCHYARD_ETCD_ENDPOINTS", etcd.endpoint().to_owned())];
    let mut elector_spec = Spec {
        program: "switchyard-elector",
        args: vec![shards.clone()],
        envs: etcd_env.clone(),
        grpc: None,
    };
    let elector = elector_spec.start().await;
    elector_spec.grpc = Some(elector.grpc_addr());
    let elector_addr = format!("--elector-addr={}", elector.grpc_addr());
    let queue_spec = Spec {
        program: "switchyard-queue",
        args: vec![
            shards.clone(),
            elector_addr.clone(),
            "--member-id=q0".into(),
        ],
        envs: etcd_env,
        grpc: None,
    };
    let queue = queue_spec.start().await;
    let kubeconfig = format!("--kubeconfig={}", plane.kubeconfig().display());
    let mut watcher_spec = Spec {
        program: "switchyard-watcher",
        args: vec![
            kubeconfig.clone(),
            format!("--config={}", config.display()),
            elector_addr.clone(),
        ],
        envs: Vec::new(),
        grpc: None,
    };
    let watcher = watcher_spec.start().await;
    watcher_spec.grpc = Some(watcher.grpc_addr());
    let reconciler_spec = Spec {
        program: "switchyard-reconciler",
        args: vec![
            kubeconfig,
            elector_addr,
            shards,
            format!("--watcher-addr={}", watcher.grpc_addr()),
        ],
        envs: Vec::new(),
        grpc: None,
    };
    let reconciler = reconciler_spec.start().await;
    converges(&client, ns.name(), "before").await;

    // Restarted: their state lives outside them.
    for (process, task) in [
        (&watcher, "informer"),
        (&watcher, "enqueuer"),
        (&watcher, "shard-resync"),
        (&reconciler, "worker"),
    ] {
        panic_task(process, task).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while restarts(process, task).await < 1.0 {
            assert!(Instant::now() < deadline, "{task} was not restarted");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for process in [&watcher, &reconciler] {
        let (status, _) = process.admin_get("/livez").await.unwrap();
        assert_eq!(status, 200, "restarted tasks leave the process live");
    }
    converges(&client, ns.name(), "after-restarts").await;
    let (status, body) = queue.admin_post("/debug/panic/no-such-task").await.unwrap();
    assert_eq!(
        (status, body.as_str()),
        (404, "no running task named no-such-task\n")
    );

    // Failing the process: each is started again, as the kubelet would, and work flows.
    fails(queue, "queue-actor").await;
    let queue = queue_spec.start().await;
    converges(&client, ns.name(), "after-queue").await;
    fails(reconciler, "shard-map").await;
    let reconciler = reconciler_spec.start().await;
    fails(watcher, "shard-map").await;
    let watcher = watcher_spec.start().await;
    fails(elector, "leader").await;
    let elector = elector_spec.start().await;
    // The followers of etcd the elector's gRPC service answers from.
    fails(elector, "shard-map-follower").await;
    let elector = elector_spec.start().await;
    fails(elector, "member-follower").await;
    let elector = elector_spec.start().await;
    converges(&client, ns.name(), "after-all").await;

    for process in [reconciler, watcher, queue, elector] {
        let (status, log) = process.terminate().await.unwrap();
        assert!(status.success(), "{log}");
    }
}
