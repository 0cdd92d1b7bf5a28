//! Which queue replica serves which virtual shard, and how a shard moves between replicas:
//! the leader's side of the protocol, free of etcd and gRPC. What both sides share (a shard's
//! [`ShardState`], the checks of a release and a renewal) and a member's side (what a queue
//! replica does with each shard it is given, [`member`]) are `switchyard-ownership`'s.
//!
//! - [`assign`]: rendezvous (highest-random-weight) hashing with bounded loads. Every shard
//!   ranks the members by `score(shard, member)`, and takes the best-ranked member that is
//!   still below the load cap `ceil(S / members) + slack`. Shards are placed in a fixed order,
//!   so the result depends only on the member set. A membership change moves mostly the shards
//!   whose ranking changed (those of a member that left, or those a new member now ranks
//!   first), plus a few that the changed cap pushes along.
//! - [`plan`]: from the current shard map, the desired owners and the live members, the
//!   transitions to make. A shard whose owner is dead moves at once. A shard whose owner is
//!   alive is first marked releasing; it moves only when that owner has drained and released
//!   it (or has died), so a shard never has two serving owners.
//!
//! A plan comes from a view that is a moment old when it is written: the map as read, and the
//! members as last watched. Each transition therefore holds only while that view does: the
//! adapter writes it only if the shard has not changed since the map was read and, for an
//! activation over a dead owner, only while that owner (`gone` in [`Transition::Activate`])
//! is still not registered. Otherwise a release, an epoch renewal or a registration that landed
//! meanwhile would be overwritten, and a live owner would lose a shard without releasing it.

use std::collections::HashMap;

pub use switchyard_ownership::{MemberId, ReleaseError, ShardState, member, released, renewable};

/// One step towards the desired assignment. The adapter writes it to etcd; the new epoch of
/// an activation is the revision of that write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Give `shard` to `owner` now: it was unassigned, or its owner `gone` is dead.
    Activate {
        shard: u32,
        owner: MemberId,
        /// The previous owner, found dead (not among the live members). The activation
        /// holds only while it is still not registered: a member that registers again under
        /// its id keeps its shards until it releases them.
        gone: Option<MemberId>,
    },
    /// Tell the live `owner` to drain `shard` and release it to `next`.
    Release {
        shard: u32,
        owner: MemberId,
        next: MemberId,
    },
}

impl Transition {
    /// The shard this transition moves.
    pub fn shard(&self) -> u32 {
        match self {
            Self::Activate { shard, .. } | Self::Release { shard, .. } => *shard,
        }
    }
}

/// The desired owner of every shard (`S` entries) for `members`, or `None` with no members.
/// `slack` is how many shards above `ceil(S / members)` a member may hold.
pub fn assign(shard_count: u32, members: &[MemberId], slack: u32) -> Option<Vec<MemberId>> {
    if members.is_empty() {
        return None;
    }
    let mut members: Vec<&MemberId> = members.iter().collect();
    members.sort();
    members.dedup();
    let count = u32::try_from(members.len()).unwrap_or(u32::MAX);
    let cap = shard_count.div_ceil(count) + slack;
    let mut load: HashMap<&str, u32> = HashMap::new();
    let mut owners = Vec::with_capacity(shard_count as usize);
    for shard in 0..shard_count {
        let mut ranked: Vec<(u64, &MemberId)> =
            members.iter().map(|m| (score(shard, m), *m)).collect();
        // Highest score first; ties (practically impossible) broken by member id.
        ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let owner = ranked
            .iter()
            .map(|(_, m)| *m)
            .find(|m| load.get(m.as_str()).copied().unwrap_or(0) < cap)
            .unwrap_or(ranked[0].1);
        *load.entry(owner.as_str()).or_insert(0) += 1;
        owners.push(owner.clone());
    }
    Some(owners)
}

/// The transitions that move `current` towards `desired`, given which members are alive.
pub fn plan(current: &[ShardState], desired: &[MemberId], alive: &[MemberId]) -> Vec<Transition> {
    let is_alive = |m: &str| alive.iter().any(|a| a == m);
    let mut transitions = Vec::new();
    for (shard, (state, want)) in current.iter().zip(desired).enumerate() {
        let shard = u32::try_from(shard).unwrap_or(u32::MAX);
        match state {
            ShardState::Unassigned => transitions.push(Transition::Activate {
                shard,
                owner: want.clone(),
                gone: None,
            }),
            ShardState::Active { owner, .. } if owner == want => {}
            ShardState::Active { owner, .. } | ShardState::Releasing { owner, .. }
                if !is_alive(owner) =>
            {
                // Its member lease expired: nobody serves the shard, hand it over at once.
                transitions.push(Transition::Activate {
                    shard,
                    owner: want.clone(),
                    gone: Some(owner.clone()),
                });
            }
            ShardState::Active { owner, .. } => transitions.push(Transition::Release {
                shard,
                owner: owner.clone(),
                next: want.clone(),
            }),
            ShardState::Releasing { owner, next, .. } if next != want => {
                // The destination changed while draining: keep draining, retarget.
                transitions.push(Transition::Release {
                    shard,
                    owner: owner.clone(),
                    next: want.clone(),
                });
            }
            ShardState::Releasing { .. } => {}
        }
    }
    transitions
}

/// `splitmix64(fnv1a64(member) ^ shard)`: a stable, well-mixed weight per (shard, member).
fn score(shard: u32, member: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in member.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut z = hash ^ u64::from(shard).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<MemberId> {
        (0..n).map(|i| format!("queue-{i}")).collect()
    }

    #[test]
    fn every_shard_gets_an_owner_within_the_cap() {
        let owners = assign(256, &members(3), 1).expect("members");
        assert_eq!(owners.len(), 256);
        let mut load: HashMap<&str, u32> = HashMap::new();
        for o in &owners {
            *load.entry(o).or_default() += 1;
        }
        assert_eq!(load.len(), 3);
        assert!(load.values().all(|l| *l <= 86 + 1), "{load:?}");
    }

    #[test]
    fn no_members_means_no_assignment() {
        assert_eq!(assign(8, &[], 1), None);
    }

    #[test]
    fn a_live_owner_drains_before_its_shard_moves_and_a_dead_one_does_not() {
        let current = vec![
            ShardState::Active {
                owner: "a".into(),
                epoch: 5,
            },
            ShardState::Active {
                owner: "dead".into(),
                epoch: 6,
            },
            ShardState::Unassigned,
            ShardState::Active {
                owner: "b".into(),
                epoch: 7,
            },
        ];
        let desired: Vec<MemberId> = ["b", "b", "a", "b"].map(String::from).to_vec();
        let alive: Vec<MemberId> = ["a", "b"].map(String::from).to_vec();
        assert_eq!(
            plan(&current, &desired, &alive),
            [
                Transition::Release {
                    shard: 0,
                    owner: "a".into(),
                    next: "b".into()
                },
                Transition::Activate {
                    shard: 1,
                    owner: "b".into(),
                    gone: Some("dead".into()),
                },
                Transition::Activate {
                    shard: 2,
                    owner: "a".into(),
                    gone: None,
                },
            ]
        );
    }

    #[test]
    fn a_draining_owner_whose_next_owner_left_drains_on_towards_another() {
        // a drains shard 0 for b; b leaves (a rolling restart), so the shard should go to c.
        let current = vec![
            ShardState::Releasing {
                owner: "a".into(),
                epoch: 5,
                next: "b".into(),
            },
            ShardState::Releasing {
                owner: "b".into(),
                epoch: 6,
                next: "a".into(),
            },
        ];
        let desired: Vec<MemberId> = ["c", "c"].map(String::from).to_vec();
        let alive: Vec<MemberId> = ["a", "c"].map(String::from).to_vec();
        assert_eq!(
            plan(&current, &desired, &alive),
            [
                // Never straight to c over a, which still serves the shard.
                Transition::Release {
                    shard: 0,
                    owner: "a".into(),
                    next: "c".into(),
                },
                // b is gone: nobody drains shard 1, which moves at once, while b stays gone.
                Transition::Activate {
                    shard: 1,
                    owner: "c".into(),
                    gone: Some("b".into()),
                },
            ]
        );
    }

    #[test]
    fn only_the_draining_owner_may_release_and_only_at_its_epoch() {
        let current = ShardState::Releasing {
            owner: "a".into(),
            epoch: 9,
            next: "b".into(),
        };
        assert_eq!(released(&current, 0, "a", 9), Ok("b".to_owned()));
        assert_eq!(
            released(&current, 0, "a", 8).map_err(|e| e.to_string()),
            Err("stale epoch 8 for shard 0 (current epoch 9)".to_owned())
        );
        assert_eq!(
            released(&current, 0, "b", 9).map_err(|e| e.to_string()),
            Err("shard 0 is not held by member \"b\"".to_owned())
        );
    }

    #[test]
    fn only_the_active_owner_may_renew_and_only_at_its_epoch() {
        let active = ShardState::Active {
            owner: "a".into(),
            epoch: 9,
        };
        assert_eq!(renewable(&active, 3, "a", 9), Ok(()));
        assert_eq!(
            renewable(&active, 3, "a", 8).map_err(|e| e.to_string()),
            Err("stale epoch 8 for shard 3 (current epoch 9)".to_owned())
        );
        assert_eq!(
            renewable(&active, 3, "b", 9).map_err(|e| e.to_string()),
            Err("shard 3 is not held by member \"b\"".to_owned())
        );
        let releasing = ShardState::Releasing {
            owner: "a".into(),
            epoch: 9,
            next: "b".into(),
        };
        assert!(
            renewable(&releasing, 3, "a", 9).is_err(),
            "draining: no renewal"
        );
    }
}
