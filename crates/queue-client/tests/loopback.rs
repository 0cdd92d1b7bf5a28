//! The client against the real queue service, in this process over loopback: keys pushed to
//! the Enqueuer come out of a WorkSession as leases, and outcomes, extensions and credits do
//! what the protocol promises; and an enqueuer facing a replica from before `EnqueueMany`.

#![allow(clippy::unwrap_used)]

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use switchyard_proto::queue::v1::{
    DescribeKeyRequest, DescribeKeyResponse, EnqueueAck, EnqueueManyRequest, EnqueueManyResponse,
    EnqueueRequest, EnqueueResponse, ListFailingRequest, ListFailingResponse, StatsRequest,
    StatsResponse, WorkRequest, WorkResponse, queue_server,
};
use switchyard_queue_client::{
    EnqueueMetrics, Enqueuer, Error, Event, Lease, MAX_CREDIT, Outcome, Priority, WorkKey,
    WorkSession,
};
use switchyard_runtime::{Role, ShutdownHandle};
use switchyard_shards::ShardView;
use switchyard_testenv::Pki;
use tokio::sync::watch;

const RS: &str = "apps/v1/ReplicaSet";
const SHARDS: u32 = 4;
/// How long a test waits for something the queue should do at once.
const PATIENCE: Duration = Duration::from_secs(10);

async fn queue() -> (SocketAddr, ShutdownHandle) {
    let flags = [
        "--log-level=warn".to_owned(),
        "--retry-base-delay=10ms".into(),
    ]
    .into_iter()
    .chain(Pki::shared().flags(Role::Queue));
    let (rt, addr) = switchyard_queue::Args::start_local(SHARDS, &[RS], flags)
        .await
        .unwrap();
    let shutdown = rt.shutdown_handle();
    tokio::spawn(rt.run());
    (addr, shutdown)
}

#[derive(Debug, Default)]
struct Counts {
    sent: AtomicUsize,
    dropped: AtomicUsize,
}

#[derive(Debug, Clone, Default)]
struct Counted(Arc<Counts>);

impl EnqueueMetrics for Counted {
    fn pending(&self, _: usize) {}
    fn sent(&self, keys: usize) {
        self.0.sent.fetch_add(keys, Ordering::Relaxed);
    }
    fn dropped(&self, keys: usize) {
        self.0.dropped.fetch_add(keys, Ordering::Relaxed);
    }
    fn retried(&self) {}
}

/// An enqueuer sending to the one queue at `addr`, as a watcher.
fn enqueuer(addr: SocketAddr, metrics: Counted) -> (Arc<Enqueuer>, ShutdownHandle) {
    enqueuer_to(ShardView::single(&addr.to_string(), SHARDS), metrics)
}

/// An enqueuer sending to the owners `view` names, as a watcher.
fn enqueuer_to(view: ShardView, metrics: Counted) -> (Arc<Enqueuer>, ShutdownHandle) {
    let enqueuer = Arc::new(Enqueuer::new(
        1000,
        SHARDS,
        metrics,
        Pki::shared().dialer(Role::Watcher),
    ));
    let (_tx, view) = watch::channel(Some(Arc::new(view)));
    let (stop, drain) = switchyard_runtime::drain_channel();
    tokio::spawn({
        let enqueuer = enqueuer.clone();
        async move {
            let _keep = _tx;
            enqueuer.run(view, drain).await
        }
    });
    (enqueuer, stop)
}

/// How a reconciler dials the queue.
fn reconciler() -> switchyard_runtime::Dialer {
    Pki::shared().dialer(Role::Reconciler)
}

async fn open(addr: SocketAddr, credits: u32) -> WorkSession {
    WorkSession::open(
        &reconciler(),
        &addr.to_string(),
        "test-worker",
        vec![RS.into()],
        credits,
    )
    .await
    .unwrap()
}

async fn next(session: &mut WorkSession) -> Event {
    tokio::time::timeout(PATIENCE, session.next())
        .await
        .expect("an event in time")
        .unwrap()
        .expect("the stream stays open")
}

async fn next_lease(session: &mut WorkSession) -> Lease {
    loop {
        if let Event::Lease(lease) = next(session).await {
            return *lease;
        }
    }
}

/// Whether a lease arrives within `wait`.
async fn leased_within(session: &mut WorkSession, wait: Duration) -> Option<Lease> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, session.next()).await {
            Err(_) => return None,
            Ok(event) => {
                if let Some(Event::Lease(lease)) = event.unwrap() {
                    return Some(*lease);
                }
            }
        }
    }
}

/// Leases `count` keys, each a first attempt of its own shard with a deadline ahead, and
/// reports them done; the keys, sorted.
async fn reconcile(session: &mut WorkSession, count: usize) -> Vec<WorkKey> {
    let mut leased = Vec::new();
    for _ in 0..count {
        let lease = next_lease(session).await;
        assert_eq!(lease.attempt, 1);
        assert_eq!(lease.shard, lease.key.shard(SHARDS));
        assert!(lease.remaining().is_some(), "a lease has a deadline ahead");
        session
            .replies()
            .complete(&lease, Outcome::Done, Duration::from_millis(1))
            .unwrap();
        leased.push(lease.key);
    }
    leased.sort();
    leased
}

#[tokio::test]
async fn pushed_keys_come_out_as_leases_and_invalid_ones_are_dropped() {
    let (addr, _queue) = queue().await;
    let counts = Counted::default();
    let (enqueuer, _stop) = enqueuer(addr, counts.clone());
    let mut session = open(addr, 10).await;
    let keys = [
        WorkKey::new(RS, "default", "web"),
        WorkKey::new(RS, "", "cluster-scoped"),
    ];
    enqueuer
        .push(keys.clone(), Priority::Normal, None, None)
        .await;
    let leased = reconcile(&mut session, 2).await;
    let mut expected = keys.to_vec();
    expected.sort();
    assert_eq!(leased, expected, "namespace and name arrive apart, as sent");
    // A name with a slash is no object's name: the queue refuses the key as invalid, and a
    // request with it as a whole. Pushed with three valid keys of its shard, only it is lost.
    let bad = WorkKey::new(RS, "default", "x/y");
    let mut beside: Vec<WorkKey> = (0..)
        .map(|i| WorkKey::new(RS, "default", format!("beside-{i}")))
        .filter(|k| k.shard(SHARDS) == bad.shard(SHARDS))
        .take(3)
        .collect();
    beside.sort();
    enqueuer
        .push(
            beside.iter().cloned().chain([bad]),
            Priority::Low,
            None,
            None,
        )
        .await;
    let leased = reconcile(&mut session, beside.len()).await;
    assert_eq!(leased, beside, "the valid keys beside the invalid one");
    tokio::time::timeout(PATIENCE, async {
        while counts.0.dropped.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the invalid key is dropped");
    assert_eq!(counts.0.dropped.load(Ordering::Relaxed), 1);
    assert_eq!(counts.0.sent.load(Ordering::Relaxed), 2 + beside.len());
    assert_eq!(enqueuer.pending(), 0);
}

/// A queue replica that is down holds back only its own shards' keys: each shard backs off
/// on its own, so a key of a live replica's shard goes at once, however long another
/// shard's sends have been failing, and the failing shard's key is kept.
/// Keys pushed one after another, as an informer pushes them in a burst of watch events, are
/// each taken by the sender before the next push while the replica has a call free: a push
/// lets the sender run before the pusher goes on, and a key of a shard with a batch out does
/// not wait for its answer.
/// (A test runtime has one thread, so nothing else could take them.)
#[tokio::test]
async fn a_burst_of_pushes_goes_out_as_calls_free_up() {
    let (addr, stop) = queue().await;
    let (enqueuer, enqueuer_stop) = enqueuer(addr, Counted::default());
    // Two keys of every shard, the second of each pushed while the first's request is out.
    let keys: Vec<WorkKey> = (0..SHARDS)
        .flat_map(|shard| {
            (0..)
                .map(|i| WorkKey::new(RS, "ns", format!("burst-{i}").as_str()))
                .filter(move |k| k.shard(SHARDS) == shard)
                .take(2)
        })
        .collect();
    let mut waiting = Vec::new();
    for key in &keys {
        enqueuer
            .push([key.clone()], Priority::Normal, None, None)
            .await;
        waiting.push(enqueuer.pending());
    }
    // Each key is taken as it is pushed while the replica has a call free (two at once, the
    // enqueuer's cap): a pusher that kept its thread, or a sender that waited for its own
    // shard's batch, would leave the first keys waiting. The keys pushed while both calls
    // are out wait, and go together in the next.
    assert_eq!(
        waiting[..2],
        [0, 0],
        "keys left waiting after each push: {waiting:?}"
    );
    let mut session = open(addr, 100).await;
    let mut expected = keys.clone();
    expected.sort();
    assert_eq!(reconcile(&mut session, keys.len()).await, expected);

    enqueuer_stop.trigger();
    stop.trigger();
}

#[tokio::test]
async fn a_replica_that_is_down_holds_back_only_its_own_shards() {
    let (addr, stop) = queue().await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut view = ShardView::single(&addr.to_string(), SHARDS);
    let mut owner = view.owners[0].clone().unwrap();
    owner.address = dead.to_string().into();
    view.owners[0] = Some(owner);
    let key_of_shard = |shard: u32, tag: &str| {
        (0..)
            .map(|i| WorkKey::new(RS, "ns", format!("{tag}-{i}").as_str()))
            .find(|k| k.shard(SHARDS) == shard)
            .unwrap()
    };
    let counts = Counted::default();
    let (enqueuer, enqueuer_stop) = enqueuer_to(view, counts.clone());
    let mut session = open(addr, 100).await;

    enqueuer
        .push([key_of_shard(0, "stranded")], Priority::Normal, None, None)
        .await;
    // Long enough for a shared backoff to have grown to its 2 s cap.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for i in 0..8 {
        let key = key_of_shard(1 + i % (SHARDS - 1), &format!("live{i}"));
        enqueuer
            .push([key.clone()], Priority::Normal, None, None)
            .await;
        let lease = leased_within(&mut session, Duration::from_secs(1))
            .await
            .unwrap_or_else(|| panic!("{key:?} was not leased within 1 s"));
        assert_eq!(lease.key, key);
        session
            .replies()
            .complete(&lease, Outcome::Done, Duration::from_millis(1))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(enqueuer.pending(), 1, "the down replica's key is kept");
    assert_eq!(counts.0.dropped.load(Ordering::Relaxed), 0);

    enqueuer_stop.trigger();
    stop.trigger();
}

#[tokio::test]
async fn outcomes_are_applied_refused_retried_and_extended_as_the_queue_promises() {
    let (addr, _queue) = queue().await;
    let (enqueuer, _stop) = enqueuer(addr, Counted::default());
    let mut session = open(addr, 10).await;
    let replies = session.replies().clone();
    // When the watcher received the event behind the add goes with the lease, and with its
    // retry.
    let observed = std::time::SystemTime::now() - Duration::from_millis(1_234);
    enqueuer
        .push(
            [WorkKey::new(RS, "ns", "a")],
            Priority::Normal,
            None,
            Some(observed),
        )
        .await;

    // Extended, then failed: leased again, as the second attempt.
    let lease = next_lease(&mut session).await;
    assert_eq!(lease.observed_at, Some(observed));
    replies.extend(&lease, Duration::from_secs(120)).unwrap();
    match next(&mut session).await {
        Event::Extended { lease_id, deadline } => {
            assert_eq!(lease_id, lease.id);
            assert!(deadline > lease.deadline, "the deadline moved on");
        }
        other => panic!("expected the extension, got {other:?}"),
    }
    replies
        .complete(&lease, Outcome::Failed("scripted".into()), Duration::ZERO)
        .unwrap();
    assert_eq!(
        next(&mut session).await,
        Event::Applied {
            lease_id: lease.id.clone()
        }
    );
    let retry = next_lease(&mut session).await;
    assert_eq!((retry.key.clone(), retry.attempt), (lease.key.clone(), 2));
    assert_eq!(
        retry.observed_at,
        Some(observed),
        "the retry answers the same event"
    );

    // An outcome for a lease already answered is refused, and says so.
    replies
        .complete(&lease, Outcome::Done, Duration::ZERO)
        .unwrap();
    assert!(matches!(
        next(&mut session).await,
        Event::Refused { lease_id, .. } if lease_id == lease.id
    ));

    // Requeue after a delay: leased again once it passed, failures forgotten.
    replies
        .complete(
            &retry,
            Outcome::RequeueAfter(Duration::from_millis(200)),
            Duration::ZERO,
        )
        .unwrap();
    let again = next_lease(&mut session).await;
    assert_eq!(again.attempt, 1);

    // Forget: gone for good.
    replies
        .complete(&again, Outcome::Forget, Duration::ZERO)
        .unwrap();
    assert!(
        leased_within(&mut session, Duration::from_millis(500))
            .await
            .is_none()
    );
}

#[tokio::test]
async fn credits_bound_the_leases_and_large_grants_are_split() {
    let (addr, _queue) = queue().await;
    let (enqueuer, _stop) = enqueuer(addr, Counted::default());
    let keys: Vec<WorkKey> = (0..3)
        .map(|i| WorkKey::new(RS, "ns", format!("k{i}")))
        .collect();
    enqueuer.push(keys, Priority::Normal, None, None).await;

    let mut session = open(addr, 1).await;
    let first = next_lease(&mut session).await;
    assert!(
        leased_within(&mut session, Duration::from_millis(300))
            .await
            .is_none(),
        "one credit, one lease"
    );
    session.replies().credit(1).unwrap();
    let second = next_lease(&mut session).await;
    assert_ne!(first.key, second.key);

    // More than one message may grant: sent as several, so the queue keeps the stream.
    let mut wide = open(addr, MAX_CREDIT + 5).await;
    session.close(Duration::from_secs(1)).await;
    let mut seen = 0;
    while let Some(lease) = leased_within(&mut wide, Duration::from_secs(2)).await {
        wide.replies()
            .complete(&lease, Outcome::Done, Duration::ZERO)
            .unwrap();
        seen += 1;
        if seen == 3 {
            break;
        }
    }
    assert_eq!(seen, 3, "the closed session's leases went to the other one");
}

#[tokio::test]
async fn refusals_are_typed_errors() {
    let (addr, _queue) = queue().await;
    let refused =
        WorkSession::open(&reconciler(), &addr.to_string(), "w", vec![" ".into()], 1).await;
    match refused {
        Err(Error::Invalid(message)) => assert!(
            message.contains("hello.controllers[0]: must not be empty"),
            "{message}"
        ),
        other => panic!("expected an invalid-argument error, got {other:?}"),
    }
    let unreachable = WorkSession::open(&reconciler(), "127.0.0.1:1", "w", vec![], 1).await;
    assert!(matches!(unreachable, Err(Error::Unavailable(_))));
    assert!(matches!(
        WorkSession::open(&reconciler(), "not a host", "w", vec![], 1).await,
        Err(Error::InvalidAddress { .. })
    ));
}

/// A queue replica from before `EnqueueMany`: a gRPC server with the queue's service in which
/// only `Enqueue` does anything (it records each batch's shard and size) and every other
/// method answers UNIMPLEMENTED, as a server without the method's route does.
#[derive(Clone, Default)]
struct OldReplica {
    batches: Arc<std::sync::Mutex<Vec<(u32, usize)>>>,
}

type Unimplemented<T> =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, tonic::Status>> + Send + 'static>>;

#[tonic::async_trait]
impl queue_server::Queue for OldReplica {
    async fn enqueue(
        &self,
        request: tonic::Request<EnqueueRequest>,
    ) -> Result<tonic::Response<EnqueueResponse>, tonic::Status> {
        let request = request.into_inner();
        let keys = request.items.len();
        self.batches.lock().unwrap().push((request.shard, keys));
        Ok(tonic::Response::new(EnqueueResponse {
            batch_id: request.batch_id,
            added: keys as u32,
            coalesced: 0,
        }))
    }
    type EnqueueStreamStream = Unimplemented<EnqueueAck>;
    async fn enqueue_stream(
        &self,
        _: tonic::Request<tonic::Streaming<EnqueueRequest>>,
    ) -> Result<tonic::Response<Self::EnqueueStreamStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("EnqueueStream"))
    }
    async fn enqueue_many(
        &self,
        _: tonic::Request<EnqueueManyRequest>,
    ) -> Result<tonic::Response<EnqueueManyResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("EnqueueMany"))
    }
    type WorkStream = Unimplemented<WorkResponse>;
    async fn work(
        &self,
        _: tonic::Request<tonic::Streaming<WorkRequest>>,
    ) -> Result<tonic::Response<Self::WorkStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("Work"))
    }
    async fn stats(
        &self,
        _: tonic::Request<StatsRequest>,
    ) -> Result<tonic::Response<StatsResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("Stats"))
    }
    async fn describe_key(
        &self,
        _: tonic::Request<DescribeKeyRequest>,
    ) -> Result<tonic::Response<DescribeKeyResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("DescribeKey"))
    }
    async fn list_failing(
        &self,
        _: tonic::Request<ListFailingRequest>,
    ) -> Result<tonic::Response<ListFailingResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("ListFailing"))
    }
}

#[tokio::test]
async fn a_replica_without_enqueue_many_is_sent_a_batch_per_enqueue() {
    let old = OldReplica::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(queue_server::QueueServer::new(old.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let counted = Counted::default();
    let enqueuer = Arc::new(Enqueuer::new(
        1000,
        SHARDS,
        counted.clone(),
        switchyard_runtime::Dialer::plaintext(),
    ));
    let (_tx, view) = watch::channel(Some(Arc::new(ShardView::single(&addr.to_string(), SHARDS))));
    let (_stop, drain) = switchyard_runtime::drain_channel();
    tokio::spawn({
        let enqueuer = enqueuer.clone();
        async move { enqueuer.run(view, drain).await }
    });
    let keys: Vec<WorkKey> = (0..40)
        .map(|i| WorkKey::new(RS, "ns", format!("old-{i}")))
        .collect();
    enqueuer
        .push(keys.clone(), Priority::Normal, None, None)
        .await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while counted.0.sent.load(Ordering::Relaxed) < keys.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "keys not all sent to the old replica"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Every key arrived once, in batches of one shard each.
    let batches = old.batches.lock().unwrap().clone();
    assert_eq!(
        batches.iter().map(|(_, keys)| keys).sum::<usize>(),
        keys.len()
    );
    let shards: std::collections::HashSet<u32> = batches.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        batches.len(),
        shards.len(),
        "one batch per shard: {batches:?}"
    );
    assert_eq!(enqueuer.pending(), 0);
}
