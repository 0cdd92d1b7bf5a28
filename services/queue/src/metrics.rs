//! client-go's work-queue metrics (`workqueue_*`, labelled `name` = controller and `shard`),
//! so existing dashboards read Switchyard's queue, plus lease expirations and refused outcomes
//! (by reason, foreign leases among them).

use std::{
    collections::HashMap,
    sync::Arc,
    sync::atomic::AtomicU64,
    time::{Duration, SystemTime},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Unit,
};
use switchyard_queue_core::{ControllerId, KeySpace, Lease, Outcome, Refused, ShardStats};
use switchyard_runtime::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    name: Arc<str>,
    shard: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    name: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    reason: &'static str,
}

type FloatGauge = Gauge<f64, AtomicU64>;

fn duration_histogram() -> Histogram {
    // client-go: prometheus.ExponentialBuckets(10e-9, 10, 10), 10 ns to 10 s.
    Histogram::new(exponential_buckets(1e-8, 10.0, 10))
}

fn age_histogram() -> Histogram {
    // 1 ms to 32 s: a change's age spans the watcher's and queue's milliseconds and a backlog.
    Histogram::new(exponential_buckets(1e-3, 2.0, 16))
}

#[derive(Clone)]
struct Handles {
    adds: Counter,
    retries: Counter,
    expirations: Counter,
    queue_duration: Histogram,
    work_duration: Histogram,
    event_age: Histogram,
}

#[derive(Debug)]
pub struct QueueMetrics {
    /// Names the controllers, those that become known after start included.
    keys: KeySpace,
    depth: Family<QueueLabels, Gauge>,
    in_flight: Family<QueueLabels, Gauge>,
    adds: Family<QueueLabels, Counter>,
    retries: Family<QueueLabels, Counter>,
    expirations: Family<QueueLabels, Counter>,
    queue_duration: Family<QueueLabels, Histogram, fn() -> Histogram>,
    work_duration: Family<QueueLabels, Histogram, fn() -> Histogram>,
    event_age: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    event_age_skewed: Counter,
    unfinished: Family<QueueLabels, FloatGauge>,
    longest_running: Family<QueueLabels, FloatGauge>,
    refused: Family<RefusedLabels, Counter>,
    busy: Counter,
    handles: HashMap<(ControllerId, u32), Handles>,
}

impl std::fmt::Debug for Handles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Handles")
    }
}

impl QueueMetrics {
    pub fn register(metrics: &Metrics, keys: &KeySpace) -> Self {
        let this = Self {
            keys: keys.clone(),
            depth: Family::default(),
            in_flight: Family::default(),
            adds: Family::default(),
            retries: Family::default(),
            expirations: Family::default(),
            queue_duration: Family::new_with_constructor(duration_histogram),
            work_duration: Family::new_with_constructor(duration_histogram),
            event_age: Family::new_with_constructor(age_histogram),
            event_age_skewed: Counter::default(),
            unfinished: Family::default(),
            longest_running: Family::default(),
            refused: Family::default(),
            busy: Counter::default(),
            handles: HashMap::new(),
        };
        metrics.register(
            "switchyard_queue_busy_enqueues",
            "Enqueue batches refused at once because the queue was full and the most batches \
             it holds already waited for room (RESOURCE_EXHAUSTED; nothing of them was added)",
            this.busy.clone(),
        );
        metrics.register(
            "workqueue_depth",
            "Current depth of the work queue",
            this.depth.clone(),
        );
        metrics.register(
            "switchyard_queue_in_flight",
            "Keys leased to workers",
            this.in_flight.clone(),
        );
        metrics.register(
            "workqueue_adds",
            "Adds handled by the work queue",
            this.adds.clone(),
        );
        metrics.register(
            "workqueue_retries",
            "Retries (failed outcomes and expired leases) handled by the work queue",
            this.retries.clone(),
        );
        metrics.register(
            "switchyard_queue_lease_expirations",
            "Leases that timed out before their outcome arrived",
            this.expirations.clone(),
        );
        metrics.register_with_unit(
            "workqueue_queue_duration",
            "How long a key stays ready before it is leased",
            Unit::Seconds,
            this.queue_duration.clone(),
        );
        metrics.register_with_unit(
            "workqueue_work_duration",
            "How long processing a key takes, from lease to outcome",
            Unit::Seconds,
            this.work_duration.clone(),
        );
        metrics.register_with_unit(
            "switchyard_queue_event_age",
            "How old the oldest change a lease answers is when the lease is granted: from the \
             watcher receiving its watch event (the add's observed_at) to the lease, so the \
             watcher's share, the queue's and the wait in the queue. Read with the watcher's \
             and the queue's clocks in step",
            Unit::Seconds,
            this.event_age.clone(),
        );
        metrics.register(
            "switchyard_queue_event_age_skewed",
            "Leases whose oldest change was observed after the lease by this replica's clock \
             (the watcher's clock ahead of it); not in switchyard_queue_event_age",
            this.event_age_skewed.clone(),
        );
        metrics.register_with_unit(
            "workqueue_unfinished_work",
            "Sum of the ages of the leases in flight",
            Unit::Seconds,
            this.unfinished.clone(),
        );
        metrics.register_with_unit(
            "workqueue_longest_running_processor",
            "Age of the oldest lease in flight",
            Unit::Seconds,
            this.longest_running.clone(),
        );
        metrics.register(
            "switchyard_queue_refused_outcomes",
            "Outcomes and lease extensions refused (stale epoch, unknown lease, another stream's lease)",
            this.refused.clone(),
        );
        this
    }

    fn labels(&self, controller: ControllerId, shard: u32) -> QueueLabels {
        QueueLabels {
            name: self.keys.name(controller),
            shard,
        }
    }

    fn handles(&mut self, controller: ControllerId, shard: u32) -> &Handles {
        if !self.handles.contains_key(&(controller, shard)) {
            let labels = self.labels(controller, shard);
            let handles = Handles {
                adds: self.adds.get_or_create(&labels).clone(),
                retries: self.retries.get_or_create(&labels).clone(),
                expirations: self.expirations.get_or_create(&labels).clone(),
                queue_duration: self.queue_duration.get_or_create(&labels).clone(),
                work_duration: self.work_duration.get_or_create(&labels).clone(),
                event_age: self
                    .event_age
                    .get_or_create(&ControllerLabels {
                        name: labels.name.clone(),
                    })
                    .clone(),
            };
            self.handles.insert((controller, shard), handles);
        }
        &self.handles[&(controller, shard)]
    }

    pub fn added(&mut self, controller: ControllerId, shard: u32) {
        self.handles(controller, shard).adds.inc();
    }

    pub fn leased(&mut self, lease: &Lease) {
        let age = lease
            .observed_at
            .map(|observed| SystemTime::now().duration_since(observed));
        if let Some(Err(_)) = age {
            self.event_age_skewed.inc();
        }
        let handles = self.handles(lease.controller(), lease.shard());
        handles.queue_duration.observe(lease.waited.as_secs_f64());
        if let Some(Ok(age)) = age {
            handles.event_age.observe(age.as_secs_f64());
        }
    }

    pub fn completed(
        &mut self,
        controller: ControllerId,
        shard: u32,
        worked: Duration,
        outcome: Outcome,
    ) {
        let handles = self.handles(controller, shard);
        handles.work_duration.observe(worked.as_secs_f64());
        if outcome == Outcome::Failed {
            handles.retries.inc();
        }
    }

    pub fn busy(&self) {
        self.busy.inc();
    }

    pub fn expired(&mut self, controller: ControllerId, shard: u32) {
        let handles = self.handles(controller, shard);
        handles.expirations.inc();
        handles.retries.inc();
    }

    pub fn refused(&self, reason: Refused) {
        let reason = match reason {
            Refused::StaleEpoch => "stale_epoch",
            Refused::UnknownLease => "unknown_lease",
            Refused::ForeignLease => "foreign_lease",
        };
        self.refused.get_or_create(&RefusedLabels { reason }).inc();
    }

    /// Refreshes the gauges from a full set of figures (every served shard).
    pub fn set_gauges(&self, stats: &[ShardStats]) {
        // Shards no longer served drop out of the exposition.
        self.depth.clear();
        self.in_flight.clear();
        self.unfinished.clear();
        self.longest_running.clear();
        for s in stats {
            let labels = self.labels(s.controller, s.shard);
            self.depth
                .get_or_create(&labels)
                .set(i64::try_from(s.depth).unwrap_or(i64::MAX));
            self.in_flight
                .get_or_create(&labels)
                .set(i64::try_from(s.in_flight).unwrap_or(i64::MAX));
            self.unfinished
                .get_or_create(&labels)
                .set(s.unfinished.as_secs_f64());
            self.longest_running
                .get_or_create(&labels)
                .set(s.longest_running.as_secs_f64());
        }
    }
}
