//! Which shards this replica serves, from its member lease and the shard map in etcd.
//!
//! ```text
//!  member lease (held/lost) ─┐
//!                            ├─► per shard: Active(me, e) → acquire at e
//!  shard map (etcd watch) ───┘              Releasing(me, e) → drain; when idle (or after the
//!                                             grace) release locally, then in etcd (fenced)
//!                                           lease lost, or another owner → release at once
//! ```
//!
//! Losing the member lease stops every shard at once: the elector may already have given
//! them to other replicas.

use std::{collections::HashMap, time::Duration};

use switchyard_elector::{membership::LeaseState, shardmap};
use switchyard_elector_core::ShardState;
use switchyard_runtime::Drain;
use tokio::{sync::watch, time::Instant};
use tracing::{info, warn};

use crate::actor::{Command, Handle};

/// How often a draining shard's in-flight count is checked.
const DRAIN_POLL: Duration = Duration::from_millis(20);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Local {
    Serving(u64),
    Draining {
        epoch: u64,
        since: Instant,
    },
    /// Stopped serving; the release in etcd has not succeeded yet (retried).
    HandingOver(u64),
}

#[derive(Debug)]
pub struct Ownership {
    pub member: String,
    pub endpoints: Vec<String>,
    pub shard_count: u32,
    pub drain_grace: Duration,
}

impl Ownership {
    pub async fn run(
        self,
        handle: Handle,
        mut lease: watch::Receiver<LeaseState>,
        mut map: watch::Receiver<Option<Vec<ShardState>>>,
        drain: Drain,
    ) {
        let mut local: HashMap<u32, Local> = HashMap::new();
        let mut client: Option<etcd_client::Client> = None;
        loop {
            let held = matches!(*lease.borrow_and_update(), LeaseState::Held { .. });
            let snapshot = map.borrow_and_update().clone();
            self.step(&handle, held, snapshot.as_deref(), &mut local, &mut client)
                .await;
            let draining = local
                .values()
                .any(|l| matches!(l, Local::Draining { .. } | Local::HandingOver(_)));
            tokio::select! {
                changed = lease.changed() => if changed.is_err() { return },
                changed = map.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(DRAIN_POLL), if draining => {}
                // Shutdown: the actor drains every shard and then the member leaves.
                _ = drain.clone().signaled() => return,
            }
        }
    }

    async fn step(
        &self,
        handle: &Handle,
        held: bool,
        map: Option<&[ShardState]>,
        local: &mut HashMap<u32, Local>,
        client: &mut Option<etcd_client::Client>,
    ) {
        for shard in 0..self.shard_count {
            let want = match (held, map.and_then(|m| m.get(shard as usize))) {
                (true, Some(ShardState::Active { owner, epoch })) if *owner == self.member => {
                    Some((*epoch, false))
                }
                (true, Some(ShardState::Releasing { owner, epoch, .. }))
                    if *owner == self.member =>
                {
                    Some((*epoch, true))
                }
                _ => None,
            };
            let now = local.get(&shard).copied();
            match (now, want) {
                (None, None) => {}
                (Some(Local::Serving(e)), Some((epoch, false))) if e == epoch => {}
                (_, Some((epoch, false))) => {
                    let _ = handle.send(Command::Acquire { shard, epoch });
                    local.insert(shard, Local::Serving(epoch));
                    info!(shard, epoch, "serving shard");
                }
                (Some(Local::Serving(e)), Some((epoch, true))) if e == epoch => {
                    let _ = handle.send(Command::Drain { shard });
                    local.insert(
                        shard,
                        Local::Draining {
                            epoch,
                            since: Instant::now(),
                        },
                    );
                    info!(shard, epoch, "draining shard for handover");
                }
                (Some(Local::Draining { epoch, since }), Some((e, true))) if e == epoch => {
                    let idle = handle.in_flight(shard).await.unwrap_or(0) == 0;
                    if idle || since.elapsed() >= self.drain_grace {
                        let _ = handle.send(Command::Release { shard });
                        info!(shard, epoch, "stopped serving shard");
                        local.insert(shard, Local::HandingOver(epoch));
                        if self.hand_over(client, shard, epoch).await {
                            local.remove(&shard);
                        }
                    }
                }
                (Some(Local::HandingOver(epoch)), Some((e, true))) if e == epoch => {
                    if self.hand_over(client, shard, epoch).await {
                        local.remove(&shard);
                    }
                }
                // The map moved on (the release landed, or the elector gave up on us).
                (Some(Local::HandingOver(_)), _) => {
                    local.remove(&shard);
                }
                // Releasing from us but not served here (this member restarted under the same
                // id): nothing to drain, hand it over.
                (None, Some((epoch, true))) => {
                    local.insert(shard, Local::HandingOver(epoch));
                    if self.hand_over(client, shard, epoch).await {
                        local.remove(&shard);
                    }
                }
                // Releasing at an epoch we never served, or nothing for us: stop at once.
                (Some(_), _) => {
                    if local.remove(&shard).is_some() {
                        let _ = handle.send(Command::Release { shard });
                        info!(shard, "stopped serving shard");
                    }
                }
            }
        }
    }

    /// Tells etcd the drained shard may go to its next owner. False when it must be retried.
    async fn hand_over(
        &self,
        client: &mut Option<etcd_client::Client>,
        shard: u32,
        epoch: u64,
    ) -> bool {
        if client.is_none() {
            *client = etcd_client::Client::connect(&self.endpoints, None)
                .await
                .ok();
        }
        let Some(c) = client.as_mut() else {
            warn!(shard, "etcd unreachable: retrying the shard handover");
            return false;
        };
        match shardmap::release(c, shard, &self.member, epoch).await {
            Ok(next) => {
                info!(shard, epoch, next = %next, "handed shard over");
                true
            }
            // The shard changed meanwhile (for example, the elector retargeted it): retry
            // against the new state.
            Err(shardmap::ShardMapError::Fenced) => false,
            Err(error) => {
                warn!(%error, shard, "handing the shard over failed");
                *client = None;
                false
            }
        }
    }
}
