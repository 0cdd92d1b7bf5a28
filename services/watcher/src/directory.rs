//! Who serves each shard: `switchyard-shards`, shared with the reconciler and the queue.

pub use switchyard_shards::{Owner, STATIC_EPOCH, ShardView, follow_elector};
