//! The same Deployment scenario run under kube-controller-manager (its Deployment and
//! ReplicaSet controllers only) and under Switchyard, on fresh namespaces of one control
//! plane, one after the other: the final Deployment, ReplicaSets and Pods agree.
//!
//! A binary of its own: kube-controller-manager's controllers act on every namespace, so no
//! other test may run Switchyard's controllers on this control plane while it runs.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use switchyard_k8s::{
    Api, Deployment, ListParams, Pod, PostParams, ReplicaSet, await_condition,
    kube::api::{Patch, PatchParams},
};
use switchyard_reconciler_core::{
    deployment::{self as core, PAUSED, PROGRESSING, get_condition},
    replicaset::is_ready,
};
use switchyard_testenv::{ControlPlane, TestNamespace};

use support::WITHIN;

/// How long one step of the scenario may take.
const STEP: Duration = Duration::from_secs(60);
/// The progress deadline of the stalled rollout at the end: short, so the test is.
const DEADLINE_SECONDS: i32 = 4;
const NAME: &str = "cmp";

/// What a user would compare after the scenario: everything but names, UIDs and times.
#[derive(Debug, PartialEq)]
struct Outcome {
    /// replicas, updated, ready, available, unavailable, observedGeneration, collisionCount.
    counts: [i64; 7],
    /// type, status, reason of each condition, sorted.
    conditions: Vec<(String, String, String)>,
    revision: Option<String>,
    /// Per ReplicaSet, by revision: revision, spec replicas, status replicas, image.
    replica_sets: Vec<(i64, i32, i32, String)>,
    /// Active Pods by image, and how many are ready.
    pods: BTreeMap<String, usize>,
    ready: usize,
}

fn image_of(template: &Value) -> Value {
    template["spec"]["containers"][0]["image"].clone()
}

async fn merge(api: &Api<Deployment>, patch: Value) {
    api.patch(NAME, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

async fn set_image(api: &Api<Deployment>, image: &str) {
    merge(
        api,
        json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}}}),
    )
    .await;
}

/// Waits until the Deployment's controller has observed its generation and `check` holds
/// for its status.
async fn wait_status(
    deployments: &Api<Deployment>,
    what: &str,
    check: impl Fn(&switchyard_k8s::k8s_openapi::api::apps::v1::DeploymentStatus) -> bool
    + Send
    + 'static,
) {
    let done = await_condition(deployments.clone(), NAME, move |d: Option<&Deployment>| {
        d.is_some_and(|d| {
            let s = d.status.clone().unwrap_or_default();
            s.observed_generation == d.metadata.generation && check(&s)
        })
    });
    if tokio::time::timeout(STEP, done).await.is_err() {
        panic!(
            "{what}: not seen; status {:?}",
            deployments.get(NAME).await.unwrap().status
        );
    }
}

/// Waits until the rollout of `n` replicas is complete, as `kubectl rollout status` sees it,
/// and every active Pod of the Deployment is of `image` and ready.
async fn complete(deployments: &Api<Deployment>, pods: &Api<Pod>, n: i32, image: &str) {
    let done = await_condition(deployments.clone(), NAME, move |d: Option<&Deployment>| {
        d.is_some_and(|d| {
            let s = d.status.clone().unwrap_or_default();
            s.observed_generation >= d.metadata.generation
                && s.replicas.unwrap_or(0) == n
                && s.updated_replicas.unwrap_or(0) == n
                && s.available_replicas.unwrap_or(0) == n
                && get_condition(&s, PROGRESSING)
                    .is_some_and(|c| c.reason.as_deref() == Some(core::NEW_RS_AVAILABLE))
        })
    });
    if tokio::time::timeout(STEP, done).await.is_err() {
        panic!(
            "no complete rollout of {image} to {n}: {:?}",
            deployments.get(NAME).await.unwrap().status
        );
    }
    tokio::time::timeout(STEP, async {
        loop {
            let active = support::active_pods(pods, &format!("app={NAME}")).await;
            if active.len() == usize::try_from(n).unwrap()
                && active.iter().all(is_ready)
                && active
                    .iter()
                    .all(|p| p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some(image))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the Pods of {image} did not settle at {n}"));
}

/// Create, scale up, roll out twice, pause (an image change and a scale while paused),
/// resume, switch to Recreate with another image; then back to RollingUpdate with a rollout
/// that cannot finish, scaled while stalled, past its progress deadline.
async fn scenario(client: &switchyard_k8s::Client, namespace: &str) -> Outcome {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
    let image = |tag: &str| format!("registry.example/cmp:{tag}");
    let d: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME},
        "spec": {
            "replicas": 6,
            "revisionHistoryLimit": 2,
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 2, "maxUnavailable": 1}},
            "selector": {"matchLabels": {"app": NAME}},
            "template": {
                "metadata": {"labels": {"app": NAME}},
                "spec": {"containers": [{"name": "c", "image": image("a")}]}
            }
        }
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    complete(&deployments, &pods, 6, &image("a")).await;
    merge(&deployments, json!({"spec": {"replicas": 9}})).await;
    complete(&deployments, &pods, 9, &image("a")).await;
    set_image(&deployments, &image("b")).await;
    complete(&deployments, &pods, 9, &image("b")).await;
    set_image(&deployments, &image("c")).await;
    complete(&deployments, &pods, 9, &image("c")).await;

    merge(&deployments, json!({"spec": {"paused": true}})).await;
    set_image(&deployments, &image("d")).await;
    merge(&deployments, json!({"spec": {"replicas": 4}})).await;
    let paused = await_condition(deployments.clone(), NAME, |d: Option<&Deployment>| {
        d.is_some_and(|d| {
            let s = d.status.clone().unwrap_or_default();
            s.observed_generation == d.metadata.generation
                && s.replicas == Some(4)
                && get_condition(&s, PROGRESSING)
                    .is_some_and(|c| c.reason.as_deref() == Some(PAUSED))
        })
    });
    tokio::time::timeout(STEP, paused)
        .await
        .expect("the paused Deployment scales to 4")
        .unwrap();
    merge(&deployments, json!({"spec": {"paused": false}})).await;
    complete(&deployments, &pods, 4, &image("d")).await;

    merge(
        &deployments,
        json!({"spec": {"strategy": {"type": "Recreate", "rollingUpdate": null}}}),
    )
    .await;
    set_image(&deployments, &image("e")).await;
    complete(&deployments, &pods, 4, &image("e")).await;

    // The history settles: at most revisionHistoryLimit old ReplicaSets.
    tokio::time::timeout(STEP, async {
        while rss.list(&ListParams::default()).await.unwrap().items.len() > 3 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("old ReplicaSets beyond the limit are deleted");

    // A rollout that cannot finish: the new Pods fit no Node. It stalls with 3 old and 3 new
    // (maxSurge 2, maxUnavailable 1 of 4).
    merge(
        &deployments,
        json!({"spec": {
            "progressDeadlineSeconds": DEADLINE_SECONDS,
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 2, "maxUnavailable": 1}},
            "template": {"spec": {
                "nodeSelector": {"switchyard.example/none": "true"},
                "containers": [{"name": "c", "image": image("f")}]
            }}
        }}),
    )
    .await;
    wait_status(&deployments, "the rollout stalls at 3 old and 3 new", |s| {
        s.replicas == Some(6) && s.updated_replicas == Some(3)
    })
    .await;
    // Scaled mid-rollout: 6 more, shared in proportion; then the deadline passes.
    merge(&deployments, json!({"spec": {"replicas": 10}})).await;
    wait_status(
        &deployments,
        "the stalled rollout scales and times out",
        |s| {
            s.replicas == Some(12)
                && s.updated_replicas == Some(6)
                && get_condition(s, PROGRESSING)
                    .is_some_and(|c| c.reason.as_deref() == Some(core::TIMED_OUT))
        },
    )
    .await;

    let d = deployments.get(NAME).await.unwrap();
    let s = d.status.clone().unwrap_or_default();
    let z = |v: Option<i32>| i64::from(v.unwrap_or(0));
    let mut conditions: Vec<(String, String, String)> = s
        .conditions
        .iter()
        .flatten()
        .map(|c| {
            (
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
            )
        })
        .collect();
    conditions.sort();
    let mut replica_sets: Vec<(i64, i32, i32, String)> = rss
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|rs| {
            let template =
                serde_json::to_value(rs.spec.as_ref().unwrap().template.as_ref().unwrap()).unwrap();
            (
                core::revision(rs),
                core::replicas(rs),
                rs.status.as_ref().map_or(0, |s| s.replicas),
                image_of(&template).as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    replica_sets.sort();
    let active = support::active_pods(&pods, "").await;
    let mut by_image = BTreeMap::new();
    for pod in &active {
        let image = pod.spec.as_ref().unwrap().containers[0]
            .image
            .clone()
            .unwrap();
        *by_image.entry(image).or_insert(0) += 1;
    }
    Outcome {
        counts: [
            z(s.replicas),
            z(s.updated_replicas),
            z(s.ready_replicas),
            z(s.available_replicas),
            z(s.unavailable_replicas),
            s.observed_generation.unwrap_or(0),
            z(s.collision_count),
        ],
        conditions,
        revision: d
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(core::REVISION).cloned()),
        replica_sets,
        pods: by_image,
        ready: active.iter().filter(|p| is_ready(p)).count(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_scenario_ends_the_same_under_kube_controller_manager_and_switchyard() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();

    let started = Instant::now();
    let kcm = plane
        .start_controller_manager(&["deployment-controller", "replicaset-controller"], &[])
        .await
        .expect("kube-controller-manager starts");
    let kcm_ns = TestNamespace::create(plane, &client, "cmp-kcm")
        .await
        .unwrap();
    let under_kcm = scenario(&client, kcm_ns.name()).await;
    drop(kcm);
    let kcm_took = started.elapsed();

    let started = Instant::now();
    let ns = TestNamespace::create(plane, &client, "cmp-sy")
        .await
        .unwrap();
    let queue = support::queue(switchyard_reconciler::BUILTIN, &[]).await;
    let watcher = support::watcher(
        plane,
        &support::watcher_config(&[ns.name()], ""),
        queue.grpc(),
    )
    .await;
    watcher.wait_ready(WITHIN).await;
    let reconciler = support::reconciler(
        plane,
        support::builtins(&[support::RS, support::DEPLOY]),
        queue.grpc(),
        watcher.grpc(),
        &[],
    )
    .await;
    reconciler.wait_ready(WITHIN).await;
    let under_switchyard = scenario(&client, ns.name()).await;
    let switchyard_took = started.elapsed();
    eprintln!("kube-controller-manager {kcm_took:?}, switchyard {switchyard_took:?}");
    eprintln!("{under_switchyard:#?}");

    assert_eq!(under_switchyard, under_kcm);
    // And the outcome is the one the scenario asks for: 10 replicas + 2 surge, 6 old and
    // available, 6 new and pending, the deadline passed.
    assert_eq!(under_switchyard.counts, [12, 6, 6, 6, 6, 12, 0]);
    assert_eq!(under_switchyard.revision.as_deref(), Some("6"));
    assert_eq!(
        under_switchyard
            .replica_sets
            .iter()
            .map(|(revision, replicas, _, _)| (*revision, *replicas))
            .collect::<Vec<_>>(),
        [(3, 0), (4, 0), (5, 6), (6, 6)]
    );
    assert!(under_switchyard.conditions.contains(&(
        "Progressing".into(),
        "False".into(),
        "ProgressDeadlineExceeded".into()
    )));
    // kubectl sees the deadline too.
    let mut command = plane.kubectl();
    command.args([
        "rollout",
        "status",
        &format!("deployment/{NAME}"),
        "-n",
        ns.name(),
        "--timeout=20s",
    ]);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("exceeded its progress deadline"),
        "{stderr}"
    );

    reconciler.stop().await;
    watcher.stop().await;
    queue.stop().await;
}
