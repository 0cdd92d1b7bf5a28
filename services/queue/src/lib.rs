//! Switchyard queue: the client-go work queue, distributed, sharded and fenced.
//!
//! The semantics live in `switchyard-queue-core`; this crate runs them as a service: one
//! actor task owns the queue ([`actor`]), the gRPC edge ([`grpc`]) validates and converts,
//! and [`metrics`] exports client-go's `workqueue_*` families. The external metrics API for
//! the HPA is its own crate, `switchyard-external-metrics`, fed the actor's backlog.

pub mod actor;
pub mod grants;
pub mod grpc;
pub mod metrics;
pub mod ownership;
mod rate;

use std::{net::SocketAddr, sync::Arc};

use switchyard_external_metrics as external_metrics;
use switchyard_queue_core::{
    BackoffConfig, DEFAULT_MAX_CONTROLLERS, KeySpace, LeaseId, LeaseIds, MAX_CONTROLLER_LEN, Queue,
    QueueConfig,
};
use switchyard_runtime::{GrpcServer, InstanceScope, Runtime, RuntimeArgs};
use switchyard_shards::{STATIC_EPOCH, member as membership};
use tokio::sync::watch;

pub const SERVICE: &str = "switchyard-queue";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Runtime(#[from] switchyard_runtime::Error),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(transparent)]
    ExternalMetrics(#[from] external_metrics::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, clap::Parser)]
#[command(name = SERVICE, version, about)]
pub struct Args {
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    #[command(flatten)]
    pub queue: QueueArgs,
    #[command(flatten)]
    pub external_metrics: external_metrics::ExternalMetricsArgs,
    #[command(flatten)]
    pub etcd_tls: switchyard_shards::EtcdTlsArgs,
}

#[derive(Clone, Debug, clap::Args)]
pub struct QueueArgs {
    /// Controllers (key spaces) known from the start, for example apps/v1/ReplicaSet; by
    /// default every controller built into the reconciler. Others become known when a worker
    /// or an enqueued key first names them, up to --max-controllers
    #[arg(
        long,
        env = "SWITCHYARD_CONTROLLERS",
        value_delimiter = ',',
        default_value = switchyard_work::builtin::LIST
    )]
    pub controllers: Vec<String>,
    /// Controllers served at most, those of --controllers and --controller-rate-limit
    /// included; a new name beyond it is refused (INVALID_ARGUMENT naming this flag)
    #[arg(long, env = "SWITCHYARD_MAX_CONTROLLERS", default_value_t = DEFAULT_MAX_CONTROLLERS)]
    pub max_controllers: usize,
    /// Number of virtual shards; fixed per installation
    #[arg(long, env = "SWITCHYARD_SHARD_COUNT", default_value_t = 256)]
    pub shard_count: u32,
    /// Serve every shard from this replica (until an elector assigns shards)
    #[arg(long, env = "SWITCHYARD_STATIC_SHARDS", default_value_t = true, action = clap::ArgAction::Set)]
    pub static_shards: bool,
    /// How long a lease lasts unless extended or answered (the visibility timeout)
    #[arg(long, env = "SWITCHYARD_LEASE_TIMEOUT", default_value = "60s")]
    pub lease_timeout: humantime::Duration,
    /// Keys held at most; a full queue slows senders instead of dropping keys
    #[arg(
        long = "queue-capacity",
        env = "SWITCHYARD_QUEUE_CAPACITY",
        default_value_t = 1_000_000
    )]
    pub capacity: usize,
    /// First retry delay of a failed key
    #[arg(long, env = "SWITCHYARD_RETRY_BASE_DELAY", default_value = "5ms")]
    pub retry_base_delay: humantime::Duration,
    /// Longest retry delay of a failed key
    #[arg(long, env = "SWITCHYARD_RETRY_MAX_DELAY", default_value = "1000s")]
    pub retry_max_delay: humantime::Duration,
    /// Retries per second of each controller's keys, cluster-wide: each replica applies the
    /// share of its shards (0 turns the buckets off)
    #[arg(long, env = "SWITCHYARD_RETRY_QPS", default_value_t = 10.0)]
    pub retry_qps: f64,
    /// Retries of each controller allowed at once before its bucket paces them, cluster-wide
    #[arg(long, env = "SWITCHYARD_RETRY_BURST", default_value_t = 100)]
    pub retry_burst: u32,
    /// One controller's retry rate and burst instead of --retry-qps/--retry-burst, as
    /// CONTROLLER=QPS:BURST (repeatable, or comma-separated); the controller is known from
    /// the start, as if --controllers named it
    #[arg(long, env = "SWITCHYARD_CONTROLLER_RATE_LIMITS", value_delimiter = ',')]
    pub controller_rate_limit: Vec<rate::ControllerRateLimit>,
    /// A reconciler identity other than the installation's own may work on this controller,
    /// as ACCOUNT=CONTROLLER (the service account its certificate names; CONTROLLER `*` for
    /// any; repeatable, or comma-separated). The installation's own reconciler may work on
    /// any controller unless a grant names its account; any other is refused the controllers
    /// not granted (PERMISSION_DENIED)
    #[arg(long, env = "SWITCHYARD_WORK_GRANTS", value_delimiter = ',')]
    pub work_grant: Vec<grants::WorkGrant>,
    /// On shutdown, how long in-flight leases may finish before the shards are handed back
    #[arg(long, env = "SWITCHYARD_DRAIN_GRACE", default_value = "10s")]
    pub drain_grace: humantime::Duration,
    /// etcd client URLs, comma-separated: join as a member and serve the shards the elector
    /// assigns (instead of --static-shards). https:// (TLS with this service's certificate,
    /// or --etcd-tls-*), or http:// only with --etcd-insecure-plaintext
    #[arg(long, env = "SWITCHYARD_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,
    /// As a member (required with --etcd-endpoints): the elector's gRPC address, whose
    /// `WatchShardMap` stream this replica follows for the shard map and the members' addresses
    #[arg(long, env = "SWITCHYARD_ELECTOR_ADDR")]
    pub elector_addr: Option<String>,
    /// This replica's member id (default: the host name, which is the pod name)
    #[arg(long, env = "SWITCHYARD_MEMBER_ID")]
    pub member_id: Option<String>,
    /// The gRPC address other services use to reach this replica (default: the bound address)
    #[arg(long, env = "SWITCHYARD_ADVERTISE_ADDRESS")]
    pub advertise_address: Option<String>,
    /// TTL of the member lease: a dead replica's shards move after at most this long
    #[arg(long, env = "SWITCHYARD_MEMBER_TTL", default_value = "2s")]
    pub member_ttl: humantime::Duration,
    /// Keys whose latest outcome (error, trace id, worker) this replica remembers for
    /// `DescribeKey` (`kubectl switchyard why`), the least recently finished forgotten
    /// first; 0 remembers none
    #[arg(long, env = "SWITCHYARD_OUTCOME_HISTORY", default_value_t = switchyard_queue_core::DEFAULT_OUTCOME_HISTORY)]
    pub outcome_history: usize,
}

impl QueueArgs {
    /// The core configuration, or an error naming the bad flag.
    pub fn config(&self) -> Result<QueueConfig> {
        if let Some(bad) = self
            .controllers
            .iter()
            .find(|c| c.trim().is_empty() || c.len() > MAX_CONTROLLER_LEN)
        {
            return Err(Error::Config(format!(
                "--controllers: {bad:?}: names must be 1 to {MAX_CONTROLLER_LEN} characters"
            )));
        }
        if let Some(bad) = self
            .controller_rate_limit
            .iter()
            .find(|l| l.controller.len() > MAX_CONTROLLER_LEN)
        {
            return Err(Error::Config(format!(
                "--controller-rate-limit: {} characters in a controller name, at most \
                 {MAX_CONTROLLER_LEN}",
                bad.controller.len()
            )));
        }
        let declared = self.declared();
        if self.max_controllers == 0 || self.max_controllers < declared.len() {
            return Err(Error::Config(format!(
                "--max-controllers: {} is fewer than the {} controllers --controllers and \
                 --controller-rate-limit name (and at least 1)",
                self.max_controllers,
                declared.len()
            )));
        }
        if self.shard_count == 0 {
            return Err(Error::Config("--shard-count: must be at least 1".into()));
        }
        if !self.etcd_endpoints.is_empty() && self.elector_addr.is_none() {
            return Err(Error::Config(
                "--elector-addr: required with --etcd-endpoints (a member follows the \
                 elector's shard map)"
                    .into(),
            ));
        }
        if self.capacity == 0 {
            return Err(Error::Config("--queue-capacity: must be at least 1".into()));
        }
        if !(self.retry_qps >= 0.0 && self.retry_qps.is_finite()) {
            return Err(Error::Config(
                "--retry-qps: must be a non-negative number".into(),
            ));
        }
        Ok(QueueConfig {
            shard_count: self.shard_count,
            lease_timeout: self.lease_timeout.into(),
            capacity: self.capacity,
            max_controllers: self.max_controllers,
            backoff: BackoffConfig {
                base: self.retry_base_delay.into(),
                max: self.retry_max_delay.into(),
                qps: self.retry_qps,
                burst: self.retry_burst,
            },
        })
    }
}

impl QueueArgs {
    /// The controllers known from the start: --controllers, then those only a
    /// --controller-rate-limit names, each once.
    fn declared(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        let limits = self.controller_rate_limit.iter().map(|l| &l.controller);
        for name in self.controllers.iter().chain(limits) {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
        names
    }
}

impl Args {
    pub async fn run(self) -> Result<()> {
        let (rt, _) = self.start().await?;
        rt.run().await?;
        Ok(())
    }

    /// A replica for tests and benchmarks that run it inside their own process: both ports
    /// chosen by the kernel on 127.0.0.1, static mode over `shard_count` shards (all served
    /// here), `controllers` declared (none given: the default, the built-in controllers), then
    /// `flags` (security, limits, logging), as a command line would give them. Started, not
    /// yet running: see [`Args::start`].
    pub async fn start_local(
        shard_count: u32,
        controllers: &[&str],
        flags: impl IntoIterator<Item = String>,
    ) -> Result<(Runtime, SocketAddr)> {
        let args = [
            SERVICE.to_owned(),
            "--admin-addr=127.0.0.1:0".into(),
            "--grpc-addr=127.0.0.1:0".into(),
            format!("--shard-count={shard_count}"),
        ]
        .into_iter()
        .chain(
            (!controllers.is_empty()).then(|| format!("--controllers={}", controllers.join(","))),
        )
        .chain(flags);
        let args = <Self as clap::Parser>::try_parse_from(args)
            .map_err(|e| Error::Config(e.to_string()))?;
        args.start().await
    }

    /// Starts the service and returns its runtime (not yet running) and gRPC address.
    pub async fn start(self) -> Result<(Runtime, SocketAddr)> {
        let Self {
            runtime,
            queue,
            external_metrics,
            etcd_tls,
        } = self;
        let config = queue.config()?;
        let membership = !queue.etcd_endpoints.is_empty();
        let etcd = if membership {
            switchyard_shards::Etcd::from_args(&queue.etcd_endpoints, &etcd_tls, &runtime.tls)
                .map_err(|e| Error::Config(e.to_string()))?
        } else {
            switchyard_shards::Etcd::plaintext(Vec::new())
        };
        let rt = Runtime::start(SERVICE, runtime).await?;
        if membership {
            etcd.announce();
        }
        let mut core = serving_queue(
            config,
            &queue.declared(),
            queue.static_shards && !membership,
        );
        for limit in &queue.controller_rate_limit {
            // Declared above, so known: this cannot meet the bound.
            core.set_rate_limit(&limit.controller, limit.limit)
                .map_err(|e| Error::Config(format!("--controller-rate-limit: {e}")))?;
        }
        let core = core.with_outcome_history(queue.outcome_history);
        let keys = core.key_space().clone();
        let metrics = metrics::QueueMetrics::register(rt.metrics(), &keys);
        let (mut actor, handle) = actor::Actor::new(core, metrics, queue.drain_grace.into());
        let (leave, member_drain) = switchyard_runtime::drain_channel();
        let (close_port, member_left) = switchyard_runtime::drain_channel();
        if membership {
            // The member leaves only after the actor has drained, so no shard is served
            // twice during a graceful handover.
            actor = actor.on_drained(leave);
        }
        // The actor holds the queue: nothing can take its place without losing the keys.
        rt.spawn_essential("queue-actor", |drain| actor.run(drain));
        let grants = grants::WorkGrants::new(rt.dialer().identity().as_ref(), &queue.work_grant);
        let mut service = grpc::QueueService::new(handle.clone(), keys.clone(), grants);
        // `config` checked that a member has an elector to follow.
        let (directory, peers) = match &queue.elector_addr {
            Some(elector) if membership => {
                let (directory, peers) = directory(&rt, &queue, elector.clone());
                let peers = external_metrics::Peers::new(peers, member_id(&queue), rt.dialer());
                (Some(directory), Some(peers))
            }
            _ => (None, None),
        };
        if let Some(directory) = &directory {
            service = service.with_directory(directory.clone());
        }
        let backlog = Backlog {
            handle: handle.clone(),
            keys,
        };
        if let Some(server) =
            external_metrics::Server::bind(&external_metrics, &rt, backlog, peers).await?
        {
            rt.spawn_essential("external-metrics", |drain| server.run(drain));
        }
        let server = GrpcServer::new()
            .add_service(service.into_server())
            .with_descriptor_set(switchyard_proto::FILE_DESCRIPTOR_SET);
        let addr = match &directory {
            // A member keeps its port open until it has left: the elector takes a refused
            // connection as proof that a member is gone (docs/elector.md).
            Some(_) => rt.serve_grpc_until(server, member_left.clone()).await?,
            None => rt.serve_grpc(server).await?,
        };
        if let Some(directory) = directory {
            join(
                &rt,
                &queue,
                etcd,
                addr,
                handle,
                directory,
                member_drain,
                close_port,
            )?;
        }
        Ok((rt, addr))
    }
}

/// This replica's member id: `--member-id`, else the host name (the pod name).
fn member_id(queue: &QueueArgs) -> String {
    switchyard_runtime::instance_id(queue.member_id.clone(), "queue", InstanceScope::Host)
}

/// Joins as a member (after the gRPC port is serving) and follows the shard map.
#[allow(clippy::too_many_arguments)]
fn join(
    rt: &Runtime,
    queue: &QueueArgs,
    etcd: switchyard_shards::Etcd,
    addr: SocketAddr,
    handle: actor::Handle,
    directory: grpc::Directory,
    member_drain: switchyard_runtime::Drain,
    close_port: switchyard_runtime::ShutdownHandle,
) -> Result<()> {
    let id = member_id(queue);
    let address = queue
        .advertise_address
        .clone()
        .unwrap_or_else(|| addr.to_string());
    let ttl: std::time::Duration = queue.member_ttl.into();
    let timing = membership::LeaseTiming {
        ttl,
        margin: ttl / 10,
    };
    let member = membership::Member {
        id: id.clone(),
        address,
    };
    let (lease, task) = membership::join(etcd.clone(), member, timing, member_drain)
        .map_err(|e| Error::Config(format!("--member-id: {e}")))?;
    // Tracked, so shutdown waits for the member to leave (its lease revoked); only then
    // does the gRPC port close.
    rt.spawn_essential("membership", |_| async move {
        let _ = task.await;
        close_port.trigger();
    });
    let gate = rt.readiness().gate("member");
    let mut first = lease.clone();
    rt.spawn("member-ready", move |drain| async move {
        tokio::select! {
            _ = first.wait_for(|s| matches!(s, membership::LeaseState::Held { .. })) => gate.ready(),
            _ = drain.signaled() => {}
        }
    });
    let ownership = ownership::Ownership {
        member: id,
        etcd,
        shard_count: queue.shard_count,
        drain_grace: queue.drain_grace.into(),
        metrics: ownership::OwnershipMetrics::register(rt.metrics(), queue.shard_count),
    };
    rt.spawn_essential("ownership", move |drain| {
        ownership.run(handle, lease, directory.map, drain)
    });
    Ok(())
}

/// Where a member learns the shard map and the members' addresses (for redirects, and as the
/// external metrics API's peers): the elector's `WatchShardMap` stream.
fn directory(
    rt: &Runtime,
    queue: &QueueArgs,
    elector: String,
) -> (
    grpc::Directory,
    watch::Receiver<Option<Vec<external_metrics::Peer>>>,
) {
    let (snapshots, follow) = switchyard_shards::follow_elector_as(
        rt.dialer(),
        elector,
        queue.shard_count,
        rt.drain(),
        switchyard_shards::member_view,
    );
    let (map_tx, map) = watch::channel(None);
    let (members_tx, members) = watch::channel(None);
    let (peers_tx, peers) = watch::channel(None);
    rt.spawn_essential("shard-map", move |drain| async move {
        let mut snapshots = snapshots;
        tokio::select! {
            () = follow => {}
            () = async {
                while snapshots.changed().await.is_ok() {
                    let Some(snapshot) = snapshots.borrow_and_update().clone() else {
                        continue;
                    };
                    let (states, addresses) = &*snapshot;
                    // Each side wakes its readers only when it changed.
                    map_tx.send_if_modified(|map| replace(map, states));
                    if members_tx.send_if_modified(|members| replace(members, addresses)) {
                        let as_peers = addresses
                            .iter()
                            .map(|m| external_metrics::Peer {
                                id: m.id.clone(),
                                address: m.address.clone(),
                            })
                            .collect();
                        peers_tx.send_replace(Some(as_peers));
                    }
                }
            } => {}
            () = drain.signaled() => {}
        }
    });
    (grpc::Directory { map, members }, peers)
}

/// What the external metrics API reads this replica's backlog from: the actor's figures,
/// named by the key space.
#[derive(Clone, Debug)]
struct Backlog {
    handle: actor::Handle,
    keys: KeySpace,
}

/// Per shard and known controller, the keys waiting (ready and delayed) and leased.
impl external_metrics::Backlog for Backlog {
    async fn backlog(&self) -> Result<Vec<(Arc<str>, u64)>, external_metrics::ShuttingDown> {
        let stats = self
            .handle
            .stats(None)
            .await
            .map_err(|actor::Closed| external_metrics::ShuttingDown)?;
        Ok(stats
            .iter()
            .map(|s| (self.keys.name(s.controller), s.depth + s.in_flight))
            .collect())
    }
}

/// Sets `slot` to `value` unless it holds it already; whether it changed.
fn replace<T: Clone + PartialEq>(slot: &mut Option<T>, value: &T) -> bool {
    let changed = slot.as_ref() != Some(value);
    if changed {
        *slot = Some(value.clone());
    }
    changed
}

/// Lease ids drawn from the thread's CSPRNG (ChaCha, seeded by the OS): 128 bits a client
/// cannot guess, so no stream can name a lease it was not handed.
#[derive(Clone, Copy, Debug, Default)]
pub struct RandomLeaseIds;

impl LeaseIds for RandomLeaseIds {
    fn next_id(&mut self) -> LeaseId {
        LeaseId::from_u128(rand::random())
    }
}

/// A queue with random lease ids that serves every shard at [`STATIC_EPOCH`] when
/// `static_shards` is set.
pub fn serving_queue(config: QueueConfig, controllers: &[&str], static_shards: bool) -> Queue {
    let shard_count = config.shard_count;
    let mut queue = Queue::new(config, controllers, RandomLeaseIds);
    if static_shards {
        let now = std::time::Instant::now();
        for shard in 0..shard_count {
            queue.acquire(shard, STATIC_EPOCH, now);
        }
    }
    queue
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// The TLS flags every service requires; these tests only parse them (no file is read).
    const TLS: [&str; 3] = ["--tls-cert=tls.crt", "--tls-key=tls.key", "--tls-ca=ca.crt"];

    fn config_error(flags: &[&str]) -> String {
        let args =
            Args::try_parse_from(["switchyard-queue"].iter().chain(&TLS).chain(flags)).unwrap();
        match args.queue.config() {
            Err(Error::Config(message)) => message,
            other => panic!("{flags:?}: expected a configuration error, got {other:?}"),
        }
    }

    #[test]
    fn bad_flags_are_named() {
        // The built-in controllers and one more: one too many for a limit of the built-ins.
        let builtins = switchyard_work::builtin::ALL.len();
        let too_few = format!("--max-controllers={builtins}");
        let too_few_named = format!(
            "--max-controllers: {builtins} is fewer than the {} controllers",
            builtins + 1
        );
        for (flags, named) in [
            (&["--shard-count=0"][..], "--shard-count"),
            (&["--queue-capacity=0"], "--queue-capacity"),
            (&["--retry-qps=-1"], "--retry-qps"),
            (&["--controllers= "], "--controllers"),
            (&["--max-controllers=0"], "--max-controllers"),
            (
                &[
                    too_few.as_str(),
                    "--controller-rate-limit=example.com/v1/A=1:1",
                ],
                too_few_named.as_str(),
            ),
            (
                &["--etcd-endpoints=https://127.0.0.1:2379"],
                "--elector-addr: required with --etcd-endpoints",
            ),
        ] {
            let message = config_error(flags);
            assert!(message.starts_with(named), "{flags:?}: {message}");
        }
        let member = Args::try_parse_from(["switchyard-queue"].iter().chain(&TLS).chain(&[
            "--etcd-endpoints=https://127.0.0.1:2379",
            "--elector-addr=127.0.0.1:8443",
        ]))
        .unwrap();
        assert!(member.queue.config().is_ok());
    }

    #[test]
    fn a_rate_limit_declares_its_controller() {
        let args = Args::try_parse_from(["switchyard-queue"].iter().chain(&TLS).chain(&[
            "--controllers=apps/v1/ReplicaSet",
            "--controller-rate-limit=example.com/v1/Later=5:10,apps/v1/ReplicaSet=1:1",
            "--max-controllers=2",
        ]))
        .unwrap();
        assert!(args.queue.config().is_ok());
        assert_eq!(
            args.queue.declared(),
            ["apps/v1/ReplicaSet", "example.com/v1/Later"]
        );
    }
}
