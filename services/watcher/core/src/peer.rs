//! Another controller manager acting on what Switchyard's controllers own: the handover
//! check.
//!
//! A controller owns the status of the objects it reconciles (a Deployment's, a Job's, a
//! Namespace's). When kube-controller-manager still runs the same controller, it writes that
//! status too, and the apiserver records who wrote it last in `managedFields` (the manager
//! `kube-controller-manager`, subresource `status`). The watcher sees every change, so it
//! reads that record on the way in: an object whose newest status write is a peer's, made
//! recently and after the watcher started, is being reconciled by that peer.
//!
//! kube-controller-manager's EndpointSlice, mirroring and Endpoints controllers write no
//! status: they are known by the objects they write ([`WRITES`]), labelled as theirs, whose
//! newest write (to the object itself) is then read the same way.

use std::{collections::BTreeMap, time::Duration};

use switchyard_work::builtin;

/// The controller managers whose field manager names are known: kube-controller-manager
/// writes as `kube-controller-manager` whichever controller writes (with or without
/// `--use-service-account-credentials`, the name comes from its user agent).
pub const PEERS: &[&str] = &["kube-controller-manager"];

/// Objects a controller writes instead of a status, labelled as its own: a peer's recent
/// write to one of them means the peer runs that controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Writes {
    pub group: &'static str,
    pub kind: &'static str,
    /// The label kube-controller-manager's controller (and Switchyard's) marks them with.
    pub label: (&'static str, &'static str),
    /// Switchyard's controller doing the same work.
    pub controller: &'static str,
}

/// The controllers known by the objects they write.
pub const WRITES: &[Writes] = &[
    Writes {
        group: "discovery.k8s.io",
        kind: "EndpointSlice",
        label: (
            "endpointslice.kubernetes.io/managed-by",
            "endpointslice-controller.k8s.io",
        ),
        controller: builtin::ENDPOINTSLICE,
    },
    Writes {
        group: "discovery.k8s.io",
        kind: "EndpointSlice",
        label: (
            "endpointslice.kubernetes.io/managed-by",
            "endpointslicemirroring-controller.k8s.io",
        ),
        controller: builtin::ENDPOINTSLICE_MIRRORING,
    },
    Writes {
        group: "",
        kind: "Endpoints",
        label: ("endpoints.kubernetes.io/managed-by", "endpoint-controller"),
        controller: builtin::ENDPOINTS,
    },
];

/// Kinds whose status is no controller's own: the kubelet writes a Pod's and a Node's, and
/// controllers only set conditions on them (kube-controller-manager's taint eviction and pod
/// garbage collector among them, which Switchyard does not stand in for). A peer's write to
/// one tells nothing of the controllers that reconcile the kind here (the stale
/// DisruptionTarget reset reconciles Pods).
pub const SHARED_STATUS: &[(&str, &str)] = &[("", "Pod"), ("", "Node")];

/// Whether the status of objects of `group` and `kind` is the controller's that reconciles
/// them: not for [`SHARED_STATUS`].
pub fn status_is_owned(group: &str, kind: &str) -> bool {
    !SHARED_STATUS.contains(&(group, kind))
}

/// The controller known by writing an object of `group` and `kind` with `labels`, if any.
pub fn written_by(
    group: &str,
    kind: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> Option<&'static str> {
    let labels = labels?;
    WRITES
        .iter()
        .find(|w| {
            w.group == group
                && w.kind == kind
                && labels.get(w.label.0).is_some_and(|v| v == w.label.1)
        })
        .map(|w| w.controller)
}

/// One `managedFields` entry, as far as the check reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldsEntry<'a> {
    pub manager: &'a str,
    /// `status` for a write through the status subresource; empty for the main resource.
    pub subresource: &'a str,
    /// When the apiserver recorded the write, in Unix seconds (the API keeps whole seconds).
    pub time: Option<i64>,
}

/// What the watcher does about a peer's writes (`--on-peer-writes`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnPeer {
    /// Count them, log them, and go on reconciling: both controllers act.
    #[default]
    Warn,
    /// Also stop sending the keys of the controllers whose objects the peer writes, for as
    /// long as its writes go on (and a window after the last one).
    StandDown,
}

/// Which writes to an object tell of a controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Its status: a controller's for the objects it reconciles.
    Status,
    /// The object itself: for an object of [`WRITES`].
    Object,
}

/// The peer that wrote the object's status last, if that write is recent: at or after
/// `since` (the watcher's start, so that a status kube-controller-manager wrote before
/// Switchyard took over does not count) and within `window` of `now` (so that a peer that
/// stopped stops counting). A write in the same second as another manager's counts as the
/// peer's: the two act at once.
///
/// With [`Part::Object`], the same for writes to the object itself (an object of
/// [`WRITES`]).
pub fn last_writer<'a>(
    entries: impl IntoIterator<Item = FieldsEntry<'a>>,
    part: Part,
    since: i64,
    now: i64,
    window: Duration,
) -> Option<&'static str> {
    let subresource = match part {
        Part::Status => "status",
        Part::Object => "",
    };
    let window = i64::try_from(window.as_secs()).unwrap_or(i64::MAX);
    let mut newest_other: Option<i64> = None;
    let mut newest_peer: Option<(i64, &'static str)> = None;
    for entry in entries {
        if entry.subresource != subresource {
            continue;
        }
        let Some(time) = entry.time else {
            continue;
        };
        match PEERS.iter().find(|p| **p == entry.manager) {
            Some(peer) if newest_peer.is_none_or(|(t, _)| time > t) => {
                newest_peer = Some((time, peer));
            }
            Some(_) => {}
            None => newest_other = newest_other.max(Some(time)),
        }
    }
    let (time, peer) = newest_peer?;
    let recent = time >= since && time >= now.saturating_sub(window);
    (recent && newest_other.is_none_or(|other| time >= other)).then_some(peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_controller_owns_the_status_of_pods_and_nodes() {
        assert!(!status_is_owned("", "Pod"));
        assert!(!status_is_owned("", "Node"));
        assert!(status_is_owned("apps", "Deployment"));
        assert!(status_is_owned("", "Namespace"));
    }

    const WINDOW: Duration = Duration::from_secs(300);
    const START: i64 = 1_000;
    const NOW: i64 = 2_000;

    fn entry<'a>(manager: &'a str, subresource: &'a str, time: i64) -> FieldsEntry<'a> {
        FieldsEntry {
            manager,
            subresource,
            time: Some(time),
        }
    }

    fn writer(entries: &[FieldsEntry<'_>]) -> Option<&'static str> {
        last_writer(entries.iter().copied(), Part::Status, START, NOW, WINDOW)
    }

    #[test]
    fn a_recent_status_write_by_the_peer_after_ours_is_the_peer_s() {
        let entries = [
            entry("switchyard-reconciler", "status", NOW - 20),
            entry("kube-controller-manager", "status", NOW - 10),
            entry("kubectl-create", "", START - 500),
        ];
        assert_eq!(writer(&entries), Some("kube-controller-manager"));
        // In the same second: both act.
        let same = [
            entry("switchyard-reconciler", "status", NOW - 10),
            entry("kube-controller-manager", "status", NOW - 10),
        ];
        assert_eq!(writer(&same), Some("kube-controller-manager"));
    }

    #[test]
    fn the_peer_does_not_count_once_another_manager_wrote_the_status_after_it() {
        let entries = [
            entry("kube-controller-manager", "status", NOW - 20),
            entry("switchyard-reconciler", "status", NOW - 10),
        ];
        assert_eq!(writer(&entries), None);
    }

    #[test]
    fn old_writes_main_resource_writes_and_other_managers_do_not_count() {
        // Before the watcher started: the history of a cluster that kube-controller-manager
        // ran before the handover.
        assert_eq!(
            writer(&[entry("kube-controller-manager", "status", START - 1)]),
            None
        );
        // Longer ago than the window: a peer that has since stopped.
        assert_eq!(
            writer(&[entry("kube-controller-manager", "status", NOW - 301)]),
            None
        );
        assert_eq!(
            writer(&[entry("kube-controller-manager", "status", NOW - 300)]),
            Some("kube-controller-manager")
        );
        // The main resource (the garbage collector's finalizers, an adoption): not a status.
        assert_eq!(writer(&[entry("kube-controller-manager", "", NOW)]), None);
        // A user's or another tool's status write.
        assert_eq!(writer(&[entry("kubectl-edit", "status", NOW)]), None);
        // No time recorded.
        let untimed = FieldsEntry {
            manager: "kube-controller-manager",
            subresource: "status",
            time: None,
        };
        assert_eq!(writer(&[untimed]), None);
        assert_eq!(writer(&[]), None);
    }

    #[test]
    fn objects_a_controller_writes_are_known_by_their_label_and_read_as_written() {
        let labels = |key: &str, value: &str| BTreeMap::from([(key.to_owned(), value.to_owned())]);
        let managed = "endpointslice.kubernetes.io/managed-by";
        let slice = labels(managed, "endpointslice-controller.k8s.io");
        assert_eq!(
            written_by("discovery.k8s.io", "EndpointSlice", Some(&slice)),
            Some(builtin::ENDPOINTSLICE)
        );
        let mirrored = labels(managed, "endpointslicemirroring-controller.k8s.io");
        assert_eq!(
            written_by("discovery.k8s.io", "EndpointSlice", Some(&mirrored)),
            Some(builtin::ENDPOINTSLICE_MIRRORING)
        );
        let endpoints = labels("endpoints.kubernetes.io/managed-by", "endpoint-controller");
        assert_eq!(
            written_by("", "Endpoints", Some(&endpoints)),
            Some(builtin::ENDPOINTS)
        );
        // A slice another controller manages (a Gateway's, a mesh's), or no label.
        let theirs = labels(managed, "gateway.example/controller");
        assert_eq!(
            written_by("discovery.k8s.io", "EndpointSlice", Some(&theirs)),
            None
        );
        assert_eq!(written_by("discovery.k8s.io", "EndpointSlice", None), None);
        assert_eq!(written_by("", "Endpoints", Some(&slice)), None);

        // The object itself, not its status.
        let written = |entries: &[FieldsEntry<'_>]| {
            last_writer(entries.iter().copied(), Part::Object, START, NOW, WINDOW)
        };
        assert_eq!(
            written(&[entry("kube-controller-manager", "", NOW - 5)]),
            Some("kube-controller-manager")
        );
        assert_eq!(
            written(&[
                entry("kube-controller-manager", "", NOW - 5),
                entry("switchyard-reconciler", "", NOW - 1),
            ]),
            None
        );
        assert_eq!(
            written(&[entry("kube-controller-manager", "", START - 5)]),
            None
        );
        assert_eq!(
            written(&[entry("kube-controller-manager", "status", NOW)]),
            None
        );
    }
}
