//! The garbage collector's decisions, as kube-controller-manager's `attemptToDeleteItem`,
//! `processDeletingDependentsItem` and `attemptToOrphanWorker` make them.
//!
//! ```text
//!  the object, deleting?
//!   ├─ with `orphan`              ─► drop every dependent's reference to it, then the finalizer
//!   ├─ with `foregroundDeletion`  ─► blocking dependents left? wait : remove the finalizer
//!   ├─ otherwise                  ─► nothing (the deletion finishes by itself)
//!  not deleting: classify each owner reference
//!   ├─ some owner solid           ─► drop the dangling and waiting references, if any
//!   ├─ some owner waiting, and it ─► delete it in the foreground (it blocks that owner); first
//!   │  has dependents                make its own references non-blocking if a dependent of it
//!   │                                is deleting in the foreground too (a circle: each would
//!   │                                wait for the other)
//!   └─ otherwise                  ─► delete it (orphan / foreground / background, by its own
//!                                    finalizers)
//! ```
//!
//! An owner is *solid* when it exists with the referenced UID, *dangling* when it does not
//! (not found, or found with another UID), and *waiting* when it exists and is deleting its
//! dependents in the foreground while this reference blocks it (`blockOwnerDeletion`).

/// What an owner reference resolves to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerState {
    Solid,
    Dangling,
    /// Deleting its dependents in the foreground, and this reference blocks it.
    Waiting,
}

/// How a deletion propagates to the deleted object's own dependents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    Orphan,
    Foreground,
    Background,
}

/// What the collector does with an object that is not being deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing: every owner is solid, or it has none.
    Keep,
    /// Remove the references to these owner UIDs: a solid owner keeps it.
    DropReferences(Vec<String>),
    /// Delete it, with this propagation; with `unblock`, first set `blockOwnerDeletion` to
    /// false on each of its references.
    Delete {
        propagation: Propagation,
        unblock: bool,
    },
}

/// What a decision needs to know of the object besides its references.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Subject {
    /// It holds the `orphan` finalizer.
    pub orphan: bool,
    /// It holds the `foregroundDeletion` finalizer.
    pub foreground: bool,
    /// Some object references it as an owner.
    pub has_dependents: bool,
    /// One of its dependents is deleting its own dependents in the foreground.
    pub dependent_deleting_dependents: bool,
}

/// Decides about an object that is not being deleted, from its references (owner UID and
/// state), as kube-controller-manager's `attemptToDeleteItem` does.
pub fn decide(references: &[(String, OwnerState)], subject: Subject) -> Decision {
    if references.is_empty() {
        return Decision::Keep;
    }
    let with = |state: OwnerState| references.iter().filter(move |(_, s)| *s == state);
    if with(OwnerState::Solid).next().is_some() {
        let drop: Vec<String> = references
            .iter()
            .filter(|(_, s)| *s != OwnerState::Solid)
            .map(|(uid, _)| uid.clone())
            .collect();
        return if drop.is_empty() {
            Decision::Keep
        } else {
            Decision::DropReferences(drop)
        };
    }
    if with(OwnerState::Waiting).next().is_some() && subject.has_dependents {
        // An owner waits for it, and it will wait for its own dependents. If one of those
        // is waiting too, the waits may close a circle back to this owner: its references
        // stop blocking, so that the owner can go (kube-controller-manager's cycle check,
        // with the same false positives).
        return Decision::Delete {
            propagation: Propagation::Foreground,
            unblock: subject.dependent_deleting_dependents,
        };
    }
    Decision::Delete {
        propagation: if subject.orphan {
            Propagation::Orphan
        } else if subject.foreground {
            Propagation::Foreground
        } else {
            Propagation::Background
        },
        unblock: false,
    }
}

/// The state of one reference to an owner that exists with the referenced UID.
pub fn existing_owner(
    owner_deleting: bool,
    owner_foreground: bool,
    block_owner_deletion: bool,
) -> OwnerState {
    if owner_deleting && owner_foreground && block_owner_deletion {
        OwnerState::Waiting
    } else {
        OwnerState::Solid
    }
}

/// The warning kube-controller-manager records on a dependent whose reference names an owner
/// of another namespace (`OwnerRefInvalidNamespace`): the reference resolves only in the
/// dependent's own namespace, where no such owner exists.
pub fn invalid_namespace_note(
    api_version: &str,
    kind: &str,
    namespace: &str,
    name: &str,
    uid: &str,
) -> String {
    format!(
        "ownerRef [{api_version}/{kind}, namespace: {namespace}, name: {name}, uid: {uid}] does not exist in namespace {namespace:?}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(states: &[OwnerState]) -> Vec<(String, OwnerState)> {
        states
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("u{i}"), *s))
            .collect()
    }

    const PLAIN: Subject = Subject {
        orphan: false,
        foreground: false,
        has_dependents: false,
        dependent_deleting_dependents: false,
    };

    fn delete(propagation: Propagation) -> Decision {
        Decision::Delete {
            propagation,
            unblock: false,
        }
    }

    #[test]
    fn an_object_without_owners_or_with_solid_owners_is_kept() {
        assert_eq!(decide(&[], PLAIN), Decision::Keep);
        assert_eq!(
            decide(&refs(&[OwnerState::Solid, OwnerState::Solid]), PLAIN),
            Decision::Keep
        );
    }

    #[test]
    fn a_solid_owner_keeps_the_object_and_the_other_references_go() {
        assert_eq!(
            decide(
                &refs(&[OwnerState::Dangling, OwnerState::Solid, OwnerState::Waiting]),
                PLAIN
            ),
            Decision::DropReferences(vec!["u0".into(), "u2".into()])
        );
    }

    #[test]
    fn a_waiting_owner_without_a_solid_one_deletes_an_owner_in_the_foreground() {
        let owner = Subject {
            has_dependents: true,
            orphan: true,
            ..PLAIN
        };
        assert_eq!(
            decide(&refs(&[OwnerState::Dangling, OwnerState::Waiting]), owner),
            delete(Propagation::Foreground)
        );
        // Without dependents there is nothing to wait for: its own finalizers decide.
        assert_eq!(
            decide(&refs(&[OwnerState::Waiting]), PLAIN),
            delete(Propagation::Background)
        );
    }

    #[test]
    fn a_waiting_owner_and_a_dependent_deleting_its_dependents_unblock_first() {
        // kube-controller-manager's "should not be blocked by dependency circle": pod3 owned
        // by pod2 (deleting in the foreground), itself owning pod1 (deleting in the
        // foreground, waiting for pod2).
        let in_a_circle = Subject {
            has_dependents: true,
            dependent_deleting_dependents: true,
            ..PLAIN
        };
        assert_eq!(
            decide(&refs(&[OwnerState::Waiting]), in_a_circle),
            Decision::Delete {
                propagation: Propagation::Foreground,
                unblock: true
            }
        );
        // A solid owner keeps it whatever its dependents do.
        assert_eq!(
            decide(&refs(&[OwnerState::Solid]), in_a_circle),
            Decision::Keep
        );
    }

    #[test]
    fn every_owner_dangling_deletes_by_the_objects_own_finalizers() {
        let dangling = refs(&[OwnerState::Dangling]);
        assert_eq!(decide(&dangling, PLAIN), delete(Propagation::Background));
        let orphan = Subject {
            orphan: true,
            ..PLAIN
        };
        assert_eq!(decide(&dangling, orphan), delete(Propagation::Orphan));
        let foreground = Subject {
            foreground: true,
            has_dependents: true,
            ..PLAIN
        };
        assert_eq!(
            decide(&dangling, foreground),
            delete(Propagation::Foreground)
        );
    }

    #[test]
    fn only_a_blocking_reference_to_a_foreground_deletion_waits() {
        assert_eq!(existing_owner(true, true, true), OwnerState::Waiting);
        assert_eq!(existing_owner(true, true, false), OwnerState::Solid);
        assert_eq!(existing_owner(true, false, true), OwnerState::Solid);
        assert_eq!(existing_owner(false, false, true), OwnerState::Solid);
    }

    #[test]
    fn the_invalid_namespace_note_reads_as_kube_controller_managers() {
        assert_eq!(
            invalid_namespace_note("v1", "ConfigMap", "b", "owner", "u1"),
            "ownerRef [v1/ConfigMap, namespace: b, name: owner, uid: u1] does not exist in namespace \"b\""
        );
    }
}
