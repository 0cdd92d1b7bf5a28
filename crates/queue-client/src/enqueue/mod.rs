//! Sends keys to the queue replica that owns each key's shard.
//!
//! ```text
//!  push ─► pending: shard -> {key -> priority, delay, causes}   (a set: repeats coalesce)
//!            │  full (capacity): push waits, so the caller stops producing instead of
//!            │  growing
//!            ▼
//!  run: per shard with an active owner and fewer than MAX_IN_FLIGHT_PER_SHARD batches in
//!       flight, a batch of up to BATCH keys; the batches of one owner go together in one
//!       EnqueueMany call of up to BATCH keys (at most MAX_CALLS_PER_REPLICA calls to an
//!       owner, MAX_IN_FLIGHT in all, at once)
//!       each batch acknowledged ─► gone;   not owner / unavailable / full ─► back into
//!       pending, and the shard waits out a backoff (or the next shard map) before it is sent
//!       again; refused as invalid ─► sent again in halves until only the keys at fault are
//!       left, which are dropped and logged
//! ```
//!
//! Sending is a pipeline, not rounds: the keys that arrive for a shard go at once, whatever
//! other shards' calls are still waiting for, and do not wait for their own shard's batch in
//! flight either (an add is a set insert at the queue, so their order does not matter)
//! unless it has MAX_IN_FLIGHT_PER_SHARD out; then they go together in the next.
//!
//! One call carries every shard's keys for a replica because with many shards (256 by
//! default) most batches are a key or two: with a call per shard, a burst of watch events
//! became as many calls, and keys waited for one of the MAX_IN_FLIGHT calls
//! (docs/benchmarks.md, "The watcher's own share, a call per replica"). At most
//! MAX_CALLS_PER_REPLICA calls to a replica are out at once; the keys that arrive meanwhile
//! go together in the next. A replica from before EnqueueMany answers UNIMPLEMENTED; it is
//! then sent a batch per Enqueue, until the next shard map.
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
    collections::HashMap,
    fmt,
    pin::pin,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, SystemTime},
};

use futures::{StreamExt, stream::FuturesUnordered};
use switchyard_runtime::{Dialer, Drain, sleep_until, trace::TraceFields};
use switchyard_shards::ShardView;
use switchyard_work::{Priority, WorkKey};
use tokio::{
    sync::{Notify, watch},
    time::Instant,
};
use tracing::{debug, error, warn};

mod pending;
mod schedule;
mod wire;

use pending::{Batch, Pending, Waiting};
use schedule::{Retry, calls};
use wire::{Replica, Sent, send};

use crate::Error;

/// Keys per batch and per call: big enough to amortise a round trip, small enough that one
/// call never holds a queue's actor for long.
const BATCH: usize = 500;
/// Calls in flight at once across all queue replicas.
const MAX_IN_FLIGHT: usize = 32;
/// Calls to one replica in flight at once. The keys that arrive while they are out go
/// together in the next: under load, calls grow instead of multiplying.
const MAX_CALLS_PER_REPLICA: usize = 2;
/// Batches of one shard in flight at once.
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
    /// A batch that failed in a way that may pass; its keys wait for a retry.
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
        let mut replicas: HashMap<Arc<str>, Replica> = HashMap::new();
        let mut sends = FuturesUnordered::new();
        // Batches in flight per shard: at MAX_IN_FLIGHT_PER_SHARD, a shard's new keys wait
        // for an answer.
        let mut in_flight: HashMap<u32, usize> = HashMap::new();
        // Shards whose last batch failed in a way that may pass: each backs off on its own,
        // so one replica that is down does not hold back the others' shards.
        let mut retries: HashMap<u32, Retry> = HashMap::new();
        // Batches to send before any pending key: halves of batches refused as invalid (sent
        // again to find the keys at fault), and batches a full round of calls left over.
        let mut resend: Vec<(u32, Batch)> = Vec::new();
        loop {
            let current = view.borrow_and_update().clone();
            if let Some(current) = &current {
                let now = Instant::now();
                let room = MAX_IN_FLIGHT.saturating_sub(sends.len());
                let mut batches = std::mem::take(&mut resend);
                let queued: usize = batches.iter().map(|(_, batch)| batch.len()).sum();
                let limit = (room * BATCH).saturating_sub(queued);
                if room > 0 && limit > 0 {
                    let held = |shard| {
                        in_flight
                            .get(&shard)
                            .is_some_and(|n| *n >= MAX_IN_FLIGHT_PER_SHARD)
                            || retries.get(&shard).is_some_and(|r| r.until > now)
                            || current.owner(shard).is_some_and(|owner| {
                                replicas
                                    .get(&owner.address)
                                    .is_some_and(|replica| replica.calls >= MAX_CALLS_PER_REPLICA)
                            })
                    };
                    batches.extend(self.lock().take(current, held, limit));
                }
                let (calls, ownerless) = calls(batches, |shard| {
                    current.owner(shard).map(|owner| owner.address.clone())
                });
                for (shard, batch) in ownerless {
                    self.put_back(shard, batch);
                }
                for (address, call) in calls {
                    let replica = replicas
                        .entry(address.clone())
                        .or_insert_with(|| Replica::new(&self.dialer, &address));
                    if sends.len() == MAX_IN_FLIGHT || replica.calls == MAX_CALLS_PER_REPLICA {
                        resend.extend(call);
                        continue;
                    }
                    replica.calls += 1;
                    for (shard, _) in &call {
                        *in_flight.entry(*shard).or_default() += 1;
                    }
                    sends.push(send(replica.clone(), address, call));
                }
            }
            let now = Instant::now();
            let cooled = retries.values().map(|r| r.until).filter(|u| *u > now).min();
            tokio::select! {
                Some(sent) = sends.next() => {
                    let Sent { address, call, results } = sent;
                    if let Some(replica) = replicas.get_mut(&address) {
                        replica.calls -= 1;
                    }
                    for (shard, _) in &call {
                        if let Some(count) = in_flight.get_mut(shard) {
                            *count -= 1;
                            if *count == 0 {
                                in_flight.remove(shard);
                            }
                        }
                    }
                    let Some(results) = results else {
                        // A replica from before EnqueueMany: a batch per call from now on,
                        // and this call's batches again at once.
                        debug!(%address, "the queue replica has no EnqueueMany; sending a batch per call");
                        if let Some(replica) = replicas.get_mut(&address) {
                            replica.many = false;
                        }
                        resend.extend(call);
                        continue;
                    };
                    for ((shard, batch), result) in call.into_iter().zip(results) {
                        self.settle(shard, batch, result, &mut retries, &mut resend);
                    }
                    self.metrics.pending(self.pending());
                }
                _ = self.arrived.notified() => {}
                _ = sleep_until(cooled) => {}
                changed = view.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // A new owner may take what the old one refused: try at once. A replica
                    // that had no EnqueueMany may have been upgraded since.
                    let now = Instant::now();
                    for retry in retries.values_mut() {
                        retry.until = now;
                    }
                    for replica in replicas.values_mut() {
                        replica.many = true;
                    }
                }
                _ = drain.clone().signaled() => return,
            }
        }
    }

    /// What one batch's answer means for its keys.
    fn settle(
        &self,
        shard: u32,
        mut batch: Batch,
        result: Result<(), Error>,
        retries: &mut HashMap<u32, Retry>,
        resend: &mut Vec<(u32, Batch)>,
    ) {
        match result {
            Ok(()) => {
                self.metrics.sent(batch.len());
                self.room.notify_waiters();
                retries.remove(&shard);
            }
            // The queue refuses a batch as a whole: the valid keys beside an invalid one go
            // again, in halves, until only the invalid keys are dropped.
            Err(Error::Invalid(_)) if batch.len() > 1 => {
                let second = batch.split_off(batch.len() / 2);
                resend.push((shard, batch));
                resend.push((shard, second));
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
    }
}

#[cfg(test)]
mod tests {
    use switchyard_work::MAX_CAUSES;

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
    fn held_shards_wait_and_a_limited_take_leaves_the_next_shards_their_turn() {
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
        // The next take starts after shard 2, and wraps around (shards 3 and 0 hold two
        // keys each, 1 and 2 one each).
        assert_eq!(shards(pending.take(&view, |_| false, 4)), [3, 0]);
        assert_eq!(shards(pending.take(&view, |_| false, 4)), [1, 2]);
        assert_eq!(pending.total, 0);
    }

    fn keys(shard: u32, n: usize) -> (u32, Batch) {
        let batch = (0..n)
            .map(|i| (key(&format!("{shard}-{i}")), low()))
            .collect();
        (shard, batch)
    }

    #[test]
    fn the_batches_of_one_replica_go_in_one_call_up_to_a_batch_of_keys() {
        let a: Arc<str> = Arc::from("q-a:50052");
        let b: Arc<str> = Arc::from("q-b:50052");
        let owner = |shard: u32| match shard % 3 {
            0 => Some(a.clone()),
            1 => Some(b.clone()),
            _ => None,
        };
        // A burst of a key in each of 200 shards: one call per replica, not one per shard.
        let (calls, ownerless) = calls((0..200).map(|shard| keys(shard, 1)).collect(), owner);
        let summary: Vec<(&str, usize)> = calls
            .iter()
            .map(|(address, call)| (&**address, call.len()))
            .collect();
        assert_eq!(summary, [("q-a:50052", 67), ("q-b:50052", 67)]);
        assert_eq!(ownerless.len(), 66);
        assert!(calls[0].1.iter().all(|(shard, _)| shard % 3 == 0));

        // A call holds at most BATCH keys: the next batch that would pass it starts a new one.
        let big = BATCH / 2 + 1;
        let (calls, _) = super::calls(vec![keys(0, big), keys(3, big), keys(6, 1)], owner);
        let sizes: Vec<Vec<usize>> = calls
            .iter()
            .map(|(_, call)| call.iter().map(|(_, batch)| batch.len()).collect())
            .collect();
        assert_eq!(sizes, [vec![big], vec![big, 1]]);
    }

    #[test]
    fn a_take_stops_at_its_limit_of_keys() {
        let mut pending = Pending::default();
        for shard in 0..3 {
            for i in 0..4 {
                pending.insert(shard, key(&format!("{shard}-{i}")), low());
            }
        }
        let view = ShardView::single("q:1", 3);
        let sizes: Vec<usize> = pending
            .take(&view, |_| false, 6)
            .iter()
            .map(|(_, batch)| batch.len())
            .collect();
        assert_eq!(sizes, [4, 2]);
        assert_eq!(pending.total, 6);
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
