//! Traces and metrics end to end. A queue, a watcher and a reconciler run as separate
//! processes (each its own `service.name`, as in a cluster) against the real control plane,
//! exporting over OTLP to a real OpenTelemetry Collector that writes every span to a file.
//!
//! ```text
//!  ReplicaSet created ─► watcher "watch event" ─► queue "enqueue" ─► queue "lease"
//!                          ─► reconciler "reconcile" ─► "apiserver request" × n
//! ```
//!
//! The batch exporters are told to wait a minute between exports, so the spans reach the
//! collector only because each service flushes its exporter on shutdown.
//!
//! The service binaries are taken from beside this test's reconciler binary: `cargo test
//! --workspace` (and `make test`) builds them; alone, run `cargo build --bins` first.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::HashMap,
    io::Write,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use switchyard_k8s::{Api, Pod, PostParams, ReplicaSet};
use switchyard_testenv::{
    Collector, ControlPlane, ExportedSpan, ServiceProcess, TestNamespace, exposition,
};

use support::{RS, SHARDS, converged, replica_set};

/// Longer than the test: nothing is exported before shutdown unless a batch fills up.
const EXPORT_DELAY_MS: &str = "60000";

fn services_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_switchyard-reconciler"))
        .parent()
        .unwrap()
        .to_owned();
    for service in ["switchyard-queue", "switchyard-watcher"] {
        assert!(
            dir.join(service).exists(),
            "{service} is missing from {}; run `cargo build --bins`",
            dir.display()
        );
    }
    dir
}

async fn start(program: &Path, args: &[&str], envs: &[(&str, &str)]) -> ServiceProcess {
    let mut process = ServiceProcess::start(program, args, envs).await.unwrap();
    if let Err(error) = process.wait_ready().await {
        panic!(
            "{} not ready: {error}\n{}",
            program.display(),
            process.log()
        );
    }
    process
}

async fn metrics(process: &ServiceProcess) -> exposition::Exposition {
    let (status, text) = process.admin_get("/metrics").await.unwrap();
    assert_eq!(status, 200);
    exposition::parse(&text)
        .unwrap_or_else(|e| panic!("/metrics is not valid OpenMetrics text: {e}\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_follows_a_replica_set_from_watch_event_to_apiserver_writes() {
    let plane = ControlPlane::shared().expect("control plane");
    let collector = Collector::start(plane.binaries()).await.unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "otel").await.unwrap();
    let dir = services_dir();
    let endpoint = collector.endpoint();
    let kubeconfig = format!("--kubeconfig={}", plane.kubeconfig().display());
    let otel = |service: &'static str| {
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
            ("OTEL_TRACES_SAMPLER", "parentbased_always_on".to_owned()),
            ("OTEL_BSP_SCHEDULE_DELAY", EXPORT_DELAY_MS.to_owned()),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                format!("test.service={service}"),
            ),
        ]
    };

    let queue_env = otel("queue");
    let queue = start(
        &dir.join("switchyard-queue"),
        &[
            &format!("--shard-count={SHARDS}"),
            &format!("--controllers={RS}"),
        ],
        &as_refs(&queue_env),
    )
    .await;
    let mut config = tempfile::NamedTempFile::new().unwrap();
    config
        .write_all(support::rs_config(ns.name()).as_bytes())
        .unwrap();
    let watcher_env = otel("watcher");
    let watcher = start(
        &dir.join("switchyard-watcher"),
        &[
            &kubeconfig,
            &format!("--config={}", config.path().display()),
            &format!("--queue-addr={}", queue.grpc_addr()),
        ],
        &as_refs(&watcher_env),
    )
    .await;
    let reconciler_env = otel("reconciler");
    let reconciler = start(
        Path::new(env!("CARGO_BIN_EXE_switchyard-reconciler")),
        &[
            &kubeconfig,
            &format!("--queue-addr={}", queue.grpc_addr()),
            &format!("--watcher-addr={}", watcher.grpc_addr()),
            // The queue serves the ReplicaSet controller's keys only.
            &format!("--controllers={RS}"),
            "--log-level=info,switchyard_reconciler=debug",
        ],
        &as_refs(&reconciler_env),
    )
    .await;

    // The known workload: one ReplicaSet of 2 replicas, created and converged.
    let rs_api: Api<ReplicaSet> = Api::namespaced(client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    rs_api
        .create(&PostParams::default(), &replica_set("web", 2))
        .await
        .unwrap();
    converged(&rs_api, &pods, "web", 2).await;

    // Metrics: every endpoint parses, and the counters moved as the workload says.
    let r = metrics(&reconciler).await;
    let success = [("controller", RS), ("result", "success")];
    assert!(
        r.value("switchyard_reconcile_total", &success)
            .unwrap_or(0.0)
            >= 1.0
    );
    assert_eq!(
        r.value(
            "switchyard_apiserver_requests_total",
            &[("verb", "create"), ("code", "201")]
        ),
        Some(2.0),
        "two Pods created, once each"
    );
    assert!(
        r.value(
            "switchyard_reconcile_time_seconds_count",
            &[("controller", RS)]
        ) >= Some(1.0)
    );
    assert_eq!(
        r.value("switchyard_active_workers", &[("controller", RS)]),
        Some(0.0)
    );
    // An error (a write conflict, retried) may happen; whatever happened adds up.
    let reconciles = r.value("switchyard_reconcile_total", &[("controller", RS)]);
    assert_eq!(
        reconciles,
        r.value(
            "switchyard_reconcile_time_seconds_count",
            &[("controller", RS)]
        )
    );
    assert_eq!(
        r.value("switchyard_reconcile_errors_total", &[("controller", RS)]),
        r.value(
            "switchyard_reconcile_total",
            &[("controller", RS), ("result", "error")]
        )
    );
    let w = metrics(&watcher).await;
    let rs_added = [("resource", "apps/v1/ReplicaSet"), ("event", "added")];
    assert_eq!(
        w.value("switchyard_watch_events_total", &rs_added),
        Some(1.0)
    );
    assert!(w.value("switchyard_apiserver_requests_total", &[("verb", "watch")]) >= Some(1.0));
    let q = metrics(&queue).await;
    assert!(q.value("workqueue_adds_total", &[("name", RS)]) >= Some(1.0));
    assert_eq!(q.value("workqueue_depth", &[("name", RS)]), Some(0.0));

    // Shutdown flushes every exporter.
    let (_, reconciler_log) = reconciler.terminate().await.unwrap();
    let (_, watcher_log) = watcher.terminate().await.unwrap();
    let (_, queue_log) = queue.terminate().await.unwrap();
    let spans = wait_for_spans(&collector, &ns, Duration::from_secs(10)).await;
    let by_id: HashMap<&str, &ExportedSpan> =
        spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let parent = |s: &ExportedSpan| by_id.get(s.parent_span_id.as_str()).copied();

    for service in [
        "switchyard-queue",
        "switchyard-watcher",
        "switchyard-reconciler",
    ] {
        let span = spans
            .iter()
            .find(|s| s.service == service)
            .unwrap_or_else(|| panic!("no span from {service}"));
        assert_eq!(
            span.resource.get("service.version").map(String::as_str),
            Some(env!("CARGO_PKG_VERSION"))
        );
        assert!(span.resource.contains_key("service.instance.id"));
        assert!(
            span.resource.contains_key("test.service"),
            "OTEL_RESOURCE_ATTRIBUTES read"
        );
    }

    // The reconcile that created the Pods: its apiserver calls are its children.
    let creates: Vec<&ExportedSpan> = spans
        .iter()
        .filter(|s| s.name == "apiserver request" && s.attribute("verb") == Some("create"))
        .filter(|s| s.attribute("resource") == Some("pods"))
        .collect();
    assert_eq!(creates.len(), 2, "one span per Pod created: {creates:#?}");
    let reconcile = parent(creates[0]).expect("the create's parent was exported");
    assert_eq!(
        parent(creates[1]).map(|s| &s.span_id),
        Some(&reconcile.span_id)
    );
    for create in &creates {
        assert_eq!(create.service, "switchyard-reconciler");
        assert_eq!(create.attribute("code"), Some("201"));
        assert_eq!(create.trace_id, reconcile.trace_id);
    }
    assert_eq!(reconcile.name, "reconcile");
    assert_eq!(reconcile.service, "switchyard-reconciler");
    assert_eq!(reconcile.attribute("controller"), Some(RS));
    assert_eq!(
        reconcile.attribute("key"),
        Some(format!("{}/web", ns.name()).as_str())
    );
    // Done, or failed on a write conflict after the creates (then retried).
    assert!(
        matches!(reconcile.attribute("outcome"), Some("done" | "failed")),
        "{reconcile:#?}"
    );
    assert_eq!(reconcile.attribute("attempt"), Some("1"));

    // Its parent is the queue's lease, whose parent is the enqueue, whose parent is the
    // watch event of the ReplicaSet's creation: one trace from the event to the writes.
    let lease = parent(reconcile).expect("the reconcile's parent was exported");
    assert_eq!(
        (lease.service.as_str(), lease.name.as_str()),
        ("switchyard-queue", "lease")
    );
    let enqueue = parent(lease).expect("the lease's parent was exported");
    assert_eq!(
        (enqueue.service.as_str(), enqueue.name.as_str()),
        ("switchyard-queue", "enqueue")
    );
    let event = parent(enqueue).expect("the enqueue's parent was exported");
    assert_eq!(
        (event.service.as_str(), event.name.as_str()),
        ("switchyard-watcher", "watch event")
    );
    assert_eq!(event.parent_span_id, "", "a watch event starts its trace");
    assert_eq!(event.attribute("kind"), Some("apps/v1/ReplicaSet"));
    assert_eq!(event.attribute("event"), Some("added"));
    assert_eq!(event.attribute("namespace"), Some(ns.name()));
    assert_eq!(event.attribute("name"), Some("web"));
    assert!(
        event
            .attribute("resource_version")
            .is_some_and(|rv| !rv.is_empty())
    );
    for span in [lease, enqueue, event] {
        assert_eq!(span.trace_id, reconcile.trace_id);
    }

    // Every reconcile links to each event it covers: the links are the enqueues of its
    // causes, each the child of a watch event.
    let reconciles: Vec<&ExportedSpan> = spans.iter().filter(|s| s.name == "reconcile").collect();
    assert!(reconciles.len() >= 2, "the Pods' changes reconciled too");
    for r in &reconciles {
        let causes: usize = r.attribute("causes").unwrap().parse().unwrap();
        assert_eq!(r.links.len(), causes, "{r:#?}");
        for (trace_id, span_id) in &r.links {
            let cause = by_id.get(span_id.as_str()).expect("linked span exported");
            assert_eq!(&cause.trace_id, trace_id);
            assert_eq!(cause.name, "enqueue");
            assert_eq!(parent(cause).map(|e| e.name.as_str()), Some("watch event"));
        }
    }
    assert!(
        reconcile.links.iter().any(|(_, id)| *id == enqueue.span_id),
        "the creating reconcile links to its own cause"
    );

    // Log lines inside a span carry its ids.
    assert!(
        reconciler_log.contains(&format!("trace_id={}", reconcile.trace_id)),
        "the reconcile's log lines carry its trace id:\n{reconciler_log}"
    );
    drop((watcher_log, queue_log));
}

/// Waits until the collector has written the ReplicaSet's watch event and a reconcile of it.
async fn wait_for_spans(
    collector: &Collector,
    ns: &TestNamespace,
    within: Duration,
) -> Vec<ExportedSpan> {
    let deadline = Instant::now() + within;
    loop {
        let spans = collector.spans().unwrap();
        let has = |service: &str, name: &str| {
            spans.iter().any(|s| {
                s.service == service
                    && s.name == name
                    && s.attribute("namespace") == Some(ns.name())
            })
        };
        if has("switchyard-watcher", "watch event") && has("switchyard-reconciler", "reconcile") {
            return spans;
        }
        assert!(
            Instant::now() < deadline,
            "spans not exported within {within:?}; {} so far; collector log:\n{}",
            spans.len(),
            collector.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn as_refs<'a>(envs: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    envs.iter().map(|(k, v)| (*k, v.as_str())).collect()
}
