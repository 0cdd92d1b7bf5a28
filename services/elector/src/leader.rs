//! The active elector: elector replicas campaign with etcd's election API; the leader keeps
//! the shard map in step with the live members; followers wait and take over as soon as the
//! leader's key goes away (its lease expires or it resigns).
//!
//! ```text
//!  campaign ──elected──► loop: members (watch) + shard map ─► assign ─► plan ─► txn (fenced on
//!     ▲                   (less those marked draining)                         the leader key)
//!     └──────────── lease lost / fenced / etcd error: back to campaigning ◄────┘
//! ```
//!
//! A transition whose view went stale before it was written (a release, a renewal or a
//! registration landed meanwhile, see [`shardmap::apply`]) is refused by etcd; the leader then
//! reads and plans again after [`REPLAN`].

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use switchyard_elector_core::{Transition, assign, plan};
use switchyard_runtime::{Backoff, Dialer, Drain};
use switchyard_shards::{Etcd, draining};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, info, warn};

use crate::{liveness, membership, shardmap};

/// The etcd election the elector replicas campaign in (its keys are in etcd's access table).
pub use switchyard_shards::access::ELECTION;
/// How often the leader re-checks the map even without a change notification.
const RESYNC: Duration = Duration::from_secs(1);
const RETRY: Duration = Duration::from_millis(500);
/// After a transition was refused as stale, the leader plans again this soon. What refused
/// it is already in etcd, so a short wait suffices; the wait keeps a member watch that lags
/// behind etcd from turning the loop into a busy one.
const REPLAN: Duration = Duration::from_millis(20);

#[derive(Clone, Debug)]
pub struct LeaderConfig {
    pub id: String,
    pub shard_count: u32,
    /// Shards a member may hold above `ceil(S / members)`.
    pub slack: u32,
    /// TTL of the leader's election lease: how fast a follower takes over a dead leader.
    pub ttl: Duration,
    /// Whether the leader revokes the registration of a member whose port refuses
    /// connections (see [`liveness`]).
    pub member_probe: bool,
    /// Registrations revoked that way.
    pub members_found_gone: Counter,
}

impl LeaderConfig {
    /// The defaults of the elector's flags: slack 1, a 2 s election TTL, the member probe on.
    pub fn new(id: impl Into<String>, shard_count: u32) -> Self {
        Self {
            id: id.into(),
            shard_count,
            slack: 1,
            ttl: Duration::from_secs(2),
            member_probe: true,
            members_found_gone: Counter::default(),
        }
    }
}

/// Campaigns and, while leading, keeps the shard map in step, until `drain`. `leading`
/// reports whether this replica leads.
pub async fn run(
    etcd: Etcd,
    dialer: Dialer,
    config: LeaderConfig,
    leading: watch::Sender<bool>,
    drain: Drain,
) {
    // A fixed pause, jittered so that electors cut off together do not campaign in step.
    let mut backoff = Backoff::new(RETRY, RETRY);
    loop {
        let result = tokio::select! {
            result = campaign_and_lead(&etcd, &dialer, &config, &leading, drain.clone()) => result,
            _ = drain.clone().signaled() => return,
        };
        leading.send_replace(false);
        if let Err(error) = result {
            warn!(%error, retry_in = ?backoff.current(), "elector lost or could not reach etcd");
        }
        if !backoff.wait(&drain).await {
            return;
        }
    }
}

async fn campaign_and_lead(
    etcd: &Etcd,
    dialer: &Dialer,
    config: &LeaderConfig,
    leading: &watch::Sender<bool>,
    drain: Drain,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut client = etcd.connect().await?;
    let ttl = i64::try_from(config.ttl.as_secs().max(1)).unwrap_or(i64::MAX);
    let lease = client.lease_grant(ttl, None).await?.id();
    let (mut keeper, mut renewals) = client.lease_keep_alive(lease).await?;
    let campaign = {
        let mut client = client.clone();
        let id = config.id.clone();
        async move { client.campaign(ELECTION, id, lease).await }
    };
    tokio::pin!(campaign);
    let mut renew = tokio::time::interval(config.ttl / 3);
    // Keep the lease alive while waiting to be elected.
    let elected = loop {
        tokio::select! {
            elected = &mut campaign => break elected?,
            _ = renew.tick() => { keeper.keep_alive().await?; }
            renewal = renewals.message() => { renewal?; }
        }
    };
    let leader_key = elected
        .leader()
        .map(|k| k.key().to_vec())
        .ok_or("campaign answered without a leader key")?;
    info!(elector = %config.id, "elected: leading the shard assignment");
    leading.send_replace(true);

    let (mut members, watch) = membership::watch_members(etcd.clone(), drain.clone());
    // The watch lives as long as this term of leadership.
    let _watch = AbortOnDropHandle::new(watch);
    let _liveness = config.member_probe.then(|| {
        AbortOnDropHandle::new(tokio::spawn(liveness::run(
            client.clone(),
            dialer.clone(),
            members.clone(),
            config.members_found_gone.clone(),
        )))
    });
    let mut resync = tokio::time::interval(RESYNC);
    let mut replan = false;
    let mut marks_unreadable = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(REPLAN), if replan => {}
            _ = renew.tick() => { keeper.keep_alive().await?; }
            renewal = renewals.message() => match renewal? {
                Some(r) if r.ttl() > 0 => {}
                _ => return Err("the elector's lease expired".into()),
            },
            changed = members.changed() => { changed?; }
            _ = resync.tick() => {}
            _ = drain.clone().signaled() => {
                // Step down at once so a follower takes over without waiting for the TTL.
                let _ = client.lease_revoke(lease).await;
                return Ok(());
            }
        }
        replan = false;
        let Some(live) = members.borrow().clone() else {
            continue;
        };
        let ids: Vec<String> = live.into_iter().map(|m| m.id).collect();
        // Members an operator marked draining get no shards: theirs leave by the planned
        // handover, as from any live member. When every member is draining, none is spared.
        // Marks that cannot be read (an etcd whose access table predates them) leave the
        // assignment as it would be without them, rather than ending the term.
        let draining = match draining::read(&mut client).await {
            Ok(registrations) => registrations.draining(),
            Err(error) => {
                if !marks_unreadable {
                    warn!(%error, "cannot read the draining marks: assigning as if there were none");
                    marks_unreadable = true;
                }
                Default::default()
            }
        };
        let candidates: Vec<String> = ids
            .iter()
            .filter(|id| !draining.contains(*id))
            .cloned()
            .collect();
        let candidates = if candidates.is_empty() {
            &ids
        } else {
            &candidates
        };
        let Some(desired) = assign(config.shard_count, candidates, config.slack) else {
            continue;
        };
        let (current, revision) = shardmap::read(&mut client, config.shard_count).await?;
        let transitions = plan(&current, &desired, &ids);
        if transitions.is_empty() {
            continue;
        }
        for transition in &transitions {
            let shard = transition.shard();
            let from = current.get(shard as usize);
            match transition {
                Transition::Activate { owner, gone, .. } => {
                    debug!(shard, ?from, %owner, ?gone, revision, "activating shard");
                }
                Transition::Release { owner, next, .. } => {
                    debug!(shard, ?from, %owner, %next, revision, "releasing shard");
                }
            }
        }
        let applied =
            shardmap::apply(&mut client, &leader_key, &current, revision, &transitions).await?;
        info!(
            transitions = transitions.len(),
            written = applied.written,
            members = ids.len(),
            "updated the shard map"
        );
        if !applied.stale.is_empty() {
            info!(shards = ?applied.stale, revision, "shards changed since the map was read: planning again");
            replan = true;
        }
    }
}
