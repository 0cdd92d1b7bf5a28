//! The latest outcome of recently finished keys, for operators asking "why" about one key
//! (`kubectl switchyard why`): how its last lease ended, its error, its trace and its worker.
//!
//! Bounded: at most `capacity` keys, the least recently finished forgotten first (an LRU).
//! The nodes live in one slab linked most recent first, so recording and evicting cost no
//! allocation beyond the error text; the key shares its text with the queue's own entry
//! while the key is held.
//!
//! ```text
//!  index: hash ─► slot       slab: [head] ⇄ … ⇄ [tail]   (most recently finished → least)
//!  record(key): move or insert at head; beyond capacity the tail's slot is reused
//! ```
//!
//! The caller gives each key's hash (the queue's, which its entry carries), so recording
//! an outcome hashes nothing.

use std::time::{Duration, Instant};

use super::{Cause, Slot, SlotIndex, WorkerId, tag};
use crate::key::ValidKey;

/// Keys remembered by default: a replica of a busy installation finishes this many keys in
/// a few seconds, a quiet one in hours; at about 230 bytes each (without errors) it is
/// 23 MB at most, an eighth of what a million queued keys take.
pub const DEFAULT_OUTCOME_HISTORY: usize = 100_000;
/// Bytes of a failure's reason kept: a line of an apiserver error and its cause, not a
/// whole response body someone's reconciler put in it.
pub const MAX_ERROR_BYTES: usize = 1024;

/// How a lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutcomeKind {
    Done,
    RequeueAfter,
    Failed,
    Forget,
    /// No outcome before the deadline.
    LeaseExpired,
}

/// A W3C trace id: 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceId(pub [u8; 16]);

impl TraceId {
    /// The trace id of a `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), if it has one that
    /// is not all zeros.
    pub fn of_traceparent(value: &str) -> Option<TraceId> {
        let hex = value.split('-').nth(1)?;
        if hex.len() != 32 {
            return None;
        }
        let id = u128::from_str_radix(hex, 16).ok()?;
        (id != 0).then(|| TraceId(id.to_be_bytes()))
    }

    /// The trace of the first cause that carries a `traceparent`: a lease's span is a child
    /// of its oldest cause, and the reconcile's span a child of the lease's.
    pub(super) fn of_causes(causes: &[Cause]) -> Option<TraceId> {
        causes.iter().find_map(|cause| {
            cause
                .iter()
                .find(|(k, _)| k == "traceparent")
                .and_then(|(_, v)| TraceId::of_traceparent(v))
        })
    }
}

impl std::fmt::Display for TraceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", u128::from_be_bytes(self.0))
    }
}

/// How a key's latest lease ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastOutcome {
    pub kind: OutcomeKind,
    pub finished_at: Instant,
    /// 1 + the failures not forgotten when the lease was granted.
    pub attempt: u32,
    /// The failure's reason, at most [`MAX_ERROR_BYTES`].
    pub error: Option<Box<str>>,
    pub trace_id: Option<TraceId>,
    pub worker: WorkerId,
    /// From lease to outcome (or expiry).
    pub duration: Duration,
}

/// `reason` cut to at most [`MAX_ERROR_BYTES`] on a character boundary.
pub fn truncate_error(reason: &str) -> Box<str> {
    let mut end = reason.len().min(MAX_ERROR_BYTES);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].into()
}

const NIL: u32 = u32::MAX;

#[derive(Debug)]
struct Node {
    key: ValidKey,
    hash: u64,
    outcome: LastOutcome,
    /// Towards the head (more recent).
    prev: u32,
    /// Towards the tail (less recent).
    next: u32,
}

/// The latest outcome of at most `capacity` keys; see the module doc.
#[derive(Debug)]
pub struct History {
    capacity: usize,
    /// The slot of each remembered key, filed under its hash's tag.
    index: SlotIndex,
    slab: Vec<Node>,
    head: u32,
    tail: u32,
}

impl History {
    /// Remembers at most `capacity` keys (0 remembers none).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.min(NIL as usize - 1),
            index: SlotIndex::new(),
            slab: Vec::new(),
            head: NIL,
            tail: NIL,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    fn find(&self, key: &ValidKey, hash: u64) -> Option<Slot> {
        self.index
            .find(tag(hash), |slot| self.slab[slot as usize].key == *key)
    }

    /// The latest outcome of `key`, whose hash is `hash`.
    pub fn get(&self, key: &ValidKey, hash: u64) -> Option<&LastOutcome> {
        self.find(key, hash)
            .map(|slot| &self.slab[slot as usize].outcome)
    }

    /// Records `outcome` as the latest of `key` (whose hash is `hash`), making it the most
    /// recent; beyond capacity the least recently finished key is forgotten.
    pub fn record(&mut self, key: &ValidKey, hash: u64, outcome: LastOutcome) {
        if self.capacity == 0 {
            return;
        }
        if let Some(slot) = self.find(key, hash) {
            self.slab[slot as usize].outcome = outcome;
            self.unlink(slot);
            self.push_front(slot);
            return;
        }
        let slot = if self.slab.len() < self.capacity {
            self.slab.push(Node {
                key: key.clone(),
                hash,
                outcome,
                prev: NIL,
                next: NIL,
            });
            (self.slab.len() - 1) as u32
        } else {
            let slot = self.tail;
            self.unlink(slot);
            self.index.remove(tag(self.slab[slot as usize].hash), slot);
            let node = &mut self.slab[slot as usize];
            node.key = key.clone();
            node.hash = hash;
            node.outcome = outcome;
            slot
        };
        self.index.insert(tag(hash), slot);
        self.push_front(slot);
    }

    fn unlink(&mut self, slot: u32) {
        let (prev, next) = {
            let node = &self.slab[slot as usize];
            (node.prev, node.next)
        };
        match prev {
            NIL => self.head = next,
            p => self.slab[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.slab[n as usize].prev = prev,
        }
    }

    fn push_front(&mut self, slot: u32) {
        let old = self.head;
        {
            let node = &mut self.slab[slot as usize];
            node.prev = NIL;
            node.next = old;
        }
        match old {
            NIL => self.tail = slot,
            o => self.slab[o as usize].prev = slot,
        }
        self.head = slot;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{KeySpace, WorkKey};

    /// Any hash serves the history, as long as a key always has the same one.
    fn hash(key: &ValidKey) -> u64 {
        use std::hash::BuildHasher;
        foldhash::fast::FixedState::default().hash_one(key.object())
    }

    fn record(history: &mut History, key: &ValidKey, outcome: LastOutcome) {
        history.record(key, hash(key), outcome);
    }

    fn get<'h>(history: &'h History, key: &ValidKey) -> Option<&'h LastOutcome> {
        history.get(key, hash(key))
    }

    fn key(space: &KeySpace, name: &str) -> ValidKey {
        space
            .validate(&WorkKey::new("rs", "ns", name))
            .expect("valid key")
    }

    fn outcome(attempt: u32) -> LastOutcome {
        LastOutcome {
            kind: OutcomeKind::Failed,
            finished_at: Instant::now(),
            attempt,
            error: Some("boom".into()),
            trace_id: None,
            worker: 1,
            duration: Duration::from_millis(5),
        }
    }

    #[test]
    fn the_least_recently_finished_key_goes_first() {
        let space = KeySpace::new(&["rs"], 16);
        let mut history = History::new(2);
        let (a, b, c) = (key(&space, "a"), key(&space, "b"), key(&space, "c"));
        record(&mut history, &a, outcome(1));
        record(&mut history, &b, outcome(1));
        // a finishes again: b is now the least recent.
        record(&mut history, &a, outcome(2));
        record(&mut history, &c, outcome(1));
        assert_eq!(history.len(), 2);
        assert_eq!(get(&history, &a).map(|o| o.attempt), Some(2));
        assert!(get(&history, &b).is_none(), "b was the least recent");
        assert!(get(&history, &c).is_some());
        for i in 0..100 {
            record(&mut history, &key(&space, &format!("k{i}")), outcome(i));
        }
        assert_eq!(history.len(), 2);
        assert_eq!(
            get(&history, &key(&space, "k99")).map(|o| o.attempt),
            Some(99)
        );
        assert_eq!(
            get(&history, &key(&space, "k98")).map(|o| o.attempt),
            Some(98)
        );
    }

    #[test]
    fn zero_capacity_remembers_nothing() {
        let space = KeySpace::new(&["rs"], 16);
        let mut history = History::new(0);
        record(&mut history, &key(&space, "a"), outcome(1));
        assert!(history.is_empty());
    }

    #[test]
    fn errors_are_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_ERROR_BYTES);
        let cut = truncate_error(&long);
        assert!(cut.len() <= MAX_ERROR_BYTES && cut.len() >= MAX_ERROR_BYTES - 1);
        assert!(cut.chars().all(|c| c == 'é'));
        assert_eq!(&*truncate_error("short"), "short");
    }

    #[test]
    fn a_traceparent_gives_its_trace_id() {
        let id = TraceId::of_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .expect("a trace id");
        assert_eq!(id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(
            TraceId::of_traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01")
                .is_none()
        );
        assert!(TraceId::of_traceparent("garbage").is_none());
    }
}
