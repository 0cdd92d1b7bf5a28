//! Every gRPC handler of the queue, driven with arbitrary messages by every identity of the
//! installation: no message panics anything in the process or stops the replica, nothing it
//! had accepted is lost, and it still serves a well-formed key afterwards. Work sessions
//! answer the leases they really hold, so that arbitrary outcomes and extensions reach the
//! queue's core rather than stopping at an unknown lease id. Bounded (a few thousand calls,
//! a few seconds), so it runs in `make test`; a failure prints the seed that replays it
//! (`SWITCHYARD_FUZZ_SEED`).

#![allow(clippy::unwrap_used)]

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use proptest::{
    collection, option,
    prelude::*,
    strategy::ValueTree,
    test_runner::{RngSeed, TestRunner},
};
use switchyard_proto::{
    common::v1::WorkKey,
    queue::v1::{
        Credit, DescribeKeyRequest, Done, EnqueueItem, EnqueueManyRequest, EnqueueRequest,
        ExtendLease, Failed, Forget, KeyPhase, LeasedItem, ListFailingRequest, Outcome,
        RequeueAfter, StatsRequest, WorkRequest, WorkerHello, outcome, queue_client::QueueClient,
        work_request::Request as Msg, work_response::Response as Reply,
    },
};
use switchyard_queue_core::shard::shard_of;
use switchyard_runtime::Role;
use switchyard_testenv::{
    Pki,
    fuzz::{self, Panics},
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const RS: &str = "apps/v1/ReplicaSet";
/// The controller of the keys enqueued before the fuzz, which no fuzzed session asks for:
/// each must still be held at the end.
const KEPT: &str = "apps/v1/Deployment";
const SHARDS: u32 = 4;
/// Cases run: each is one call (or one stream of several messages) as one identity.
const CASES: u32 = 2000;
/// How long one case may take: a call that hangs fails the test rather than stalling it.
const CALL_LIMIT: Duration = Duration::from_secs(20);
/// How long a stream's answers are read, when none comes, before it is dropped.
const STREAM_READ: Duration = Duration::from_millis(50);

/// Text as a caller may send it: empty, plausible, any Unicode, oversized, or a known name.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z0-9./-]{1,20}",
        ".{0,24}",
        (250usize..300).prop_map(|n| "n".repeat(n)),
        Just(RS.to_owned()),
    ]
}

/// Numbers as a caller may send them, the edges included (uniform values almost never hit
/// them).
fn edgy_i64() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(i64::MAX),
        Just(i64::MIN),
        Just(0),
        Just(-1),
        (i64::MAX - 1_000_000_000)..=i64::MAX,
        any::<i64>(),
        0i64..1_000_000,
    ]
}

fn duration() -> impl Strategy<Value = Option<prost_types::Duration>> {
    let nanos = prop_oneof![
        Just(999_999_999),
        Just(0),
        Just(-1),
        any::<i32>(),
        0i32..1_000_000_000
    ];
    option::of(
        (edgy_i64(), nanos).prop_map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }),
    )
}

fn key() -> impl Strategy<Value = Option<WorkKey>> {
    option::of(
        (text(), text(), text()).prop_map(|(controller, namespace, name)| WorkKey {
            controller,
            namespace,
            name,
        }),
    )
}

fn shard() -> impl Strategy<Value = u32> {
    prop_oneof![0..SHARDS, any::<u32>()]
}

fn item() -> impl Strategy<Value = EnqueueItem> {
    (
        key(),
        prop_oneof![0i32..3, any::<i32>()],
        duration(),
        collection::btree_map(text(), text(), 0..3),
        option::of((edgy_i64(), any::<i32>())),
    )
        .prop_map(|(key, priority, delay, trace, observed)| EnqueueItem {
            key,
            priority,
            delay,
            trace_context: trace.into_iter().collect(),
            observed_at: observed.map(|(seconds, nanos)| prost_types::Timestamp { seconds, nanos }),
        })
}

fn enqueue() -> impl Strategy<Value = EnqueueRequest> {
    let anything = (any::<u64>(), shard(), collection::vec(item(), 0..4)).prop_map(
        |(batch_id, shard, items)| EnqueueRequest {
            batch_id,
            shard,
            items,
        },
    );
    // A well-formed key in its own shard, so that the rest of the item (its delay, its
    // trace context, its timestamp) reaches the queue rather than the key's check.
    let aligned = (any::<u64>(), "[a-z]{1,10}", "[a-z0-9-]{1,20}", item()).prop_map(
        |(batch_id, namespace, name, mut item)| {
            let shard = shard_of(RS, &namespace, &name, SHARDS);
            item.key = Some(WorkKey {
                controller: RS.into(),
                namespace,
                name,
            });
            EnqueueRequest {
                batch_id,
                shard,
                items: vec![item],
            }
        },
    );
    prop_oneof![anything, aligned]
}

fn versions() -> impl Strategy<Value = BTreeMap<String, u64>> {
    collection::btree_map(text(), any::<u64>(), 0..3)
}

fn result() -> impl Strategy<Value = outcome::Result> {
    prop_oneof![
        Just(outcome::Result::Done(Done {})),
        Just(outcome::Result::Forget(Forget {})),
        text().prop_map(|reason| outcome::Result::Failed(Failed { reason })),
        duration().prop_map(|delay| outcome::Result::RequeueAfter(RequeueAfter { delay })),
    ]
}

/// A hello's controllers: a few names of any kind, or more than the queue may serve.
fn controllers() -> impl Strategy<Value = Vec<String>> {
    prop_oneof![
        4 => collection::vec(text(), 0..3),
        1 => (17usize..40).prop_map(|n| vec![RS.to_owned(); n]),
    ]
}

fn work_message() -> impl Strategy<Value = Msg> {
    prop_oneof![
        (text(), controllers()).prop_map(|(worker_id, controllers)| {
            Msg::Hello(WorkerHello {
                worker_id,
                controllers,
            })
        }),
        prop_oneof![Just(u32::MAX), Just(0), any::<u32>(), 0u32..20]
            .prop_map(|items| Msg::Credit(Credit { items })),
        (
            shard(),
            any::<u64>(),
            text(),
            option::of(result()),
            duration(),
            versions(),
            versions()
        )
            .prop_map(
                |(shard, epoch, lease_id, result, duration, observed, namespace_observed)| {
                    Msg::Outcome(Outcome {
                        shard,
                        epoch,
                        lease_id,
                        result,
                        duration,
                        observed: observed.into_iter().collect(),
                        namespace_observed: namespace_observed.into_iter().collect(),
                    })
                }
            ),
        (shard(), any::<u64>(), text(), duration()).prop_map(
            |(shard, epoch, lease_id, extend_by)| Msg::Extend(ExtendLease {
                shard,
                epoch,
                lease_id,
                extend_by,
            })
        ),
    ]
}

/// How a session answers one lease it holds: with its real shard, epoch and id (the epoch
/// sometimes off by one), and anything else arbitrary.
#[derive(Clone, Debug)]
enum Answer {
    Outcome {
        result: Option<outcome::Result>,
        duration: Option<prost_types::Duration>,
        observed: BTreeMap<String, u64>,
        namespace_observed: BTreeMap<String, u64>,
        stale: bool,
    },
    Extend {
        by: Option<prost_types::Duration>,
        stale: bool,
    },
}

fn answer() -> impl Strategy<Value = Answer> {
    let stale = prop_oneof![5 => Just(false), 1 => Just(true)];
    prop_oneof![
        3 => (option::of(result()), duration(), versions(), versions(), stale.clone()).prop_map(
            |(result, duration, observed, namespace_observed, stale)| Answer::Outcome {
                result,
                duration,
                observed,
                namespace_observed,
                stale,
            }
        ),
        1 => (duration(), stale).prop_map(|(by, stale)| Answer::Extend { by, stale }),
    ]
}

impl Answer {
    fn to(self, item: &LeasedItem) -> Msg {
        let epoch = |stale: bool| item.epoch.wrapping_sub(u64::from(stale));
        match self {
            Answer::Outcome {
                result,
                duration,
                observed,
                namespace_observed,
                stale,
            } => Msg::Outcome(Outcome {
                shard: item.shard,
                epoch: epoch(stale),
                lease_id: item.lease_id.clone(),
                result,
                duration,
                observed: observed.into_iter().collect(),
                namespace_observed: namespace_observed.into_iter().collect(),
            }),
            Answer::Extend { by, stale } => Msg::Extend(ExtendLease {
                shard: item.shard,
                epoch: epoch(stale),
                lease_id: item.lease_id.clone(),
                extend_by: by,
            }),
        }
    }
}

/// One call of any handler.
#[derive(Clone, Debug)]
enum Call {
    Enqueue(EnqueueRequest),
    EnqueueStream(Vec<EnqueueRequest>),
    EnqueueMany(Vec<EnqueueRequest>),
    Stats(String),
    DescribeKey(Option<WorkKey>),
    ListFailing(String, u32),
    /// A Work stream: a valid hello first or not, then what follows.
    Work(bool, Vec<Msg>),
    /// A Work stream that enqueues keys of its own, leases them (or others), and answers
    /// each lease it gets with the next answer.
    Session(Vec<Answer>),
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        3 => enqueue().prop_map(Call::Enqueue),
        1 => collection::vec(enqueue(), 0..4).prop_map(Call::EnqueueStream),
        2 => prop_oneof![
            9 => collection::vec(enqueue(), 0..4),
            1 => Just(vec![EnqueueRequest::default(); 4097]),
        ]
        .prop_map(Call::EnqueueMany),
        1 => text().prop_map(Call::Stats),
        1 => key().prop_map(Call::DescribeKey),
        1 => (text(), prop_oneof![Just(u32::MAX), any::<u32>()])
            .prop_map(|(c, limit)| Call::ListFailing(c, limit)),
        2 => (any::<bool>(), collection::vec(work_message(), 0..6))
            .prop_map(|(hello, messages)| Call::Work(hello, messages)),
        3 => collection::vec(answer(), 1..5).prop_map(Call::Session),
    ]
}

fn work_request(message: Msg) -> WorkRequest {
    WorkRequest {
        request: Some(message),
    }
}

fn hello(worker_id: &str, controllers: &[&str]) -> WorkRequest {
    work_request(Msg::Hello(WorkerHello {
        worker_id: worker_id.into(),
        controllers: controllers.iter().map(|c| (*c).to_owned()).collect(),
    }))
}

/// A batch of one ready key, well formed, in its shard.
fn ready(controller: &str, name: &str) -> EnqueueRequest {
    EnqueueRequest {
        batch_id: 1,
        shard: shard_of(controller, "default", name, SHARDS),
        items: vec![EnqueueItem {
            key: Some(WorkKey {
                controller: controller.into(),
                namespace: "default".into(),
                name: name.into(),
            }),
            ..EnqueueItem::default()
        }],
    }
}

async fn make(client: &mut QueueClient<Channel>, call: Call, case: u32) {
    // Refusals are expected; only the replica's survival is asserted.
    match call {
        Call::Enqueue(request) => drop(client.enqueue(request).await),
        Call::EnqueueStream(requests) => {
            if let Ok(response) = client.enqueue_stream(tokio_stream::iter(requests)).await {
                let mut acks = response.into_inner();
                let _ = tokio::time::timeout(STREAM_READ, async {
                    while let Ok(Some(_)) = acks.message().await {}
                })
                .await;
            }
        }
        Call::EnqueueMany(batches) => {
            drop(client.enqueue_many(EnqueueManyRequest { batches }).await)
        }
        Call::Stats(controller) => drop(client.stats(StatsRequest { controller }).await),
        Call::DescribeKey(key) => drop(client.describe_key(DescribeKeyRequest { key }).await),
        Call::ListFailing(controller, limit) => drop(
            client
                .list_failing(ListFailingRequest { controller, limit })
                .await,
        ),
        Call::Work(valid, messages) => {
            let first = valid.then(|| hello("fuzz", &[RS]));
            let requests: Vec<WorkRequest> = first
                .into_iter()
                .chain(messages.into_iter().map(work_request))
                .collect();
            if let Ok(response) = client.work(tokio_stream::iter(requests)).await {
                let mut stream = response.into_inner();
                let _ = tokio::time::timeout(STREAM_READ, async {
                    while let Ok(Some(_)) = stream.message().await {}
                })
                .await;
            }
        }
        Call::Session(answers) => session(client, answers, case).await,
    }
}

async fn session(client: &mut QueueClient<Channel>, answers: Vec<Answer>, case: u32) {
    for n in 0..answers.len() {
        drop(client.enqueue(ready(RS, &format!("s{case}-{n}"))).await);
    }
    let (tx, rx) = mpsc::channel(answers.len() + 2);
    tx.send(hello("session", &[RS])).await.unwrap();
    let credit = u32::try_from(answers.len()).unwrap();
    tx.send(work_request(Msg::Credit(Credit { items: credit })))
        .await
        .unwrap();
    let Ok(response) = client.work(ReceiverStream::new(rx)).await else {
        return;
    };
    let mut stream = response.into_inner();
    let mut answers = answers.into_iter();
    // One reply per answer (an acknowledgement or an extension's answer), and one item per
    // credit; the stream ends early when an answer is refused as invalid.
    let mut expected = 2 * credit;
    while expected > 0 {
        let Ok(Ok(Some(message))) = tokio::time::timeout(STREAM_READ, stream.message()).await
        else {
            break;
        };
        expected -= 1;
        if let Some(Reply::Item(item)) = message.response {
            let Some(answer) = answers.next() else { break };
            if tx.send(work_request(answer.to(&item))).await.is_err() {
                break;
            }
        }
    }
}

async fn start() -> (switchyard_runtime::ShutdownHandle, SocketAddr, SocketAddr) {
    let flags = ["--drain-grace=1s".to_owned()]
        .into_iter()
        .chain(Pki::shared().flags(Role::Queue));
    let (rt, addr) = switchyard_queue::Args::start_local(SHARDS, &[RS, KEPT], flags)
        .await
        .unwrap();
    let (shutdown, admin) = (rt.shutdown_handle(), rt.admin_addr());
    tokio::spawn(rt.run());
    (shutdown, addr, admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbitrary_calls_from_every_identity_leave_the_replica_serving() {
    let panics = Panics::count();
    let seed = fuzz::seed();
    let (shutdown, addr, admin) = start().await;
    let mut clients = Vec::new();
    for role in Role::ALL {
        let channel = Pki::shared()
            .channel(role, Role::Queue, addr)
            .await
            .unwrap();
        clients.push(QueueClient::new(channel));
    }
    let reconciler = Role::ALL
        .iter()
        .position(|r| *r == Role::Reconciler)
        .unwrap();
    let operator = Role::ALL.iter().position(|r| *r == Role::Operator).unwrap();
    let kept: Vec<String> = (0..20).map(|n| format!("kept-{n}")).collect();
    for name in &kept {
        clients[reconciler]
            .enqueue(ready(KEPT, name))
            .await
            .unwrap();
    }

    let mut runner = TestRunner::new(ProptestConfig {
        cases: CASES,
        rng_seed: RngSeed::Fixed(seed),
        ..ProptestConfig::default()
    });
    let strategy = (0..Role::ALL.len(), call());
    for case in 0..CASES {
        let (who, call) = strategy.new_tree(&mut runner).unwrap().current();
        let shown = format!("{call:?}");
        if tokio::time::timeout(CALL_LIMIT, make(&mut clients[who], call, case))
            .await
            .is_err()
        {
            panic!(
                "case {case} as {:?} hung (panics: {:?}): {shown:.2000}",
                Role::ALL[who],
                panics.so_far()
            );
        }
    }

    // Nothing panicked, the replica is alive with no task restarted, and it kept every key
    // it had accepted.
    let (count, first) = panics.so_far();
    assert_eq!(count, 0, "{first:?}");
    let livez = reqwest::get(format!("http://{admin}/livez")).await.unwrap();
    assert_eq!(livez.status(), 200, "{:?}", livez.text().await);
    let metrics = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("switchyard_task_restarts_total{") && !l.ends_with(" 0")),
        "{metrics}"
    );
    for name in &kept {
        let described = clients[operator]
            .describe_key(DescribeKeyRequest {
                key: ready(KEPT, name).items[0].key.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_ne!(described.phase(), KeyPhase::Absent, "{name} was lost");
    }

    // And it serves: a well-formed key is leased.
    let mut client = clients[reconciler].clone();
    let name = "after-the-fuzz";
    client.enqueue(ready(RS, name)).await.unwrap();
    let (tx, rx) = mpsc::channel(16);
    tx.send(hello("after", &[RS])).await.unwrap();
    let mut stream = client
        .work(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    // Keys the fuzz enqueued may come first: lease until ours does.
    let leased = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            tx.send(work_request(Msg::Credit(Credit { items: 1 })))
                .await
                .unwrap();
            match stream.message().await.unwrap().unwrap().response {
                Some(Reply::Item(item)) if item.key.as_ref().unwrap().name == name => return,
                _ => {}
            }
        }
    })
    .await;
    assert!(
        leased.is_ok(),
        "the well-formed key was leased after the fuzz"
    );
    shutdown.trigger();
}
