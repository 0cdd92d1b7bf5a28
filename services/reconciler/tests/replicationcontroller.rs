//! The ReplicationController controller against the real control plane, beside
//! kube-controller-manager's `replicationcontroller-controller` (each on a namespace of its
//! own, one after the other): the same script ends the same under both.
//!
//! - a ReplicationController of three adopts the orphan its selector matches and makes two
//!   Pods, Ready and available, and the status says so (two fully labelled; no
//!   `terminatingReplicas`, which its status lacks);
//! - scaled to one, two Pods go;
//! - the Pod it keeps stops matching: released, and a replacement is made;
//! - the Events on it are the same.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use serde_json::json;
use switchyard_k8s::{
    Api, Client, ListParams, Pod, PostParams,
    k8s_openapi::api::core::v1::{Event, ReplicationController},
    kube::api::{Patch, PatchParams},
};
use switchyard_reconciler::replicationcontroller::NAME;
use switchyard_reconciler_core::replicaset::{controller_of, is_active};
use switchyard_testenv::{ControlPlane, TestNamespace};

use support::WITHIN;

/// What one controller did to the script's ReplicationController.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    /// (replicas, ready, available, fullyLabeled, terminating field present) at each step.
    statuses: Vec<(i32, i32, i32, i32, bool)>,
    /// Every Pod it controlled named it as `v1/ReplicationController`.
    owned_as_replication_controller: bool,
    /// The orphan there before it came under its control.
    adopted: bool,
    /// The Pod whose labels stopped matching lost its controller reference.
    released: bool,
    /// The reasons of the Events on it.
    reasons: BTreeSet<String>,
}

fn replication_controller(replicas: i32) -> ReplicationController {
    serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "selector": {"app": "web"},
            "template": {
                "metadata": {"labels": {"app": "web", "tier": "front"}},
                "spec": {"containers": [{"name": "c", "image": "registry.example/web:1"}]},
            },
        },
    }))
    .unwrap()
}

/// Waits until the ReplicationController's status and its active Pods are `replicas` Ready
/// (and, with `fully_labelled`, all fully labelled); returns the status and the active Pods.
///
/// `fully_labelled` is for a step whose Pods are all the template's: a status can still be
/// the one written before the step's Pod was made (the same counts when the Pod it replaced
/// was the orphan, which lacks the template's `tier` label).
async fn settled(
    rcs: &Api<ReplicationController>,
    pods: &Api<Pod>,
    replicas: i32,
    fully_labelled: bool,
) -> ((i32, i32, i32, i32, bool), Vec<Pod>) {
    let deadline = Instant::now() + WITHIN;
    loop {
        let rc = rcs.get("web").await.unwrap();
        let raw = serde_json::to_value(&rc).unwrap();
        let status = rc.status.clone().unwrap_or_default();
        let active: Vec<Pod> = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| is_active(p) && controller_of(p).is_some())
            .collect();
        let seen = (
            status.replicas,
            status.ready_replicas.unwrap_or(0),
            status.available_replicas.unwrap_or(0),
            status.fully_labeled_replicas.unwrap_or(0),
            raw["status"].get("terminatingReplicas").is_some(),
        );
        if seen.0 == replicas
            && seen.1 == replicas
            && seen.2 == replicas
            && i32::try_from(active.len()).unwrap() == replicas
            && (!fully_labelled || seen.3 == replicas)
            && status.observed_generation == rc.metadata.generation
        {
            return (seen, active);
        }
        assert!(
            Instant::now() < deadline,
            "not settled at {replicas} within {WITHIN:?}: status {seen:?}, {} active",
            active.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn scale(rcs: &Api<ReplicationController>, replicas: i32) {
    rcs.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": replicas}})),
    )
    .await
    .unwrap();
}

/// The script, in `namespace`.
async fn scenario(client: &Client, namespace: &str) -> Outcome {
    let rcs: Api<ReplicationController> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    // An orphan its selector matches, there before it (without the template's `tier` label).
    let orphan: Pod = serde_json::from_value(json!({
        "metadata": {"name": "orphan", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "registry.example/web:1"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &orphan).await.unwrap();
    let rc = rcs
        .create(&PostParams::default(), &replication_controller(3))
        .await
        .unwrap();
    let uid = rc.metadata.uid.clone().unwrap();
    let mut statuses = Vec::new();
    let mut owned_as_replication_controller = true;
    let mut owned = |active: &[Pod]| {
        owned_as_replication_controller &= active.iter().all(|p| {
            controller_of(p).is_some_and(|r| {
                r.kind == "ReplicationController" && r.api_version == "v1" && r.uid == uid
            })
        });
    };

    let (status, active) = settled(&rcs, &pods, 3, false).await;
    statuses.push(status);
    owned(&active);
    let adopted = active
        .iter()
        .any(|p| p.metadata.name.as_deref() == Some("orphan"));

    // Scaled to one. Which Pod stays depends on when each turned Ready (to the second), so
    // its labels, and the fully labelled count, are not compared.
    scale(&rcs, 1).await;
    let (status, active) = settled(&rcs, &pods, 1, false).await;
    statuses.push((status.0, status.1, status.2, -1, status.4));
    owned(&active);

    // The Pod it keeps stops matching: released, and replaced.
    let kept = active[0].metadata.name.clone().unwrap();
    pods.patch(
        &kept,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "elsewhere"}}})),
    )
    .await
    .unwrap();
    let deadline = Instant::now() + WITHIN;
    let released = loop {
        let pod = pods.get(&kept).await.unwrap();
        if controller_of(&pod).is_none() {
            break true;
        }
        if Instant::now() >= deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (status, active) = settled(&rcs, &pods, 1, true).await;
    statuses.push(status);
    owned(&active);

    // The Events on it, once they are written.
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let mut reasons = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        reasons = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.involved_object.kind.as_deref() == Some("ReplicationController"))
            .filter_map(|e| e.reason)
            .collect();
        if reasons.contains("SuccessfulDelete") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Outcome {
        statuses,
        owned_as_replication_controller,
        adopted,
        released,
        reasons,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replication_controller_ends_as_under_kube_controller_manager() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();

    let kcm = plane
        .start_controller_manager(&["replicationcontroller-controller"], &[])
        .await
        .expect("kube-controller-manager starts");
    let under_kcm_ns = TestNamespace::create(plane, &client, "rc-kcm")
        .await
        .unwrap();
    let under_kcm = scenario(&client, under_kcm_ns.name()).await;
    drop(kcm);

    let switchyard = support::Builtins::start(plane, &[NAME]).await;
    let under_switchyard_ns = TestNamespace::create(plane, &client, "rc-sy")
        .await
        .unwrap();
    let under_switchyard = scenario(&client, under_switchyard_ns.name()).await;
    let created = switchyard.requests("create", &["201"]).await;
    switchyard.stop().await;

    eprintln!("kube-controller-manager: {under_kcm:?}");
    eprintln!("switchyard: {under_switchyard:?}");
    assert_eq!(
        under_kcm,
        Outcome {
            statuses: vec![
                (3, 3, 3, 2, false),
                (1, 1, 1, -1, false),
                (1, 1, 1, 1, false)
            ],
            owned_as_replication_controller: true,
            adopted: true,
            released: true,
            reasons: ["SuccessfulCreate", "SuccessfulDelete"]
                .map(String::from)
                .into(),
        }
    );
    assert_eq!(under_switchyard, under_kcm);
    // The Pods were this reconciler's: it is the only controller running.
    assert!(created >= 4.0, "the reconciler created {created} Pods");
}
