//! The queue of one replica, in parts:
//!
//! - here: configuration, keys' states, ownership of shards, and adds;
//! - [`lease`]: leases, their deadlines and the outcomes that end them;
//! - [`causes`]: what caused a key's adds, handed out with its next lease;
//! - [`floor`]: per shard, the cache versions its reconciles read at, handed out with leases;
//! - [`stats`]: figures per controller and shard, and running totals;
//! - [`inspect`] and [`history`]: one key now, and how its latest lease ended.
//!
//! Each controller's keys live in a slab: a key is hashed once, when it is added (with a
//! seeded hasher: users name keys, so the hash must not be one they can aim collisions at),
//! and from then on the ready queue, the delayed heap and the lease table carry its slot.
//!
//! ```text
//!  add(key) ── hash once ─► index: hash ─► slot      slots: [entry | free | entry | …]
//!                                             │          ▲       ▲
//!  ready: (slot, seq) … ───────────────────────┴──────────┘       │
//!  delayed: (at, seq, controller, slot)      leases: id ─► (key, slot, seq, hash)
//! ```
//!
//! An item names the entry as it was when the item was made (its `seq`): an entry
//! rescheduled, removed or replaced in a reused slot has another, and the item is stale.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap, VecDeque},
    hash::BuildHasher,
    time::{Duration, Instant},
};

use switchyard_work::{MAX_DELAY, Priority};

use crate::{
    Backoff, BackoffConfig, RateLimit,
    key::{ControllerId, KeySpace, ObjectName, ValidKey},
};

mod causes;
mod floor;
mod history;
mod inspect;
mod lease;
mod slot_index;
mod stats;
#[cfg(test)]
mod tests;

use causes::Causes;
pub use causes::{Cause, Origin};
use floor::ShardFloor;
pub use floor::{
    KindVersions, MAX_FLOOR_KIND_LEN, MAX_FLOOR_KINDS, MAX_FLOOR_NAMESPACES, ReadFloor,
};
use history::History as OutcomeHistory;
pub use history::{
    DEFAULT_OUTCOME_HISTORY, History, LastOutcome, MAX_ERROR_BYTES, OutcomeKind, TraceId,
};
pub use inspect::{KeyPhase, KeyView};
pub use lease::{InvalidLeaseId, Lease, LeaseId, LeaseIds, SequentialLeaseIds, WorkerId};
use lease::{LeaseInfo, LeaseMap};
use slot_index::SlotIndex;
pub use stats::{ShardStats, Totals};

/// Hashes keys (and the small maps by shard): seeded at random per queue, so that nobody
/// who names keys can make them collide, and fast enough to hash each key once per cycle.
type KeyHasher = foldhash::fast::RandomState;

/// Where an entry lives in its controller's slab (or a node in the outcome history's).
type Slot = u32;

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
    /// The lease is live but bound to another worker's stream; it stays that worker's.
    #[error("failed precondition: lease held by another stream")]
    ForeignLease,
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
    /// Controllers served at most, those named at start included: a new name beyond it is
    /// refused ([`crate::KeyError::TooManyControllers`]).
    pub max_controllers: usize,
    pub backoff: BackoffConfig,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            shard_count: 256,
            lease_timeout: Duration::from_secs(60),
            capacity: 1_000_000,
            max_controllers: crate::key::DEFAULT_MAX_CONTROLLERS,
            backoff: BackoffConfig::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ShardState {
    Active(u64),
    /// Handing over: no adds, no new leases; outcomes of in-flight leases still count.
    Draining(u64),
    /// Not served for now (the member's lease may have expired): no adds, no new leases;
    /// outcomes of in-flight leases still count, and the keys are kept in case the same
    /// member renews the shard's epoch ([`Queue::renew`]).
    Suspended(u64),
}

impl ShardState {
    fn epoch(self) -> u64 {
        match self {
            Self::Active(e) | Self::Draining(e) | Self::Suspended(e) => e,
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
    Leased {
        pending: Option<Due>,
    },
    /// Not held: the entry stays only while the outcome history remembers the key (it is
    /// dropped when the history forgets it), and an add makes it held again.
    Finished,
}

#[derive(Debug)]
struct Entry {
    key: ObjectName,
    /// The key's hash under the queue's [`KeyHasher`], computed when it was added.
    hash: u64,
    shard: u32,
    state: State,
    failures: u32,
    /// When the key last became ready.
    ready_since: Instant,
    /// Bumped on every reschedule; queue and heap items with an older value are stale.
    seq: u64,
    /// The key's node in the outcome history, or [`history::NIL`].
    history: u32,
}

impl Entry {
    fn is_held(&self) -> bool {
        !matches!(self.state, State::Finished)
    }
}

#[derive(Debug)]
struct ControllerQueue {
    /// The entries; a free slot is reused by the next new key.
    slots: Vec<Option<Entry>>,
    free: Vec<Slot>,
    /// The slot of each held key, filed under the upper half of the key's hash.
    index: SlotIndex,
    /// Indexed by `Priority as usize`; items carry the entry's `seq` when pushed.
    ready: [VecDeque<(Slot, u64)>; 2],
    /// Causes of the adds not yet handed to a worker (trace contexts, observation times), of
    /// the keys that have any. Beside the entries rather than in them: adds that name neither
    /// (lists, resyncs, and every add without traces or a watcher's stamp) cost no byte here.
    causes: HashMap<Slot, Causes, KeyHasher>,
}

impl ControllerQueue {
    fn new() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            index: SlotIndex::new(),
            ready: [VecDeque::new(), VecDeque::new()],
            causes: HashMap::default(),
        }
    }

    /// Keeps where an add to `slot` came from, when it names anything (most adds name
    /// nothing, and their key has no entry in `causes`).
    fn keep_origin(&mut self, slot: Slot, origin: Origin) {
        if !origin.is_empty() {
            self.causes.entry(slot).or_default().add(origin);
        }
    }

    /// The slot of `key`, whose hash is `hash`.
    fn find(&self, key: &ObjectName, hash: u64) -> Option<Slot> {
        let slots = &self.slots;
        self.index.find(tag(hash), |slot| {
            slots[slot as usize]
                .as_ref()
                .is_some_and(|entry| entry.key == *key)
        })
    }

    fn get(&self, slot: Slot) -> Option<&Entry> {
        self.slots.get(slot as usize)?.as_ref()
    }

    fn get_mut(&mut self, slot: Slot) -> Option<&mut Entry> {
        self.slots.get_mut(slot as usize)?.as_mut()
    }

    /// Holds a new key (not held yet) and returns its slot.
    fn insert(&mut self, entry: Entry) -> Slot {
        let hash = entry.hash;
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(entry);
                slot
            }
            None => {
                self.slots.push(Some(entry));
                (self.slots.len() - 1) as Slot
            }
        };
        self.index.insert(tag(hash), slot);
        slot
    }

    /// Loads the index bucket the removal of the key in `slot` will read (a hint only).
    fn prefetch_index(&self, slot: Slot) {
        if let Some(entry) = self.get(slot) {
            self.index.prefetch(tag(entry.hash));
        }
    }

    /// Forgets the key in `slot`, and its causes.
    fn remove(&mut self, slot: Slot) -> Option<Entry> {
        let entry = self.slots.get_mut(slot as usize)?.take()?;
        self.index.remove(tag(entry.hash), slot);
        self.free.push(slot);
        if !self.causes.is_empty() {
            self.causes.remove(&slot);
        }
        Some(entry)
    }

    /// Forgets every entry `keep` refuses, its node in `history` too; returns how many of
    /// them held their key.
    fn retain(
        &mut self,
        history: &mut OutcomeHistory,
        mut keep: impl FnMut(&Entry) -> bool,
    ) -> usize {
        let gone: Vec<Slot> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, entry)| entry.as_ref().is_some_and(|e| !keep(e)))
            .map(|(slot, _)| slot as Slot)
            .collect();
        gone.into_iter()
            .filter_map(|slot| self.forget(history, slot))
            .filter(Entry::is_held)
            .count()
    }

    /// Forgets the entry in `slot` and its node in `history`.
    fn forget(&mut self, history: &mut OutcomeHistory, slot: Slot) -> Option<Entry> {
        let entry = self.remove(slot)?;
        history.forget(entry.history);
        Some(entry)
    }

    /// The entries of the keys held (queued, delayed or leased).
    fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.slots.iter().flatten().filter(|e| e.is_held())
    }
}

/// What a key is filed under in a [`SlotIndex`]: the upper half of its hash.
fn tag(hash: u64) -> u32 {
    (hash >> 32) as u32
}

/// Ready time, entry seq when scheduled, controller, slot.
type DelayedItem = (Instant, u64, ControllerId, Slot);

/// `now + delay`, the delay cut to `longest`; a time past the clock's end is `now`: whatever
/// asked, and whatever `now` a caller gives, it never panics.
pub(crate) fn after(now: Instant, delay: Duration, longest: Duration) -> Instant {
    now.checked_add(delay.min(longest)).unwrap_or(now)
}

/// Maps by shard number: the elector chooses the shards a queue holds, so a fast hasher
/// suffices; a worker's outcome may name any shard, but only looks one up.
type ShardMap<V> = HashMap<u32, V, KeyHasher>;

/// The queue of one replica: every known controller's keys in every shard it serves.
///
/// Controllers become known at run time ([`KeySpace::intern`], through any clone of
/// [`Queue::key_space`]); the per-controller state grows to the new ids when their first key
/// arrives ([`Queue::know_controllers`]).
#[derive(Debug)]
pub struct Queue {
    config: QueueConfig,
    backoff: Backoff,
    keys: KeySpace,
    controllers: Vec<ControllerQueue>,
    /// Hashes every key this queue holds (see [`KeyHasher`]).
    hasher: KeyHasher,
    shards: ShardMap<ShardState>,
    /// The read floor of each shard served that has one.
    floors: ShardMap<ShardFloor>,
    /// When each shard served was taken at its epoch.
    held_since: ShardMap<Instant>,
    /// The epoch a shard was renewed from by this member: its leases given then still count.
    renewed_from: ShardMap<u64>,
    leases: LeaseMap<LeaseInfo>,
    lease_deadlines: BinaryHeap<Reverse<(Instant, LeaseId)>>,
    delayed: BinaryHeap<Reverse<DelayedItem>>,
    len: usize,
    next_seq: u64,
    lease_ids: Box<dyn LeaseIds>,
    cursor: usize,
    totals: Totals,
    /// How recently finished keys' latest leases ended.
    history: OutcomeHistory,
}

impl Queue {
    /// An empty queue serving no shard yet, knowing `controllers` from the start (others
    /// become known as callers name them); its lease ids come from `lease_ids`.
    pub fn new(
        config: QueueConfig,
        controllers: &[&str],
        lease_ids: impl LeaseIds + 'static,
    ) -> Self {
        let keys = KeySpace::with_limit(controllers, config.max_controllers, config.shard_count);
        let known = keys.len();
        Self {
            backoff: Backoff::new(config.backoff.clone(), known),
            keys,
            config,
            controllers: (0..known).map(|_| ControllerQueue::new()).collect(),
            hasher: KeyHasher::default(),
            shards: ShardMap::default(),
            floors: ShardMap::default(),
            held_since: ShardMap::default(),
            renewed_from: ShardMap::default(),
            leases: LeaseMap::default(),
            lease_deadlines: BinaryHeap::new(),
            delayed: BinaryHeap::new(),
            len: 0,
            next_seq: 0,
            lease_ids: Box::new(lease_ids),
            cursor: 0,
            totals: Totals::default(),
            history: OutcomeHistory::new(DEFAULT_OUTCOME_HISTORY),
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

    /// Starts serving `shard` at `epoch` from `now`, empty (recovery is level-triggered: the
    /// watcher resyncs the shard). A different epoch than the one held discards what was held.
    pub fn acquire(&mut self, shard: u32, epoch: u64, now: Instant) {
        if self.shards.get(&shard) == Some(&ShardState::Active(epoch)) {
            return;
        }
        self.discard_shard(shard);
        self.shards.insert(shard, ShardState::Active(epoch));
        self.held_since.insert(shard, now);
        self.reshare();
    }

    /// Serves `shard` again at `epoch`, which this member's own renewal of epoch `from` wrote
    /// (no other member held the shard in between): if the shard is suspended at `from`, its
    /// keys, delays, backoff counts and in-flight leases are kept, and outcomes of leases
    /// given at `from` still count. Returns how many keys were kept; otherwise it acquires
    /// the shard empty, as [`Self::acquire`] does, and returns `None`.
    pub fn renew(&mut self, shard: u32, from: u64, epoch: u64, now: Instant) -> Option<usize> {
        if self.shards.get(&shard) != Some(&ShardState::Suspended(from)) {
            self.acquire(shard, epoch, now);
            return None;
        }
        self.shards.insert(shard, ShardState::Active(epoch));
        self.renewed_from.insert(shard, from);
        self.reshare();
        // One pass over the keys: those of the shard are counted, and its ready ones queued
        // again (leasing skipped, and let go of, them while the shard was suspended).
        let mut kept = 0;
        let mut ready: Vec<(ControllerId, Slot, Priority)> = Vec::new();
        for (controller, queue) in self.controllers.iter().enumerate() {
            for (slot, entry) in queue.slots.iter().enumerate() {
                let Some(entry) = entry.as_ref().filter(|e| e.shard == shard && e.is_held()) else {
                    continue;
                };
                kept += 1;
                if let State::Ready(priority) = entry.state {
                    ready.push((controller as ControllerId, slot as Slot, priority));
                }
            }
        }
        for (controller, slot, priority) in ready {
            self.schedule(controller, slot, Due::Now(priority), now);
        }
        Some(kept)
    }

    /// Stops serving `shard` for now, keeping its keys: the member's lease may have expired,
    /// and the same member may renew the shard ([`Self::renew`]) or lose it (`release`).
    pub fn suspend(&mut self, shard: u32) {
        if let Some(state) = self.shards.get(&shard).copied() {
            self.shards
                .insert(shard, ShardState::Suspended(state.epoch()));
            self.reshare();
        }
    }

    /// Grows the per-controller state to every controller the key space knows (names made
    /// known since, through a clone of it).
    pub fn know_controllers(&mut self) {
        let known = self.keys.len();
        if known > self.controllers.len() {
            self.controllers.resize_with(known, ControllerQueue::new);
            self.backoff.grow(known);
        }
    }

    /// `controller`'s own retry rate and burst (cluster-wide; this replica applies its share),
    /// making the name known if it is new.
    pub fn set_rate_limit(
        &mut self,
        controller: &str,
        limit: RateLimit,
    ) -> Result<(), crate::KeyError> {
        let id = self.keys.intern(controller)?;
        self.know_controllers();
        self.backoff.set_limit(id as usize, limit);
        Ok(())
    }

    /// `controller`'s retry rate and burst on this replica.
    pub fn rate_limit(&self, controller: &str) -> Option<RateLimit> {
        self.backoff
            .effective(self.keys.controller_id(controller)? as usize)
    }

    /// This replica's part of every controller's retry rate: the active shards' part of all.
    fn reshare(&mut self) {
        let active = self
            .shards
            .values()
            .filter(|s| matches!(s, ShardState::Active(_)))
            .count();
        self.backoff
            .set_share(active as f64 / f64::from(self.config.shard_count.max(1)));
    }

    /// Stops leasing `shard` and drops its waiting keys; in-flight leases may still report.
    pub fn drain(&mut self, shard: u32) {
        if let Some(state) = self.shards.get(&shard).copied() {
            self.shards
                .insert(shard, ShardState::Draining(state.epoch()));
            self.reshare();
            self.drop_waiting(shard);
        }
    }

    /// Raises `shard`'s read floor by what a reconcile of a key of `namespace` read at (its
    /// applied outcome's report). Nothing for a shard this replica does not serve.
    pub fn raise_floor(&mut self, shard: u32, namespace: &str, observed: &ReadFloor) {
        if self.shards.contains_key(&shard) {
            self.floors
                .entry(shard)
                .or_default()
                .raise(namespace, observed);
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
                ShardState::Draining(_) | ShardState::Suspended(_) => None,
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
        self.add_caused(key, priority, delay, Origin::default(), now)
    }

    /// Adds a key with where the add came from; coalesced adds keep their causes (bounded)
    /// and the earliest time one was observed, and the next lease of the key carries them.
    pub fn add_caused(
        &mut self,
        key: &ValidKey,
        priority: Priority,
        delay: Duration,
        origin: Origin,
        now: Instant,
    ) -> Result<AddOutcome> {
        let (controller, shard) = (key.controller(), key.shard());
        if self.shard_epoch(shard).is_none() {
            return Err(Error::NotOwner { shard });
        }
        let due = if delay.is_zero() {
            Due::Now(priority)
        } else {
            Due::At(after(now, delay, MAX_DELAY))
        };
        if controller as usize >= self.controllers.len() {
            self.know_controllers();
        }
        // The one hash of this key until it leaves the queue.
        let hash = self.hasher.hash_one(key.object());
        let queue = &mut self.controllers[controller as usize];
        let found = queue.find(key.object(), hash);
        // A key the history remembers but the queue no longer holds is held again as new.
        let finished = found.filter(|&slot| queue.get(slot).is_some_and(|e| !e.is_held()));
        let Some(slot) = found.filter(|_| finished.is_none()) else {
            if self.len >= self.config.capacity {
                return Err(Error::Full {
                    capacity: self.config.capacity,
                });
            }
            let seq = self.next_seq;
            self.next_seq += 1;
            let state = match due {
                Due::Now(priority) => State::Ready(priority),
                Due::At(at) => State::Delayed(at),
            };
            let slot = match finished {
                Some(slot) => {
                    if let Some(entry) = queue.get_mut(slot) {
                        (entry.state, entry.failures, entry.ready_since, entry.seq) =
                            (state, 0, now, seq);
                    }
                    slot
                }
                None => queue.insert(Entry {
                    key: key.object().clone(),
                    hash,
                    shard,
                    state,
                    failures: 0,
                    ready_since: now,
                    seq,
                    history: history::NIL,
                }),
            };
            // Scheduled here rather than through `schedule`, which would look the slot up again.
            match due {
                Due::Now(priority) => queue.ready[priority as usize].push_back((slot, seq)),
                Due::At(at) => self.delayed.push(Reverse((at, seq, controller, slot))),
            }
            queue.keep_origin(slot, origin);
            self.len += 1;
            self.totals.adds += 1;
            return Ok(AddOutcome::Added);
        };
        let Some(entry) = queue.get_mut(slot) else {
            return Ok(AddOutcome::Coalesced);
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
            State::Finished => false,
        };
        queue.keep_origin(slot, origin);
        if reschedule {
            self.schedule(controller, slot, due, now);
        }
        Ok(AddOutcome::Coalesced)
    }

    /// Puts an existing entry in the ready queue or the delayed heap.
    fn schedule(&mut self, controller: ControllerId, slot: Slot, due: Due, now: Instant) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let queue = &mut self.controllers[controller as usize];
        let Some(entry) = queue.get_mut(slot) else {
            return;
        };
        entry.seq = seq;
        match due {
            Due::Now(priority) => {
                if !matches!(entry.state, State::Ready(_)) {
                    entry.ready_since = now;
                }
                entry.state = State::Ready(priority);
                queue.ready[priority as usize].push_back((slot, seq));
            }
            Due::At(at) if at <= now => {
                self.schedule(controller, slot, Due::Now(Priority::Normal), now)
            }
            Due::At(at) => {
                entry.state = State::Delayed(at);
                self.delayed.push(Reverse((at, seq, controller, slot)));
            }
        }
    }

    fn discard_shard(&mut self, shard: u32) {
        if self.shards.remove(&shard).is_some() {
            self.reshare();
        }
        self.floors.remove(&shard);
        self.held_since.remove(&shard);
        self.renewed_from.remove(&shard);
        self.leases.retain(|_, l| l.key.shard() != shard);
        for queue in &mut self.controllers {
            self.len -= queue.retain(&mut self.history, |e| e.shard != shard);
        }
    }

    fn drop_waiting(&mut self, shard: u32) {
        for queue in &mut self.controllers {
            self.len -= queue.retain(&mut self.history, |e| {
                e.shard != shard || matches!(e.state, State::Leased { .. })
            });
        }
    }
}
