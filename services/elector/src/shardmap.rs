//! The shard map in etcd: `/switchyard/shards/<shard>` holds the shard's state as JSON.
//!
//! The epoch of an active shard is the etcd revision of the write that activated it (the
//! key's `mod_revision`), so epochs only grow. A releasing shard keeps its owner's epoch in the
//! value. The leader's writes are fenced on its election key; a member's release is fenced on
//! the shard key's revision, so a stale release never applies.
//!
//! The leader plans from a read of the map and its watch of the members, and each of its
//! writes holds only while that view does (see `switchyard_elector_core`): every transition
//! is a nested transaction that applies only if the shard key is unchanged since the read
//! and, for an activation over a dead owner, that owner's member key is still absent. A
//! transition refused that way writes nothing; the leader reads and plans again.

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};
use switchyard_elector_core::{MemberId, ShardState, Transition, released, renewable};

use crate::membership::MEMBERS_PREFIX;

pub const SHARDS_PREFIX: &str = "/switchyard/shards/";

#[derive(Debug, thiserror::Error)]
pub enum ShardMapError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("shard {shard}: malformed state in etcd: {reason}")]
    Malformed { shard: u32, reason: String },
    #[error("{0}")]
    Release(#[from] switchyard_elector_core::ReleaseError),
    #[error("lost the election or the shard changed meanwhile: nothing written")]
    Fenced,
}

pub type Result<T, E = ShardMapError> = std::result::Result<T, E>;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
enum Stored {
    Active {
        owner: String,
    },
    Releasing {
        owner: String,
        epoch: u64,
        next: String,
    },
}

/// The etcd key of a shard (zero-padded, so keys sort by shard).
pub fn shard_key(shard: u32) -> String {
    format!("{SHARDS_PREFIX}{shard:05}")
}

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

fn decode(shard: u32, value: &[u8], mod_revision: i64) -> Result<ShardState> {
    let stored: Stored = serde_json::from_slice(value).map_err(|e| ShardMapError::Malformed {
        shard,
        reason: e.to_string(),
    })?;
    Ok(match stored {
        Stored::Active { owner } => ShardState::Active {
            owner,
            epoch: u64::try_from(mod_revision).unwrap_or(0),
        },
        Stored::Releasing { owner, epoch, next } => ShardState::Releasing { owner, epoch, next },
    })
}

fn encode(stored: &Stored) -> String {
    serde_json::to_string(stored).expect("shard state serializes")
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
    let stored = match transition {
        Transition::Activate { owner, gone, .. } => {
            if let Some(gone) = gone {
                // Still not registered (an absent key compares as version 0).
                conditions.push(Compare::version(
                    format!("{MEMBERS_PREFIX}{gone}"),
                    CompareOp::Equal,
                    0,
                ));
            }
            Stored::Active {
                owner: owner.clone(),
            }
        }
        Transition::Release { owner, next, .. } => {
            let epoch = match current.get(shard as usize) {
                Some(ShardState::Active { epoch, .. } | ShardState::Releasing { epoch, .. }) => {
                    *epoch
                }
                _ => 0,
            };
            Stored::Releasing {
                owner: owner.clone(),
                epoch,
                next: next.clone(),
            }
        }
    };
    TxnOp::txn(
        Txn::new()
            .when(conditions)
            .and_then([TxnOp::put(key, encode(&stored), None)]),
    )
}

/// A member that drained `shard` hands it to the next owner. Refused, with nothing written,
/// when the member does not hold it as releasing at `epoch`, or the shard changed while this
/// ran.
pub async fn release(
    client: &mut Client,
    shard: u32,
    member: &str,
    epoch: u64,
) -> Result<MemberId> {
    let key = shard_key(shard);
    let response = client.get(key.clone(), None).await?;
    let Some(kv) = response.kvs().first() else {
        return Err(switchyard_elector_core::ReleaseError::NotHeld {
            shard,
            member: member.to_owned(),
        }
        .into());
    };
    let state = decode(shard, kv.value(), kv.mod_revision())?;
    let next = released(&state, shard, member, epoch)?;
    let txn = Txn::new()
        .when([Compare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            kv.mod_revision(),
        )])
        .and_then([TxnOp::put(
            key,
            encode(&Stored::Active {
                owner: next.clone(),
            }),
            None,
        )]);
    if client.txn(txn).await?.succeeded() {
        Ok(next)
    } else {
        Err(ShardMapError::Fenced)
    }
}

/// A member renews the epoch of a shard it holds as active at `epoch`: the shard stays its
/// own and gets a new epoch (the revision of this write), which is returned. Refused, with
/// nothing written, when the member does not hold the shard at `epoch` or the shard changed
/// while this ran.
pub async fn renew(client: &mut Client, shard: u32, member: &str, epoch: u64) -> Result<u64> {
    let key = shard_key(shard);
    let response = client.get(key.clone(), None).await?;
    let Some(kv) = response.kvs().first() else {
        return Err(switchyard_elector_core::ReleaseError::NotHeld {
            shard,
            member: member.to_owned(),
        }
        .into());
    };
    renewable(
        &decode(shard, kv.value(), kv.mod_revision())?,
        shard,
        member,
        epoch,
    )?;
    let txn = Txn::new()
        .when([Compare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            kv.mod_revision(),
        )])
        .and_then([TxnOp::put(
            key,
            encode(&Stored::Active {
                owner: member.to_owned(),
            }),
            None,
        )]);
    let response = client.txn(txn).await?;
    if !response.succeeded() {
        return Err(ShardMapError::Fenced);
    }
    Ok(response
        .header()
        .and_then(|h| u64::try_from(h.revision()).ok())
        .unwrap_or(0))
}

/// Publishes the shard map (`shard_count` entries) now and after every change, until `drain`.
/// A malformed entry is logged and read as unassigned, so one bad key cannot stop the map.
pub fn watch(
    endpoints: Vec<String>,
    shard_count: u32,
    drain: switchyard_runtime::Drain,
) -> (
    tokio::sync::watch::Receiver<Option<Vec<ShardState>>>,
    tokio::task::JoinHandle<()>,
) {
    let (mut entries, mirror) = crate::mirror::mirror(endpoints, SHARDS_PREFIX, drain);
    let (tx, rx) = tokio::sync::watch::channel(None);
    let task = tokio::spawn(async move {
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
    });
    (rx, task)
}
