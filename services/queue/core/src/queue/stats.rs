//! Introspection: figures per controller and shard, and running totals.

use std::{
    collections::HashMap,
    hash::BuildHasher,
    time::{Duration, Instant},
};

use super::{Queue, ShardState, State};
use crate::key::{ControllerId, ValidKey};

/// Introspection figures of one controller's keys in one shard.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardStats {
    pub controller: ControllerId,
    pub shard: u32,
    pub epoch: u64,
    /// Keys waiting, ready or delayed.
    pub depth: u64,
    pub in_flight: u64,
    /// Keys with failures not yet forgotten.
    pub retrying: u64,
    /// Age of the oldest ready key.
    pub oldest_ready: Duration,
    /// Sum of the ages of the leases in flight (client-go's unfinished work).
    pub unfinished: Duration,
    /// Age of the oldest lease in flight.
    pub longest_running: Duration,
}

/// Running totals, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub adds: u64,
    pub retries: u64,
    pub lease_expirations: u64,
    pub refused_stale_epoch: u64,
    pub refused_unknown_lease: u64,
    /// Outcomes and extensions for a lease another worker holds.
    pub refused_foreign_lease: u64,
}

impl Queue {
    // ---- introspection ---------------------------------------------------------------

    /// Figures per known controller and served shard (every served shard, even when empty;
    /// every controller known, even before its first key).
    pub fn stats(&self, now: Instant) -> Vec<ShardStats> {
        let mut stats: HashMap<(ControllerId, u32), ShardStats> = HashMap::new();
        let known = self.keys.len().max(self.controllers.len());
        // A suspended shard is not served: its kept keys are not this replica's backlog.
        let served = self
            .shards
            .iter()
            .filter(|(_, state)| !matches!(state, ShardState::Suspended(_)));
        for (&shard, state) in served {
            for controller in 0..known as ControllerId {
                stats.insert(
                    (controller, shard),
                    ShardStats {
                        controller,
                        shard,
                        epoch: state.epoch(),
                        ..Default::default()
                    },
                );
            }
        }
        for (controller, queue) in self.controllers.iter().enumerate() {
            for entry in queue.entries() {
                let Some(s) = stats.get_mut(&(controller as ControllerId, entry.shard)) else {
                    continue;
                };
                match entry.state {
                    State::Ready(_) => {
                        s.depth += 1;
                        s.oldest_ready = s
                            .oldest_ready
                            .max(now.saturating_duration_since(entry.ready_since));
                    }
                    State::Delayed(_) => s.depth += 1,
                    State::Leased { .. } => s.in_flight += 1,
                    // `entries` yields held keys only.
                    State::Finished => {}
                }
                if entry.failures > 0 {
                    s.retrying += 1;
                }
            }
        }
        for lease in self.leases.values() {
            if let Some(s) = stats.get_mut(&(lease.key.controller(), lease.key.shard())) {
                let age = now.saturating_duration_since(lease.leased_at);
                s.unfinished += age;
                s.longest_running = s.longest_running.max(age);
            }
        }
        let mut stats: Vec<_> = stats.into_values().collect();
        stats.sort_unstable_by_key(|s| (s.controller, s.shard));
        stats
    }

    /// Whether `key` is ready, delayed or leased (for tests).
    pub fn contains(&self, key: &ValidKey) -> bool {
        let hash = self.hasher.hash_one(key.object());
        self.controllers
            .get(key.controller() as usize)
            .is_some_and(|queue| {
                queue
                    .find(key.object(), hash)
                    .and_then(|slot| queue.get(slot))
                    .is_some_and(|entry| entry.is_held())
            })
    }
}
