//! The worker: one Work stream to the queue, up to `concurrency` reconciles at once.
//!
//! ```text
//!  hello(worker id, controllers) ─► credit(concurrency) ─► queue
//!  queue ─ leased item ─► spawn reconcile ─┬─ done | requeue after d | failed (error, panic, timeout)
//!                                          │    ─► outcome(duration) + credit(1)
//!                                          └─ every half lease: extend the lease
//!  SIGTERM: no new credit, items not started are left to the stream's clean close (the queue
//!  returns their leases at once), in-flight reconciles finish within the drain budget, then
//!  the stream is half-closed and the worker exits.
//! ```
//!
//! A reconcile runs in a task of its own, so that a panic becomes a `failed` outcome and the
//! worker lives on. When the stream breaks, the worker reconnects with backoff; the leases of
//! the broken stream wait out the queue's visibility timeout.
//!
//! The stream itself is the queue client's [`WorkSession`]: the worker sees leases and
//! answers with outcomes, never the protocol's messages.

use std::{
    collections::{BTreeMap, HashMap},
    convert::Infallible,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use switchyard_queue_client::{Error, Event, Lease, Outcome, Replies, WorkSession};
use switchyard_runtime::{
    Backoff, Drain, Gate, ShutdownHandle, drain_channel, panic_message, sleep_until,
    trace::{self, TraceFields},
};
use switchyard_shards::ShardView;
use tokio::{
    sync::{Semaphore, watch},
    task::{AbortHandle, JoinHandle, JoinSet},
};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::{
    Action, Context, Registry, Request, cache,
    metrics::{ControllerLabels, Ended, ReconcilerMetrics},
};

/// First and last delay between attempts to reach the queue.
const QUEUE_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));
/// Kept from the drain timeout for closing the stream after in-flight reconciles finish, so
/// that the close is clean (and the queue returns unstarted leases at once) before the
/// runtime gives up on the drain.
const CLOSE_MARGIN: Duration = Duration::from_secs(2);
/// How long to wait for the queue to acknowledge the last outcomes after the half-close.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// How the worker runs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub worker_id: String,
    /// Reconciles at once (credits granted).
    pub concurrency: u32,
    /// A reconcile that runs longer is abandoned and reported failed.
    pub reconcile_timeout: Duration,
    /// How long in-flight reconciles may take to finish after SIGTERM.
    pub drain_timeout: Duration,
    /// How the worker reaches the queue replicas.
    pub dialer: switchyard_runtime::Dialer,
}

/// What every work stream of this worker shares.
#[derive(Clone)]
pub struct Worker {
    pub registry: Arc<Registry>,
    /// The context of a controller without one of its own in `contexts`.
    pub ctx: Context,
    /// Per controller name: its own apiserver client (and rate limit).
    contexts: Arc<BTreeMap<String, Context>>,
    pub settings: Arc<Settings>,
    /// Bounds the reconciles running at once across every queue replica.
    permits: Arc<Semaphore>,
    /// Opened by the first work stream established.
    ready: Arc<Mutex<Option<Gate>>>,
    metrics: ReconcilerMetrics,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("registry", &self.registry)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Worker {
    pub fn new(
        registry: Registry,
        ctx: Context,
        settings: Settings,
        ready: Gate,
        metrics: ReconcilerMetrics,
    ) -> Self {
        Self {
            metrics,
            permits: Arc::new(Semaphore::new(settings.concurrency as usize)),
            registry: Arc::new(registry),
            ctx,
            contexts: Arc::default(),
            settings: Arc::new(settings),
            ready: Arc::new(Mutex::new(Some(ready))),
        }
    }

    /// Gives each named controller a context of its own (its own client and rate limit).
    pub fn per_controller(mut self, contexts: BTreeMap<String, Context>) -> Self {
        self.contexts = Arc::new(contexts);
        self
    }

    /// Serves one queue replica until shutdown, reconnecting when the stream breaks.
    pub async fn serve(self, queue: Arc<str>, drain: Drain) {
        let mut backoff = Backoff::new(QUEUE_BACKOFF.0, QUEUE_BACKOFF.1);
        loop {
            let session = Session {
                queue: queue.clone(),
                worker: self.clone(),
            };
            match session.run(&mut backoff, &drain).await {
                Ok(()) => return,
                Err(error) => {
                    warn!(%error, %queue, retry_in = ?backoff.current(), "work stream failed")
                }
            }
            if !backoff.wait(&drain).await {
                return;
            }
        }
    }

    /// Serves every queue replica of the elector's shard map: a work stream to each distinct
    /// owner address; a replica that leaves the map is drained like a shutdown.
    pub async fn follow(self, mut view: watch::Receiver<Option<Arc<ShardView>>>, drain: Drain) {
        let mut sessions: BTreeMap<Arc<str>, (ShutdownHandle, JoinHandle<()>)> = BTreeMap::new();
        let mut stopping = Vec::new();
        loop {
            let addresses = view
                .borrow_and_update()
                .as_ref()
                .map(|v| v.addresses())
                .unwrap_or_default();
            sessions.retain(|address, (handle, task)| {
                let keep = addresses.contains(address);
                if !keep {
                    info!(queue = %address, "queue replica left the shard map: draining its stream");
                    handle.trigger();
                    stopping.push(std::mem::replace(task, tokio::spawn(async {})));
                }
                keep
            });
            for address in addresses {
                sessions.entry(address.clone()).or_insert_with(|| {
                    let (handle, session_drain) = drain_channel();
                    let task = tokio::spawn(
                        self.clone()
                            .serve(address.clone(), session_drain)
                            .instrument(info_span!("queue", address = %address)),
                    );
                    (handle, task)
                });
            }
            tokio::select! {
                changed = view.changed() => if changed.is_err() { break },
                _ = drain.clone().signaled() => break,
            }
        }
        for (handle, task) in sessions.into_values() {
            handle.trigger();
            stopping.push(task);
        }
        for task in stopping {
            let _ = task.await;
        }
    }
}

struct Session {
    queue: Arc<str>,
    worker: Worker,
}

impl Session {
    /// Ok when it ended because of shutdown.
    async fn run(self, backoff: &mut Backoff, drain: &Drain) -> Result<(), Error> {
        let Worker {
            registry, settings, ..
        } = &self.worker;
        let mut session = WorkSession::open(
            &settings.dialer,
            &self.queue,
            &settings.worker_id,
            registry.names(),
            settings.concurrency,
        )
        .await?;
        info!(queue = %self.queue, concurrency = settings.concurrency, "work stream open");
        *backoff = Backoff::new(QUEUE_BACKOFF.0, QUEUE_BACKOFF.1);
        let gate = self
            .worker
            .ready
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(gate) = gate {
            gate.ready();
        }

        let mut running = JoinSet::new();
        // The reconcile of each lease, so that a lease the queue takes back stops its own.
        let mut by_lease: HashMap<String, AbortHandle> = HashMap::new();
        let mut drain_deadline: Option<tokio::time::Instant> = None;
        loop {
            if drain_deadline.is_some() && running.is_empty() {
                break;
            }
            tokio::select! {
                event = session.next() => match event? {
                    Some(Event::Lease(lease)) => match drain_deadline {
                        None => {
                            let replies = session.replies().clone();
                            let id = lease.id.clone();
                            let reconcile = self.reconcile(*lease, replies, drain.clone());
                            let handle = running.spawn({
                                let id = id.clone();
                                async move {
                                    reconcile.await;
                                    id
                                }
                            });
                            by_lease.insert(id, handle);
                        }
                        // Not started: its lease returns when the stream closes cleanly.
                        Some(_) => debug!(lease_id = %lease.id, "item arrived while draining"),
                    },
                    Some(Event::Refused { lease_id, reason }) => match by_lease.remove(&lease_id) {
                        // An extension refused (the lease expired or its shard moved): the key
                        // may be leased to another worker now, so this reconcile stops; the
                        // stream and its other leases go on.
                        Some(reconcile) => {
                            reconcile.abort();
                            warn!(%lease_id, %reason, "lease taken back by the queue: its reconcile stops");
                        }
                        None => warn!(%lease_id, %reason, "outcome refused by the queue"),
                    },
                    Some(Event::Extended { lease_id, .. }) => {
                        debug!(%lease_id, "lease extended");
                    }
                    Some(Event::Applied { .. }) => {}
                    None => {
                        return if drain_deadline.is_some() {
                            Ok(())
                        } else {
                            Err(Error::Unavailable("the queue ended the work stream".into()))
                        };
                    }
                },
                Some(joined) = running.join_next(), if !running.is_empty() => {
                    if let Ok(lease_id) = joined {
                        by_lease.remove(&lease_id);
                    }
                }
                _ = drain.clone().signaled(), if drain_deadline.is_none() => {
                    let budget = settings.drain_timeout.saturating_sub(CLOSE_MARGIN);
                    info!(in_flight = running.len(), ?budget, "draining: finishing in-flight reconciles");
                    drain_deadline = Some(tokio::time::Instant::now() + budget);
                }
                _ = sleep_until(drain_deadline) => {
                    warn!(abandoned = running.len(), "drain budget spent: abandoning in-flight reconciles");
                    running.abort_all();
                    break;
                }
            }
        }
        // Half-close: the queue applies the outcomes sent so far, then returns the leases of
        // items never started.
        drop(running);
        session.close(CLOSE_WAIT).await;
        info!("work stream closed");
        Ok(())
    }

    fn reconcile(
        &self,
        lease: Lease,
        replies: Replies,
        drain: Drain,
    ) -> impl Future<Output = ()> + Send + 'static {
        let registry = self.worker.registry.clone();
        let permits = self.worker.permits.clone();
        let metrics = self.worker.metrics.clone();
        let timeout = self.worker.settings.reconcile_timeout;
        let key = lease.key.clone();
        let mut ctx = self
            .worker
            .contexts
            .get(&*key.controller)
            .unwrap_or(&self.worker.ctx)
            .clone();
        // Reads at least at the shard's read floor; what they were answered at goes back
        // with the outcome and raises it.
        ctx.cache = ctx
            .cache
            .reading_at(lease.read_floor.clone(), &key.namespace)
            .after_shard_move(cache::moved_lately(lease.shard_held_for));
        let reads = ctx.cache.clone();
        let span = reconcile_span(&lease);
        async move {
            // The lease is kept from the start, also while waiting for a permit.
            let extend = extend_lease(&lease, &replies);
            let work = async {
                // Never closed: the semaphore lives as long as the worker.
                let _permit = permits.acquire_owned().await.ok();
                let _in_flight =
                    InFlight::new(&metrics.active_workers.get_or_create(&ControllerLabels {
                        controller: key.controller.to_string(),
                    }));
                let started = Instant::now();
                let verdict = match registry.get(&key.controller) {
                    Some(controller) => {
                        let request = Request {
                            namespace: key.namespace.to_string(),
                            name: key.name.to_string(),
                            attempt: lease.attempt,
                        };
                        let task = AbortOnDrop(tokio::spawn(
                            async move {
                                match controller.reconcile(&ctx, &request).await {
                                    Ok(action) => Ok(action),
                                    Err(error) => {
                                        let action = controller.error_policy(&error, &request);
                                        Err((error, action))
                                    }
                                }
                            }
                            .instrument(tracing::Span::current()),
                        ));
                        match tokio::time::timeout(timeout, task).await {
                            Ok(Ok(Ok(action))) => outcome(action, None),
                            // kube-controller-manager's handleErr: a namespace being
                            // deleted refuses every creation; nothing is left to do there.
                            Ok(Ok(Err((error, _)))) if error.is_namespace_terminating() => {
                                debug!(%error, "namespace terminating, reconcile done");
                                (Ended::Done, Outcome::Done)
                            }
                            Ok(Ok(Err((error, action)))) => outcome(action, Some(error)),
                            Ok(Err(join)) if join.is_panic() => failed(
                                Ended::Panicked,
                                format!("reconcile panicked: {}", panic_message(join.into_panic())),
                            ),
                            Ok(Err(join)) => {
                                failed(Ended::Failed, format!("reconcile aborted: {join}"))
                            }
                            Err(_) => failed(
                                Ended::TimedOut,
                                format!(
                                    "reconcile timed out after {}",
                                    humantime::format_duration(timeout)
                                ),
                            ),
                        }
                    }
                    None => failed(
                        Ended::Failed,
                        format!("no controller named {:?} in this worker", key.controller),
                    ),
                };
                (verdict, started.elapsed())
            };
            let ((kind, verdict), duration) = tokio::select! {
                done = work => done,
                never = extend => match never {},
            };
            metrics.ended(&key.controller, kind, duration);
            let span = tracing::Span::current();
            span.record("outcome", kind.outcome());
            if kind.result() == "error" {
                span.record("otel.status_code", "ERROR");
            }
            match &verdict {
                Outcome::Failed(reason) => warn!(?duration, %reason, "reconcile failed"),
                _ => debug!(?duration, "reconciled"),
            }
            // A closed stream refuses both: the lease waits out its timeout at the queue.
            let _ = replies.complete_observed(&lease, verdict, duration, &reads.observed());
            if !drain.is_draining() {
                let _ = replies.credit(1);
            }
        }
        .instrument(span)
    }
}

/// The outcome an action asks for; `error` when it is the error policy's answer to one.
fn outcome(action: Action, error: Option<crate::Error>) -> (Ended, Outcome) {
    let ended = |ok| if error.is_some() { Ended::Failed } else { ok };
    match action {
        Action::Done => (ended(Ended::Done), Outcome::Done),
        Action::RequeueAfter(delay) => (ended(Ended::RequeueAfter), Outcome::RequeueAfter(delay)),
        Action::Forget => {
            if let Some(error) = &error {
                warn!(%error, "reconcile failed; the error policy forgets the key");
            }
            (ended(Ended::Forgotten), Outcome::Forget)
        }
        Action::Backoff => failed(
            Ended::Failed,
            error.map_or_else(
                || "the reconcile asked for a retry with backoff".to_owned(),
                |e| e.to_string(),
            ),
        ),
    }
}

fn failed(kind: Ended, reason: String) -> (Ended, Outcome) {
    (kind, Outcome::Failed(reason))
}

/// The span of one reconcile. When traces are exported it continues the trace of the lease
/// (the queue's span, itself a child of the oldest event the lease covers) and links to every
/// event it covers; otherwise it is a plain log context.
fn reconcile_span(lease: &Lease) -> tracing::Span {
    let key = &lease.key;
    if !trace::exporting() {
        return info_span!(
            "reconcile",
            controller = %key.controller,
            namespace = %key.namespace,
            name = %key.name,
            attempt = lease.attempt,
            outcome = tracing::field::Empty,
        );
    }
    let span = info_span!(
        parent: None,
        "reconcile",
        otel.kind = "consumer",
        controller = %key.controller,
        key = %format_args!("{}/{}", key.namespace, key.name),
        namespace = %key.namespace,
        name = %key.name,
        attempt = lease.attempt,
        causes = lease.causes.len(),
        causes_dropped = lease.causes_dropped,
        outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    let parent: Option<&TraceFields> = if lease.trace_context.is_empty() {
        lease.causes.first()
    } else {
        Some(&lease.trace_context)
    };
    if let Some(parent) = parent {
        trace::set_parent(&span, parent);
    }
    for cause in &lease.causes {
        trace::add_link(&span, cause);
    }
    span
}

/// Renews the lease every half lease, by the lease's original length, until dropped.
async fn extend_lease(lease: &Lease, replies: &Replies) -> Infallible {
    let Some(length) = lease.remaining() else {
        return std::future::pending::<Infallible>().await;
    };
    loop {
        tokio::time::sleep(length / 2).await;
        debug!(lease_id = %lease.id, ?length, "extending the lease");
        if replies.extend(lease, length).is_err() {
            return std::future::pending::<Infallible>().await;
        }
    }
}

/// Counts a reconcile in `switchyard_active_workers` until it ends or is abandoned.
struct InFlight(prometheus_client::metrics::gauge::Gauge);

impl InFlight {
    fn new(gauge: &prometheus_client::metrics::gauge::Gauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A reconcile task that is aborted when its worker gives up on it (timeout, drain budget).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}
