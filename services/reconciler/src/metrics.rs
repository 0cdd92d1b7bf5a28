//! The reconciler's metrics: every outcome by controller and kind, reconcile durations, and
//! reconciles in flight.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
};
use switchyard_runtime::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub controller: String,
    /// `done`, `requeue_after`, `failed`, `panicked` or `timed_out`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: String,
}

/// Buckets from 1 ms doubling to about 33 s: a reconcile is usually a few apiserver calls,
/// and the default timeout is 60 s.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

#[derive(Clone, Debug)]
pub struct ReconcilerMetrics {
    pub outcomes: Family<OutcomeLabels, Counter>,
    pub durations: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    pub in_flight: Gauge,
}

impl ReconcilerMetrics {
    pub fn register(metrics: &Metrics) -> Self {
        let this = Self {
            outcomes: Family::default(),
            durations: Family::new_with_constructor(duration_histogram),
            in_flight: Gauge::default(),
        };
        metrics.register(
            "switchyard_reconciles",
            "Reconciles finished, by controller and outcome",
            this.outcomes.clone(),
        );
        metrics.register(
            "switchyard_reconcile_duration_seconds",
            "How long reconciles took, as reported to the queue, by controller",
            this.durations.clone(),
        );
        metrics.register(
            "switchyard_reconciles_in_flight",
            "Reconciles running now",
            this.in_flight.clone(),
        );
        this
    }
}
