//! Who serves each shard: one static queue, or the elector's shard map followed over gRPC.
//!
//! ```text
//!  elector WatchShardMap ──► ShardView (shard -> address, epoch; active shards only)
//!                              │
//!                              ├─► watcher router: where to send each shard's keys
//!                              ├─► watcher: a shard whose active owner or epoch changed is
//!                              │   resynced from the cache (the new owner started empty)
//!                              └─► reconciler: one work stream per distinct owner address
//!
//!  elector WatchShardMap ──► follow_elector_as: any conversion of the whole map (a queue
//!                            member takes every shard's state and the members' addresses)
//! ```

use std::{collections::HashSet, sync::Arc, time::Duration};

use switchyard_proto::elector::v1::{
    ShardMap, ShardState, WatchShardMapRequest, elector_client::ElectorClient,
};
use switchyard_runtime::{Backoff, Drain};
use tokio::sync::watch;
use tracing::{info, warn};

/// The epoch of every shard served by the one static queue (as the queue uses).
pub const STATIC_EPOCH: u64 = 1;
/// First and last delay between attempts to reach the elector.
const ELECTOR_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub address: Arc<str>,
    pub epoch: u64,
}

/// The active owner of every shard; `None` while a shard is unassigned or moving.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardView {
    pub owners: Vec<Option<Owner>>,
}

impl ShardView {
    pub fn single(address: &str, shard_count: u32) -> Self {
        let owner = Owner {
            address: address.into(),
            epoch: STATIC_EPOCH,
        };
        Self {
            owners: vec![Some(owner); shard_count as usize],
        }
    }

    pub fn owner(&self, shard: u32) -> Option<&Owner> {
        self.owners.get(shard as usize).and_then(Option::as_ref)
    }

    fn from_map(map: &ShardMap, shard_count: u32) -> Self {
        let mut owners = vec![None; shard_count as usize];
        for shard in &map.shards {
            let active = shard.state == ShardState::Active as i32 && !shard.address.is_empty();
            if let Some(slot) = owners.get_mut(shard.shard as usize)
                && active
            {
                *slot = Some(Owner {
                    address: shard.address.as_str().into(),
                    epoch: shard.epoch,
                });
            }
        }
        Self { owners }
    }

    /// The distinct addresses of the active owners (the queue replicas serving shards).
    pub fn addresses(&self) -> std::collections::BTreeSet<Arc<str>> {
        self.owners
            .iter()
            .flatten()
            .map(|o| o.address.clone())
            .collect()
    }

    /// Shards that have an active owner now that differs from `before`'s.
    pub fn new_owners(&self, before: &ShardView) -> HashSet<u32> {
        (0..self.owners.len() as u32)
            .filter(|&s| self.owner(s).is_some() && self.owner(s) != before.owner(s))
            .collect()
    }
}

/// Follows the elector's shard map; the receiver holds `None` until the first map arrives.
pub fn follow_elector(
    address: String,
    shard_count: u32,
    drain: Drain,
) -> (
    watch::Receiver<Option<Arc<ShardView>>>,
    impl Future<Output = ()> + Send + 'static,
) {
    follow_elector_as(address, shard_count, drain, move |map| {
        ShardView::from_map(map, shard_count)
    })
}

/// Follows the elector's shard map, each snapshot as `convert` makes it (a queue member needs
/// every shard's state, not only the active owners); the receiver holds `None` until the
/// first map arrives, and changes only when the conversion does.
pub fn follow_elector_as<T>(
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
        let endpoint = format!("http://{address}");
        loop {
            match stream_maps(&endpoint, shard_count, &tx, &convert, &drain).await {
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
    endpoint: &str,
    shard_count: u32,
    tx: &watch::Sender<Option<Arc<T>>>,
    convert: &impl Fn(&ShardMap) -> T,
    drain: &Drain,
) -> Result<(), tonic::Status> {
    let mut client = ElectorClient::connect(endpoint.to_owned())
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
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
            return Err(tonic::Status::unavailable(
                "the elector closed the shard map stream",
            ));
        };
        if map.shard_count != shard_count {
            return Err(tonic::Status::failed_precondition(format!(
                "the elector has {} shards, this service is configured for {shard_count}",
                map.shard_count
            )));
        }
        let converted = convert(&map);
        tx.send_if_modified(|current| {
            let changed = current.as_deref() != Some(&converted);
            if changed {
                if current.is_none() {
                    let active = map
                        .shards
                        .iter()
                        .filter(|s| s.state == ShardState::Active as i32)
                        .count();
                    info!(active, "shard map received");
                }
                *current = Some(Arc::new(converted));
            }
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use switchyard_proto::elector::v1::ShardAssignment;

    use super::*;

    fn assignment(shard: u32, address: &str, epoch: u64, state: ShardState) -> ShardAssignment {
        ShardAssignment {
            shard,
            member_id: address.into(),
            address: address.into(),
            epoch,
            state: state as i32,
            next_member_id: String::new(),
        }
    }

    #[test]
    fn only_active_shards_have_owners_and_moves_are_found() {
        let map = ShardMap {
            revision: 9,
            shard_count: 3,
            shards: vec![
                assignment(0, "a:1", 5, ShardState::Active),
                assignment(1, "a:1", 5, ShardState::Releasing),
                assignment(2, "", 0, ShardState::Unassigned),
            ],
            members: vec![],
        };
        let before = ShardView::from_map(&map, 3);
        assert_eq!(before.owner(0).unwrap().epoch, 5);
        assert!(before.owner(1).is_none());
        assert!(before.owner(2).is_none());

        let map = ShardMap {
            shards: vec![
                assignment(0, "a:1", 5, ShardState::Active),
                assignment(1, "b:1", 9, ShardState::Active),
                assignment(2, "", 0, ShardState::Unassigned),
            ],
            ..map
        };
        let after = ShardView::from_map(&map, 3);
        assert_eq!(after.new_owners(&before), HashSet::from([1]));
        let addresses: Vec<String> = after.addresses().iter().map(|a| a.to_string()).collect();
        assert_eq!(addresses, ["a:1", "b:1"]);
        assert!(after.new_owners(&after).is_empty());
    }
}
