//! deploy/kustomize/components/monitoring for real, with Debian's `prometheus` package
//! (`scripts/install-deps.sh` installs it; without it these tests fail and say so):
//!
//! - the alerts pass `promtool check rules`, and `promtool test rules` runs their unit tests,
//!   which hold, for every alert the component defines, a case where it fires and one where
//!   it must not;
//! - a Prometheus server scrapes a running topology and every query of the dashboard returns
//!   data:
//!
//! ```text
//!  elector ─► queue × 2 (16 shards; the second's join moves shards) ─► watcher ─► reconciler × 2
//!     ▲ every admin /metrics, each second, as the ServiceMonitors' jobs name them
//!  prometheus (127.0.0.1, free port; the component's alerts loaded)
//!
//!  workload: 3 Deployments that roll out; 1 whose Pods the apiserver refuses (a ResourceQuota
//!  of no Pods), so its ReplicaSet's reconciles fail and are retried; and one gRPC call that
//!  the authorization table refuses
//! ```
//!
//! Then every dashboard query (read from the dashboard's JSON, Grafana's variables replaced)
//! returns at least one series with a number, every alert rule evaluates without error, every
//! shard has an owner, and no alert fires.

#![allow(clippy::unwrap_used)]

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::Value;
use switchyard_k8s::{Api, Deployment, PostParams};
use switchyard_proto::queue::v1::{EnqueueRequest, queue_client::QueueClient};
use switchyard_runtime::Role;
use switchyard_testenv::{
    ControlPlane, Pki, Prometheus, Sample, TestNamespace, manifests, promtool,
};
use switchyard_tests::{
    CONVERGE_TIMEOUT,
    fleet::{await_rolled_out, create_all},
    topology::{self, Shape, Topology},
};

const SHARDS: u32 = 16;
const DEPLOYMENTS: usize = 3;
const REPLICAS: i32 = 2;
/// How long, once the workload has rolled out, Prometheus gets to show it in every query.
const QUERIES_TIMEOUT: Duration = Duration::from_secs(60);
/// The whole topology test, however it goes; its processes are killed when it ends.
const TEST_TIMEOUT: Duration = Duration::from_secs(300);
const DASHBOARD: &str =
    include_str!("../deploy/kustomize/components/monitoring/dashboards/switchyard.json");
const ALERTS: &str = include_str!("../deploy/kustomize/components/monitoring/alerts.yaml");
const ALERT_TESTS: &str =
    include_str!("../deploy/kustomize/components/monitoring/tests/alerts_test.yaml");
const OPERATIONS: &str = include_str!("../docs/operations.md");

/// What Grafana puts in place of the dashboard's variables, for a query sent to Prometheus
/// itself: every namespace and controller, and a rate window that spans the whole test.
const VARIABLES: [(&str, &str); 3] = [
    ("$__rate_interval", "5m"),
    ("$namespace", ".*"),
    ("$controller", ".*"),
];

fn component() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kustomize/components/monitoring")
}

/// The alerts of alerts.yaml, each with its rule.
fn alerts() -> Vec<(String, serde_norway::Value)> {
    let rule: serde_norway::Value = serde_norway::from_str(ALERTS).unwrap();
    rule["spec"]["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_sequence().unwrap())
        .filter_map(|r| Some((r["alert"].as_str()?.to_owned(), r.clone())))
        .collect()
}

/// Every query of the dashboard: (panel title, legend, expression with the variables
/// replaced), rows' nested panels included.
fn dashboard_queries() -> Vec<(String, String, String)> {
    fn walk(panels: &Value, out: &mut Vec<(String, String, String)>) {
        for panel in panels.as_array().into_iter().flatten() {
            walk(&panel["panels"], out);
            for target in panel["targets"].as_array().into_iter().flatten() {
                let mut expr = target["expr"].as_str().unwrap_or_default().to_owned();
                for (variable, value) in VARIABLES {
                    expr = expr.replace(variable, value);
                }
                out.push((
                    panel["title"].as_str().unwrap_or_default().to_owned(),
                    target["legendFormat"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    expr,
                ));
            }
        }
    }
    let dashboard: Value = serde_json::from_str(DASHBOARD).unwrap();
    let mut queries = Vec::new();
    walk(&dashboard["panels"], &mut queries);
    queries
}

/// Panics with how to install promtool and prometheus when they are missing.
fn require_prometheus() {
    if let Err(error) = promtool() {
        panic!("{error}");
    }
}

#[test]
fn every_alert_passes_promtool_and_is_tested_firing_and_not() {
    require_prometheus();
    let out = std::process::Command::new(component().join("tests/promtool.sh"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tests/promtool.sh: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let tests: serde_norway::Value = serde_norway::from_str(ALERT_TESTS).unwrap();
    let cases: Vec<&serde_norway::Value> = tests["tests"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|test| test["alert_rule_test"].as_sequence().into_iter().flatten())
        .collect();
    let alerts = alerts();
    assert_eq!(alerts.len(), 8, "{alerts:?}");
    for (alert, rule) in &alerts {
        let expected = |firing: bool| {
            cases.iter().any(|case| {
                case["alertname"] == alert.as_str()
                    && case["exp_alerts"]
                        .as_sequence()
                        .is_some_and(|e| e.is_empty() != firing)
            })
        };
        assert!(expected(true), "{alert}: no unit test where it fires");
        assert!(
            expected(false),
            "{alert}: no unit test where it must not fire"
        );
        // What an on-call engineer gets with the alert: how bad, and where to read on.
        assert!(
            ["warning", "critical"].contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
            "{alert}: a severity"
        );
        let anchor = alert.to_lowercase();
        assert_eq!(
            rule["annotations"]["runbook_url"].as_str(),
            Some(format!("docs/operations.md#{anchor}").as_str()),
            "{alert}: a runbook"
        );
        assert!(
            OPERATIONS
                .lines()
                .any(|line| line == format!("### {alert}")),
            "{alert}: docs/operations.md has a section for it"
        );
    }
}

/// Polls an instant query once a second until `done` holds for its result; the last result
/// (or error) when `deadline` passes.
async fn await_query(
    prometheus: &Prometheus,
    expr: &str,
    deadline: Instant,
    done: impl Fn(&[Sample]) -> bool,
) -> Result<Vec<Sample>, String> {
    loop {
        let last = prometheus.query(expr).await;
        if let Ok(samples) = &last
            && done(samples)
        {
            return Ok(samples.clone());
        }
        if Instant::now() >= deadline {
            return Err(format!("{last:?}"));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// At least one series, and a number in one of them (a quantile of no observations or a
/// ratio of nothing is NaN: the panel would draw no line).
fn has_data(samples: &[Sample]) -> bool {
    samples.iter().any(|s| s.value.is_finite())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_data_from_a_running_topology() {
    require_prometheus();
    tokio::time::timeout(TEST_TIMEOUT, scrape_a_running_topology())
        .await
        .unwrap_or_else(|_| panic!("the test did not end within {TEST_TIMEOUT:?}"));
}

async fn scrape_a_running_topology() {
    let start = Instant::now();
    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "{queries:?}");
    for (panel, _, expr) in &queries {
        assert!(!expr.contains('$'), "{panel}: a variable left in {expr}");
    }

    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "monitoring")
        .await
        .unwrap();
    let refused = topology::refusing_pods(plane, &client, "monitoring-refused").await;
    let topology = Topology::start(
        plane,
        Shape {
            shards: SHARDS,
            queues: 2,
            reconcilers: 2,
            namespaces: vec![ns.name().to_owned(), refused.name().to_owned()],
            elector_args: Vec::new(),
            queue_args: Vec::new(),
        },
    )
    .await;
    println!("{:>5.1}s topology ready", start.elapsed().as_secs_f64());

    let rules = plane.dir().join(format!("alerts-{}.rules.yaml", ns.name()));
    let extracted = std::process::Command::new(component().join("tests/promtool.sh"))
        .arg("--extract")
        .arg(&rules)
        .status()
        .unwrap();
    assert!(extracted.success());
    let targets: Vec<(&str, std::net::SocketAddr)> = topology
        .running
        .iter()
        .map(|(job, process)| (*job, process.admin_addr()))
        .collect();
    let prometheus = Prometheus::start(&targets, &[&rules]).await.unwrap();
    println!(
        "{:>5.1}s prometheus ready at {}",
        start.elapsed().as_secs_f64(),
        prometheus.url()
    );

    // The workload.
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    let deployments = (0..DEPLOYMENTS)
        .map(|i| manifests::deployment(&format!("web-{i}"), REPLICAS, Value::Null))
        .collect();
    create_all(&api, deployments, DEPLOYMENTS).await;
    Api::<Deployment>::namespaced(client.clone(), refused.name())
        .create(
            &PostParams::default(),
            &manifests::deployment("refused", 1, Value::Null),
        )
        .await
        .unwrap();
    let queue = topology.of("switchyard-queue")[0];
    let channel = Pki::shared()
        .channel(Role::Observer, Role::Queue, queue.grpc_addr())
        .await
        .unwrap();
    let denied = QueueClient::new(channel)
        .enqueue(EnqueueRequest::default())
        .await
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    if let Err(done) = await_rolled_out(
        &api,
        manifests::IMAGE,
        REPLICAS,
        DEPLOYMENTS,
        CONVERGE_TIMEOUT,
    )
    .await
    {
        panic!("{done} of {DEPLOYMENTS} Deployments rolled out within {CONVERGE_TIMEOUT:?}");
    }
    println!(
        "{:>5.1}s workload rolled out",
        start.elapsed().as_secs_f64()
    );

    let deadline = Instant::now() + QUERIES_TIMEOUT;
    // Every admin port scraped, a few times over.
    let scraped = await_query(&prometheus, "count_over_time(up[5m])", deadline, |s| {
        s.len() == targets.len() && s.iter().all(|s| s.value >= 3.0)
    })
    .await
    .unwrap_or_else(|last| panic!("{} targets scraped 3 times: {last}", targets.len()));
    await_query(&prometheus, "up", deadline, |s| {
        s.len() == targets.len() && s.iter().all(|s| s.value == 1.0)
    })
    .await
    .unwrap_or_else(|last| panic!("every admin port answers: {last} ({scraped:?})"));
    // The refused Pods are failed reconciles of the ReplicaSet controller.
    await_query(
        &prometheus,
        r#"sum(switchyard_reconcile_errors_total{controller="apps/v1/ReplicaSet"})"#,
        deadline,
        |s| s.first().is_some_and(|s| s.value >= 2.0),
    )
    .await
    .unwrap_or_else(|last| panic!("the refused Pods' reconciles failed: {last}"));

    let mut missing = Vec::new();
    for (panel, legend, expr) in &queries {
        if let Err(last) = await_query(&prometheus, expr, deadline, has_data).await {
            missing.push(format!("{panel} ({legend}): {expr}\n    last: {last}"));
        }
    }
    assert!(
        missing.is_empty(),
        "dashboard queries without data:\n{}",
        missing.join("\n")
    );
    println!(
        "{:>5.1}s all {} dashboard queries return data",
        start.elapsed().as_secs_f64(),
        queries.len()
    );

    // Every shard has an owner, and the queues say how many there are.
    let count = prometheus
        .query("max(switchyard_queue_shard_count)")
        .await
        .unwrap();
    assert_eq!(count.first().map(|s| s.value), Some(f64::from(SHARDS)));
    await_query(
        &prometheus,
        "count(count by (shard) (switchyard_queue_shard_epoch))",
        deadline,
        |s| s.first().is_some_and(|s| s.value == f64::from(SHARDS)),
    )
    .await
    .unwrap_or_else(|last| panic!("{SHARDS} shards served: {last}"));

    // Every alert rule evaluates on real data without an error, and none fires.
    let names: BTreeSet<String> = alerts().into_iter().map(|(name, _)| name).collect();
    let evaluated = loop {
        let groups = prometheus.rules().await.unwrap();
        let rules: Vec<Value> = groups
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let all_evaluated = rules.iter().all(|r| {
            r["lastEvaluation"]
                .as_str()
                .is_some_and(|t| !t.starts_with("0001-"))
        });
        if all_evaluated && !rules.is_empty() {
            break rules;
        }
        assert!(
            Instant::now() < deadline,
            "the rules were not evaluated: {groups}\n{}",
            prometheus.log()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let loaded: BTreeSet<String> = evaluated
        .iter()
        .filter_map(|r| Some(r["name"].as_str()?.to_owned()))
        .collect();
    assert_eq!(loaded, names, "the alerts Prometheus loaded");
    for rule in &evaluated {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
    let firing = prometheus
        .query(r#"ALERTS{alertstate="firing"}"#)
        .await
        .unwrap();
    assert!(firing.is_empty(), "no alert fires: {firing:?}");

    drop(prometheus);
    let unclean = topology.terminate().await;
    assert!(unclean.is_empty(), "{}", unclean.join("\n"));
    println!("{:>5.1}s stopped", start.elapsed().as_secs_f64());
}
