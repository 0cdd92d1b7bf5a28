//! The work queue of one queue replica: client-go's work-queue promises, kept per controller
//! key space across the virtual shards this replica owns, with leases and fencing epochs so
//! that workers can live in other processes.
//!
//! ```text
//!  add ──► [ready: normal | low] ──lease──► leased ──done/forget──► gone (or ready again if dirty)
//!   │            ▲                            │  └──failed / lease expired──► delayed (backoff)
//!   └─after d─► delayed ──due──┘              └──requeue after d──────────► delayed
//! ```
//!
//! - A key is queued at most once: adds while ready coalesce (a live add upgrades a low-priority
//!   one); an add while delayed keeps the **earliest** ready time; an add while leased marks the
//!   key dirty and it is queued again when the lease ends.
//! - A leased key is never leased again until its outcome arrives or its lease expires.
//! - Every lease carries its shard's epoch and a lease id, and is bound to the worker (one
//!   session) it was handed to; an outcome or extension with a stale epoch, an unknown lease
//!   id, or from another worker than the holder is refused and counted, never applied. Lease
//!   ids come from a [`LeaseIds`] source the caller gives: random in a served queue.
//!
//! - Each add may carry a cause (opaque here: the service keeps a trace context in it). Causes
//!   of coalesced adds are kept, the latest [`MAX_CAUSES`] of them, and handed out with the
//!   next lease; a lease that fails, expires or is returned puts them back for the retry.
//!   An add may also say when its sender observed the event behind it (the sender's clock);
//!   the lease carries the earliest of the adds it covers.
//! - Each shard keeps a read floor: per kind, the highest cache version its reconciles
//!   reported reading at. Every lease carries it; workers read at least there, so a key's
//!   next reconcile never sees an older state than its last, whichever cache answers.
//!
//! The core does no I/O and reads no clock: every call takes `now`, so tests drive time.
//!
//! The work vocabulary the services share ([`WorkKey`], its shard, [`Priority`], the
//! protocol's limits) is `switchyard-work`'s, re-exported here; the queue core is where a key
//! gets its meaning: validated once by the gRPC edge into the [`ValidKey`] the core stores
//! ([`key`]).

mod backoff;
pub mod key;
mod queue;

pub use switchyard_work::{
    MAX_CAUSES, MAX_CONTROLLER_LEN, MAX_CREDIT, MAX_DELAY, MAX_LEASE_EXTENSION, MAX_NAME_LEN,
    MAX_NAMESPACE_LEN, Priority, WorkKey, earliest, shard,
};

pub use backoff::{Backoff, BackoffConfig, RateLimit};
pub use key::{ControllerId, DEFAULT_MAX_CONTROLLERS, KeyError, KeySpace, ValidKey};
pub use queue::{
    AddOutcome, Cause, DEFAULT_OUTCOME_HISTORY, Error, History, InvalidLeaseId, KeyPhase, KeyView,
    KindVersions, LastOutcome, Lease, LeaseId, LeaseIds, MAX_ERROR_BYTES, MAX_FLOOR_KIND_LEN,
    MAX_FLOOR_KINDS, MAX_FLOOR_NAMESPACES, Origin, Outcome, OutcomeKind, Queue, QueueConfig,
    ReadFloor, Refused, Result, SequentialLeaseIds, ShardStats, Totals, TraceId, WorkerId,
};
