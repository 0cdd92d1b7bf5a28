//! A shard's read floor: the highest cache resourceVersion reconciles of the shard read at,
//! per kind over every namespace and per kind in each namespace. Every lease of the shard
//! carries the kinds' floor and its key's namespace's, and the worker reads each kind at least
//! at that version, so a reconcile never acts on a state older than what an earlier reconcile
//! of the shard saw or wrote, whichever watcher replica answers its reads.
//!
//! Both are needed. A watcher that watches a kind with one stream compares a version with
//! everything it has of the kind, so the kinds' floor serves it. A watcher with one stream per
//! namespace (`namespaces.include`) compares a read with its namespace's stream only, which a
//! version reached in another namespace may never reach: it needs the namespace's own floor.
//!
//! The floor is soft state, like the shard's keys: a shard that moves starts with none.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

/// Kinds one floor holds at most: a shard's controllers read a handful. A reconcile that
/// reports more is refused at the edge; a floor that is full keeps the kinds it has.
pub const MAX_FLOOR_KINDS: usize = 64;

/// Longest kind name ("group/version/Kind"): a DNS subdomain group (253), a version and a
/// kind (63 each), and the two slashes.
pub const MAX_FLOOR_KIND_LEN: usize = 253 + 63 + 63 + 2;

/// Namespaces one shard's floor holds at most. A new namespace beyond them takes the place of
/// the one whose newest version is the oldest: a floor exists to outlast a watcher's lag
/// (milliseconds to seconds), and that namespace has been quiet the longest.
pub const MAX_FLOOR_NAMESPACES: usize = 1024;

/// Per kind ("group/version/Kind", "v1/Pod" for the core group), a resourceVersion; at most
/// [`MAX_FLOOR_KINDS`] kinds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KindVersions(BTreeMap<Arc<str>, u64>);

impl KindVersions {
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

    fn newest(&self) -> u64 {
        self.0.values().copied().max().unwrap_or(0)
    }
}

impl<'a> FromIterator<(&'a str, u64)> for KindVersions {
    fn from_iter<I: IntoIterator<Item = (&'a str, u64)>>(observed: I) -> Self {
        let mut versions = Self::default();
        versions.raise(observed);
        versions
    }
}

/// A floor as one key reads at it: what a lease carries, and what its reconcile reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadFloor {
    /// Per kind, over every namespace.
    pub kinds: KindVersions,
    /// Per kind, in the key's namespace.
    pub namespace: KindVersions,
}

impl ReadFloor {
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty() && self.namespace.is_empty()
    }

    /// A floor of these kinds' versions, over every namespace and in the key's.
    #[cfg(test)]
    pub(crate) fn from_pairs(kinds: &[(&str, u64)], namespace: &[(&str, u64)]) -> Self {
        Self {
            kinds: kinds.iter().copied().collect(),
            namespace: namespace.iter().copied().collect(),
        }
    }
}

/// One shard's floor.
#[derive(Debug, Default)]
pub(crate) struct ShardFloor {
    kinds: KindVersions,
    namespaces: HashMap<Arc<str>, KindVersions>,
}

impl ShardFloor {
    /// The floor a key of `namespace` reads at.
    pub(crate) fn of(&self, namespace: &str) -> ReadFloor {
        ReadFloor {
            kinds: self.kinds.clone(),
            namespace: self.namespaces.get(namespace).cloned().unwrap_or_default(),
        }
    }

    /// Raises the floor by what a reconcile of a key of `namespace` read at.
    pub(crate) fn raise(&mut self, namespace: &str, observed: &ReadFloor) {
        self.kinds.raise(observed.kinds.iter());
        if observed.namespace.is_empty() {
            return;
        }
        if let Some(floor) = self.namespaces.get_mut(namespace) {
            floor.raise(observed.namespace.iter());
            return;
        }
        if self.namespaces.len() >= MAX_FLOOR_NAMESPACES {
            let quietest = self
                .namespaces
                .iter()
                .min_by_key(|(_, floor)| floor.newest())
                .map(|(namespace, _)| namespace.clone());
            if let Some(quietest) = quietest {
                self.namespaces.remove(&quietest);
            }
        }
        self.namespaces
            .insert(namespace.into(), observed.namespace.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_floor_only_rises_and_stays_bounded() {
        let mut floor: KindVersions = [("v1/Pod", 10), ("apps/v1/ReplicaSet", 7)]
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

    #[test]
    fn a_key_reads_at_the_kinds_floor_and_its_own_namespaces() {
        let mut shard = ShardFloor::default();
        shard.raise(
            "a",
            &ReadFloor::from_pairs(&[("v1/Pod", 40)], &[("v1/Pod", 40)]),
        );
        shard.raise(
            "b",
            &ReadFloor::from_pairs(&[("v1/Pod", 90)], &[("v1/Pod", 90)]),
        );
        assert_eq!(
            shard.of("a"),
            ReadFloor::from_pairs(&[("v1/Pod", 90)], &[("v1/Pod", 40)])
        );
        assert_eq!(
            shard.of("b"),
            ReadFloor::from_pairs(&[("v1/Pod", 90)], &[("v1/Pod", 90)])
        );
        assert_eq!(shard.of("c"), ReadFloor::from_pairs(&[("v1/Pod", 90)], &[]));
        shard.raise(
            "a",
            &ReadFloor::from_pairs(&[], &[("v1/Pod", 45), ("v1/Secret", 3)]),
        );
        assert_eq!(
            shard.of("a").namespace,
            [("v1/Pod", 45), ("v1/Secret", 3)].into_iter().collect()
        );
    }

    #[test]
    fn a_full_floor_gives_up_its_quietest_namespace() {
        let mut shard = ShardFloor::default();
        let names: Vec<String> = (0..MAX_FLOOR_NAMESPACES)
            .map(|i| format!("ns-{i}"))
            .collect();
        for (i, namespace) in names.iter().enumerate() {
            shard.raise(
                namespace,
                &ReadFloor::from_pairs(&[], &[("v1/Pod", 100 + i as u64)]),
            );
        }
        shard.raise("ns-0", &ReadFloor::from_pairs(&[], &[("v1/Pod", 5000)]));
        shard.raise("new", &ReadFloor::from_pairs(&[], &[("v1/Pod", 6000)]));
        assert_eq!(shard.namespaces.len(), MAX_FLOOR_NAMESPACES);
        assert!(
            shard.of("ns-1").namespace.is_empty(),
            "ns-1 was the quietest"
        );
        assert!(!shard.of("ns-0").namespace.is_empty());
        assert!(!shard.of("new").namespace.is_empty());
    }
}
