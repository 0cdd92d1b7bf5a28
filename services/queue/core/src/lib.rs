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
//! The work key lives here too ([`key`]): one [`WorkKey`] type from the watcher's mapping to
//! the queue, and the [`ValidKey`] the queue's gRPC edge makes once and the core stores. The
//! queue core is where a key gets its meaning (validated, hashed to its shard, kept), and it
//! is a pure crate without I/O, so the watcher core and the queue client share the type by
//! depending on it without pulling in a service. The protocol limit both sides of a work
//! stream respect, [`MAX_CREDIT`], lives here for the same reason.

mod backoff;
pub mod key;
mod queue;
pub mod shard;

pub use backoff::{Backoff, BackoffConfig, RateLimit};
pub use key::{
    ControllerId, DEFAULT_MAX_CONTROLLERS, KeyError, KeySpace, MAX_CONTROLLER_LEN, MAX_NAME_LEN,
    MAX_NAMESPACE_LEN, ValidKey, WorkKey,
};
pub use queue::{
    AddOutcome, Cause, DEFAULT_OUTCOME_HISTORY, Error, History, InvalidLeaseId, KeyPhase, KeyView,
    KindVersions, LastOutcome, Lease, LeaseId, LeaseIds, MAX_CAUSES, MAX_DELAY, MAX_ERROR_BYTES,
    MAX_FLOOR_KIND_LEN, MAX_FLOOR_KINDS, MAX_FLOOR_NAMESPACES, MAX_LEASE_EXTENSION, Origin,
    Outcome, OutcomeKind, Priority, Queue, QueueConfig, ReadFloor, Refused, Result,
    SequentialLeaseIds, ShardStats, Totals, TraceId, WorkerId, earliest,
};

/// Credits one message of a work stream may grant: the queue refuses more, and the queue
/// client never sends more (a worker's concurrency is at most this). Ten thousand leases in
/// flight per stream is far beyond what one worker process reconciles at once.
pub const MAX_CREDIT: u32 = 10_000;
