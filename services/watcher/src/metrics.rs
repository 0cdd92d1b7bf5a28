//! The watcher's metrics: watch events and relists per resource, cached objects, running
//! informers and registrations, keys routed to the queue, and how long Cache API reads waited
//! for their resourceVersion.

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
use switchyard_queue_client::EnqueueMetrics;
use switchyard_runtime::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    pub resource: String,
    /// `added`, `modified`, `deleted`, `listed`, `error`.
    pub event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResyncLabels {
    /// `periodic`, `shard_moved` or `requested`.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabels {
    /// The controller whose objects' status the peer wrote.
    pub controller: String,
    /// The peer's field manager, one of `switchyard_watcher_core::peer::PEERS`.
    pub manager: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupVersionLabels {
    /// `apps/v1`, or `v1` for the core group.
    pub group_version: String,
}

/// Buckets from 0.5 ms doubling to about 16 s: a read whose version the cache already holds
/// waits for nothing; one that waits for a watch event waits milliseconds; a read gives up
/// after its `max_wait` (at most 30 s).
fn wait_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

#[derive(Clone, Debug)]
pub struct WatcherMetrics {
    pub watch_events: Family<EventLabels, Counter>,
    pub relists: Family<ResourceLabels, Counter>,
    pub cached_objects: Family<ResourceLabels, Gauge>,
    pub informers: Family<ResourceLabels, Gauge>,
    pub registrations: Gauge,
    pub resyncs: Family<ResyncLabels, Counter>,
    pub keys_sent: Counter,
    pub keys_dropped: Counter,
    pub enqueue_retries: Counter,
    pub pending_keys: Gauge,
    pub graph_objects: Gauge,
    pub graph_resources: Gauge,
    pub discovery_failures: Family<GroupVersionLabels, Counter>,
    pub read_wait: Family<ResourceLabels, Histogram, fn() -> Histogram>,
    pub peer_writes: Family<PeerLabels, Counter>,
    pub standing_down: Family<ControllerLabels, Gauge>,
    pub stood_down_keys: Family<ControllerLabels, Counter>,
}

impl Default for WatcherMetrics {
    fn default() -> Self {
        Self {
            watch_events: Family::default(),
            relists: Family::default(),
            cached_objects: Family::default(),
            informers: Family::default(),
            registrations: Gauge::default(),
            resyncs: Family::default(),
            keys_sent: Counter::default(),
            keys_dropped: Counter::default(),
            enqueue_retries: Counter::default(),
            pending_keys: Gauge::default(),
            graph_objects: Gauge::default(),
            graph_resources: Gauge::default(),
            discovery_failures: Family::default(),
            read_wait: Family::new_with_constructor(wait_histogram),
            peer_writes: Family::default(),
            standing_down: Family::default(),
            stood_down_keys: Family::default(),
        }
    }
}

impl WatcherMetrics {
    pub fn register(metrics: &Metrics) -> Self {
        let this = Self::default();
        metrics.register(
            "switchyard_watch_events",
            "Watch events received, by resource and event (listed = from a list or relist)",
            this.watch_events.clone(),
        );
        metrics.register(
            "switchyard_watch_relists",
            "Lists of a resource after the first (410 Gone, or a watch that could not resume)",
            this.relists.clone(),
        );
        metrics.register(
            "switchyard_cache_objects",
            "Objects in the watcher's cache, by resource",
            this.cached_objects.clone(),
        );
        metrics.register(
            "switchyard_watcher_informers",
            "Informers running, by resource (one per watched kind, however many need it); \
             a kind no one needs any more has no series",
            this.informers.clone(),
        );
        metrics.register(
            "switchyard_watcher_registrations",
            "Watch registrations open (Watches.Register streams)",
            this.registrations.clone(),
        );
        metrics.register(
            "switchyard_watcher_resyncs",
            "Resyncs that re-sent cached keys, by reason",
            this.resyncs.clone(),
        );
        metrics.register(
            "switchyard_watcher_keys_sent",
            "Keys acknowledged by a queue replica",
            this.keys_sent.clone(),
        );
        metrics.register(
            "switchyard_watcher_keys_dropped",
            "Keys a queue refused as invalid (a malformed key, or a new controller past its --max-controllers)",
            this.keys_dropped.clone(),
        );
        metrics.register(
            "switchyard_watcher_enqueue_retries",
            "Batches of keys the queue did not add and that were retried (queue unavailable, moving or full)",
            this.enqueue_retries.clone(),
        );
        metrics.register(
            "switchyard_watcher_pending_keys",
            "Keys waiting to be sent to the queue",
            this.pending_keys.clone(),
        );
        metrics.register(
            "switchyard_watcher_graph_objects",
            "Objects in the garbage collector's graph (every deletable resource, metadata only)",
            this.graph_objects.clone(),
        );
        metrics.register(
            "switchyard_watcher_graph_resources",
            "Resources the garbage collector's graph watches",
            this.graph_resources.clone(),
        );
        metrics.register(
            "switchyard_watcher_discovery_failures",
            "Group versions whose discovery failed (stale aggregated APIs), by group version",
            this.discovery_failures.clone(),
        );
        metrics.register_with_unit(
            "switchyard_cache_read_wait",
            "How long Cache API reads that asked for a resourceVersion waited for the cache \
             (or the stream of the namespace read) to reach it, by resource; reads that gave up \
             included",
            Unit::Seconds,
            this.read_wait.clone(),
        );
        metrics.register(
            "switchyard_watcher_peer_status_writes",
            "Changes whose newest status write (for the objects a controller writes instead, \
             such as EndpointSlices: newest write) is another controller manager's, recent \
             and since this watcher started, by the controller and the manager: that \
             controller also runs there (docs/deploy.md, handover)",
            this.peer_writes.clone(),
        );
        metrics.register(
            "switchyard_watcher_standing_down",
            "1 while the controller's keys are held back because another controller manager \
             writes its objects' status (--on-peer-writes=stand-down)",
            this.standing_down.clone(),
        );
        metrics.register(
            "switchyard_watcher_stood_down_keys",
            "Keys not sent because their controller stands down for another controller manager",
            this.stood_down_keys.clone(),
        );
        this
    }
}

/// The queue client's enqueuer reports the keys it routes here.
impl EnqueueMetrics for WatcherMetrics {
    fn pending(&self, keys: usize) {
        self.pending_keys.set(keys as i64);
    }

    fn sent(&self, keys: usize) {
        self.keys_sent.inc_by(keys as u64);
    }

    fn dropped(&self, keys: usize) {
        self.keys_dropped.inc_by(keys as u64);
    }

    fn retried(&self) {
        self.enqueue_retries.inc();
    }
}
