//! One task owns the queue core; gRPC handlers send it commands.
//!
//! ```text
//!  Enqueue ─┐                     ┌─► worker 1 channel (items, acks) ─► Work stream 1
//!  Work ────┼─► commands ─► actor ┼─► worker 2 channel                ─► Work stream 2
//!  Stats ───┘   (mpsc)     (Queue)└─► metrics (on every lease/outcome; gauges each second)
//! ```
//!
//! After every batch of commands and every timer the actor hands ready keys to workers that
//! have credit, so a worker never holds more items than it granted. Enqueues that meet a full
//! queue wait in arrival order until keys leave; their senders wait for the acknowledgement,
//! which is the backpressure.

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use switchyard_queue_core::{
    AddOutcome, ControllerId, Error as CoreError, KeyPhase, KeyView, Queue, ShardStats, ValidKey,
    WorkerId,
};
use switchyard_runtime::{Drain, sleep_until};
use tokio::sync::mpsc;
use tracing::{debug, info};

mod protocol;

pub use protocol::{
    Add, Added, Closed, Command, Completion, Described, EnqueueError, Handle, ToWorker, WorkerView,
};
use protocol::{EnqueueReply, FailingKeys};

use crate::metrics::QueueMetrics;

/// Commands handled per wake-up before leases are dispatched, so bursts are batched.
const COMMAND_BATCH: usize = 1024;
/// Commands waiting for the actor; senders wait for room (backpressure to the gRPC handlers
/// and, through HTTP/2 flow control, to their callers).
const COMMAND_QUEUE: usize = 4096;
/// Enqueue batches waiting for room in a full queue; beyond it a batch is refused at once
/// (RESOURCE_EXHAUSTED, nothing of it added) rather than held.
pub const MAX_BLOCKED_BATCHES: usize = 1024;
/// How often depth and in-flight gauges are refreshed.
const GAUGE_INTERVAL: Duration = Duration::from_secs(1);
/// Names of departed workers kept, so that a remembered outcome still names its worker after
/// the worker's stream closed: reconciler restarts over hours, each a new stream per worker.
const DEPARTED_WORKER_NAMES: usize = 1024;

struct Worker {
    name: Arc<str>,
    controllers: Vec<ControllerId>,
    credits: u32,
    /// Outcomes accepted from it.
    finished: u64,
    tx: mpsc::UnboundedSender<ToWorker>,
}

struct Blocked {
    shard: u32,
    adds: VecDeque<Add>,
    done: Added,
    reply: EnqueueReply,
}

pub struct Actor {
    queue: Queue,
    rx: mpsc::Receiver<Command>,
    workers: HashMap<WorkerId, Worker>,
    /// Workers with credit, in turn.
    hungry: VecDeque<WorkerId>,
    blocked: VecDeque<Blocked>,
    next_worker: WorkerId,
    /// Names of the latest departed workers, oldest first.
    departed: VecDeque<(WorkerId, Arc<str>)>,
    metrics: QueueMetrics,
    drain_grace: Duration,
    /// Triggered once the shards are handed back on shutdown (the member then leaves).
    on_drained: Option<switchyard_runtime::ShutdownHandle>,
}

impl std::fmt::Debug for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Actor")
            .field("keys", &self.queue.len())
            .field("workers", &self.workers.len())
            .finish_non_exhaustive()
    }
}

fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

impl Actor {
    pub fn new(queue: Queue, metrics: QueueMetrics, drain_grace: Duration) -> (Self, Handle) {
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let actor = Self {
            queue,
            rx,
            workers: HashMap::new(),
            hungry: VecDeque::new(),
            blocked: VecDeque::new(),
            next_worker: 1,
            departed: VecDeque::new(),
            metrics,
            drain_grace,
            on_drained: None,
        };
        (actor, Handle { tx })
    }

    /// Triggers `handle` once the shards are handed back on shutdown.
    pub fn on_drained(mut self, handle: switchyard_runtime::ShutdownHandle) -> Self {
        self.on_drained = Some(handle);
        self
    }

    pub async fn run(mut self, drain: Drain) {
        let mut gauges = tokio::time::interval(GAUGE_INTERVAL);
        let draining = drain.clone().signaled();
        tokio::pin!(draining);
        loop {
            let wake = self.queue.next_wakeup().map(tokio::time::Instant::from_std);
            tokio::select! {
                command = self.rx.recv() => {
                    // Every handle is gone: shutdown dropped the servers before this loop saw
                    // the drain. The shards are handed back all the same, below.
                    let Some(command) = command else { break };
                    self.handle(command);
                    for _ in 1..COMMAND_BATCH {
                        match self.rx.try_recv() {
                            Ok(command) => self.handle(command),
                            Err(_) => break,
                        }
                    }
                }
                _ = sleep_until(wake) => {}
                _ = gauges.tick() => self.metrics.set_gauges(&self.queue.stats(now())),
                _ = &mut draining => break,
            }
            self.tick();
        }
        // Either way out ends here, so the member always leaves after its shards are back.
        self.drain_all().await;
    }

    fn tick(&mut self) {
        let now = now();
        for (controller, shard) in self.queue.advance(now) {
            self.metrics.expired(controller, shard);
        }
        self.unblock(now);
        self.dispatch(now);
    }

    fn handle(&mut self, command: Command) {
        let now = now();
        match command {
            Command::Enqueue { shard, adds, reply } => self.enqueue(shard, adds, reply, now),
            Command::Connect {
                name,
                controllers,
                tx,
                reply,
            } => {
                let _ = reply.send(self.connect(name, controllers, tx));
            }
            Command::Credit { worker, items } => self.credit(worker, items),
            Command::Complete { worker, done } => self.complete(worker, done, now),
            Command::Extend {
                worker,
                shard,
                epoch,
                lease,
                by,
            } => {
                let result = self.queue.extend(worker, shard, epoch, lease, by, now);
                if let Err(refused) = result {
                    self.metrics.refused(refused);
                }
                self.reply(worker, ToWorker::Extended { lease, result });
            }
            Command::Invalid { worker, reason } => {
                self.reply(worker, ToWorker::Invalid(reason));
                // A misbehaving worker's leases expire like a broken stream's.
                self.forget_worker(worker);
            }
            Command::Disconnect { worker, clean } => self.disconnect(worker, clean, now),
            Command::Acquire { shard, epoch } => self.queue.acquire(shard, epoch, now),
            Command::Resume { shard, from, epoch } => self.resume(shard, from, epoch, now),
            Command::Suspend { shard } => self.queue.suspend(shard),
            Command::Drain { shard } => self.queue.drain(shard),
            Command::Release { shard } => self.queue.release(shard),
            Command::InFlight { shard, reply } => {
                let _ = reply.send(self.queue.shard_in_flight(shard));
            }
            Command::Stats { controller, reply } => {
                let _ = reply.send(self.stats(controller, now));
            }
            Command::Workers { reply } => {
                let _ = reply.send(self.workers());
            }
            Command::Describe { key, reply } => {
                let described = self.queue.describe(&key).map(|view| self.described(view));
                let _ = reply.send(described);
            }
            Command::Failing {
                controller,
                limit,
                reply,
            } => {
                let _ = reply.send(self.failing(controller, limit));
            }
        }
    }

    /// A batch of adds for `shard`: applied now, or queued behind earlier batches waiting for
    /// room, or refused when too many wait.
    fn enqueue(&mut self, shard: u32, adds: Vec<Add>, reply: EnqueueReply, now: Instant) {
        if self.queue.shard_epoch(shard).is_none() {
            let _ = reply.send(Err(EnqueueError::NotOwner { shard }));
            return;
        }
        let blocked = Blocked {
            shard,
            adds: adds.into(),
            done: Added::default(),
            reply,
        };
        if self.blocked.is_empty() {
            if let Some(waiting) = self.apply(blocked, now) {
                self.blocked.push_back(waiting);
            }
        } else if self.blocked.len() >= MAX_BLOCKED_BATCHES {
            self.metrics.busy();
            let _ = blocked.reply.send(Err(EnqueueError::Busy {
                waiting: self.blocked.len(),
            }));
        } else {
            // Earlier senders are waiting for room: keep arrival order.
            self.blocked.push_back(blocked);
        }
    }

    /// A new Work stream; its worker id.
    fn connect(
        &mut self,
        name: Arc<str>,
        controllers: Vec<ControllerId>,
        tx: mpsc::UnboundedSender<ToWorker>,
    ) -> WorkerId {
        let id = self.next_worker;
        self.next_worker += 1;
        self.workers.insert(
            id,
            Worker {
                name,
                controllers,
                credits: 0,
                finished: 0,
                tx,
            },
        );
        id
    }

    fn credit(&mut self, worker: WorkerId, items: u32) {
        if let Some(w) = self.workers.get_mut(&worker) {
            if w.credits == 0 {
                self.hungry.push_back(worker);
            }
            w.credits = w.credits.saturating_add(items);
        }
    }

    /// A worker's outcome: applied to the core (or refused), its read floor raised, counted,
    /// and acknowledged.
    fn complete(&mut self, worker: WorkerId, done: Completion, now: Instant) {
        let Completion {
            shard,
            epoch,
            lease,
            outcome,
            observed,
            error,
        } = done;
        let key = self.queue.lease_key(lease).cloned();
        let controller = key.as_ref().map(ValidKey::controller);
        let result = self.queue.complete_with_error(
            worker,
            shard,
            epoch,
            lease,
            outcome,
            error.as_deref(),
            now,
        );
        if let (Ok(_), Some(key)) = (&result, &key) {
            self.queue.raise_floor(shard, key.namespace(), &observed);
            if let Some(w) = self.workers.get_mut(&worker) {
                w.finished += 1;
            }
        }
        match (&result, controller) {
            (Ok(worked), Some(controller)) => {
                self.metrics.completed(controller, shard, *worked, outcome)
            }
            (Err(refused), _) => self.metrics.refused(*refused),
            _ => {}
        }
        self.reply(
            worker,
            ToWorker::Ack {
                lease,
                result: result.map(|_| ()),
            },
        );
    }

    fn disconnect(&mut self, worker: WorkerId, clean: bool, now: Instant) {
        self.forget_worker(worker);
        if clean {
            let returned = self.queue.release_worker(worker, now);
            debug!(worker, returned, "worker left");
        } else {
            debug!(
                worker,
                leases = self.queue.worker_leases(worker),
                "worker stream broke; its leases expire"
            );
        }
    }

    /// The member renewed the epoch of a shard it had suspended: serve it again, with the
    /// keys it kept if it held that epoch.
    fn resume(&mut self, shard: u32, from: u64, epoch: u64, now: Instant) {
        match self.queue.renew(shard, from, epoch, now) {
            Some(kept) => info!(
                shard,
                epoch, kept, "kept the shard's keys across the renewal"
            ),
            None => info!(shard, epoch, "no keys kept for the shard: serving it empty"),
        }
    }

    fn stats(&self, controller: Option<ControllerId>, now: Instant) -> Vec<ShardStats> {
        let mut stats = self.queue.stats(now);
        if let Some(c) = controller {
            stats.retain(|s| s.controller == c);
        }
        stats
    }

    fn workers(&self) -> Vec<WorkerView> {
        let mut workers: Vec<_> = self.workers.iter().collect();
        workers.sort_unstable_by_key(|(id, _)| **id);
        workers
            .into_iter()
            .map(|(id, w)| WorkerView {
                name: w.name.clone(),
                controllers: w.controllers.clone(),
                credits: w.credits,
                in_flight: self.queue.worker_leases(*id),
                finished: w.finished,
            })
            .collect()
    }

    fn failing(&self, controller: Option<ControllerId>, limit: usize) -> FailingKeys {
        let (keys, total) = self.queue.failing(controller, limit);
        let keys = keys
            .into_iter()
            .map(|(key, view)| (key, self.described(view)))
            .collect();
        (keys, total)
    }

    /// A key's view with its workers named.
    fn described(&self, view: KeyView<'_>) -> Described {
        Described {
            epoch: view.epoch,
            holder: match view.phase {
                KeyPhase::Leased { worker, .. } => self.worker_name(worker),
                _ => None,
            },
            phase: view.phase,
            failures: view.failures,
            last: view
                .last
                .map(|last| (last.clone(), self.worker_name(last.worker))),
        }
    }

    /// Drops a worker, keeping its name for the outcomes that name it.
    fn forget_worker(&mut self, worker: WorkerId) {
        if let Some(gone) = self.workers.remove(&worker) {
            if self.departed.len() == DEPARTED_WORKER_NAMES {
                self.departed.pop_front();
            }
            self.departed.push_back((worker, gone.name));
        }
    }

    fn worker_name(&self, worker: WorkerId) -> Option<Arc<str>> {
        self.workers
            .get(&worker)
            .map(|w| w.name.clone())
            .or_else(|| {
                self.departed
                    .iter()
                    .rev()
                    .find(|(id, _)| *id == worker)
                    .map(|(_, name)| name.clone())
            })
    }

    /// Adds as many of `blocked`'s keys as fit; returns it if some are still waiting.
    fn apply(&mut self, mut blocked: Blocked, now: Instant) -> Option<Blocked> {
        while let Some(add) = blocked.adds.front() {
            match self
                .queue
                .add_caused(&add.key, add.priority, add.delay, add.origin.clone(), now)
            {
                Ok(AddOutcome::Added) => {
                    blocked.done.added += 1;
                    self.metrics.added(add.key.controller(), blocked.shard);
                }
                Ok(AddOutcome::Coalesced) => blocked.done.coalesced += 1,
                Err(CoreError::Full { .. }) => return Some(blocked),
                // Only ownership can have moved since arrival (a batch that waited for room).
                Err(CoreError::NotOwner { .. }) => {
                    let _ = blocked.reply.send(Err(EnqueueError::NotOwner {
                        shard: blocked.shard,
                    }));
                    return None;
                }
            }
            blocked.adds.pop_front();
        }
        let _ = blocked.reply.send(Ok(blocked.done));
        None
    }

    fn unblock(&mut self, now: Instant) {
        while let Some(blocked) = self.blocked.pop_front() {
            if let Some(still) = self.apply(blocked, now) {
                self.blocked.push_front(still);
                return;
            }
        }
    }

    fn dispatch(&mut self, now: Instant) {
        let mut idle = 0;
        while idle < self.hungry.len() {
            let Some(id) = self.hungry.pop_front() else {
                break;
            };
            let Some(worker) = self.workers.get_mut(&id) else {
                continue;
            };
            if worker.credits == 0 {
                continue;
            }
            match self.queue.lease(id, &worker.controllers, now) {
                Some(lease) => {
                    idle = 0;
                    worker.credits -= 1;
                    self.metrics.leased(&lease);
                    if worker.tx.send(ToWorker::Item(lease)).is_err() {
                        // The stream is gone; its Disconnect is on the way and the lease
                        // expires if the worker does not come back.
                        continue;
                    }
                    if worker.credits > 0 {
                        self.hungry.push_back(id);
                    }
                }
                None => {
                    idle += 1;
                    self.hungry.push_back(id);
                }
            }
        }
    }

    fn reply(&self, worker: WorkerId, message: ToWorker) {
        if let Some(w) = self.workers.get(&worker) {
            let _ = w.tx.send(message);
        }
    }

    /// Stops leasing every shard, lets in-flight leases finish for the grace period while
    /// still taking their outcomes, then hands the shards back.
    async fn drain_all(&mut self) {
        let shards: Vec<u32> = self
            .queue
            .owned_shards()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        for shard in &shards {
            self.queue.drain(*shard);
        }
        for blocked in self.blocked.drain(..) {
            let _ = blocked.reply.send(Err(EnqueueError::NotOwner {
                shard: blocked.shard,
            }));
        }
        let deadline = tokio::time::Instant::now() + self.drain_grace;
        info!(in_flight = self.queue.in_flight(), grace = ?self.drain_grace, "draining shards");
        while self.queue.in_flight() > 0 {
            tokio::select! {
                command = self.rx.recv() => match command {
                    Some(command) => self.handle(command),
                    None => break,
                },
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        let abandoned = self.queue.in_flight();
        for shard in shards {
            self.queue.release(shard);
        }
        info!(abandoned, "shards released");
        if let Some(handle) = &self.on_drained {
            handle.trigger();
        }
    }
}

#[cfg(test)]
mod tests {
    use switchyard_queue_core::QueueConfig;
    use switchyard_runtime::{Metrics, drain_channel};

    use super::*;

    fn actor() -> (Actor, Handle) {
        let queue = Queue::new(QueueConfig::default(), &["rs"], crate::RandomLeaseIds);
        let metrics = QueueMetrics::register(&Metrics::new_for_tests(), queue.key_space());
        Actor::new(queue, metrics, Duration::from_secs(1))
    }

    /// Shutdown may drop every handle (the gRPC server, the ownership task) before the actor
    /// sees the drain: the shards are handed back and the member told to leave all the same.
    #[tokio::test]
    async fn the_member_leaves_when_every_handle_is_gone_before_the_drain() {
        let (actor, handle) = actor();
        let (leave, left) = drain_channel();
        let (_shutdown, drain) = drain_channel();
        handle
            .send(Command::Acquire { shard: 3, epoch: 7 })
            .await
            .expect("actor running");
        drop(handle);
        actor.on_drained(leave).run(drain).await;
        assert!(left.is_draining(), "the member was told to leave");
    }

    #[tokio::test]
    async fn the_member_leaves_after_the_drain() {
        let (actor, handle) = actor();
        let (leave, left) = drain_channel();
        let (shutdown, drain) = drain_channel();
        let run = tokio::spawn(actor.on_drained(leave).run(drain));
        assert_eq!(handle.in_flight(3).await.expect("actor running"), 0);
        assert!(!left.is_draining());
        shutdown.trigger();
        run.await.expect("actor ends");
        assert!(left.is_draining(), "the member was told to leave");
    }
}
