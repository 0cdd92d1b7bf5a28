//! Who serves each shard: `switchyard-directory`, shared with the reconciler.

pub use switchyard_directory::*;
