//! A real etcd, an elector (its leader loop and its gRPC API, in this process) and queue
//! replicas as processes, shared by the sharding tests and the elector benchmark.

#![allow(dead_code, clippy::unwrap_used)]

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant, SystemTime},
};

use prometheus_client::metrics::counter::Counter;
use switchyard_elector::{
    grpc::ElectorService,
    leader::{self, LeaderConfig},
    membership, shardmap,
};
use switchyard_proto::{
    elector::v1::elector_client::ElectorClient,
    queue::v1::{StatsRequest, queue_client::QueueClient},
};
use switchyard_runtime::{
    AdminArgs, GrpcArgs, GrpcServer, LogArgs, LogFormat, Role, Runtime, RuntimeArgs, ShutdownHandle,
};
use switchyard_testenv::{Etcd, Pki, ServiceProcess, serve_intervals};
use tonic::transport::Channel;

pub const RS: &str = "apps/v1/ReplicaSet";

pub struct Cluster {
    /// Declared first so that it is dropped first: the elector stops before etcd does.
    _elector: StopOnDrop,
    pub etcd: Etcd,
    /// The elector's count of members it found gone (their port refused connections).
    pub members_found_gone: Counter,
    /// Where the elector serves `switchyard.elector.v1.Elector`.
    pub elector_addr: SocketAddr,
    /// The etcd URL the replicas are given.
    replica_endpoint: String,
    pub shard_count: u32,
    pub replicas: Vec<Option<ServiceProcess>>,
    next: usize,
}

/// etcd, an elector and three replicas serving `shard_count` shards.
pub async fn cluster(shard_count: u32) -> Cluster {
    let etcd = Etcd::start().await.unwrap();
    let endpoint = etcd.endpoint().to_owned();
    cluster_on(etcd, endpoint, shard_count).await
}

/// Like [`cluster`], with the replicas reaching etcd at `replica_endpoint` (a proxy, say);
/// the elector talks to etcd directly.
pub async fn cluster_on(etcd: Etcd, replica_endpoint: String, shard_count: u32) -> Cluster {
    let rt = elector_runtime().await;
    let (leading, _) = tokio::sync::watch::channel(false);
    let config = LeaderConfig::new("elector", shard_count);
    let members_found_gone = config.members_found_gone.clone();
    let store = etcd.connection(Role::Elector);
    let (leader_store, dialer) = (store.clone(), rt.dialer());
    rt.spawn("leader", move |drain| {
        leader::run(leader_store, dialer, config, leading, drain)
    });
    let service = ElectorService::new(
        shard_count,
        shardmap::watch(store.clone(), shard_count, rt.drain()).0,
        membership::watch_members(store, rt.drain()).0,
    );
    let elector_addr = rt
        .serve_grpc(GrpcServer::new().add_service(service.into_server()))
        .await
        .unwrap();
    let stop = rt.shutdown_handle();
    tokio::spawn(rt.run());
    let mut cluster = Cluster {
        _elector: StopOnDrop(stop),
        etcd,
        members_found_gone,
        elector_addr,
        replica_endpoint,
        shard_count,
        replicas: Vec::new(),
        next: 0,
    };
    for _ in 0..3 {
        cluster.add_replica().await;
    }
    cluster
}

/// Shuts the in-process elector down when dropped.
struct StopOnDrop(ShutdownHandle);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.trigger();
    }
}

/// The elector's runtime shell in this process: its gRPC server speaks mutual TLS with the
/// elector's certificate and authorizes every call as the elector binary does.
async fn elector_runtime() -> Runtime {
    let loopback = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let args = RuntimeArgs {
        admin: AdminArgs {
            admin_addr: loopback(0),
            debug_fault_injection: false,
        },
        grpc: GrpcArgs {
            grpc_addr: loopback(0),
            grpc_max_connection_age: Duration::from_secs(3600).into(),
            grpc_max_connection_age_grace: Duration::from_secs(300).into(),
        },
        tls: Pki::shared().files(Role::Elector).args(),
        // Errors only: the tests stop etcd under it on purpose, and read the replicas' logs.
        log: LogArgs {
            log_level: "error".into(),
            log_format: LogFormat::Plain,
        },
        drain_timeout: Duration::from_secs(5).into(),
    };
    Runtime::start("switchyard-elector", args).await.unwrap()
}

/// A client of the queue replica at `address`, as `role`: a watcher enqueues, a reconciler
/// works (and may enqueue), an observer reads stats.
pub async fn queue_client(
    role: Role,
    address: impl std::fmt::Display,
) -> switchyard_testenv::Result<QueueClient<Channel>> {
    Ok(QueueClient::new(
        Pki::shared().channel(role, Role::Queue, address).await?,
    ))
}

/// A client of the elector at `address`, as an operator's tool that reads the shard map.
pub async fn elector_client(address: SocketAddr) -> ElectorClient<Channel> {
    ElectorClient::new(
        Pki::shared()
            .channel(Role::Observer, Role::Elector, address)
            .await
            .unwrap(),
    )
}

impl Cluster {
    /// Starts one more replica (member `q<n>`) and waits until it is a member.
    pub async fn add_replica(&mut self) -> usize {
        let id = self.next;
        self.next += 1;
        let replica = self.start_member(id).await;
        self.replicas.push(Some(replica));
        self.replicas.len() - 1
    }

    /// Starts replica `i` again under its member id `q<i>` (after it was stopped).
    pub async fn restart_replica(&mut self, i: usize) {
        assert!(self.replicas[i].is_none(), "replica {i} is still running");
        self.replicas[i] = Some(self.start_member(i).await);
    }

    /// A replica process for member `q<id>`, ready (it holds its member lease).
    async fn start_member(&self, id: usize) -> ServiceProcess {
        let mut replica = ServiceProcess::start(
            Path::new(env!("CARGO_BIN_EXE_switchyard-queue")),
            &[
                &format!("--member-id=q{id}"),
                &format!("--shard-count={}", self.shard_count),
                &format!("--controllers={RS}"),
                "--log-format=json",
                "--drain-grace=2s",
            ],
            &[
                ("SWITCHYARD_ETCD_ENDPOINTS", &self.replica_endpoint),
                // The map and the members' addresses come from the elector's stream.
                ("SWITCHYARD_ELECTOR_ADDR", &self.elector_addr.to_string()),
            ],
        )
        .await
        .unwrap();
        replica.wait_ready().await.unwrap();
        replica
    }
}

pub async fn served(replica: &ServiceProcess) -> Vec<u32> {
    let mut client = queue_client(Role::Observer, replica.grpc_addr())
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

/// Log timestamps are taken just after a shard is acquired and just after it is released;
/// this allows for the gap.
pub const CLOCK_MARGIN: Duration = Duration::from_millis(5);

/// Asserts that no two serve intervals of a shard overlap, across every replica's log (each
/// with the time its open intervals end); returns how many shards were served at all.
pub fn assert_no_two_owners(logs: &[(String, SystemTime)]) -> usize {
    let mut by_shard: HashMap<u32, Vec<(SystemTime, SystemTime)>> = HashMap::new();
    for (log, end) in logs {
        for (shard, spans) in serve_intervals(log, *end) {
            by_shard.entry(shard).or_default().extend(spans);
        }
    }
    for (shard, spans) in &mut by_shard {
        spans.sort();
        for pair in spans.windows(2) {
            let (_, end) = pair[0];
            let (start, _) = pair[1];
            assert!(
                start + CLOCK_MARGIN >= end,
                "shard {shard} served twice at once: {spans:?}"
            );
        }
    }
    by_shard.len()
}

/// The value of one sample of `/metrics` (`name{labels}` exactly as exposed), if present.
pub fn metric(exposition: &str, sample: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == sample).then(|| value.parse().ok()).flatten()
    })
}

/// A replica's `/metrics` text.
pub async fn metrics(replica: &ServiceProcess) -> String {
    let (status, body) = replica.admin_get("/metrics").await.unwrap();
    assert_eq!(status, 200, "{body}");
    body
}
