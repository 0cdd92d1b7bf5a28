//! Every gRPC handler of the queue, driven with arbitrary messages by every identity of the
//! installation: no message panics a task or stops the replica, which still serves a
//! well-formed key afterwards. Bounded (a few hundred cases), so it runs in `make test`.

#![allow(clippy::unwrap_used)]

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use clap::Parser;
use proptest::{collection, option, prelude::*, strategy::ValueTree, test_runner::TestRunner};
use switchyard_proto::{
    common::v1::WorkKey,
    queue::v1::{
        Credit, DescribeKeyRequest, Done, EnqueueItem, EnqueueManyRequest, EnqueueRequest,
        ExtendLease, Failed, Forget, ListFailingRequest, Outcome, RequeueAfter, StatsRequest,
        WorkRequest, WorkerHello, outcome, queue_client::QueueClient, work_request::Request as Msg,
        work_response::Response as Reply,
    },
};
use switchyard_queue_core::shard::shard_of;
use switchyard_runtime::Role;
use switchyard_testenv::Pki;
use tonic::transport::Channel;

const RS: &str = "apps/v1/ReplicaSet";
const SHARDS: u32 = 4;
/// Cases run: each is one call (or one Work stream of several messages) as one identity.
const CASES: u32 = 2000;
/// How long a Work stream's answers are read before it is dropped.
const STREAM_READ: Duration = Duration::from_millis(50);
const ROLES: [Role; 6] = [
    Role::Watcher,
    Role::Queue,
    Role::Reconciler,
    Role::Elector,
    Role::Observer,
    Role::Operator,
];

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

fn work_message() -> impl Strategy<Value = Msg> {
    let result = prop_oneof![
        Just(outcome::Result::Done(Done {})),
        Just(outcome::Result::Forget(Forget {})),
        text().prop_map(|reason| outcome::Result::Failed(Failed { reason })),
        duration().prop_map(|delay| outcome::Result::RequeueAfter(RequeueAfter { delay })),
    ];
    prop_oneof![
        (text(), collection::vec(text(), 0..3)).prop_map(|(worker_id, controllers)| {
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
            option::of(result),
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

/// One call of any handler.
#[derive(Clone, Debug)]
enum Call {
    Enqueue(EnqueueRequest),
    EnqueueMany(Vec<EnqueueRequest>),
    Stats(String),
    DescribeKey(Option<WorkKey>),
    ListFailing(String, u32),
    /// A Work stream: a valid hello first or not, then what follows.
    Work(bool, Vec<Msg>),
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        enqueue().prop_map(Call::Enqueue),
        collection::vec(enqueue(), 0..4).prop_map(Call::EnqueueMany),
        text().prop_map(Call::Stats),
        key().prop_map(Call::DescribeKey),
        (text(), prop_oneof![Just(u32::MAX), any::<u32>()])
            .prop_map(|(c, limit)| Call::ListFailing(c, limit)),
        (any::<bool>(), collection::vec(work_message(), 0..6))
            .prop_map(|(hello, messages)| Call::Work(hello, messages)),
    ]
}

async fn make(client: &mut QueueClient<Channel>, call: Call) {
    // Refusals are expected; only the replica's survival is asserted.
    match call {
        Call::Enqueue(request) => drop(client.enqueue(request).await),
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
        Call::Work(hello, messages) => {
            let first = hello.then(|| {
                Msg::Hello(WorkerHello {
                    worker_id: "fuzz".into(),
                    controllers: vec![RS.into()],
                })
            });
            let requests: Vec<WorkRequest> = first
                .into_iter()
                .chain(messages)
                .map(|m| WorkRequest { request: Some(m) })
                .collect();
            if let Ok(response) = client.work(tokio_stream::iter(requests)).await {
                let mut stream = response.into_inner();
                let _ = tokio::time::timeout(STREAM_READ, async {
                    while let Ok(Some(_)) = stream.message().await {}
                })
                .await;
            }
        }
    }
}

async fn start() -> (switchyard_runtime::ShutdownHandle, SocketAddr, SocketAddr) {
    let mut args = vec![
        "switchyard-queue".to_owned(),
        "--admin-addr=127.0.0.1:0".into(),
        "--grpc-addr=127.0.0.1:0".into(),
        format!("--shard-count={SHARDS}"),
        format!("--controllers={RS}"),
        "--drain-grace=1s".into(),
    ];
    args.extend(Pki::shared().flags(Role::Queue));
    let (rt, addr) = switchyard_queue::Args::try_parse_from(args)
        .unwrap()
        .start()
        .await
        .unwrap();
    let (shutdown, admin) = (rt.shutdown_handle(), rt.admin_addr());
    tokio::spawn(rt.run());
    (shutdown, addr, admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbitrary_calls_from_every_identity_leave_the_replica_serving() {
    let (shutdown, addr, admin) = start().await;
    let mut clients = Vec::new();
    for role in ROLES {
        let channel = Pki::shared()
            .channel(role, Role::Queue, addr)
            .await
            .unwrap();
        clients.push(QueueClient::new(channel));
    }
    let mut runner = TestRunner::new(ProptestConfig {
        cases: CASES,
        ..ProptestConfig::default()
    });
    let strategy = (0..ROLES.len(), call());
    for _ in 0..CASES {
        let (who, call) = strategy.new_tree(&mut runner).unwrap().current();
        make(&mut clients[who], call).await;
    }

    // Alive, no task restarted or failed, and serving.
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
    let mut reconciler = clients[2].clone();
    let name = "after-the-fuzz";
    reconciler
        .enqueue(EnqueueRequest {
            batch_id: 1,
            shard: shard_of(RS, "default", name, SHARDS),
            items: vec![EnqueueItem {
                key: Some(WorkKey {
                    controller: RS.into(),
                    namespace: "default".into(),
                    name: name.into(),
                }),
                ..EnqueueItem::default()
            }],
        })
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tx.send(WorkRequest {
        request: Some(Msg::Hello(WorkerHello {
            worker_id: "after".into(),
            controllers: vec![RS.into()],
        })),
    })
    .await
    .unwrap();
    let mut stream = reconciler
        .work(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    // Keys the fuzz enqueued may come first: lease until ours does.
    let leased = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            tx.send(WorkRequest {
                request: Some(Msg::Credit(Credit { items: 1 })),
            })
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
