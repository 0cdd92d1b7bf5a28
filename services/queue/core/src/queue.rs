use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use crate::{
    Backoff, BackoffConfig,
    key::{ControllerId, KeySpace, ObjectName, ValidKey},
};
/// Lease extensions longer than this are refused: a reconcile that needs more should extend
/// again, so a dead worker's key is not held for hours.
pub const MAX_LEASE_EXTENSION: Duration = Duration::from_secs(3600);
/// Causes kept per key: a key added a thousand times while leased is reconciled once, and
/// its trace links to the latest adds only. 16 links are what a trace view still shows.
pub const MAX_CAUSES: usize = 16;

/// What caused an add, opaque to the queue (the service keeps a W3C trace context in it).
pub type Cause = Arc<[(String, String)]>;

pub type LeaseId = u64;
pub type WorkerId = u64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("shard {shard} is not served by this replica")]
    NotOwner { shard: u32 },
    #[error("the queue is full ({capacity} keys)")]
    Full { capacity: usize },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why an outcome or extension was not applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("stale epoch: the shard is now at another epoch or not served here")]
    StaleEpoch,
    #[error("unknown lease: it expired, was released, or never existed")]
    UnknownLease,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Initial list, resync.
    Low = 0,
    /// Live events.
    Normal = 1,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Reconciled; forgets the key's failures.
    Done,
    /// Reconciled; look again after the delay (failures forgotten, as controller-runtime does).
    RequeueAfter(Duration),
    /// Retry with backoff.
    Failed,
    /// Drop the key's failures without requeueing.
    Forget,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddOutcome {
    /// The key was not queued before.
    Added,
    /// The key was already queued, delayed or leased; the add merged into it.
    Coalesced,
}

#[derive(Clone, Debug, PartialEq)]
pub struct QueueConfig {
    /// Number of virtual shards, fixed per installation.
    pub shard_count: u32,
    /// How long a lease lasts unless extended or answered (the visibility timeout).
    pub lease_timeout: Duration,
    /// Keys held at most (queued, delayed or leased); adds of new keys beyond it get `Full`.
    pub capacity: usize,
    pub backoff: BackoffConfig,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            shard_count: 256,
            lease_timeout: Duration::from_secs(60),
            capacity: 1_000_000,
            backoff: BackoffConfig::default(),
        }
    }
}

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
    /// The causes of the adds this lease covers, oldest first, at most [`MAX_CAUSES`].
    pub causes: Vec<Cause>,
    /// Causes beyond [`MAX_CAUSES`] that were dropped (the oldest go first).
    pub causes_dropped: u32,
}

impl Lease {
    pub fn controller(&self) -> ControllerId {
        self.key.controller()
    }

    pub fn shard(&self) -> u32 {
        self.key.shard()
    }
}

/// The causes of a key's adds: the latest [`MAX_CAUSES`], and how many older ones went.
#[derive(Clone, Debug, Default)]
struct Causes {
    kept: Vec<Cause>,
    dropped: u32,
}

impl Causes {
    fn push(&mut self, cause: Cause) {
        if self.kept.len() == MAX_CAUSES {
            self.kept.remove(0);
            self.dropped = self.dropped.saturating_add(1);
        }
        self.kept.push(cause);
    }

    /// Puts the causes of an unfinished lease back before the ones added since.
    fn restore(&mut self, older: Causes) {
        let newer = std::mem::replace(self, older);
        self.dropped = self.dropped.saturating_add(newer.dropped);
        for cause in newer.kept {
            self.push(cause);
        }
    }

    fn is_empty(&self) -> bool {
        self.kept.is_empty() && self.dropped == 0
    }
}

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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ShardState {
    Active(u64),
    /// Handing over: no adds, no new leases; outcomes of in-flight leases still count.
    Draining(u64),
}

impl ShardState {
    fn epoch(self) -> u64 {
        match self {
            Self::Active(e) | Self::Draining(e) => e,
        }
    }
}

/// When a key should be ready again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Due {
    Now(Priority),
    At(Instant),
}

impl Due {
    /// The earlier of two; among two ready-now, the higher priority.
    fn merge(self, other: Option<Due>) -> Due {
        match (self, other) {
            (d, None) => d,
            (Due::Now(a), Some(Due::Now(b))) => Due::Now(a.max(b)),
            (Due::Now(p), Some(Due::At(_))) | (Due::At(_), Some(Due::Now(p))) => Due::Now(p),
            (Due::At(a), Some(Due::At(b))) => Due::At(a.min(b)),
        }
    }
}

#[derive(Debug)]
enum State {
    Ready(Priority),
    Delayed(Instant),
    Leased { pending: Option<Due> },
}

#[derive(Debug)]
struct Entry {
    shard: u32,
    state: State,
    failures: u32,
    /// When the key last became ready.
    ready_since: Instant,
    /// Bumped on every reschedule; queue and heap items with an older value are stale.
    seq: u64,
}

#[derive(Debug)]
struct ControllerQueue {
    entries: HashMap<ObjectName, Entry>,
    /// Indexed by `Priority as usize`; items carry the entry's `seq` when pushed.
    ready: [VecDeque<(ObjectName, u64)>; 2],
    /// Causes of the adds not yet handed to a worker, of the keys that have any. Beside the
    /// entries rather than in them: without traces it stays empty and costs no byte per key.
    causes: HashMap<ObjectName, Causes>,
}

impl ControllerQueue {
    /// Forgets the causes of keys no longer held.
    fn prune_causes(&mut self) {
        if !self.causes.is_empty() {
            let entries = &self.entries;
            self.causes.retain(|key, _| entries.contains_key(key));
        }
    }
}

/// Hashes lease ids, which this replica generates in sequence: nobody can choose them to
/// collide, so SipHash's flooding protection buys nothing here (keys, which users name,
/// keep SipHash). Fibonacci hashing spreads the sequence over the table.
#[derive(Clone, Copy, Debug, Default)]
struct LeaseIdHasher(u64);

impl std::hash::Hasher for LeaseIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 << 8 | u64::from(*byte)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, id: u64) {
        self.0 = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type LeaseMap<V> = HashMap<LeaseId, V, std::hash::BuildHasherDefault<LeaseIdHasher>>;

/// Ready time, entry seq when scheduled, controller, key.
type DelayedItem = (Instant, u64, ControllerId, ObjectName);

#[derive(Debug)]
struct LeaseInfo {
    key: ValidKey,
    worker: WorkerId,
    deadline: Instant,
    leased_at: Instant,
    /// The lease's causes, put back if it ends without an outcome that settles them.
    causes: Causes,
}

/// The queue of one replica: every registered controller's keys in every shard it serves.
#[derive(Debug)]
pub struct Queue {
    config: QueueConfig,
    backoff: Backoff,
    keys: KeySpace,
    controllers: Vec<ControllerQueue>,
    shards: HashMap<u32, ShardState>,
    leases: LeaseMap<LeaseInfo>,
    lease_deadlines: BinaryHeap<Reverse<(Instant, LeaseId)>>,
    delayed: BinaryHeap<Reverse<DelayedItem>>,
    len: usize,
    next_seq: u64,
    next_lease: LeaseId,
    cursor: usize,
    totals: Totals,
}

impl Queue {
    pub fn new(config: QueueConfig, controllers: &[&str]) -> Self {
        Self {
            backoff: Backoff::new(config.backoff.clone()),
            keys: KeySpace::new(controllers, config.shard_count),
            config,
            controllers: controllers
                .iter()
                .map(|_| ControllerQueue {
                    entries: HashMap::new(),
                    ready: [VecDeque::new(), VecDeque::new()],
                    causes: HashMap::new(),
                })
                .collect(),
            shards: HashMap::new(),
            leases: LeaseMap::default(),
            lease_deadlines: BinaryHeap::new(),
            delayed: BinaryHeap::new(),
            len: 0,
            next_seq: 0,
            next_lease: 1,
            cursor: 0,
            totals: Totals::default(),
        }
    }

    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// The controllers served and the shard count: what keys are validated against.
    pub fn key_space(&self) -> &KeySpace {
        &self.keys
    }

    pub fn totals(&self) -> &Totals {
        &self.totals
    }

    /// Keys held: queued, delayed or leased.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn in_flight(&self) -> usize {
        self.leases.len()
    }

    /// The shard of `key` and the epoch this replica serves it at, if it does.
    pub fn shard_epoch(&self, shard: u32) -> Option<u64> {
        match self.shards.get(&shard) {
            Some(ShardState::Active(e)) => Some(*e),
            _ => None,
        }
    }

    // ---- ownership -------------------------------------------------------------------

    /// Starts serving `shard` at `epoch`, empty (recovery is level-triggered: the watcher
    /// resyncs the shard). A different epoch than the one held discards what was held.
    pub fn acquire(&mut self, shard: u32, epoch: u64) {
        if self.shards.get(&shard) == Some(&ShardState::Active(epoch)) {
            return;
        }
        self.discard_shard(shard);
        self.shards.insert(shard, ShardState::Active(epoch));
    }

    /// Stops leasing `shard` and drops its waiting keys; in-flight leases may still report.
    pub fn drain(&mut self, shard: u32) {
        if let Some(state) = self.shards.get(&shard).copied() {
            self.shards
                .insert(shard, ShardState::Draining(state.epoch()));
            self.drop_waiting(shard);
        }
    }

    /// Leases still in flight in `shard`.
    pub fn shard_in_flight(&self, shard: u32) -> usize {
        self.leases
            .values()
            .filter(|l| l.key.shard() == shard)
            .count()
    }

    /// Forgets `shard` entirely; later outcomes for it are refused as stale.
    pub fn release(&mut self, shard: u32) {
        self.discard_shard(shard);
    }

    pub fn owned_shards(&self) -> Vec<(u32, u64)> {
        let mut shards: Vec<_> = self
            .shards
            .iter()
            .filter_map(|(s, st)| match st {
                ShardState::Active(e) => Some((*s, *e)),
                ShardState::Draining(_) => None,
            })
            .collect();
        shards.sort_unstable();
        shards
    }

    // ---- adds ------------------------------------------------------------------------

    /// Adds a key, ready now or after `delay`.
    pub fn add(
        &mut self,
        key: &ValidKey,
        priority: Priority,
        delay: Duration,
        now: Instant,
    ) -> Result<AddOutcome> {
        self.add_caused(key, priority, delay, None, now)
    }

    /// Adds a key with what caused the add; coalesced adds keep their causes (bounded), and
    /// the next lease of the key carries them.
    pub fn add_caused(
        &mut self,
        key: &ValidKey,
        priority: Priority,
        delay: Duration,
        cause: Option<Cause>,
        now: Instant,
    ) -> Result<AddOutcome> {
        let (controller, shard) = (key.controller(), key.shard());
        if self.shard_epoch(shard).is_none() {
            return Err(Error::NotOwner { shard });
        }
        let due = if delay.is_zero() {
            Due::Now(priority)
        } else {
            Due::At(now + delay)
        };
        let queue = &mut self.controllers[controller as usize];
        let Some(entry) = queue.entries.get_mut(key.object()) else {
            if self.len >= self.config.capacity {
                return Err(Error::Full {
                    capacity: self.config.capacity,
                });
            }
            let key = key.object().clone();
            let seq = self.next_seq;
            self.next_seq += 1;
            // Scheduled here rather than through `schedule`, which would look the key up again.
            let state = match due {
                Due::Now(priority) => {
                    queue.ready[priority as usize].push_back((key.clone(), seq));
                    State::Ready(priority)
                }
                Due::At(at) => {
                    self.delayed
                        .push(Reverse((at, seq, controller, key.clone())));
                    State::Delayed(at)
                }
            };
            if let Some(cause) = cause {
                queue.causes.entry(key.clone()).or_default().push(cause);
            }
            queue.entries.insert(
                key,
                Entry {
                    shard,
                    state,
                    failures: 0,
                    ready_since: now,
                    seq,
                },
            );
            self.len += 1;
            self.totals.adds += 1;
            return Ok(AddOutcome::Added);
        };
        let reschedule = match entry.state {
            State::Ready(current) => matches!(due, Due::Now(p) if p > current),
            State::Delayed(at) => match due {
                Due::Now(_) => true,
                Due::At(new) => new < at,
            },
            State::Leased { ref mut pending } => {
                if pending.is_none() {
                    self.totals.adds += 1;
                }
                *pending = Some(due.merge(*pending));
                false
            }
        };
        if reschedule || cause.is_some() {
            let key = key.object().clone();
            if let Some(cause) = cause {
                queue.causes.entry(key.clone()).or_default().push(cause);
            }
            if reschedule {
                self.schedule(controller, key, due, now);
            }
        }
        Ok(AddOutcome::Coalesced)
    }

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
                self.finish(id, Finish::Retry, now);
            }
        }
        while let Some(Reverse((at, seq, controller, _))) = self.delayed.peek() {
            if *at > now {
                break;
            }
            let (at, seq, controller) = (*at, *seq, *controller);
            let Some(Reverse((_, _, _, key))) = self.delayed.pop() else {
                break;
            };
            let queue = &mut self.controllers[controller as usize];
            if let Some(entry) = queue.entries.get(&key)
                && entry.seq == seq
                && matches!(entry.state, State::Delayed(a) if a == at)
            {
                self.schedule(controller, key, Due::Now(Priority::Normal), now);
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
        while let Some((key, seq)) = queue.ready[priority as usize].pop_front() {
            let Some(entry) = queue.entries.get_mut(&key) else {
                continue;
            };
            if entry.seq != seq || !matches!(entry.state, State::Ready(p) if p == priority) {
                continue;
            }
            let Some(ShardState::Active(epoch)) = self.shards.get(&entry.shard).copied() else {
                continue;
            };
            let id = self.next_lease;
            self.next_lease += 1;
            let deadline = now + self.config.lease_timeout;
            entry.state = State::Leased { pending: None };
            let causes = if queue.causes.is_empty() {
                Causes::default()
            } else {
                queue.causes.remove(&key).unwrap_or_default()
            };
            let key = ValidKey::from_parts(controller, entry.shard, key);
            let lease = Lease {
                id,
                key: key.clone(),
                epoch,
                attempt: entry.failures.saturating_add(1),
                deadline,
                waited: now.saturating_duration_since(entry.ready_since),
                causes: causes.kept.clone(),
                causes_dropped: causes.dropped,
            };
            self.leases.insert(
                id,
                LeaseInfo {
                    key,
                    worker,
                    deadline,
                    leased_at: now,
                    causes,
                },
            );
            self.lease_deadlines.push(Reverse((deadline, id)));
            return Some(lease);
        }
        None
    }

    /// Applies a worker's outcome. Returns how long the key was leased.
    pub fn complete(
        &mut self,
        shard: u32,
        epoch: u64,
        lease: LeaseId,
        outcome: Outcome,
        now: Instant,
    ) -> Result<Duration, Refused> {
        let info = self.check_lease(shard, epoch, lease)?;
        let worked = now.saturating_duration_since(info.leased_at);
        let finish = match outcome {
            Outcome::Done | Outcome::Forget => Finish::Forget(None),
            Outcome::RequeueAfter(d) => Finish::Forget(Some(now + d)),
            Outcome::Failed => Finish::Retry,
        };
        if outcome == Outcome::Failed {
            self.totals.retries += 1;
        }
        self.finish(lease, finish, now);
        Ok(worked)
    }

    /// Extends a lease to `now + by`. Returns the new deadline.
    pub fn extend(
        &mut self,
        shard: u32,
        epoch: u64,
        lease: LeaseId,
        by: Duration,
        now: Instant,
    ) -> Result<Instant, Refused> {
        self.check_lease(shard, epoch, lease)?;
        let deadline = now + by.min(MAX_LEASE_EXTENSION);
        if let Some(info) = self.leases.get_mut(&lease) {
            info.deadline = deadline;
        }
        self.lease_deadlines.push(Reverse((deadline, lease)));
        Ok(deadline)
    }

    /// The controller of a live lease.
    pub fn lease_controller(&self, lease: LeaseId) -> Option<ControllerId> {
        self.leases.get(&lease).map(|l| l.key.controller())
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
        shard: u32,
        epoch: u64,
        lease: LeaseId,
    ) -> Result<&LeaseInfo, Refused> {
        if self.shards.get(&shard).map(|s| s.epoch()) != Some(epoch) {
            self.totals.refused_stale_epoch += 1;
            return Err(Refused::StaleEpoch);
        }
        match self.leases.get(&lease) {
            Some(info) if info.key.shard() == shard => Ok(info),
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
        let key = info.key.object();
        let queue = &mut self.controllers[controller as usize];
        let Some(entry) = queue.entries.get_mut(key) else {
            return;
        };
        let State::Leased { pending, .. } = entry.state else {
            return;
        };
        if matches!(how, Finish::Retry | Finish::Return) && !info.causes.is_empty() {
            // Not settled: the next attempt covers the same events.
            match queue.causes.get_mut(key) {
                Some(newer) => newer.restore(info.causes),
                None => {
                    queue.causes.insert(key.clone(), info.causes);
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
                let delay = self.backoff.delay(entry.failures, now);
                Some(Due::At(now + delay).merge(pending))
            }
            Finish::Return => Some(Due::Now(Priority::Normal).merge(pending)),
        };
        match next {
            // A draining shard keeps nothing waiting: its next owner resyncs it.
            Some(due) if !draining => self.schedule(controller, key.clone(), due, now),
            _ => {
                queue.entries.remove(key);
                if !queue.causes.is_empty() {
                    queue.causes.remove(key);
                }
                self.len -= 1;
            }
        }
    }

    /// Puts an existing entry in the ready queue or the delayed heap.
    fn schedule(&mut self, controller: ControllerId, key: ObjectName, due: Due, now: Instant) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let queue = &mut self.controllers[controller as usize];
        let Some(entry) = queue.entries.get_mut(&key) else {
            return;
        };
        entry.seq = seq;
        match due {
            Due::Now(priority) => {
                if !matches!(entry.state, State::Ready(_)) {
                    entry.ready_since = now;
                }
                entry.state = State::Ready(priority);
                queue.ready[priority as usize].push_back((key, seq));
            }
            Due::At(at) if at <= now => {
                self.schedule(controller, key, Due::Now(Priority::Normal), now)
            }
            Due::At(at) => {
                entry.state = State::Delayed(at);
                self.delayed.push(Reverse((at, seq, controller, key)));
            }
        }
    }

    fn discard_shard(&mut self, shard: u32) {
        self.shards.remove(&shard);
        self.leases.retain(|_, l| l.key.shard() != shard);
        for queue in &mut self.controllers {
            let before = queue.entries.len();
            queue.entries.retain(|_, e| e.shard != shard);
            self.len -= before - queue.entries.len();
            queue.prune_causes();
        }
    }

    fn drop_waiting(&mut self, shard: u32) {
        for queue in &mut self.controllers {
            let before = queue.entries.len();
            queue
                .entries
                .retain(|_, e| e.shard != shard || matches!(e.state, State::Leased { .. }));
            self.len -= before - queue.entries.len();
            queue.prune_causes();
        }
    }

    // ---- introspection ---------------------------------------------------------------

    /// Figures per controller and served shard (every served shard, even when empty).
    pub fn stats(&self, now: Instant) -> Vec<ShardStats> {
        let mut stats: HashMap<(ControllerId, u32), ShardStats> = HashMap::new();
        for (&shard, state) in &self.shards {
            for controller in 0..self.controllers.len() as ControllerId {
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
            for entry in queue.entries.values() {
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
        self.controllers[key.controller() as usize]
            .entries
            .contains_key(key.object())
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

#[cfg(test)]
mod tests {
    use super::*;

    const RS: &str = "apps/v1/ReplicaSet";

    const CONTROLLERS: [&str; 2] = [RS, "apps/v1/Deployment"];

    fn key(name: &str) -> ValidKey {
        KeySpace::new(&CONTROLLERS, 4)
            .validate_parts(RS, "default", name)
            .unwrap()
    }

    fn queue() -> (Queue, Instant) {
        let mut q = Queue::new(
            QueueConfig {
                shard_count: 4,
                lease_timeout: Duration::from_secs(10),
                capacity: 100,
                backoff: BackoffConfig {
                    qps: 0.0,
                    ..Default::default()
                },
            },
            &CONTROLLERS,
        );
        for shard in 0..4 {
            q.acquire(shard, 7);
        }
        (q, Instant::now())
    }

    fn lease(q: &mut Queue, now: Instant) -> Option<Lease> {
        q.advance(now);
        q.lease(1, &[], now)
    }

    fn cause(n: usize) -> Cause {
        Arc::from(vec![("traceparent".to_owned(), n.to_string())])
    }

    fn caused(q: &mut Queue, name: &str, n: usize, now: Instant) -> AddOutcome {
        q.add_caused(
            &key(name),
            Priority::Normal,
            Duration::ZERO,
            Some(cause(n)),
            now,
        )
        .unwrap()
    }

    #[test]
    fn coalesced_adds_keep_their_causes_and_the_lease_carries_them() {
        let (mut q, now) = queue();
        assert_eq!(caused(&mut q, "a", 1, now), AddOutcome::Added);
        assert_eq!(caused(&mut q, "a", 2, now), AddOutcome::Coalesced);
        q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
            .unwrap();
        let l = lease(&mut q, now).unwrap();
        assert_eq!(l.causes, vec![cause(1), cause(2)]);
        assert_eq!(l.causes_dropped, 0);
        // Adds while leased are the next lease's causes, not this one's.
        caused(&mut q, "a", 3, now);
        q.complete(l.shard(), l.epoch, l.id, Outcome::Done, now)
            .unwrap();
        let l = lease(&mut q, now).unwrap();
        assert_eq!(l.causes, vec![cause(3)]);
    }

    #[test]
    fn causes_are_bounded_keeping_the_latest() {
        let (mut q, now) = queue();
        for n in 0..MAX_CAUSES + 5 {
            caused(&mut q, "a", n, now);
        }
        let l = lease(&mut q, now).unwrap();
        assert_eq!(l.causes.len(), MAX_CAUSES);
        assert_eq!(l.causes.first(), Some(&cause(5)));
        assert_eq!(l.causes.last(), Some(&cause(MAX_CAUSES + 4)));
        assert_eq!(l.causes_dropped, 5);
    }

    #[test]
    fn a_failed_lease_puts_its_causes_back_for_the_retry() {
        let (mut q, now) = queue();
        caused(&mut q, "a", 1, now);
        let l = lease(&mut q, now).unwrap();
        caused(&mut q, "a", 2, now);
        q.complete(l.shard(), l.epoch, l.id, Outcome::Failed, now)
            .unwrap();
        let later = now + Duration::from_secs(60);
        let l = lease(&mut q, later).unwrap();
        assert_eq!(l.causes, vec![cause(1), cause(2)]);
        q.complete(l.shard(), l.epoch, l.id, Outcome::Done, later)
            .unwrap();
        q.add(&key("a"), Priority::Normal, Duration::ZERO, later)
            .unwrap();
        assert!(lease(&mut q, later).unwrap().causes.is_empty());
    }

    #[test]
    fn causes_go_with_their_key_when_a_shard_is_dropped() {
        let (mut q, now) = queue();
        caused(&mut q, "a", 1, now);
        let shard = key("a").shard();
        q.drain(shard);
        q.release(shard);
        q.acquire(shard, 8);
        q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
            .unwrap();
        assert!(lease(&mut q, now).unwrap().causes.is_empty());
        assert!(q.controllers.iter().all(|c| c.causes.is_empty()));
    }

    #[test]
    fn adds_while_queued_coalesce() {
        let (mut q, now) = queue();
        assert_eq!(
            q.add(&key("a"), Priority::Normal, Duration::ZERO, now),
            Ok(AddOutcome::Added)
        );
        assert_eq!(
            q.add(&key("a"), Priority::Normal, Duration::ZERO, now),
            Ok(AddOutcome::Coalesced)
        );
        assert_eq!(q.len(), 1);
        assert!(lease(&mut q, now).is_some());
        assert!(lease(&mut q, now).is_none(), "queued once, leased once");
    }

    #[test]
    fn live_adds_beat_low_priority_ones_and_upgrade_them() {
        let (mut q, now) = queue();
        q.add(&key("resync-1"), Priority::Low, Duration::ZERO, now)
            .unwrap();
        q.add(&key("resync-2"), Priority::Low, Duration::ZERO, now)
            .unwrap();
        q.add(&key("live"), Priority::Normal, Duration::ZERO, now)
            .unwrap();
        q.add(&key("resync-2"), Priority::Normal, Duration::ZERO, now)
            .unwrap();
        let order: Vec<_> = std::iter::from_fn(|| lease(&mut q, now))
            .map(|l| l.key.name().to_owned())
            .collect();
        assert_eq!(order, ["live", "resync-2", "resync-1"]);
    }

    #[test]
    fn a_delayed_add_keeps_the_earliest_ready_time() {
        let (mut q, t0) = queue();
        q.add(&key("a"), Priority::Normal, Duration::from_secs(10), t0)
            .unwrap();
        q.add(&key("a"), Priority::Normal, Duration::from_secs(3), t0)
            .unwrap();
        q.add(&key("a"), Priority::Normal, Duration::from_secs(20), t0)
            .unwrap();
        assert!(lease(&mut q, t0 + Duration::from_millis(2999)).is_none());
        assert!(lease(&mut q, t0 + Duration::from_secs(3)).is_some());
        // An add without delay makes a delayed key ready at once.
        q.add(&key("b"), Priority::Normal, Duration::from_secs(10), t0)
            .unwrap();
        q.add(&key("b"), Priority::Normal, Duration::ZERO, t0)
            .unwrap();
        assert!(lease(&mut q, t0).is_some());
    }

    #[test]
    fn a_key_added_while_leased_is_queued_again_when_the_lease_ends() {
        let (mut q, now) = queue();
        q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
            .unwrap();
        let l = lease(&mut q, now).unwrap();
        q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
            .unwrap();
        assert!(lease(&mut q, now).is_none(), "never two leases of one key");
        q.complete(l.shard(), l.epoch, l.id, Outcome::Done, now)
            .unwrap();
        let again = lease(&mut q, now).expect("dirty key requeued");
        assert_eq!(again.key, l.key);
        q.complete(again.shard(), again.epoch, again.id, Outcome::Done, now)
            .unwrap();
        assert!(q.is_empty(), "done without a new add forgets the key");
    }

    #[test]
    fn failures_back_off_exponentially_and_done_forgets_them() {
        let (mut q, t0) = queue();
        q.add(&key("a"), Priority::Normal, Duration::ZERO, t0)
            .unwrap();
        let mut now = t0;
        for (attempt, backoff_ms) in [(1, 5), (2, 10), (3, 20)] {
            let l = lease(&mut q, now).unwrap();
            assert_eq!(l.attempt, attempt);
            q.complete(l.shard(), l.epoch, l.id, Outcome::Failed, now)
                .unwrap();
            assert!(lease(&mut q, now + Duration::from_millis(backoff_ms - 1)).is_none());
            now += Duration::from_millis(backoff_ms);
        }
        let l = lease(&mut q, now).unwrap();
        assert_eq!(l.attempt, 4);
        q.complete(
            l.shard(),
            l.epoch,
            l.id,
            Outcome::RequeueAfter(Duration::from_secs(1)),
            now,
        )
        .unwrap();
        let l = lease(&mut q, now + Duration::from_secs(1)).unwrap();
        assert_eq!(l.attempt, 1, "requeue-after forgets the failures");
        assert_eq!(q.totals().retries, 3);
    }

    #[test]
    fn an_expired_lease_requeues_with_backoff_and_refuses_the_late_outcome() {
        let (mut q, t0) = queue();
        q.add(&key("a"), Priority::Normal, Duration::ZERO, t0)
            .unwrap();
        let l = lease(&mut q, t0).unwrap();
        let expiry = t0 + Duration::from_secs(10);
        assert_eq!(q.advance(expiry).len(), 1);
        assert!(lease(&mut q, expiry).is_none(), "backoff after expiry");
        let again = lease(&mut q, expiry + Duration::from_millis(5)).unwrap();
        assert_eq!(again.attempt, 2);
        assert_eq!(
            q.complete(l.shard(), l.epoch, l.id, Outcome::Done, expiry),
            Err(Refused::UnknownLease)
        );
        assert_eq!(q.totals().lease_expirations, 1);
        assert_eq!(q.totals().refused_unknown_lease, 1);
    }

    #[test]
    fn an_extended_lease_outlives_its_first_deadline() {
        let (mut q, t0) = queue();
        q.add(&key("a"), Priority::Normal, Duration::ZERO, t0)
            .unwrap();
        let l = lease(&mut q, t0).unwrap();
        let t1 = t0 + Duration::from_secs(8);
        let deadline = q
            .extend(l.shard(), l.epoch, l.id, Duration::from_secs(30), t1)
            .unwrap();
        assert_eq!(deadline, t1 + Duration::from_secs(30));
        assert!(q.advance(t0 + Duration::from_secs(20)).is_empty());
        assert_eq!(q.advance(deadline).len(), 1);
    }

    #[test]
    fn outcomes_with_a_stale_epoch_are_refused_and_change_nothing() {
        let (mut q, now) = queue();
        q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
            .unwrap();
        let l = lease(&mut q, now).unwrap();
        assert_eq!(
            q.complete(l.shard(), l.epoch - 1, l.id, Outcome::Done, now),
            Err(Refused::StaleEpoch)
        );
        assert_eq!(q.in_flight(), 1);
        // The shard changes owner and comes back at a new epoch: old leases are gone.
        q.acquire(l.shard(), l.epoch + 1);
        assert_eq!(
            q.complete(l.shard(), l.epoch, l.id, Outcome::Done, now),
            Err(Refused::StaleEpoch)
        );
        assert_eq!(q.totals().refused_stale_epoch, 2);
        assert!(q.is_empty(), "a new epoch starts empty");
    }

    #[test]
    fn a_draining_shard_leases_nothing_new_but_accepts_outcomes() {
        let (mut q, now) = queue();
        q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
            .unwrap();
        let l = lease(&mut q, now).unwrap();
        let same_shard = (0..1000)
            .map(|i| key(&format!("k{i}")))
            .find(|k| k.shard() == l.shard())
            .unwrap();
        q.add(&same_shard, Priority::Normal, Duration::ZERO, now)
            .unwrap();
        q.drain(l.shard());
        assert_eq!(
            q.add(&key("a"), Priority::Normal, Duration::ZERO, now),
            Err(Error::NotOwner { shard: l.shard() })
        );
        assert!(lease(&mut q, now).is_none());
        assert_eq!(q.shard_in_flight(l.shard()), 1);
        q.complete(l.shard(), l.epoch, l.id, Outcome::Done, now)
            .unwrap();
        assert_eq!(q.shard_in_flight(l.shard()), 0);
        q.release(l.shard());
        assert!(q.is_empty());
    }

    #[test]
    fn a_cleanly_closed_worker_returns_its_leases_at_once() {
        let (mut q, now) = queue();
        q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
            .unwrap();
        q.advance(now);
        let l = q.lease(42, &[], now).unwrap();
        assert_eq!(q.release_worker(42, now), 1);
        let again = q.lease(43, &[], now).unwrap();
        assert_eq!((again.key, again.attempt), (l.key, 1));
    }

    #[test]
    fn a_full_queue_refuses_new_keys_but_coalesces_known_ones() {
        let (mut q, now) = queue();
        for i in 0..100 {
            q.add(
                &key(&format!("k{i}")),
                Priority::Normal,
                Duration::ZERO,
                now,
            )
            .unwrap();
        }
        assert_eq!(
            q.add(&key("one-more"), Priority::Normal, Duration::ZERO, now),
            Err(Error::Full { capacity: 100 })
        );
        assert_eq!(
            q.add(&key("k5"), Priority::Normal, Duration::ZERO, now),
            Ok(AddOutcome::Coalesced)
        );
    }

    #[test]
    fn stats_count_depth_in_flight_retries_and_age() {
        let (mut q, t0) = queue();
        q.add(&key("a"), Priority::Normal, Duration::ZERO, t0)
            .unwrap();
        q.add(&key("b"), Priority::Normal, Duration::ZERO, t0)
            .unwrap();
        let l = lease(&mut q, t0).unwrap();
        q.complete(l.shard(), l.epoch, l.id, Outcome::Failed, t0)
            .unwrap();
        let stats = q.stats(t0 + Duration::from_secs(2));
        let total = |f: fn(&ShardStats) -> u64| stats.iter().map(f).sum::<u64>();
        assert_eq!(stats.len(), 8, "2 controllers x 4 shards");
        assert_eq!(total(|s| s.depth), 2);
        assert_eq!(total(|s| s.retrying), 1);
        assert_eq!(
            stats.iter().map(|s| s.oldest_ready).max(),
            Some(Duration::from_secs(2))
        );
    }
}
