//! Queue replicas are members: each keeps `/switchyard/members/<id>` (value: its gRPC
//! address) under an etcd lease it renews every third of the TTL.
//!
//! Safety before liveness: a member counts its lease as held only until
//! `sent + ttl - margin`, where `sent` is when the last *acknowledged* renewal was sent. etcd
//! renews on receipt, after `sent`, so the member gives up serving before etcd can have
//! expired the lease; `margin` covers clock-rate differences. When renewals fail that long,
//! the state turns [`LeaseState::Lost`] (logged and counted); the member then registers again
//! with a new lease as soon as etcd answers.

use std::time::Duration;

use etcd_client::PutOptions;
use switchyard_runtime::{Backoff, Drain};

use crate::etcd::Etcd;
use tokio::{sync::watch, time::Instant};
use tracing::{info, warn};

/// Where members are registered.
pub const MEMBERS_PREFIX: &str = "/switchyard/members/";
/// The default member lease TTL: a dead member's shards are free after at most this long.
pub const DEFAULT_TTL: Duration = Duration::from_secs(2);
/// First and last delay between attempts to reach etcd.
const RETRY: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("invalid member {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Member {
    pub id: String,
    /// gRPC address of the member's queue.
    pub address: String,
}

/// The longest member id: a Pod name's length.
pub const MAX_MEMBER_ID_BYTES: usize = 253;

/// What is wrong with `id` as a member id (one etcd path segment, 1 to
/// [`MAX_MEMBER_ID_BYTES`] bytes), if anything.
pub fn member_id_problem(id: &str) -> Option<String> {
    if id.is_empty() {
        Some("required".to_owned())
    } else if id.len() > MAX_MEMBER_ID_BYTES {
        Some(format!("{} bytes, at most {MAX_MEMBER_ID_BYTES}", id.len()))
    } else if id.contains('/') {
        Some("must not contain '/'".to_owned())
    } else {
        None
    }
}

impl Member {
    /// Checks the id ([`member_id_problem`]) and the address.
    pub fn validate(&self) -> Result<(), MembershipError> {
        if let Some(reason) = member_id_problem(&self.id) {
            return Err(MembershipError::Invalid {
                field: "id",
                reason,
            });
        }
        if self.address.is_empty() {
            return Err(MembershipError::Invalid {
                field: "address",
                reason: "must not be empty".to_owned(),
            });
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// Registered and renewed in time: the member may serve its shards.
    ///
    /// `registered` is the etcd revision of this registration's write. A shard activated for
    /// this member at an epoch (revision) below it was activated for an earlier registration,
    /// whose queue contents are gone: the member renews such a shard's epoch before serving
    /// it, so that the new epoch tells the watcher to resync the shard.
    Held { lease: i64, registered: i64 },
    /// Not registered, or renewals failed long enough that etcd may have expired the lease:
    /// the member must not serve.
    Lost,
}

/// Timing of a member lease.
#[derive(Clone, Copy, Debug)]
pub struct LeaseTiming {
    pub ttl: Duration,
    /// Subtracted from the TTL when deciding the lease may have expired.
    pub margin: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self {
            ttl: DEFAULT_TTL,
            // 10 % of the TTL: far above clock-rate drift, small against the TTL.
            margin: DEFAULT_TTL / 10,
        }
    }
}

/// Registers `member` and keeps it registered until `drain`, when the lease is revoked so
/// its shards are free at once. Returns the lease state, which starts `Lost`.
pub fn join(
    etcd: Etcd,
    member: Member,
    timing: LeaseTiming,
    drain: Drain,
) -> Result<(watch::Receiver<LeaseState>, tokio::task::JoinHandle<()>), MembershipError> {
    member.validate()?;
    let (state, rx) = watch::channel(LeaseState::Lost);
    let task = tokio::spawn(async move {
        let mut backoff = Backoff::new(RETRY.0, RETRY.1);
        loop {
            match hold(&etcd, &member, timing, &state, drain.clone()).await {
                Ok(()) => return,
                Err(error) => {
                    if state.send_replace(LeaseState::Lost) != LeaseState::Lost {
                        warn!(member = %member.id, "member lease may have expired: stopped serving");
                    }
                    warn!(%error, member = %member.id, retry_in = ?backoff.current(), "cannot hold the member lease in etcd");
                }
            }
            if !backoff.wait(&drain).await {
                return;
            }
        }
    });
    Ok((rx, task))
}

/// One registration: grant, put, renew until the lease is lost (error) or `drain` (Ok).
async fn hold(
    etcd: &Etcd,
    member: &Member,
    timing: LeaseTiming,
    state: &watch::Sender<LeaseState>,
    drain: Drain,
) -> Result<(), MembershipError> {
    let mut client = etcd.connect().await?;
    let ttl_secs = i64::try_from(timing.ttl.as_secs().max(1)).unwrap_or(i64::MAX);
    let granted_at = Instant::now();
    let lease = client.lease_grant(ttl_secs, None).await?.id();
    let registered = client
        .put(
            format!("{MEMBERS_PREFIX}{}", member.id),
            member.address.clone(),
            Some(PutOptions::new().with_lease(lease)),
        )
        .await?
        .header()
        .map_or(0, |h| h.revision());
    let (mut keeper, mut responses) = client.lease_keep_alive(lease).await?;
    state.send_replace(LeaseState::Held { lease, registered });
    info!(member = %member.id, lease, registered, "member registered");

    let mut valid_until = granted_at + timing.ttl - timing.margin;
    let mut renew = tokio::time::interval(timing.ttl / 3);
    let mut sent = Vec::new();
    loop {
        tokio::select! {
            _ = renew.tick() => {
                sent.push(Instant::now());
                // A failed send surfaces as the deadline passing; a send that cannot go out
                // must not hold the deadline back.
                let _ = tokio::time::timeout_at(valid_until, keeper.keep_alive()).await;
            }
            response = responses.message() => match response {
                Ok(Some(r)) if r.ttl() > 0 => {
                    // Responses come in order: this one answers the oldest renewal in flight.
                    if !sent.is_empty() {
                        valid_until = sent.remove(0) + timing.ttl - timing.margin;
                    }
                }
                Ok(Some(_)) => return Err(MembershipError::Invalid {
                    field: "lease",
                    reason: format!("lease {lease} expired in etcd"),
                }),
                Ok(None) => return Err(etcd_client::Error::InvalidArgs("keep-alive stream ended".into()).into()),
                Err(error) => return Err(error.into()),
            },
            _ = tokio::time::sleep_until(valid_until) => {
                return Err(etcd_client::Error::InvalidArgs(format!(
                    "no renewal acknowledged within {:?}", timing.ttl - timing.margin
                )).into());
            }
            _ = drain.clone().signaled() => {
                state.send_replace(LeaseState::Lost);
                // Free the member's shards at once rather than after the TTL; an etcd that
                // does not answer leaves them to the TTL.
                let _ = tokio::time::timeout(timing.ttl, client.lease_revoke(lease)).await;
                info!(member = %member.id, "member left");
                return Ok(());
            }
        }
    }
}
