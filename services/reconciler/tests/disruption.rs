//! The disruption controller against the real control plane, beside kube-controller-manager's
//! `disruption-controller` (each on a namespace of its own, one after the other, with its
//! own ReplicaSet controller): the same script ends the same under both.
//!
//! - `web`: `maxUnavailable: 1` over a ReplicaSet of three: expected from its scale, one
//!   disruption allowed;
//! - `solo`: `minAvailable: 2` over one bare Pod: none allowed;
//! - `half`: `minAvailable: 50%` over another bare Pod: unmanaged, so nothing expected;
//! - evictions through the apiserver honour the status: a `web` Pod goes (and its
//!   ReplicaSet's replacement brings the budget back), the `solo` Pod is refused (429);
//! - `kubectl drain --pod-selector app=web` of a Node with `web` Pods completes, one Pod at
//!   a time;
//! - a `DisruptionTarget` condition left on the `solo` Pod three minutes ago (an eviction
//!   whose delete failed) is set back to False; one left on `half` just now stays; one left
//!   three minutes ago on `loose`, a Pod no budget selects, is set back to False too;
//! - the Events are the same.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use serde_json::json;
use switchyard_k8s::{
    Api, Client, ListParams, Pod, PostParams, ReplicaSet,
    k8s_openapi::api::{core::v1::Event, policy::v1::PodDisruptionBudget},
    k8s_openapi::jiff::{SignedDuration, Timestamp},
    kube::api::{EvictParams, Patch, PatchParams},
};
use switchyard_reconciler::disruption::{NAME, STALE_NAME};
use switchyard_reconciler_core::disruption::DISRUPTION_TARGET;
use switchyard_testenv::{ControlPlane, TestNamespace};

use support::WITHIN;

/// A budget's status: expected, desired, current, allowed, and its condition's status and
/// reason.
type Budget = (i32, i32, i32, i32, String, String);

/// A Pod condition's status, reason and message.
type ConditionSeen = (String, Option<String>, Option<String>);

#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    /// `web`, `solo` and `half` once settled, and `web` again after the evictions.
    budgets: Vec<Budget>,
    /// The eviction of a `web` Pod let through; that of `solo` refused with 429.
    evictions: (bool, Option<u16>),
    /// `kubectl drain` of a Node with `web` Pods completed.
    drained: bool,
    /// `solo`'s stale DisruptionTarget once reset (status, reason, message), `half`'s
    /// fresh one's status then, and `loose`'s stale one once reset.
    disruption_targets: (Option<ConditionSeen>, String, Option<ConditionSeen>),
    /// The reasons of the Events on the budgets.
    reasons: BTreeSet<String>,
}

fn budget(name: &str, spec: serde_json::Value) -> PodDisruptionBudget {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

/// Waits until `name`'s status is worked out for its generation with `allowed` disruptions
/// and `current` healthy.
async fn settled(api: &Api<PodDisruptionBudget>, name: &str, current: i32, allowed: i32) -> Budget {
    let deadline = Instant::now() + WITHIN;
    loop {
        let pdb = api.get(name).await.unwrap();
        let status = pdb.status.clone().unwrap_or_default();
        let condition = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "DisruptionAllowed")
            .map(|c| (c.status.clone(), c.reason.clone()))
            .unwrap_or_default();
        let seen = (
            status.expected_pods,
            status.desired_healthy,
            status.current_healthy,
            status.disruptions_allowed,
            condition.0,
            condition.1,
        );
        if status.observed_generation == pdb.metadata.generation
            && seen.2 == current
            && seen.3 == allowed
            && !seen.4.is_empty()
        {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "{name} not settled at {current} healthy, {allowed} allowed: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn ready_pods(pods: &Api<Pod>, labels: &str, n: usize) -> Vec<Pod> {
    let deadline = Instant::now() + WITHIN;
    loop {
        let ready: Vec<Pod> = pods
            .list(&ListParams::default().labels(labels))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(switchyard_reconciler_core::replicaset::is_ready)
            .collect();
        if ready.len() == n {
            return ready;
        }
        assert!(Instant::now() < deadline, "{} of {n} ready", ready.len());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn scenario(plane: &ControlPlane, client: &Client, namespace: &str) -> Outcome {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
    sets.create(&PostParams::default(), &support::replica_set("web", 3))
        .await
        .unwrap();
    let solo: Pod = serde_json::from_value(json!({
        "metadata": {"name": "solo", "labels": {"app": "solo"}},
        "spec": {"containers": [{"name": "c", "image": "registry.example/solo:1"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &solo).await.unwrap();
    let mut half = solo.clone();
    half.metadata.name = Some("half".into());
    half.metadata.labels = Some([("app".to_owned(), "half".to_owned())].into());
    pods.create(&PostParams::default(), &half).await.unwrap();
    let mut loose = solo.clone();
    loose.metadata.name = Some("loose".into());
    loose.metadata.labels = Some([("app".to_owned(), "loose".to_owned())].into());
    pods.create(&PostParams::default(), &loose).await.unwrap();
    let web_labels = "app=web";
    ready_pods(&pods, web_labels, 3).await;
    ready_pods(&pods, "app=solo", 1).await;
    ready_pods(&pods, "app=half", 1).await;
    for (name, spec) in [
        (
            "web",
            json!({"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}),
        ),
        (
            "solo",
            json!({"minAvailable": 2, "selector": {"matchLabels": {"app": "solo"}}}),
        ),
        (
            "half",
            json!({"minAvailable": "50%", "selector": {"matchLabels": {"app": "half"}}}),
        ),
    ] {
        budgets
            .create(&PostParams::default(), &budget(name, spec))
            .await
            .unwrap();
    }
    let mut statuses = vec![
        settled(&budgets, "web", 3, 1).await,
        settled(&budgets, "solo", 1, 0).await,
        settled(&budgets, "half", 1, 0).await,
    ];

    // One web Pod may go; the solo Pod may not. (A client that does not retry a 429 by
    // itself, as kube's does by default.)
    let web = ready_pods(&pods, web_labels, 3).await;
    let kubeconfig =
        switchyard_k8s::kube::config::Kubeconfig::read_from(plane.kubeconfig()).unwrap();
    let mut config =
        switchyard_k8s::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
    config.default_retry = false;
    let evicting: Api<Pod> = Api::namespaced(Client::try_from(config).unwrap(), namespace);
    let first = evicting
        .evict(
            web[0].metadata.name.as_deref().unwrap(),
            &EvictParams::default(),
        )
        .await
        .is_ok();
    let second = match evicting.evict("solo", &EvictParams::default()).await {
        Ok(_) => None,
        Err(switchyard_k8s::kube::Error::Api(status)) => Some(status.code),
        Err(other) => panic!("eviction: {other}"),
    };
    ready_pods(&pods, web_labels, 3).await;
    statuses.push(settled(&budgets, "web", 3, 1).await);

    // A drain of a Node with web Pods, as an operator runs it, only for this script's Pods.
    let node = ready_pods(&pods, web_labels, 3).await[0]
        .spec
        .as_ref()
        .unwrap()
        .node_name
        .clone()
        .unwrap();
    let mut drain = plane.kubectl();
    drain.args([
        "drain",
        &node,
        "--pod-selector=app=web",
        "-n",
        namespace,
        "--timeout=60s",
        "--ignore-daemonsets",
    ]);
    let drained = tokio::task::spawn_blocking(move || drain.output())
        .await
        .unwrap()
        .unwrap();
    // Checked while the node is still cordoned: uncordoned first, a replacement not yet
    // scheduled could land on it again.
    let drained = drained.status.success() && {
        ready_pods(&pods, web_labels, 3)
            .await
            .iter()
            .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node.as_str()))
    };
    support::kubectl(plane, &["uncordon", &node]).await;

    // DisruptionTarget conditions left behind: stale on solo and loose, fresh on half.
    for (name, ago) in [("half", 0), ("solo", 180), ("loose", 180)] {
        let since = Timestamp::now() - SignedDuration::from_secs(ago);
        pods.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [{
                "type": DISRUPTION_TARGET, "status": "True", "reason": "EvictionByEvictionAPI",
                "message": "Eviction API: evicting", "lastTransitionTime": since.to_string(),
            }]}})),
        )
        .await
        .unwrap();
    }
    let condition = |pod: &Pod| {
        pod.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == DISRUPTION_TARGET).cloned())
    };
    let deadline = Instant::now() + WITHIN;
    let reset = |name: &'static str| {
        let pods = pods.clone();
        async move {
            loop {
                let found = condition(&pods.get(name).await.unwrap());
                if let Some(c) = found.filter(|c| c.status == "False") {
                    break Some((c.status, c.reason, c.message));
                }
                if Instant::now() >= deadline {
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let (solo_reset, loose_reset) = tokio::join!(reset("solo"), reset("loose"));
    let fresh = condition(&pods.get("half").await.unwrap())
        .map(|c| c.status)
        .unwrap_or_default();

    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let reasons = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("PodDisruptionBudget"))
        .filter_map(|e| e.reason)
        .collect();
    Outcome {
        budgets: statuses,
        evictions: (first, second),
        drained,
        disruption_targets: (solo_reset, fresh, loose_reset),
        reasons,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_end_as_under_kube_controller_manager_and_evictions_honour_them() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();

    let kcm = plane
        .start_controller_manager(&["disruption-controller", "replicaset-controller"], &[])
        .await
        .expect("kube-controller-manager starts");
    let under_kcm_ns = TestNamespace::create(plane, &client, "pdb-kcm")
        .await
        .unwrap();
    let under_kcm = scenario(plane, &client, under_kcm_ns.name()).await;
    drop(kcm);

    let switchyard = support::Builtins::start(plane, &[NAME, STALE_NAME, support::RS]).await;
    let under_switchyard_ns = TestNamespace::create(plane, &client, "pdb-sy")
        .await
        .unwrap();
    let under_switchyard = scenario(plane, &client, under_switchyard_ns.name()).await;
    let writes = switchyard.requests("update", &["200"]).await;
    switchyard.stop().await;

    eprintln!("kube-controller-manager: {under_kcm:#?}");
    eprintln!("switchyard: {under_switchyard:#?}");
    let budget = |e, d, c, a, s: &str, r: &str| (e, d, c, a, s.to_owned(), r.to_owned());
    assert_eq!(
        under_kcm.budgets,
        vec![
            budget(3, 2, 3, 1, "True", "SufficientPods"),
            budget(1, 2, 1, 0, "False", "InsufficientPods"),
            budget(0, 0, 1, 0, "False", "InsufficientPods"),
            budget(3, 2, 3, 1, "True", "SufficientPods"),
        ]
    );
    assert_eq!(under_kcm.evictions, (true, Some(429)));
    assert!(under_kcm.drained);
    let reset = Some(("False".to_owned(), None, None));
    assert_eq!(
        under_kcm.disruption_targets,
        (reset.clone(), "True".to_owned(), reset)
    );
    assert_eq!(under_switchyard, under_kcm);
    // The statuses were this reconciler's: it is the only disruption controller running.
    assert!(writes >= 3.0, "the reconciler wrote {writes} statuses");
}
