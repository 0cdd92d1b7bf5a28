//! The work vocabulary every Switchyard service shares: a [`WorkKey`] from the watcher's
//! mapping through the queue to a reconciler, the virtual shard it hashes to
//! ([`shard_of`]), the [`Priority`] of an add, and the limits both ends of the queue's
//! protocol respect. Pure: no I/O and no dependencies, so the watcher's core, the queue's
//! core and the queue client share it without depending on one another.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

pub mod shard;

/// Each name once: a constant per controller, [`builtin::ALL`] and the comma-separated
/// [`builtin::LIST`] a flag's default takes.
macro_rules! built_in {
    ($first:ident = $first_name:literal $(, $rest:ident = $name:literal)* $(,)?) => {
        pub const $first: &str = $first_name;
        $(pub const $rest: &str = $name;)*
        /// Every one, in the order the reconciler registers them.
        pub const ALL: &[&str] = &[$first $(, $rest)*];
        /// [`ALL`] joined with commas.
        pub const LIST: &str = concat!($first_name $(, ",", $name)*);
    };
}

/// The controllers built into the reconciler, by the name their keys carry: one list for
/// what a queue serves from the start by default (its `--controllers`) and what the
/// reconciler runs by default.
pub mod builtin {
    built_in!(
        REPLICASET = "apps/v1/ReplicaSet",
        DEPLOYMENT = "apps/v1/Deployment",
        GARBAGE_COLLECTOR = "garbage-collector",
        NAMESPACE = "v1/Namespace",
        SERVICE_ACCOUNT = "serviceaccount",
        JOB = "batch/v1/Job",
        TTL_AFTER_FINISHED = "ttl-after-finished",
        CRONJOB = "batch/v1/CronJob",
        POD_GC = "pod-garbage-collector",
        REPLICATION_CONTROLLER = "v1/ReplicationController",
        STATEFULSET = "apps/v1/StatefulSet",
        DISRUPTION = "policy/v1/PodDisruptionBudget",
        STALE_POD_DISRUPTION = "stale-pod-disruption",
        DAEMONSET = "apps/v1/DaemonSet",
        ENDPOINTSLICE = "endpointslice",
        ENDPOINTS = "endpoints",
        ENDPOINTSLICE_MIRRORING = "endpointslice-mirroring",
    );
}

pub use shard::shard_of;

/// A work key as callers name it: the reconciler kind, and the object's namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkKey {
    pub controller: Arc<str>,
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl WorkKey {
    pub fn new(
        controller: impl Into<Arc<str>>,
        namespace: impl Into<Arc<str>>,
        name: impl Into<Arc<str>>,
    ) -> Self {
        Self {
            controller: controller.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key's virtual shard among `shard_count` (see [`shard`]).
    pub fn shard(&self, shard_count: u32) -> u32 {
        shard_of(&self.controller, &self.namespace, &self.name, shard_count)
    }
}

/// How soon an add wants its reconcile: live events go before initial lists and resyncs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Initial list, resync.
    Low = 0,
    /// Live events.
    Normal = 1,
}

/// Kubernetes limits: a namespace is a DNS label, a name at most a DNS subdomain.
pub const MAX_NAMESPACE_LEN: usize = 63;
pub const MAX_NAME_LEN: usize = 253;
/// Longest controller name: it travels in every work key (the watcher's limit too).
pub const MAX_CONTROLLER_LEN: usize = 253;

/// Credits one message of a work stream may grant: the queue refuses more, and the queue
/// client never sends more (a worker's concurrency is at most this). Ten thousand leases in
/// flight per stream is far beyond what one worker process reconciles at once.
pub const MAX_CREDIT: u32 = 10_000;

/// Causes kept per key: a key added a thousand times while leased is reconciled once, and
/// its trace links to the latest adds only. 16 links are what a trace view still shows.
pub const MAX_CAUSES: usize = 16;

/// The longest a key waits for a delay: an add's, a `RequeueAfter`'s or a backoff's. Longer
/// ones are the caller's to refuse (the gRPC edge names the field) or are cut to this; a
/// controller that meant a later time is reconciled once a week and asks again. A week is far
/// beyond any requeue a controller of kube-controller-manager makes, and keeps `now + delay`
/// far from the end of the monotonic clock.
pub const MAX_DELAY: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// Lease extensions longer than this are refused: a reconcile that needs more should extend
/// again, so a dead worker's key is not held for hours.
pub const MAX_LEASE_EXTENSION: Duration = Duration::from_secs(3600);

/// The earlier of two observation times, either of which may be missing.
pub fn earliest(a: Option<SystemTime>, b: Option<SystemTime>) -> Option<SystemTime> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::builtin;

    #[test]
    fn the_built_in_list_is_every_name_joined() {
        assert_eq!(builtin::LIST, builtin::ALL.join(","));
        assert_eq!(builtin::ALL[0], builtin::REPLICASET);
        let once: std::collections::BTreeSet<&str> = builtin::ALL.iter().copied().collect();
        assert_eq!(once.len(), builtin::ALL.len(), "each name once");
        assert!(builtin::ALL.contains(&builtin::CRONJOB));
    }
}
