//! The reconciler's metrics, named after controller-runtime's so that its dashboards read
//! them with the prefix changed: reconciles by controller and result, errors, panics,
//! reconcile time and active workers; the latency of reads from the watcher's Cache API; and
//! how long each apiserver client's rate limit held its requests. The apiserver client's
//! requests are counted by the runtime's [`switchyard_runtime::apiserver`] layer.

use std::{sync::atomic::AtomicU64, time::Duration};

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
use switchyard_runtime::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub controller: String,
    /// `success`, `requeue_after` or `error` (failed, panicked or timed out).
    pub result: &'static str,
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

/// How a reconcile ended, for the metrics and the span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    Done,
    RequeueAfter,
    /// Dropped without a retry ([`crate::Action::Forget`]).
    Forgotten,
    Failed,
    Panicked,
    TimedOut,
}

impl Ended {
    /// The `result` label: controller-runtime's values.
    pub fn result(self) -> &'static str {
        match self {
            Self::Done | Self::Forgotten => "success",
            Self::RequeueAfter => "requeue_after",
            Self::Failed | Self::Panicked | Self::TimedOut => "error",
        }
    }

    /// The outcome as the logs and spans name it.
    pub fn outcome(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::RequeueAfter => "requeue_after",
            Self::Forgotten => "forgotten",
            Self::Failed => "failed",
            Self::Panicked => "panicked",
            Self::TimedOut => "timed_out",
        }
    }
}

#[derive(Clone, Debug)]
pub struct ReconcilerMetrics {
    pub reconciles: Family<ResultLabels, Counter>,
    pub errors: Family<ControllerLabels, Counter>,
    pub panics: Family<ControllerLabels, Counter>,
    pub timeouts: Family<ControllerLabels, Counter>,
    pub time: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    pub active_workers: Family<ControllerLabels, Gauge>,
}

impl ReconcilerMetrics {
    pub fn register(metrics: &Metrics) -> Self {
        let this = Self {
            reconciles: Family::default(),
            errors: Family::default(),
            panics: Family::default(),
            timeouts: Family::default(),
            time: Family::new_with_constructor(duration_histogram),
            active_workers: Family::default(),
        };
        metrics.register(
            "switchyard_reconcile",
            "Reconciles finished, by controller and result (success, requeue_after, error)",
            this.reconciles.clone(),
        );
        metrics.register(
            "switchyard_reconcile_errors",
            "Reconciles that ended in an error, a panic or a timeout, by controller",
            this.errors.clone(),
        );
        metrics.register(
            "switchyard_reconcile_panics",
            "Reconciles that panicked, by controller",
            this.panics.clone(),
        );
        metrics.register(
            "switchyard_reconcile_timeouts",
            "Reconciles abandoned after --reconcile-timeout, by controller",
            this.timeouts.clone(),
        );
        metrics.register_with_unit(
            "switchyard_reconcile_time",
            "How long reconciles took, as reported to the queue, by controller",
            Unit::Seconds,
            this.time.clone(),
        );
        metrics.register(
            "switchyard_active_workers",
            "Reconciles running now, by controller",
            this.active_workers.clone(),
        );
        this
    }

    /// Counts a finished reconcile.
    pub fn ended(&self, controller: &str, ended: Ended, took: Duration) {
        let labels = ControllerLabels {
            controller: controller.to_owned(),
        };
        self.reconciles
            .get_or_create(&ResultLabels {
                controller: labels.controller.clone(),
                result: ended.result(),
            })
            .inc();
        match ended {
            Ended::Done | Ended::RequeueAfter | Ended::Forgotten => {}
            Ended::Failed => {
                self.errors.get_or_create(&labels).inc();
            }
            Ended::Panicked => {
                self.errors.get_or_create(&labels).inc();
                self.panics.get_or_create(&labels).inc();
            }
            Ended::TimedOut => {
                self.errors.get_or_create(&labels).inc();
                self.timeouts.get_or_create(&labels).inc();
            }
        }
        self.time.get_or_create(&labels).observe(took.as_secs_f64());
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheCallLabels {
    /// `Get`, `List` or `GetGraphNode`.
    pub call: &'static str,
    /// `ok`, or the gRPC code the watcher answered with (`DeadlineExceeded`: not fresh in
    /// time).
    pub code: String,
}

/// The latency of Cache API calls, each watcher replica tried counted apart.
#[derive(Clone, Debug)]
pub struct CacheMetrics {
    latency: Family<CacheCallLabels, Histogram, fn() -> Histogram>,
    decoded: Family<DecodedLabels, Gauge>,
}

/// The decoded objects `list_shared` keeps of one kind, decoded as one type.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecodedLabels {
    /// `group/version/Kind` (`v1/Pod`).
    pub kind: String,
    /// The type decoded into, unqualified (`Pod`, or a narrower view such as
    /// `NodePlacement`).
    pub decoded_as: String,
}

impl CacheMetrics {
    pub fn register(metrics: &Metrics) -> Self {
        let this = Self {
            latency: Family::new_with_constructor(duration_histogram),
            decoded: Family::default(),
        };
        metrics.register_with_unit(
            "switchyard_cache_request_duration",
            "Cache API call latency to the response headers, by call and code: the watcher's \
             wait for the read's resourceVersion included",
            Unit::Seconds,
            this.latency.clone(),
        );
        metrics.register(
            "switchyard_cache_decoded_objects",
            "Decoded objects this process keeps for shared lists (list_shared), by kind and the \
             type decoded into, as of the kind's last shared list",
            this.decoded.clone(),
        );
        this
    }

    /// `kept` objects of `kind` are kept decoded as `decoded_as`.
    pub fn decoded(&self, kind: String, decoded_as: &str, kept: usize) {
        self.decoded
            .get_or_create(&DecodedLabels {
                kind,
                decoded_as: decoded_as.to_owned(),
            })
            .set(i64::try_from(kept).unwrap_or(i64::MAX));
    }

    pub fn observe(&self, call: &'static str, code: Option<tonic::Code>, took: Duration) {
        let code = code.map_or_else(|| "ok".to_owned(), |code| format!("{code:?}"));
        self.latency
            .get_or_create(&CacheCallLabels { call, code })
            .observe(took.as_secs_f64());
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClientLabels {
    /// The controller whose client it is, `<controller>/events` for its Events' client, or
    /// `default` for the one the service's own calls use.
    pub client: String,
}

/// What the client-side rate limit (`--kube-api-qps`, `--kube-api-burst`) cost each apiserver
/// client: client-go's `rest_client_rate_limiter_duration_seconds`, counted for a client whose
/// requests wait one at a time.
#[derive(Clone, Debug)]
pub struct RateLimitMetrics {
    held: Family<ClientLabels, Counter<f64, AtomicU64>>,
    waited: Family<ClientLabels, Counter>,
}

/// One client's share of [`RateLimitMetrics`].
#[derive(Clone, Debug, Default)]
pub struct RateLimitCounters {
    /// Seconds the client held a request for a token.
    pub held: Counter<f64, AtomicU64>,
    /// Requests that waited for a token.
    pub waited: Counter,
}

impl RateLimitMetrics {
    pub fn register(metrics: &Metrics) -> Self {
        let this = Self {
            held: Family::default(),
            waited: Family::default(),
        };
        metrics.register_with_unit(
            "switchyard_apiserver_rate_limit_wait",
            "Time an apiserver client held its requests for a rate-limit token, by client: \
             requests wait one at a time, so a rate near 1 second a second means the limit \
             bounds the client",
            Unit::Seconds,
            this.held.clone(),
        );
        metrics.register(
            "switchyard_apiserver_rate_limited_requests",
            "Apiserver requests that waited for a rate-limit token, by client",
            this.waited.clone(),
        );
        this
    }

    pub fn client(&self, client: &str) -> RateLimitCounters {
        let labels = ClientLabels {
            client: client.to_owned(),
        };
        RateLimitCounters {
            held: self.held.get_or_create(&labels).clone(),
            waited: self.waited.get_or_create(&labels).clone(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    /// A registered webhook's path (never one a caller made up: those are answered 404).
    pub path: String,
    /// `allowed`, `denied`, `patched`, `converted`, `failed` or `malformed`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookPathLabels {
    pub path: String,
}

/// The webhook server's requests, controller-runtime's `controller_runtime_webhook_*`.
#[derive(Clone, Debug)]
pub struct WebhookMetrics {
    requests: Family<WebhookLabels, Counter>,
    time: Family<WebhookPathLabels, Histogram, fn() -> Histogram>,
}

impl WebhookMetrics {
    pub fn register(metrics: &Metrics) -> Self {
        let this = Self {
            requests: Family::default(),
            time: Family::new_with_constructor(duration_histogram),
        };
        metrics.register(
            "switchyard_webhook_requests",
            "Webhook requests answered, by path and result (allowed, denied, patched, converted, failed, malformed)",
            this.requests.clone(),
        );
        metrics.register_with_unit(
            "switchyard_webhook_latency",
            "How long webhook requests took to answer, by path",
            Unit::Seconds,
            this.time.clone(),
        );
        this
    }

    /// Counts a request to a registered `path`.
    pub fn observe(&self, path: &str, result: &'static str, took: Duration) {
        self.requests
            .get_or_create(&WebhookLabels {
                path: path.to_owned(),
                result,
            })
            .inc();
        self.time
            .get_or_create(&WebhookPathLabels {
                path: path.to_owned(),
            })
            .observe(took.as_secs_f64());
    }
}
