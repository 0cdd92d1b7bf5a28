//! The Job controller against the real control plane, beside kube-controller-manager's
//! `job-controller` (each on a namespace of its own, one after the other): the same Jobs end
//! the same under both. The harness's kwok ends each Pod as its container's command asks
//! (docs/testing.md, "Pod outcomes"): no command succeeds after 1 s, `exit N` fails with N,
//! `sleep S` runs S seconds.
//!
//! - `complete`: 3 completions, parallelism 2: `Complete` (`CompletionsReached`), 3 succeeded;
//! - `indexed`: an Indexed Job of 3: `completedIndexes` `0-2`, each Pod with its index label
//!   and hostname;
//! - `backoff`: every Pod exits 1, `backoffLimit: 1`: `Failed` (`BackoffLimitExceeded`) after
//!   two failures, the second Pod created after the 10 s failure backoff;
//! - `fail_job`: a `podFailurePolicy` `FailJob` rule on exit code 42: `Failed`
//!   (`PodFailurePolicy`) after one Pod;
//! - `deadline`: Pods that sleep 60 s, `activeDeadlineSeconds: 2`: `Failed`
//!   (`DeadlineExceeded`), its Pods deleted;
//! - `per_index`: Indexed, 2 completions, every Pod exits 1, `backoffLimitPerIndex: 0`:
//!   `failedIndexes` `0,1`, `Failed` (`FailedIndexes`);
//! - `success_policy`: Indexed, `succeededCount: 1`: `Complete` (`SuccessPolicy`) after one
//!   Pod, the others deleted;
//! - `suspended`: created suspended: no Pod, `Suspended`; resumed: `Complete`;
//! - `elsewhere`: `managedBy` another controller: no Pod, no status.
//!
//! And on a namespace of its own where an admission policy refuses every Pod, `refused`: the
//! Job's Pods cannot be created: it stays without Pods or conditions, reports `FailedCreate`
//! Events naming the refusal, and retries with a backoff rather than in a loop.
//!
//! A binary of its own: kube-controller-manager's Job controller acts on every namespace.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use futures::future::join_all;
use serde_json::{Value, json};
use switchyard_k8s::{
    Api, Client, ListParams, Pod, PostParams,
    k8s_openapi::api::{
        admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
        batch::v1::Job,
        core::v1::Event as CoreEvent,
    },
    kube::api::{Patch, PatchParams},
};
use switchyard_reconciler::job::NAME;
use switchyard_reconciler_core::job::{COMPLETION_INDEX, has_tracking_finalizer};
use switchyard_testenv::{ControlPlane, TestNamespace};

/// The longest a scenario may take: the backoff scenario waits out a 10 s failure backoff.
const SCENARIO: Duration = Duration::from_secs(60);

/// How a Job ended, in the fields both controllers write.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    /// Type and reason of each condition that is true, sorted.
    conditions: Vec<(String, String)>,
    succeeded: i32,
    failed: i32,
    completed_indexes: Option<String>,
    failed_indexes: Option<String>,
    /// Pods left with the tracking finalizer once the Job finished.
    tracked_pods: usize,
    /// Per Pod left, its index label and hostname (Indexed Jobs).
    indexed_pods: Vec<(String, String)>,
}

fn job(name: &str, spec: Value) -> Job {
    let mut full = json!({
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "work", "image": "registry.example/work:1"}]
            }
        }
    });
    for (k, v) in spec.as_object().unwrap() {
        full[k] = v.clone();
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": full})).unwrap()
}

fn command(spec: Value, command: &[&str]) -> Value {
    let mut spec = spec;
    spec["template"] = json!({
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "work", "image": "registry.example/work:1", "command": command}]
        }
    });
    spec
}

fn scenarios() -> Vec<(&'static str, Value)> {
    vec![
        ("complete", json!({"completions": 3, "parallelism": 2})),
        (
            "indexed",
            json!({"completionMode": "Indexed", "completions": 3, "parallelism": 3}),
        ),
        (
            "backoff",
            command(json!({"backoffLimit": 1}), &["sh", "-c", "exit 1"]),
        ),
        (
            "fail-job",
            command(
                json!({"backoffLimit": 6, "podFailurePolicy": {"rules": [
                    {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}}),
                &["sh", "-c", "exit 42"],
            ),
        ),
        (
            "deadline",
            command(json!({"activeDeadlineSeconds": 2}), &["sleep", "60"]),
        ),
        (
            "per-index",
            command(
                json!({"completionMode": "Indexed", "completions": 2, "parallelism": 2,
                       "backoffLimitPerIndex": 0}),
                &["sh", "-c", "exit 1"],
            ),
        ),
        (
            "success-policy",
            command(
                json!({"completionMode": "Indexed", "completions": 3, "parallelism": 1,
                       "successPolicy": {"rules": [{"succeededCount": 1}]}}),
                &["sleep", "1"],
            ),
        ),
        ("suspended", json!({"suspend": true, "completions": 1})),
        (
            "elsewhere",
            json!({"managedBy": "example.com/other", "completions": 1}),
        ),
    ]
}

fn finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        })
}

fn true_conditions(job: &Job) -> Vec<(String, String)> {
    let mut conditions: Vec<(String, String)> = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.status == "True")
        .map(|c| (c.type_, c.reason.unwrap_or_default()))
        .collect();
    conditions.sort();
    conditions
}

/// Polls the Job until `done` holds; the Job then.
async fn job_until(api: &Api<Job>, name: &str, what: &str, done: impl Fn(&Job) -> bool) -> Job {
    let deadline = Instant::now() + SCENARIO;
    loop {
        let job = api.get(name).await.unwrap();
        if done(&job) {
            return job;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: not {what} after {SCENARIO:?}: {:#?}",
            job.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs one scenario in `namespace` and reads how it ended.
async fn run(client: &Client, namespace: &str, name: &str, spec: Value) -> Outcome {
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    jobs.create(&PostParams::default(), &job(name, spec))
        .await
        .unwrap();
    let selector = format!("batch.kubernetes.io/job-name={name}");
    let job = match name {
        "suspended" => {
            let job = job_until(&jobs, name, "suspended", |j| {
                true_conditions(j).iter().any(|(t, _)| t == "Suspended")
            })
            .await;
            let created = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .unwrap();
            assert!(created.items.is_empty(), "{name}: pods of a suspended job");
            jobs.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"suspend": false}})),
            )
            .await
            .unwrap();
            drop(job);
            job_until(&jobs, name, "finished", finished).await
        }
        "elsewhere" => {
            // Left alone: nothing to wait for but time.
            tokio::time::sleep(Duration::from_secs(3)).await;
            jobs.get(name).await.unwrap()
        }
        _ => job_until(&jobs, name, "finished", finished).await,
    };
    let left = support::pods_once_counted(&pods, &selector).await;
    let status = job.status.clone().unwrap_or_default();
    let mut indexed_pods: Vec<(String, String)> = left
        .iter()
        .filter_map(|p| {
            let index = p.metadata.labels.as_ref()?.get(COMPLETION_INDEX)?.clone();
            let hostname = p.spec.as_ref()?.hostname.clone().unwrap_or_default();
            Some((index, hostname))
        })
        .collect();
    indexed_pods.sort();
    indexed_pods.dedup();
    Outcome {
        conditions: true_conditions(&job),
        succeeded: status.succeeded.unwrap_or(0),
        failed: status.failed.unwrap_or(0),
        completed_indexes: status.completed_indexes.filter(|s| !s.is_empty()),
        failed_indexes: status.failed_indexes.filter(|s| !s.is_empty()),
        tracked_pods: left.iter().filter(|p| has_tracking_finalizer(p)).count(),
        indexed_pods,
    }
}

/// Every scenario at once, in a namespace of its own.
async fn all(
    plane: &ControlPlane,
    client: &Client,
    prefix: &str,
) -> BTreeMap<&'static str, Outcome> {
    let namespace = TestNamespace::create(plane, client, prefix).await.unwrap();
    let ns = namespace.name().to_owned();
    let outcomes = join_all(scenarios().into_iter().map(|(name, spec)| {
        let (client, ns) = (client.clone(), ns.clone());
        async move { (name, run(&client, &ns, name, spec).await) }
    }))
    .await;
    outcomes.into_iter().collect()
}

/// What became of a Job whose Pods admission refuses, after `REFUSED_WATCHED`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refused {
    pods: usize,
    active: i32,
    conditions: Vec<(String, String)>,
    /// A `FailedCreate` Event names the refusal.
    reported: bool,
}

const REFUSED_WATCHED: Duration = Duration::from_secs(8);

/// The `refused` scenario; also how many creations were tried (the Events' occurrences).
async fn refused(plane: &ControlPlane, client: &Client, prefix: &str) -> (Refused, i32) {
    let namespace = TestNamespace::create(plane, client, &format!("{prefix}-refused"))
        .await
        .unwrap();
    let ns = namespace.name();
    // An admission policy of the apiserver's own (CEL) refuses every Pod of the namespace.
    let name = format!("{ns}-no-pods");
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                "resources": ["pods"],
            }]},
            "validations": [{"expression": "false", "message": "no pods are admitted here"}],
        },
    }))
    .unwrap();
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": ns,
            }}},
        },
    }))
    .unwrap();
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    // In force once a Pod is refused.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let probe: Pod = serde_json::from_value(json!({"metadata": {"name": "probe"},
        "spec": {"containers": [{"name": "c", "image": "registry.example/c:1"}]}}))
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while pods.create(&PostParams::default(), &probe).await.is_ok() {
        pods.delete("probe", &Default::default()).await.unwrap();
        assert!(
            Instant::now() < deadline,
            "the admission policy is not in force"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    jobs.create(
        &PostParams::default(),
        &job("refused", json!({"completions": 1})),
    )
    .await
    .unwrap();
    tokio::time::sleep(REFUSED_WATCHED).await;
    let job = jobs.get("refused").await.unwrap();
    let pods = pods.list(&ListParams::default()).await.unwrap().items.len();
    let events: Api<CoreEvent> = Api::namespaced(client.clone(), ns);
    let failed: Vec<CoreEvent> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedCreate"))
        .collect();
    let attempts = failed
        .iter()
        .map(|e| {
            e.series
                .as_ref()
                .and_then(|s| s.count)
                .or(e.count)
                .unwrap_or(1)
                .max(1)
        })
        .sum();
    let refused = Refused {
        pods,
        active: job.status.as_ref().and_then(|s| s.active).unwrap_or(0),
        conditions: true_conditions(&job),
        reported: failed.iter().any(|e| {
            e.message
                .as_deref()
                .is_some_and(|m| m.contains("no pods are admitted here"))
        }),
    };
    let _ = bindings.delete(&name, &Default::default()).await;
    let _ = policies.delete(&name, &Default::default()).await;
    (refused, attempts)
}

fn conditions(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = pairs
        .iter()
        .map(|(t, r)| ((*t).to_owned(), (*r).to_owned()))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_end_as_under_kube_controller_manager() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();

    let kcm = plane
        .start_controller_manager(&["job-controller"], &[])
        .await
        .expect("kube-controller-manager starts");
    let (under_kcm, refused_kcm) = tokio::join!(
        all(plane, &client, "job-kcm"),
        refused(plane, &client, "job-kcm")
    );
    drop(kcm);

    let switchyard = support::Builtins::start(plane, &[NAME]).await;
    let (under_switchyard, refused_switchyard) = tokio::join!(
        all(plane, &client, "job-sy"),
        refused(plane, &client, "job-sy")
    );
    // The Pods were this reconciler's: kube-controller-manager is stopped, and no other
    // controller of Jobs runs.
    let created = switchyard.requests("create", &["201"]).await;
    switchyard.stop().await;

    for (name, kcm) in &under_kcm {
        eprintln!("{name}: kube-controller-manager {kcm:?}");
        eprintln!(
            "{name}: switchyard              {:?}",
            under_switchyard[name]
        );
    }
    let expected = [
        (
            "complete",
            conditions(&[
                ("Complete", "CompletionsReached"),
                ("SuccessCriteriaMet", "CompletionsReached"),
            ]),
        ),
        (
            "indexed",
            conditions(&[
                ("Complete", "CompletionsReached"),
                ("SuccessCriteriaMet", "CompletionsReached"),
            ]),
        ),
        (
            "backoff",
            conditions(&[
                ("Failed", "BackoffLimitExceeded"),
                ("FailureTarget", "BackoffLimitExceeded"),
            ]),
        ),
        (
            "fail-job",
            conditions(&[
                ("Failed", "PodFailurePolicy"),
                ("FailureTarget", "PodFailurePolicy"),
            ]),
        ),
        (
            "deadline",
            conditions(&[
                ("Failed", "DeadlineExceeded"),
                ("FailureTarget", "DeadlineExceeded"),
            ]),
        ),
        (
            "per-index",
            conditions(&[
                ("Failed", "FailedIndexes"),
                ("FailureTarget", "FailedIndexes"),
            ]),
        ),
        (
            "success-policy",
            conditions(&[
                ("Complete", "SuccessPolicy"),
                ("SuccessCriteriaMet", "SuccessPolicy"),
            ]),
        ),
        (
            "suspended",
            conditions(&[
                ("Complete", "CompletionsReached"),
                ("SuccessCriteriaMet", "CompletionsReached"),
            ]),
        ),
        ("elsewhere", conditions(&[])),
    ];
    for (name, wanted) in expected {
        assert_eq!(
            under_kcm[name].conditions, wanted,
            "{name} under kube-controller-manager"
        );
    }
    assert_eq!(under_kcm["complete"].succeeded, 3);
    assert_eq!(
        under_kcm["indexed"].completed_indexes.as_deref(),
        Some("0-2")
    );
    assert_eq!(
        under_kcm["indexed"].indexed_pods,
        [("0", "indexed-0"), ("1", "indexed-1"), ("2", "indexed-2")]
            .map(|(i, h)| (i.to_owned(), h.to_owned()))
    );
    assert_eq!(under_kcm["backoff"].failed, 2);
    assert_eq!(
        under_kcm["per-index"].failed_indexes.as_deref(),
        Some("0,1")
    );
    assert_eq!(under_kcm["success-policy"].succeeded, 1);
    for (name, kcm) in &under_kcm {
        assert_eq!(
            &under_switchyard[name], kcm,
            "{name}: switchyard against kube-controller-manager"
        );
    }
    assert!(created >= 14.0, "the reconciler created {created} pods");

    eprintln!(
        "refused: kube-controller-manager {refused_kcm:?}, switchyard {refused_switchyard:?}"
    );
    let refused = Refused {
        pods: 0,
        active: 0,
        conditions: Vec::new(),
        reported: true,
    };
    assert_eq!(refused_kcm.0, refused);
    assert_eq!(refused_switchyard.0, refused);
    // Retried with a backoff: a handful of attempts in 8 s, not hundreds.
    for (side, attempts) in [
        ("kube-controller-manager", refused_kcm.1),
        ("switchyard", refused_switchyard.1),
    ] {
        assert!(
            (1..=20).contains(&attempts),
            "{side}: {attempts} creations tried in {REFUSED_WATCHED:?}"
        );
    }
}
