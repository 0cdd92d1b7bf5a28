//! The CronJob controller against the real control plane, beside kube-controller-manager's
//! `cronjob-controller` (each with its own Job controller, on a namespace of its own, one
//! after the other): the same CronJobs start the same Jobs and end with the same status.
//!
//! Every CronJob runs `@every 5s` and the test watches 16 s, started early enough in a
//! minute that the minute does not change meanwhile. A Job is named for its scheduled
//! minute, so each CronJob starts one Job in that window, under both controllers:
//! - `allow`: its Job succeeds; the active list empties, `lastSuccessfulTime` is set;
//! - `forbid`: `concurrencyPolicy: Forbid`, its Job runs 60 s: one Job, still active;
//! - `suspended`: no Job;
//! - `tokyo`: `timeZone: Asia/Tokyo`: the Job's scheduled-timestamp annotation is in +09:00;
//! - `no-history`: `successfulJobsHistoryLimit: 0`: its Job, once succeeded, is deleted
//!   (and one of the same name started again at the next time: how many within the window
//!   is a matter of timing, so only that some were deleted is compared).
//!
//! A binary of its own: kube-controller-manager's controllers act on every namespace.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use futures::future::join_all;
use serde_json::{Value, json};
use switchyard_k8s::{
    Api, Client, ListParams, PostParams,
    k8s_openapi::{
        api::batch::v1::{CronJob, Job},
        jiff::Timestamp,
    },
};
use switchyard_reconciler_core::cronjob::SCHEDULED_TIMESTAMP;
use switchyard_testenv::{ControlPlane, TestNamespace};

/// How long each CronJob is watched.
const WATCHED: Duration = Duration::from_secs(16);
/// The last second of a minute at which the test may start, so that it ends in that minute.
const LATEST_START_SECOND: i64 = 38;

/// What one CronJob did.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    /// Distinct Job names seen.
    jobs: usize,
    /// Jobs seen (by UID) that were gone at the end.
    deleted: usize,
    active: usize,
    last_schedule_set: bool,
    last_successful_set: bool,
    /// The UTC offset of the scheduled-timestamp annotation of the Jobs seen.
    offsets: BTreeSet<String>,
    /// Each Job's name is `<cronjob>-<minutes since the epoch of its annotation>`.
    names_match: bool,
}

fn cronjob(name: &str, spec: Value, command: &[&str]) -> CronJob {
    let mut container = json!({"name": "work", "image": "registry.example/work:1"});
    if !command.is_empty() {
        container["command"] = json!(command);
    }
    let mut full = json!({
        "schedule": "@every 5s",
        "jobTemplate": {"spec": {
            "backoffLimit": 0,
            "template": {"spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "containers": [container]
            }}
        }}
    });
    for (k, v) in spec.as_object().unwrap() {
        full[k] = v.clone();
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": full})).unwrap()
}

fn scenarios() -> Vec<(&'static str, CronJob)> {
    vec![
        ("allow", cronjob("allow", json!({}), &[])),
        (
            "forbid",
            cronjob(
                "forbid",
                json!({"concurrencyPolicy": "Forbid"}),
                &["sleep", "60"],
            ),
        ),
        (
            "suspended",
            cronjob("suspended", json!({"suspend": true}), &[]),
        ),
        (
            "tokyo",
            cronjob("tokyo", json!({"timeZone": "Asia/Tokyo"}), &[]),
        ),
        (
            "no-history",
            cronjob("no-history", json!({"successfulJobsHistoryLimit": 0}), &[]),
        ),
    ]
}

async fn follow(client: &Client, namespace: &str, name: &str, cj: CronJob) -> Outcome {
    let cronjobs: Api<CronJob> = Api::namespaced(client.clone(), namespace);
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    cronjobs.create(&PostParams::default(), &cj).await.unwrap();
    let mut seen: BTreeMap<String, Job> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + WATCHED;
    let mut present = BTreeSet::new();
    while tokio::time::Instant::now() < deadline {
        present.clear();
        for job in jobs.list(&ListParams::default()).await.unwrap().items {
            let owned = job
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|r| r.kind == "CronJob" && r.name == name);
            if owned {
                let uid = job.metadata.uid.clone().unwrap_or_default();
                present.insert(uid.clone());
                seen.insert(uid, job);
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let status = cronjobs.get(name).await.unwrap().status.unwrap_or_default();
    let scheduled = |job: &Job| {
        job.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SCHEDULED_TIMESTAMP))
            .cloned()
            .unwrap_or_default()
    };
    let names: BTreeSet<&str> = seen
        .values()
        .filter_map(|j| j.metadata.name.as_deref())
        .collect();
    Outcome {
        jobs: names.len(),
        deleted: seen.keys().filter(|n| !present.contains(*n)).count(),
        active: status.active.map_or(0, |a| a.len()),
        last_schedule_set: status.last_schedule_time.is_some(),
        last_successful_set: status.last_successful_time.is_some(),
        offsets: seen
            .values()
            .map(|j| {
                let at = scheduled(j);
                if at.ends_with('Z') {
                    "Z".to_owned()
                } else {
                    at.get(at.len().saturating_sub(6)..)
                        .unwrap_or_default()
                        .to_owned()
                }
            })
            .collect(),
        names_match: seen.values().all(|job| {
            scheduled(job).parse::<Timestamp>().is_ok_and(|t| {
                job.metadata.name.as_deref()
                    == Some(format!("{name}-{}", t.as_second().div_euclid(60)).as_str())
            })
        }),
    }
}

/// Every scenario at once, in a namespace of its own, started early in a minute.
async fn all(
    plane: &ControlPlane,
    client: &Client,
    prefix: &str,
) -> BTreeMap<&'static str, Outcome> {
    let namespace = TestNamespace::create(plane, client, prefix).await.unwrap();
    let ns = namespace.name().to_owned();
    let second = Timestamp::now().as_second().rem_euclid(60);
    if second > LATEST_START_SECOND {
        tokio::time::sleep(Duration::from_secs((61 - second).unsigned_abs())).await;
    }
    join_all(scenarios().into_iter().map(|(name, cj)| {
        let (client, ns) = (client.clone(), ns.clone());
        async move { (name, follow(&client, &ns, name, cj).await) }
    }))
    .await
    .into_iter()
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cronjobs_start_their_jobs_as_under_kube_controller_manager() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();

    let kcm = plane
        .start_controller_manager(&["job-controller", "cronjob-controller"], &[])
        .await
        .expect("kube-controller-manager starts");
    let under_kcm = all(plane, &client, "cron-kcm").await;
    drop(kcm);

    let names = [
        switchyard_reconciler::job::NAME,
        switchyard_reconciler::cronjob::NAME,
    ];
    let switchyard = support::Builtins::start(plane, &names).await;
    let under_switchyard = all(plane, &client, "cron-sy").await;
    switchyard.stop().await;

    for (name, kcm) in &under_kcm {
        eprintln!("{name}: kube-controller-manager {kcm:?}");
        eprintln!(
            "{name}: switchyard              {:?}",
            under_switchyard[name]
        );
    }
    let utc: BTreeSet<String> = ["Z".to_owned()].into();
    let allow = &under_kcm["allow"];
    assert_eq!((allow.jobs, allow.active), (1, 0), "allow: {allow:?}");
    assert!(allow.last_schedule_set && allow.last_successful_set && allow.names_match);
    assert_eq!(allow.offsets, utc);
    let forbid = &under_kcm["forbid"];
    assert_eq!((forbid.jobs, forbid.active), (1, 1), "forbid: {forbid:?}");
    assert_eq!(under_kcm["suspended"].jobs, 0);
    assert!(!under_kcm["suspended"].last_schedule_set);
    assert_eq!(under_kcm["tokyo"].offsets, ["+09:00".to_owned()].into());
    let no_history = &under_kcm["no-history"];
    assert!(no_history.deleted >= 1, "no-history: {no_history:?}");
    for (name, kcm) in &under_kcm {
        let sy = &under_switchyard[name];
        if *name == "no-history" {
            assert_eq!((sy.jobs, kcm.jobs), (1, 1), "{name}: one name");
            // How many times a failed Job is made again and deleted within the window
            // depends on timing; that it is deleted does not.
            assert!(sy.deleted >= 1 && sy.names_match, "{name}: {sy:?}");
        } else {
            assert_eq!(
                sy, kcm,
                "{name}: switchyard against kube-controller-manager"
            );
        }
    }
}
