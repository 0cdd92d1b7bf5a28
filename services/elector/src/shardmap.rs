//! The leader's side of the shard map in etcd. The layout, and the members' own fenced
//! release and renewal, are in `switchyard_shards::store`; the leader's writes are fenced on
//! its election key.
//!
//! The leader plans from a read of the map and its watch of the members, and each of its
//! writes holds only while that view does (see `switchyard_elector_core`): every transition
//! is a nested transaction that applies only if the shard key is unchanged since the read
//! and, for an activation over a dead owner, that owner's member key is still absent. A
//! transition refused that way writes nothing; the leader reads and plans again.

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use switchyard_elector_core::{ShardState, Transition};
use switchyard_shards::{
    member::MEMBERS_PREFIX,
    store::{SHARDS_PREFIX, decode, encode, shard_key},
};

pub use switchyard_shards::store::{Result, ShardMapError};

/// The whole map (`shard_count` entries) and the revision it was read at.
pub async fn read(client: &mut Client, shard_count: u32) -> Result<(Vec<ShardState>, i64)> {
    let response = client
        .get(SHARDS_PREFIX, Some(GetOptions::new().with_prefix()))
        .await?;
    let revision = response.header().map_or(0, |h| h.revision());
    let mut map = vec![ShardState::Unassigned; shard_count as usize];
    for kv in response.kvs() {
        let Some(shard) = kv
            .key_str()
            .ok()
            .and_then(|k| k.strip_prefix(SHARDS_PREFIX))
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(slot) = map.get_mut(shard as usize) {
            *slot = decode(shard, kv.value(), kv.mod_revision())?;
        }
    }
    Ok((map, revision))
}

/// etcd refuses transactions of more than 128 operations by default (`--max-txn-ops`); a
/// nested transaction counts against what its parent leaves, so 100 leave room for the
/// conditions of each.
const MAX_TXN_OPS: usize = 100;

/// What [`apply`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Transitions written.
    pub written: usize,
    /// Shards whose transition was refused because the view it was planned from no longer
    /// holds: the shard changed since the read, or its dead owner registered again.
    pub stale: Vec<u32>,
}

/// Writes `transitions`, planned from `current` as read at `revision`, in transactions of at
/// most [`MAX_TXN_OPS`] that each apply only while `leader_key` exists (this elector still
/// leads). Within them, each transition applies on its own and only while the view it was
/// planned from holds (see the module docs); the others are reported as stale. Every
/// transition stands alone, so a map written in several transactions is valid at every step.
pub async fn apply(
    client: &mut Client,
    leader_key: &[u8],
    current: &[ShardState],
    revision: i64,
    transitions: &[Transition],
) -> Result<Applied> {
    let mut applied = Applied::default();
    for chunk in transitions.chunks(MAX_TXN_OPS) {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .map(|t| guarded(current, revision, t))
            .collect();
        let txn = Txn::new()
            .when([Compare::version(leader_key.to_vec(), CompareOp::Greater, 0)])
            .and_then(ops);
        let response = client.txn(txn).await?;
        if !response.succeeded() {
            return Err(ShardMapError::Fenced);
        }
        for (transition, op) in chunk.iter().zip(response.op_responses()) {
            match op {
                TxnOpResponse::Txn(r) if r.succeeded() => applied.written += 1,
                _ => applied.stale.push(transition.shard()),
            }
        }
    }
    Ok(applied)
}

/// One transition as a nested transaction that writes only while its view holds.
fn guarded(current: &[ShardState], revision: i64, transition: &Transition) -> TxnOp {
    let shard = transition.shard();
    let key = shard_key(shard);
    // Unchanged since the read (an absent key compares as revision 0).
    let mut conditions = vec![Compare::mod_revision(
        key.clone(),
        CompareOp::Less,
        revision.saturating_add(1),
    )];
    let state = match transition {
        Transition::Activate { owner, gone, .. } => {
            if let Some(gone) = gone {
                // Still not registered (an absent key compares as version 0).
                conditions.push(Compare::version(
                    format!("{MEMBERS_PREFIX}{gone}"),
                    CompareOp::Equal,
                    0,
                ));
            }
            ShardState::Active {
                owner: owner.clone(),
                epoch: 0,
            }
        }
        Transition::Release { owner, next, .. } => {
            let epoch = match current.get(shard as usize) {
                Some(ShardState::Active { epoch, .. } | ShardState::Releasing { epoch, .. }) => {
                    *epoch
                }
                _ => 0,
            };
            ShardState::Releasing {
                owner: owner.clone(),
                epoch,
                next: next.clone(),
            }
        }
    };
    TxnOp::txn(Txn::new().when(conditions).and_then([TxnOp::put(
        key,
        encode(&state).expect("a transition writes an assigned state"),
        None,
    )]))
}

/// Publishes the shard map (`shard_count` entries) now and after every change, until `drain`,
/// from a task of its own (see [`follow`]).
pub fn watch(
    etcd: switchyard_shards::Etcd,
    shard_count: u32,
    drain: switchyard_runtime::Drain,
) -> (
    tokio::sync::watch::Receiver<Option<Vec<ShardState>>>,
    tokio::task::JoinHandle<()>,
) {
    let (rx, follow) = follow(etcd, shard_count, drain);
    (rx, tokio::spawn(follow))
}

/// The shard map (`shard_count` entries), published now and after every change by the
/// returned future until `drain`; the caller runs it (a service, as a supervised task). A
/// malformed entry is logged and read as unassigned, so one bad key cannot stop the map.
pub fn follow(
    etcd: switchyard_shards::Etcd,
    shard_count: u32,
    drain: switchyard_runtime::Drain,
) -> (
    tokio::sync::watch::Receiver<Option<Vec<ShardState>>>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (mut entries, mirror) = crate::mirror::mirror(etcd, SHARDS_PREFIX, drain);
    let (tx, rx) = tokio::sync::watch::channel(None);
    let task = async move {
        let _mirror = tokio_util::task::AbortOnDropHandle::new(mirror);
        loop {
            let map = entries.borrow_and_update().as_ref().map(|entries| {
                let mut map = vec![ShardState::Unassigned; shard_count as usize];
                for (key, (value, mod_revision)) in entries {
                    let Some(shard) = key.parse::<u32>().ok().filter(|s| *s < shard_count) else {
                        continue;
                    };
                    match decode(shard, value, *mod_revision) {
                        Ok(state) => map[shard as usize] = state,
                        Err(error) => tracing::warn!(%error, "ignoring a shard map entry"),
                    }
                }
                map
            });
            tx.send_if_modified(|old| {
                let changed = *old != map;
                *old = map;
                changed
            });
            if entries.changed().await.is_err() {
                return;
            }
        }
    };
    (rx, task)
}
