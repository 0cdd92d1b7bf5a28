//! The DaemonSet controller against the real control plane, beside kube-controller-manager's
//! `daemonset-controller` (each on 50 kwok Nodes and a namespace of its own, one after the
//! other): the same script ends the same under both.
//!
//! - 50 Nodes: 40 plain, 5 tainted `dedicated=infra:NoSchedule` (tolerated), 5 tainted
//!   `gpu=true:NoSchedule` (not): a Pod on each of 45, placed by the scheduler through the
//!   node affinity the controller sets;
//! - a new image, rolled out 5 at a time; mid-rollout one Node is added and one removed (its
//!   Pods deleted as the pod garbage collector would);
//! - a Node tainted `evict=now:NoExecute` and a Node relabelled out of the selector lose
//!   their Pods;
//! - `kubectl rollout history` lists two revisions and `kubectl rollout undo` takes the first
//!   image back (its revision renumbered, no third made); `kubectl rollout status` waits for
//!   each rollout.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use serde_json::json;
use switchyard_k8s::{
    Api, Client, DeleteParams, ListParams, Pod, PostParams,
    k8s_openapi::api::{
        apps::v1::{ControllerRevision, DaemonSet},
        core::v1::{Event, Node},
    },
    kube::api::{Patch, PatchParams},
};
use switchyard_reconciler::daemonset::NAME;
use switchyard_reconciler_core::{daemonset::target_node, replicaset::is_ready};
use switchyard_testenv::{ControlPlane, TestNamespace};

use support::WITHIN;

/// Held by each test for its whole run: the controllers one starts act on every namespace.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const NODES: usize = 50;

/// What one controller did.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    /// (desired, current, ready, updated, available, misscheduled) at each settled step.
    statuses: Vec<(i32, i32, i32, i32, i32, i32)>,
    /// At the end: each Node (by index) and the images of the Pods on it.
    placed: BTreeMap<usize, Vec<String>>,
    /// The ControllerRevisions' numbers at the end.
    revisions: Vec<i64>,
    /// `kubectl rollout history` listed two revisions before the undo.
    history_listed_two: bool,
    /// The reasons of the Events on the DaemonSet.
    reasons: BTreeSet<String>,
}

fn node_name(run: &str, i: usize) -> String {
    format!("ds-{run}-{i}")
}

/// A Node of `run`: the first 40 plain, then 5 with a taint the DaemonSet tolerates and 5
/// with one it does not.
async fn node(client: &Client, run: &str, i: usize) {
    let taints = match i {
        40..45 => json!([{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]),
        45..50 => json!([{"key": "gpu", "value": "true", "effect": "NoSchedule"}]),
        _ => json!([]),
    };
    let spec = json!({ "taints": taints });
    support::kwok_node(client, &node_name(run, i), json!({"ds-run": run}), spec).await;
}

fn daemon_set(run: &str) -> DaemonSet {
    serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 5}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {
                    "nodeSelector": {"ds-run": run},
                    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}],
                    "containers": [{"name": "agent", "image": "registry.example/agent:1"}],
                },
            },
        },
    }))
    .unwrap()
}

fn image_of(pod: &Pod) -> String {
    pod.spec.as_ref().unwrap().containers[0]
        .image
        .clone()
        .unwrap_or_default()
}

/// Waits until `desired` Nodes each have one Ready Pod of `image` and the status says so;
/// returns the status counts.
async fn settled(
    sets: &Api<DaemonSet>,
    pods: &Api<Pod>,
    desired: i32,
    image: &str,
) -> (i32, i32, i32, i32, i32, i32) {
    let deadline = Instant::now() + WITHIN;
    loop {
        let ds = sets.get("agent").await.unwrap();
        let s = ds.status.clone().unwrap_or_default();
        let seen = (
            s.desired_number_scheduled,
            s.current_number_scheduled,
            s.number_ready,
            s.updated_number_scheduled.unwrap_or(0),
            s.number_available.unwrap_or(0),
            s.number_misscheduled,
        );
        let listed = pods.list(&ListParams::default()).await.unwrap().items;
        let live: Vec<&Pod> = listed
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let good = live
            .iter()
            .filter(|p| is_ready(p) && image_of(p) == image)
            .count();
        let nodes: BTreeSet<&str> = live.iter().filter_map(|p| target_node(p)).collect();
        if seen == (desired, desired, desired, desired, desired, 0)
            && s.observed_generation == ds.metadata.generation
            && live.len() == usize::try_from(desired).unwrap()
            && good == live.len()
            && nodes.len() == live.len()
            && listed.len() == live.len()
        {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "not settled at {desired} of {image} within {WITHIN:?}: status {seen:?}, {} pods, \
             {} live, {good} ready at the image",
            listed.len(),
            live.len()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn image(tag: u32) -> serde_json::Value {
    json!({"spec": {"template": {"spec": {"containers": [{"name": "agent", "image": format!("registry.example/agent:{tag}")}]}}}})
}

/// The script: `run` names its Nodes and labels them.
async fn scenario(plane: &ControlPlane, client: &Client, namespace: &str, run: &str) -> Outcome {
    let sets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..NODES {
        node(client, run, i).await;
    }
    sets.create(&PostParams::default(), &daemon_set(run))
        .await
        .unwrap();
    let mut statuses = vec![settled(&sets, &pods, 45, "registry.example/agent:1").await];

    // A new image; mid-rollout a Node comes and one goes.
    sets.patch("agent", &PatchParams::default(), &Patch::Merge(image(2)))
        .await
        .unwrap();
    let deadline = Instant::now() + WITHIN;
    loop {
        let updated = pods
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|p| image_of(p).ends_with(":2"))
            .count();
        if updated >= 5 {
            break;
        }
        assert!(Instant::now() < deadline, "the rollout did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    node(client, run, NODES).await;
    let gone = node_name(run, 0);
    nodes.delete(&gone, &DeleteParams::default()).await.unwrap();
    // As the pod garbage collector would: the Pods of a deleted Node go too.
    for pod in pods.list(&ListParams::default()).await.unwrap().items {
        if target_node(&pod) == Some(gone.as_str()) {
            let _ = pods
                .delete(
                    pod.metadata.name.as_deref().unwrap(),
                    &DeleteParams::default().grace_period(0),
                )
                .await;
        }
    }
    support::kubectl_rollout_status(plane, namespace, "daemonset/agent").await;
    statuses.push(settled(&sets, &pods, 45, "registry.example/agent:2").await);

    // One Node tainted NoExecute, one relabelled out of the selector.
    nodes
        .patch(
            &node_name(run, 1),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": [{"key": "evict", "value": "now", "effect": "NoExecute"}]}})),
        )
        .await
        .unwrap();
    nodes
        .patch(
            &node_name(run, 2),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"ds-run": "elsewhere"}}})),
        )
        .await
        .unwrap();
    statuses.push(settled(&sets, &pods, 43, "registry.example/agent:2").await);

    // kubectl's history, then an undo to the first image.
    let history = support::kubectl(
        plane,
        &["rollout", "history", "daemonset/agent", "-n", namespace],
    )
    .await;
    let history_listed_two = history
        .lines()
        .filter(|l| l.trim_start().starts_with(char::is_numeric))
        .count()
        == 2;
    support::kubectl(
        plane,
        &["rollout", "undo", "daemonset/agent", "-n", namespace],
    )
    .await;
    support::kubectl_rollout_status(plane, namespace, "daemonset/agent").await;
    statuses.push(settled(&sets, &pods, 43, "registry.example/agent:1").await);

    let prefix = format!("ds-{run}-");
    let mut placed: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for pod in pods.list(&ListParams::default()).await.unwrap().items {
        let index = target_node(&pod)
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|i| i.parse().ok())
            .unwrap();
        placed.entry(index).or_default().push(image_of(&pod));
    }
    let revisions_api: Api<ControllerRevision> = Api::namespaced(client.clone(), namespace);
    let mut revisions: Vec<i64> = revisions_api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|r| r.revision)
        .collect();
    revisions.sort_unstable();
    // Written long before: kube-controller-manager's recorder (and ours) lets 25 Events
    // through per object at once, so the creations' fill it.
    let reasons: BTreeSet<String> = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("DaemonSet"))
        .filter_map(|e| e.reason)
        .collect();
    for i in 0..=NODES {
        let _ = nodes
            .delete(&node_name(run, i), &DeleteParams::default())
            .await;
    }
    Outcome {
        statuses,
        placed,
        revisions,
        history_listed_two,
        reasons,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_set_across_50_nodes_ends_as_under_kube_controller_manager() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();

    let kcm = plane
        .start_controller_manager(&["daemonset-controller"], &[])
        .await
        .expect("kube-controller-manager starts");
    let under_kcm_ns = TestNamespace::create(plane, &client, "ds-kcm")
        .await
        .unwrap();
    let under_kcm = scenario(plane, &client, under_kcm_ns.name(), "kcm").await;
    drop(kcm);

    let switchyard = support::Builtins::start(plane, &[NAME]).await;
    let under_switchyard_ns = TestNamespace::create(plane, &client, "ds-sy")
        .await
        .unwrap();
    let under_switchyard = scenario(plane, &client, under_switchyard_ns.name(), "sy").await;
    switchyard.stop().await;

    eprintln!("kube-controller-manager: {under_kcm:#?}");
    eprintln!("switchyard: {under_switchyard:#?}");
    let expected_nodes: BTreeSet<usize> = (3..45).chain([NODES]).collect();
    assert_eq!(
        under_kcm.placed.keys().copied().collect::<BTreeSet<_>>(),
        expected_nodes
    );
    assert!(under_kcm.history_listed_two);
    assert_eq!(under_switchyard, under_kcm);
}
