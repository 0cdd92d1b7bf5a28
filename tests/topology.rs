//! A running Switchyard on the test control plane, every service its own process, as the
//! operator tools see one: an etcd, an elector, queue replicas that are members of the
//! shard map, a watcher over the test's namespaces and reconcilers. The plugin and the
//! monitoring tests run it; and a namespace where the apiserver refuses every Pod, for
//! failing reconciles.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use serde_json::json;
use switchyard_elector_core::assign;
use switchyard_k8s::{
    Api, PostParams,
    k8s_openapi::api::core::v1::ResourceQuota,
    kube::{
        Client,
        api::{Patch, PatchParams},
    },
};
use switchyard_proto::elector::v1::{
    GetShardMapRequest, ShardMap, ShardState, elector_client::ElectorClient,
};
use switchyard_runtime::Role;
use switchyard_testenv::{ControlPlane, Etcd, Pki, ServiceProcess, TestNamespace};

use crate::{fleet::Spec, service_binary};

/// How long the queue replicas' joins may take to settle in the shard map.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// What to start.
#[derive(Clone, Debug)]
pub struct Shape {
    pub shards: u32,
    pub queues: usize,
    pub reconcilers: usize,
    /// The namespaces the watcher watches.
    pub namespaces: Vec<String>,
    /// More flags for the elector and for every queue replica.
    pub elector_args: Vec<String>,
    pub queue_args: Vec<String>,
}

/// The running services, in start order; stopped when dropped, or cleanly with
/// [`Topology::terminate`].
#[derive(Debug)]
pub struct Topology {
    /// `(job, process)`: the job is the service's name (the ServiceMonitors' job names).
    pub running: Vec<(&'static str, ServiceProcess)>,
    pub etcd: Etcd,
}

impl Topology {
    pub async fn start(plane: &ControlPlane, shape: Shape) -> Self {
        let etcd = Etcd::start().await.unwrap();
        let config = plane
            .dir()
            .join(format!("watcher-{}.yaml", shape.namespaces.join("-")));
        let namespaces: Vec<&str> = shape.namespaces.iter().map(|n| n.as_ref()).collect();
        crate::write_watcher_config(&config, shape.shards, &namespaces);
        let kubeconfig = format!("--kubeconfig={}", plane.kubeconfig().display());
        let shards = format!("--shard-count={}", shape.shards);
        let etcd_env = vec![(
            "SWITCHYARD_ETCD_ENDPOINTS".to_owned(),
            etcd.endpoint().to_owned(),
        )];

        let mut running = Vec::new();
        let elector = Spec {
            envs: etcd_env.clone(),
            ..Spec::new(
                "elector",
                service_binary("switchyard-elector"),
                [shards.clone()]
                    .into_iter()
                    .chain(shape.elector_args.iter().cloned())
                    .collect(),
            )
        }
        .start()
        .await;
        let elector_addr = format!("--elector-addr={}", elector.grpc_addr());
        running.push(("switchyard-elector", elector));
        for i in 0..shape.queues {
            let queue = Spec {
                envs: etcd_env.clone(),
                ..Spec::new(
                    format!("queue-{i}"),
                    service_binary("switchyard-queue"),
                    [
                        format!("--member-id=q{i}"),
                        shards.clone(),
                        elector_addr.clone(),
                    ]
                    .into_iter()
                    .chain(shape.queue_args.iter().cloned())
                    .collect(),
                )
            }
            .start()
            .await;
            running.push(("switchyard-queue", queue));
        }
        let watcher = Spec::new(
            "watcher",
            service_binary("switchyard-watcher"),
            vec![
                kubeconfig.clone(),
                format!("--config={}", config.display()),
                elector_addr.clone(),
            ],
        )
        .start()
        .await;
        let watcher_addr = format!("--watcher-addr={}", watcher.grpc_addr());
        running.push(("switchyard-watcher", watcher));
        for i in 0..shape.reconcilers {
            let reconciler = Spec::new(
                format!("reconciler-{i}"),
                service_binary("switchyard-reconciler"),
                vec![
                    kubeconfig.clone(),
                    elector_addr.clone(),
                    shards.clone(),
                    watcher_addr.clone(),
                    format!("--worker-id=r{i}"),
                ],
            )
            .start()
            .await;
            running.push(("switchyard-reconciler", reconciler));
        }
        let this = Self { running, etcd };
        this.settled(&shape).await;
        this
    }

    /// Waits until the shard map is where the elector means it to stay: every queue replica
    /// a member, and every shard active with the owner the elector's assignment gives it.
    /// Until then shards move, and a moved shard starts empty (docs/reliability.md), so a key
    /// a test enqueues directly could vanish.
    async fn settled(&self, shape: &Shape) -> ShardMap {
        let slack = shape
            .elector_args
            .iter()
            .find_map(|a| a.strip_prefix("--shard-slack=")?.parse().ok())
            .unwrap_or(1);
        let elector = self.of("switchyard-elector")[0].grpc_addr().to_string();
        let mut client = ElectorClient::new(
            Pki::shared()
                .channel(Role::Observer, Role::Elector, &elector)
                .await
                .unwrap(),
        );
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            let map = client
                .get_shard_map(GetShardMapRequest {})
                .await
                .unwrap()
                .into_inner();
            let members: Vec<String> = map.members.iter().map(|m| m.id.clone()).collect();
            let desired = assign(shape.shards, &members, slack);
            let settled = members.len() == shape.queues
                && desired.is_some_and(|owners| {
                    map.shards.len() == owners.len()
                        && map.shards.iter().zip(&owners).all(|(s, owner)| {
                            s.state == ShardState::Active as i32 && s.member_id == *owner
                        })
                });
            if settled {
                return map;
            }
            assert!(
                Instant::now() < deadline,
                "the shard map did not settle within {SETTLE_TIMEOUT:?}: {map:#?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The processes of one service (`switchyard-queue`), in start order.
    pub fn of(&self, job: &str) -> Vec<&ServiceProcess> {
        self.running
            .iter()
            .filter(|(j, _)| *j == job)
            .map(|(_, p)| p)
            .collect()
    }

    /// Stops every service, newest first, each with SIGTERM; what did not exit cleanly,
    /// with its log.
    pub async fn terminate(mut self) -> Vec<String> {
        let mut unclean = Vec::new();
        while let Some((job, process)) = self.running.pop() {
            let (status, log) = process.terminate().await.unwrap();
            if !status.success() {
                unclean.push(format!("{job}: {status}\n{log}"));
            }
        }
        unclean
    }
}

/// A namespace of its own where the apiserver refuses every Pod: a quota of no Pods, with
/// the status kube-controller-manager's quota controller would write (none runs here).
pub async fn refusing_pods(plane: &ControlPlane, client: &Client, prefix: &str) -> TestNamespace {
    let namespace = TestNamespace::create(plane, client, prefix).await.unwrap();
    let quotas = Api::<ResourceQuota>::namespaced(client.clone(), namespace.name());
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "no-pods"},
        "spec": {"hard": {"pods": "0"}},
    }))
    .unwrap();
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    quotas
        .patch_status(
            "no-pods",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"hard": {"pods": "0"}, "used": {"pods": "0"}}})),
        )
        .await
        .unwrap();
    namespace
}
