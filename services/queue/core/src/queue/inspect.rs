//! One key, looked at: where it stands now and how its latest lease ended (`DescribeKey`,
//! `kubectl switchyard why`).

use std::{hash::BuildHasher, time::Instant};

use super::{
    LeaseId, Queue, ShardState, State, WorkerId,
    history::{self, History, LastOutcome, OutcomeKind, TraceId, truncate_error},
};
use crate::key::{ControllerId, ValidKey};

/// Where a held key stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyPhase {
    /// Not held: never added, or finished and not added since.
    Absent,
    /// Ready since then, waiting for a worker.
    Queued { since: Instant },
    /// Ready at that time (a backoff after failures, a requeue after, a delayed add).
    Delayed { until: Instant },
    /// Leased to `worker` until `deadline`; `readd_pending` when added again meanwhile.
    Leased {
        worker: WorkerId,
        deadline: Instant,
        readd_pending: bool,
    },
}

/// A key as the replica that serves its shard sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyView<'a> {
    pub epoch: u64,
    pub phase: KeyPhase,
    /// Failures not yet forgotten.
    pub failures: u32,
    pub last: Option<&'a LastOutcome>,
}

impl Queue {
    /// Remembers the latest outcome of at most `capacity` keys (see [`History`]) instead of
    /// [`DEFAULT_OUTCOME_HISTORY`](super::DEFAULT_OUTCOME_HISTORY).
    pub fn with_outcome_history(mut self, capacity: usize) -> Self {
        self.history = History::new(capacity);
        self
    }

    /// Keys whose latest outcome is remembered.
    pub fn outcomes_remembered(&self) -> usize {
        self.history.len()
    }

    /// `key` now, or `None` when its shard is not served here (draining shards count: their
    /// leases still finish here).
    pub fn describe(&self, key: &ValidKey) -> Option<KeyView<'_>> {
        let epoch = match self.shards.get(&key.shard())? {
            ShardState::Active(e) | ShardState::Draining(e) | ShardState::Suspended(e) => *e,
        };
        let hash = self.hasher.hash_one(key.object());
        let entry = self
            .controllers
            .get(key.controller() as usize)
            .and_then(|queue| {
                queue
                    .find(key.object(), hash)
                    .and_then(|slot| queue.get(slot))
            });
        let phase = match entry.map(|e| &e.state) {
            None | Some(State::Finished) => KeyPhase::Absent,
            Some(State::Ready(_)) => KeyPhase::Queued {
                since: entry.map_or_else(Instant::now, |e| e.ready_since),
            },
            Some(State::Delayed(until)) => KeyPhase::Delayed { until: *until },
            Some(State::Leased { pending }) => {
                let lease = self.leases.values().find(|l| l.key == *key);
                match lease {
                    Some(lease) => KeyPhase::Leased {
                        worker: lease.worker,
                        deadline: lease.deadline,
                        readd_pending: pending.is_some(),
                    },
                    // A leased entry always has its lease; answer absent rather than guess.
                    None => KeyPhase::Absent,
                }
            }
        };
        Some(KeyView {
            epoch,
            phase,
            failures: entry.map_or(0, |e| e.failures),
            last: entry.and_then(|e| self.history.get(e.history)),
        })
    }

    /// The held keys with failures not yet forgotten, of `controller` or of all: the most
    /// failures first (then by controller and name), at most `limit`, each described; and how
    /// many there are in all. Walks every held key of the controllers asked for.
    pub fn failing(
        &self,
        controller: Option<ControllerId>,
        limit: usize,
    ) -> (Vec<(ValidKey, KeyView<'_>)>, usize) {
        let mut failing: Vec<(u32, ValidKey)> = Vec::new();
        for (id, queue) in self.controllers.iter().enumerate() {
            let id = id as ControllerId;
            if controller.is_some_and(|c| c != id) {
                continue;
            }
            failing.extend(
                queue
                    .entries()
                    .filter(|entry| entry.failures > 0)
                    .map(|entry| {
                        (
                            entry.failures,
                            ValidKey::from_parts(id, entry.shard, entry.key.clone()),
                        )
                    }),
            );
        }
        let total = failing.len();
        let order = |(a_failures, a): &(u32, ValidKey), (b_failures, b): &(u32, ValidKey)| {
            b_failures
                .cmp(a_failures)
                .then(a.controller().cmp(&b.controller()))
                .then_with(|| a.namespace().cmp(b.namespace()))
                .then_with(|| a.name().cmp(b.name()))
        };
        if failing.len() > limit {
            failing.select_nth_unstable_by(limit, order);
            failing.truncate(limit);
        }
        failing.sort_unstable_by(order);
        let described = failing
            .into_iter()
            .filter_map(|(_, key)| self.describe(&key).map(|view| (key, view)))
            .collect();
        (described, total)
    }

    /// Records how lease `id` ends, before it is finished. Nothing for an unknown lease.
    pub(super) fn note_end(
        &mut self,
        id: LeaseId,
        kind: OutcomeKind,
        error: Option<&str>,
        now: Instant,
    ) {
        if self.history.capacity() == 0 {
            return;
        }
        let Some(info) = self.leases.get(&id) else {
            return;
        };
        let controller = info.key.controller();
        let queue = &mut self.controllers[controller as usize];
        let Some(entry) = queue.get_mut(info.slot).filter(|e| e.seq == info.seq) else {
            return;
        };
        let outcome = LastOutcome {
            kind,
            finished_at: now,
            attempt: entry.failures.saturating_add(1),
            error: error.map(truncate_error),
            trace_id: TraceId::of_causes(&info.causes.kept),
            worker: info.worker,
            duration: now.saturating_duration_since(info.leased_at),
        };
        let owner = (controller, info.slot);
        let Some((controller, slot)) = self.history.record(&mut entry.history, owner, outcome)
        else {
            return;
        };
        // The least recently finished key, forgotten: dropped if no longer held.
        let queue = &mut self.controllers[controller as usize];
        if let Some(entry) = queue.get_mut(slot) {
            entry.history = history::NIL;
            if !entry.is_held() {
                queue.remove(slot);
            }
        }
        // The next key to be forgotten is known now: its index bucket starts loading while
        // this lease ends and the next runs, instead of when that key's removal needs it.
        if let Some((controller, slot)) = self.history.least_recent() {
            self.controllers[controller as usize].prefetch_index(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use super::*;
    use crate::{
        AddOutcome, BackoffConfig, KeySpace, Origin, Outcome, Priority, QueueConfig,
        SequentialLeaseIds, queue::Cause,
    };

    const RS: &str = "apps/v1/ReplicaSet";
    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

    fn queue(history: usize) -> (Queue, KeySpace, Instant) {
        let mut q = Queue::new(
            QueueConfig {
                shard_count: 4,
                lease_timeout: Duration::from_secs(10),
                capacity: 100,
                max_controllers: 4,
                backoff: BackoffConfig {
                    qps: 0.0,
                    ..Default::default()
                },
            },
            &[RS],
            SequentialLeaseIds::default(),
        )
        .with_outcome_history(history);
        let now = Instant::now();
        for shard in 0..4 {
            q.acquire(shard, 7, now);
        }
        (q, KeySpace::new(&[RS], 4), now)
    }

    fn traced() -> Cause {
        Arc::from(vec![(
            "traceparent".to_owned(),
            format!("00-{TRACE}-00f067aa0ba902b7-01"),
        )])
    }

    #[test]
    fn a_failing_key_shows_its_backoff_error_trace_and_worker() {
        let (mut q, space, now) = queue(8);
        let key = space.validate_parts(RS, "web", "api").unwrap();
        assert_eq!(q.describe(&key).unwrap().phase, KeyPhase::Absent);
        q.add_caused(
            &key,
            Priority::Normal,
            Duration::ZERO,
            Origin::traced(traced()),
            now,
        )
        .unwrap();
        assert_eq!(
            q.describe(&key).unwrap().phase,
            KeyPhase::Queued { since: now }
        );

        let lease = q.lease(3, &[], now).unwrap();
        let view = q.describe(&key).unwrap();
        assert_eq!(
            view.phase,
            KeyPhase::Leased {
                worker: 3,
                deadline: lease.deadline,
                readd_pending: false
            }
        );
        assert_eq!(view.epoch, 7);

        let later = now + Duration::from_millis(40);
        q.complete_with_error(
            3,
            lease.shard(),
            lease.epoch,
            lease.id,
            Outcome::Failed,
            Some("replicasets \"api\" is forbidden"),
            later,
        )
        .unwrap();
        let view = q.describe(&key).unwrap();
        assert_eq!(view.failures, 1);
        assert!(matches!(view.phase, KeyPhase::Delayed { until } if until > later));
        let last = view.last.expect("the outcome is remembered");
        assert_eq!(last.kind, OutcomeKind::Failed);
        assert_eq!(
            last.error.as_deref(),
            Some("replicasets \"api\" is forbidden")
        );
        assert_eq!(last.trace_id.map(|t| t.to_string()).as_deref(), Some(TRACE));
        assert_eq!((last.worker, last.attempt), (3, 1));
        assert_eq!(last.duration, Duration::from_millis(40));

        // The retry is the second attempt; its lease expires unanswered.
        let retry_at = later + Duration::from_secs(1);
        q.advance(retry_at);
        let lease = q.lease(4, &[], retry_at).unwrap();
        assert_eq!(lease.attempt, 2);
        q.advance(lease.deadline);
        let last = q.describe(&key).unwrap().last.unwrap().clone();
        assert_eq!(last.kind, OutcomeKind::LeaseExpired);
        assert_eq!((last.worker, last.attempt), (4, 2));
        assert_eq!(last.error, None);
        assert_eq!(q.describe(&key).unwrap().failures, 2);
    }

    /// Adds, leases and finishes `name` with `outcome`; returns the add's outcome.
    fn cycle(q: &mut Queue, space: &KeySpace, name: &str, outcome: Outcome) -> AddOutcome {
        let now = Instant::now();
        let key = space.validate_parts(RS, "ns", name).unwrap();
        let added = q.add(&key, Priority::Normal, Duration::ZERO, now).unwrap();
        let lease = q.lease(1, &[], now).unwrap();
        assert_eq!(lease.key, key);
        q.complete(1, lease.shard(), lease.epoch, lease.id, outcome, now)
            .unwrap();
        added
    }

    /// Entries in the slabs: held keys and finished ones the history remembers.
    fn entries(q: &Queue) -> usize {
        q.controllers
            .iter()
            .map(|c| c.slots.iter().flatten().count())
            .sum()
    }

    #[test]
    fn a_remembered_key_added_again_is_held_as_a_new_key() {
        let (mut q, space, _) = queue(4);
        assert_eq!(cycle(&mut q, &space, "a", Outcome::Done), AddOutcome::Added);
        let a = space.validate_parts(RS, "ns", "a").unwrap();
        assert!(!q.contains(&a));
        assert_eq!((q.len(), q.totals().adds), (0, 1));
        assert_eq!(q.describe(&a).unwrap().phase, KeyPhase::Absent);
        // Its entry stays for the history, and the next add makes it held again.
        assert_eq!(entries(&q), 1);
        assert_eq!(
            cycle(&mut q, &space, "a", Outcome::Failed),
            AddOutcome::Added
        );
        assert_eq!((q.len(), q.totals().adds), (1, 2));
        let view = q.describe(&a).unwrap();
        assert!(matches!(view.phase, KeyPhase::Delayed { .. }));
        assert_eq!((view.failures, view.last.unwrap().attempt), (1, 1));
        assert_eq!(entries(&q), 1, "one entry per key");
    }

    #[test]
    fn finished_keys_count_against_neither_the_length_nor_the_capacity() {
        let (mut q, space, _) = queue(1_000);
        for i in 0..100 {
            cycle(&mut q, &space, &format!("k{i}"), Outcome::Done);
        }
        assert_eq!((q.len(), q.outcomes_remembered()), (0, 100));
        // The queue holds 100 keys at most: all can still be added.
        let now = Instant::now();
        for i in 0..100 {
            let key = space.validate_parts(RS, "ns", &format!("new{i}")).unwrap();
            q.add(&key, Priority::Normal, Duration::ZERO, now).unwrap();
        }
        let full = space.validate_parts(RS, "ns", "k0").unwrap();
        assert_eq!(
            q.add(&full, Priority::Normal, Duration::ZERO, now),
            Err(crate::Error::Full { capacity: 100 }),
            "a remembered key added again is held again, and counts"
        );
    }

    #[test]
    fn a_forgotten_key_frees_its_entry_and_a_released_shard_its_memories() {
        let (mut q, space, _) = queue(3);
        for i in 0..50 {
            cycle(&mut q, &space, &format!("k{i}"), Outcome::Done);
            assert!(entries(&q) <= 3, "{} entries after {i} keys", entries(&q));
        }
        assert_eq!(q.outcomes_remembered(), 3);
        // A held key whose memory is forgotten keeps its entry.
        let now = Instant::now();
        let held = space.validate_parts(RS, "ns", "held").unwrap();
        q.add(&held, Priority::Normal, Duration::ZERO, now).unwrap();
        let lease = q.lease(1, &[], now).unwrap();
        q.complete(
            1,
            lease.shard(),
            lease.epoch,
            lease.id,
            Outcome::Failed,
            now,
        )
        .unwrap();
        // The held key waits out its backoff; the others pass it.
        for i in 50..60 {
            cycle(&mut q, &space, &format!("k{i}"), Outcome::Done);
        }
        let view = q.describe(&held).unwrap();
        assert!(matches!(view.phase, KeyPhase::Delayed { .. }));
        assert_eq!(view.failures, 1);
        assert!(view.last.is_none(), "forgotten by the history, still held");
        assert_eq!(q.len(), 1);
        for shard in 0..4 {
            q.release(shard);
        }
        assert_eq!((entries(&q), q.outcomes_remembered(), q.len()), (0, 0, 0));
    }

    #[test]
    fn done_keys_are_remembered_within_the_bound_only() {
        let (mut q, space, now) = queue(2);
        for name in ["a", "b", "c"] {
            let key = space.validate_parts(RS, "ns", name).unwrap();
            q.add(&key, Priority::Normal, Duration::ZERO, now).unwrap();
            let lease = q.lease(1, &[], now).unwrap();
            q.complete(1, lease.shard(), lease.epoch, lease.id, Outcome::Done, now)
                .unwrap();
        }
        assert_eq!(q.outcomes_remembered(), 2);
        let a = space.validate_parts(RS, "ns", "a").unwrap();
        let c = space.validate_parts(RS, "ns", "c").unwrap();
        assert!(q.describe(&a).unwrap().last.is_none());
        assert_eq!(
            q.describe(&c).unwrap().last.unwrap().kind,
            OutcomeKind::Done
        );
        assert_eq!(q.describe(&c).unwrap().phase, KeyPhase::Absent);
        q.release(0);
        q.release(1);
        q.release(2);
        q.release(3);
        assert!(
            q.describe(&c).is_none(),
            "a shard not served is not described"
        );
    }

    #[test]
    fn failing_keys_come_most_failures_first_within_the_limit() {
        let (mut q, space, now) = queue(8);
        let fail = |q: &mut Queue, at: Instant| {
            q.advance(at);
            let lease = q.lease(1, &[], at).unwrap();
            q.complete_with_error(
                1,
                lease.shard(),
                lease.epoch,
                lease.id,
                Outcome::Failed,
                Some("refused"),
                at,
            )
            .unwrap();
        };
        let key = |name| space.validate_parts(RS, "ns", name).unwrap();
        for name in ["b", "a", "done"] {
            q.add(&key(name), Priority::Normal, Duration::ZERO, now)
                .unwrap();
        }
        // Leased in the order added: b, a, done.
        fail(&mut q, now);
        fail(&mut q, now);
        let lease = q.lease(1, &[], now).unwrap();
        q.complete(1, lease.shard(), lease.epoch, lease.id, Outcome::Done, now)
            .unwrap();
        // b is retried first (its backoff ends first) and fails again.
        fail(&mut q, now + Duration::from_secs(60));

        let (all, total) = q.failing(None, 10);
        let names: Vec<_> = all.iter().map(|(k, v)| (k.name(), v.failures)).collect();
        assert_eq!((names, total), (vec![("b", 2), ("a", 1)], 2));
        assert_eq!(all[0].1.last.unwrap().error.as_deref(), Some("refused"));

        let (first, total) = q.failing(Some(key("a").controller()), 1);
        assert_eq!((first.len(), first[0].0.name(), total), (1, "b", 2));
        assert_eq!(q.failing(Some(3), 10).1, 0, "another controller has none");
    }
}
