//! The keys waiting to be sent, per shard: one entry per key, adds of a key merged into it
//! (the higher priority, the shorter delay, the earliest observation, the latest causes).

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, SystemTime},
};

use switchyard_shards::ShardView;
use switchyard_work::{MAX_CAUSES, Priority, WorkKey, earliest};

use super::{BATCH, Cause};

/// A key waiting to be sent: its priority, its delay, what caused it and when the earliest
/// of its events was observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Waiting {
    pub(super) priority: Priority,
    pub(super) delay: Duration,
    pub(super) causes: Vec<Cause>,
    pub(super) observed_at: Option<SystemTime>,
}

impl Waiting {
    pub(super) fn merge(&mut self, other: Waiting) {
        self.priority = self.priority.max(other.priority);
        self.delay = self.delay.min(other.delay);
        self.observed_at = earliest(self.observed_at, other.observed_at);
        for cause in other.causes {
            if self.causes.len() == MAX_CAUSES {
                self.causes.remove(0);
            }
            self.causes.push(cause);
        }
    }
}

pub(super) type Batch = Vec<(WorkKey, Waiting)>;

#[derive(Debug, Default)]
pub(super) struct Pending {
    pub(super) by_shard: BTreeMap<u32, HashMap<WorkKey, Waiting>>,
    pub(super) total: usize,
    /// Where the next [`Pending::take`] starts, so that a limit does not always favour the
    /// same shards.
    pub(super) next: u32,
}

impl Pending {
    pub(super) fn insert(&mut self, shard: u32, key: WorkKey, waiting: Waiting) {
        let keys = self.by_shard.entry(shard).or_default();
        match keys.get_mut(&key) {
            Some(w) => w.merge(waiting),
            None => {
                keys.insert(key, waiting);
                self.total += 1;
            }
        }
    }

    /// Takes up to [`BATCH`] keys of every shard that has an owner and is not `held`, at
    /// most `limit` keys in all, starting after the last shard the previous call took.
    pub(super) fn take(
        &mut self,
        view: &ShardView,
        held: impl Fn(u32) -> bool,
        limit: usize,
    ) -> Vec<(u32, Batch)> {
        let mut batches = Vec::new();
        let mut taken_keys = 0;
        let (after, before): (Vec<_>, Vec<_>) = self
            .by_shard
            .iter_mut()
            .partition(|(shard, _)| **shard >= self.next);
        for (&shard, keys) in after.into_iter().chain(before) {
            let most = BATCH.min(limit - taken_keys);
            if most == 0 {
                break;
            }
            if view.owner(shard).is_none() || keys.is_empty() || held(shard) {
                continue;
            }
            let batch: Batch = if keys.len() <= most {
                keys.drain().collect()
            } else {
                let taken: Vec<WorkKey> = keys.keys().take(most).cloned().collect();
                taken
                    .into_iter()
                    .filter_map(|k| keys.remove_entry(&k))
                    .collect()
            };
            self.total -= batch.len();
            taken_keys += batch.len();
            self.next = shard.wrapping_add(1);
            batches.push((shard, batch));
        }
        self.by_shard.retain(|_, keys| !keys.is_empty());
        batches
    }
}
