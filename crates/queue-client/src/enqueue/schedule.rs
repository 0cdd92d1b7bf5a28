//! Which keys go in which call: batches grouped into calls per owning replica, and the shards
//! waiting to be sent again after a failure.

use std::{collections::HashMap, sync::Arc};

use switchyard_runtime::Backoff;
use tokio::time::Instant;

use super::{BATCH, RETRY_BACKOFF, pending::Batch};

/// Batches of several shards: those of one call to one replica (at most [`BATCH`] keys
/// together), or those waiting to be sent.
pub(super) type Batches = Vec<(u32, Batch)>;

/// Groups `batches` into calls to the replica `owner` names for each shard, filling a call up
/// to [`BATCH`] keys before starting the next one for that replica. The batches of shards
/// without an owner come back apart.
pub(super) fn calls(
    batches: Batches,
    owner: impl Fn(u32) -> Option<Arc<str>>,
) -> (Vec<(Arc<str>, Batches)>, Batches) {
    let mut calls: Vec<(Arc<str>, Batches, usize)> = Vec::new();
    // The call being filled for each replica, by index into `calls`.
    let mut filling: HashMap<Arc<str>, usize> = HashMap::new();
    let mut ownerless = Vec::new();
    for (shard, batch) in batches {
        let Some(address) = owner(shard) else {
            ownerless.push((shard, batch));
            continue;
        };
        let keys = batch.len();
        match filling.get(&address) {
            Some(&i) if calls[i].2 + keys <= BATCH => {
                calls[i].1.push((shard, batch));
                calls[i].2 += keys;
            }
            _ => {
                filling.insert(address.clone(), calls.len());
                calls.push((address, vec![(shard, batch)], keys));
            }
        }
    }
    let calls = calls
        .into_iter()
        .map(|(address, call, _)| (address, call))
        .collect();
    (calls, ownerless)
}

/// A shard waiting to be sent again after a failure.
pub(super) struct Retry {
    pub(super) backoff: Backoff,
    pub(super) until: Instant,
}

impl Retry {
    pub(super) fn new() -> Self {
        Self {
            backoff: Backoff::new(RETRY_BACKOFF.0, RETRY_BACKOFF.1),
            until: Instant::now(),
        }
    }
}
