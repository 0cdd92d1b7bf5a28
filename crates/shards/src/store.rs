//! The shard map in etcd: `/switchyard/shards/<shard>` holds the shard's state as JSON.
//!
//! The epoch of an active shard is the etcd revision of the write that activated it (the
//! key's `mod_revision`), so epochs only grow. A releasing shard keeps its owner's epoch in the
//! value. The elector's leader writes the map (fenced on its election key, see the elector's
//! `shardmap`); a member writes only its own two changes, each fenced on the shard key's
//! revision so a stale one never applies:
//!
//! - [`release`]: a drained shard goes to the next owner the leader named;
//! - [`renew`]: a shard held from an earlier registration gets a new epoch before it is served.
//!
//! Members write these to etcd themselves, not through the elector: the member already holds
//! an etcd session for its lease, and a release must not wait for an elector in failover.

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use serde::{Deserialize, Serialize};
use switchyard_ownership::{MemberId, ReleaseError, ShardState, released, renewable};

pub const SHARDS_PREFIX: &str = "/switchyard/shards/";

#[derive(Debug, thiserror::Error)]
pub enum ShardMapError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("shard {shard}: malformed state in etcd: {reason}")]
    Malformed { shard: u32, reason: String },
    #[error("{0}")]
    Release(#[from] ReleaseError),
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

/// A shard's state from its stored value and the key's `mod_revision` (an active shard's epoch).
pub fn decode(shard: u32, value: &[u8], mod_revision: i64) -> Result<ShardState> {
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

/// The stored value of `state` (an active shard's epoch is not stored: it is the revision of
/// the write); `None` for an unassigned shard, which has no key.
pub fn encode(state: &ShardState) -> Option<String> {
    let stored = match state {
        ShardState::Unassigned => return None,
        ShardState::Active { owner, .. } => Stored::Active {
            owner: owner.clone(),
        },
        ShardState::Releasing { owner, epoch, next } => Stored::Releasing {
            owner: owner.clone(),
            epoch: *epoch,
            next: next.clone(),
        },
    };
    Some(store_json(&stored))
}

fn store_json(stored: &Stored) -> String {
    serde_json::to_string(stored).expect("shard state serializes")
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
    let (next, _) = activate_checked(client, shard, member, |state| {
        released(state, shard, member, epoch)
    })
    .await?;
    Ok(next)
}

/// A member renews the epoch of a shard it holds as active at `epoch`: the shard stays its
/// own and gets a new epoch (the revision of this write), which is returned. Refused, with
/// nothing written, when the member does not hold the shard at `epoch` or the shard changed
/// while this ran.
pub async fn renew(client: &mut Client, shard: u32, member: &str, epoch: u64) -> Result<u64> {
    let (_, revision) = activate_checked(client, shard, member, |state| {
        renewable(state, shard, member, epoch).map(|()| member.to_owned())
    })
    .await?;
    Ok(u64::try_from(revision).unwrap_or(0))
}

/// Reads `shard`, asks `check` who owns it next, and writes it active for that member, fenced
/// on the revision read: a shard that changed in between is left alone ([`ShardMapError::Fenced`]).
/// Returns the new owner and the revision of the write (the shard's new epoch).
async fn activate_checked(
    client: &mut Client,
    shard: u32,
    member: &str,
    check: impl FnOnce(&ShardState) -> std::result::Result<MemberId, ReleaseError>,
) -> Result<(MemberId, i64)> {
    let key = shard_key(shard);
    let response = client.get(key.clone(), None).await?;
    let Some(kv) = response.kvs().first() else {
        return Err(ReleaseError::NotHeld {
            shard,
            member: member.to_owned(),
        }
        .into());
    };
    let owner = check(&decode(shard, kv.value(), kv.mod_revision())?)?;
    let txn = Txn::new()
        .when([Compare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            kv.mod_revision(),
        )])
        .and_then([TxnOp::put(
            key,
            store_json(&Stored::Active {
                owner: owner.clone(),
            }),
            None,
        )]);
    let response = client.txn(txn).await?;
    if !response.succeeded() {
        return Err(ShardMapError::Fenced);
    }
    Ok((owner, response.header().map_or(0, |h| h.revision())))
}
