//! The Lookup controller scaled out, end to end on the harness's real control plane.
//!
//! ```text
//!  test: lookup service (axum, loopback, 200 ms a call) ◄── GET ?q= ── reconciler processes
//!        queue (in process; external metrics API on loopback) ◄── Work ──┘  (1, then 4)
//!        watcher (in process; the controller registers its watch at start)
//! ```
//!
//! A backlog of Lookups drains through one reconciler replica, then a second backlog of the
//! same size through four. Each replica makes at most two calls at once (`--concurrency=2`):
//! the lookup service never has more than two calls in flight from one replica, and more
//! than two replicas' worth at once from four, which it can only have if the queue spreads
//! the keys over them and they work side by side. How much faster four drain is printed, not
//! asserted: a speed-up is a benchmark figure, and a loaded machine moves it. The backlog
//! the queue's external metrics API reports at its peak asks the example's HPA
//! (`deploy/hpa.yaml`) for four replicas, and for one once it has drained:
//! the test applies the HPA's formula to what the API answers (kube-controller-manager's HPA
//! itself scaling on that API is `tests/hpa.rs`).
//!
//! A second test follows one Lookup's trace, as Jaeger or Tempo would show it, through a real
//! OpenTelemetry Collector: the watcher's event, the queue's enqueue and lease, the replica's
//! reconcile and, inside it, the slow call and the status write.

#![allow(clippy::unwrap_used)]

use std::{
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    Router,
    extract::{Query, State},
    routing::get,
};
use clap::Parser;
use serde_json::Value;
use switchyard_example_lookup::Lookup;
use switchyard_k8s::{Api, Client, PostParams, kube::api::ListParams};
use switchyard_runtime::Role;
use switchyard_testenv::{
    Collector, ControlPlane, ExportedSpan, InProcess, Pki, ServiceProcess, TestNamespace,
};

/// What one call to the lookup service takes: the slow external system.
const CALL: Duration = Duration::from_millis(200);
/// Calls one replica makes at once.
const CONCURRENCY: u32 = 2;
/// Lookups in each backlog: ten seconds of work for one replica.
const BACKLOG: usize = 100;
/// Creations in flight at once, so a backlog is created far faster than one replica drains it.
const CREATORS: usize = 10;
const SHARDS: u32 = 16;
const CONTROLLER_LABEL: &str = "example.switchyard.io.v1.Lookup";
const WITHIN: Duration = Duration::from_secs(120);

/// One call the lookup service answered.
#[derive(Clone, Debug)]
struct Call {
    query: String,
    started: Instant,
    ended: Instant,
}

/// The calls the lookup service answered, and how many it has in flight.
#[derive(Debug, Default)]
struct Record {
    answered: Vec<Call>,
    in_flight: usize,
    /// The most calls in flight at once since the last [`Record::take_peak`].
    peak: usize,
}

impl Record {
    fn take_peak(&mut self) -> usize {
        std::mem::replace(&mut self.peak, self.in_flight)
    }
}

type Calls = Arc<Mutex<Record>>;

/// The external service: answers `GET /lookup?q=<query>` after [`CALL`], recording the call.
async fn lookup_service() -> (SocketAddr, Calls) {
    async fn answer(
        State(calls): State<Calls>,
        Query(params): Query<std::collections::HashMap<String, String>>,
    ) -> String {
        /// Counts a call in flight until it ends, answered or dropped by its caller.
        struct InFlight(Calls);
        impl Drop for InFlight {
            fn drop(&mut self) {
                self.0.lock().unwrap().in_flight -= 1;
            }
        }
        let started = Instant::now();
        let in_flight = {
            let mut record = calls.lock().unwrap();
            record.in_flight += 1;
            record.peak = record.peak.max(record.in_flight);
            InFlight(calls.clone())
        };
        tokio::time::sleep(CALL).await;
        drop(in_flight);
        let query = params.get("q").cloned().unwrap_or_default();
        calls.lock().unwrap().answered.push(Call {
            query: query.clone(),
            started,
            ended: Instant::now(),
        });
        format!("answer to {query}")
    }
    let calls = Calls::default();
    let app = Router::new()
        .route("/lookup", get(answer))
        .with_state(calls.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, calls)
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A queue started with the built-in controllers' names only (it learns the Lookup
/// controller's at run time), serving its external metrics API on `metrics`.
async fn queue(metrics: SocketAddr) -> InProcess {
    let mut args = vec![
        "switchyard-queue".to_owned(),
        "--admin-addr=127.0.0.1:0".into(),
        "--grpc-addr=127.0.0.1:0".into(),
        format!("--shard-count={SHARDS}"),
        format!("--external-metrics-addr={metrics}"),
        // Read straight by the test, not through the aggregation layer.
        "--external-metrics-insecure-any-client".into(),
        "--drain-grace=1s".into(),
    ];
    args.extend(Pki::shared().flags(Role::Queue));
    let (rt, grpc) = switchyard_queue::Args::try_parse_from(args)
        .unwrap()
        .start()
        .await
        .unwrap();
    InProcess::spawn(rt, Some(grpc))
}

/// A watcher of `namespace` whose configuration names no controller.
async fn watcher(plane: &ControlPlane, namespace: &str, queue: SocketAddr) -> InProcess {
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        format!("shardCount: {SHARDS}\nnamespaces:\n  include: [{namespace}]\nregistrations:\n  - serviceAccount: switchyard-reconciler\n    kinds:\n      - {{apiVersion: example.switchyard.io/v1, kind: Lookup, objects: full}}\n"),
    )
    .unwrap();
    let path = config.into_temp_path().keep().unwrap();
    let mut args = vec![
        "switchyard-watcher".to_owned(),
        "--admin-addr=127.0.0.1:0".into(),
        "--grpc-addr=127.0.0.1:0".into(),
        format!("--kubeconfig={}", plane.kubeconfig().display()),
        format!("--config={}", path.display()),
        format!("--queue-addr={queue}"),
    ];
    args.extend(Pki::shared().flags(Role::Watcher));
    let (rt, grpc) = switchyard_watcher::Args::try_parse_from(args)
        .unwrap()
        .start()
        .await
        .unwrap();
    let watcher = InProcess::spawn(rt, Some(grpc));
    watcher.wait_ready(Duration::from_secs(60)).await;
    watcher
}

/// One replica of the example's binary, as its Deployment would run it, with `envs`.
async fn replica(
    plane: &ControlPlane,
    queue: SocketAddr,
    watcher: SocketAddr,
    service: SocketAddr,
    envs: &[(&str, &str)],
) -> ServiceProcess {
    let flags = [
        format!("--kubeconfig={}", plane.kubeconfig().display()),
        format!("--queue-addr={queue}"),
        format!("--watcher-addr={watcher}"),
        format!("--shard-count={SHARDS}"),
        format!("--concurrency={CONCURRENCY}"),
        format!("--lookup-url=http://{service}/lookup"),
    ];
    let tls = Pki::shared().flags(Role::Reconciler);
    let args: Vec<&str> = flags.iter().chain(&tls).map(String::as_str).collect();
    let binary = Path::new(env!("CARGO_BIN_EXE_switchyard-example-lookup"));
    let mut process = ServiceProcess::start(binary, &args, envs).await.unwrap();
    // Ready once its watch is registered and listed, and its Work stream is open.
    process
        .wait_ready()
        .await
        .unwrap_or_else(|e| panic!("replica not ready: {e}\n{}", process.log()));
    process
}

async fn install_crd(client: &Client) {
    switchyard_sdk_test::install_crd::<Lookup>(client).await;
}

/// The Lookup controller's backlog as the HPA reads it: the queue's external metric.
async fn backlog(metrics: SocketAddr) -> u64 {
    // The API makes itself a certificate when given none; the aggregation layer is told to
    // skip verifying it (insecureSkipTLSVerify), and so is this reader.
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let body: Value = http
        .get(format!(
            "https://{metrics}/apis/external.metrics.k8s.io/v1beta1/namespaces/default/\
             switchyard_queue_backlog?labelSelector=controller%3D{CONTROLLER_LABEL}"
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["value"].as_str().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// The example's HPA: its replica bounds and the backlog per replica it aims at.
struct Hpa {
    min: u64,
    max: u64,
    per_replica: u64,
}

impl Hpa {
    fn shipped() -> Self {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/hpa.yaml");
        let hpa: Value = serde_norway::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let spec = &hpa["spec"];
        let metric = &spec["metrics"][0]["external"];
        assert_eq!(
            metric["metric"]["selector"]["matchLabels"]["controller"],
            CONTROLLER_LABEL
        );
        Self {
            min: spec["minReplicas"].as_u64().unwrap(),
            max: spec["maxReplicas"].as_u64().unwrap(),
            per_replica: metric["target"]["averageValue"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap(),
        }
    }

    /// The replicas the HPA asks for on an AverageValue target: the backlog over the
    /// target, rounded up, within the bounds.
    fn replicas(&self, backlog: u64) -> u64 {
        backlog.div_ceil(self.per_replica).clamp(self.min, self.max)
    }
}

/// Creates [`BACKLOG`] Lookups named `<batch>-<i>`, [`CREATORS`] at a time.
async fn create_backlog(lookups: &Api<Lookup>, batch: &str) {
    let mut creating = tokio::task::JoinSet::new();
    for creator in 0..CREATORS {
        let lookups = lookups.clone();
        let batch = batch.to_owned();
        creating.spawn(async move {
            for i in (creator..BACKLOG).step_by(CREATORS) {
                let name = format!("{batch}-{i}");
                let lookup = Lookup::new(
                    &name,
                    switchyard_example_lookup::LookupSpec {
                        query: name.clone(),
                    },
                );
                lookups
                    .create(&PostParams::default(), &lookup)
                    .await
                    .unwrap();
            }
        });
    }
    creating.join_all().await;
}

/// The highest backlog the HPA's metric shows until `batch` is answered, and how long the
/// answers took: from the first call of the batch to the end of its last.
async fn drain(metrics: SocketAddr, calls: &Calls, batch: &str) -> (u64, Duration) {
    let prefix = format!("{batch}-");
    let deadline = Instant::now() + WITHIN;
    let mut peak = 0;
    loop {
        let answered: Vec<Call> = calls
            .lock()
            .unwrap()
            .answered
            .iter()
            .filter(|c| c.query.starts_with(&prefix))
            .cloned()
            .collect();
        let mut queries: Vec<&str> = answered.iter().map(|c| c.query.as_str()).collect();
        queries.sort_unstable();
        queries.dedup();
        if queries.len() == BACKLOG {
            let first = answered.iter().map(|c| c.started).min().unwrap();
            let last = answered.iter().map(|c| c.ended).max().unwrap();
            return (peak, last - first);
        }
        assert!(
            Instant::now() < deadline,
            "{batch}: {} of {BACKLOG} Lookups answered within {WITHIN:?}",
            queries.len()
        );
        peak = peak.max(backlog(metrics).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every Lookup of `batch` has its answer in its status, as `kubectl get lookups` shows.
async fn assert_answered(lookups: &Api<Lookup>, batch: &str) {
    let deadline = Instant::now() + WITHIN;
    loop {
        let list = lookups.list(&ListParams::default()).await.unwrap();
        let answered = list
            .items
            .iter()
            .filter(|l| l.metadata.name.as_deref().unwrap().starts_with(batch))
            .filter(|l| {
                l.status.as_ref().and_then(|s| s.answer.as_deref())
                    == Some(format!("answer to {}", l.spec.query).as_str())
            })
            .count();
        if answered == BACKLOG {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{batch}: {answered} of {BACKLOG} statuses answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Lookup reconciles one replica has finished, from its metrics.
async fn reconciles(replica: &ServiceProcess) -> f64 {
    let text = reqwest::get(format!("http://{}/metrics", replica.admin_addr()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("switchyard_reconcile_total{") && l.contains("Lookup"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_share_a_backlog_of_slow_calls_and_call_side_by_side() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    install_crd(&client).await;
    let ns = TestNamespace::create(plane, &client, "lookup")
        .await
        .unwrap();
    let lookups: Api<Lookup> = Api::namespaced(client.clone(), ns.name());
    let hpa = Hpa::shipped();

    let (service, calls) = lookup_service().await;
    let metrics = free_port();
    let queue = queue(metrics).await;
    let watcher = watcher(plane, ns.name(), queue.grpc()).await;

    // One replica: the HPA's minimum while nothing waits.
    let mut replicas = vec![replica(plane, queue.grpc(), watcher.grpc(), service, &[]).await];
    assert_eq!(hpa.replicas(backlog(metrics).await), 1);
    calls.lock().unwrap().take_peak();
    create_backlog(&lookups, "one").await;
    let (peak, one) = drain(metrics, &calls, "one").await;
    assert_answered(&lookups, "one").await;
    let calls_at_once_one = calls.lock().unwrap().take_peak();
    assert!(
        calls_at_once_one <= CONCURRENCY as usize,
        "one replica had {calls_at_once_one} calls in flight at once, above --concurrency={CONCURRENCY}"
    );
    assert_eq!(
        hpa.replicas(peak),
        4,
        "a backlog of {peak} asks the HPA for {} replicas",
        hpa.replicas(peak)
    );
    let deadline = Instant::now() + WITHIN;
    while backlog(metrics).await > 0 {
        assert!(Instant::now() < deadline, "the backlog does not drain to 0");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Four replicas, as the HPA asked at the peak.
    for _ in 1..hpa.replicas(peak) {
        replicas.push(replica(plane, queue.grpc(), watcher.grpc(), service, &[]).await);
    }
    let mut before = Vec::new();
    for replica in &replicas {
        before.push(reconciles(replica).await);
    }
    calls.lock().unwrap().take_peak();
    create_backlog(&lookups, "four").await;
    let (_, four) = drain(metrics, &calls, "four").await;
    assert_answered(&lookups, "four").await;
    let calls_at_once_four = calls.lock().unwrap().take_peak();

    let speedup = one.as_secs_f64() / four.as_secs_f64();
    eprintln!(
        "{BACKLOG} Lookups of {CALL:?} each: one replica {one:?}, four replicas {four:?} \
         ({speedup:.2}x); calls at once {calls_at_once_one} and {calls_at_once_four}; \
         peak backlog {peak}"
    );
    // More than two replicas' worth of calls at once: at least three replicas worked side by
    // side, which only a queue spreading the keys gives.
    assert!(
        calls_at_once_four > 2 * CONCURRENCY as usize,
        "four replicas had at most {calls_at_once_four} calls in flight at once"
    );
    // Each replica took its part of the second backlog (a quarter in theory).
    for (i, replica) in replicas.iter().enumerate() {
        let done = reconciles(replica).await - before[i];
        assert!(
            done >= (BACKLOG / 4 / 3) as f64,
            "replica {i} reconciled {done} of the {BACKLOG} Lookups"
        );
    }

    for replica in replicas {
        let (status, log) = replica.terminate().await.unwrap();
        assert!(status.success(), "a replica did not exit cleanly:\n{log}");
    }
    watcher.stop().await;
    queue.stop().await;
}

/// A Switchyard service binary from beside the example's (`cargo test --workspace` builds
/// them all), started and ready.
async fn service_process(name: &str, args: &[&str], envs: &[(&str, &str)]) -> ServiceProcess {
    let dir = Path::new(env!("CARGO_BIN_EXE_switchyard-example-lookup"))
        .parent()
        .unwrap();
    let program = dir.join(name);
    assert!(
        program.exists(),
        "{name} is missing from {}; run `cargo build --bins`",
        dir.display()
    );
    let mut process = ServiceProcess::start(&program, args, envs).await.unwrap();
    process
        .wait_ready()
        .await
        .unwrap_or_else(|e| panic!("{name} not ready: {e}\n{}", process.log()));
    process
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_is_one_trace_from_its_watch_event_to_the_slow_call() {
    let plane = ControlPlane::shared().expect("control plane");
    let collector = Collector::start(plane.binaries()).await.unwrap();
    let client = plane.client().await.unwrap();
    install_crd(&client).await;
    let ns = TestNamespace::create(plane, &client, "lookup-trace")
        .await
        .unwrap();
    let lookups: Api<Lookup> = Api::namespaced(client.clone(), ns.name());
    let (service, _) = lookup_service().await;
    let otel = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint()),
        ("OTEL_TRACES_SAMPLER", "parentbased_always_on".to_owned()),
        ("OTEL_BSP_SCHEDULE_DELAY", "200".to_owned()),
    ];
    let otel: Vec<(&str, &str)> = otel.iter().map(|(k, v)| (*k, v.as_str())).collect();

    let queue = service_process(
        "switchyard-queue",
        &[&format!("--shard-count={SHARDS}")],
        &otel,
    )
    .await;
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        format!(
            "shardCount: {SHARDS}\nnamespaces:\n  include: [{}]\nregistrations:\n  - serviceAccount: switchyard-reconciler\n    kinds:\n      - {{apiVersion: example.switchyard.io/v1, kind: Lookup, objects: full}}\n",
            ns.name()
        ),
    )
    .unwrap();
    let watcher = service_process(
        "switchyard-watcher",
        &[
            &format!("--kubeconfig={}", plane.kubeconfig().display()),
            &format!("--config={}", config.path().display()),
            &format!("--queue-addr={}", queue.grpc_addr()),
        ],
        &otel,
    )
    .await;
    let replica = replica(
        plane,
        queue.grpc_addr(),
        watcher.grpc_addr(),
        service,
        &otel,
    )
    .await;

    let name = "traced";
    let lookup = Lookup::new(
        name,
        switchyard_example_lookup::LookupSpec {
            query: name.to_owned(),
        },
    );
    lookups
        .create(&PostParams::default(), &lookup)
        .await
        .unwrap();
    let deadline = Instant::now() + WITHIN;
    let (spans, call) = loop {
        let spans = collector.spans().unwrap();
        let call = spans
            .iter()
            .find(|s| s.name == "lookup" && s.attribute("query") == Some(name))
            .cloned();
        // Complete once every span above the call (the reconcile, the queue's lease and
        // enqueue, the watch event), and the status write, are exported too.
        if let Some(call) = call
            && call.ancestry_exported(&spans)
            && spans
                .iter()
                .any(|s| s.trace_id == call.trace_id && s.name == "watch event")
            && spans
                .iter()
                .any(|s| s.name == "apiserver request" && s.parent_span_id == call.parent_span_id)
        {
            break (spans, call);
        }
        assert!(
            Instant::now() < deadline,
            "no trace of the Lookup's call with its watch event and status write within \
             {WITHIN:?}; exported: {:#?}",
            spans
                .iter()
                .map(|s| (&s.service, &s.name, &s.attributes))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let parent = |span: &ExportedSpan| -> ExportedSpan {
        spans
            .iter()
            .find(|s| s.span_id == span.parent_span_id)
            .unwrap_or_else(|| panic!("the parent of {span:#?} was not exported"))
            .clone()
    };
    let key = format!("{}/{name}", ns.name());
    let reconcile = parent(&call);
    assert_eq!(reconcile.name, "reconcile", "{reconcile:#?}");
    assert_eq!(reconcile.attribute("key"), Some(key.as_str()));
    let lease = parent(&reconcile);
    assert_eq!(
        (lease.service.as_str(), lease.name.as_str()),
        ("switchyard-queue", "lease")
    );
    let enqueue = parent(&lease);
    assert_eq!(
        (enqueue.service.as_str(), enqueue.name.as_str()),
        ("switchyard-queue", "enqueue")
    );
    let event = parent(&enqueue);
    assert_eq!(
        (event.service.as_str(), event.name.as_str()),
        ("switchyard-watcher", "watch event")
    );
    assert_eq!(event.attribute("name"), Some(name));
    assert_eq!(event.parent_span_id, "", "the watch event starts the trace");
    // The answer written back: an apiserver request inside the same reconcile.
    assert!(
        spans.iter().any(|s| s.name == "apiserver request"
            && s.parent_span_id == reconcile.span_id
            && s.attribute("verb") == Some("patch")
            && s.attribute("resource") == Some("lookups/status")),
        "no apiserver request of the reconcile that called: {:#?}",
        spans
            .iter()
            .filter(|s| s.parent_span_id == reconcile.span_id)
            .collect::<Vec<_>>()
    );
    for span in [&reconcile, &lease, &enqueue, &event] {
        assert_eq!(span.trace_id, call.trace_id, "{span:#?}");
    }

    for process in [replica, watcher, queue] {
        let (status, log) = process.terminate().await.unwrap();
        assert!(status.success(), "a process did not exit cleanly:\n{log}");
    }
}
