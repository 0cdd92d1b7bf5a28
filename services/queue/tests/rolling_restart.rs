//! A graceful rolling restart of every queue replica, one by one, while work flows.
//!
//! ```text
//!  producer ──Enqueue (follows NotShardOwner redirects)──► q0 q1 q2 ◄──Work── workers
//!     ▲                                                    (SIGTERM, restart, one by one)
//!     └── WatchShardMap (elector gRPC): a shard's new epoch ─► resend its keys not yet done
//! ```
//!
//! Queue contents are soft state: a shard's new owner starts empty and the watcher resends
//! the shard's keys when it sees the new epoch. The producer plays that part of the watcher:
//! it keeps every key it enqueued until a worker reports it done, and resends a shard's
//! pending keys when the shard's epoch changes in the elector's `WatchShardMap` stream.
//!
//! Checked from the workers' records (all in this process, so one monotonic clock):
//! - no key is lost: every key enqueued is leased and reported done, and accepted;
//! - no key is leased twice at once: per key, a lease starts only after the worker holding
//!   the previous one sent its outcome;
//! - no outcome is refused (a graceful handover lets in-flight leases finish).

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use prost::Message;
use switchyard_proto::{
    common::v1::{NotShardOwner, WorkKey},
    elector::v1::{ShardMap, ShardState, WatchShardMapRequest},
    queue::v1::{
        Credit, Done, EnqueueItem, EnqueueRequest, Outcome, WorkRequest, WorkerHello, outcome,
        queue_client::QueueClient, work_request, work_response,
    },
};
use switchyard_queue_core::shard::shard_of;
use switchyard_runtime::Role;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, transport::Channel};

use support::{
    RS, assert_no_two_owners, cluster, elector_client, metric, metrics, queue_client, until_served,
};

const SHARDS: u32 = 16;
/// New keys per producer tick, and the tick: at most 500 keys/s (the producer's own sends
/// stretch its tick; about 230 keys/s on the loaded 2-core machine), modest beside etcd, three
/// replicas and this test.
const KEYS_PER_TICK: usize = 5;
const TICK: Duration = Duration::from_millis(10);
/// Keys per enqueue batch at most.
const BATCH: usize = 500;
/// Workers per replica, and the items each may hold at once.
const WORKERS_PER_REPLICA: usize = 2;
const CREDITS: u32 = 16;
/// How long a worker "reconciles" one key: long enough that handovers find leases in flight
/// (about 230 keys/s × 50 ms ≈ 12 over 16 shards) and must wait for them. With the wait
/// removed from the handover, the test fails (outcomes refused).
const WORK: Duration = Duration::from_millis(50);
/// Steady work between two restarts.
const STEADY: Duration = Duration::from_millis(1500);
/// How long every pending key gets to be done once the roll is over.
const SETTLE: Duration = Duration::from_secs(60);

/// One lease as a worker saw it.
#[derive(Debug)]
struct Lease {
    key: String,
    replica: String,
    epoch: u64,
    received: Instant,
    outcome_sent: Option<Instant>,
    applied: Option<bool>,
}

#[derive(Default)]
struct Book {
    leases: Vec<Lease>,
    /// (replica address, lease id) -> index in `leases`.
    index: HashMap<(String, String), usize>,
    done: HashSet<String>,
    /// Keys the queue accepted, counting resends.
    accepted: usize,
}

type Shared = Arc<Mutex<Book>>;

fn key(name: &str) -> WorkKey {
    WorkKey {
        controller: RS.into(),
        namespace: "default".into(),
        name: name.into(),
    }
}

fn send(request: work_request::Request) -> WorkRequest {
    WorkRequest {
        request: Some(request),
    }
}

/// One worker session at `address`, until the replica ends the stream.
async fn worker(address: String, id: String, book: Shared) {
    let Ok(mut client) = queue_client(Role::Reconciler, &address).await else {
        return;
    };
    let (tx, rx) = mpsc::channel(2 * CREDITS as usize + 2);
    let _ = tx
        .send(send(work_request::Request::Hello(WorkerHello {
            worker_id: id,
            controllers: vec![RS.into()],
        })))
        .await;
    let _ = tx
        .send(send(work_request::Request::Credit(Credit {
            items: CREDITS,
        })))
        .await;
    let Ok(response) = client.work(ReceiverStream::new(rx)).await else {
        return;
    };
    let mut responses = response.into_inner();
    while let Ok(Some(message)) = responses.message().await {
        match message.response {
            Some(work_response::Response::Item(item)) => {
                let received = Instant::now();
                let name = item.key.as_ref().unwrap().name.clone();
                {
                    let mut book = book.lock().unwrap();
                    let at = book.leases.len();
                    book.leases.push(Lease {
                        key: name,
                        replica: address.clone(),
                        epoch: item.epoch,
                        received,
                        outcome_sent: None,
                        applied: None,
                    });
                    book.index
                        .insert((address.clone(), item.lease_id.clone()), at);
                }
                // Reconciles run side by side, up to the credits granted.
                let (book, tx, address) = (book.clone(), tx.clone(), address.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(WORK).await;
                    {
                        let mut book = book.lock().unwrap();
                        let at = book.index[&(address, item.lease_id.clone())];
                        book.leases[at].outcome_sent = Some(Instant::now());
                    }
                    let outcome = Outcome {
                        shard: item.shard,
                        epoch: item.epoch,
                        lease_id: item.lease_id,
                        result: Some(outcome::Result::Done(Done {})),
                        duration: None,
                        observed: Default::default(),
                        namespace_observed: Default::default(),
                    };
                    let _ = tx.send(send(work_request::Request::Outcome(outcome))).await;
                    let _ = tx
                        .send(send(work_request::Request::Credit(Credit { items: 1 })))
                        .await;
                });
            }
            Some(work_response::Response::OutcomeAck(ack)) => {
                let mut book = book.lock().unwrap();
                let at = book.index[&(address.clone(), ack.lease_id)];
                book.leases[at].applied = Some(ack.applied);
                if ack.applied {
                    let key = book.leases[at].key.clone();
                    book.done.insert(key);
                }
            }
            _ => {}
        }
    }
}

/// Keeps `WORKERS_PER_REPLICA` workers on every member the shard map names.
async fn workers(map: watch::Receiver<Option<ShardMap>>, book: Shared) {
    let mut running: HashMap<String, Vec<tokio::task::JoinHandle<()>>> = HashMap::new();
    let mut serial = 0;
    loop {
        let addresses: Vec<String> = map
            .borrow()
            .iter()
            .flat_map(|m| m.members.iter().map(|m| m.address.clone()))
            .collect();
        running.retain(|_, tasks| tasks.iter().any(|t| !t.is_finished()));
        for address in addresses {
            running.entry(address.clone()).or_insert_with(|| {
                (0..WORKERS_PER_REPLICA)
                    .map(|_| {
                        serial += 1;
                        tokio::spawn(worker(
                            address.clone(),
                            format!("worker-{serial}"),
                            book.clone(),
                        ))
                    })
                    .collect()
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[derive(Debug, Default)]
struct Produced {
    keys: usize,
    accepted_batches: usize,
    redirects: usize,
    resyncs: usize,
}

/// Enqueues new keys until `stop`, then resends until every key is done (or `SETTLE`).
/// Routes each shard by what redirects taught it, starting anywhere.
async fn producer(
    mut map: watch::Receiver<Option<ShardMap>>,
    book: Shared,
    mut stop: watch::Receiver<bool>,
) -> Produced {
    let mut stats = Produced::default();
    let mut pending: HashMap<u32, BTreeSet<String>> = HashMap::new();
    let mut to_send: HashMap<u32, BTreeSet<String>> = HashMap::new();
    let mut epochs: HashMap<u32, u64> = HashMap::new();
    let mut route: HashMap<u32, String> = HashMap::new();
    let mut clients: HashMap<String, QueueClient<Channel>> = HashMap::new();
    let mut settle_deadline: Option<Instant> = None;
    let mut spread = 0usize;
    loop {
        if settle_deadline.is_none() && *stop.borrow_and_update() {
            settle_deadline = Some(Instant::now() + SETTLE);
        }
        if settle_deadline.is_none() {
            for _ in 0..KEYS_PER_TICK {
                let name = format!("k{}", stats.keys);
                stats.keys += 1;
                let shard = shard_of(RS, "default", &name, SHARDS);
                pending.entry(shard).or_default().insert(name.clone());
                to_send.entry(shard).or_default().insert(name);
            }
        }
        {
            let book = book.lock().unwrap();
            let done = &book.done;
            for keys in pending.values_mut() {
                keys.retain(|k| !done.contains(k));
            }
            for keys in to_send.values_mut() {
                keys.retain(|k| !done.contains(k));
            }
        }
        if settle_deadline.is_some() && pending.values().all(BTreeSet::is_empty) {
            return stats;
        }
        if let Some(deadline) = settle_deadline {
            assert!(
                Instant::now() < deadline,
                "keys never done: {:?}",
                pending.values().flatten().take(20).collect::<Vec<_>>()
            );
        }
        // A shard's new epoch: its new owner started empty, so resend what is not done.
        let snapshot = map.borrow_and_update().clone();
        let Some(snapshot) = snapshot else {
            tokio::time::sleep(TICK).await;
            continue;
        };
        let members: Vec<String> = {
            for a in &snapshot.shards {
                if a.state() != ShardState::Active {
                    continue;
                }
                if epochs.insert(a.shard, a.epoch) != Some(a.epoch) {
                    let keys = pending.get(&a.shard).cloned().unwrap_or_default();
                    if !keys.is_empty() {
                        stats.resyncs += 1;
                    }
                    to_send.entry(a.shard).or_default().extend(keys);
                }
            }
            snapshot.members.iter().map(|m| m.address.clone()).collect()
        };
        for (shard, keys) in to_send.iter_mut() {
            if keys.is_empty() || members.is_empty() {
                continue;
            }
            let address = route.get(shard).cloned().unwrap_or_else(|| {
                spread += 1;
                members[spread % members.len()].clone()
            });
            let batch: Vec<String> = keys.iter().take(BATCH).cloned().collect();
            let client = match clients.get(&address) {
                Some(client) => client.clone(),
                None => match queue_client(Role::Watcher, &address).await {
                    Ok(client) => {
                        clients.insert(address.clone(), client.clone());
                        client
                    }
                    Err(_) => {
                        route.remove(shard);
                        continue;
                    }
                },
            };
            let request = EnqueueRequest {
                batch_id: 0,
                shard: *shard,
                items: batch
                    .iter()
                    .map(|name| EnqueueItem {
                        key: Some(key(name)),
                        ..Default::default()
                    })
                    .collect(),
            };
            match client.clone().enqueue(request).await {
                Ok(_) => {
                    stats.accepted_batches += 1;
                    book.lock().unwrap().accepted += batch.len();
                    route.insert(*shard, address);
                    for name in &batch {
                        keys.remove(name);
                    }
                }
                Err(status) if status.code() == Code::FailedPrecondition => {
                    stats.redirects += 1;
                    let detail = NotShardOwner::decode(status.details()).unwrap();
                    assert_eq!(detail.shard, *shard);
                    if detail.owner_address.is_empty() || detail.owner_address == address {
                        route.remove(shard);
                    } else {
                        route.insert(*shard, detail.owner_address);
                    }
                }
                // The replica is stopping or gone: ask another one.
                Err(_) => {
                    route.remove(shard);
                    clients.remove(&address);
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = stop.changed() => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_loses_no_key_and_leases_none_twice_at_once() {
    let mut cluster = cluster(SHARDS).await;
    // Every replica holds shards before the roll starts.
    let settled = |owners: &HashMap<u32, usize>| (0..3).all(|i| owners.values().any(|o| *o == i));
    until_served(&cluster, Duration::from_secs(15), settled).await;

    let mut elector = elector_client(cluster.elector_addr).await;
    let mut stream = elector
        .watch_shard_map(WatchShardMapRequest {})
        .await
        .unwrap()
        .into_inner();
    let (map_tx, map) = watch::channel(None);
    tokio::spawn(async move {
        while let Ok(Some(snapshot)) = stream.message().await {
            map_tx.send_replace(Some(snapshot));
        }
    });
    let book: Shared = Arc::default();
    let pool = tokio::spawn(workers(map.clone(), book.clone()));
    let (stop, stopped) = watch::channel(false);
    let producing = tokio::spawn(producer(map.clone(), book.clone(), stopped));

    let started = Instant::now();
    let mut logs = Vec::new();
    tokio::time::sleep(STEADY).await;
    // (accepted, leased) just before each SIGTERM and once the restarted replica serves again.
    let flow = |book: &Shared| {
        let book = book.lock().unwrap();
        (book.accepted, book.leases.len())
    };
    let mut windows = Vec::new();
    for i in 0..3 {
        let before = flow(&book);
        let leaving = cluster.replicas[i].take().unwrap();
        let (status, log) = leaving.terminate().await.unwrap();
        assert!(status.success(), "replica q{i} exited with {status}");
        logs.push((log, SystemTime::now()));
        cluster.restart_replica(i).await;
        // Back in the map and holding shards again, every shard served exactly once.
        until_served(&cluster, Duration::from_secs(30), settled).await;
        windows.push((before, flow(&book)));
        println!("q{i} restarted; {:?} into the roll", started.elapsed());
        tokio::time::sleep(STEADY).await;
    }
    stop.send_replace(true);
    let produced = producing.await.unwrap();
    pool.abort();
    println!("{produced:?} in {:?}", started.elapsed());

    let book = std::mem::take(&mut *book.lock().unwrap());
    let all: BTreeSet<String> = (0..produced.keys).map(|n| format!("k{n}")).collect();
    let missing: Vec<&String> = all.iter().filter(|k| !book.done.contains(*k)).collect();
    assert!(missing.is_empty(), "keys never done: {missing:?}");
    for (i, ((accepted, leased), (accepted_after, leased_after))) in windows.iter().enumerate() {
        assert!(
            accepted_after > accepted && leased_after > leased,
            "work flowed while q{i} restarted: {:?}",
            windows[i]
        );
    }
    assert!(
        produced.redirects > 0,
        "redirects were followed: {produced:?}"
    );
    assert!(
        produced.resyncs > 0,
        "shards moved with keys pending: {produced:?}"
    );

    let mut by_key: HashMap<&str, Vec<&Lease>> = HashMap::new();
    for lease in &book.leases {
        by_key.entry(&lease.key).or_default().push(lease);
    }
    let mut leased_again = 0;
    for (key, leases) in &mut by_key {
        leases.sort_by_key(|l| l.received);
        for pair in leases.windows(2) {
            leased_again += 1;
            // A lease whose worker never sent its outcome is held for ever.
            let ended = pair[0].outcome_sent;
            assert!(
                ended.is_some_and(|end| end <= pair[1].received),
                "{key} leased twice at once: {:?} and {:?}",
                pair[0],
                pair[1]
            );
        }
    }
    let refused: Vec<&Lease> = book
        .leases
        .iter()
        .filter(|l| l.applied == Some(false))
        .collect();
    assert!(refused.is_empty(), "outcomes refused: {refused:?}");
    let epochs: HashSet<(&str, u64)> = book
        .leases
        .iter()
        .map(|l| (l.replica.as_str(), l.epoch))
        .collect();
    println!(
        "{} leases of {} keys ({leased_again} leased again after a resync), over {} \
         (replica, epoch) pairs",
        book.leases.len(),
        by_key.len(),
        epochs.len()
    );

    // The replicas' own account: handovers happened, none ran out of grace or lost a lease,
    // and no shard was `reassigned` (moved by the map without a release from its server).
    let mut handovers = 0.0;
    for replica in cluster.replicas.iter().flatten() {
        let text = metrics(replica).await;
        handovers += metric(
            &text,
            "switchyard_queue_shard_releases_total{reason=\"handover\"}",
        )
        .unwrap_or(0.0);
        for reason in ["handover_grace_expired", "lease_lost", "reassigned"] {
            assert_eq!(
                metric(
                    &text,
                    &format!("switchyard_queue_shard_releases_total{{reason=\"{reason}\"}}")
                ),
                None,
                "{text}"
            );
        }
        assert_eq!(
            metric(&text, "switchyard_queue_member_lease_lost_total"),
            Some(0.0),
            "{text}"
        );
    }
    assert!(handovers > 0.0, "planned handovers were counted");

    for replica in cluster.replicas.iter_mut() {
        let (status, log) = replica.take().unwrap().terminate().await.unwrap();
        assert!(status.success());
        logs.push((log, SystemTime::now()));
    }
    // The replicas stopped during the roll have no metrics left: their logs name the reason
    // of every shard they stopped serving.
    for (log, _) in &logs {
        let reassigned: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("\"reason\":\"reassigned\""))
            .collect();
        assert!(
            reassigned.is_empty(),
            "moved without a release: {reassigned:?}"
        );
    }
    assert_eq!(assert_no_two_owners(&logs), SHARDS as usize);
}
