//! Sends keys to the queue replica that owns each key's shard.
//!
//! ```text
//!  push ─► pending: shard -> {key -> priority, delay, causes}   (a set: repeats coalesce)
//!            │  full (capacity): push waits, so the caller stops producing instead of
//!            │  growing
//!            ▼
//!  run: per shard with an active owner and fewer than MAX_IN_FLIGHT_PER_SHARD requests in
//!       flight, a batch of up to BATCH keys ─► Enqueue at the owner (at most MAX_IN_FLIGHT
//!       requests at once)
//!       acknowledged ─► gone;   not owner / unavailable / full ─► back into pending, and the
//!       shard waits out a backoff (or the next shard map) before it is sent again; refused as
//!       invalid ─► sent again in halves until only the keys at fault are left, which are
//!       dropped and logged
//! ```
//!
//! Sending is a pipeline, not rounds: the keys that arrive for a shard go at once, whatever
//! other shards' requests are still waiting for, and do not wait for their own shard's
//! request in flight either (an add is a set insert at the queue, so their order does not
//! matter) unless it has MAX_IN_FLIGHT_PER_SHARD out; then they go together in the next.
//!
//! A push wakes the sender and then yields: an informer reading a burst of buffered watch
//! events would otherwise keep its thread, and the sender it woke (in that thread's LIFO
//! slot, which other threads cannot steal) would wait behind it.
//!
//! Nothing is dropped because a queue is slow, down or moving: keys wait in the pending set,
//! whose size is bounded by the number of distinct keys.
//!
//! A key may ask the queue to hold it for a delay (a batch period): repeats coalesce here to
//! the shortest, and at the queue the earliest ready time wins.
//!
//! A key may carry the trace contexts of the events that caused it (the latest
//! [`MAX_CAUSES`] when repeats coalesce here), and goes to the queue as one item per cause,
//! so that the queue keeps every one with the key. It may also carry when the earliest of
//! those events was observed (repeats keep the earliest), which the lease hands on.

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    pin::pin,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, SystemTime},
};

use futures::{StreamExt, stream::FuturesUnordered};
use switchyard_proto::queue::v1::{EnqueueRequest, queue_client::QueueClient};
use switchyard_queue_core::{MAX_CAUSES, Priority, WorkKey, earliest};
use switchyard_runtime::{Backoff, Dialer, Drain, Role, sleep_until, trace::TraceFields};
use switchyard_shards::ShardView;
use tokio::{
    sync::{Notify, watch},
    time::Instant,
};
use tonic::transport::Channel;
use tracing::{debug, error, warn};

use crate::{Error, convert};

/// Keys per Enqueue request: big enough to amortise a round trip, small enough that one
/// request never holds a queue's actor for long.
const BATCH: usize = 500;
/// Requests in flight at once across all queue replicas.
const MAX_IN_FLIGHT: usize = 32;
/// Requests of one shard in flight at once.
const MAX_IN_FLIGHT_PER_SHARD: usize = 4;
/// First and last delay before retrying keys a queue did not take.
const RETRY_BACKOFF: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(2));

/// The trace context of the event that caused a key.
pub type Cause = Arc<TraceFields>;

/// What an [`Enqueuer`] reports, for the caller's metrics.
pub trait EnqueueMetrics: Send + Sync + fmt::Debug {
    /// Keys waiting to be sent, after every change.
    fn pending(&self, keys: usize);
    /// Keys a queue replica acknowledged.
    fn sent(&self, keys: usize);
    /// Keys a queue refused as invalid; they are dropped.
    fn dropped(&self, keys: usize);
    /// An Enqueue that failed; its keys wait for a retry.
    fn retried(&self);
}

/// No metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoMetrics;

impl EnqueueMetrics for NoMetrics {
    fn pending(&self, _: usize) {}
    fn sent(&self, _: usize) {}
    fn dropped(&self, _: usize) {}
    fn retried(&self) {}
}

/// A key to send: ready at once, or after a delay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Add {
    pub key: WorkKey,
    pub delay: Duration,
}

impl From<WorkKey> for Add {
    fn from(key: WorkKey) -> Self {
        Self {
            key,
            delay: Duration::ZERO,
        }
    }
}

impl From<(WorkKey, Option<Duration>)> for Add {
    fn from((key, delay): (WorkKey, Option<Duration>)) -> Self {
        Self {
            key,
            delay: delay.unwrap_or_default(),
        }
    }
}

/// A key waiting to be sent: its priority, its delay, what caused it and when the earliest
/// of its events was observed.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Waiting {
    priority: Priority,
    delay: Duration,
    causes: Vec<Cause>,
    observed_at: Option<SystemTime>,
}

impl Waiting {
    fn merge(&mut self, other: Waiting) {
        self.priority = self.priority.max(other.priority);
        self.delay = self.delay.min(other.delay);
        self.observed_at = earliest(self.observed_at, other.observed_at);
        for cause in other.causes {
            if self.causes.len() == MAX_CAUSES {
                self.causes.remove(0);
            }
            self.causes.push(cause);
        }
    }
}

type Batch = Vec<(WorkKey, Waiting)>;

#[derive(Debug, Default)]
struct Pending {
    by_shard: BTreeMap<u32, HashMap<WorkKey, Waiting>>,
    total: usize,
    /// Where the next [`Pending::take`] starts, so that a limit does not always favour the
    /// same shards.
    next: u32,
}

impl Pending {
    fn insert(&mut self, shard: u32, key: WorkKey, waiting: Waiting) {
        let keys = self.by_shard.entry(shard).or_default();
        match keys.get_mut(&key) {
            Some(w) => w.merge(waiting),
            None => {
                keys.insert(key, waiting);
                self.total += 1;
            }
        }
    }

    /// Takes up to [`BATCH`] keys of every shard that has an owner and is not `held`, for at
    /// most `limit` shards, starting after the last shard the previous call took.
    fn take(
        &mut self,
        view: &ShardView,
        held: impl Fn(u32) -> bool,
        limit: usize,
    ) -> Vec<(u32, Batch)> {
        let mut batches = Vec::new();
        let (after, before): (Vec<_>, Vec<_>) = self
            .by_shard
            .iter_mut()
            .partition(|(shard, _)| **shard >= self.next);
        for (&shard, keys) in after.into_iter().chain(before) {
            if batches.len() == limit {
                break;
            }
            if view.owner(shard).is_none() || keys.is_empty() || held(shard) {
                continue;
            }
            let batch: Batch = if keys.len() <= BATCH {
                keys.drain().collect()
            } else {
                let taken: Vec<WorkKey> = keys.keys().take(BATCH).cloned().collect();
                taken
                    .into_iter()
                    .filter_map(|k| keys.remove_entry(&k))
                    .collect()
            };
            self.total -= batch.len();
            self.next = shard.wrapping_add(1);
            batches.push((shard, batch));
        }
        self.by_shard.retain(|_, keys| !keys.is_empty());
        batches
    }
}

/// Sends keys to the queue replicas that own their shards: push from any task, and spawn
/// [`Enqueuer::run`] once.
#[derive(Debug)]
pub struct Enqueuer {
    pending: Mutex<Pending>,
    /// Wakes the sender when keys arrive.
    arrived: Notify,
    /// Wakes pushers waiting for room.
    room: Notify,
    capacity: usize,
    shard_count: u32,
    metrics: Box<dyn EnqueueMetrics>,
    dialer: Dialer,
}

impl Enqueuer {
    /// An enqueuer that holds at most `capacity` distinct keys waiting and reaches the queue
    /// replicas through `dialer`.
    pub fn new(
        capacity: usize,
        shard_count: u32,
        metrics: impl EnqueueMetrics + 'static,
        dialer: Dialer,
    ) -> Self {
        Self {
            dialer,
            pending: Mutex::default(),
            arrived: Notify::new(),
            room: Notify::new(),
            capacity,
            shard_count,
            metrics: Box::new(metrics),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keys waiting to be sent.
    pub fn pending(&self) -> usize {
        self.lock().total
    }

    /// Queues keys for sending; waits while the pending set is full. `cause` is the trace
    /// context of the event the keys come from, and `observed_at` when that event arrived.
    pub async fn push(
        &self,
        keys: impl IntoIterator<Item = impl Into<Add>>,
        priority: Priority,
        cause: Option<Cause>,
        observed_at: Option<SystemTime>,
    ) {
        let mut keys = keys.into_iter().peekable();
        if keys.peek().is_none() {
            return;
        }
        loop {
            let mut room = pin!(self.room.notified());
            room.as_mut().enable();
            {
                let mut pending = self.lock();
                if pending.total < self.capacity {
                    for add in keys {
                        let Add { key, delay } = add.into();
                        let shard = key.shard(self.shard_count);
                        let waiting = Waiting {
                            priority,
                            delay,
                            causes: cause.iter().cloned().collect(),
                            observed_at,
                        };
                        pending.insert(shard, key, waiting);
                    }
                    self.metrics.pending(pending.total);
                    break;
                }
            }
            debug!(
                capacity = self.capacity,
                "pending keys full; waiting for the queue"
            );
            room.await;
        }
        self.arrived.notify_one();
        tokio::task::yield_now().await;
    }

    fn put_back(&self, shard: u32, batch: Batch) {
        let mut pending = self.lock();
        for (key, waiting) in batch {
            pending.insert(shard, key, waiting);
        }
        self.metrics.pending(pending.total);
    }

    /// Sends pending keys to the owners `view` names, until shutdown.
    pub async fn run(
        self: Arc<Self>,
        mut view: watch::Receiver<Option<Arc<ShardView>>>,
        drain: Drain,
    ) {
        let mut clients: HashMap<Arc<str>, QueueClient<Channel>> = HashMap::new();
        let mut sends = FuturesUnordered::new();
        // Requests in flight per shard: at MAX_IN_FLIGHT_PER_SHARD, a shard's new keys wait
        // for an answer.
        let mut in_flight: HashMap<u32, usize> = HashMap::new();
        // Shards whose last request failed in a way that may pass: each backs off on its own,
        // so one replica that is down does not hold back the others' shards.
        let mut retries: HashMap<u32, Retry> = HashMap::new();
        // Halves of batches refused as invalid, sent again to find the keys at fault.
        let mut halves: Vec<(u32, Batch)> = Vec::new();
        loop {
            let current = view.borrow_and_update().clone();
            if let Some(current) = &current {
                let now = Instant::now();
                let room = MAX_IN_FLIGHT.saturating_sub(sends.len());
                let mut batches = std::mem::take(&mut halves);
                if batches.len() > room {
                    halves = batches.split_off(room);
                } else if room > batches.len() {
                    let held = |shard| {
                        in_flight
                            .get(&shard)
                            .is_some_and(|n| *n >= MAX_IN_FLIGHT_PER_SHARD)
                            || retries.get(&shard).is_some_and(|r| r.until > now)
                    };
                    batches.extend(self.lock().take(current, held, room - batches.len()));
                }
                for (shard, batch) in batches {
                    let Some(owner) = current.owner(shard) else {
                        self.put_back(shard, batch);
                        continue;
                    };
                    let client = clients
                        .entry(owner.address.clone())
                        .or_insert_with(|| connect(&self.dialer, &owner.address))
                        .clone();
                    *in_flight.entry(shard).or_default() += 1;
                    sends.push(send(client, shard, batch));
                }
            }
            let now = Instant::now();
            let cooled = retries.values().map(|r| r.until).filter(|u| *u > now).min();
            tokio::select! {
                Some((shard, batch, result)) = sends.next() => {
                    if let Some(count) = in_flight.get_mut(&shard) {
                        *count -= 1;
                        if *count == 0 {
                            in_flight.remove(&shard);
                        }
                    }
                    match result {
                        Ok(()) => {
                            self.metrics.sent(batch.len());
                            self.room.notify_waiters();
                            retries.remove(&shard);
                        }
                        // The queue refuses a batch as a whole: the valid keys beside an
                        // invalid one go again, in halves, until only the invalid keys are
                        // dropped.
                        Err(Error::Invalid(_)) if batch.len() > 1 => {
                            let mut batch = batch;
                            let second = batch.split_off(batch.len() / 2);
                            halves.push((shard, batch));
                            halves.push((shard, second));
                        }
                        Err(error) if !error.is_retryable() => {
                            self.metrics.dropped(batch.len());
                            error!(shard, keys = batch.len(), %error, "the queue refused keys as invalid; dropped (check the controllers the queue serves)");
                        }
                        Err(error) => {
                            warn!(shard, keys = batch.len(), %error, "enqueue failed; keys kept for retry");
                            self.metrics.retried();
                            self.put_back(shard, batch);
                            let retry = retries.entry(shard).or_insert_with(Retry::new);
                            retry.until = Instant::now() + retry.backoff.advance();
                        }
                    }
                    self.metrics.pending(self.pending());
                }
                _ = self.arrived.notified() => {}
                _ = sleep_until(cooled) => {}
                changed = view.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // A new owner may take what the old one refused: try at once.
                    let now = Instant::now();
                    for retry in retries.values_mut() {
                        retry.until = now;
                    }
                }
                _ = drain.clone().signaled() => return,
            }
        }
    }
}

/// A shard waiting to be sent again after a failure.
struct Retry {
    backoff: Backoff,
    until: Instant,
}

impl Retry {
    fn new() -> Self {
        Self {
            backoff: Backoff::new(RETRY_BACKOFF.0, RETRY_BACKOFF.1),
            until: Instant::now(),
        }
    }
}

fn connect(dialer: &Dialer, address: &str) -> QueueClient<Channel> {
    match crate::endpoint(dialer, address) {
        Ok(endpoint) => QueueClient::new(dialer.lazy(&endpoint, Role::Queue)),
        Err(error) => {
            // An address from the shard map that is not a URI authority: requests fail and
            // the keys wait until the map names a usable address.
            error!(%address, %error, "invalid queue address in the shard map");
            QueueClient::new(Channel::from_static("http://invalid.invalid").connect_lazy())
        }
    }
}

async fn send(
    mut client: QueueClient<Channel>,
    shard: u32,
    batch: Batch,
) -> (u32, Batch, Result<(), Error>) {
    let request = EnqueueRequest {
        batch_id: 0,
        shard,
        items: batch
            .iter()
            .flat_map(|(key, waiting)| {
                convert::enqueue_items(
                    key,
                    waiting.priority,
                    waiting.delay,
                    &waiting.causes,
                    waiting.observed_at,
                )
            })
            .collect(),
    };
    let result = client
        .enqueue(request)
        .await
        .map(|_| ())
        .map_err(Error::from);
    (shard, batch, result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> WorkKey {
        WorkKey::new("c", "ns", name)
    }

    fn take_all(pending: &mut Pending, view: &ShardView) -> Vec<(u32, Batch)> {
        pending.take(view, |_| false, usize::MAX)
    }

    fn low() -> Waiting {
        Waiting {
            priority: Priority::Low,
            delay: Duration::ZERO,
            causes: Vec::new(),
            observed_at: None,
        }
    }

    fn caused(priority: Priority, n: usize) -> Waiting {
        let fields = TraceFields::from([("traceparent".to_owned(), n.to_string())]);
        Waiting {
            priority,
            delay: Duration::ZERO,
            causes: vec![Arc::new(fields)],
            observed_at: None,
        }
    }

    fn delayed(ms: u64) -> Waiting {
        Waiting {
            delay: Duration::from_millis(ms),
            ..low()
        }
    }

    #[test]
    fn repeats_coalesce_to_the_shortest_delay() {
        let mut pending = Pending::default();
        pending.insert(0, key("a"), delayed(200));
        pending.insert(0, key("a"), delayed(50));
        pending.insert(0, key("a"), delayed(100));
        pending.insert(0, key("b"), delayed(100));
        pending.insert(0, key("b"), low());
        let mut batch = take_all(&mut pending, &ShardView::single("q:1", 1))
            .remove(0)
            .1;
        batch.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        assert_eq!(batch[0].1.delay, Duration::from_millis(50));
        assert_eq!(batch[1].1.delay, Duration::ZERO);
    }

    #[test]
    fn repeats_coalesce_and_keep_the_higher_priority_and_every_cause() {
        let mut pending = Pending::default();
        pending.insert(0, key("a"), caused(Priority::Low, 1));
        pending.insert(0, key("a"), caused(Priority::Normal, 2));
        pending.insert(0, key("a"), low());
        pending.insert(1, key("b"), low());
        assert_eq!(pending.total, 2);
        let view = ShardView::single("q:1", 2);
        let mut batches = take_all(&mut pending, &view);
        batches.sort_by_key(|(s, _)| *s);
        let a = &batches[0].1[0].1;
        assert_eq!(a.priority, Priority::Normal);
        assert_eq!(a.causes.len(), 2);
        assert_eq!(a.causes[1]["traceparent"], "2");
        assert_eq!(batches[1].1, vec![(key("b"), low())]);
        assert_eq!(pending.total, 0);
    }

    #[test]
    fn causes_of_a_pending_key_are_bounded_keeping_the_latest() {
        let mut pending = Pending::default();
        for n in 0..MAX_CAUSES + 3 {
            pending.insert(0, key("a"), caused(Priority::Normal, n));
        }
        let batches = take_all(&mut pending, &ShardView::single("q:1", 1));
        let causes = &batches[0].1[0].1.causes;
        assert_eq!(causes.len(), MAX_CAUSES);
        assert_eq!(causes[0]["traceparent"], "3");
    }

    #[test]
    fn shards_without_an_owner_wait_and_big_shards_go_in_batches() {
        let mut pending = Pending::default();
        for i in 0..(BATCH + 10) {
            pending.insert(0, key(&i.to_string()), low());
        }
        pending.insert(1, key("x"), low());
        let mut view = ShardView::single("q:1", 2);
        view.owners[1] = None;
        let batches = take_all(&mut pending, &view);
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].1.len(), BATCH);
        assert_eq!(pending.total, 11);
        let batches = take_all(&mut pending, &view);
        assert_eq!(batches[0].1.len(), 10);
        assert_eq!(pending.total, 1);
    }

    #[test]
    fn held_shards_wait_and_a_limit_takes_the_next_shards_in_turn() {
        let mut pending = Pending::default();
        for shard in 0..4 {
            pending.insert(shard, key(&shard.to_string()), low());
        }
        let view = ShardView::single("q:1", 4);
        let shards =
            |batches: Vec<(u32, Batch)>| batches.into_iter().map(|(s, _)| s).collect::<Vec<_>>();

        // Shard 0 has a request in flight: its keys stay.
        assert_eq!(shards(pending.take(&view, |s| s == 0, 2)), [1, 2]);
        for shard in 0..4 {
            pending.insert(shard, key("again"), low());
        }
        // The next take starts after shard 2, and wraps around.
        assert_eq!(shards(pending.take(&view, |_| false, 3)), [3, 0, 1]);
        assert_eq!(shards(pending.take(&view, |_| false, 3)), [2]);
        assert_eq!(pending.total, 0);
    }

    #[tokio::test]
    async fn a_full_enqueuer_makes_push_wait_until_room() {
        let enqueuer = Arc::new(Enqueuer::new(2, 1, NoMetrics, Dialer::plaintext()));
        enqueuer
            .push([key("a"), key("b")], Priority::Low, None, None)
            .await;
        let blocked = tokio::spawn({
            let enqueuer = enqueuer.clone();
            async move { enqueuer.push([key("c")], Priority::Low, None, None).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !blocked.is_finished(),
            "push must wait while the pending set is full"
        );
        let view = ShardView::single("q:1", 1);
        let taken = take_all(&mut enqueuer.lock(), &view);
        assert_eq!(taken[0].1.len(), 2);
        enqueuer.room.notify_waiters();
        tokio::time::timeout(Duration::from_secs(5), blocked)
            .await
            .expect("push proceeds once there is room")
            .unwrap();
        assert_eq!(enqueuer.pending(), 1);
    }
}
