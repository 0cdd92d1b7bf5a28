//! A shard's read floor: per kind, the highest cache resourceVersion a reconcile of the shard
//! read at. Every lease of the shard carries it, and the worker reads each kind at least at
//! that version, so a reconcile never acts on a state older than what an earlier reconcile
//! of the shard saw or wrote, whichever watcher replica answers its reads.
//!
//! The floor is soft state, like the shard's keys: a shard that moves starts with none.

use std::{collections::BTreeMap, sync::Arc};

/// Kinds one floor holds at most: a shard's controllers read a handful. A reconcile that
/// reports more is refused at the edge; a floor that is full keeps the kinds it has.
pub const MAX_FLOOR_KINDS: usize = 64;

/// Longest kind name ("group/version/Kind"): a DNS subdomain group (253), a version and a
/// kind (63 each), and the two slashes.
pub const MAX_FLOOR_KIND_LEN: usize = 253 + 63 + 63 + 2;

/// Per kind ("group/version/Kind", "v1/Pod" for the core group), a resourceVersion.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadFloor(BTreeMap<Arc<str>, u64>);

impl ReadFloor {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.0.iter().map(|(kind, rv)| (&**kind, *rv))
    }

    /// Raises each kind to at least the version `observed` names; new kinds beyond
    /// [`MAX_FLOOR_KINDS`] are not taken.
    pub fn raise<'a>(&mut self, observed: impl IntoIterator<Item = (&'a str, u64)>) {
        for (kind, rv) in observed {
            if let Some(floor) = self.0.get_mut(kind) {
                *floor = (*floor).max(rv);
            } else if self.0.len() < MAX_FLOOR_KINDS {
                self.0.insert(kind.into(), rv);
            }
        }
    }
}

impl<'a> FromIterator<(&'a str, u64)> for ReadFloor {
    fn from_iter<I: IntoIterator<Item = (&'a str, u64)>>(observed: I) -> Self {
        let mut floor = Self::default();
        floor.raise(observed);
        floor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_floor_only_rises_and_stays_bounded() {
        let mut floor: ReadFloor = [("v1/Pod", 10), ("apps/v1/ReplicaSet", 7)]
            .into_iter()
            .collect();
        floor.raise([("v1/Pod", 8), ("apps/v1/ReplicaSet", 9)]);
        assert_eq!(
            floor.iter().collect::<Vec<_>>(),
            [("apps/v1/ReplicaSet", 9), ("v1/Pod", 10)]
        );
        let kinds: Vec<String> = (0..2 * MAX_FLOOR_KINDS)
            .map(|i| format!("k/v1/K{i}"))
            .collect();
        floor.raise(kinds.iter().map(|k| (k.as_str(), 1)));
        assert_eq!(floor.iter().count(), MAX_FLOOR_KINDS);
        floor.raise([("v1/Pod", 11)]);
        assert!(floor.iter().any(|kind| kind == ("v1/Pod", 11)));
    }
}
