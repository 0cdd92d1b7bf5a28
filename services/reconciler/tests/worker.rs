//! The worker runtime with a scripted controller, a real queue in this process and the real
//! apiserver (the client is built, not used): outcomes, panics, timeouts, lease extension,
//! requeue and drain, observed through what the queue leases next.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    net::SocketAddr,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use switchyard_k8s::Pod;
use switchyard_proto::{
    common::v1::WorkKey,
    queue::v1::{EnqueueItem, EnqueueRequest, Priority},
};
use switchyard_runtime::Role;
use switchyard_sdk::{Action, Context, Controller, Registry, Request, Result};
use switchyard_testenv::ControlPlane;
use tokio::sync::mpsc;

const SCRIPTED: &str = "example.com/v1/Scripted";

static REQUEUED: AtomicBool = AtomicBool::new(false);
static RETRIED: AtomicBool = AtomicBool::new(false);
static WROTE: AtomicBool = AtomicBool::new(false);

/// Records `"<name>#<attempt>"` when a reconcile starts and `"<name> finished"` when it
/// ends; behaves by the key's name.
struct Scripted(mpsc::UnboundedSender<String>);

impl Controller for Scripted {
    fn name(&self) -> &str {
        SCRIPTED
    }

    async fn reconcile(&self, ctx: &Context, request: &Request) -> Result {
        {
            let name = request.name.as_str();
            let _ = self.0.send(format!("{name}#{}", request.attempt));
            let first = request.attempt == 1;
            let action = match name {
                // Unwinds without the panic hook, whose backtrace (RUST_BACKTRACE=1) can take
                // longer than the reconcile timeout to print on a loaded machine.
                "panics" if first => std::panic::resume_unwind(Box::new("scripted panic")),
                "hangs" if first => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Action::Done
                }
                "fails" | "terminal" if first => {
                    return Err(switchyard_sdk::Error::Other(name.into()));
                }
                // Requeued by the error policy, it comes back as a first attempt: fail once.
                "retry-later" if !Self::once(&RETRIED) => {
                    return Err(switchyard_sdk::Error::Other(name.into()));
                }
                n if n.starts_with("slow") => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Action::Done
                }
                "requeue" if !self.requeued() => Action::RequeueAfter(Duration::from_millis(300)),
                // The first time, reports a write of a Pod at version 77, as a controller
                // reports what it writes; after that, says what its reads start from.
                "floor" if !Self::once(&WROTE) => {
                    let mut written = Pod::default();
                    written.metadata.namespace = Some("ns".to_owned());
                    written.metadata.resource_version = Some("77".to_owned());
                    ctx.cache.wrote(&written);
                    Action::Done
                }
                "floor" => {
                    let floor = ctx.cache.observed();
                    let (kinds, here) = (floor.kinds.get("v1/Pod"), floor.namespace.get("v1/Pod"));
                    // The queue took its shards when the test started.
                    let moved = ctx.cache.may_lack_writes();
                    let _ = self.0.send(format!(
                        "floor reads Pods at {kinds:?}, {here:?} in ns; moved lately: {moved}"
                    ));
                    Action::Done
                }
                _ => Action::Done,
            };
            let _ = self.0.send(format!("{name} finished"));
            Ok(action)
        }
    }

    fn error_policy(&self, error: &switchyard_sdk::Error, _: &Request) -> Action {
        Self::policy(error)
    }
}

impl Scripted {
    /// The error policy: "terminal" is forgotten, "retry-later" looks again after a fixed
    /// delay, any other failure backs off.
    fn policy(error: &switchyard_sdk::Error) -> Action {
        match error.to_string().as_str() {
            "terminal" => Action::forget(),
            "retry-later" => Action::requeue(Duration::from_millis(300)),
            _ => Action::Backoff,
        }
    }

    fn requeued(&self) -> bool {
        Self::once(&REQUEUED)
    }

    /// False the first time, true after.
    fn once(flag: &AtomicBool) -> bool {
        flag.swap(true, Ordering::SeqCst)
    }
}

async fn enqueue(queue: SocketAddr, name: &str) {
    let mut client = support::queue_client(Role::Watcher, queue).await;
    client
        .enqueue(EnqueueRequest {
            batch_id: 1,
            shard: switchyard_work::shard::shard_of(SCRIPTED, "ns", name, support::SHARDS),
            items: vec![EnqueueItem {
                key: Some(WorkKey {
                    controller: SCRIPTED.into(),
                    namespace: "ns".into(),
                    name: name.into(),
                }),
                priority: Priority::Normal as i32,
                delay: None,
                trace_context: Default::default(),
                observed_at: None,
            }],
        })
        .await
        .unwrap();
}

struct Events(mpsc::UnboundedReceiver<String>);

impl Events {
    async fn expect(&mut self, event: &str, within: Duration) {
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.0.recv()).await {
                Ok(Some(got)) if got == event => return,
                Ok(Some(got)) => seen.push(got),
                _ => panic!("no {event:?} within {within:?}; saw {seen:?}"),
            }
        }
    }

    async fn collect(&mut self, during: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + during;
        let mut seen = Vec::new();
        while let Ok(Some(got)) = tokio::time::timeout_at(deadline, self.0.recv()).await {
            seen.push(got);
        }
        seen
    }

    async fn expect_none(&mut self, event: &str, during: Duration) {
        let deadline = tokio::time::Instant::now() + during;
        while let Ok(Some(got)) = tokio::time::timeout_at(deadline, self.0.recv()).await {
            assert_ne!(got, event, "{event:?} happened");
        }
    }
}

async fn worker(
    plane: &ControlPlane,
    queue: SocketAddr,
    extra: &[&str],
) -> (support::InProcess, Events) {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut registry = Registry::default();
    registry.register(Scripted(tx));
    // Nothing reads the cache here.
    let watcher: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let process = support::reconciler(plane, registry, queue, watcher, extra).await;
    process.wait_ready(support::WITHIN).await;
    (process, Events(rx))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_panics_and_timeouts_are_failed_outcomes_and_the_worker_lives_on() {
    let plane = ControlPlane::shared().expect("control plane");
    let queue = support::queue(&[SCRIPTED], &["--lease-timeout=2s"]).await;
    let (reconciler, mut events) = worker(
        plane,
        queue.grpc(),
        &["--reconcile-timeout=1s", "--concurrency=4"],
    )
    .await;
    let within = Duration::from_secs(10);

    // A failed outcome makes the queue lease the key again as attempt 2.
    enqueue(queue.grpc(), "fails").await;
    events.expect("fails#1", within).await;
    events.expect("fails#2", within).await;

    // The error policy decides: a failure it forgets is not retried, one it requeues comes
    // back after the delay as a first attempt (its failure not counted), and the key's
    // failures are then forgotten.
    enqueue(queue.grpc(), "terminal").await;
    events.expect("terminal#1", within).await;
    events
        .expect_none("terminal#2", Duration::from_secs(1))
        .await;
    enqueue(queue.grpc(), "retry-later").await;
    events.expect("retry-later#1", within).await;
    let start = std::time::Instant::now();
    events.expect("retry-later#1", within).await;
    assert!(
        start.elapsed() >= Duration::from_millis(250),
        "{:?}",
        start.elapsed()
    );

    // A panic is a failed outcome, and the worker lives on.
    enqueue(queue.grpc(), "panics").await;
    events.expect("panics#1", within).await;
    events.expect("panics#2", within).await;
    events.expect("panics finished", within).await;

    // Past --reconcile-timeout the reconcile is abandoned and reported failed (long before
    // the 2 s lease would have expired).
    enqueue(queue.grpc(), "hangs").await;
    events.expect("hangs#1", within).await;
    let start = std::time::Instant::now();
    events.expect("hangs#2", within).await;
    assert!(
        start.elapsed() < Duration::from_millis(1800),
        "{:?}",
        start.elapsed()
    );

    // RequeueAfter brings the key back after the delay, as a first attempt.
    enqueue(queue.grpc(), "requeue").await;
    events.expect("requeue#1", within).await;
    events.expect("requeue finished", within).await;
    events.expect("requeue#1", within).await;

    // Every outcome is counted: by result, and errors, panics and timeouts on their own.
    for (series, count) in [
        (
            format!(r#"switchyard_reconcile_total{{controller="{SCRIPTED}",result="error"}}"#),
            5.0,
        ),
        (
            format!(
                r#"switchyard_reconcile_total{{controller="{SCRIPTED}",result="requeue_after"}}"#
            ),
            1.0,
        ),
        (
            format!(r#"switchyard_reconcile_errors_total{{controller="{SCRIPTED}"}}"#),
            5.0,
        ),
        (
            format!(r#"switchyard_reconcile_panics_total{{controller="{SCRIPTED}"}}"#),
            1.0,
        ),
        (
            format!(r#"switchyard_reconcile_timeouts_total{{controller="{SCRIPTED}"}}"#),
            1.0,
        ),
        (
            format!(r#"switchyard_active_workers{{controller="{SCRIPTED}"}}"#),
            0.0,
        ),
    ] {
        assert_eq!(reconciler.metric(&series).await, count, "{series}");
    }

    reconciler.stop().await;
    queue.stop().await;
}

/// The lease's read floor reaches the reconcile's reads: what the key's last reconcile wrote,
/// reported with its outcome, is where the next one's reads start, on any watcher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_reads_from_where_the_last_one_of_its_shard_wrote() {
    let plane = ControlPlane::shared().expect("control plane");
    let queue = support::queue(&[SCRIPTED], &[]).await;
    let (reconciler, mut events) = worker(plane, queue.grpc(), &[]).await;
    let within = Duration::from_secs(10);

    enqueue(queue.grpc(), "floor").await;
    events.expect("floor finished", within).await;
    enqueue(queue.grpc(), "floor").await;
    events
        .expect(
            "floor reads Pods at Some(77), Some(77) in ns; moved lately: true",
            within,
        )
        .await;

    reconciler.stop().await;
    queue.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_longer_than_the_lease_keeps_it_by_extending() {
    let plane = ControlPlane::shared().expect("control plane");
    let queue = support::queue(&[SCRIPTED], &["--lease-timeout=2s"]).await;
    let (reconciler, mut events) = worker(plane, queue.grpc(), &[]).await;
    let within = Duration::from_secs(10);
    // 5 s with a 2 s lease: extensions keep it; an expired lease would come back as #2.
    enqueue(queue.grpc(), "slow").await;
    events.expect("slow#1", within).await;
    let seen = events.collect(Duration::from_secs(8)).await;
    assert_eq!(seen, ["slow finished"], "leased once, finished once");
    reconciler.stop().await;
    queue.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_in_flight_reconciles_and_returns_unstarted_leases() {
    let plane = ControlPlane::shared().expect("control plane");
    let queue = support::queue(&[SCRIPTED], &["--lease-timeout=60s"]).await;
    let (reconciler, mut events) = worker(
        plane,
        queue.grpc(),
        &["--concurrency=2", "--drain-timeout=20s"],
    )
    .await;
    let within = Duration::from_secs(10);

    enqueue(queue.grpc(), "slow-drain").await;
    events.expect("slow-drain#1", within).await;
    reconciler.trigger_shutdown();
    // Leased to the draining worker (one credit is left) but not started.
    enqueue(queue.grpc(), "after-drain").await;
    events.expect("slow-drain finished", within).await;
    reconciler.stopped(within).await;
    events
        .expect_none("after-drain#1", Duration::from_millis(200))
        .await;

    // The next worker gets the unstarted key at once, as a first attempt (a lease that had
    // to expire would take 60 s and come back as attempt 2), and never the finished one.
    let (next, mut events) = worker(plane, queue.grpc(), &[]).await;
    events.expect("after-drain#1", within).await;
    events
        .expect_none("slow-drain#1", Duration::from_secs(1))
        .await;
    next.stop().await;
    queue.stop().await;
}
