//! Which shards this replica serves: the I/O loop around the member's step of the shard
//! protocol (`switchyard_ownership::member`, pure and property-tested against the leader's
//! plan).
//!
//! ```text
//!  member lease (held/lost) ─┐                                   ┌─► actor: acquire, drain, release
//!                            ├─► per shard: want ─► member::step ┼─► etcd: renew, hand over (fenced,
//!  shard map (WatchShardMap)─┘   (+ in-flight count of a        │        raced against the lease)
//!                                   draining shard)              └─► metrics
//! ```
//!
//! Losing the member lease stops every shard at once: the elector may already have given
//! them to other replicas. A shard given at an epoch older than this registration is renewed
//! in etcd before it is served, so the watcher resyncs it (see the step's docs).
//!
//! [`OwnershipMetrics`] puts all of this on the admin port's `/metrics`.

use std::{collections::HashMap, time::Duration};

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Unit,
};
use std::time::Instant;
use switchyard_ownership::{
    ShardState,
    member::{self, DrainProgress, Effect, Local, Stop},
};
use switchyard_runtime::{Drain, Metrics};
use switchyard_shards::{
    member::LeaseState,
    store::{self as shardmap, ShardMapError},
};

use tokio::sync::watch;
use tracing::{info, warn};

use crate::actor::{Command, Handle};

/// How often a draining shard's in-flight count is checked, and a failed handover or epoch
/// renewal retried.
const DRAIN_POLL: Duration = Duration::from_millis(20);
/// An etcd call (connect, handover, renewal) that takes longer is abandoned and retried, so
/// one stuck call cannot hold the other shards back. A lease loss abandons it at once.
const ETCD_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The lease a step runs under. An etcd call made in the step races its loss: an etcd that
/// stalls (answers nothing) must not keep this task from stopping every shard.
struct LeaseGuard {
    lease: watch::Receiver<LeaseState>,
    held: Option<i64>,
}

fn lease_id(state: &LeaseState) -> Option<i64> {
    match state {
        LeaseState::Held { lease, .. } => Some(*lease),
        LeaseState::Lost => None,
    }
}

impl LeaseGuard {
    /// `call`'s result, or `None` when the lease changed first or the call timed out.
    async fn run<T>(&self, call: impl std::future::Future<Output = T>) -> Option<T> {
        let mut lease = self.lease.clone();
        let held = self.held;
        let changed = lease.wait_for(|s| lease_id(s) != held);
        tokio::select! {
            biased;
            _ = changed => None,
            result = tokio::time::timeout(ETCD_CALL_TIMEOUT, call) => result.ok(),
        }
    }
}

/// Why a shard stopped being served here: the `reason` label of
/// `switchyard_queue_shard_releases_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
enum Reason {
    /// Planned move: drained with no lease in flight, then handed over.
    handover,
    /// Planned move: the drain grace ran out with leases still in flight.
    handover_grace_expired,
    /// The member lease may have expired: every shard stops at once.
    lease_lost,
    /// The map took the shard away without a release from here.
    reassigned,
    /// The replica shuts down: the actor drains and hands every shard back.
    shutdown,
}

impl From<Stop> for Reason {
    fn from(stop: Stop) -> Self {
        match stop {
            Stop::Handover => Self::handover,
            Stop::HandoverGraceExpired => Self::handover_grace_expired,
            Stop::LeaseLost => Self::lease_lost,
            Stop::Reassigned => Self::reassigned,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: Reason,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ShardLabels {
    shard: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OperationLabels {
    operation: &'static str,
}

/// Shard ownership on the admin port's `/metrics`.
#[derive(Clone, Debug)]
pub struct OwnershipMetrics {
    lease_held: Gauge,
    lease_lost: Counter,
    served: Gauge,
    epoch: Family<ShardLabels, Gauge>,
    acquired: Counter,
    renewed: Counter,
    releases: Family<ReasonLabels, Counter>,
    failures: Family<OperationLabels, Counter>,
    drain: Histogram,
}

impl OwnershipMetrics {
    /// Registers the metrics of a member of an installation of `shard_count` virtual shards.
    pub fn register(metrics: &Metrics, shard_count: u32) -> Self {
        let shards = Gauge::<i64>::default();
        shards.set(i64::from(shard_count));
        metrics.register(
            "switchyard_queue_shard_count",
            "Virtual shards of the installation (--shard-count); each should be served by one \
             replica (switchyard_queue_shard_epoch)",
            shards,
        );
        let this = Self {
            lease_held: Gauge::default(),
            lease_lost: Counter::default(),
            served: Gauge::default(),
            epoch: Family::default(),
            acquired: Counter::default(),
            renewed: Counter::default(),
            releases: Family::default(),
            failures: Family::default(),
            // 1 ms to about 16 s: a drain ends when in-flight leases finish, at most after
            // --drain-grace (10 s by default).
            drain: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
        };
        metrics.register(
            "switchyard_queue_member_lease_held",
            "1 while this replica holds its member lease in etcd and may serve shards",
            this.lease_held.clone(),
        );
        metrics.register(
            "switchyard_queue_member_lease_lost",
            "Times renewals of the member lease failed long enough that etcd may have expired \
             it, so every shard stopped at once",
            this.lease_lost.clone(),
        );
        metrics.register(
            "switchyard_queue_shards_served",
            "Shards this replica serves (leasing, or draining for a handover)",
            this.served.clone(),
        );
        metrics.register(
            "switchyard_queue_shard_epoch",
            "Fencing epoch of each shard this replica serves; absent when not served",
            this.epoch.clone(),
        );
        metrics.register(
            "switchyard_queue_shard_acquisitions",
            "Shards this replica started serving (each start is empty, at a new epoch)",
            this.acquired.clone(),
        );
        metrics.register(
            "switchyard_queue_shard_epoch_renewals",
            "Shards held from an earlier registration whose epoch was renewed before serving",
            this.renewed.clone(),
        );
        metrics.register(
            "switchyard_queue_shard_releases",
            "Shards this replica stopped serving, by reason",
            this.releases.clone(),
        );
        metrics.register(
            "switchyard_queue_shard_map_write_failures",
            "Handovers and epoch renewals that etcd refused or did not answer (retried)",
            this.failures.clone(),
        );
        metrics.register_with_unit(
            "switchyard_queue_shard_drain",
            "Planned handovers: from the release order until the shard stopped being served",
            Unit::Seconds,
            this.drain.clone(),
        );
        this
    }

    fn released(&self, shard: u32, reason: Reason) {
        self.epoch.remove(&ShardLabels { shard });
        self.releases.get_or_create(&ReasonLabels { reason }).inc();
    }

    fn failed(&self, operation: &'static str) {
        self.failures
            .get_or_create(&OperationLabels { operation })
            .inc();
    }
}

#[derive(Debug)]
pub struct Ownership {
    pub member: String,
    pub etcd: switchyard_shards::Etcd,
    pub shard_count: u32,
    pub drain_grace: Duration,
    pub metrics: OwnershipMetrics,
}

impl Ownership {
    pub async fn run(
        self,
        handle: Handle,
        mut lease: watch::Receiver<LeaseState>,
        mut map: watch::Receiver<Option<Vec<ShardState>>>,
        drain: Drain,
    ) {
        let mut local: HashMap<u32, Local> = HashMap::new();
        let mut client: Option<etcd_client::Client> = None;
        let mut held: Option<i64> = None;
        loop {
            let state = *lease.borrow_and_update();
            let now_held = lease_id(&state);
            let guard = LeaseGuard {
                lease: lease.clone(),
                held: now_held,
            };
            // A new lease id without a `Lost` in between (the watch kept only the latest
            // state) is a loss all the same.
            if held.is_some() && held != now_held {
                let stopped = local.values().filter(|l| l.served()).count();
                warn!(member = %self.member, shards = stopped, "member lease may have expired: stopped serving every shard");
                self.metrics.lease_lost.inc();
                self.step(&handle, &guard, None, None, &mut local, &mut client)
                    .await;
            }
            held = now_held;
            self.metrics.lease_held.set(i64::from(held.is_some()));
            let registered = match state {
                LeaseState::Held { registered, .. } => Some(registered),
                LeaseState::Lost => None,
            };
            let snapshot = map.borrow_and_update().clone();
            self.step(
                &handle,
                &guard,
                registered,
                snapshot.as_deref(),
                &mut local,
                &mut client,
            )
            .await;
            let served = local.values().filter(|l| l.served()).count();
            self.metrics
                .served
                .set(i64::try_from(served).unwrap_or(i64::MAX));
            let pending = local.values().any(|l| l.pending());
            tokio::select! {
                changed = lease.changed() => if changed.is_err() { return },
                changed = map.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(DRAIN_POLL), if pending => {}
                // Shutdown: the actor drains every shard and then the member leaves.
                _ = drain.clone().signaled() => {
                    for (shard, _) in local.iter().filter(|(_, l)| l.served()) {
                        self.metrics.released(*shard, Reason::shutdown);
                    }
                    return;
                }
            }
        }
    }

    /// One pass over every shard. `registered` is the revision of this member's registration
    /// while it holds its lease.
    async fn step(
        &self,
        handle: &Handle,
        guard: &LeaseGuard,
        registered: Option<i64>,
        map: Option<&[ShardState]>,
        local: &mut HashMap<u32, Local>,
        client: &mut Option<etcd_client::Client>,
    ) {
        for shard in 0..self.shard_count {
            let want = member::want(
                &self.member,
                registered,
                map.and_then(|m| m.get(shard as usize)),
            );
            let now = local.get(&shard).copied();
            let drain = match now {
                Some(Local::Draining { since, .. }) => DrainProgress {
                    idle: handle.in_flight(shard).await.unwrap_or(0) == 0,
                    grace_over: since.elapsed() >= self.drain_grace,
                },
                _ => DrainProgress {
                    idle: false,
                    grace_over: false,
                },
            };
            let step = member::step(now, want, registered.is_some(), drain, Instant::now());
            let mut next = step.local;
            for effect in step.effects {
                match effect {
                    Effect::Acquire(epoch) => {
                        let _ = handle.send(Command::Acquire { shard, epoch }).await;
                        self.metrics.acquired.inc();
                        self.metrics
                            .epoch
                            .get_or_create(&ShardLabels { shard })
                            .set(i64::try_from(epoch).unwrap_or(i64::MAX));
                        info!(shard, epoch, "serving shard");
                    }
                    Effect::Resume { from, epoch } => {
                        let _ = handle.send(Command::Resume { shard, from, epoch }).await;
                        self.metrics.acquired.inc();
                        self.metrics
                            .epoch
                            .get_or_create(&ShardLabels { shard })
                            .set(i64::try_from(epoch).unwrap_or(i64::MAX));
                        // The same message as a fresh start: the log reads as serve intervals.
                        info!(shard, from, epoch, keys = "kept", "serving shard");
                    }
                    Effect::Suspend => {
                        let _ = handle.send(Command::Suspend { shard }).await;
                        self.metrics.released(shard, Reason::lease_lost);
                        info!(
                            shard,
                            reason = "lease_lost",
                            keys = "kept",
                            "stopped serving shard"
                        );
                    }
                    Effect::Discard => {
                        let _ = handle.send(Command::Release { shard }).await;
                        info!(
                            shard,
                            "dropped the keys kept for a shard served elsewhere now"
                        );
                    }
                    Effect::Drain(epoch) => {
                        let _ = handle.send(Command::Drain { shard }).await;
                        info!(shard, epoch, "draining shard for handover");
                    }
                    Effect::Stop {
                        reason,
                        drained_for,
                    } => {
                        let _ = handle.send(Command::Release { shard }).await;
                        if let Some(drained) = drained_for {
                            self.metrics.drain.observe(drained.as_secs_f64());
                        }
                        let reason = Reason::from(reason);
                        self.metrics.released(shard, reason);
                        info!(shard, ?reason, "stopped serving shard");
                    }
                    Effect::Renew(epoch) => {
                        let written = self.renew(guard, client, shard, epoch).await;
                        next = member::renewed(next, written);
                    }
                    Effect::HandOver(epoch) => {
                        let ok = self.hand_over(guard, client, shard, epoch).await;
                        next = member::handed_over(epoch, ok);
                    }
                }
            }
            match next {
                Some(state) => local.insert(shard, state),
                None => local.remove(&shard),
            };
        }
    }

    async fn connected<'a>(
        &self,
        client: &'a mut Option<etcd_client::Client>,
    ) -> Option<&'a mut etcd_client::Client> {
        if client.is_none() {
            *client = self.etcd.connect().await.ok();
        }
        client.as_mut()
    }

    /// Tells etcd the drained shard may go to its next owner. False when it must be retried.
    async fn hand_over(
        &self,
        guard: &LeaseGuard,
        client: &mut Option<etcd_client::Client>,
        shard: u32,
        epoch: u64,
    ) -> bool {
        let call = async {
            let c = self.connected(client).await?;
            Some(shardmap::release(c, shard, &self.member, epoch).await)
        };
        let result = guard.run(call).await.flatten();
        match result {
            Some(Ok(next)) => {
                info!(shard, epoch, next = %next, "handed shard over");
                return true;
            }
            // The shard changed meanwhile (for example, the elector retargeted it): retry
            // against the new state.
            Some(Err(ShardMapError::Fenced)) => {}
            Some(Err(error)) => {
                warn!(%error, shard, "handing the shard over failed");
                *client = None;
            }
            None => {
                warn!(
                    shard,
                    "etcd unreachable or too slow: retrying the shard handover"
                );
                *client = None;
            }
        }
        self.metrics.failed("handover");
        false
    }

    /// Renews the epoch of a shard held from an earlier registration: the epoch written, or
    /// `None` when it must be retried.
    async fn renew(
        &self,
        guard: &LeaseGuard,
        client: &mut Option<etcd_client::Client>,
        shard: u32,
        epoch: u64,
    ) -> Option<u64> {
        let call = async {
            let c = self.connected(client).await?;
            Some(shardmap::renew(c, shard, &self.member, epoch).await)
        };
        let result = guard.run(call).await.flatten();
        match result {
            Some(Ok(renewed)) => {
                info!(
                    shard,
                    epoch,
                    renewed,
                    "renewed the epoch of a shard held from an earlier registration"
                );
                self.metrics.renewed.inc();
                return Some(renewed);
            }
            Some(Err(ShardMapError::Fenced)) => {}
            Some(Err(error)) => {
                warn!(%error, shard, "renewing the shard epoch failed");
                *client = None;
            }
            None => {
                warn!(
                    shard,
                    "etcd unreachable or too slow: retrying the epoch renewal"
                );
                *client = None;
            }
        }
        self.metrics.failed("renewal");
        None
    }
}
