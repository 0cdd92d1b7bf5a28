//! A reconciler killed (SIGKILL) while a Job of 200 completions runs, and another started in
//! its place: the Job completes with exactly 200 succeeded Pods counted, none twice, none
//! lost, and no Pod left with the tracking finalizer. What makes it so is the tracking
//! (docs/reconciler.md, "The Job controller"): a finished Pod's UID is in the Job's
//! `uncountedTerminatedPods` before its finalizer goes, and counted only once it has gone.
//!
//! A binary of its own: its reconcilers act on every namespace.

#![allow(clippy::unwrap_used)]

mod support;

/// The reconciler binary its processes run.
const RECONCILER: &str = env!("CARGO_BIN_EXE_switchyard-reconciler");

use std::{
    path::Path,
    time::{Duration, Instant},
};

use serde_json::json;
use switchyard_k8s::{Api, Pod, PostParams, k8s_openapi::api::batch::v1::Job};
use switchyard_reconciler::job::NAME;
use switchyard_reconciler_core::job::has_tracking_finalizer;
use switchyard_testenv::{ControlPlane, TestNamespace};

use support::WITHIN;

const COMPLETIONS: i32 = 200;
/// Succeeded Pods counted when the reconciler is killed.
const KILL_AT: i32 = 60;
/// The longest the Job may take once the second reconciler runs.
const FINISH: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_survives_its_reconciler_killed_with_every_pod_counted_once() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let namespace = TestNamespace::create(plane, &client, "job-restart")
        .await
        .unwrap();
    let ns = namespace.name().to_owned();

    let queue = support::queue(&[NAME], &[]).await;
    let watcher = support::watcher(plane, &support::watcher_config(&[], ""), queue.grpc()).await;
    watcher.wait_ready(WITHIN).await;
    let first = support::reconciler_process(
        Path::new(RECONCILER),
        plane,
        queue.grpc(),
        watcher.grpc(),
        NAME,
    )
    .await;

    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "many"},
        "spec": {
            "completions": COMPLETIONS,
            "parallelism": 20,
            "template": {"spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "work", "image": "registry.example/work:1"}]
            }}
        }
    }))
    .unwrap();
    jobs.create(&PostParams::default(), &job).await.unwrap();

    let deadline = Instant::now() + FINISH;
    loop {
        let status = jobs.get("many").await.unwrap().status.unwrap_or_default();
        if status.succeeded.unwrap_or(0) >= KILL_AT {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not {KILL_AT} succeeded: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = first.kill();
    eprintln!(
        "killed the first reconciler ({} log lines)",
        log.lines().count()
    );
    let second = support::reconciler_process(
        Path::new(RECONCILER),
        plane,
        queue.grpc(),
        watcher.grpc(),
        NAME,
    )
    .await;

    let deadline = Instant::now() + FINISH;
    let job = loop {
        let job = jobs.get("many").await.unwrap();
        let done = job
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Complete" && c.status == "True")
            });
        if done {
            break job;
        }
        assert!(Instant::now() < deadline, "not complete: {:?}", job.status);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let listed = support::pods_once_counted(&pods, "batch.kubernetes.io/job-name=many").await;
    let tracked = listed.iter().filter(|p| has_tracking_finalizer(p)).count();
    assert_eq!(tracked, 0, "{tracked} pods keep the tracking finalizer");
    second.terminate().await.unwrap();
    watcher.stop().await;
    queue.stop().await;

    let status = job.status.unwrap();
    let succeeded_pods = listed
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
        .count();
    assert_eq!(status.succeeded, Some(COMPLETIONS), "{status:?}");
    assert_eq!(status.failed.unwrap_or(0), 0);
    let uncounted = status.uncounted_terminated_pods.unwrap_or_default();
    assert!(uncounted.succeeded.unwrap_or_default().is_empty());
    assert_eq!(
        succeeded_pods, COMPLETIONS as usize,
        "no Pod beyond the completions"
    );
}
