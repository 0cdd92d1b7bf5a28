//! Random sequences of add / add-after / lease / outcome / time passing / worker release /
//! ownership change, run against the real queue and a small reference model. Invariants:
//! a key is held at most once, never leased twice at a time, outcomes on dead leases and
//! from workers that do not hold the lease are refused and change nothing, and nothing is
//! lost: every key still owed work is leased once time runs on.

#![allow(clippy::unwrap_used)]

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use proptest::prelude::*;
use switchyard_queue_core::{
    BackoffConfig, KeySpace, Lease, LeaseId, Outcome, Priority, Queue, QueueConfig, Refused,
    SequentialLeaseIds, ValidKey, WorkKey, WorkerId,
};

const CONTROLLERS: [&str; 2] = ["apps/v1/ReplicaSet", "apps/v1/Deployment"];
const NAMES: usize = 6;
const SHARDS: u32 = 3;
const LEASE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug)]
enum Op {
    Add {
        key: usize,
        low: bool,
        delay_ms: u64,
    },
    Lease {
        worker: u64,
    },
    Complete {
        pick: usize,
        outcome: u8,
        stale_epoch: bool,
        /// Sent by a worker that does not hold the lease.
        foreign: bool,
    },
    Advance {
        ms: u64,
    },
    ReleaseWorker {
        worker: u64,
    },
    Reacquire {
        shard: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..CONTROLLERS.len() * NAMES, any::<bool>(), prop_oneof![Just(0u64), 1..3000u64])
            .prop_map(|(key, low, delay_ms)| Op::Add { key, low, delay_ms }),
        4 => (1..3u64).prop_map(|worker| Op::Lease { worker }),
        3 => (any::<usize>(), 0..4u8, prop::bool::weighted(0.1), prop::bool::weighted(0.1))
            .prop_map(|(pick, outcome, stale_epoch, foreign)| Op::Complete { pick, outcome, stale_epoch, foreign }),
        2 => (1..4000u64).prop_map(|ms| Op::Advance { ms }),
        1 => (1..3u64).prop_map(|worker| Op::ReleaseWorker { worker }),
        1 => (0..SHARDS).prop_map(|shard| Op::Reacquire { shard }),
    ]
}

fn work_key(i: usize) -> WorkKey {
    WorkKey::new(CONTROLLERS[i / NAMES], "ns", format!("obj-{}", i % NAMES))
}

fn valid(space: &KeySpace, i: usize) -> ValidKey {
    space.validate(&work_key(i)).unwrap()
}

/// What the model knows of one key.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Held {
    Waiting,
    Leased { dirty: bool },
}

struct Model {
    held: HashMap<usize, Held>,
    /// Live leases the model expects: lease id -> (key, deadline, worker).
    leases: HashMap<LeaseId, (usize, Instant, WorkerId)>,
    epochs: HashMap<u32, u64>,
}

fn index_of(lease: &Lease) -> usize {
    let name: usize = lease
        .key
        .name()
        .rsplit('-')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    lease.controller() as usize * NAMES + name
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_queue_keeps_client_go_promises(ops in prop::collection::vec(op(), 1..120)) {
        let mut queue = Queue::new(
            QueueConfig {
                shard_count: SHARDS,
                lease_timeout: LEASE_TIMEOUT,
                capacity: 1000,
                max_controllers: CONTROLLERS.len(),
                backoff: BackoffConfig { base: Duration::from_millis(5), max: Duration::from_secs(2), qps: 0.0, burst: 0 },
            },
            &CONTROLLERS,
            SequentialLeaseIds::default(),
        );
        let mut model = Model { held: HashMap::new(), leases: HashMap::new(), epochs: HashMap::new() };
        let start = Instant::now();
        for shard in 0..SHARDS {
            queue.acquire(shard, 1, start);
            model.epochs.insert(shard, 1);
        }
        let space = queue.key_space().clone();
        let shard_of = |_: &Queue, i: usize| valid(&space, i).shard();
        let mut now = start;

        for op in ops {
            match op {
                Op::Add { key, low, delay_ms } => {
                    let priority = if low { Priority::Low } else { Priority::Normal };
                    queue.add(&valid(&space, key), priority, Duration::from_millis(delay_ms), now).unwrap();
                    let held = model.held.entry(key).or_insert(Held::Waiting);
                    if let Held::Leased { dirty } = held { *dirty = true; }
                }
                Op::Lease { worker } => {
                    expire(&mut queue, &mut model, now);
                    if let Some(lease) = queue.lease(worker, &[], now) {
                        let key = index_of(&lease);
                        prop_assert_eq!(model.held.get(&key), Some(&Held::Waiting),
                            "leased a key that was not waiting: {:?}", lease);
                        prop_assert!(model.leases.values().all(|(k, ..)| *k != key), "two leases of one key");
                        model.held.insert(key, Held::Leased { dirty: false });
                        model.leases.insert(lease.id, (key, lease.deadline, worker));
                    }
                }
                Op::Complete { pick, outcome, stale_epoch, foreign } => {
                    expire(&mut queue, &mut model, now);
                    let mut ids: Vec<LeaseId> = model.leases.keys().copied().collect();
                    ids.sort_unstable();
                    let Some(&id) = ids.get(pick % ids.len().max(1)) else { continue };
                    let (key, _, holder) = model.leases[&id];
                    let worker = if foreign { holder + 100 } else { holder };
                    let shard = shard_of(&queue, key);
                    let epoch = model.epochs[&shard] + u64::from(stale_epoch);
                    let outcome = match outcome {
                        0 => Outcome::Done,
                        1 => Outcome::Failed,
                        2 => Outcome::Forget,
                        _ => Outcome::RequeueAfter(Duration::from_millis(700)),
                    };
                    let result = queue.complete(worker, shard, epoch, id, outcome, now);
                    if stale_epoch {
                        prop_assert_eq!(result, Err(Refused::StaleEpoch));
                        continue;
                    }
                    if foreign {
                        prop_assert_eq!(result, Err(Refused::ForeignLease));
                        continue;
                    }
                    prop_assert!(result.is_ok(), "live lease refused: {:?}", result);
                    model.leases.remove(&id);
                    let Some(Held::Leased { dirty }) = model.held.get(&key).copied() else {
                        return Err(TestCaseError::fail("completed key not leased in model"));
                    };
                    let keeps = dirty || matches!(outcome, Outcome::Failed | Outcome::RequeueAfter(_));
                    if keeps { model.held.insert(key, Held::Waiting); } else { model.held.remove(&key); }
                }
                Op::Advance { ms } => {
                    now += Duration::from_millis(ms);
                    expire(&mut queue, &mut model, now);
                }
                Op::ReleaseWorker { worker } => {
                    let released = queue.release_worker(worker, now);
                    let mine: Vec<LeaseId> = model.leases.iter().filter(|(_, (_, _, w))| *w == worker).map(|(id, _)| *id).collect();
                    prop_assert_eq!(released, mine.len());
                    for id in mine {
                        let (key, ..) = model.leases.remove(&id).unwrap();
                        model.held.insert(key, Held::Waiting);
                    }
                }
                Op::Reacquire { shard } => {
                    let epoch = model.epochs[&shard] + 1;
                    queue.acquire(shard, epoch, now);
                    model.epochs.insert(shard, epoch);
                    let gone: Vec<usize> = model.held.keys().copied().filter(|k| shard_of(&queue, *k) == shard).collect();
                    for key in gone { model.held.remove(&key); }
                    model.leases.retain(|_, (k, ..)| shard_of(&queue, *k) != shard);
                }
            }
            // At most once: the queue holds exactly the keys the model holds.
            prop_assert_eq!(queue.len(), model.held.len());
            prop_assert_eq!(queue.in_flight(), model.leases.len());
            for key in 0..CONTROLLERS.len() * NAMES {
                prop_assert_eq!(queue.contains(&valid(&space, key)), model.held.contains_key(&key));
            }
        }

        // Nothing lost: let time run; every key still held is leased (and done) eventually.
        let owed: HashSet<usize> = model.held.keys().copied().collect();
        let mut leased = HashSet::new();
        for _ in 0..200 {
            now += Duration::from_secs(3);
            expire(&mut queue, &mut model, now);
            while let Some(lease) = queue.lease(9, &[], now) {
                leased.insert(index_of(&lease));
                queue.complete(9, lease.shard(), lease.epoch, lease.id, Outcome::Done, now).unwrap();
            }
            if queue.is_empty() { break; }
        }
        prop_assert!(queue.is_empty(), "keys left behind: {} held", queue.len());
        prop_assert!(owed.is_subset(&leased), "owed {:?}, leased {:?}", owed, leased);
    }
}

/// Lets the queue expire leases and mirrors it in the model.
fn expire(queue: &mut Queue, model: &mut Model, now: Instant) {
    let expired = queue.advance(now).len();
    let due: Vec<LeaseId> = model
        .leases
        .iter()
        .filter(|(_, (_, d, _))| *d <= now)
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(
        expired,
        due.len(),
        "the queue expires exactly the leases past their deadline"
    );
    for id in due {
        let (key, ..) = model.leases.remove(&id).unwrap();
        model.held.insert(key, Held::Waiting);
    }
}
