//! Traces and metrics end to end. A queue, a watcher and a reconciler run as separate
//! processes (each its own `service.name`, as in a cluster) against the real control plane,
//! exporting over OTLP to a real OpenTelemetry Collector that writes every span to a file.
//! The workload is one Deployment rolled out by the ReplicaSet and Deployment controllers,
//! with the watcher configured as shipped.
//!
//! ```text
//!  Deployment created ─► watcher "watch event" ─► queue "enqueue" ─► queue "lease"
//!                          ─► reconciler "reconcile" ─► "apiserver request" POST replicasets
//!  ReplicaSet created ─► watcher "watch event" (a trace of its own) ─► … ─► "reconcile"
//!                          ─► "apiserver request" POST pods × 2
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

use serde_json::json;
use switchyard_k8s::{Api, Deployment, ListParams, Pod, PostParams, ReplicaSet, await_condition};
use switchyard_reconciler::{deployment, replicaset};
use switchyard_reconciler_core::deployment::{AVAILABLE, controller_of, get_condition};
use switchyard_runtime::Role;
use switchyard_testenv::{
    Collector, ControlPlane, ExportedSpan, Pki, ServiceProcess, TestNamespace, exposition,
};

use support::{DEPLOY, RS, SHARDS};

/// Longer than the test: nothing is exported before shutdown unless a batch fills up.
const EXPORT_DELAY_MS: &str = "60000";
/// How long the rollout of 2 Pods may take: seconds on kwok; this bounds a broken run.
const ROLLOUT: Duration = Duration::from_secs(60);
/// How long after the rollout the last reconcile may still be reporting its outcome (it
/// waits until the watcher's cache holds its last write).
const SETTLE: Duration = Duration::from_secs(10);

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
async fn traces_follow_a_deployment_rollout_from_watch_events_to_apiserver_writes() {
    let plane = ControlPlane::shared().expect("control plane");
    // Exported over mutual TLS, as the otel overlay exports: each service presents its own
    // certificate and checks the collector's.
    let pki = Pki::shared();
    let collector = Collector::start_tls(plane.binaries(), pki).await.unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "otel").await.unwrap();
    let dir = services_dir();
    let kubeconfig = format!("--kubeconfig={}", plane.kubeconfig().display());
    let otel = |service: &'static str, role: Role| {
        let mut env = collector.exporter_env(&pki.files(role));
        env.extend([
            ("OTEL_TRACES_SAMPLER", "parentbased_always_on".to_owned()),
            ("OTEL_BSP_SCHEDULE_DELAY", EXPORT_DELAY_MS.to_owned()),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                format!("test.service={service}"),
            ),
        ]);
        env
    };

    let queue_env = otel("queue", Role::Queue);
    let queue = start(
        &dir.join("switchyard-queue"),
        &[
            &format!("--shard-count={SHARDS}"),
            &format!("--controllers={}", switchyard_reconciler::BUILTIN.join(",")),
        ],
        &as_refs(&queue_env),
    )
    .await;
    let mut config = tempfile::NamedTempFile::new().unwrap();
    config
        .write_all(support::watcher_config(&[ns.name()], "").as_bytes())
        .unwrap();
    let watcher_env = otel("watcher", Role::Watcher);
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
    let reconciler_env = otel("reconciler", Role::Reconciler);
    // The workload controllers (the namespace controller's watches cover every Namespace).
    let reconciler = start(
        Path::new(env!("CARGO_BIN_EXE_switchyard-reconciler")),
        &[
            &kubeconfig,
            &format!("--queue-addr={}", queue.grpc_addr()),
            &format!("--watcher-addr={}", watcher.grpc_addr()),
            "--log-level=info,switchyard_reconciler=debug",
            &format!("--controllers={RS},{DEPLOY}"),
        ],
        &as_refs(&reconciler_env),
    )
    .await;

    // The known workload: one Deployment of 2 replicas, created and rolled out.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    let rs_api: Api<ReplicaSet> = Api::namespaced(client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    deployments
        .create(&PostParams::default(), &web_deployment(2))
        .await
        .unwrap();
    let rs_name = rolled_out(&deployments, &rs_api, &pods, 2).await;

    // Metrics: every endpoint parses, and the counters moved as the workload says.
    let r = settled(&reconciler).await;
    for controller in [RS, DEPLOY] {
        let c = [("controller", controller)];
        let success = [("controller", controller), ("result", "success")];
        assert!(
            r.value("switchyard_reconcile_total", &success)
                .unwrap_or(0.0)
                >= 1.0,
            "{controller}"
        );
        // An error (a write conflict, retried) may happen; whatever happened adds up.
        assert_eq!(
            r.value("switchyard_reconcile_total", &c),
            r.value("switchyard_reconcile_time_seconds_count", &c),
            "{controller}"
        );
        assert_eq!(
            r.value("switchyard_reconcile_errors_total", &c),
            r.value(
                "switchyard_reconcile_total",
                &[("controller", controller), ("result", "error")]
            ),
            "{controller}"
        );
    }
    let created = r.value(
        "switchyard_apiserver_requests_total",
        &[("verb", "create"), ("code", "201")],
    );
    let w = metrics(&watcher).await;
    for kind in ["apps/v1/Deployment", "apps/v1/ReplicaSet"] {
        let added = [("resource", kind), ("event", "added")];
        assert_eq!(
            w.value("switchyard_watch_events_total", &added),
            Some(1.0),
            "{kind}"
        );
    }
    assert!(w.value("switchyard_apiserver_requests_total", &[("verb", "watch")]) >= Some(1.0));
    // The reconciles read the watcher's cache, and the reads after the ReplicaSet's Pods were
    // created waited there for them (or found them already cached).
    let listed = [("call", "List"), ("code", "ok")];
    assert!(r.value("switchyard_cache_request_duration_seconds_count", &listed) >= Some(1.0));
    let pods_read = [("resource", "v1/Pod")];
    assert!(w.value("switchyard_cache_read_wait_seconds_count", &pods_read) >= Some(1.0));
    // Each controller's client, and its Events' client, reports its rate limit: a rollout of
    // 2 Pods stays within the default burst, so nothing waited.
    for controller in [RS, DEPLOY] {
        for client in [controller.to_owned(), format!("{controller}/events")] {
            let c = [("client", client.as_str())];
            assert_eq!(
                r.value("switchyard_apiserver_rate_limited_requests_total", &c),
                Some(0.0),
                "{client}"
            );
            assert_eq!(
                r.value("switchyard_apiserver_rate_limit_wait_seconds_total", &c),
                Some(0.0),
                "{client}"
            );
        }
    }
    let q = metrics(&queue).await;
    for controller in [RS, DEPLOY] {
        assert!(q.value("workqueue_adds_total", &[("name", controller)]) >= Some(1.0));
        assert_eq!(
            q.value("workqueue_depth", &[("name", controller)]),
            Some(0.0)
        );
    }

    // Shutdown flushes every exporter.
    let (_, reconciler_log) = reconciler.terminate().await.unwrap();
    let (_, watcher_log) = watcher.terminate().await.unwrap();
    let (_, queue_log) = queue.terminate().await.unwrap();
    let services = [
        "switchyard-queue",
        "switchyard-watcher",
        "switchyard-reconciler",
    ];
    // Each process's exporter flushes as it stops, the queue's last: wait for all three.
    let exported = wait_for_spans(&collector, Duration::from_secs(10), |spans| {
        spans.iter().filter(|s| is_create(s, "pods")).count() == 2
            && spans.iter().any(|s| is_create(s, "replicasets"))
            && spans
                .iter()
                .filter(|s| is_create(s, "pods") || is_create(s, "replicasets"))
                .all(|s| s.ancestry_exported(spans))
            && spans
                .iter()
                .any(|s| s.name == "watch event" && s.attribute("namespace") == Some(ns.name()))
            && services
                .iter()
                .all(|service| spans.iter().any(|s| s.service == *service))
    })
    .await;
    let spans = Spans::new(&exported);

    for service in services {
        let span = exported
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
    // Every create the reconciler counted has its span, answered 201: the ReplicaSet, its
    // two Pods and the Deployment's events.
    let creates = exported
        .iter()
        .filter(|s| s.name == "apiserver request" && s.attribute("verb") == Some("create"))
        .filter(|s| s.attribute("code") == Some("201"))
        .count();
    assert_eq!(created, Some(creates as f64));

    // 1. The Deployment's trace: its watch event, the enqueue and lease of its key, and the
    // reconcile that created the ReplicaSet, the create being the reconcile's child.
    let d_event = spans.one("the Deployment's added event", |s| {
        is_added_event(s, "apps/v1/Deployment", ns.name(), "web")
    });
    assert_eq!(d_event.parent_span_id, "", "a watch event starts its trace");
    assert!(
        d_event
            .attribute("resource_version")
            .is_some_and(|rv| !rv.is_empty())
    );
    let rs_create = spans.one("the ReplicaSet's create", |s| is_create(s, "replicasets"));
    assert_eq!(rs_create.service, "switchyard-reconciler");
    assert_eq!(rs_create.attribute("code"), Some("201"));
    let d_reconcile = spans
        .parent(rs_create)
        .expect("the create's parent was exported");
    assert_reconcile(d_reconcile, deployment::NAME, &format!("{}/web", ns.name()));
    assert_eq!(rs_create.trace_id, d_reconcile.trace_id);
    let (d_enqueue, event) = spans.caused_by(d_reconcile);
    assert_eq!(event.span_id, d_event.span_id, "{event:#?}");

    // 2. The ReplicaSet's trace. The watcher starts a trace at every watch event, the
    // controller's own writes included: an apiserver watch event does not say who wrote the
    // object, so the ReplicaSet's added event is a root with no link to the reconcile that
    // created it. From there, one trace runs to the Pod creates.
    let rs_event = spans.one("the ReplicaSet's added event", |s| {
        is_added_event(s, "apps/v1/ReplicaSet", ns.name(), &rs_name)
    });
    assert_eq!(
        rs_event.parent_span_id, "",
        "a watch event starts its trace"
    );
    assert!(rs_event.links.is_empty(), "{rs_event:#?}");
    assert_ne!(rs_event.trace_id, d_event.trace_id);
    let pod_creates: Vec<&ExportedSpan> =
        exported.iter().filter(|s| is_create(s, "pods")).collect();
    assert_eq!(
        pod_creates.len(),
        2,
        "one span per Pod created: {pod_creates:#?}"
    );
    let rs_reconcile = spans
        .parent(pod_creates[0])
        .expect("the create's parent was exported");
    for create in &pod_creates {
        assert_eq!(create.service, "switchyard-reconciler");
        assert_eq!(create.attribute("code"), Some("201"));
        assert_eq!(create.parent_span_id, rs_reconcile.span_id);
        assert_eq!(create.trace_id, rs_reconcile.trace_id);
    }
    assert_reconcile(
        rs_reconcile,
        replicaset::NAME,
        &format!("{}/{rs_name}", ns.name()),
    );
    let (rs_enqueue, event) = spans.caused_by(rs_reconcile);
    assert_eq!(event.span_id, rs_event.span_id, "{event:#?}");

    // The ReplicaSet's event keys its Deployment too: its trace holds that enqueue, and a
    // later reconcile of the Deployment links to it.
    let back = spans.one("the Deployment's enqueue for the ReplicaSet's event", |s| {
        s.name == "enqueue"
            && s.parent_span_id == rs_event.span_id
            && s.attribute("controller") == Some(DEPLOY)
    });
    assert_eq!(back.service, "switchyard-queue");
    assert_eq!(back.attribute("name"), Some("web"));
    assert!(
        exported.iter().any(|s| s.name == "reconcile"
            && s.attribute("controller") == Some(DEPLOY)
            && s.links.iter().any(|(_, id)| *id == back.span_id)),
        "a reconcile of the Deployment links to the ReplicaSet's event"
    );

    // 3. Every reconcile links to each event it covers (coalesced adds included): the links
    // are the enqueues of its causes, each the child of a watch event.
    let reconciles: Vec<&ExportedSpan> =
        exported.iter().filter(|s| s.name == "reconcile").collect();
    assert!(reconciles.len() >= 3, "the Pods' changes reconciled too");
    for r in &reconciles {
        let causes: usize = r.attribute("causes").unwrap().parse().unwrap();
        assert_eq!(r.links.len(), causes, "{r:#?}");
        for (trace_id, span_id) in &r.links {
            let cause = spans.get(span_id).expect("linked span exported");
            assert_eq!(&cause.trace_id, trace_id);
            assert_eq!(cause.name, "enqueue");
            assert_eq!(
                spans.parent(cause).map(|e| e.name.as_str()),
                Some("watch event")
            );
        }
    }
    for (reconcile, enqueue) in [(d_reconcile, d_enqueue), (rs_reconcile, rs_enqueue)] {
        assert!(
            reconcile.links.iter().any(|(_, id)| *id == enqueue.span_id),
            "a reconcile links to its own cause: {reconcile:#?}"
        );
    }

    // Log lines inside a span carry its ids: the line naming the ReplicaSet created joins
    // the Deployment's trace to the ReplicaSet's.
    assert!(
        reconciler_log
            .lines()
            .any(|line| line.contains("created new replica set")
                && line.contains(&rs_name)
                && line.contains(&format!("trace_id={}", d_reconcile.trace_id))
                && line.contains(&format!("span_id={}", d_reconcile.span_id))),
        "the creating reconcile's log line carries its ids:\n{reconciler_log}"
    );
    drop((watcher_log, queue_log));
}

fn web_deployment(replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]}
            }
        }
    }))
    .unwrap()
}

/// Waits until the Deployment `web` is rolled out to `n` replicas, as `kubectl rollout
/// status` says it (and Available); checks that its one ReplicaSet controls `n` active
/// Pods. Returns that ReplicaSet's name.
async fn rolled_out(
    deployments: &Api<Deployment>,
    rs_api: &Api<ReplicaSet>,
    pods: &Api<Pod>,
    n: i32,
) -> String {
    let done = await_condition(deployments.clone(), "web", move |d: Option<&Deployment>| {
        d.is_some_and(|d| {
            let status = d.status.clone().unwrap_or_default();
            status.observed_generation >= d.metadata.generation
                && status.replicas == Some(n)
                && status.updated_replicas == Some(n)
                && status.available_replicas == Some(n)
                && get_condition(&status, AVAILABLE).is_some_and(|c| c.status == "True")
        })
    });
    if tokio::time::timeout(ROLLOUT, done).await.is_err() {
        let d = deployments.get("web").await.unwrap();
        panic!("web did not roll out to {n}: status {:?}", d.status);
    }
    let uid = deployments.get("web").await.unwrap().metadata.uid.unwrap();
    let rss = rs_api.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(rss.len(), 1, "one ReplicaSet: {rss:#?}");
    let rs = &rss[0];
    assert_eq!(
        controller_of(&rs.metadata).map(|o| o.uid.as_str()),
        Some(uid.as_str())
    );
    let rs_uid = rs.metadata.uid.as_deref().unwrap();
    let active = support::active_pods(pods, "app=web").await;
    assert_eq!(active.len(), n as usize, "active Pods");
    for pod in &active {
        assert_eq!(
            controller_of(&pod.metadata).map(|o| o.uid.as_str()),
            Some(rs_uid)
        );
    }
    rs.metadata.name.clone().unwrap()
}

/// The reconciler's metrics once no reconcile runs: the one that wrote the rollout's last
/// status may still be waiting for the watcher's cache to hold the write.
async fn settled(reconciler: &ServiceProcess) -> exposition::Exposition {
    let deadline = Instant::now() + SETTLE;
    loop {
        let r = metrics(reconciler).await;
        let idle = |controller| {
            r.value("switchyard_active_workers", &[("controller", controller)]) == Some(0.0)
        };
        if idle(RS) && idle(DEPLOY) {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "reconciles still running {SETTLE:?} after the rollout"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn is_create(span: &ExportedSpan, resource: &str) -> bool {
    span.name == "apiserver request"
        && span.attribute("verb") == Some("create")
        && span.attribute("resource") == Some(resource)
}

fn is_added_event(span: &ExportedSpan, kind: &str, namespace: &str, name: &str) -> bool {
    span.name == "watch event"
        && span.service == "switchyard-watcher"
        && span.attribute("kind") == Some(kind)
        && span.attribute("namespace") == Some(namespace)
        && span.attribute("name") == Some(name)
        && span.attribute("event") == Some("added")
}

/// A reconcile of `controller`'s `key` that made writes: its first attempt, ended without
/// a panic or a timeout (a write conflict after the creates fails it, to be retried).
fn assert_reconcile(span: &ExportedSpan, controller: &str, key: &str) {
    assert_eq!(
        (span.service.as_str(), span.name.as_str()),
        ("switchyard-reconciler", "reconcile")
    );
    assert_eq!(span.attribute("controller"), Some(controller));
    assert_eq!(span.attribute("key"), Some(key));
    assert_eq!(span.attribute("attempt"), Some("1"));
    assert!(
        matches!(
            span.attribute("outcome"),
            Some("done" | "requeue_after" | "failed")
        ),
        "{span:#?}"
    );
}

/// The exported spans by span id.
struct Spans<'s> {
    all: &'s [ExportedSpan],
    by_id: HashMap<&'s str, &'s ExportedSpan>,
}

impl<'s> Spans<'s> {
    fn new(all: &'s [ExportedSpan]) -> Self {
        let by_id = all.iter().map(|s| (s.span_id.as_str(), s)).collect();
        Self { all, by_id }
    }

    fn get(&self, span_id: &str) -> Option<&'s ExportedSpan> {
        self.by_id.get(span_id).copied()
    }

    fn parent(&self, span: &ExportedSpan) -> Option<&'s ExportedSpan> {
        self.get(&span.parent_span_id)
    }

    /// The one span that `matches`.
    fn one(&self, what: &str, matches: impl Fn(&ExportedSpan) -> bool) -> &'s ExportedSpan {
        let found: Vec<&ExportedSpan> = self.all.iter().filter(|s| matches(s)).collect();
        assert_eq!(found.len(), 1, "one span for {what}: {found:#?}");
        found[0]
    }

    /// Walks up from a reconcile by parent span id: its parent is the queue's lease of its
    /// key, whose parent is the enqueue of that key, whose parent is the watcher's watch
    /// event; all in the reconcile's trace. Returns the enqueue and the watch event.
    fn caused_by(&self, reconcile: &ExportedSpan) -> (&'s ExportedSpan, &'s ExportedSpan) {
        let controller = reconcile.attribute("controller");
        let key = reconcile.attribute("key").unwrap();
        let lease = self
            .parent(reconcile)
            .expect("the reconcile's parent was exported");
        assert_eq!(
            (lease.service.as_str(), lease.name.as_str()),
            ("switchyard-queue", "lease")
        );
        assert_eq!(lease.attribute("controller"), controller);
        assert_eq!(lease.attribute("key"), Some(key));
        let enqueue = self.parent(lease).expect("the lease's parent was exported");
        assert_eq!(
            (enqueue.service.as_str(), enqueue.name.as_str()),
            ("switchyard-queue", "enqueue")
        );
        assert_eq!(enqueue.attribute("controller"), controller);
        assert_eq!(
            key.split_once('/'),
            enqueue
                .attribute("namespace")
                .zip(enqueue.attribute("name"))
        );
        let event = self
            .parent(enqueue)
            .expect("the enqueue's parent was exported");
        assert_eq!(
            (event.service.as_str(), event.name.as_str()),
            ("switchyard-watcher", "watch event")
        );
        for span in [lease, enqueue, event] {
            assert_eq!(span.trace_id, reconcile.trace_id, "{span:#?}");
        }
        (enqueue, event)
    }
}

/// Waits until the collector has written spans that satisfy `complete`.
async fn wait_for_spans(
    collector: &Collector,
    within: Duration,
    complete: impl Fn(&[ExportedSpan]) -> bool,
) -> Vec<ExportedSpan> {
    let deadline = Instant::now() + within;
    loop {
        let spans = collector.spans().unwrap();
        if complete(&spans) {
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
