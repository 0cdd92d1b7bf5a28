//! The Deployment controller's decisions, as kube-controller-manager's
//! `pkg/controller/deployment` makes them, in files split as its are.
//!
//! ```text
//!  ReplicaSets (owned ∪ selected) ─► claim ─► owned ─► new (template equal, hash ignored) + old
//!                                      ├─► adopt orphans the selector matches
//!                                      └─► release owned ones it no longer matches
//!  paused or replicas changed (desired-replicas annotation) ─► scale: the one active RS, or
//!                                                              proportionally over all of them
//!  RollingUpdate ─► create new RS │ scale new up to replicas + maxSurge │ scale old down to
//!                   keep replicas - maxUnavailable available (unhealthy ones first)
//!  Recreate      ─► old RSs to 0 ─► wait until no old Pod runs ─► create/scale new RS
//!  complete ─► delete old RSs with 0 replicas past revisionHistoryLimit
//!  status: sums over the RSs ─► Available (min availability), Progressing (progress deadline)
//! ```
//!
//! Which file holds which decision (kube-controller-manager's file in brackets):
//!
//! ```text
//!  spec.rs      the Deployment read and checked; maxSurge/maxUnavailable resolved
//!  sync.rs      claim, new/old split │ the new ReplicaSet │ scale, proportional scaling
//!  [sync.go]    │ cleanup of old ReplicaSets │ status, paused/resumed
//!  rolling.rs   new up to replicas + maxSurge, old down keeping the minimum available
//!  [rolling.go]
//!  recreate.rs  wait until no old Pod runs
//!  [recreate.go]
//!  progress.rs  Progressing (complete, progressing, timed out), ReplicaFailure, re-check delay
//!  [progress.go]
//!  util.rs      annotation keys and reasons, revisions, pod-template-hash, template
//!  [util/deployment_util.go]   equality, conditions, small accessors
//! ```
//!
//! A rollback is a template change back to an old template: `sync.rs` finds the old
//! ReplicaSet as the new one and `util.rs` raises its revision. kube-controller-manager's
//! `rollback.go` serves the deprecated `rollbackTo` field, which Switchyard does not
//! support (docs/reconciler.md), so there is no `rollback.rs`.
//!
//! Every function here takes the objects it decides on (and `now`); the service crate reads
//! the cache, calls these, and performs the writes.

mod progress;
mod recreate;
mod rolling;
mod spec;
mod sync;
mod util;

pub use self::{progress::*, recreate::*, rolling::*, spec::*, sync::*, util::*};

#[cfg(test)]
mod tests;
