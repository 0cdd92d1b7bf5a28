//! Which member owns a virtual shard, and how one hands it over: what the elector (the
//! leader's side) and the queue replicas (a member's side, [`member`]) share. Pure: no etcd,
//! no gRPC, no clock (every call takes `now`).

pub mod member;

/// A queue replica's member id.
pub type MemberId = String;

/// Where a shard stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardState {
    Unassigned,
    /// `owner` serves the shard at `epoch`.
    Active {
        owner: MemberId,
        epoch: u64,
    },
    /// `owner` was told to stop serving the shard (it drains); `next` takes it after the
    /// release.
    Releasing {
        owner: MemberId,
        epoch: u64,
        next: MemberId,
    },
}

impl ShardState {
    /// The member that may serve the shard now, if any.
    pub fn owner(&self) -> Option<&str> {
        match self {
            Self::Unassigned => None,
            Self::Active { owner, .. } | Self::Releasing { owner, .. } => Some(owner),
        }
    }
}

/// Errors of a release acknowledgement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseError {
    NotHeld {
        shard: u32,
        member: MemberId,
    },
    StaleEpoch {
        shard: u32,
        epoch: u64,
        current: u64,
    },
}

impl std::fmt::Display for ReleaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotHeld { shard, member } => {
                write!(f, "shard {shard} is not held by member {member:?}")
            }
            Self::StaleEpoch {
                shard,
                epoch,
                current,
            } => write!(
                f,
                "stale epoch {epoch} for shard {shard} (current epoch {current})"
            ),
        }
    }
}

impl std::error::Error for ReleaseError {}

/// Checks a release acknowledgement for `shard` in `state` and returns the member that takes
/// the shard next.
pub fn released(
    state: &ShardState,
    shard: u32,
    member: &str,
    epoch: u64,
) -> Result<MemberId, ReleaseError> {
    match state {
        ShardState::Releasing {
            owner,
            epoch: current_epoch,
            next,
        } if owner == member => {
            if *current_epoch != epoch {
                return Err(ReleaseError::StaleEpoch {
                    shard,
                    epoch,
                    current: *current_epoch,
                });
            }
            Ok(next.clone())
        }
        _ => Err(ReleaseError::NotHeld {
            shard,
            member: member.to_owned(),
        }),
    }
}

/// Checks that `member` may renew the epoch of `shard` in `state`: it holds the shard as
/// active at `epoch`. A member renews the epoch of a shard that was activated for an earlier
/// registration of its own (see the queue's ownership), so the new epoch marks a fresh start.
pub fn renewable(
    state: &ShardState,
    shard: u32,
    member: &str,
    epoch: u64,
) -> Result<(), ReleaseError> {
    match state {
        ShardState::Active {
            owner,
            epoch: current,
        } if owner == member => {
            if *current == epoch {
                Ok(())
            } else {
                Err(ReleaseError::StaleEpoch {
                    shard,
                    epoch,
                    current: *current,
                })
            }
        }
        _ => Err(ReleaseError::NotHeld {
            shard,
            member: member.to_owned(),
        }),
    }
}
