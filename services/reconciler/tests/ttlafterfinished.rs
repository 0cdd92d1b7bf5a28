//! The TTL-after-finished controller against the real control plane, beside
//! kube-controller-manager's `ttl-after-finished-controller` (each with its own Job
//! controller, on a namespace of its own, one after the other): the same Jobs are deleted,
//! as late after they finished, in the same way.
//!
//! - `ttl-3`: finished, `ttlSecondsAfterFinished: 3`: deleted 3 to 8 s after its `Complete`
//!   condition's transition;
//! - `ttl-0`: deleted as soon as it finished;
//! - `ttl-300`: not deleted while the test watches;
//! - `no-ttl`: never deleted;
//! - `ttl-later`: made without a TTL, given `ttlSecondsAfterFinished: 2` once it finished:
//!   deleted 2 to 7 s after its finish.
//!
//! No garbage collector runs, so a Job deleted in the foreground stays, being deleted, with
//! the `foregroundDeletion` finalizer: which shows the propagation the controller asked for.
//! A binary of its own: kube-controller-manager's controllers act on every namespace.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use futures::future::join_all;
use serde_json::json;
use switchyard_k8s::{
    Api, Client, PostParams,
    k8s_openapi::api::batch::v1::Job,
    kube::api::{Patch, PatchParams},
};
use switchyard_testenv::{ControlPlane, TestNamespace};

use support::WITHIN;

/// How long the test watches for a deletion that must not come.
const WATCHED: Duration = Duration::from_secs(12);

/// What became of one Job.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    /// Deleted, with the `foregroundDeletion` finalizer.
    foreground: Option<bool>,
    /// Whole seconds from its finish to its deletion, within the bounds the TTL allows.
    on_time: Option<bool>,
}

fn job(name: &str, ttl: Option<i32>) -> Job {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "ttlSecondsAfterFinished": ttl,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "work", "image": "registry.example/work:1"}]
            }}
        }
    }))
    .unwrap()
}

fn finished_at(job: &Job) -> Option<i64> {
    job.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Complete" && c.status == "True")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0.as_second())
}

/// Creates the Job with `ttl`, gives it `later` as its TTL once it finished, and watches it
/// until it is deleted or `WATCHED` has passed since it finished.
async fn follow(
    client: &Client,
    namespace: &str,
    name: &str,
    ttl: Option<i32>,
    later: Option<i32>,
) -> Outcome {
    let api: Api<Job> = Api::namespaced(client.clone(), namespace);
    api.create(&PostParams::default(), &job(name, ttl))
        .await
        .unwrap();
    let ttl = ttl.or(later);
    let started = Instant::now();
    let mut finished_seen: Option<Instant> = None;
    loop {
        let current = api.get(name).await.unwrap();
        if let Some(deleted) = &current.metadata.deletion_timestamp {
            let finished = finished_at(&current).expect("deleted before it finished");
            let took = deleted.0.as_second() - finished;
            let ttl = i64::from(ttl.unwrap_or(i32::MAX));
            let foreground = current
                .metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == "foregroundDeletion");
            eprintln!("{namespace}/{name}: deleted {took} s after it finished");
            return Outcome {
                foreground: Some(foreground),
                on_time: Some((ttl..=ttl + 5).contains(&took)),
            };
        }
        if finished_at(&current).is_some() {
            if finished_seen.is_none()
                && let Some(later) = later
            {
                let patch = json!({"spec": {"ttlSecondsAfterFinished": later}});
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
            }
            let seen = *finished_seen.get_or_insert_with(Instant::now);
            if seen.elapsed() >= WATCHED {
                return Outcome {
                    foreground: None,
                    on_time: None,
                };
            }
        }
        assert!(
            started.elapsed() < WITHIN + WATCHED,
            "{namespace}/{name}: neither finished nor deleted: {:#?}",
            current.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn all(
    plane: &ControlPlane,
    client: &Client,
    prefix: &str,
) -> BTreeMap<&'static str, Outcome> {
    let namespace = TestNamespace::create(plane, client, prefix).await.unwrap();
    let ns = namespace.name().to_owned();
    let jobs = [
        ("ttl-3", Some(3), None),
        ("ttl-0", Some(0), None),
        ("ttl-300", Some(300), None),
        ("no-ttl", None, None),
        ("ttl-later", None, Some(2)),
    ];
    join_all(jobs.into_iter().map(|(name, ttl, later)| {
        let (client, ns) = (client.clone(), ns.clone());
        async move { (name, follow(&client, &ns, name, ttl, later).await) }
    }))
    .await
    .into_iter()
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_jobs_are_deleted_after_their_ttl_as_under_kube_controller_manager() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();

    let kcm = plane
        .start_controller_manager(&["job-controller", "ttl-after-finished-controller"], &[])
        .await
        .expect("kube-controller-manager starts");
    let under_kcm = all(plane, &client, "ttl-kcm").await;
    drop(kcm);

    let names = [
        switchyard_reconciler::job::NAME,
        switchyard_reconciler::ttlafterfinished::NAME,
    ];
    let switchyard = support::Builtins::start(plane, &names).await;
    let under_switchyard = all(plane, &client, "ttl-sy").await;
    // A deletion the foregroundDeletion finalizer holds answers 200 or 202 (accepted).
    let deleted = switchyard.requests("delete", &["200", "202"]).await;
    let reconciles = switchyard
        .reconciler
        .metric(&format!(
            r#"switchyard_reconcile_time_seconds_count{{controller="{}"}}"#,
            switchyard_reconciler::ttlafterfinished::NAME
        ))
        .await;
    switchyard.stop().await;

    eprintln!("kube-controller-manager: {under_kcm:?}");
    eprintln!("switchyard: {under_switchyard:?}, {reconciles} reconciles");
    let deleted_in_time = Outcome {
        foreground: Some(true),
        on_time: Some(true),
    };
    let kept = Outcome {
        foreground: None,
        on_time: None,
    };
    assert_eq!(under_kcm["ttl-3"], deleted_in_time);
    assert_eq!(under_kcm["ttl-0"], deleted_in_time);
    assert_eq!(under_kcm["ttl-300"], kept);
    assert_eq!(under_kcm["no-ttl"], kept);
    assert_eq!(under_kcm["ttl-later"], deleted_in_time);
    assert_eq!(under_switchyard, under_kcm);
    assert!(deleted >= 2.0, "the reconciler deleted {deleted} jobs");
    // As kube-controller-manager's, the controller hears of a Job with a TTL when it is
    // made, finishes or has its TTL changed, not of Jobs without one nor of each status write
    // the Job controller makes on the way: the 4 Jobs with a TTL left from
    // kube-controller-manager's half once as it starts, its own 3 made with a TTL when made
    // and when finished, `ttl-later` when given its TTL, and the waits of `ttl-3` and
    // `ttl-later` (twice each, should a delayed key come a hair early). Keyed by every Job
    // change, it reconciled 26 times for the first 4 Jobs alone.
    assert!(
        reconciles <= 4.0 + 3.0 * 2.0 + 1.0 + 2.0 * 2.0,
        "{reconciles} reconciles of the TTL-after-finished controller"
    );
}
