//! A queue, a watcher and a reconciler in this process, against the harness's real control
//! plane.

#![allow(dead_code, clippy::unwrap_used)]

use std::{io::Write, net::SocketAddr, time::Duration};

use serde_json::json;
use switchyard_k8s::{Api, ListParams, Pod, ReplicaSet, await_condition};
use switchyard_proto::{
    elector::v1::elector_client::ElectorClient, queue::v1::queue_client::QueueClient,
};
use switchyard_reconciler_core::{
    job::has_tracking_finalizer,
    replicaset::{controller_of, is_active},
};
use switchyard_runtime::Role;
use switchyard_sdk::Registry;
pub use switchyard_testenv::InProcess;
use switchyard_testenv::{ControlPlane, Pki, manifests};

pub const RS: &str = "apps/v1/ReplicaSet";
pub const DEPLOY: &str = "apps/v1/Deployment";
pub const NS: &str = switchyard_reconciler::namespace::NAME;
#[allow(unused_imports)]
pub use switchyard_sdk_test::{
    SHARDS, WITHIN, queue, reconciler, reconciler_routed, watcher, watcher_on, watcher_reaching,
    watcher_routed,
};

/// The ReplicaSet controller alone, for tests whose queue serves only its keys.
pub fn replica_set_controller() -> Registry {
    builtins(&[RS])
}

/// The namespace controller alone.
pub fn namespace_controller() -> Registry {
    builtins(&[NS])
}

/// A client of the queue at `address`, as `role` (a watcher enqueues, an observer reads
/// stats), over mutual TLS.
pub async fn queue_client(
    role: Role,
    address: SocketAddr,
) -> QueueClient<tonic::transport::Channel> {
    QueueClient::new(
        Pki::shared()
            .channel(role, Role::Queue, address)
            .await
            .unwrap(),
    )
}

/// A client of the elector at `address`, as an operator's tool that reads the shard map.
pub async fn elector_client(
    address: &str,
) -> switchyard_testenv::Result<ElectorClient<tonic::transport::Channel>> {
    Ok(ElectorClient::new(
        Pki::shared()
            .channel(Role::Observer, Role::Elector, address)
            .await?,
    ))
}

/// A test's watcher configuration: the shard count, the namespaces watched (none: every
/// namespace), `more` (YAML keys, `garbageCollector: {}` for one), and the kustomize base's
/// grants, so that the built-in controllers register their own watches as they do when
/// deployed.
pub fn watcher_config(namespaces: &[&str], more: &str) -> String {
    let base = include_str!("../../../../deploy/kustomize/base/watcher-config.yaml");
    let (_, grants) = base
        .split_once("\nregistrations:")
        .expect("the base grants the built-in controllers' kinds");
    let namespaces = if namespaces.is_empty() {
        String::new()
    } else {
        format!("namespaces:\n  include: [{}]\n", namespaces.join(", "))
    };
    format!("shardCount: {SHARDS}\n{namespaces}{more}registrations:{grants}")
}

/// The built-in controllers named, alone: a test runs those it is about, so that no other
/// registers its watches (the namespace controller's cover every Namespace of the cluster).
pub fn builtins(names: &[&str]) -> Registry {
    builtins_tuned(names, &switchyard_reconciler::Tuning::default())
}

/// [`builtins`] tuned as the reconciler's flags would (`--terminated-pod-gc-threshold`).
pub fn builtins_tuned(names: &[&str], tuning: &switchyard_reconciler::Tuning) -> Registry {
    let mut registry = switchyard_reconciler::builtin_controllers_with(tuning);
    registry
        .retain(&names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
        .unwrap();
    registry
}

/// A queue, a watcher (every namespace, the kustomize base's grants) and a reconciler running
/// the built-in controllers `names`, all in this process: what a test of those controllers
/// runs against the control plane.
pub struct Builtins {
    pub queue: InProcess,
    pub watcher: InProcess,
    pub reconciler: InProcess,
}

impl Builtins {
    pub async fn start(plane: &ControlPlane, names: &[&str]) -> Self {
        Self::start_tuned(plane, names, &switchyard_reconciler::Tuning::default()).await
    }

    pub async fn start_tuned(
        plane: &ControlPlane,
        names: &[&str],
        tuning: &switchyard_reconciler::Tuning,
    ) -> Self {
        let queue = queue(names, &[]).await;
        let watcher = watcher(plane, &watcher_config(&[], ""), queue.grpc()).await;
        watcher.wait_ready(WITHIN).await;
        let reconciler = reconciler(
            plane,
            builtins_tuned(names, tuning),
            queue.grpc(),
            watcher.grpc(),
            &[],
        )
        .await;
        reconciler.wait_ready(WITHIN).await;
        Self {
            queue,
            watcher,
            reconciler,
        }
    }

    /// The reconciler's successful apiserver requests of `verb` answered with one of `codes`.
    pub async fn requests(&self, verb: &str, codes: &[&str]) -> f64 {
        let mut sum = 0.0;
        for code in codes {
            sum += self
                .reconciler
                .metric(&format!(
                    r#"switchyard_apiserver_requests_total{{verb="{verb}",code="{code}"}}"#
                ))
                .await;
        }
        sum
    }

    pub async fn stop(self) {
        self.reconciler.stop().await;
        self.watcher.stop().await;
        self.queue.stop().await;
    }
}

/// A Job's Pods (`selector`) once none keeps the tracking finalizer, or as they are after
/// [`WITHIN`]: the Job controller removes the last finalizers right after the Job finishes
/// (or, for Pods still terminating, once they end).
pub async fn pods_once_counted(pods: &Api<Pod>, selector: &str) -> Vec<Pod> {
    let deadline = std::time::Instant::now() + WITHIN;
    loop {
        let listed = pods
            .list(&ListParams::default().labels(selector))
            .await
            .unwrap()
            .items;
        let tracked = listed.iter().any(has_tracking_finalizer);
        if !tracked || std::time::Instant::now() >= deadline {
            return listed;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A ReplicaSet whose Pods also carry `tier=web` (a label the selector does not name).
pub fn replica_set(name: &str, replicas: i32) -> ReplicaSet {
    let mut value = manifests::workload("ReplicaSet", name, replicas, serde_json::Value::Null);
    value["spec"]["template"]["metadata"]["labels"]["tier"] = json!("web");
    serde_json::from_value(value).unwrap()
}

/// Waits until the ReplicaSet's status says `n` Pods, all fully labeled, ready and available,
/// for its current generation; then checks the Pods themselves.
pub async fn converged(rs_api: &Api<ReplicaSet>, pods: &Api<Pod>, name: &str, n: i32) -> Vec<Pod> {
    let done = await_condition(rs_api.clone(), name, move |rs: Option<&ReplicaSet>| {
        rs.is_some_and(|rs| {
            let status = rs.status.clone().unwrap_or_default();
            status.observed_generation == rs.metadata.generation
                && status.replicas == n
                && status.fully_labeled_replicas == Some(n)
                && status.ready_replicas == Some(n)
                && status.available_replicas == Some(n)
        })
    });
    if tokio::time::timeout(Duration::from_secs(60), done)
        .await
        .is_err()
    {
        let rs = rs_api.get(name).await.unwrap();
        panic!(
            "{name} did not converge to {n} ready Pods: status {:?}",
            rs.status
        );
    }
    let rs = rs_api.get(name).await.unwrap();
    let uid = rs.metadata.uid.unwrap();
    let active = active_pods(pods, &format!("app={name}")).await;
    assert_eq!(active.len(), n as usize, "active Pods");
    for pod in &active {
        let owner = controller_of(pod).expect("a controller reference");
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("ReplicaSet", uid.as_str())
        );
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(
            (labels["app"].as_str(), labels["tier"].as_str()),
            (name, "web")
        );
        // Created from the template (an adopted orphan has a name of its own).
        if let Some(prefix) = &pod.metadata.generate_name {
            assert_eq!(prefix, &format!("{name}-"));
        }
    }
    active
}

/// The Pods matching `labels` (every Pod when empty) that are neither terminating nor
/// finished: the ones a ReplicaSet counts.
pub async fn active_pods(pods: &Api<Pod>, labels: &str) -> Vec<Pod> {
    let mut params = ListParams::default();
    if !labels.is_empty() {
        params = params.labels(labels);
    }
    pods.list(&params)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(is_active)
        .collect()
}

/// A TCP proxy to the apiserver whose traffic can be held: a watcher reaching the apiserver
/// through it keeps answering from its cache while it hears of nothing new, as a watcher far
/// behind does.
pub struct HeldProxy {
    held: tokio::sync::watch::Sender<bool>,
    kubeconfig: tempfile::TempPath,
    task: tokio::task::JoinHandle<()>,
}

impl HeldProxy {
    pub async fn start(plane: &ControlPlane) -> Self {
        let upstream: SocketAddr = plane
            .server()
            .trim_start_matches("https://")
            .parse()
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (held, _) = tokio::sync::watch::channel(false);
        let task = tokio::spawn({
            let held = held.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                        continue;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::spawn(relay(client_read, server_write, held.subscribe()));
                    tokio::spawn(relay(server_read, client_write, held.subscribe()));
                }
            }
        });
        let text = std::fs::read_to_string(plane.kubeconfig()).unwrap();
        assert!(
            text.contains(plane.server()),
            "the kubeconfig names the server"
        );
        let text = text.replace(plane.server(), &format!("https://{address}"));
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(text.as_bytes()).unwrap();
        Self {
            held,
            kubeconfig: file.into_temp_path(),
            task,
        }
    }

    /// A kubeconfig reaching the apiserver through the proxy.
    pub fn kubeconfig(&self) -> &std::path::Path {
        &self.kubeconfig
    }

    /// From now on, bytes read on either side are held until [`HeldProxy::release`].
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    pub fn release(&self) {
        self.held.send_replace(false);
    }
}

impl Drop for HeldProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, holding what it read while `held` says so.
async fn relay(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut held: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if held.wait_for(|held| !*held).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

/// The watches of `registry`'s controllers, registered with the watcher at `watcher` as a
/// reconciler registers them at start, for a test that calls a controller itself. The
/// registration lasts as long as the value returned.
pub async fn register(
    watcher: SocketAddr,
    registry: &Registry,
) -> Vec<switchyard_sdk::registration::Held> {
    let (_shutdown, drain) = switchyard_runtime::drain_channel();
    switchyard_sdk::registration::Registration::new(
        &Pki::shared().dialer(Role::Reconciler),
        &watcher.to_string(),
        "test",
        &registry.watches(),
    )
    .unwrap()
    .register(&drain)
    .await
    .unwrap()
}

/// Runs kubectl; its standard output, or a panic with its standard error.
pub async fn kubectl(plane: &ControlPlane, args: &[&str]) -> String {
    let mut command = plane.kubectl();
    command.args(args);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        output.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `kubectl rollout status` of `object` (`deployment/web`), as a user would run it: it must
/// end in success within 60 s. Its output.
pub async fn kubectl_rollout_status(plane: &ControlPlane, namespace: &str, object: &str) -> String {
    let stdout = kubectl(
        plane,
        &[
            "rollout",
            "status",
            object,
            "-n",
            namespace,
            "--timeout=60s",
        ],
    )
    .await;
    assert!(
        [
            "successfully rolled out",
            "rolling update complete",
            "roll out complete"
        ]
        .iter()
        .any(|done| stdout.contains(done)),
        "{stdout}"
    );
    stdout
}

/// A reconciler process of `binary` (the package's `CARGO_BIN_EXE_switchyard-reconciler`)
/// against `plane`, running `controller` alone, ready: one a test can kill (SIGKILL) and
/// start again.
pub async fn reconciler_process(
    binary: &std::path::Path,
    plane: &ControlPlane,
    queue: SocketAddr,
    watcher: SocketAddr,
    controller: &str,
) -> switchyard_testenv::ServiceProcess {
    let mut process = switchyard_testenv::ServiceProcess::start(
        binary,
        &[
            &format!("--kubeconfig={}", plane.kubeconfig().display()),
            &format!("--queue-addr={queue}"),
            &format!("--watcher-addr={watcher}"),
            &format!("--controllers={controller}"),
        ],
        &[],
    )
    .await
    .unwrap();
    process.wait_ready().await.unwrap();
    process
}

/// A Node kwok plays the kubelet for (Ready, Pods on it Running and Ready), with `labels`
/// and `spec` (JSON: its taints, its `podCIDRs` for the addresses kwok gives its Pods),
/// roomy enough for any test's Pods.
pub async fn kwok_node(
    client: &switchyard_k8s::Client,
    name: &str,
    labels: serde_json::Value,
    spec: serde_json::Value,
) {
    let mut all = json!({"kubernetes.io/hostname": name, "type": "kwok"});
    if let (Some(all), Some(more)) = (all.as_object_mut(), labels.as_object()) {
        all.extend(more.clone());
    }
    let node: switchyard_k8s::k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": all,
        },
        "spec": spec,
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "250"},
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "250"},
        },
    }))
    .unwrap();
    Api::<switchyard_k8s::k8s_openapi::api::core::v1::Node>::all(client.clone())
        .create(&switchyard_k8s::PostParams::default(), &node)
        .await
        .unwrap();
}
