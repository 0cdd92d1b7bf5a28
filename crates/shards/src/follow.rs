//! Following the elector's `WatchShardMap` stream: the one follower every service uses.
//!
//! ```text
//!  elector WatchShardMap ──► follow_elector: ShardView (shard -> address, epoch; active only)
//!                              ├─► watcher router: where to send each shard's keys
//!                              ├─► watcher: a shard whose active owner or epoch changed is
//!                              │   resynced from the cache (the new owner started empty)
//!                              └─► reconciler: one work stream per distinct owner address
//!
//!  elector WatchShardMap ──► follow_elector_as(member_view): every shard's state and the
//!                            members' addresses (a queue member)
//! ```

use std::{sync::Arc, time::Duration};

use switchyard_ownership::ShardState;
use switchyard_proto::elector::v1::{
    self as pb, ShardMap, WatchShardMapRequest, elector_client::ElectorClient,
};
use switchyard_runtime::{Backoff, DialError, Dialer, Drain, Role};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::{member::Member, view::ShardView};

/// First and last delay between attempts to reach the elector.
const ELECTOR_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// Why the shard map stream ended.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("cannot reach the elector: {0}")]
    Connect(#[from] DialError),
    #[error("the elector answered {}: {}", .0.code(), .0.message())]
    Elector(#[from] tonic::Status),
    #[error("the elector closed the shard map stream")]
    Closed,
    #[error("the elector has {elector} shards, this service is configured for {configured}")]
    ShardCount { elector: u32, configured: u32 },
}

/// Follows the elector's shard map; the receiver holds `None` until the first map arrives.
pub fn follow_elector(
    dialer: Dialer,
    address: String,
    shard_count: u32,
    drain: Drain,
) -> (
    watch::Receiver<Option<Arc<ShardView>>>,
    impl Future<Output = ()> + Send + 'static,
) {
    follow_elector_as(dialer, address, shard_count, drain, move |map| {
        ShardView::from_map(map, shard_count)
    })
}

/// Follows the elector's shard map, each snapshot as `convert` makes it (a queue member needs
/// every shard's state, not only the active owners); the receiver holds `None` until the
/// first map arrives, and changes only when the conversion does.
pub fn follow_elector_as<T>(
    dialer: Dialer,
    address: String,
    shard_count: u32,
    drain: Drain,
    convert: impl Fn(&ShardMap) -> T + Send + Sync + 'static,
) -> (
    watch::Receiver<Option<Arc<T>>>,
    impl Future<Output = ()> + Send + 'static,
)
where
    T: PartialEq + Send + Sync + 'static,
{
    let (tx, rx) = watch::channel(None);
    let task = async move {
        let mut backoff = Backoff::new(ELECTOR_BACKOFF.0, ELECTOR_BACKOFF.1);
        loop {
            match stream_maps(&dialer, &address, shard_count, &tx, &convert, &drain).await {
                Ok(()) => return,
                Err(error) => {
                    warn!(%error, elector = %address, retry_in = ?backoff.current(), "shard map watch failed")
                }
            }
            if !backoff.wait(&drain).await {
                return;
            }
        }
    };
    (rx, task)
}

async fn stream_maps<T: PartialEq>(
    dialer: &Dialer,
    address: &str,
    shard_count: u32,
    tx: &watch::Sender<Option<Arc<T>>>,
    convert: &impl Fn(&ShardMap) -> T,
    drain: &Drain,
) -> Result<(), FollowError> {
    let endpoint = dialer.endpoint(address, Role::Elector)?;
    let mut client = ElectorClient::new(dialer.connect(&endpoint, Role::Elector).await?);
    let mut maps = client
        .watch_shard_map(WatchShardMapRequest {})
        .await?
        .into_inner();
    loop {
        let map = tokio::select! {
            map = maps.message() => map?,
            _ = drain.clone().signaled() => return Ok(()),
        };
        let Some(map) = map else {
            return Err(FollowError::Closed);
        };
        if map.shard_count != shard_count {
            return Err(FollowError::ShardCount {
                elector: map.shard_count,
                configured: shard_count,
            });
        }
        let converted = convert(&map);
        tx.send_if_modified(|current| {
            let changed = current.as_deref() != Some(&converted);
            if changed {
                if current.is_none() {
                    let active = map
                        .shards
                        .iter()
                        .filter(|s| s.state == pb::ShardState::Active as i32)
                        .count();
                    info!(active, "shard map received");
                }
                *current = Some(Arc::new(converted));
            }
            changed
        });
    }
}

/// A member's view of a map the elector sent: every shard's state (as many as `map` names;
/// a shard it leaves out is unassigned) and the members. The elector's snapshot is its inverse.
pub fn member_view(map: &ShardMap) -> (Vec<ShardState>, Vec<Member>) {
    let mut states = vec![ShardState::Unassigned; map.shard_count as usize];
    for shard in &map.shards {
        let state = match pb::ShardState::try_from(shard.state) {
            Ok(pb::ShardState::Active) => ShardState::Active {
                owner: shard.member_id.clone(),
                epoch: shard.epoch,
            },
            Ok(pb::ShardState::Releasing) => ShardState::Releasing {
                owner: shard.member_id.clone(),
                epoch: shard.epoch,
                next: shard.next_member_id.clone(),
            },
            _ => ShardState::Unassigned,
        };
        if let Some(slot) = states.get_mut(shard.shard as usize) {
            *slot = state;
        }
    }
    let members = map
        .members
        .iter()
        .map(|m| Member {
            id: m.id.clone(),
            address: m.address.clone(),
        })
        .collect();
    (states, members)
}
