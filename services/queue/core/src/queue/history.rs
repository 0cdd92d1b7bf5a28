//! The latest outcome of recently finished keys, for operators asking "why" about one key
//! (`kubectl switchyard why`): how its last lease ended, its error, its trace and its worker.
//!
//! Bounded: at most `capacity` keys, the least recently finished forgotten first (an LRU).
//! The nodes live in one slab linked most recent first, so recording and evicting cost no
//! allocation beyond the error text.
//!
//! A node belongs to one of the queue's entries (its controller and slot), and the entry
//! keeps its node: the history has no index of its own, the queue's finds the key. A key the
//! queue no longer holds keeps its entry, marked finished and not counted as held, for as long
//! as the history remembers it; forgetting it drops the entry. So recording an outcome looks
//! nothing up, where a history indexed by key looked up the key recorded and the key forgotten,
//! two cache misses per outcome in a large history.
//!
//! ```text
//!  entry.history ─► node     slab: [head] ⇄ … ⇄ [tail]   (most recently finished → least)
//!  record(entry): move or insert at head; beyond capacity the tail's node is reused, and
//!                 its entry told (dropped if finished, else it just loses its node)
//! ```
//!
//! Since the tail is the next entry forgotten, the queue asks for it
//! ([`History::least_recent`]) after each outcome and has the CPU load that entry's index
//! bucket while other work runs: dropping a finished key then finds its bucket in the cache,
//! where it was the one miss of a key's cycle that nothing else overlapped.

use std::time::{Duration, Instant};

use super::{Cause, Slot, WorkerId};
use crate::key::ControllerId;

/// Keys remembered by default: a replica of a busy installation finishes this many keys in
/// a few seconds, a quiet one in hours; at about 330 bytes each (the node, and the entry of
/// a key no longer held; without errors) it is 33 MB at most, a sixth of what a million
/// queued keys take.
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

/// No node: an entry the history does not remember, or the end of the list.
pub(super) const NIL: u32 = u32::MAX;

/// The queue entry whose outcome a node holds: its controller and its slot there.
pub(super) type Owner = (ControllerId, Slot);

#[derive(Debug)]
struct Node {
    owner: Owner,
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
    slab: Vec<Node>,
    /// Nodes forgotten before they reached the tail, reused first.
    free: Vec<u32>,
    head: u32,
    tail: u32,
}

impl History {
    /// Remembers at most `capacity` keys (0 remembers none).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.min(NIL as usize - 1),
            slab: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.slab.len() - self.free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The outcome in `node` (an entry's), if it has one.
    pub(super) fn get(&self, node: u32) -> Option<&LastOutcome> {
        self.slab.get(node as usize).map(|n| &n.outcome)
    }

    /// Records `outcome` as the latest of the entry `owner`, whose node is `*node` (replaced
    /// when it is [`NIL`]), and makes it the most recent. Beyond capacity the least recently
    /// finished entry is forgotten and returned: the caller clears that entry's node, or drops
    /// the entry if the queue no longer holds its key.
    pub(super) fn record(
        &mut self,
        node: &mut u32,
        owner: Owner,
        outcome: LastOutcome,
    ) -> Option<Owner> {
        if self.capacity == 0 {
            return None;
        }
        if let Some(n) = self.slab.get_mut(*node as usize) {
            debug_assert_eq!(n.owner, owner, "a node belongs to one entry");
            n.outcome = outcome;
            self.unlink(*node);
            self.push_front(*node);
            return None;
        }
        let mut forgotten = None;
        let slot = if let Some(slot) = self.free.pop() {
            slot
        } else if self.slab.len() < self.capacity {
            self.slab.push(Node {
                owner,
                outcome,
                prev: NIL,
                next: NIL,
            });
            *node = (self.slab.len() - 1) as u32;
            self.push_front(*node);
            return None;
        } else {
            let slot = self.tail;
            self.unlink(slot);
            forgotten = Some(self.slab[slot as usize].owner);
            slot
        };
        let n = &mut self.slab[slot as usize];
        n.owner = owner;
        n.outcome = outcome;
        *node = slot;
        self.push_front(slot);
        forgotten
    }

    /// The entry the next [`History::record`] of an entry without a node forgets: the least
    /// recent, once the history is full and has no forgotten node to reuse.
    pub(super) fn least_recent(&self) -> Option<Owner> {
        if self.slab.len() < self.capacity || !self.free.is_empty() {
            return None;
        }
        self.slab.get(self.tail as usize).map(|node| node.owner)
    }

    /// Forgets `node` (an entry's, whose key the queue drops), if it is one.
    pub(super) fn forget(&mut self, node: u32) {
        if (node as usize) < self.slab.len() {
            self.unlink(node);
            self.free.push(node);
        }
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

    /// Entries as the queue keeps them: each its node (or [`NIL`]).
    struct Entries(Vec<u32>);

    impl Entries {
        fn new(n: usize) -> Self {
            Self(vec![NIL; n])
        }

        /// Records `attempt` for entry `e`, clearing the node of the entry forgotten.
        fn record(&mut self, history: &mut History, e: Slot, attempt: u32) {
            if let Some((_, gone)) =
                history.record(&mut self.0[e as usize], (0, e), outcome(attempt))
            {
                self.0[gone as usize] = NIL;
            }
        }

        fn attempt(&self, history: &History, e: Slot) -> Option<u32> {
            history.get(self.0[e as usize]).map(|o| o.attempt)
        }
    }

    #[test]
    fn the_least_recently_finished_key_goes_first() {
        let mut history = History::new(2);
        let mut entries = Entries::new(200);
        let (a, b, c) = (0, 1, 2);
        entries.record(&mut history, a, 1);
        entries.record(&mut history, b, 1);
        // a finishes again: b is now the least recent.
        entries.record(&mut history, a, 2);
        entries.record(&mut history, c, 1);
        assert_eq!(history.len(), 2);
        assert_eq!(entries.attempt(&history, a), Some(2));
        assert_eq!(entries.attempt(&history, b), None, "b was the least recent");
        assert!(entries.attempt(&history, c).is_some());
        for e in 100..200 {
            entries.record(&mut history, e, e);
        }
        assert_eq!(history.len(), 2);
        assert_eq!(entries.attempt(&history, 199), Some(199));
        assert_eq!(entries.attempt(&history, 198), Some(198));
        assert_eq!(entries.0.iter().filter(|&&n| n != NIL).count(), 2);
    }

    #[test]
    fn a_forgotten_node_is_reused_before_the_least_recent_is_evicted() {
        let mut history = History::new(2);
        let mut entries = Entries::new(3);
        entries.record(&mut history, 0, 1);
        entries.record(&mut history, 1, 1);
        history.forget(entries.0[1]);
        entries.0[1] = NIL;
        assert_eq!(history.len(), 1);
        entries.record(&mut history, 2, 1);
        assert_eq!(history.len(), 2);
        assert_eq!(
            entries.attempt(&history, 0),
            Some(1),
            "room was made by forgetting"
        );
        assert_eq!(entries.attempt(&history, 2), Some(1));
    }

    #[test]
    fn the_entry_forgotten_next_is_known_before() {
        let mut history = History::new(2);
        let mut entries = Entries::new(3);
        entries.record(&mut history, 0, 1);
        assert_eq!(
            history.least_recent(),
            None,
            "not full: nothing is forgotten"
        );
        entries.record(&mut history, 1, 1);
        assert_eq!(history.least_recent(), Some((0, 0)));
        entries.record(&mut history, 0, 2);
        assert_eq!(history.least_recent(), Some((0, 1)));
        entries.record(&mut history, 2, 1);
        assert_eq!(entries.attempt(&history, 1), None, "1 went, as announced");
        history.forget(entries.0[0]);
        entries.0[0] = NIL;
        assert_eq!(
            history.least_recent(),
            None,
            "a forgotten node is reused first"
        );
        assert_eq!(History::new(0).least_recent(), None);
    }

    #[test]
    fn zero_capacity_remembers_nothing() {
        let mut history = History::new(0);
        let mut entries = Entries::new(1);
        entries.record(&mut history, 0, 1);
        assert!(history.is_empty());
        assert_eq!(entries.0[0], NIL);
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
