//! A real etcd, an elector and queue replicas as processes, shared by the sharding tests and
//! the elector benchmark.

#![allow(dead_code, clippy::unwrap_used)]

use std::{
    collections::HashMap,
    path::Path,
    time::{Duration, Instant},
};

use switchyard_elector::leader::{self, LeaderConfig};
use switchyard_proto::queue::v1::{StatsRequest, queue_client::QueueClient};
use switchyard_runtime::{ShutdownHandle, drain_channel};
use switchyard_testenv::{Etcd, ServiceProcess};

pub const RS: &str = "apps/v1/ReplicaSet";

pub struct Cluster {
    pub etcd: Etcd,
    _elector: ShutdownHandle,
    pub shard_count: u32,
    pub replicas: Vec<Option<ServiceProcess>>,
    next: usize,
}

/// etcd, an elector and three replicas serving `shard_count` shards.
pub async fn cluster(shard_count: u32) -> Cluster {
    let etcd = Etcd::start().await.unwrap();
    let endpoints = vec![etcd.endpoint().to_owned()];
    let (stop, drain) = drain_channel();
    let (leading, _) = tokio::sync::watch::channel(false);
    let config = LeaderConfig {
        id: "elector".into(),
        shard_count,
        slack: 1,
        ttl: Duration::from_secs(2),
    };
    tokio::spawn(leader::run(endpoints, config, leading, drain));
    let mut cluster = Cluster {
        etcd,
        _elector: stop,
        shard_count,
        replicas: Vec::new(),
        next: 0,
    };
    for _ in 0..3 {
        cluster.add_replica().await;
    }
    cluster
}

impl Cluster {
    /// Starts one more replica (member `q<n>`) and waits until it is a member.
    pub async fn add_replica(&mut self) -> usize {
        let id = self.next;
        self.next += 1;
        let mut replica = ServiceProcess::start(
            Path::new(env!("CARGO_BIN_EXE_switchyard-queue")),
            &[
                &format!("--member-id=q{id}"),
                &format!("--shard-count={}", self.shard_count),
                &format!("--controllers={RS}"),
                "--log-format=json",
                "--drain-grace=2s",
            ],
            &[("SWITCHYARD_ETCD_ENDPOINTS", self.etcd.endpoint())],
        )
        .await
        .unwrap();
        replica.wait_ready().await.unwrap();
        self.replicas.push(Some(replica));
        self.replicas.len() - 1
    }
}

pub async fn served(replica: &ServiceProcess) -> Vec<u32> {
    let mut client = QueueClient::connect(format!("http://{}", replica.grpc_addr()))
        .await
        .unwrap();
    let stats = client
        .stats(StatsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut shards: Vec<u32> = stats.shards.iter().map(|s| s.shard).collect();
    shards.dedup();
    shards
}

/// Waits until the live replicas together serve every shard exactly once; returns how long
/// that took and who serves what.
pub async fn until_all_served(
    cluster: &Cluster,
    within: Duration,
) -> (Duration, HashMap<u32, usize>) {
    until_served(cluster, within, |_| true).await
}

/// Like `until_all_served`, and also until `settled` holds for who serves what.
pub async fn until_served(
    cluster: &Cluster,
    within: Duration,
    settled: impl Fn(&HashMap<u32, usize>) -> bool,
) -> (Duration, HashMap<u32, usize>) {
    let start = Instant::now();
    loop {
        let mut owners: HashMap<u32, usize> = HashMap::new();
        let mut twice = false;
        for (i, replica) in cluster.replicas.iter().enumerate() {
            let Some(replica) = replica else { continue };
            for shard in served(replica).await {
                twice |= owners.insert(shard, i).is_some();
            }
        }
        if !twice && owners.len() == cluster.shard_count as usize && settled(&owners) {
            return (start.elapsed(), owners);
        }
        assert!(
            start.elapsed() < within,
            "not all shards served after {within:?}: {owners:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
