//! What the watcher and the reconciler need of the shard map: the active owner of each shard.

use std::{collections::HashSet, sync::Arc};

use switchyard_proto::elector::v1::{ShardMap, ShardState as ProtoState};

/// The epoch of every shard served by the one static queue (no elector).
pub const STATIC_EPOCH: u64 = 1;

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

    /// The active owners of `map` (`shard_count` shards).
    pub(crate) fn from_map(map: &ShardMap, shard_count: u32) -> Self {
        let mut owners = vec![None; shard_count as usize];
        for shard in &map.shards {
            let active = shard.state == ProtoState::Active as i32 && !shard.address.is_empty();
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

#[cfg(test)]
mod tests {
    use switchyard_proto::elector::v1::ShardAssignment;

    use super::*;

    type ShardState = ProtoState;

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
            leader_id: String::new(),
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
