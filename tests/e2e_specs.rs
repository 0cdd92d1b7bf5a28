//! Kubernetes' own end-to-end specs (`e2e.test`, built from the control plane's module by
//! `scripts/testenv.sh e2e`) run twice at once, each on a control plane of its own: under
//! kube-controller-manager's controllers, and under Switchyard's built-in controllers. Every
//! spec that passes under kube-controller-manager must pass under Switchyard; a spec that
//! fails under both (the test cluster's kwok Pods cannot do what it needs) is reported, not
//! counted against either.
//!
//! `make e2e-specs` runs it (it is ignored in `make test`: the batch specs alone take about
//! ten minutes, the CronJob ones waiting on whole minutes). Environment:
//!
//! - `SWITCHYARD_E2E_FOCUS`: the specs, a ginkgo regular expression; by default those of the
//!   Job, CronJob and TTL-after-finished controllers;
//! - `SWITCHYARD_E2E_SKIP`: specs left out; by default `[Serial]`, `[Disruptive]`,
//!   `[Flaky]` and `[Feature:…]` (features behind gates the test apiserver does not turn on);
//! - `SWITCHYARD_E2E_PROCS`: ginkgo processes per side (6).
//!
//! On both sides kube-controller-manager also runs what Switchyard does not offer and the e2e
//! framework needs: the `kube-root-ca.crt` publisher.

#![allow(clippy::unwrap_used)]

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;
use switchyard_testenv::{ControlPlane, ControlPlaneOptions};
use switchyard_tests::topology::{Shape, Topology};

const FOCUS: &str = r"\[sig-apps\] (Job|CronJob|TTLAfterFinished) ";
const SKIP: &str = r"\[Serial\]|\[Disruptive\]|\[Flaky\]|\[Feature:";
const PROCS: usize = 6;
/// ginkgo's own bound on a side's run.
const SUITE_TIMEOUT: Duration = Duration::from_secs(50 * 60);
/// What the e2e framework needs and Switchyard does not run.
const INFRASTRUCTURE: &[&str] = &["root-ca-certificate-publisher-controller"];
/// kube-controller-manager's names of the controllers Switchyard runs by default.
const COMPARED: &[&str] = &[
    "replicaset-controller",
    "deployment-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "job-controller",
    "cronjob-controller",
    "ttl-after-finished-controller",
    "pod-garbage-collector-controller",
    "replicationcontroller-controller",
    "statefulset-controller",
    "disruption-controller",
    "daemonset-controller",
    "endpointslice-controller",
    "endpoints-controller",
    "endpointslice-mirroring-controller",
];

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// One spec's outcome on one side.
#[derive(Clone, Debug)]
struct Outcome {
    state: String,
    seconds: f64,
    failure: String,
}

/// A ginkgo JSON report: one entry per suite run.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Suite {
    #[serde(default)]
    spec_reports: Vec<SpecReport>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SpecReport {
    /// `null` for the suite's own nodes.
    #[serde(default)]
    container_hierarchy_texts: Option<Vec<String>>,
    #[serde(default)]
    leaf_node_text: String,
    #[serde(default)]
    leaf_node_type: String,
    state: String,
    /// Nanoseconds.
    #[serde(default)]
    run_time: u64,
    #[serde(default)]
    failure: Option<Failure>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Failure {
    #[serde(default)]
    message: String,
}

/// The specs a report ran (skipped ones and the suite's setup nodes left out), by full name.
fn outcomes(report: &Path) -> BTreeMap<String, Outcome> {
    let text = std::fs::read_to_string(report)
        .unwrap_or_else(|e| panic!("ginkgo's report {}: {e}", report.display()));
    let suites: Vec<Suite> = serde_json::from_str(&text).unwrap();
    suites
        .into_iter()
        .flat_map(|s| s.spec_reports)
        .filter(|r| r.leaf_node_type == "It" && r.state != "skipped")
        .map(|r| {
            let mut name = r.container_hierarchy_texts.unwrap_or_default().join(" ");
            name.push(' ');
            name.push_str(&r.leaf_node_text);
            let failure = r.failure.map(|f| f.message).unwrap_or_default();
            let outcome = Outcome {
                state: r.state,
                seconds: r.run_time as f64 / 1e9,
                failure: failure.lines().next().unwrap_or_default().to_owned(),
            };
            (name, outcome)
        })
        .collect()
}

/// Runs the focused specs against `plane` with ginkgo, its output and report in `dir`.
async fn run_specs(plane: &ControlPlane, dir: &Path) -> BTreeMap<String, Outcome> {
    std::fs::create_dir_all(dir).unwrap();
    let binaries = plane.binaries();
    let (ginkgo, e2e) = (binaries.path("ginkgo"), binaries.path("e2e.test"));
    for program in [&ginkgo, &e2e] {
        assert!(
            program.exists(),
            "{} is missing: scripts/testenv.sh e2e builds it (make e2e-specs does)",
            program.display()
        );
    }
    let log = std::fs::File::create(dir.join("ginkgo.log")).unwrap();
    let status = tokio::process::Command::new(&ginkgo)
        .current_dir(dir)
        .arg(format!(
            "--procs={}",
            env_or("SWITCHYARD_E2E_PROCS", &PROCS.to_string())
        ))
        .arg(format!("--focus={}", env_or("SWITCHYARD_E2E_FOCUS", FOCUS)))
        .arg(format!("--skip={}", env_or("SWITCHYARD_E2E_SKIP", SKIP)))
        .arg(format!("--timeout={}s", SUITE_TIMEOUT.as_secs()))
        .args(["--json-report=report.json", "--no-color"])
        .arg(format!("--output-dir={}", dir.display()))
        .arg(&e2e)
        .arg("--")
        .arg(format!("--kubeconfig={}", plane.kubeconfig().display()))
        // Never ask a kwok "kubelet" for logs: its Pods run nothing.
        .args(["--provider=local", "--dump-logs-on-failure=false"])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .status()
        .await
        .unwrap();
    // ginkgo exits non-zero when a spec failed; the report says which.
    eprintln!("{}: ginkgo exited {status}", dir.display());
    outcomes(&dir.join("report.json"))
}

fn passed(outcome: Option<&Outcome>) -> bool {
    outcome.is_some_and(|o| o.state == "passed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "about ten minutes: make e2e-specs runs it"]
async fn kubernetes_e2e_specs_pass_under_switchyard_wherever_they_pass_under_kube_controller_manager()
 {
    let results = PathBuf::from(env_or(
        "SWITCHYARD_E2E_RESULTS",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../target/e2e-specs"),
    ));
    let _ = std::fs::remove_dir_all(&results);
    let (kcm_plane, own_plane) = tokio::join!(
        ControlPlane::start(ControlPlaneOptions::default()),
        ControlPlane::start(ControlPlaneOptions::default()),
    );
    let (kcm_plane, own_plane) = (kcm_plane.unwrap(), own_plane.unwrap());

    let under_kcm = async {
        let controllers: Vec<&str> = COMPARED.iter().chain(INFRASTRUCTURE).copied().collect();
        let _kcm = kcm_plane
            .start_controller_manager(&controllers, &[])
            .await
            .expect("kube-controller-manager starts");
        run_specs(&kcm_plane, &results.join("kube-controller-manager")).await
    };
    let under_switchyard = async {
        let _kcm = own_plane
            .start_controller_manager(INFRASTRUCTURE, &[])
            .await
            .expect("kube-controller-manager starts");
        let services = Topology::start(
            &own_plane,
            Shape {
                shards: 16,
                queues: 1,
                reconcilers: 1,
                namespaces: Vec::new(),
                elector_args: Vec::new(),
                queue_args: Vec::new(),
            },
        )
        .await;
        let seen = run_specs(&own_plane, &results.join("switchyard")).await;
        let unclean = services.terminate().await;
        assert!(unclean.is_empty(), "{unclean:#?}");
        seen
    };
    let (kcm, ours) = tokio::join!(under_kcm, under_switchyard);

    let mut table =
        String::from("| spec | kube-controller-manager | Switchyard |\n|---|---|---|\n");
    let mut regressions = Vec::new();
    let names: std::collections::BTreeSet<&String> = kcm.keys().chain(ours.keys()).collect();
    for name in names {
        let (theirs, mine) = (kcm.get(name), ours.get(name));
        let cell = |o: Option<&Outcome>| {
            o.map_or("not run".to_owned(), |o| {
                format!("{} ({:.0} s)", o.state, o.seconds)
            })
        };
        table.push_str(&format!("| {name} | {} | {} |\n", cell(theirs), cell(mine)));
        if passed(theirs) && !passed(mine) {
            regressions.push(format!(
                "{name}: {}",
                mine.map_or("not run", |o| o.failure.as_str())
            ));
        }
    }
    std::fs::write(results.join("table.md"), &table).unwrap();
    let count =
        |side: &BTreeMap<String, Outcome>| side.values().filter(|o| o.state == "passed").count();
    eprintln!(
        "{table}\npassed: kube-controller-manager {} of {}, Switchyard {} of {} (table in {})",
        count(&kcm),
        kcm.len(),
        count(&ours),
        ours.len(),
        results.join("table.md").display()
    );
    assert!(!kcm.is_empty(), "no spec ran under kube-controller-manager");
    assert!(
        regressions.is_empty(),
        "specs that pass under kube-controller-manager and not under Switchyard:\n{}",
        regressions.join("\n")
    );
}

/// ginkgo's report as it writes it: the suite's own nodes (no containers, `null`), skipped
/// specs, and specs that passed and failed.
#[test]
fn a_ginkgo_report_gives_the_specs_that_ran_with_their_outcome() {
    let report = r#"[{"SuiteDescription": "Kubernetes e2e suite", "SpecReports": [
        {"ContainerHierarchyTexts": null, "LeafNodeType": "SynchronizedBeforeSuite",
         "LeafNodeText": "", "State": "passed", "RunTime": 5000000},
        {"ContainerHierarchyTexts": ["[sig-apps] Job"], "LeafNodeType": "It",
         "LeafNodeText": "should delete a job", "State": "passed", "RunTime": 2500000000,
         "Failure": null},
        {"ContainerHierarchyTexts": ["[sig-apps] Job", "with successPolicy"],
         "LeafNodeType": "It", "LeafNodeText": "should succeed", "State": "failed",
         "RunTime": 900000000000,
         "Failure": {"Message": "timed out waiting for the condition\nmore"}},
        {"ContainerHierarchyTexts": ["[sig-apps] Deployment"], "LeafNodeType": "It",
         "LeafNodeText": "should roll over", "State": "skipped", "RunTime": 0}
    ]}]"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    std::fs::write(&path, report).unwrap();
    let seen = outcomes(&path);
    let names: Vec<&str> = seen.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "[sig-apps] Job should delete a job",
            "[sig-apps] Job with successPolicy should succeed"
        ]
    );
    let failed = &seen["[sig-apps] Job with successPolicy should succeed"];
    assert_eq!(
        (failed.state.as_str(), failed.failure.as_str()),
        ("failed", "timed out waiting for the condition")
    );
    assert_eq!(seen["[sig-apps] Job should delete a job"].seconds, 2.5);
}
