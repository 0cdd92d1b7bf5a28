//! An index from a key's hash to the slab slot holding the key, for the queue's held keys and
//! the outcome history.
//!
//! The queue passes every key through it twice per cycle (found at add, removed at done), in
//! tables of up to a million keys, so each operation costs what its cache misses cost. A
//! bucket is one `u64`, the hash's tag (its upper half) beside the slot, in one open-addressed
//! array probed linearly: finding a key reads the buckets from its home on, which for a table
//! at most three quarters full is one cache line nearly always, and removing a key rewrites
//! the buckets after it in the same line. A table with separate control bytes (as hashbrown
//! keeps them) reads two lines far apart for each removal.
//!
//! ```text
//!  buckets: [tag│slot] [tag│slot] [ empty ] [tag│slot] …    home(tag) = tag × φ ≫ shift
//!  remove: empty the bucket, then move later ones of the run back over the hole
//! ```
//!
//! The index keeps only the tag, never reads an entry to place one, and so grows without
//! touching the slab; the caller compares keys ([`SlotIndex::find`]). Tags may repeat (two
//! keys whose hashes share their upper half); a `(tag, slot)` pair may not.

use super::Slot;

/// A bucket no entry uses: slot `u32::MAX` is never given out.
const EMPTY: u64 = u64::MAX;

/// The table is grown before it is fuller than this (numerator, denominator).
const MAX_LOAD: (usize, usize) = (3, 4);

const MIN_BUCKETS: usize = 16;

#[derive(Debug, Default)]
pub(super) struct SlotIndex {
    /// A power of two long, or empty.
    buckets: Vec<u64>,
    len: usize,
}

impl SlotIndex {
    pub(super) fn new() -> Self {
        Self::default()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }

    /// The slot of the first entry with `tag` whose slot `is` accepts (the caller compares
    /// the key in the slot).
    pub(super) fn find(&self, tag: u32, mut is: impl FnMut(Slot) -> bool) -> Option<Slot> {
        if self.buckets.is_empty() {
            return None;
        }
        let mask = self.buckets.len() - 1;
        let mut at = self.home(tag);
        loop {
            let bucket = self.buckets[at];
            if bucket == EMPTY {
                return None;
            }
            if tag_of(bucket) == tag && is(slot_of(bucket)) {
                return Some(slot_of(bucket));
            }
            at = (at + 1) & mask;
        }
    }

    /// Files `slot` under `tag`; the pair must not be filed already.
    pub(super) fn insert(&mut self, tag: u32, slot: Slot) {
        assert!(slot != Slot::MAX, "slot {slot} is reserved");
        if (self.len + 1) * MAX_LOAD.1 > self.buckets.len() * MAX_LOAD.0 {
            self.grow();
        }
        self.place(pack(tag, slot));
        self.len += 1;
    }

    /// Unfiles `slot` from `tag`; false if it was not filed there.
    pub(super) fn remove(&mut self, tag: u32, slot: Slot) -> bool {
        if self.buckets.is_empty() {
            return false;
        }
        let mask = self.buckets.len() - 1;
        let wanted = pack(tag, slot);
        let mut hole = self.home(tag);
        loop {
            match self.buckets[hole] {
                EMPTY => return false,
                bucket if bucket == wanted => break,
                _ => hole = (hole + 1) & mask,
            }
        }
        // Backward shift: each later bucket of the run that may sit at the hole (its home is
        // not between the hole and it) moves there, and leaves its own place as the hole.
        let mut at = hole;
        loop {
            at = (at + 1) & mask;
            let bucket = self.buckets[at];
            if bucket == EMPTY {
                break;
            }
            let home = self.home(tag_of(bucket));
            if at.wrapping_sub(home) & mask >= at.wrapping_sub(hole) & mask {
                self.buckets[hole] = bucket;
                hole = at;
            }
        }
        self.buckets[hole] = EMPTY;
        self.len -= 1;
        true
    }

    /// Asks the CPU to load the home bucket of `tag` into its cache, without waiting: a
    /// hint for a [`SlotIndex::remove`] or [`SlotIndex::find`] of that tag soon after.
    pub(super) fn prefetch(&self, tag: u32) {
        if let Some(bucket) = self.buckets.get(self.home(tag)) {
            prefetch(bucket);
        }
    }

    fn home(&self, tag: u32) -> usize {
        let bits = self.buckets.len().trailing_zeros();
        // Fibonacci hashing: the product's top bits depend on every bit of the tag.
        (u64::from(tag).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize
    }

    /// Puts `bucket` in the first empty bucket from its home on.
    fn place(&mut self, bucket: u64) {
        let mask = self.buckets.len() - 1;
        let mut at = self.home(tag_of(bucket));
        while self.buckets[at] != EMPTY {
            at = (at + 1) & mask;
        }
        self.buckets[at] = bucket;
    }

    /// Twice the buckets (at least [`MIN_BUCKETS`]), every entry placed again from its tag.
    fn grow(&mut self) {
        let size = (self.buckets.len() * 2).max(MIN_BUCKETS);
        let old = std::mem::replace(&mut self.buckets, vec![EMPTY; size]);
        for bucket in old.into_iter().filter(|&b| b != EMPTY) {
            self.place(bucket);
        }
    }
}

fn pack(tag: u32, slot: Slot) -> u64 {
    (u64::from(tag) << 32) | u64::from(slot)
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn prefetch(bucket: &u64) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    // SAFETY: a prefetch is a hint: it reads nothing into the program and cannot fault, and
    // the address is of a live bucket. SSE, which it needs, is part of every x86_64 CPU.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(bucket).cast()) }
}

#[cfg(not(target_arch = "x86_64"))]
fn prefetch(_: &u64) {}

fn tag_of(bucket: u64) -> u32 {
    (bucket >> 32) as u32
}

fn slot_of(bucket: u64) -> Slot {
    bucket as u32
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn finds_what_was_filed_and_not_what_was_removed() {
        let mut index = SlotIndex::new();
        assert_eq!(index.find(7, |_| true), None);
        assert!(!index.remove(7, 1));
        index.insert(7, 1);
        index.insert(7, 2);
        index.insert(8, 3);
        assert_eq!(index.len(), 3);
        assert_eq!(index.find(7, |s| s == 2), Some(2));
        assert_eq!(index.find(7, |s| s == 3), None, "slot 3 is filed under 8");
        assert!(index.remove(7, 1));
        assert!(!index.remove(7, 1));
        assert_eq!(index.find(7, |_| true), Some(2));
        assert_eq!(index.len(), 2);
    }

    #[test]
    fn stays_under_three_quarters_full() {
        let mut index = SlotIndex::new();
        for slot in 0..100_000u32 {
            index.insert(slot.wrapping_mul(2_654_435_761), slot);
            assert!(index.len() * 4 <= index.buckets.len() * 3);
        }
        for slot in 0..100_000u32 {
            let tag = slot.wrapping_mul(2_654_435_761);
            assert_eq!(index.find(tag, |s| s == slot), Some(slot));
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u32, Slot),
        Remove(u32, Slot),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few tags, so that runs are long, wrap around the table's end and share tags.
        (any::<bool>(), 0u32..24, 0u32..64).prop_map(|(insert, tag, slot)| {
            let tag = tag.wrapping_mul(0x8000_0001);
            if insert {
                Op::Insert(tag, slot)
            } else {
                Op::Remove(tag, slot)
            }
        })
    }

    proptest! {
        /// Against a set of pairs: after any inserts and removals, every filed pair is found
        /// and no other.
        #[test]
        fn behaves_as_a_set_of_pairs(ops in proptest::collection::vec(op(), 1..400)) {
            let mut index = SlotIndex::new();
            let mut model = HashSet::new();
            for op in ops {
                match op {
                    Op::Insert(tag, slot) => {
                        if model.insert((tag, slot)) {
                            index.insert(tag, slot);
                        }
                    }
                    Op::Remove(tag, slot) => {
                        prop_assert_eq!(index.remove(tag, slot), model.remove(&(tag, slot)));
                    }
                }
                prop_assert_eq!(index.len(), model.len());
            }
            for tag in (0u32..24).map(|t| t.wrapping_mul(0x8000_0001)) {
                for slot in 0..64 {
                    let found = index.find(tag, |s| s == slot);
                    prop_assert_eq!(found.is_some(), model.contains(&(tag, slot)));
                }
            }
        }
    }
}
