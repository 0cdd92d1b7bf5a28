//! A queue member's side of the protocol: what to do with each shard, given its member lease,
//! the shard map and what it does with the shard now. Pure: the queue's ownership loop feeds
//! it and carries out the [`Effect`]s (actor commands, fenced etcd writes, metrics).
//!
//! ```text
//!  map says              here now                  effects                        then
//!  Active(me, e),        not serving at e          Acquire(e)                     Serving(e)
//!    e after my registration
//!  Active(me, e),        anything but a renewal    Stop(reassigned) if served,    Renewing(e)
//!    e before it         already taken at e          Renew(e) (etcd, fenced)
//!  Releasing(me, e)      Serving(e)                Drain(e)                       Draining(e)
//!  Releasing(me, e)      Draining(e), idle or      Stop(handover[_grace_expired]) HandingOver(e)
//!                          past the grace            HandOver(e) (etcd, fenced)     until it lands
//!  anything              served, lease lost        Suspend (keys kept)            Suspended(e)
//!  Active(me, e),        Suspended(e)              Renew(e) (etcd, fenced)        Renewing(e, kept)
//!    e before my registration
//!  Active(me, n),        Renewing(e, kept), the    Resume(from e, at n)           Serving(n)
//!    n what my renewal wrote                         (keys kept)
//!  anything else         served                    Stop(lease_lost | reassigned)  nothing, or
//!                        or keys kept              Discard                        HandingOver(e)
//!                                                    HandOver(e) if Releasing(me)
//! ```
//!
//! A shard the map gives this member at an epoch older than its registration was activated
//! for an earlier registration (before a lost lease, or before the process restarted under the
//! same id): the member renews the epoch and serves only at the new one, so every fresh start
//! of a shard has an epoch of its own and the watcher resyncs it. Without its lease a member
//! serves nothing: the leader may already have moved its shards. But it keeps the keys of the
//! shards it stopped serving then: if the map still gives a shard to it at the epoch it held,
//! no other member served the shard in between (any change of owner writes a new epoch), and
//! once its own renewal lands the member resumes the shard with its keys, delays and backoff
//! counts. Any other outcome discards them.

use std::time::{Duration, Instant};

use crate::ShardState;

/// What this member does with one shard now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Local {
    Serving(u64),
    /// Told to release: leases no more, waits for in-flight leases to end.
    Draining {
        epoch: u64,
        since: Instant,
    },
    /// Stopped serving; the release in etcd has not landed yet (retried).
    HandingOver(u64),
    /// Held at the epoch of an earlier registration, so not served: the epoch is renewed
    /// first (`renewed`: the epoch etcd wrote, once it took the renewal; until the map shows
    /// it). `kept`: the shard's keys are kept from `epoch` for [`Effect::Resume`].
    Renewing {
        epoch: u64,
        renewed: Option<u64>,
        kept: bool,
    },
    /// Served at this epoch until the member's lease may have expired: not served, its keys
    /// kept in case the map still gives it here at this epoch.
    Suspended(u64),
}

impl Local {
    /// Whether the actor serves the shard (leases, or takes outcomes while draining).
    pub fn served(self) -> bool {
        matches!(self, Self::Serving(_) | Self::Draining { .. })
    }

    /// Whether the next step must come without waiting for a change (poll or retry).
    pub fn pending(self) -> bool {
        matches!(
            self,
            Self::Draining { .. } | Self::HandingOver(_) | Self::Renewing { renewed: None, .. }
        )
    }

    /// Whether the queue holds the shard's keys for this member (served or kept).
    fn holds_keys(self) -> bool {
        self.served() || matches!(self, Self::Suspended(_) | Self::Renewing { kept: true, .. })
    }

    fn epoch(self) -> u64 {
        match self {
            Self::Serving(epoch)
            | Self::Draining { epoch, .. }
            | Self::HandingOver(epoch)
            | Self::Renewing { epoch, .. }
            | Self::Suspended(epoch) => epoch,
        }
    }
}

/// What the map asks of this member for one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    Serve(u64),
    /// Active here at an epoch older than this registration: renew it before serving.
    Renew(u64),
    Release(u64),
}

/// What the map asks of `member` for a shard in `state`, while it holds its lease from the
/// registration written at revision `registered` (`None`: no lease, nothing is asked).
pub fn want(member: &str, registered: Option<i64>, state: Option<&ShardState>) -> Option<Want> {
    let registered = registered?;
    match state? {
        ShardState::Active { owner, epoch } if owner == member => {
            // An epoch is the revision of the write that activated the shard.
            if i64::try_from(*epoch).is_ok_and(|e| e > registered) {
                Some(Want::Serve(*epoch))
            } else {
                Some(Want::Renew(*epoch))
            }
        }
        ShardState::Releasing { owner, epoch, .. } if owner == member => {
            Some(Want::Release(*epoch))
        }
        _ => None,
    }
}

/// Why a shard stopped being served here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stop {
    /// Planned move: drained with no lease in flight, then handed over.
    Handover,
    /// Planned move: the drain grace ran out with leases still in flight.
    HandoverGraceExpired,
    /// The member lease may have expired: every shard stops at once.
    LeaseLost,
    /// The map took the shard away without a release from here.
    Reassigned,
}

/// One thing to do, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Start serving the shard, empty, at this epoch.
    Acquire(u64),
    /// Serve the shard again at `epoch`, which this member's renewal of `from` wrote,
    /// with the keys kept since it was suspended at `from`.
    Resume { from: u64, epoch: u64 },
    /// The member lease may have expired: stop serving the shard, keeping its keys.
    Suspend,
    /// Forget the keys kept for a shard that is not served here (no release to count: it
    /// was counted when suspended).
    Discard,
    /// Stop leasing the shard; in-flight leases may still end.
    Drain(u64),
    /// Stop serving the shard; `drained_for` is how long a planned handover drained.
    Stop {
        reason: Stop,
        drained_for: Option<Duration>,
    },
    /// Renew the shard's epoch in etcd (fenced); settle with [`renewed`].
    Renew(u64),
    /// Release the drained shard to its next owner in etcd (fenced); settle with
    /// [`handed_over`].
    HandOver(u64),
}

/// What to do with one shard, and what it is here afterwards (an etcd effect settles it by
/// its result).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub effects: Vec<Effect>,
    pub local: Option<Local>,
}

/// A draining shard's progress, as the queue's actor sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainProgress {
    /// No lease of the shard is in flight.
    pub idle: bool,
    /// The drain grace ran out.
    pub grace_over: bool,
}

/// One shard's step. `lease_held` is whether the member holds its lease; `drain` is read for a
/// draining shard only.
pub fn step(
    local: Option<Local>,
    want: Option<Want>,
    lease_held: bool,
    drain: DrainProgress,
    now: Instant,
) -> Step {
    let keep = |local| Step {
        effects: Vec::new(),
        local,
    };
    match (local, want) {
        (None, None) => keep(None),
        // Without the lease nothing is served, but the keys are kept.
        (Some(here), _) if !lease_held && here.served() => Step {
            effects: vec![Effect::Suspend],
            local: Some(Local::Suspended(here.epoch())),
        },
        (Some(Local::Suspended(_)), None) if !lease_held => keep(local),
        (
            Some(Local::Renewing {
                epoch: from,
                renewed: Some(written),
                kept: true,
            }),
            Some(Want::Serve(epoch)),
        ) if epoch == written => Step {
            effects: vec![Effect::Resume { from, epoch }],
            local: Some(Local::Serving(epoch)),
        },
        (Some(Local::Serving(e)), Some(Want::Serve(epoch))) if e == epoch => keep(local),
        (_, Some(Want::Serve(epoch))) => Step {
            effects: vec![Effect::Acquire(epoch)],
            local: Some(Local::Serving(epoch)),
        },
        (
            Some(Local::Renewing {
                epoch,
                renewed: Some(_),
                ..
            }),
            Some(Want::Renew(e)),
        ) if e == epoch => keep(local),
        (now_here, Some(Want::Renew(epoch))) => {
            // Kept from this very epoch: no other member has served the shard since.
            let kept = now_here.is_some_and(|here| here.holds_keys() && here.epoch() == epoch)
                && !now_here.is_some_and(Local::served);
            let mut effects = Vec::new();
            if now_here.is_some_and(Local::served) {
                effects.push(stop(Stop::Reassigned));
            } else if now_here.is_some_and(Local::holds_keys) && !kept {
                effects.push(Effect::Discard);
            }
            effects.push(Effect::Renew(epoch));
            Step {
                effects,
                local: Some(Local::Renewing {
                    epoch,
                    renewed: None,
                    kept,
                }),
            }
        }
        (Some(Local::Serving(e)), Some(Want::Release(epoch))) if e == epoch => Step {
            effects: vec![Effect::Drain(epoch)],
            local: Some(Local::Draining { epoch, since: now }),
        },
        (Some(Local::Draining { epoch, since }), Some(Want::Release(e))) if e == epoch => {
            if !(drain.idle || drain.grace_over) {
                return keep(local);
            }
            let reason = if drain.idle {
                Stop::Handover
            } else {
                Stop::HandoverGraceExpired
            };
            Step {
                effects: vec![
                    Effect::Stop {
                        reason,
                        drained_for: Some(now.saturating_duration_since(since)),
                    },
                    Effect::HandOver(epoch),
                ],
                local: Some(Local::HandingOver(epoch)),
            }
        }
        (Some(Local::HandingOver(epoch)), Some(Want::Release(e))) if e == epoch => Step {
            effects: vec![Effect::HandOver(epoch)],
            local,
        },
        // Nothing served here at the epoch the map names: the map moved on (a release or
        // renewal landed, or the elector gave up on us), or this member restarted under the
        // same id. Stop whatever was served, then hand over what the map still has releasing
        // from us: nothing is left to drain.
        (was, want) => {
            let mut effects = Vec::new();
            if was.is_some_and(Local::served) {
                effects.push(stop(if lease_held {
                    Stop::Reassigned
                } else {
                    Stop::LeaseLost
                }));
            } else if was.is_some_and(Local::holds_keys) {
                effects.push(Effect::Discard);
            }
            match want {
                Some(Want::Release(epoch)) => {
                    effects.push(Effect::HandOver(epoch));
                    Step {
                        effects,
                        local: Some(Local::HandingOver(epoch)),
                    }
                }
                _ => Step {
                    effects,
                    local: None,
                },
            }
        }
    }
}

fn stop(reason: Stop) -> Effect {
    Effect::Stop {
        reason,
        drained_for: None,
    }
}

/// The shard after a [`Effect::Renew`] from `local` (the step's): `written` is the epoch
/// etcd wrote, `None` when it did not take the renewal (retried).
pub fn renewed(local: Option<Local>, written: Option<u64>) -> Option<Local> {
    match local {
        Some(Local::Renewing { epoch, kept, .. }) => Some(Local::Renewing {
            epoch,
            renewed: written,
            kept,
        }),
        other => other,
    }
}

/// The shard after a [`Effect::HandOver`]: gone from here once etcd took it, else retried.
pub fn handed_over(epoch: u64, ok: bool) -> Option<Local> {
    (!ok).then_some(Local::HandingOver(epoch))
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: DrainProgress = DrainProgress {
        idle: true,
        grace_over: false,
    };
    const BUSY: DrainProgress = DrainProgress {
        idle: false,
        grace_over: false,
    };

    fn active(owner: &str, epoch: u64) -> ShardState {
        ShardState::Active {
            owner: owner.into(),
            epoch,
        }
    }

    #[test]
    fn the_map_asks_only_a_member_that_holds_its_lease() {
        assert_eq!(want("a", None, Some(&active("a", 9))), None);
        assert_eq!(want("a", Some(5), Some(&active("b", 9))), None);
        assert_eq!(
            want("a", Some(5), Some(&active("a", 9))),
            Some(Want::Serve(9))
        );
        // Activated for an earlier registration: its keys are gone, renew first.
        assert_eq!(
            want("a", Some(9), Some(&active("a", 9))),
            Some(Want::Renew(9))
        );
        let releasing = ShardState::Releasing {
            owner: "a".into(),
            epoch: 9,
            next: "b".into(),
        };
        assert_eq!(want("a", Some(5), Some(&releasing)), Some(Want::Release(9)));
        assert_eq!(want("b", Some(5), Some(&releasing)), None);
    }

    #[test]
    fn a_planned_move_drains_then_hands_over_once_idle_or_after_the_grace() {
        let t0 = Instant::now();
        let draining = step(
            Some(Local::Serving(7)),
            Some(Want::Release(7)),
            true,
            IDLE,
            t0,
        );
        assert_eq!(draining.effects, [Effect::Drain(7)]);
        let local = draining.local;

        let later = t0 + Duration::from_millis(30);
        let busy = step(local, Some(Want::Release(7)), true, BUSY, later);
        assert!(busy.effects.is_empty());
        assert_eq!(busy.local, local);

        let done = step(local, Some(Want::Release(7)), true, IDLE, later);
        assert_eq!(
            done.effects,
            [
                Effect::Stop {
                    reason: Stop::Handover,
                    drained_for: Some(Duration::from_millis(30)),
                },
                Effect::HandOver(7),
            ]
        );
        let expired = step(
            local,
            Some(Want::Release(7)),
            true,
            DrainProgress {
                idle: false,
                grace_over: true,
            },
            later,
        );
        assert!(matches!(
            expired.effects[0],
            Effect::Stop {
                reason: Stop::HandoverGraceExpired,
                ..
            }
        ));
        // A refused handover is retried on the next step; one that landed leaves nothing.
        assert_eq!(handed_over(7, false), Some(Local::HandingOver(7)));
        let retry = step(
            handed_over(7, false),
            Some(Want::Release(7)),
            true,
            IDLE,
            later,
        );
        assert_eq!(retry.effects, [Effect::HandOver(7)]);
        assert_eq!(handed_over(7, true), None);
    }

    #[test]
    fn a_lost_lease_suspends_every_served_shard_and_a_stale_epoch_is_renewed_first() {
        let now = Instant::now();
        let lost = step(Some(Local::Serving(3)), None, false, IDLE, now);
        assert_eq!(lost.effects, [Effect::Suspend]);
        assert_eq!(lost.local, Some(Local::Suspended(3)));
        // Still without the lease: kept as it is.
        let still = step(lost.local, None, false, IDLE, now);
        assert!(still.effects.is_empty());
        assert_eq!(still.local, lost.local);

        // Served at an epoch older than the registration (the process restarted under the
        // same id): stopped, renewed, and served empty at the new epoch.
        let renew = step(
            Some(Local::Serving(3)),
            Some(Want::Renew(3)),
            true,
            IDLE,
            now,
        );
        assert_eq!(
            renew.effects,
            [
                Effect::Stop {
                    reason: Stop::Reassigned,
                    drained_for: None
                },
                Effect::Renew(3)
            ]
        );
        // Taken by etcd: wait for the map to show the new epoch, then serve at it.
        let taken = renewed(renew.local, Some(11));
        let waiting = step(taken, Some(Want::Renew(3)), true, IDLE, now);
        assert!(waiting.effects.is_empty());
        let serve = step(taken, Some(Want::Serve(11)), true, IDLE, now);
        assert_eq!(serve.effects, [Effect::Acquire(11)]);
        assert_eq!(serve.local, Some(Local::Serving(11)));
    }

    #[test]
    fn a_shard_the_map_still_gives_here_at_the_epoch_held_resumes_with_its_keys() {
        let now = Instant::now();
        let suspended = Some(Local::Suspended(3));
        let renew = step(suspended, Some(Want::Renew(3)), true, IDLE, now);
        assert_eq!(renew.effects, [Effect::Renew(3)]);
        // etcd did not take it: retried, the keys still kept.
        let refused = renewed(renew.local, None);
        let retry = step(refused, Some(Want::Renew(3)), true, IDLE, now);
        assert_eq!(retry.effects, [Effect::Renew(3)]);
        let taken = renewed(retry.local, Some(11));
        let resume = step(taken, Some(Want::Serve(11)), true, IDLE, now);
        assert_eq!(resume.effects, [Effect::Resume { from: 3, epoch: 11 }]);
        assert_eq!(resume.local, Some(Local::Serving(11)));
        // The map shows an epoch this member's renewal did not write: empty.
        let other = step(taken, Some(Want::Serve(12)), true, IDLE, now);
        assert_eq!(other.effects, [Effect::Acquire(12)]);
    }

    #[test]
    fn kept_keys_are_discarded_when_the_shard_went_elsewhere_or_moved_on() {
        let now = Instant::now();
        let suspended = Some(Local::Suspended(3));
        // Another member has it now.
        let gone = step(suspended, None, true, IDLE, now);
        assert_eq!(gone.effects, [Effect::Discard]);
        assert_eq!(gone.local, None);
        // Given here at another epoch than the one held: the keys are not the shard's.
        let renew = step(suspended, Some(Want::Renew(5)), true, IDLE, now);
        assert_eq!(renew.effects, [Effect::Discard, Effect::Renew(5)]);
        assert!(matches!(
            renew.local,
            Some(Local::Renewing { kept: false, .. })
        ));
        // Activated here afresh: acquired empty (the queue discards what it kept).
        let fresh = step(suspended, Some(Want::Serve(8)), true, IDLE, now);
        assert_eq!(fresh.effects, [Effect::Acquire(8)]);
        // Asked to release while suspended: nothing to drain.
        let release = step(suspended, Some(Want::Release(3)), true, IDLE, now);
        assert_eq!(release.effects, [Effect::Discard, Effect::HandOver(3)]);
    }
}
