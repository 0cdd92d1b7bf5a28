//! The actor under paused tokio time: delayed adds, lease timeouts and backoff happen at
//! exactly the configured moments.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use switchyard_queue::{
    actor::{Actor, Add, Command, Completion, Handle, ToWorker},
    metrics::QueueMetrics,
    serving_queue,
};
use switchyard_queue_core::{BackoffConfig, KeySpace, Lease, Outcome, Priority, QueueConfig};
use tokio::sync::mpsc;

const RS: &str = "apps/v1/ReplicaSet";

async fn start() -> (Handle, switchyard_runtime::ShutdownHandle) {
    let config = QueueConfig {
        shard_count: 1,
        lease_timeout: Duration::from_secs(30),
        capacity: 100,
        max_controllers: 1,
        backoff: BackoffConfig {
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
            qps: 0.0,
            burst: 0,
        },
    };
    let queue = serving_queue(config, &[RS], true);
    let metrics = QueueMetrics::register(
        &switchyard_runtime::Metrics::new_for_tests(),
        queue.key_space(),
    );
    let (actor, handle) = Actor::new(queue, metrics, Duration::from_secs(1));
    let (shutdown, drain) = switchyard_runtime::drain_channel();
    tokio::spawn(actor.run(drain));
    (handle, shutdown)
}

fn add(name: &str, delay: Duration) -> Add {
    Add {
        key: KeySpace::new(&[RS], 1)
            .validate_parts(RS, "ns", name)
            .unwrap(),
        priority: Priority::Normal,
        delay,
        origin: Default::default(),
    }
}

async fn worker(handle: &Handle, credits: u32) -> (u64, mpsc::UnboundedReceiver<ToWorker>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let id = handle.connect("timing".into(), vec![], tx).await.unwrap();
    handle
        .send(Command::Credit {
            worker: id,
            items: credits,
        })
        .await
        .unwrap();
    (id, rx)
}

/// The next leased item, and how much (paused) time passed until it came.
async fn next_item(rx: &mut mpsc::UnboundedReceiver<ToWorker>) -> (Lease, Duration) {
    let start = tokio::time::Instant::now();
    loop {
        match rx.recv().await.unwrap() {
            ToWorker::Item(lease) => return (lease, start.elapsed()),
            _ => continue,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_delayed_add_is_leased_when_its_delay_ends() {
    let (handle, _shutdown) = start().await;
    handle
        .enqueue(0, vec![add("later", Duration::from_secs(10))])
        .await
        .unwrap()
        .unwrap();
    let (_, mut rx) = worker(&handle, 1).await;
    let (lease, waited) = next_item(&mut rx).await;
    assert_eq!((lease.key.namespace(), lease.key.name()), ("ns", "later"));
    assert_eq!(waited.as_secs(), 10);
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_lease_times_out_and_the_key_returns_after_backoff() {
    let (handle, _shutdown) = start().await;
    handle
        .enqueue(0, vec![add("slow", Duration::ZERO)])
        .await
        .unwrap()
        .unwrap();
    let (_, mut rx) = worker(&handle, 2).await;
    let (first, _) = next_item(&mut rx).await;
    // Lease timeout (30 s), then the first retry backoff (1 s).
    let (second, waited) = next_item(&mut rx).await;
    assert_eq!(second.key, first.key);
    assert_eq!(second.attempt, 2);
    assert_eq!(waited.as_secs(), 31);
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_exponentially() {
    let (handle, _shutdown) = start().await;
    handle
        .enqueue(0, vec![add("flaky", Duration::ZERO)])
        .await
        .unwrap()
        .unwrap();
    let (worker_id, mut rx) = worker(&handle, 10).await;
    let mut waits = Vec::new();
    for _ in 0..4 {
        let (lease, waited) = next_item(&mut rx).await;
        waits.push(waited.as_secs());
        handle
            .send(Command::Complete {
                worker: worker_id,
                done: Completion {
                    shard: lease.shard(),
                    epoch: lease.epoch,
                    lease: lease.id,
                    outcome: Outcome::Failed,
                    observed: Default::default(),
                    error: Some("still failing".into()),
                },
            })
            .await
            .unwrap();
    }
    assert_eq!(waits, [0, 1, 2, 4]);
}
