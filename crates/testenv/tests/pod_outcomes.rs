//! The harness's kwok runs what a Pod's containers ask for, as a kubelet would
//! (docs/testing.md, "Pod outcomes"): `exit N` ends a container with code N, `sleep S` keeps
//! it running S seconds, the pause image and `sleep infinity` keep it running, and the Pod's
//! restartPolicy decides between a terminal phase and a restart. kube-controller-manager's
//! Job controller then reaches the conditions a real cluster gives the same Jobs.
//!
//! A binary of its own: kube-controller-manager's Job controller acts on every namespace.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard_k8s::{
    Api, Pod, PostParams,
    kube::{Client, api::DynamicObject, core::GroupVersionKind, discovery::ApiResource},
};
use switchyard_testenv::{ControlPlane, TestNamespace};

const IMAGE: &str = "registry.example/work:1";
const PAUSE: &str = "registry.k8s.io/pause:3.10";
/// Every outcome here takes seconds; a missing one fails well before the test's own bound.
const WAIT: Duration = Duration::from_secs(60);

fn container(name: &str, image: &str, command: &[&str]) -> Value {
    let mut container = json!({"name": name, "image": image});
    if !command.is_empty() {
        container["command"] = json!(command);
    }
    container
}

fn pod(name: &str, restart_policy: &str, containers: Vec<Value>) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": restart_policy, "containers": containers},
    }))
    .unwrap()
}

/// Polls the Pod until `done` holds of it; the Pod as it was then.
async fn pod_until(api: &Api<Pod>, name: &str, what: &str, done: impl Fn(&Pod) -> bool) -> Pod {
    let deadline = Instant::now() + WAIT;
    loop {
        let pod = api.get(name).await.unwrap();
        if done(&pod) {
            return pod;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: not {what} after {WAIT:?}: {:#?}",
            pod.status
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// Each container's `(exit code of its terminated state, restart count, exit code of its last
/// state)`, by container order.
fn containers(pod: &Pod) -> Vec<(Option<i32>, i32, Option<i32>)> {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let terminated = |state: &Option<_>| {
                state.as_ref().and_then(
                    |s: &switchyard_k8s::k8s_openapi::api::core::v1::ContainerState| {
                        s.terminated.as_ref().map(|t| t.exit_code)
                    },
                )
            };
            (
                terminated(&c.state),
                c.restart_count,
                terminated(&c.last_state),
            )
        })
        .collect()
}

/// Creates the Pod and waits until it is Running; when it got there.
async fn start(api: &Api<Pod>, pod: Pod) -> Instant {
    let name = pod.metadata.name.clone().unwrap();
    api.create(&PostParams::default(), &pod).await.unwrap();
    pod_until(api, &name, "Running", |p| phase(p) == "Running").await;
    Instant::now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_end_as_their_containers_ask() {
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "outcomes")
        .await
        .unwrap();
    let api: Api<Pod> = Api::namespaced(client.clone(), ns.name());

    let failed = async {
        start(
            &api,
            pod(
                "exits-3",
                "Never",
                vec![container("c", IMAGE, &["sh", "-c", "exit 3"])],
            ),
        )
        .await;
        let pod = pod_until(&api, "exits-3", "Failed", |p| phase(p) == "Failed").await;
        assert_eq!(containers(&pod), [(Some(3), 0, None)]);
        let reason = pod
            .status
            .as_ref()
            .unwrap()
            .container_statuses
            .as_ref()
            .unwrap()[0]
            .state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .reason
            .clone();
        assert_eq!(reason.as_deref(), Some("Error"));
    };
    let succeeded = async {
        start(
            &api,
            pod(
                "exits-0",
                "Never",
                vec![container("c", IMAGE, &["sh", "-c", "exit 0"])],
            ),
        )
        .await;
        let pod = pod_until(&api, "exits-0", "Succeeded", |p| phase(p) == "Succeeded").await;
        assert_eq!(containers(&pod), [(Some(0), 0, None)]);
    };
    let sleeps = async {
        let running = start(
            &api,
            pod(
                "sleeps-3",
                "Never",
                vec![container("c", IMAGE, &["sleep", "3"])],
            ),
        )
        .await;
        pod_until(&api, "sleeps-3", "Succeeded", |p| phase(p) == "Succeeded").await;
        let ran = running.elapsed();
        assert!(
            ran >= Duration::from_millis(2500),
            "`sleep 3` ran only {ran:?}"
        );
    };
    // Two containers: the Pod ends with the longer, and fails if either does.
    let mixed = async {
        let running = start(
            &api,
            pod(
                "mixed",
                "Never",
                vec![
                    container("ok", IMAGE, &[]),
                    container("late", IMAGE, &["sh", "-c", "sleep 2; exit 7"]),
                ],
            ),
        )
        .await;
        let pod = pod_until(&api, "mixed", "Failed", |p| phase(p) == "Failed").await;
        assert!(running.elapsed() >= Duration::from_millis(1500));
        assert_eq!(containers(&pod), [(Some(0), 0, None), (Some(7), 0, None)]);
    };
    // Running forever: the pause image, `sleep infinity`, and a container with no command
    // outside a Job.
    let forever = async {
        for (name, c) in [
            ("pause", container("c", PAUSE, &[])),
            ("infinity", container("c", IMAGE, &["sleep", "infinity"])),
            ("no-command", container("c", IMAGE, &[])),
        ] {
            start(&api, pod(name, "Never", vec![c])).await;
        }
        tokio::time::sleep(Duration::from_secs(4)).await;
        for name in ["pause", "infinity", "no-command"] {
            let pod = api.get(name).await.unwrap();
            assert_eq!(phase(&pod), "Running", "{name}");
            assert_eq!(containers(&pod), [(None, 0, None)], "{name}");
        }
    };
    // Restarted in place: OnFailure after a failure, Always after any exit.
    let restarts = async {
        start(
            &api,
            pod(
                "on-failure",
                "OnFailure",
                vec![container("c", IMAGE, &["sh", "-c", "exit 1"])],
            ),
        )
        .await;
        start(
            &api,
            pod(
                "always",
                "Always",
                vec![container("c", IMAGE, &["sleep", "1"])],
            ),
        )
        .await;
        for (name, code) in [("on-failure", 1), ("always", 0)] {
            let pod = pod_until(&api, name, "restarted twice", |p| {
                containers(p).first().is_some_and(|c| c.1 >= 2)
            })
            .await;
            assert_eq!(phase(&pod), "Running", "{name}");
            assert_eq!(containers(&pod)[0].2, Some(code), "{name}");
        }
    };
    tokio::join!(failed, succeeded, sleeps, mixed, forever, restarts);
}

fn job_api(client: &Client, namespace: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("batch", "v1", "Job"));
    Api::namespaced_with(client.clone(), namespace, &resource)
}

fn job(name: &str, spec: Value, restart_policy: &str, command: &[&str]) -> DynamicObject {
    let mut spec = spec;
    spec["template"] = json!({
        "spec": {
            "restartPolicy": restart_policy,
            "containers": [container("work", IMAGE, command)],
        }
    });
    serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

/// The Job's terminal condition (`Complete` or `Failed`, status True) and its reason, and
/// its `succeeded` and `failed` counts, once it has one.
async fn finished(api: &Api<DynamicObject>, name: &str) -> (String, String, i64, i64) {
    let deadline = Instant::now() + WAIT;
    loop {
        let job = api.get(name).await.unwrap();
        let status = &job.data["status"];
        let terminal = status["conditions"].as_array().and_then(|conditions| {
            conditions.iter().find(|c| {
                (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True"
            })
        });
        if let Some(condition) = terminal {
            return (
                condition["type"].as_str().unwrap().to_owned(),
                condition["reason"].as_str().unwrap_or("").to_owned(),
                status["succeeded"].as_i64().unwrap_or(0),
                status["failed"].as_i64().unwrap_or(0),
            );
        }
        assert!(
            Instant::now() < deadline,
            "Job {name} not finished after {WAIT:?}: {status:#}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_controller_managers_job_controller_sees_the_outcomes() {
    let plane = ControlPlane::shared().unwrap();
    let _kcm = plane
        .start_controller_manager(&["job-controller"], &[])
        .await
        .unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "jobs").await.unwrap();
    let api = job_api(&client, ns.name());

    let jobs = [
        // No command: a Job's Pods complete after a short delay.
        job(
            "completes",
            json!({"completions": 2, "parallelism": 1}),
            "Never",
            &[],
        ),
        job(
            "exits-3",
            json!({"backoffLimit": 0}),
            "Never",
            &["sh", "-c", "exit 3"],
        ),
        job(
            "policy",
            json!({"backoffLimit": 6, "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}}),
            "Never",
            &["sh", "-c", "exit 42"],
        ),
        // Restarts in place count against the backoff limit.
        job(
            "restarts",
            json!({"backoffLimit": 1}),
            "OnFailure",
            &["sh", "-c", "exit 1"],
        ),
        job(
            "deadline",
            json!({"activeDeadlineSeconds": 2}),
            "Never",
            &["sleep", "60"],
        ),
    ];
    for job in &jobs {
        api.create(&PostParams::default(), job).await.unwrap();
    }
    let (completes, exits, policy, restarts, deadline) = tokio::join!(
        finished(&api, "completes"),
        finished(&api, "exits-3"),
        finished(&api, "policy"),
        finished(&api, "restarts"),
        finished(&api, "deadline"),
    );
    assert_eq!(
        completes,
        ("Complete".into(), "CompletionsReached".into(), 2, 0)
    );
    assert_eq!(
        exits,
        ("Failed".into(), "BackoffLimitExceeded".into(), 0, 1)
    );
    assert_eq!(
        (policy.0.as_str(), policy.1.as_str(), policy.3),
        ("Failed", "PodFailurePolicy", 1)
    );
    assert_eq!(
        (restarts.0.as_str(), restarts.1.as_str()),
        ("Failed", "BackoffLimitExceeded")
    );
    assert_eq!(
        (deadline.0.as_str(), deadline.1.as_str()),
        ("Failed", "DeadlineExceeded")
    );
}
