//! The queue service over loopback gRPC: many workers, workers that die mid-lease, stale
//! outcomes, leases bound to their stream, backpressure, bad input and shard ownership; and
//! `DescribeKey` following one key.

#![allow(clippy::unwrap_used)]

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    time::Duration,
};

use prost::Message;
use switchyard_proto::{
    common::v1::{NotShardOwner, WorkKey},
    queue::v1::{
        BatchRefusal, Credit, DescribeKeyRequest, Done, EnqueueItem, EnqueueManyRequest,
        EnqueueRequest, ExtendLease, Failed, KeyPhase, LeaseExtended, LeasedItem,
        ListFailingRequest, Outcome, OutcomeKind, RequeueAfter, ShardStats, StatsRequest,
        WorkRequest, WorkResponse, WorkerHello, enqueue_result, outcome, queue_client::QueueClient,
        work_request::Request as Msg, work_response::Response as Reply,
    },
};
use switchyard_queue_core::shard::shard_of;
use switchyard_runtime::{Role, ShutdownHandle};
use switchyard_testenv::Pki;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Streaming, transport::Channel};

const RS: &str = "apps/v1/ReplicaSet";
const SHARDS: u32 = 4;

struct Server {
    addr: SocketAddr,
    admin: SocketAddr,
    shutdown: ShutdownHandle,
    running: tokio::task::JoinHandle<Result<(), switchyard_runtime::Error>>,
}

impl Server {
    async fn start(extra: &[&str]) -> Self {
        let flags = ["--retry-qps=0".to_owned(), "--drain-grace=1s".into()]
            .into_iter()
            .chain(extra.iter().map(|a| (*a).to_owned()))
            .chain(Pki::shared().flags(Role::Queue));
        let (rt, addr) =
            switchyard_queue::Args::start_local(SHARDS, &[RS, "apps/v1/Deployment"], flags)
                .await
                .unwrap();
        let shutdown = rt.shutdown_handle();
        Self {
            addr,
            admin: rt.admin_addr(),
            shutdown,
            running: tokio::spawn(rt.run()),
        }
    }

    /// A server with `names` already enqueued, and a client.
    async fn seeded(
        extra: &[&str],
        names: impl IntoIterator<Item = String>,
    ) -> (Self, QueueClient<Channel>) {
        let server = Self::start(extra).await;
        let mut client = server.client().await;
        for batch in batches(names) {
            client.enqueue(batch).await.unwrap();
        }
        (server, client)
    }

    /// A client as a reconciler: it enqueues (as controllers that enqueue do) and works.
    async fn client(&self) -> QueueClient<Channel> {
        QueueClient::new(
            Pki::shared()
                .channel(Role::Reconciler, Role::Queue, self.addr)
                .await
                .unwrap(),
        )
    }

    async fn stop(self) {
        self.shutdown.trigger();
        self.running.await.unwrap().unwrap();
    }
}

/// One `Stats` figure summed over every controller and shard.
async fn stats_sum(client: &mut QueueClient<Channel>, figure: fn(&ShardStats) -> u64) -> u64 {
    let stats = client
        .stats(StatsRequest::default())
        .await
        .unwrap()
        .into_inner();
    stats.shards.iter().map(figure).sum()
}

fn key(name: &str) -> WorkKey {
    WorkKey {
        controller: RS.into(),
        namespace: "default".into(),
        name: name.into(),
    }
}

/// Batches of keys grouped by shard, as a watcher sends them.
fn batches(names: impl IntoIterator<Item = String>) -> Vec<EnqueueRequest> {
    let mut by_shard: Vec<Vec<EnqueueItem>> = vec![Vec::new(); SHARDS as usize];
    for name in names {
        let shard = shard_of(RS, "default", &name, SHARDS);
        by_shard[shard as usize].push(EnqueueItem {
            key: Some(key(&name)),
            ..Default::default()
        });
    }
    by_shard
        .into_iter()
        .enumerate()
        .filter(|(_, items)| !items.is_empty())
        .map(|(shard, items)| EnqueueRequest {
            batch_id: shard as u64,
            shard: shard as u32,
            items,
        })
        .collect()
}

struct Worker {
    tx: mpsc::Sender<WorkRequest>,
    rx: Streaming<WorkResponse>,
    /// Items that arrived while waiting for an acknowledgement.
    early: std::collections::VecDeque<LeasedItem>,
}

impl Worker {
    async fn connect(client: &mut QueueClient<Channel>, controllers: &[&str]) -> Self {
        let (tx, rx) = mpsc::channel(1024);
        tx.send(WorkRequest {
            request: Some(Msg::Hello(WorkerHello {
                worker_id: "test".into(),
                controllers: controllers.iter().map(|c| (*c).to_owned()).collect(),
            })),
        })
        .await
        .unwrap();
        let rx = client
            .work(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Self {
            tx,
            rx,
            early: Default::default(),
        }
    }

    async fn send(&self, request: Msg) {
        self.tx
            .send(WorkRequest {
                request: Some(request),
            })
            .await
            .unwrap();
    }

    async fn credit(&self, items: u32) {
        self.send(Msg::Credit(Credit { items })).await;
    }

    async fn next(&mut self) -> Reply {
        tokio::time::timeout(Duration::from_secs(10), self.rx.message())
            .await
            .expect("a message in time")
            .unwrap()
            .unwrap()
            .response
            .unwrap()
    }

    async fn item(&mut self) -> LeasedItem {
        if let Some(item) = self.early.pop_front() {
            return item;
        }
        match self.next().await {
            Reply::Item(item) => item,
            other => panic!("expected an item, got {other:?}"),
        }
    }

    async fn finish(
        &mut self,
        item: &LeasedItem,
        result: outcome::Result,
        epoch: u64,
    ) -> (bool, String) {
        self.finish_observed(item, result, epoch, HashMap::new(), HashMap::new())
            .await
    }

    async fn finish_observed(
        &mut self,
        item: &LeasedItem,
        result: outcome::Result,
        epoch: u64,
        observed: HashMap<String, u64>,
        namespace_observed: HashMap<String, u64>,
    ) -> (bool, String) {
        self.send(Msg::Outcome(Outcome {
            shard: item.shard,
            epoch,
            lease_id: item.lease_id.clone(),
            result: Some(result),
            duration: None,
            observed,
            namespace_observed,
        }))
        .await;
        loop {
            match self.next().await {
                Reply::OutcomeAck(ack) => {
                    assert_eq!(ack.lease_id, item.lease_id);
                    return (ack.applied, ack.reason);
                }
                Reply::Item(early) => self.early.push_back(early),
                Reply::LeaseExtended(_) => {}
            }
        }
    }

    async fn extend(&mut self, item: &LeasedItem, by: Duration) -> LeaseExtended {
        self.send(Msg::Extend(ExtendLease {
            shard: item.shard,
            epoch: item.epoch,
            lease_id: item.lease_id.clone(),
            extend_by: prost_types::Duration::try_from(by).ok(),
        }))
        .await;
        loop {
            match self.next().await {
                Reply::LeaseExtended(extended) => {
                    assert_eq!(extended.lease_id, item.lease_id);
                    return extended;
                }
                Reply::Item(early) => self.early.push_back(early),
                Reply::OutcomeAck(_) => {}
            }
        }
    }
}

#[tokio::test]
async fn many_workers_lease_every_key_exactly_once() {
    let server = Server::start(&[]).await;
    let mut client = server.client().await;
    let names: Vec<String> = (0..2000).map(|i| format!("obj-{i}")).collect();
    for batch in batches(names.clone()) {
        client.enqueue(batch).await.unwrap();
    }
    let mut workers = Vec::new();
    for _ in 0..4 {
        let mut c = server.client().await;
        let worker = Worker::connect(&mut c, &[]).await;
        worker.credit(50).await;
        workers.push(worker);
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for mut worker in workers {
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let Ok(Ok(Some(message))) =
                    tokio::time::timeout(Duration::from_millis(500), worker.rx.message()).await
                else {
                    return;
                };
                match message.response.unwrap() {
                    Reply::Item(item) => {
                        tx.send(item.key.clone().unwrap().name).unwrap();
                        worker
                            .send(Msg::Outcome(Outcome {
                                shard: item.shard,
                                epoch: item.epoch,
                                lease_id: item.lease_id,
                                result: Some(outcome::Result::Done(Done {})),
                                duration: None,
                                observed: Default::default(),
                                namespace_observed: Default::default(),
                            }))
                            .await;
                        worker.credit(1).await;
                    }
                    Reply::OutcomeAck(ack) => assert!(ack.applied, "{ack:?}"),
                    Reply::LeaseExtended(_) => {}
                }
            }
        }));
    }
    drop(tx);
    for task in tasks {
        task.await.unwrap();
    }
    let mut seen = HashSet::new();
    while let Some(name) = rx.recv().await {
        assert!(seen.insert(name.clone()), "{name} leased twice");
    }
    assert_eq!(seen.len(), names.len());
    assert_eq!(stats_sum(&mut client, |s| s.depth + s.in_flight).await, 0);
    server.stop().await;
}

#[tokio::test]
async fn a_worker_killed_mid_lease_loses_its_keys_to_another_after_the_timeout() {
    let (server, mut client) =
        Server::seeded(&["--lease-timeout=300ms"], ["victim".to_owned()]).await;
    let mut doomed = Worker::connect(&mut client, &[RS]).await;
    doomed.credit(1).await;
    let first = doomed.item().await;
    // Killed: the stream is reset while its request side is still open, never closed cleanly.
    let Worker {
        tx: _still_open,
        rx,
        ..
    } = doomed;
    drop(rx);

    let mut c = server.client().await;
    let mut survivor = Worker::connect(&mut c, &[RS]).await;
    survivor.credit(1).await;
    let second = survivor.item().await;
    // By the queue's own clock, which stamped the first lease's deadline: a loaded machine
    // delays this side's reads, not the queue's expiry. (Each stamp converts the queue's
    // monotonic clock to wall time on its own: allow them a millisecond apart.)
    let deadline = std::time::SystemTime::try_from(first.lease_deadline.unwrap()).unwrap();
    let queued_again = std::time::SystemTime::try_from(second.queued_at.unwrap()).unwrap();
    assert!(
        queued_again + Duration::from_millis(1) >= deadline,
        "only after the lease expired: queued again at {queued_again:?}, deadline {deadline:?}"
    );
    assert_eq!(second.key, first.key);
    assert_eq!(second.attempt, 2, "an expired lease counts as a failure");
    assert_ne!(second.lease_id, first.lease_id);
    server.stop().await;
}

#[tokio::test]
async fn a_cleanly_closed_worker_hands_its_keys_back_at_once() {
    let (server, mut client) =
        Server::seeded(&["--lease-timeout=60s"], ["handed-back".to_owned()]).await;
    let mut leaving = Worker::connect(&mut client, &[]).await;
    leaving.credit(1).await;
    let item = leaving.item().await;
    drop(leaving.tx); // closes the request stream cleanly
    let mut c = server.client().await;
    let mut next = Worker::connect(&mut c, &[]).await;
    next.credit(1).await;
    let again = next.item().await;
    assert_eq!((again.key, again.attempt), (item.key, 1));
    server.stop().await;
}

#[tokio::test]
async fn stale_and_unknown_outcomes_are_refused_and_change_nothing() {
    let (server, mut client) = Server::seeded(&[], ["fenced".to_owned()]).await;
    let mut worker = Worker::connect(&mut client, &[]).await;
    worker.credit(1).await;
    let item = worker.item().await;
    let (applied, reason) = worker
        .finish(&item, outcome::Result::Done(Done {}), item.epoch + 1)
        .await;
    assert!(!applied);
    assert!(reason.starts_with("stale epoch"), "{reason}");
    // Well formed, as a guess would be, but never issued.
    let unknown = LeasedItem {
        lease_id: "5f0e3c2a9b8d7e6f1a2b3c4d5e6f7a8b".into(),
        ..item.clone()
    };
    let (applied, reason) = worker
        .finish(&unknown, outcome::Result::Done(Done {}), item.epoch)
        .await;
    assert!(!applied);
    assert!(reason.starts_with("unknown lease"), "{reason}");
    assert_eq!(
        stats_sum(&mut client, |s| s.in_flight).await,
        1,
        "still leased"
    );
    let (applied, _) = worker
        .finish(
            &item,
            outcome::Result::Failed(Failed {
                reason: "boom".into(),
            }),
            item.epoch,
        )
        .await;
    assert!(applied);
    server.stop().await;
}

#[tokio::test]
async fn a_lease_is_answered_and_extended_only_on_the_stream_that_received_it() {
    const FOREIGN: &str = "failed precondition: lease held by another stream";
    let (server, mut client) = Server::seeded(&[], ["bound".to_owned()]).await;
    let mut holder = Worker::connect(&mut client, &[]).await;
    holder.credit(1).await;
    let item = holder.item().await;
    let mut c = server.client().await;
    let mut other = Worker::connect(&mut c, &[]).await;

    let (applied, reason) = other
        .finish(&item, outcome::Result::Done(Done {}), item.epoch)
        .await;
    assert_eq!((applied, reason.as_str()), (false, FOREIGN));
    let extended = other.extend(&item, Duration::from_secs(600)).await;
    assert_eq!(
        (extended.applied, extended.reason.as_str()),
        (false, FOREIGN)
    );
    assert_eq!(extended.lease_deadline, None);
    // The refusals end neither stream: the other stream is still answered...
    let unknown = LeasedItem {
        lease_id: "5f0e3c2a9b8d7e6f1a2b3c4d5e6f7a8b".into(),
        ..item.clone()
    };
    let (applied, reason) = other
        .finish(&unknown, outcome::Result::Done(Done {}), item.epoch)
        .await;
    assert!(!applied);
    assert!(reason.starts_with("unknown lease"), "{reason}");
    assert_eq!(
        stats_sum(&mut client, |s| s.in_flight).await,
        1,
        "still leased"
    );
    // ...and the holder's outcome applies.
    let (applied, reason) = holder
        .finish(&item, outcome::Result::Done(Done {}), item.epoch)
        .await;
    assert!(applied, "{reason}");
    assert_eq!(stats_sum(&mut client, |s| s.depth + s.in_flight).await, 0);
    assert_eq!(
        metric_sum(
            server.admin,
            "switchyard_queue_refused_outcomes_total{reason=\"foreign_lease\"}"
        )
        .await,
        2.0
    );
    server.stop().await;
}

/// A refused extension (the lease unknown or expired) ends that lease alone: the stream and
/// its other leases go on.
#[tokio::test]
async fn a_refused_extension_ends_that_lease_only() {
    let (server, mut client) = Server::seeded(&[], ["kept".to_owned()]).await;
    let mut worker = Worker::connect(&mut client, &[]).await;
    worker.credit(1).await;
    let item = worker.item().await;
    let gone = LeasedItem {
        lease_id: "0123456789abcdef0123456789abcdef".into(),
        ..item.clone()
    };
    let refused = worker.extend(&gone, Duration::from_secs(60)).await;
    assert!(!refused.applied);
    assert!(
        refused.reason.starts_with("unknown lease"),
        "{}",
        refused.reason
    );
    assert_eq!(refused.lease_deadline, None);
    // The same stream still extends and answers its live lease.
    let extended = worker.extend(&item, Duration::from_secs(60)).await;
    assert!(extended.applied, "{}", extended.reason);
    let (applied, reason) = worker
        .finish(&item, outcome::Result::Done(Done {}), item.epoch)
        .await;
    assert!(applied, "{reason}");
    assert_eq!(stats_sum(&mut client, |s| s.depth + s.in_flight).await, 0);
    server.stop().await;
}

#[tokio::test]
async fn lease_ids_are_128_random_bits_in_hex() {
    let names: Vec<String> = (0..16).map(|i| format!("id-{i}")).collect();
    let (server, mut client) = Server::seeded(&[], names.clone()).await;
    let mut worker = Worker::connect(&mut client, &[]).await;
    worker.credit(16).await;
    let mut ids = Vec::new();
    for _ in &names {
        let id = worker.item().await.lease_id;
        assert_eq!(id.len(), 32, "{id}");
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{id}"
        );
        ids.push(u128::from_str_radix(&id, 16).unwrap());
    }
    // Random ids are spread over 128 bits: no two of them are near each other, as ids counted
    // or drawn from a narrow range would be (the odds of a false alarm are about 2^-56).
    for (i, a) in ids.iter().enumerate() {
        for b in &ids[i + 1..] {
            assert!(a.abs_diff(*b) > 1 << 64, "{a:032x} and {b:032x}");
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn a_full_queue_slows_the_sender_and_drops_nothing() {
    let server = Server::start(&["--queue-capacity=10"]).await;
    let mut client = server.client().await;
    let names: Vec<String> = (0..80).map(|i| format!("k{i}")).collect();
    let batch = batches(names.clone())
        .into_iter()
        .max_by_key(|b| b.items.len())
        .unwrap();
    let expected: HashSet<String> = batch
        .items
        .iter()
        .map(|i| i.key.clone().unwrap().name)
        .collect();
    assert!(expected.len() > 10);
    let mut sender = client.clone();
    let pending = tokio::spawn(async move { sender.enqueue(batch).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!pending.is_finished(), "the batch waits for room");

    let mut worker = Worker::connect(&mut client, &[]).await;
    worker.credit(1000).await;
    let mut seen = HashSet::new();
    while seen.len() < expected.len() {
        let item = worker.item().await;
        seen.insert(item.key.clone().unwrap().name);
        worker
            .finish(&item, outcome::Result::Done(Done {}), item.epoch)
            .await;
    }
    assert_eq!(seen, expected);
    let ack = pending.await.unwrap().unwrap().into_inner();
    assert_eq!(ack.added as usize, expected.len());
    server.stop().await;
}

#[tokio::test]
async fn bad_input_is_refused_naming_the_field_and_changes_nothing() {
    let server = Server::start(&[]).await;
    let mut client = server.client().await;
    let good = key("fine");
    let shard = shard_of(RS, "default", "fine", SHARDS);
    let item = |k: WorkKey| EnqueueItem {
        key: Some(k),
        ..Default::default()
    };
    let cases = [
        (
            WorkKey {
                name: String::new(),
                ..key("")
            },
            "items[1].key.name: must not be empty",
        ),
        (
            key(&"n".repeat(254)),
            "items[1].key.name: 254 characters, at most 253",
        ),
        (
            WorkKey {
                namespace: "n".repeat(64),
                ..key("x")
            },
            "items[1].key.namespace: 64 characters, at most 63",
        ),
        (
            WorkKey {
                controller: " ".into(),
                ..key("x")
            },
            "items[1].key.controller: must not be empty",
        ),
        (
            WorkKey {
                controller: "c".repeat(254),
                ..key("x")
            },
            "items[1].key.controller: 254 characters, at most 253",
        ),
    ];
    for (bad, message) in cases {
        let status = client
            .enqueue(EnqueueRequest {
                batch_id: 1,
                shard,
                items: vec![item(good.clone()), item(bad)],
            })
            .await
            .unwrap_err();
        assert_eq!(
            (status.code(), status.message()),
            (Code::InvalidArgument, message)
        );
    }
    let oversized = EnqueueItem {
        trace_context: HashMap::from([("tracestate".to_owned(), "x".repeat(1100))]),
        ..item(good.clone())
    };
    let status = client
        .enqueue(EnqueueRequest {
            batch_id: 1,
            shard,
            items: vec![item(good.clone()), oversized],
        })
        .await
        .unwrap_err();
    assert_eq!(
        status.message(),
        "items[1].trace_context: 1110 bytes, at most 1024"
    );
    let malformed = EnqueueItem {
        observed_at: Some(prost_types::Timestamp {
            seconds: 1_790_000_000,
            nanos: -5,
        }),
        ..item(good.clone())
    };
    let status = client
        .enqueue(EnqueueRequest {
            batch_id: 1,
            shard,
            items: vec![item(good.clone()), malformed],
        })
        .await
        .unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::InvalidArgument,
            "items[1].observed_at: not a valid timestamp (0001-01-01 to 9999-12-31, nanos 0 to 999999999)"
        )
    );
    let status = client
        .enqueue(EnqueueRequest {
            batch_id: 1,
            shard: 99,
            items: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(status.message(), "shard: 99 is not below the shard count 4");
    assert_eq!(
        stats_sum(&mut client, |s| s.depth).await,
        0,
        "nothing was added"
    );

    let mut worker = Worker::connect(&mut client, &[]).await;
    worker.credit(0).await;
    let status = worker.rx.message().await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::InvalidArgument,
            "credit.items: 0 is out of range 1..=10000"
        )
    );

    let (tx, rx) = mpsc::channel(1);
    tx.send(WorkRequest {
        request: Some(Msg::Credit(Credit { items: 1 })),
    })
    .await
    .unwrap();
    let status = client.work(ReceiverStream::new(rx)).await.unwrap_err();
    assert_eq!(
        status.message(),
        "the first message of a work stream must be hello"
    );
    server.stop().await;
}

#[tokio::test]
async fn delays_beyond_any_clock_are_refused_or_capped_and_the_replica_keeps_serving() {
    let (server, mut client) = Server::seeded(&[], ["first".to_owned()]).await;
    let forever = prost_types::Duration {
        seconds: i64::MAX,
        nanos: 999_999_999,
    };
    // An Enqueue's delay: refused, naming the field and the limit; nothing changes.
    let mut batch = batches(["later".to_owned()]).remove(0);
    batch.items[0].delay = Some(forever);
    let refused = client.enqueue(batch).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("items[0].delay") && refused.message().contains("at most"),
        "{refused:?}"
    );
    // A RequeueAfter outcome's: applied, with the delay capped (an outcome is never lost).
    let mut worker = Worker::connect(&mut client, &[RS]).await;
    worker.credit(1).await;
    let item = worker.item().await;
    let requeue = outcome::Result::RequeueAfter(RequeueAfter {
        delay: Some(forever),
    });
    let (applied, reason) = worker.finish(&item, requeue, item.epoch).await;
    assert!(applied, "{reason}");
    // The replica goes on serving: a new key is leased, and the requeued one waits.
    for batch in batches(["next".to_owned()]) {
        client.enqueue(batch).await.unwrap();
    }
    worker.credit(1).await;
    let next = worker.item().await;
    assert_eq!(next.key.unwrap().name, "next");
    // Nothing accepted was lost: the requeued key waits, a week at most.
    let first = operator(&server)
        .await
        .describe_key(DescribeKeyRequest {
            key: Some(key("first")),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.phase(), KeyPhase::Delayed, "{first:?}");
    let ready_in = std::time::SystemTime::try_from(first.ready_at.unwrap())
        .unwrap()
        .duration_since(std::time::SystemTime::now())
        .unwrap();
    let week = Duration::from_secs(7 * 24 * 3600);
    assert!(
        ready_in <= week && ready_in > week - Duration::from_secs(60),
        "{ready_in:?}"
    );
    let livez = reqwest::get(format!("http://{}/livez", server.admin))
        .await
        .unwrap();
    assert_eq!(livez.status(), 200, "{:?}", livez.text().await);
    server.stop().await;
}

#[tokio::test]
async fn a_hello_naming_more_controllers_than_the_queue_may_serve_is_refused() {
    let server = Server::start(&["--max-controllers=4"]).await;
    let mut client = server.client().await;
    // 100,000 names in 2 MB: each lease would walk them all for every controller.
    for (names, served) in [(vec![RS; 100_000], false), (vec![RS; 4], true)] {
        let (tx, rx) = mpsc::channel(1);
        tx.send(WorkRequest {
            request: Some(Msg::Hello(WorkerHello {
                worker_id: "many".into(),
                controllers: names.iter().map(|c| (*c).to_owned()).collect(),
            })),
        })
        .await
        .unwrap();
        let answer = client.work(ReceiverStream::new(rx)).await;
        if served {
            answer.unwrap();
            continue;
        }
        let status = answer.unwrap_err();
        assert_eq!(
            (status.code(), status.message()),
            (
                Code::InvalidArgument,
                "hello.controllers: 100000 names, at most 4 (--max-controllers)"
            )
        );
    }
    server.stop().await;
}

/// A reconciler of its own (an SDK user's binary) works only on the controllers granted to
/// its service account: it cannot take the installation's controllers' leases.
#[tokio::test]
async fn a_reconciler_identity_works_only_on_the_controllers_granted_to_it() {
    const GREETING: &str = "example.switchyard.io/v1/Greeting";
    const ACCOUNT: &str = "greeting-switchyard-reconciler";
    let grant = format!("--work-grant={ACCOUNT}={GREETING}");
    let server = Server::start(&[&grant]).await;
    let files = Pki::shared().issue_as(ACCOUNT, ACCOUNT).unwrap();
    let dialer = switchyard_runtime::Dialer::from_args(&files.args()).unwrap();
    let endpoint = dialer
        .endpoint(&server.addr.to_string(), Role::Queue)
        .unwrap();
    let mut greeting = QueueClient::new(dialer.connect(&endpoint, Role::Queue).await.unwrap());
    let hello = |controllers: &[&str]| {
        let (tx, rx) = mpsc::channel(1);
        tx.try_send(WorkRequest {
            request: Some(Msg::Hello(WorkerHello {
                worker_id: "w".into(),
                controllers: controllers.iter().map(|c| (*c).to_owned()).collect(),
            })),
        })
        .unwrap();
        (tx, ReceiverStream::new(rx))
    };
    let (_tx, refused) = hello(&[GREETING, RS]);
    let status = greeting.work(refused).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::PermissionDenied,
            "hello.controllers[1]: the service account \"greeting-switchyard-reconciler\" may \
             not work on \"apps/v1/ReplicaSet\" (--work-grant \
             greeting-switchyard-reconciler=apps/v1/ReplicaSet would allow it)"
        )
    );
    let (_tx, granted) = hello(&[GREETING]);
    greeting.work(granted).await.unwrap();
    // The installation's own reconciler works on any controller.
    let (_tx, own) = hello(&[GREETING, RS]);
    server.client().await.work(own).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn coalesced_adds_hand_their_trace_contexts_to_the_lease() {
    let server = Server::start(&[]).await;
    let mut client = server.client().await;
    let shard = shard_of(RS, "default", "traced", SHARDS);
    let parent = |n: u32| format!("00-{n:032x}-{n:016x}-01");
    let items = (1..=3)
        .map(|n| EnqueueItem {
            key: Some(key("traced")),
            trace_context: HashMap::from([
                ("traceparent".to_owned(), parent(n)),
                ("baggage".to_owned(), "dropped".to_owned()),
            ]),
            ..Default::default()
        })
        .collect();
    let response = client
        .enqueue(EnqueueRequest {
            batch_id: 1,
            shard,
            items,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((response.added, response.coalesced), (1, 2));
    let mut worker = Worker::connect(&mut client, &[]).await;
    worker.credit(1).await;
    let item = worker.item().await;
    let causes: Vec<&str> = item
        .causes
        .iter()
        .map(|c| c.fields["traceparent"].as_str())
        .collect();
    assert_eq!(causes, [parent(1), parent(2), parent(3)]);
    assert!(
        item.causes
            .iter()
            .all(|c| !c.fields.contains_key("baggage"))
    );
    assert_eq!(item.causes_dropped, 0);
    // Without an exporter in this process, the lease's context is its oldest cause's.
    assert_eq!(item.trace_context["traceparent"], parent(1));
    server.stop().await;
}

#[tokio::test]
async fn a_shard_not_served_here_is_refused_with_where_to_go() {
    let server = Server::start(&["--static-shards=false"]).await;
    let mut client = server.client().await;
    let request = batches(["orphan".to_owned()]).remove(0);
    let shard = request.shard;
    let status = client.enqueue(request).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    let detail = NotShardOwner::decode(status.details()).unwrap();
    assert_eq!(detail.shard, shard);
    server.stop().await;
}

/// `EnqueueMany` of `batches`: each batch added, or its refusal.
async fn enqueue_many(
    client: &mut QueueClient<Channel>,
    batches: Vec<EnqueueRequest>,
) -> Vec<Result<(), BatchRefusal>> {
    let results = client
        .enqueue_many(EnqueueManyRequest { batches })
        .await
        .unwrap()
        .into_inner()
        .results;
    results
        .into_iter()
        .map(|r| match r.result.unwrap() {
            enqueue_result::Result::Added(_) => Ok(()),
            enqueue_result::Result::Refused(refusal) => Err(refusal),
        })
        .collect()
}

#[tokio::test]
async fn enqueue_many_answers_each_batch_as_enqueue_would() {
    let server = Server::start(&[]).await;
    let mut client = server.client().await;
    let mut good = batches((0..40).map(|i| format!("k{i}")));
    assert!(good.len() >= 2, "keys of several shards");
    let valid: usize = good.iter().map(|b| b.items.len()).sum();
    let mut bad_key = batches(["x".to_owned()]).remove(0);
    bad_key.items[0].key.as_mut().unwrap().name = String::new();
    let out_of_range = EnqueueRequest {
        batch_id: 99,
        shard: SHARDS,
        items: batches(["y".to_owned()]).remove(0).items,
    };
    let first = good.remove(0);
    let mut sent = vec![first, bad_key, out_of_range];
    sent.extend(good);
    let outcomes: Vec<Result<(), (Code, String)>> = enqueue_many(&mut client, sent)
        .await
        .into_iter()
        .map(|r| r.map_err(|refusal| (Code::from(refusal.code), refusal.message)))
        .collect();
    assert_eq!(outcomes[0], Ok(()));
    assert_eq!(
        outcomes[1],
        Err((
            Code::InvalidArgument,
            "batches[1].items[0].key.name: must not be empty".into()
        ))
    );
    assert_eq!(
        outcomes[2],
        Err((
            Code::InvalidArgument,
            format!("batches[2].shard: {SHARDS} is not below the shard count {SHARDS}")
        ))
    );
    assert!(outcomes[3..].iter().all(Result::is_ok), "{outcomes:?}");
    // Every key of the valid batches is queued, none of the refused ones.
    assert_eq!(stats_sum(&mut client, |s| s.depth).await, valid as u64);

    let too_many = client
        .enqueue_many(EnqueueManyRequest {
            batches: vec![EnqueueRequest::default(); 4097],
        })
        .await
        .unwrap_err();
    assert_eq!(
        (too_many.code(), too_many.message()),
        (Code::InvalidArgument, "batches: 4097 batches, at most 4096")
    );
    assert_eq!(stats_sum(&mut client, |s| s.depth).await, valid as u64);
    server.stop().await;
}

#[tokio::test]
async fn enqueue_many_refuses_each_shard_not_served_with_where_to_go() {
    let server = Server::start(&["--static-shards=false"]).await;
    let mut client = server.client().await;
    let sent = batches((0..40).map(|i| format!("k{i}")));
    let shards: Vec<u32> = sent.iter().map(|b| b.shard).collect();
    let refused: Vec<u32> = enqueue_many(&mut client, sent)
        .await
        .into_iter()
        .map(|r| {
            let refusal = r.expect_err("a shard not served here was added");
            assert_eq!(Code::from(refusal.code), Code::FailedPrecondition);
            NotShardOwner::decode(refusal.details.as_slice())
                .unwrap()
                .shard
        })
        .collect();
    assert_eq!(refused, shards);
    server.stop().await;
}

/// A controller the queue was not started with (a reconciler's own, registered with the
/// watcher at run time) is served once a worker or a key names it, up to --max-controllers.
#[tokio::test]
async fn a_controller_named_at_run_time_is_served_up_to_the_bound() {
    const LATER: &str = "example.com/v1/Later";
    const OVER: &str = "example.com/v1/Over";
    // RS and Deployment are declared; room for one more.
    let server = Server::start(&["--max-controllers=3"]).await;
    let mut client = server.client().await;
    let mut worker = Worker::connect(&mut client, &[LATER]).await;
    worker.credit(1).await;
    let later = |name: &str| WorkKey {
        controller: LATER.into(),
        namespace: "default".into(),
        name: name.into(),
    };
    let shard = shard_of(LATER, "default", "a", SHARDS);
    let added = client
        .enqueue(EnqueueRequest {
            batch_id: 1,
            shard,
            items: vec![EnqueueItem {
                key: Some(later("a")),
                ..Default::default()
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(added.added, 1);
    // The worker, which named it before any key did, leases it under its name.
    let item = worker.item().await;
    assert_eq!(item.key, Some(later("a")));
    let stats = client
        .stats(StatsRequest {
            controller: LATER.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.shards.len(), SHARDS as usize, "{stats:?}");
    assert_eq!(stats.shards.iter().map(|s| s.in_flight).sum::<u64>(), 1);
    assert_eq!(
        worker
            .finish(&item, outcome::Result::Done(Done {}), item.epoch)
            .await,
        (true, String::new())
    );
    let adds = metric_sum(
        server.admin,
        &format!("workqueue_adds_total{{name=\"{LATER}\""),
    )
    .await;
    assert_eq!(
        adds, 1.0,
        "the new controller's keys are counted under its name"
    );

    // A fourth name is one too many, by a key or by a worker; nothing of the batch is added.
    let over = WorkKey {
        controller: OVER.into(),
        ..later("b")
    };
    let status = client
        .enqueue(EnqueueRequest {
            batch_id: 2,
            shard: shard_of(OVER, "default", "b", SHARDS),
            items: vec![EnqueueItem {
                key: Some(over),
                ..Default::default()
            }],
        })
        .await
        .unwrap_err();
    let says = format!(
        "controller \"{OVER}\" is new and the queue already serves 3 controllers, its limit \
         (--max-controllers)"
    );
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::InvalidArgument,
            format!("items[0].key.controller: {says}").as_str()
        )
    );
    let hello = WorkRequest {
        request: Some(Msg::Hello(WorkerHello {
            worker_id: "test".into(),
            controllers: vec![RS.into(), OVER.into()],
        })),
    };
    let status = client.work(tokio_stream::iter([hello])).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::InvalidArgument,
            format!("hello.controllers[1]: {says}").as_str()
        )
    );
    let status = client
        .stats(StatsRequest {
            controller: OVER.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        status.message(),
        format!("controller: unknown controller \"{OVER}\"")
    );
    // The names it knows still work at the bound.
    client
        .enqueue(batches(["still".to_owned()]).remove(0))
        .await
        .unwrap();
    assert_eq!(stats_sum(&mut client, |s| s.depth).await, 1);
    server.stop().await;
}

/// Refused outcomes counted by the server, by its metrics.
async fn refused_outcomes(admin: SocketAddr) -> f64 {
    metric_sum(admin, "switchyard_queue_refused_outcomes_total{").await
}

/// The sum of the server's samples whose line starts with `prefix`.
async fn metric_sum(admin: SocketAddr, prefix: &str) -> f64 {
    let text = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_worker_that_sends_outcomes_without_reading_replies_is_held_back_and_loses_none() {
    const SENT: usize = 3 * switchyard_queue::grpc::MAX_PENDING_REPLIES;
    let server = Server::start(&[]).await;
    // A small receive window, so that what the transport buffers stays small beside the
    // server's budget.
    let dialer = Pki::shared().dialer(Role::Reconciler);
    let endpoint = dialer
        .endpoint(&server.addr.to_string(), Role::Queue)
        .unwrap()
        .initial_stream_window_size(64 * 1024)
        .initial_connection_window_size(64 * 1024);
    let channel = dialer.connect(&endpoint, Role::Queue).await.unwrap();
    let mut client = QueueClient::new(channel);
    let mut worker = Worker::connect(&mut client, &[]).await;
    // Outcomes for leases that do not exist: each is refused and acknowledged.
    let tx = worker.tx.clone();
    let sender = tokio::spawn(async move {
        for i in 0..SENT {
            let outcome = Outcome {
                shard: 0,
                epoch: 1,
                lease_id: (1_000_000 + i).to_string(),
                result: Some(outcome::Result::Done(Done {})),
                duration: None,
                observed: Default::default(),
                namespace_observed: Default::default(),
            };
            let request = WorkRequest {
                request: Some(Msg::Outcome(outcome)),
            };
            if tx.send(request).await.is_err() {
                return;
            }
        }
    });
    // Without reading a reply: the server takes up to its budget, plus what the transport
    // buffers, then stops taking more.
    let mut seen = 0.0;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = refused_outcomes(server.admin).await;
        if now == seen {
            break;
        }
        seen = now;
    }
    assert!(seen > 0.0, "the server took some outcomes");
    assert!(
        seen < (switchyard_queue::grpc::MAX_PENDING_REPLIES + 10_000) as f64,
        "a worker not reading its replies got {seen} of {SENT} outcomes processed"
    );
    // Once it reads, every outcome is answered.
    for _ in 0..SENT {
        match worker.next().await {
            Reply::OutcomeAck(ack) => assert!(!ack.applied),
            other => panic!("expected an acknowledgement, got {other:?}"),
        }
    }
    sender.await.unwrap();
    assert_eq!(refused_outcomes(server.admin).await, SENT as f64);
    server.stop().await;
}

#[tokio::test]
async fn metrics_follow_a_known_workload() {
    let server = Server::start(&[]).await;
    let mut client = server.client().await;
    let names = [
        "m-done".to_owned(),
        "m-failed".to_owned(),
        "m-waiting".to_owned(),
    ];
    for batch in batches(names.clone()) {
        client.enqueue(batch).await.unwrap();
    }
    // Coalesces: not an add.
    for batch in batches(["m-waiting".to_owned()]) {
        client.enqueue(batch).await.unwrap();
    }
    let mut worker = Worker::connect(&mut client, &[]).await;
    worker.credit(2).await;
    let a = worker.item().await;
    let b = worker.item().await;
    worker
        .finish(&a, outcome::Result::Done(Done {}), a.epoch)
        .await;
    worker
        .finish(&b, outcome::Result::Failed(Failed::default()), b.epoch)
        .await;
    worker
        .finish(&b, outcome::Result::Done(Done {}), b.epoch + 7)
        .await;

    let text = reqwest::get(format!("http://{}/metrics", server.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let sum = |prefix: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(sum("workqueue_adds_total{"), 3.0, "{text}");
    assert_eq!(sum("workqueue_retries_total{"), 1.0);
    assert_eq!(sum("workqueue_work_duration_seconds_count{"), 2.0);
    assert_eq!(sum("workqueue_queue_duration_seconds_count{"), 2.0);
    assert_eq!(
        sum("switchyard_queue_refused_outcomes_total{reason=\"stale_epoch\"}"),
        1.0
    );
    assert!(
        text.contains("name=\"apps/v1/ReplicaSet\""),
        "labelled by controller"
    );
    assert!(text.trim_end().ends_with("# EOF"));
    server.stop().await;
}

#[tokio::test]
async fn shutdown_stops_leasing_but_takes_in_flight_outcomes_within_the_grace() {
    let (server, mut client) =
        Server::seeded(&[], ["in-flight".to_owned(), "never-leased".to_owned()]).await;
    let mut worker = Worker::connect(&mut client, &[]).await;
    worker.credit(1).await;
    let item = worker.item().await;

    server.shutdown.trigger();
    tokio::time::sleep(Duration::from_millis(200)).await;
    worker.credit(5).await;
    let (applied, reason) = worker
        .finish(&item, outcome::Result::Done(Done {}), item.epoch)
        .await;
    assert!(
        applied,
        "an in-flight outcome still counts while draining: {reason}"
    );
    // Nothing else was leased, and the stream ends once the shards are handed back.
    let end = tokio::time::timeout(Duration::from_secs(5), worker.rx.message())
        .await
        .expect("the stream ends within the grace (1 s)");
    assert!(matches!(end, Ok(None)), "{end:?}");
    assert!(worker.early.is_empty());
    server.running.await.unwrap().unwrap();
}

#[tokio::test]
async fn applied_outcomes_raise_the_shards_read_floor_that_leases_carry() {
    let server = Server::start(&[]).await;
    let mut client = server.client().await;
    let shard = shard_of(RS, "default", "first", SHARDS);
    let same_shard: Vec<String> = (0..)
        .map(|i| format!("next-{i}"))
        .filter(|name| shard_of(RS, "default", name, SHARDS) == shard)
        .take(2)
        .collect();
    let mut worker = Worker::connect(&mut client, &[]).await;
    worker.credit(10).await;
    let done = || outcome::Result::Done(Done {});
    let kinds = |pairs: &[(&str, u64)]| -> HashMap<String, u64> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    };

    client
        .enqueue(batches(["first".to_owned()]).remove(0))
        .await
        .unwrap();
    let first = worker.item().await;
    assert!(first.read_floor.is_empty(), "{first:?}");
    assert!(first.namespace_read_floor.is_empty(), "{first:?}");
    let observed = kinds(&[("v1/Pod", 40), (RS, 12)]);
    let here = kinds(&[("v1/Pod", 38)]);
    assert!(
        worker
            .finish_observed(&first, done(), first.epoch, observed.clone(), here.clone())
            .await
            .0
    );

    client
        .enqueue(batches([same_shard[0].clone()]).remove(0))
        .await
        .unwrap();
    let second = worker.item().await;
    assert_eq!(second.read_floor, observed);
    assert_eq!(second.namespace_read_floor, here);
    // A refused outcome (a stale epoch) raises nothing; a lower version lowers nothing.
    let (applied, _) = worker
        .finish_observed(
            &second,
            done(),
            second.epoch + 1,
            kinds(&[("v1/Pod", 99)]),
            kinds(&[("v1/Pod", 99)]),
        )
        .await;
    assert!(!applied);
    assert!(
        worker
            .finish_observed(
                &second,
                done(),
                second.epoch,
                kinds(&[("v1/Pod", 7)]),
                kinds(&[("v1/Pod", 7)]),
            )
            .await
            .0
    );
    client
        .enqueue(batches([same_shard[1].clone()]).remove(0))
        .await
        .unwrap();
    let third = worker.item().await;
    assert_eq!(third.read_floor, observed);
    assert_eq!(third.namespace_read_floor, here);

    // Too many kinds is a malformed outcome: the stream ends naming the field.
    let many: HashMap<String, u64> = (0..65).map(|i| (format!("g/v1/K{i}"), 1)).collect();
    worker
        .send(Msg::Outcome(Outcome {
            shard: third.shard,
            epoch: third.epoch,
            lease_id: third.lease_id.clone(),
            result: Some(done()),
            duration: None,
            observed: HashMap::new(),
            namespace_observed: many,
        }))
        .await;
    let status = loop {
        match tokio::time::timeout(Duration::from_secs(10), worker.rx.message())
            .await
            .expect("an answer in time")
        {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without an error"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("outcome.namespace_observed: 65 kinds, at most 64"),
        "{status:?}"
    );
    server.stop().await;
}

/// A client as an operator's tool (`kubectl switchyard why`).
async fn operator(server: &Server) -> QueueClient<Channel> {
    QueueClient::new(
        Pki::shared()
            .channel(Role::Operator, Role::Queue, server.addr)
            .await
            .unwrap(),
    )
}

#[tokio::test]
async fn describe_key_follows_a_key_through_lease_failure_and_backoff() {
    let (server, mut client) = Server::seeded(&[], ["api".to_owned()]).await;
    let mut operator = operator(&server).await;
    let describe = |name: &str| DescribeKeyRequest {
        key: Some(key(name)),
    };
    let queued = operator
        .describe_key(describe("api"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(queued.phase(), KeyPhase::Queued);
    assert_eq!(queued.shard, shard_of(RS, "default", "api", SHARDS));
    assert!(queued.ready_since.is_some() && queued.last_outcome.is_none());

    let mut worker = Worker::connect(&mut client, &[RS]).await;
    worker.credit(1).await;
    let item = worker.item().await;
    let leased = operator
        .describe_key(describe("api"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(leased.phase(), KeyPhase::Leased);
    assert_eq!(leased.worker_id, "test");
    assert!(leased.lease_deadline.is_some());
    // Its Work stream granted one item and holds it: no credit left.
    let stats = client
        .stats(StatsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let streams: Vec<_> = stats
        .workers
        .iter()
        .map(|w| (w.worker_id.as_str(), w.credits, w.in_flight))
        .collect();
    assert_eq!(streams, [("test", 0, 1)]);

    let reason = "replicasets \"api\" is forbidden";
    let (applied, _) = worker
        .finish(
            &item,
            outcome::Result::Failed(Failed {
                reason: reason.into(),
            }),
            item.epoch,
        )
        .await;
    assert!(applied);
    let failed = operator
        .describe_key(describe("api"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(failed.failures, 1);
    assert!(
        matches!(failed.phase(), KeyPhase::Delayed | KeyPhase::Queued),
        "backing off, or ready again after the first 5 ms: {failed:?}"
    );
    let last = failed.last_outcome.unwrap();
    assert_eq!(last.kind(), OutcomeKind::Failed);
    assert_eq!((last.error.as_str(), last.attempt), (reason, 1));
    assert_eq!(last.worker_id, "test");

    // The failing keys list it as DescribeKey does; the stream counts the outcome.
    let failing = operator
        .list_failing(ListFailingRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(failing.total, 1);
    assert_eq!(failing.keys.len(), 1);
    assert_eq!(failing.keys[0].key, Some(key("api")));
    assert_eq!(failing.keys[0].failures, 1);
    let stats = client
        .stats(StatsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.workers[0].finished, 1);
    let too_many = operator
        .list_failing(ListFailingRequest {
            limit: 1001,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(too_many.code(), Code::InvalidArgument);
    assert_eq!(too_many.message(), "limit: 1001 is more than 1000");

    // A key never added is absent; bad input names the field.
    let absent = operator
        .describe_key(describe("never"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(absent.phase(), KeyPhase::Absent);
    assert!(absent.last_outcome.is_none());
    let bad = operator
        .describe_key(DescribeKeyRequest {
            key: Some(WorkKey {
                controller: "example.com/v1/Nope".into(),
                ..key("api")
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(
        bad.message()
            .starts_with("key.controller: unknown controller"),
        "{bad:?}"
    );
    let missing = operator
        .describe_key(DescribeKeyRequest { key: None })
        .await
        .unwrap_err();
    assert_eq!(missing.message(), "key: required");
    server.stop().await;
}

#[tokio::test]
async fn describe_key_of_a_shard_not_served_here_says_where_to_go() {
    let server = Server::start(&["--static-shards=false"]).await;
    let mut operator = operator(&server).await;
    let status = operator
        .describe_key(DescribeKeyRequest {
            key: Some(key("orphan")),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    let detail = NotShardOwner::decode(status.details()).unwrap();
    assert_eq!(detail.shard, shard_of(RS, "default", "orphan", SHARDS));
    server.stop().await;
}
