//! A queue and a watcher in this process, against the harness's real control plane, and a
//! worker that records every key the queue leases.

#![allow(dead_code, clippy::unwrap_used)]

use std::{collections::HashSet, io::Write, net::SocketAddr, time::Duration};

use clap::Parser;
use switchyard_proto::{
    elector::v1::elector_client::ElectorClient,
    queue::v1::{
        Credit, Done, Outcome, WorkRequest, WorkerHello, outcome, queue_client::QueueClient,
        work_request::Request as Msg, work_response::Response as Reply,
    },
    watcher::v1::{cache_client::CacheClient, watches_client::WatchesClient},
};
use switchyard_runtime::{Dialer, Role};
pub use switchyard_testenv::InProcess;
use switchyard_testenv::{ControlPlane, Pki};
use tokio::{sync::mpsc, task::JoinHandle};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

pub const RS: &str = "apps/v1/ReplicaSet";
pub const WIDGET: &str = "example.com/v1/Widget";
pub const SHARDS: u32 = 16;

/// A queue serving every shard (static mode) for `controllers`.
pub async fn queue(controllers: &[&str], extra: &[&str]) -> InProcess {
    let flags = ["--drain-grace=1s".to_owned()]
        .into_iter()
        .chain(extra.iter().map(|a| (*a).to_owned()))
        .chain(Pki::shared().flags(Role::Queue));
    let (rt, grpc) = switchyard_queue::Args::start_local(SHARDS, controllers, flags)
        .await
        .unwrap();
    InProcess::spawn(rt, Some(grpc))
}

/// A watcher with `config` (YAML) against `plane`'s apiserver; `route` is `--queue-addr=...`
/// or `--elector-addr=...`. Not waited for: see [`InProcess::wait_ready`].
pub async fn watcher(plane: &ControlPlane, config: &str, route: &str) -> InProcess {
    watcher_with(plane, config, &[route]).await
}

/// As [`watcher`], with `flags` (the route among them) after the common ones.
pub async fn watcher_with(plane: &ControlPlane, config: &str, flags: &[&str]) -> InProcess {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(config.as_bytes()).unwrap();
    let path = file.into_temp_path().keep().unwrap();
    let mut args = vec![
        "switchyard-watcher".to_owned(),
        "--admin-addr=127.0.0.1:0".into(),
        "--grpc-addr=127.0.0.1:0".into(),
        format!("--kubeconfig={}", plane.kubeconfig().display()),
        format!("--config={}", path.display()),
    ];
    args.extend(flags.iter().map(|f| (*f).to_owned()));
    args.extend(Pki::shared().flags(Role::Watcher));
    let (rt, grpc) = switchyard_watcher::Args::try_parse_from(args)
        .unwrap()
        .start()
        .await
        .unwrap();
    InProcess::spawn(rt, Some(grpc))
}

/// A client of the queue at `address`, as `role` (a reconciler works, an observer reads
/// stats), over mutual TLS.
pub async fn queue_client(role: Role, address: SocketAddr) -> QueueClient<Channel> {
    QueueClient::new(
        Pki::shared()
            .channel(role, Role::Queue, address)
            .await
            .unwrap(),
    )
}

/// A client of the watcher's Cache API at `address`, as a reconciler (the role that reads
/// the cache).
pub async fn cache_client(address: SocketAddr) -> CacheClient<Channel> {
    CacheClient::new(
        Pki::shared()
            .channel(Role::Reconciler, Role::Watcher, address)
            .await
            .unwrap(),
    )
}

/// A client of the watcher's Watches API at `address`, as `role` (only a reconciler may
/// register).
pub async fn watches_client(role: Role, address: SocketAddr) -> WatchesClient<Channel> {
    WatchesClient::new(
        Pki::shared()
            .channel(role, Role::Watcher, address)
            .await
            .unwrap(),
    )
}

/// A client of the elector at `address`, as an operator's tool that reads the shard map.
pub async fn elector_client(address: &str) -> switchyard_testenv::Result<ElectorClient<Channel>> {
    Ok(ElectorClient::new(
        Pki::shared()
            .channel(Role::Observer, Role::Elector, address)
            .await?,
    ))
}

/// A worker that leases every key of a queue, reports it done at once and records it as
/// `"<controller> <namespace>/<name>"`.
pub struct Worker {
    keys: mpsc::UnboundedReceiver<String>,
    _task: JoinHandle<()>,
}

impl Worker {
    pub async fn start(queue: SocketAddr) -> Self {
        let mut client = queue_client(Role::Reconciler, queue).await;
        let (tx, rx) = mpsc::channel(1024);
        let send = |request| WorkRequest {
            request: Some(request),
        };
        tx.send(send(Msg::Hello(WorkerHello {
            worker_id: "watcher-test".into(),
            controllers: vec![],
        })))
        .await
        .unwrap();
        tx.send(send(Msg::Credit(Credit { items: 1000 })))
            .await
            .unwrap();
        let mut inbound = client
            .work(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let (keys_tx, keys) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                let Some(Reply::Item(item)) = message.response else {
                    continue;
                };
                let key = item.key.unwrap();
                let _ = keys_tx.send(format!("{} {}/{}", key.controller, key.namespace, key.name));
                let done = Outcome {
                    shard: item.shard,
                    epoch: item.epoch,
                    lease_id: item.lease_id,
                    result: Some(outcome::Result::Done(Done {})),
                    duration: None,
                    observed: Default::default(),
                    namespace_observed: Default::default(),
                };
                if tx.send(send(Msg::Outcome(done))).await.is_err()
                    || tx
                        .send(send(Msg::Credit(Credit { items: 1 })))
                        .await
                        .is_err()
                {
                    return;
                }
            }
        });
        Self { keys, _task: task }
    }

    /// Waits until `key` is leased; returns the keys leased before it.
    pub async fn expect(&mut self, key: &str, within: Duration) -> Vec<String> {
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.keys.recv()).await {
                Ok(Some(got)) if got == key => return seen,
                Ok(Some(got)) => seen.push(got),
                _ => panic!("{key:?} was not leased within {within:?}; leased: {seen:?}"),
            }
        }
    }

    /// Waits until every key of `keys` is leased (in any order).
    pub async fn expect_all(&mut self, keys: &[String], within: Duration) {
        let mut missing: HashSet<&String> = keys.iter().collect();
        let deadline = tokio::time::Instant::now() + within;
        while !missing.is_empty() {
            match tokio::time::timeout_at(deadline, self.keys.recv()).await {
                Ok(Some(got)) => {
                    missing.remove(&got);
                }
                _ => panic!("not leased within {within:?}: {missing:?}"),
            }
        }
    }

    /// Every key leased during `window`.
    pub async fn leased_during(&mut self, window: Duration) -> Vec<String> {
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + window;
        while let Ok(Some(got)) = tokio::time::timeout_at(deadline, self.keys.recv()).await {
            seen.push(got);
        }
        seen
    }
}

#[allow(unused_imports)] // not every test binary uses it
pub use switchyard_testenv::manifests::replica_set;

/// A pod with `labels`, controlled by `owner` (`(kind, apiVersion, name, uid)`) if given.
pub fn pod(
    name: &str,
    labels: &[(&str, &str)],
    owner: Option<(&str, &str, &str, &str)>,
) -> switchyard_k8s::Pod {
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
        .collect();
    let owners: Vec<serde_json::Value> = owner
        .into_iter()
        .map(|(kind, api_version, name, uid)| {
            serde_json::json!({
                "apiVersion": api_version, "kind": kind, "name": name, "uid": uid,
                "controller": true, "blockOwnerDeletion": true
            })
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "ownerReferences": owners},
        "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]}
    }))
    .unwrap()
}

/// The ReplicaSet controller's configuration (for ReplicaSets, owns Pods) for one namespace.
pub fn rs_config(namespace: &str, pods_metadata_only: bool) -> String {
    format!(
        r#"
shardCount: {SHARDS}
namespaces:
  include: [{namespace}]
resources:
  - apiVersion: v1
    kind: Pod
    metadataOnly: {pods_metadata_only}
controllers:
  - name: {RS}
    for: {{apiVersion: apps/v1, kind: ReplicaSet, predicates: [generationChanged, labelsChanged]}}
    owns:
      - {{apiVersion: v1, kind: Pod}}
"#
    )
}

pub fn key(controller: &str, namespace: &str, name: &str) -> String {
    format!("{controller} {namespace}/{name}")
}

pub const WITHIN: Duration = Duration::from_secs(20);

/// A channel to the watcher at `address` as a reconciler of its own, whose certificate names
/// `service_account` (`<name>-switchyard-reconciler`, so that its role is a reconciler's).
pub async fn reconciler_as(service_account: &str, address: SocketAddr) -> Channel {
    let files = Pki::shared()
        .issue_as(service_account, service_account)
        .unwrap();
    let dialer = Dialer::from_args(&files.args()).unwrap();
    let endpoint = dialer
        .endpoint(&address.to_string(), Role::Watcher)
        .unwrap();
    dialer.connect(&endpoint, Role::Watcher).await.unwrap()
}
