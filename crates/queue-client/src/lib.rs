//! The client of the queue protocol (`switchyard.queue.v1`): callers speak in work keys,
//! leases and outcomes; the proto types, the limits and the status codes stay in here.
//!
//! ```text
//!  watcher ── push(WorkKey, Priority, cause) ─► Enqueuer ─ per shard, batched ─► Enqueue at
//!             (waits while the pending set is full)   ▲ retry / drop            the owner
//!                                                     └── ShardView (switchyard-shards)
//!
//!  reconciler ◄─ Event::Lease(Lease) ─── WorkSession ◄── Work stream ── queue replica
//!             ── Replies: complete(Outcome), extend, credit ──► (credits capped at MAX_CREDIT)
//! ```
//!
//! - [`Enqueuer`]: keys wait in a pending set (repeats coalesce) until the queue replica that
//!   owns their shard acknowledges them; a slow, moving or absent queue makes `push` wait
//!   instead of dropping anything.
//! - [`WorkSession`]: one Work stream; [`WorkSession::next`] yields [`Event`]s, and
//!   [`Replies`] (cloneable, for the tasks that reconcile) sends outcomes, extensions and
//!   credits.
//! - [`Error`]: what went wrong, typed; `tonic` status codes are matched in one place.
//!
//! The work key is [`WorkKey`] from `switchyard-work`, the one type from the watcher's
//! mapping to the queue's core.

mod convert;
mod enqueue;
mod error;
mod work;

pub use enqueue::{Add, Cause, EnqueueMetrics, Enqueuer, NoMetrics};
pub use error::{Error, Result};
pub use switchyard_work::{MAX_CREDIT, Priority, WorkKey};
pub use work::{Event, Lease, Outcome, ReadFloor, Replies, Versions, WorkSession};

/// The gRPC endpoint of a queue replica at `address` (`host:port`, as the shard map and the
/// flags name it).
fn endpoint(
    dialer: &switchyard_runtime::Dialer,
    address: &str,
) -> Result<tonic::transport::Endpoint> {
    dialer
        .endpoint(address, switchyard_runtime::Role::Queue)
        .map(|endpoint| endpoint.tcp_nodelay(true))
        .map_err(|error| Error::InvalidAddress {
            address: address.to_owned(),
            reason: error.to_string(),
        })
}
