//! Leases: handing ready keys to workers, their deadlines, and the outcomes that end them.

use std::{
    cmp::Reverse,
    collections::HashMap,
    time::{Duration, Instant},
};

use switchyard_work::{MAX_DELAY, MAX_LEASE_EXTENSION, Priority};

use super::{
    Cause, Causes, Due, Outcome, OutcomeKind, Queue, ReadFloor, Refused, ShardState, Slot, State,
    after, history,
};
use crate::key::{ControllerId, ValidKey};

/// Deadlines of ended or extended leases stay in the deadline heap until they come due;
/// when they outnumber the live ones by more than this many, the heap is rebuilt from the
/// live leases.
/// A heap of stale deadlines would otherwise hold every lease of the last lease timeout
/// (at 100,000 keys/s and 60 s, six million of them); 1,024 keeps the rebuilds rare at any
/// rate, each costing one pass over the live leases.
pub(super) const STALE_DEADLINES: usize = 1024;

/// Names a lease: 128 bits, written as 32 lowercase hex digits. With the stream that holds
/// it, all a worker shows to answer or extend a lease, so a served queue draws them at
/// random ([`LeaseIds`]): one client cannot name another's lease by guessing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseId(u128);

impl LeaseId {
    /// Names no lease: never issued. The service's edge stands it in for an id that does not
    /// parse, so that outcome is refused as unknown like any other.
    pub const NONE: Self = Self(0);

    pub const fn from_u128(id: u128) -> Self {
        Self(id)
    }
}

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// A string that is not 32 lowercase hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a lease id is 32 lowercase hex digits")]
pub struct InvalidLeaseId;

impl std::str::FromStr for LeaseId {
    type Err = InvalidLeaseId;

    /// Only the form [`Display`](std::fmt::Display) writes, so one lease has one name.
    fn from_str(s: &str) -> Result<Self, InvalidLeaseId> {
        let hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
        if s.len() != 32 || !s.as_bytes().iter().all(hex) {
            return Err(InvalidLeaseId);
        }
        u128::from_str_radix(s, 16)
            .map(Self)
            .map_err(|_| InvalidLeaseId)
    }
}

/// Where lease ids come from. The core reads no randomness, as it reads no clock: the service
/// draws ids from a CSPRNG, tests and benchmarks may count ([`SequentialLeaseIds`]). An id
/// that is [`LeaseId::NONE`] or names a live lease is drawn again.
pub trait LeaseIds: Send + std::fmt::Debug {
    fn next_id(&mut self) -> LeaseId;
}

/// 1, 2, 3…: deterministic, for tests and benchmarks. Guessable, so never for a served queue.
#[derive(Clone, Copy, Debug, Default)]
pub struct SequentialLeaseIds(u128);

impl LeaseIds for SequentialLeaseIds {
    fn next_id(&mut self) -> LeaseId {
        self.0 += 1;
        LeaseId(self.0)
    }
}

/// The worker a lease is bound to: one session (a Work stream) of a worker process. Only it
/// may answer or extend its leases.
pub type WorkerId = u64;

/// A key handed to a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub id: LeaseId,
    /// The key, with its controller and shard.
    pub key: ValidKey,
    pub epoch: u64,
    /// 1 + failures not yet forgotten.
    pub attempt: u32,
    pub deadline: Instant,
    /// How long the key waited ready before this lease.
    pub waited: Duration,
    /// The causes of the adds this lease covers, oldest first, at most
    /// [`MAX_CAUSES`](super::MAX_CAUSES).
    pub causes: Vec<Cause>,
    /// Causes beyond [`MAX_CAUSES`](super::MAX_CAUSES) that were dropped (the oldest go first).
    pub causes_dropped: u32,
    /// The earliest time a sender observed an event behind the adds this lease covers.
    pub observed_at: Option<std::time::SystemTime>,
    /// The shard's read floor when the lease was granted.
    pub read_floor: ReadFloor,
    /// How long this replica had served the shard at its epoch when the lease was granted:
    /// the floor of a shard that moved lately may lack the previous owner's last writes.
    pub shard_held_for: Duration,
}

impl Lease {
    pub fn controller(&self) -> ControllerId {
        self.key.controller()
    }

    pub fn shard(&self) -> u32 {
        self.key.shard()
    }
}

/// Hashes lease ids, which this replica draws (at random, or in sequence in tests): nobody
/// outside can choose them to collide, so a seeded hash's flooding protection buys nothing
/// here (keys, which users name, keep one: see `KeyHasher`). Folding the halves and
/// Fibonacci hashing spread a sequence over the table as well as random ids.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LeaseIdHasher(u64);

impl std::hash::Hasher for LeaseIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 << 8 | u64::from(*byte)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u128(&mut self, id: u128) {
        let folded = (id as u64) ^ ((id >> 64) as u64);
        self.0 = folded.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub(super) type LeaseMap<V> = HashMap<LeaseId, V, std::hash::BuildHasherDefault<LeaseIdHasher>>;

#[derive(Debug)]
pub(super) struct LeaseInfo {
    pub(super) key: ValidKey,
    /// Where the key's entry is, and its `seq` when leased (unchanged while it is leased).
    pub(super) slot: Slot,
    pub(super) seq: u64,
    pub(super) worker: WorkerId,
    pub(super) deadline: Instant,
    pub(super) leased_at: Instant,
    /// The lease's causes, put back if it ends without an outcome that settles them.
    pub(super) causes: Causes,
}

impl Queue {
    // ---- leases ----------------------------------------------------------------------

    /// Applies the passage of time: expires leases and makes due keys ready. Returns the
    /// controller and shard of every lease that expired.
    pub fn advance(&mut self, now: Instant) -> Vec<(ControllerId, u32)> {
        let mut expired = Vec::new();
        while let Some(Reverse((deadline, id))) = self.lease_deadlines.peek().cloned() {
            if deadline > now {
                break;
            }
            self.lease_deadlines.pop();
            if let Some(l) = self.leases.get(&id).filter(|l| l.deadline == deadline) {
                expired.push((l.key.controller(), l.key.shard()));
                self.totals.lease_expirations += 1;
                self.note_end(id, OutcomeKind::LeaseExpired, None, now);
                self.finish(id, Finish::Retry, now);
            }
        }
        while let Some(&Reverse((at, seq, controller, slot))) = self.delayed.peek() {
            if at > now {
                break;
            }
            self.delayed.pop();
            let queue = &self.controllers[controller as usize];
            if let Some(entry) = queue.get(slot)
                && entry.seq == seq
                && matches!(entry.state, State::Delayed(a) if a == at)
            {
                self.schedule(controller, slot, Due::Now(Priority::Normal), now);
            }
        }
        expired
    }

    /// When `advance` next has something to do.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let lease = self.lease_deadlines.peek().map(|Reverse((d, _))| *d);
        let delayed = self.delayed.peek().map(|Reverse((at, ..))| *at);
        match (lease, delayed) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Leases the next ready key to `worker`: live keys before low-priority ones, controllers
    /// in turn. `controllers` restricts the choice (empty: any). Call `advance` first.
    pub fn lease(
        &mut self,
        worker: WorkerId,
        controllers: &[ControllerId],
        now: Instant,
    ) -> Option<Lease> {
        let count = self.controllers.len();
        for priority in [Priority::Normal, Priority::Low] {
            for step in 0..count {
                let controller = ((self.cursor + step) % count) as ControllerId;
                if !controllers.is_empty() && !controllers.contains(&controller) {
                    continue;
                }
                if let Some(lease) = self.lease_from(controller, priority, worker, now) {
                    self.cursor = (controller as usize + 1) % count;
                    return Some(lease);
                }
            }
        }
        None
    }

    fn lease_from(
        &mut self,
        controller: ControllerId,
        priority: Priority,
        worker: WorkerId,
        now: Instant,
    ) -> Option<Lease> {
        let queue = &mut self.controllers[controller as usize];
        while let Some((slot, seq)) = queue.ready[priority as usize].pop_front() {
            let Some(entry) = queue.slots.get_mut(slot as usize).and_then(Option::as_mut) else {
                continue;
            };
            if entry.seq != seq || !matches!(entry.state, State::Ready(p) if p == priority) {
                continue;
            }
            let Some(ShardState::Active(epoch)) = self.shards.get(&entry.shard).copied() else {
                continue;
            };
            let id = fresh_id(self.lease_ids.as_mut(), &self.leases);
            let deadline = after(now, self.config.lease_timeout, Duration::MAX);
            entry.state = State::Leased { pending: None };
            let causes = if queue.causes.is_empty() {
                Causes::default()
            } else {
                queue.causes.remove(&slot).unwrap_or_default()
            };
            let key = ValidKey::from_parts(controller, entry.shard, entry.key.clone());
            let lease = Lease {
                id,
                key: key.clone(),
                epoch,
                attempt: entry.failures.saturating_add(1),
                deadline,
                waited: now.saturating_duration_since(entry.ready_since),
                causes: causes.kept.clone(),
                causes_dropped: causes.dropped,
                observed_at: causes.observed_at,
                read_floor: self
                    .floors
                    .get(&entry.shard)
                    .map(|floor| floor.of(entry.key.namespace()))
                    .unwrap_or_default(),
                shard_held_for: self
                    .held_since
                    .get(&entry.shard)
                    .map_or(Duration::ZERO, |since| {
                        now.saturating_duration_since(*since)
                    }),
            };
            self.leases.insert(
                id,
                LeaseInfo {
                    key,
                    slot,
                    seq,
                    worker,
                    deadline,
                    leased_at: now,
                    causes,
                },
            );
            self.push_deadline(deadline, id);
            return Some(lease);
        }
        None
    }

    /// Applies the outcome `worker` sends for one of its leases. Returns how long the key was
    /// leased. Refused, changing nothing, when the epoch is stale, the lease unknown, or the
    /// lease held by another worker (which may still answer it).
    pub fn complete(
        &mut self,
        worker: WorkerId,
        shard: u32,
        epoch: u64,
        lease: LeaseId,
        outcome: Outcome,
        now: Instant,
    ) -> Result<Duration, Refused> {
        self.complete_with_error(worker, shard, epoch, lease, outcome, None, now)
    }

    /// [`complete`](Self::complete), with the reason a failed reconcile gave: the key's
    /// latest outcome keeps it (at most [`MAX_ERROR_BYTES`](super::MAX_ERROR_BYTES)).
    #[allow(clippy::too_many_arguments)]
    pub fn complete_with_error(
        &mut self,
        worker: WorkerId,
        shard: u32,
        epoch: u64,
        lease: LeaseId,
        outcome: Outcome,
        error: Option<&str>,
        now: Instant,
    ) -> Result<Duration, Refused> {
        let info = self.check_lease(worker, shard, epoch, lease)?;
        let worked = now.saturating_duration_since(info.leased_at);
        let kind = match outcome {
            Outcome::Done => OutcomeKind::Done,
            Outcome::RequeueAfter(_) => OutcomeKind::RequeueAfter,
            Outcome::Failed => OutcomeKind::Failed,
            Outcome::Forget => OutcomeKind::Forget,
        };
        self.note_end(lease, kind, error, now);
        let finish = match outcome {
            Outcome::Done | Outcome::Forget => Finish::Forget(None),
            Outcome::RequeueAfter(d) => Finish::Forget(Some(after(now, d, MAX_DELAY))),
            Outcome::Failed => Finish::Retry,
        };
        if outcome == Outcome::Failed {
            self.totals.retries += 1;
        }
        self.finish(lease, finish, now);
        Ok(worked)
    }

    /// Extends one of `worker`'s leases to `now + by`. Returns the new deadline. Refused as
    /// [`complete`](Self::complete) is.
    pub fn extend(
        &mut self,
        worker: WorkerId,
        shard: u32,
        epoch: u64,
        lease: LeaseId,
        by: Duration,
        now: Instant,
    ) -> Result<Instant, Refused> {
        self.check_lease(worker, shard, epoch, lease)?;
        let deadline = after(now, by, MAX_LEASE_EXTENSION);
        if let Some(info) = self.leases.get_mut(&lease) {
            info.deadline = deadline;
        }
        self.push_deadline(deadline, lease);
        Ok(deadline)
    }

    /// Schedules lease `id`'s expiry check; rebuilds the heap from the live leases when
    /// stale deadlines pile up (see [`STALE_DEADLINES`]).
    fn push_deadline(&mut self, deadline: Instant, id: LeaseId) {
        self.lease_deadlines.push(Reverse((deadline, id)));
        if self.lease_deadlines.len() > 2 * self.leases.len() + STALE_DEADLINES {
            self.lease_deadlines = self
                .leases
                .iter()
                .map(|(id, info)| Reverse((info.deadline, *id)))
                .collect();
        }
    }

    /// The key a lease in flight covers.
    pub fn lease_key(&self, lease: LeaseId) -> Option<&ValidKey> {
        self.leases.get(&lease).map(|l| &l.key)
    }

    /// Returns every lease of `worker` to the queue at once (its stream closed cleanly).
    pub fn release_worker(&mut self, worker: WorkerId, now: Instant) -> usize {
        let ids: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, l)| l.worker == worker)
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            self.finish(*id, Finish::Return, now);
        }
        ids.len()
    }

    /// Leases held by `worker`.
    pub fn worker_leases(&self, worker: WorkerId) -> usize {
        self.leases.values().filter(|l| l.worker == worker).count()
    }

    fn check_lease(
        &mut self,
        worker: WorkerId,
        shard: u32,
        epoch: u64,
        lease: LeaseId,
    ) -> Result<&LeaseInfo, Refused> {
        if self.shards.get(&shard).map(|s| s.epoch()) != Some(epoch)
            && self.renewed_from.get(&shard) != Some(&epoch)
        {
            self.totals.refused_stale_epoch += 1;
            return Err(Refused::StaleEpoch);
        }
        match self.leases.get(&lease) {
            Some(info) if info.key.shard() == shard && info.worker == worker => Ok(info),
            Some(info) if info.key.shard() == shard => {
                self.totals.refused_foreign_lease += 1;
                Err(Refused::ForeignLease)
            }
            _ => {
                self.totals.refused_unknown_lease += 1;
                Err(Refused::UnknownLease)
            }
        }
    }

    /// Ends a lease and reschedules its key (or drops it).
    fn finish(&mut self, lease: LeaseId, how: Finish, now: Instant) {
        let Some(info) = self.leases.remove(&lease) else {
            return;
        };
        let draining = matches!(
            self.shards.get(&info.key.shard()),
            Some(ShardState::Draining(_))
        );
        let controller = info.key.controller();
        let slot = info.slot;
        let queue = &mut self.controllers[controller as usize];
        let Some(entry) = queue
            .slots
            .get_mut(slot as usize)
            .and_then(Option::as_mut)
            .filter(|e| e.seq == info.seq)
        else {
            return;
        };
        let State::Leased { pending, .. } = entry.state else {
            return;
        };
        if matches!(how, Finish::Retry | Finish::Return) && !info.causes.is_empty() {
            // Not settled: the next attempt covers the same events.
            match queue.causes.get_mut(&slot) {
                Some(newer) => newer.restore(info.causes),
                None => {
                    queue.causes.insert(slot, info.causes);
                }
            }
        }
        let next = match how {
            Finish::Forget(after) => {
                entry.failures = 0;
                after
                    .map(Due::At)
                    .map_or(pending, |d| Some(d.merge(pending)))
            }
            Finish::Retry => {
                entry.failures = entry.failures.saturating_add(1);
                let delay = self.backoff.delay(controller as usize, entry.failures, now);
                Some(Due::At(after(now, delay, MAX_DELAY)).merge(pending))
            }
            Finish::Return => Some(Due::Now(Priority::Normal).merge(pending)),
        };
        match next {
            // A draining shard keeps nothing waiting: its next owner resyncs it.
            Some(due) if !draining => self.schedule(controller, slot, due, now),
            // Remembered by the history: the entry stays, no longer held, until forgotten.
            None if !draining && entry.history != history::NIL => {
                entry.state = State::Finished;
                self.len -= 1;
            }
            _ => {
                queue.forget(&mut self.history, slot);
                self.len -= 1;
            }
        }
    }
}

/// A new lease's id from `ids`: never [`LeaseId::NONE`], never a live lease's (either would
/// let an answer meant for one lease end another). A random 128-bit draw repeats neither in
/// practice; the check makes it a promise whatever the source.
fn fresh_id(ids: &mut dyn LeaseIds, live: &LeaseMap<LeaseInfo>) -> LeaseId {
    loop {
        let id = ids.next_id();
        if id != LeaseId::NONE && !live.contains_key(&id) {
            return id;
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Finish {
    /// Done, forget or requeue-after: failures forgotten.
    Forget(Option<Instant>),
    /// Failed or expired: backoff.
    Retry,
    /// The worker went away cleanly: ready again at once, failures kept.
    Return,
}
