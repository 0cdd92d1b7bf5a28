//! What the end-to-end benchmarks share: the controllers under test, kube-controller-manager
//! or Switchyard (a queue and a watcher in the benchmark's process, reconcilers as processes
//! of their own), started on a control plane and read through their metrics.

#![allow(dead_code, clippy::unwrap_used)]

use std::{collections::BTreeMap, path::Path, time::Duration};

use clap::Parser;
use futures::{StreamExt, stream};
use serde_json::json;
use switchyard_k8s::{
    Api, Client, Namespace, PostParams, k8s_openapi::api::core::v1::ServiceAccount,
};
use switchyard_runtime::Role;
use switchyard_testenv::{ControlPlane, ControlPlaneOptions, InProcess, Pki, ServiceProcess};

/// Every controller process gets the same client limits, on both sides: requests per second
/// and burst of each controller's client.
const CLIENT_QPS: u32 = 100;
const CLIENT_BURST: u32 = 200;
/// The shipped watcher configuration: what the built-in controllers watch.
const WATCHER_CONFIG: &str = include_str!("../../../../deploy/kustomize/base/watcher-config.yaml");
const CONTROLLERS: &str = switchyard_work::builtin::LIST;

#[derive(Clone, Copy, Debug)]
pub enum Under {
    ControllerManager {
        /// Every Deployment and ReplicaSet sync first waits this long
        /// (`kube-controller-manager-slowed`); none when 0.
        latency_ms: u64,
    },
    Switchyard {
        reconcilers: usize,
        latency_ms: u64,
        /// Reconciles at a time per reconciler (`--concurrency`).
        concurrency: usize,
        /// Mutual TLS between the services (the default); plaintext otherwise.
        mtls: bool,
        /// The reconcilers share one process's client limits (each gets its share of the
        /// requests per second and burst), so together they write no faster than one.
        shared_limits: bool,
    },
}

impl Under {
    pub const KCM: Self = Self::ControllerManager { latency_ms: 0 };

    /// In plaintext, as every figure before mutual TLS was measured, so they compare.
    /// Slow reconciles (`latency_ms` above 0) run one at a time per replica: a replica's
    /// capacity (50 reconciles/s at 20 ms) stays below what this machine's control plane
    /// absorbs, so replicas, not the apiserver, bound it. Others run 10 at a time.
    pub const fn switchyard(reconcilers: usize, latency_ms: u64) -> Self {
        Self::Switchyard {
            reconcilers,
            latency_ms,
            concurrency: if latency_ms > 0 { 1 } else { 10 },
            mtls: false,
            shared_limits: false,
        }
    }

    /// `reconcilers` running `concurrency` reconciles at a time, each waiting `latency_ms`.
    pub const fn switchyard_slow(reconcilers: usize, latency_ms: u64, concurrency: usize) -> Self {
        Self::Switchyard {
            reconcilers,
            latency_ms,
            concurrency,
            mtls: false,
            shared_limits: false,
        }
    }

    /// [`Under::switchyard`], the reconcilers sharing one process's client limits.
    pub const fn switchyard_shared_limits(reconcilers: usize) -> Self {
        Self::Switchyard {
            reconcilers,
            latency_ms: 0,
            concurrency: 10,
            mtls: false,
            shared_limits: true,
        }
    }

    pub const fn switchyard_mtls(reconcilers: usize) -> Self {
        Self::Switchyard {
            reconcilers,
            latency_ms: 0,
            concurrency: 10,
            mtls: true,
            shared_limits: false,
        }
    }
}

/// A fresh control plane with `nodes` kwok Nodes and the namespace `namespace`, which gets
/// the `default` ServiceAccount its Pods need (no serviceaccount controller runs here).
pub async fn plane_with_namespace(nodes: usize, namespace: &str) -> (ControlPlane, Client) {
    let plane = ControlPlane::start(ControlPlaneOptions { nodes, dir: None })
        .await
        .unwrap();
    let client = plane.client().await.unwrap();
    let object: Namespace =
        serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    (plane, client)
}

/// The number in the environment variable `variable`, or `default`.
pub fn env_count(variable: &str, default: usize) -> usize {
    std::env::var(variable)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Creates the objects `make(0..count)` makes, 16 at a time.
pub async fn create_all<K>(api: &Api<K>, count: usize, make: impl Fn(usize) -> K)
where
    K: Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    stream::iter(0..count)
        .map(|i| {
            let (api, object) = (api.clone(), make(i));
            async move {
                api.create(&PostParams::default(), &object).await.unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<()>()
        .await;
}

/// The flags that give a service `role`'s certificate, or plaintext.
fn security(mtls: bool, role: Role) -> Vec<String> {
    if mtls {
        Pki::shared().flags(role)
    } else {
        vec!["--insecure-plaintext".to_owned()]
    }
}

/// CPU seconds used so far by `pids` and this process.
pub fn cpu_of(pids: &[u32]) -> f64 {
    pids.iter()
        .chain([&std::process::id()])
        .filter_map(|pid| switchyard_testenv::cpu_seconds(*pid))
        .sum()
}

/// What runs the controllers during one measurement; stopped on drop.
pub enum Controllers {
    Kcm(switchyard_testenv::ControllerManager),
    Switchyard {
        queue: InProcess,
        watcher: InProcess,
        reconcilers: Vec<ServiceProcess>,
    },
}

impl Controllers {
    /// The controller processes (the queue and the watcher run in this one).
    pub fn pids(&self) -> Vec<u32> {
        match self {
            Self::Kcm(kcm) => vec![kcm.pid()],
            Self::Switchyard { reconcilers, .. } => reconcilers.iter().map(|r| r.pid()).collect(),
        }
    }

    pub async fn start(plane: &ControlPlane, under: Under) -> Self {
        match under {
            Under::ControllerManager { latency_ms } => {
                // The controllers a Switchyard reconciler runs by default.
                let controllers = [
                    "deployment-controller",
                    "replicaset-controller",
                    "garbage-collector-controller",
                    "namespace-controller",
                    "serviceaccount-controller",
                    "job-controller",
                    "ttl-after-finished-controller",
                    "cronjob-controller",
                    "pod-garbage-collector-controller",
                    "replicationcontroller-controller",
                    "statefulset-controller",
                    "disruption-controller",
                    "daemonset-controller",
                    "endpointslice-controller",
                    "endpoints-controller",
                    "endpointslice-mirroring-controller",
                ];
                let args = [
                    &format!("--kube-api-qps={CLIENT_QPS}"),
                    &format!("--kube-api-burst={CLIENT_BURST}"),
                    "--use-service-account-credentials=false",
                    // Its work queues' metrics, read without credentials.
                    "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                ];
                let kcm = if latency_ms == 0 {
                    plane.start_controller_manager(&controllers, &args).await
                } else {
                    plane
                        .start_controller_manager_slowed(
                            Duration::from_millis(latency_ms),
                            &controllers,
                            &args,
                        )
                        .await
                };
                Self::Kcm(kcm.unwrap())
            }
            Under::Switchyard {
                reconcilers,
                latency_ms,
                concurrency,
                mtls,
                shared_limits,
            } => {
                let queue = in_process_queue(mtls).await;
                let watcher = in_process_watcher(plane, queue.grpc(), mtls).await;
                watcher.wait_ready(Duration::from_secs(60)).await;
                let mut started = Vec::new();
                for i in 0..reconcilers {
                    let mut args = vec![
                        format!("--kubeconfig={}", plane.kubeconfig().display()),
                        format!("--queue-addr={}", queue.grpc()),
                        format!("--watcher-addr={}", watcher.grpc()),
                        format!("--worker-id=bench-{i}"),
                        format!("--simulated-latency={latency_ms}ms"),
                        format!("--concurrency={concurrency}"),
                        "--log-format=json".to_owned(),
                    ];
                    let share = if shared_limits { reconcilers as u32 } else { 1 };
                    args.push(format!("--kube-api-qps={}", CLIENT_QPS / share));
                    args.push(format!("--kube-api-burst={}", CLIENT_BURST / share));
                    args.extend(security(mtls, Role::Reconciler));
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    let mut process = ServiceProcess::start(
                        Path::new(env!("CARGO_BIN_EXE_switchyard-reconciler")),
                        &args,
                        &[("SWITCHYARD_LOG", "warn")],
                    )
                    .await
                    .unwrap();
                    process.wait_ready().await.unwrap();
                    started.push(process);
                }
                Self::Switchyard {
                    queue,
                    watcher,
                    reconcilers: started,
                }
            }
        }
    }

    /// The reconcilers' time so far (nothing under kube-controller-manager): see
    /// [`print_timings`].
    pub async fn timings(&self) -> BTreeMap<String, f64> {
        match self {
            Self::Switchyard { reconcilers, .. } => timings_of(reconcilers).await,
            _ => BTreeMap::new(),
        }
    }

    pub async fn stop(self) {
        if let Self::Switchyard {
            queue,
            watcher,
            reconcilers,
        } = self
        {
            let requests =
                reconciler_counters(&reconcilers, "switchyard_apiserver_requests_total").await;
            eprintln!("reconciler apiserver requests: {requests:?}");
            print_timings("in all", &timings_of(&reconcilers).await, &BTreeMap::new());
            for reconciler in reconcilers {
                let _ = reconciler.terminate().await;
            }
            watcher.stop().await;
            queue.stop().await;
        }
    }
}

/// The families [`print_timings`] reads: a reconcile's time in all, and its reads of the
/// watcher's cache.
const TIMED: [&str; 2] = [
    "switchyard_reconcile_time_seconds",
    "switchyard_cache_request_duration_seconds",
];

/// Each timed family's `_sum` and `_count` per label set, summed over the reconcilers,
/// keyed `<family>_sum{labels}` and `<family>_count{labels}`.
async fn timings_of(reconcilers: &[ServiceProcess]) -> BTreeMap<String, f64> {
    let mut all = BTreeMap::new();
    for family in TIMED {
        for part in ["sum", "count"] {
            for (labels, value) in
                reconciler_counters(reconcilers, &format!("{family}_{part}")).await
            {
                all.insert(format!("{family}_{part}{{{labels}}}"), value);
            }
        }
    }
    all
}

/// Prints where the reconciles' time went between two [`Controllers::timings`] (`before`
/// empty: since the start): per controller and per cache call, how many and their mean.
pub fn print_timings(phase: &str, after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) {
    let delta = between(before, after);
    for family in TIMED {
        let prefix = format!("{family}_count{{");
        for (key, count) in delta.iter().filter(|(k, _)| k.starts_with(&prefix)) {
            let labels = &key[prefix.len()..key.len() - 1];
            let sum = delta
                .get(&format!("{family}_sum{{{labels}}}"))
                .copied()
                .unwrap_or(0.0);
            eprintln!(
                "{phase}: {family} {labels}: {count} at {:.1} ms on average",
                sum / count * 1e3
            );
        }
    }
}

/// `after - before`, without the zeros.
pub fn between<K: Clone + Ord>(
    before: &BTreeMap<K, f64>,
    after: &BTreeMap<K, f64>,
) -> BTreeMap<K, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// The samples of the counter `name` in a Prometheus text exposition, by label set.
pub fn counter(text: &str, name: &str) -> BTreeMap<String, f64> {
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name).and_then(|r| r.strip_prefix('{')) else {
            continue;
        };
        if let Some((labels, value)) = rest.rsplit_once("} ") {
            *samples.entry(labels.to_owned()).or_default() += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    samples
}

/// The counter `name` summed over the reconcilers, by label set.
async fn reconciler_counters(reconcilers: &[ServiceProcess], name: &str) -> BTreeMap<String, f64> {
    let mut sums: BTreeMap<String, f64> = BTreeMap::new();
    for reconciler in reconcilers {
        let (_, text) = reconciler.admin_get("/metrics").await.unwrap();
        for (labels, value) in counter(&text, name) {
            *sums.entry(labels).or_default() += value;
        }
    }
    sums
}

/// The value of the label `name` in a series' label set (`a="x",b="y"`).
pub fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    labels.split(',').find_map(|l| {
        let (key, value) = l.split_once('=')?;
        (key == name).then(|| value.trim_matches('"'))
    })
}

/// The work queues' adds and retries of the controllers named `names`, summed over the other
/// labels (Switchyard's shards), keyed `metric{name="..."}`.
fn queue_counters(text: &str, names: &[&str]) -> BTreeMap<String, f64> {
    let mut sums = BTreeMap::new();
    for family in ["workqueue_adds_total", "workqueue_retries_total"] {
        for (labels, value) in counter(text, family) {
            if let Some(name) = label(&labels, "name").filter(|n| names.contains(n)) {
                *sums
                    .entry(format!("{family}{{name=\"{name}\"}}"))
                    .or_default() += value;
            }
        }
    }
    sums
}

/// One series of the apiserver's `apiserver_request_total`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Request {
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub code: String,
}

impl Request {
    /// A write of the controllers: a write verb on Pods (not their binding or status, which
    /// the scheduler and kwok write), ReplicaSets, Deployments (not their creation, which the
    /// benchmark makes) and Events.
    pub fn controller_write(&self) -> bool {
        matches!(self.verb.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
            && match (self.resource.as_str(), self.subresource.as_str()) {
                ("pods" | "replicasets" | "events", "")
                | ("replicasets" | "deployments", "status") => true,
                ("deployments", "") => self.verb != "POST",
                _ => false,
            }
    }

    pub fn read(&self) -> bool {
        matches!(self.verb.as_str(), "GET" | "LIST")
    }

    /// `resource/subresource verb`.
    pub fn name(&self) -> String {
        format!("{}/{} {}", self.resource, self.subresource, self.verb)
    }
}

/// The apiserver's requests so far, by verb, resource, subresource and code (summed over the
/// other labels: group, version, scope, component).
pub async fn apiserver_requests(client: &switchyard_k8s::Client) -> BTreeMap<Request, f64> {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(request).await.unwrap();
    let mut requests = BTreeMap::new();
    for (labels, value) in counter(&text, "apiserver_request_total") {
        let of = |name: &str| label(&labels, name).unwrap_or_default().to_owned();
        let series = Request {
            verb: of("verb"),
            resource: of("resource"),
            subresource: of("subresource"),
            code: of("code"),
        };
        *requests.entry(series).or_default() += value;
    }
    requests
}

/// The requests of `requests` that `keep` keeps, summed by `resource/subresource verb`.
pub fn requests_by_name(
    requests: &BTreeMap<Request, f64>,
    keep: impl Fn(&Request) -> bool,
) -> BTreeMap<String, f64> {
    let mut sums = BTreeMap::new();
    for (request, value) in requests.iter().filter(|(r, _)| keep(r)) {
        *sums.entry(request.name()).or_default() += value;
    }
    sums
}

/// The controllers' successful writes (2xx) by `resource/subresource verb`.
pub fn controller_writes(requests: &BTreeMap<Request, f64>) -> BTreeMap<String, f64> {
    requests_by_name(requests, |r| {
        r.controller_write() && r.code.starts_with('2')
    })
}

/// The names of the Deployment and ReplicaSet controllers' work queues in
/// kube-controller-manager's metrics and in Switchyard's.
const KCM_QUEUES: [&str; 2] = ["deployment", "replicaset"];
const SWITCHYARD_QUEUES: [&str; 2] = ["apps/v1/Deployment", "apps/v1/ReplicaSet"];

impl Controllers {
    /// The metrics of whatever holds the work queues (kube-controller-manager, or the
    /// queue), and the names of the Deployment and ReplicaSet controllers' queues in them.
    async fn queue_metrics(&self) -> (String, [&'static str; 2]) {
        match self {
            Self::Kcm(kcm) => (kcm.metrics().await.unwrap(), KCM_QUEUES),
            Self::Switchyard { queue, .. } => {
                (queue.admin_get("/metrics").await.1, SWITCHYARD_QUEUES)
            }
        }
    }

    /// The work counters so far, each keyed `metric{labels}`: the work queues' adds and
    /// retries by controller (kube-controller-manager's Deployment and ReplicaSet queues, or
    /// Switchyard's queue summed over its shards) and, for Switchyard, the reconciles by
    /// controller and result.
    pub async fn work(&self) -> BTreeMap<String, f64> {
        let (text, names) = self.queue_metrics().await;
        let mut work = queue_counters(&text, &names);
        if let Self::Switchyard { reconcilers, .. } = self {
            for (labels, value) in
                reconciler_counters(reconcilers, "switchyard_reconcile_total").await
            {
                work.insert(format!("reconciles{{{labels}}}"), value);
            }
        }
        work
    }

    /// How long keys of the Deployment and ReplicaSet controllers waited in their work queue
    /// before a worker took them (`workqueue_queue_duration_seconds`, with client-go's buckets
    /// on both sides), the two controllers together.
    pub async fn queue_wait(&self) -> Buckets {
        let (text, names) = self.queue_metrics().await;
        Buckets::parse(&text, "workqueue_queue_duration_seconds", "name", &names)
    }

    /// What the client-side rate limits (`--kube-api-qps`, `--kube-api-burst`) have cost so
    /// far. kube-controller-manager, over all its clients
    /// (`rest_client_rate_limiter_duration_seconds`, each request's own wait, so concurrent
    /// waits add up): `requests`, `waited > 5 ms`, `seconds waited`. Switchyard, per client
    /// summed over the reconcilers, whose requests wait one at a time: `<client> held s` and
    /// `<client> waited`.
    pub async fn rate_limits(&self) -> BTreeMap<String, f64> {
        match self {
            Self::Kcm(kcm) => {
                let text = kcm.metrics().await.unwrap();
                let family = "rest_client_rate_limiter_duration_seconds";
                let sum = |name: &str| counter(&text, name).values().sum::<f64>();
                let buckets = Buckets::parse_where(&text, family, |_| true);
                let within = buckets
                    .0
                    .iter()
                    .find(|(le, _)| *le == 0.005)
                    .map_or(0.0, |(_, count)| *count);
                BTreeMap::from([
                    ("requests".to_owned(), buckets.count()),
                    ("waited > 5 ms".to_owned(), buckets.count() - within),
                    ("seconds waited".to_owned(), sum(&format!("{family}_sum"))),
                ])
            }
            Self::Switchyard { reconcilers, .. } => {
                let mut costs = BTreeMap::new();
                for (name, what) in [
                    (
                        "switchyard_apiserver_rate_limit_wait_seconds_total",
                        "held s",
                    ),
                    ("switchyard_apiserver_rate_limited_requests_total", "waited"),
                ] {
                    for (labels, value) in reconciler_counters(reconcilers, name).await {
                        let client = label(&labels, "client").unwrap_or_default();
                        costs.insert(format!("{client} {what}"), value);
                    }
                }
                costs
            }
        }
    }

    /// Keys of the Deployment and ReplicaSet controllers waiting in their work queues now
    /// (`workqueue_depth`; keys held back for later are not counted, on either side).
    pub async fn queue_depth(&self) -> f64 {
        let (text, names) = self.queue_metrics().await;
        counter(&text, "workqueue_depth")
            .into_iter()
            .filter(|(labels, _)| label(labels, "name").is_some_and(|n| names.contains(&n)))
            .map(|(_, depth)| depth)
            .sum()
    }

    /// Where Switchyard's reconciles wait, so far: the reconcilers' Cache API calls
    /// (`switchyard_cache_request_duration_seconds`, `Get` and `List`), their apiserver writes
    /// (`switchyard_apiserver_request_duration_seconds`: create, update, patch, delete), and
    /// the watcher's waits for a read's resourceVersion (`switchyard_cache_read_wait_seconds`,
    /// every resource). Empty for kube-controller-manager.
    pub async fn waits(&self) -> BTreeMap<&'static str, Buckets> {
        let Self::Switchyard {
            watcher,
            reconcilers,
            ..
        } = self
        else {
            return BTreeMap::new();
        };
        let (mut cache, mut writes) = (Buckets::default(), Buckets::default());
        for reconciler in reconcilers {
            let (_, text) = reconciler.admin_get("/metrics").await.unwrap();
            cache = cache.plus(&Buckets::parse(
                &text,
                "switchyard_cache_request_duration_seconds",
                "call",
                &["Get", "List"],
            ));
            writes = writes.plus(&Buckets::parse(
                &text,
                "switchyard_apiserver_request_duration_seconds",
                "verb",
                &["create", "update", "patch", "delete"],
            ));
        }
        let (_, text) = watcher.admin_get("/metrics").await;
        let read_wait = Buckets::parse_where(&text, "switchyard_cache_read_wait_seconds", |_| true);
        BTreeMap::from([
            ("cache calls", cache),
            ("apiserver writes", writes),
            ("watcher read waits", read_wait),
        ])
    }

    /// How long the Deployment and ReplicaSet controllers' reconciles took
    /// (`switchyard_reconcile_time_seconds`, summed over the reconcilers), or
    /// kube-controller-manager's syncs (its work queues' `workqueue_work_duration_seconds`,
    /// in client-go's buckets, a factor of 10 apart).
    pub async fn reconcile_time(&self) -> Buckets {
        let reconcilers = match self {
            Self::Kcm(kcm) => {
                let text = kcm.metrics().await.unwrap();
                return Buckets::parse(
                    &text,
                    "workqueue_work_duration_seconds",
                    "name",
                    &KCM_QUEUES,
                );
            }
            Self::Switchyard { reconcilers, .. } => reconcilers,
        };
        let mut all = Buckets::default();
        for reconciler in reconcilers {
            let (_, text) = reconciler.admin_get("/metrics").await.unwrap();
            let one = Buckets::parse(
                &text,
                "switchyard_reconcile_time_seconds",
                "controller",
                &SWITCHYARD_QUEUES,
            );
            all = all.plus(&one);
        }
        all
    }
}

async fn in_process_queue(mtls: bool) -> InProcess {
    let flags: Vec<String> = ["--log-level=warn".to_owned()]
        .into_iter()
        .chain(security(mtls, Role::Queue))
        .collect();
    InProcess::start_on_own_runtime("queue", move || async move {
        let controllers: Vec<&str> = CONTROLLERS.split(',').collect();
        switchyard_queue::Args::start_local(256, &controllers, flags).await
    })
    .await
    .unwrap()
}

async fn in_process_watcher(
    plane: &ControlPlane,
    queue: std::net::SocketAddr,
    mtls: bool,
) -> InProcess {
    let config = plane.dir().join("watcher-bench.yaml");
    let text = match std::env::var_os("SWITCHYARD_BENCH_WATCHER_CONFIG") {
        Some(file) => std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("SWITCHYARD_BENCH_WATCHER_CONFIG={file:?}: {e}")),
        None => WATCHER_CONFIG.to_owned(),
    };
    std::fs::write(&config, text).unwrap();
    let args = vec![
        "switchyard-watcher".to_owned(),
        "--admin-addr=127.0.0.1:0".into(),
        "--grpc-addr=127.0.0.1:0".into(),
        format!("--kubeconfig={}", plane.kubeconfig().display()),
        format!("--config={}", config.display()),
        format!("--queue-addr={queue}"),
        "--log-level=warn".into(),
    ]
    .into_iter()
    .chain(security(mtls, Role::Watcher));
    let args = switchyard_watcher::Args::try_parse_from(args).unwrap();
    InProcess::start_on_own_runtime("watcher", move || args.start())
        .await
        .unwrap()
}

/// A histogram's cumulative counts by upper bound (`le`), smallest bound first.
#[derive(Clone, Debug, Default)]
pub struct Buckets(pub Vec<(f64, f64)>);

impl Buckets {
    /// The buckets of `family` (`<family>_bucket` series) in a Prometheus text exposition,
    /// summed over the series whose label `label` is one of `names`.
    pub fn parse(text: &str, family: &str, label_name: &str, names: &[&str]) -> Self {
        Self::parse_where(text, family, |labels| {
            label(labels, label_name).is_some_and(|n| names.contains(&n))
        })
    }

    /// The buckets of `family` summed over the series whose label set `keep` keeps.
    pub fn parse_where(text: &str, family: &str, keep: impl Fn(&str) -> bool) -> Self {
        let mut sums: Vec<(f64, f64)> = Vec::new();
        for (labels, value) in counter(text, &format!("{family}_bucket")) {
            if !keep(&labels) {
                continue;
            }
            let Some(le) = label(&labels, "le").and_then(|le| le.parse::<f64>().ok()) else {
                continue;
            };
            match sums.iter_mut().find(|(bound, _)| *bound == le) {
                Some((_, sum)) => *sum += value,
                None => sums.push((le, value)),
            }
        }
        sums.sort_by(|a, b| a.0.total_cmp(&b.0));
        Self(sums)
    }

    /// The counts observed since `before`.
    pub fn since(&self, before: &Self) -> Self {
        Self(
            self.0
                .iter()
                .map(|(le, count)| {
                    let earlier = before
                        .0
                        .iter()
                        .find(|(bound, _)| bound == le)
                        .map_or(0.0, |(_, c)| *c);
                    (*le, count - earlier)
                })
                .collect(),
        )
    }

    /// Observations in all (the `+Inf` bucket).
    pub fn count(&self) -> f64 {
        self.0.last().map_or(0.0, |(_, c)| *c)
    }

    /// The share of observations at or below `bound`, which must be a bucket's bound; 1 when
    /// nothing was observed.
    pub fn share_within(&self, bound: f64) -> f64 {
        let count = self.count();
        if count == 0.0 {
            return 1.0;
        }
        let within = self
            .0
            .iter()
            .find(|(le, _)| *le == bound)
            .unwrap_or_else(|| panic!("no bucket with the bound {bound}"))
            .1;
        within / count
    }
    /// Both histograms' counts added, bound by bound.
    fn plus(&self, other: &Self) -> Self {
        if self.0.is_empty() {
            return other.clone();
        }
        Self(
            self.0
                .iter()
                .zip(&other.0)
                .map(|((le, a), (_, b))| (*le, a + b))
                .collect(),
        )
    }

    /// The smallest bucket bound with at least `q` of the observations at or below it.
    pub fn quantile_bound(&self, q: f64) -> f64 {
        let count = self.count();
        self.0
            .iter()
            .find(|(_, c)| *c >= q * count)
            .map_or(f64::INFINITY, |(le, _)| *le)
    }
}

/// Prints each ratio `(figure, numerator, denominator)` of `area` whose two figures were
/// measured (and whose denominator is not 0).
pub fn print_ratios(area: &str, measured: &BTreeMap<&str, f64>, ratios: &[(&str, &str, &str)]) {
    for (name, numerator, denominator) in ratios {
        if let (Some(n), Some(d)) = (measured.get(numerator), measured.get(denominator))
            && *d > 0.0
        {
            println!("bench {area}.{name} {:.2} ratio", n / d);
        }
    }
}
