//! Level-triggered behaviour, each scenario run under kube-controller-manager (its Deployment
//! and ReplicaSet controllers only) and then under Switchyard, on fresh namespaces of one
//! control plane, and compared:
//!
//! - a status tampered with (Deployment, ReplicaSet) is repaired, within the step's minute,
//!   which only the status's own watch event can explain (no resync runs on either side);
//!   how long it took is printed, not bounded (kube-controller-manager once took 2.14 s on a
//!   loaded machine, where the test used to hold both to 2 s);
//! - a namespace deleted while its Deployment scales and rolls out: the controllers end there
//!   quietly (Switchyard's log names no refusal, no warning);
//! - the Events `kubectl describe` shows for a scale up, a rollout and a scale down;
//! - which Pods a scale-down deletes: `pod-deletion-cost`, and Pods of a sibling ReplicaSet
//!   crowding a Node;
//! - proportional scaling while a rollout is stuck (kwok never makes the new Pods Ready), for
//!   several `maxSurge`/`maxUnavailable` pairs.
//!
//! A binary of its own: kube-controller-manager's controllers act on every namespace, so no
//! other test may run controllers on this control plane while it runs.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use switchyard_k8s::{
    Api, DeleteParams, Deployment, ListParams, Namespace, Pod, PostParams, ReplicaSet,
    k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent},
    kube::api::{Patch, PatchParams},
};
use switchyard_reconciler_core::{
    deployment::{self as core, PROGRESSING, get_condition},
    replicaset::{POD_DELETION_COST, is_active, is_ready},
};
use switchyard_testenv::{
    ControlPlane, KWOK_IMAGE_PULL_FAILS, ServiceProcess, TestNamespace, manifests,
};

use support::{DEPLOY, RS, WITHIN};

/// How long one step may take.
const STEP: Duration = Duration::from_secs(60);
/// A stuck rollout counts as settled once its ReplicaSets keep their sizes this long.
const SETTLED_FOR: Duration = Duration::from_secs(2);
/// The Events count as written once this many reads, a second apart, find them unchanged.
const EVENTS_STABLE_READS: u32 = 10;
/// The `maxSurge`/`maxUnavailable` pairs of the stuck rollouts.
const STUCK_PAIRS: [(&str, &str); 4] = [("25%", "25%"), ("2", "0"), ("0", "3"), ("50%", "10%")];

fn patch() -> PatchParams {
    PatchParams::default()
}

async fn merge<K>(api: &Api<K>, name: &str, value: Value)
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &patch(), &Patch::Merge(value))
        .await
        .unwrap();
}

/// Polls `check` every 50 ms until it holds; panics with `what` after `within`.
async fn until<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The rollout of `name` to `n` replicas is complete and its Pods are ready.
async fn complete(client: &switchyard_k8s::Client, namespace: &str, name: &str, n: i32) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    until(
        STEP,
        &format!("{namespace}/{name} complete at {n}"),
        || async {
            let d = deployments.get(name).await.unwrap();
            let s = d.status.clone().unwrap_or_default();
            let active = support::active_pods(&pods, &format!("app={name}")).await;
            s.observed_generation >= d.metadata.generation
                && s.replicas == Some(n)
                && s.updated_replicas == Some(n)
                && s.available_replicas == Some(n)
                && get_condition(&s, PROGRESSING)
                    .is_some_and(|c| c.reason.as_deref() == Some(core::NEW_RS_AVAILABLE))
                && active.len() == usize::try_from(n).unwrap()
                && active.iter().all(is_ready)
        },
    )
    .await;
}

// --- status tampering ---------------------------------------------------------------------

/// Milliseconds until a tampered Deployment status, then a tampered ReplicaSet status, were
/// written back.
async fn tampering(client: &switchyard_k8s::Client, namespace: &str) -> (Duration, Duration) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
    deployments
        .create(
            &PostParams::default(),
            &manifests::deployment("tamper", 2, Value::Null),
        )
        .await
        .unwrap();
    complete(client, namespace, "tamper", 2).await;

    let bad = json!({"status": {"readyReplicas": 0, "availableReplicas": 0}});
    deployments
        .patch_status("tamper", &patch(), &Patch::Merge(&bad))
        .await
        .unwrap();
    let start = Instant::now();
    until(STEP, "the Deployment status repaired", || async {
        let s = deployments
            .get_status("tamper")
            .await
            .unwrap()
            .status
            .unwrap();
        s.ready_replicas == Some(2) && s.available_replicas == Some(2)
    })
    .await;
    let deployment_repaired = start.elapsed();

    let rs_name = rss.list(&ListParams::default()).await.unwrap().items[0]
        .metadata
        .name
        .clone()
        .unwrap();
    rss.patch_status(&rs_name, &patch(), &Patch::Merge(&bad))
        .await
        .unwrap();
    let start = Instant::now();
    until(STEP, "the ReplicaSet status repaired", || async {
        let rs = rss.get_status(&rs_name).await.unwrap().status.unwrap();
        let d = deployments
            .get_status("tamper")
            .await
            .unwrap()
            .status
            .unwrap();
        rs.ready_replicas == Some(2)
            && rs.available_replicas == Some(2)
            && d.ready_replicas == Some(2)
            && d.available_replicas == Some(2)
    })
    .await;
    (deployment_repaired, start.elapsed())
}

// --- events -------------------------------------------------------------------------------

/// What `kubectl describe` shows of one object's Events: type, reason, message with the
/// generated names replaced, and how many times.
type Shown = Vec<(String, String, String, i32)>;

/// Created at 2, scaled to 4, rolled to a second image (old to 0 first, then new to 4: no
/// step depends on timing), scaled down to 1. The Events of the Deployment and of each
/// ReplicaSet (by revision).
async fn events(
    plane: &ControlPlane,
    client: &switchyard_k8s::Client,
    namespace: &str,
) -> BTreeMap<String, Shown> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let strategy = json!({"strategy": {"type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "100%"}}});
    deployments
        .create(
            &PostParams::default(),
            &manifests::deployment("ev", 2, strategy),
        )
        .await
        .unwrap();
    complete(client, namespace, "ev", 2).await;
    merge(&deployments, "ev", json!({"spec": {"replicas": 4}})).await;
    complete(client, namespace, "ev", 4).await;
    merge(
        &deployments,
        "ev",
        json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "registry.example/app:2"}]}}}}),
    )
    .await;
    complete(client, namespace, "ev", 4).await;
    merge(&deployments, "ev", json!({"spec": {"replicas": 1}})).await;
    complete(client, namespace, "ev", 1).await;

    // Names by revision: ev -> deployment, ev-<hash> -> rs-<revision>, their Pods -> pod.
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
    let mut aliases: Vec<(String, String)> = rss
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|rs| {
            (
                rs.metadata.name.clone().unwrap(),
                format!("rs-{}", core::revision(rs)),
            )
        })
        .collect();
    // Longest first, so that a Pod name is replaced as a whole.
    aliases.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    let normalize = |message: &str| -> String {
        let mut out = message.to_owned();
        for (name, alias) in &aliases {
            // A Pod is <replicaset>-<5 characters>.
            while let Some(at) = out.find(&format!("{name}-")) {
                let end = (at + name.len() + 6).min(out.len());
                out.replace_range(at..end, &format!("{alias}-pod"));
            }
            out = out.replace(name.as_str(), alias);
        }
        out
    };
    let events: Api<CoreEvent> = Api::namespaced(client.clone(), namespace);
    // Events are written in the background: read until two reads a second apart agree.
    // Only the controllers' Events (the scheduler's, about Pods, name nodes and namespaces).
    let mut shown: Option<BTreeMap<String, Shown>> = None;
    let mut stable = 0;
    let start = Instant::now();
    loop {
        assert!(start.elapsed() < STEP, "the Events did not settle");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut now: BTreeMap<String, Shown> = BTreeMap::new();
        for e in events.list(&ListParams::default()).await.unwrap().items {
            let kind = e.involved_object.kind.as_deref().unwrap_or_default();
            if kind != "Deployment" && kind != "ReplicaSet" {
                continue;
            }
            let object = normalize(e.involved_object.name.as_deref().unwrap_or_default());
            now.entry(object).or_default().push((
                e.type_.clone().unwrap_or_default(),
                e.reason.clone().unwrap_or_default(),
                normalize(e.message.as_deref().unwrap_or_default()),
                e.count.unwrap_or(1).max(1),
            ));
        }
        for list in now.values_mut() {
            list.sort();
        }
        if shown.as_ref() == Some(&now) {
            stable += 1;
            if stable == EVENTS_STABLE_READS {
                break;
            }
        } else {
            stable = 0;
        }
        shown = Some(now);
    }
    let shown = shown.unwrap_or_default();

    // And `kubectl describe` shows each message.
    let describe = |what: &str| {
        let mut command = plane.kubectl();
        command.args(["describe", what, "-n", namespace]);
        let output = command.output().unwrap();
        normalize(&String::from_utf8_lossy(&output.stdout))
    };
    let deploy = describe("deployment/ev");
    let rs = describe("replicasets");
    for (object, list) in &shown {
        let text = if object == "ev" { &deploy } else { &rs };
        for (_, reason, message, _) in list {
            assert!(
                text.contains(reason.as_str()) && text.contains(message.as_str()),
                "kubectl describe does not show {reason} {message:?} of {object}:\n{text}"
            );
        }
    }
    shown
}

// --- deletion order -----------------------------------------------------------------------

/// A Pod controlled by nobody yet, on `node`, that the selector `app=<app>,set=<set>` matches.
fn orphan(name: &str, app: &str, set: &str, node: &str, cost: Option<i32>) -> Pod {
    let mut annotations = serde_json::Map::new();
    if let Some(cost) = cost {
        annotations.insert(POD_DELETION_COST.into(), json!(cost.to_string()));
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": app, "set": set},
                     "annotations": annotations},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": manifests::IMAGE}]}
    }))
    .unwrap()
}

fn replica_set_of(
    name: &str,
    app: &str,
    set: &str,
    replicas: i32,
    owner: Option<&ConfigMap>,
) -> ReplicaSet {
    let mut value = json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": app, "set": set}},
            "template": {"metadata": {"labels": {"app": app, "set": set}},
                         "spec": {"containers": [{"name": "c", "image": manifests::IMAGE}]}}
        }
    });
    if let Some(owner) = owner {
        value["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "v1", "kind": "ConfigMap",
            "name": owner.metadata.name, "uid": owner.metadata.uid, "controller": true
        }]);
    }
    serde_json::from_value(value).unwrap()
}

/// The names of the active Pods of `selector`, sorted.
async fn active_names(pods: &Api<Pod>, selector: &str) -> Vec<String> {
    let mut names: Vec<String> = support::active_pods(pods, selector)
        .await
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    names.sort();
    names
}

/// Which Pods stay: of four with deletion costs scaled to two, and of a ReplicaSet whose
/// sibling (same controller) crowds one of its Nodes, scaled from three to two.
async fn deletion_order(
    client: &switchyard_k8s::Client,
    namespace: &str,
    nodes: &[String],
) -> (Vec<String>, Vec<String>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
    let params = PostParams::default();
    for (name, cost) in [
        ("cost-a", 10),
        ("cost-b", -5),
        ("cost-c", 100),
        ("cost-d", 0),
    ] {
        pods.create(&params, &orphan(name, "cost", "x", &nodes[0], Some(cost)))
            .await
            .unwrap();
    }
    // a1, a2 alone on node 0; a3 on node 1 with the three Pods of the sibling b.
    for (name, set, node) in [
        ("a1", "a", &nodes[0]),
        ("a2", "a", &nodes[0]),
        ("a3", "a", &nodes[1]),
        ("b1", "b", &nodes[1]),
        ("b2", "b", &nodes[1]),
        ("b3", "b", &nodes[1]),
    ] {
        pods.create(&params, &orphan(name, "rel", set, node, None))
            .await
            .unwrap();
    }
    until(STEP, "the orphans are ready", || async {
        let active = support::active_pods(&pods, "").await;
        active.len() == 10 && active.iter().all(is_ready)
    })
    .await;
    let owner: ConfigMap = Api::namespaced(client.clone(), namespace)
        .create(
            &params,
            &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap(),
        )
        .await
        .unwrap();
    rss.create(&params, &replica_set_of("cost", "cost", "x", 4, None))
        .await
        .unwrap();
    rss.create(
        &params,
        &replica_set_of("rel-a", "rel", "a", 3, Some(&owner)),
    )
    .await
    .unwrap();
    rss.create(
        &params,
        &replica_set_of("rel-b", "rel", "b", 3, Some(&owner)),
    )
    .await
    .unwrap();
    // Every orphan adopted, none created.
    until(STEP, "the orphans are adopted", || async {
        let active = support::active_pods(&pods, "").await;
        active.len() == 10
            && active
                .iter()
                .all(|p| switchyard_reconciler_core::replicaset::controller_of(p).is_some())
    })
    .await;
    merge(&rss, "cost", json!({"spec": {"replicas": 2}})).await;
    merge(&rss, "rel-a", json!({"spec": {"replicas": 2}})).await;
    until(STEP, "the scale-downs are done", || async {
        support::active_pods(&pods, "app=cost").await.len() == 2
            && support::active_pods(&pods, "app=rel,set=a").await.len() == 2
    })
    .await;
    (
        active_names(&pods, "app=cost").await,
        active_names(&pods, "app=rel").await,
    )
}

// --- proportional scaling while stuck -----------------------------------------------------

/// Per step, the (revision, spec replicas) of every ReplicaSet, once the rollout settled.
type Sizes = Vec<Vec<(i64, i32)>>;

async fn settled_sizes(
    rss: &Api<ReplicaSet>,
    deployments: &Api<Deployment>,
    name: &str,
) -> Vec<(i64, i32)> {
    let mut last: Option<(Vec<(i64, i32)>, Instant)> = None;
    let start = Instant::now();
    loop {
        assert!(start.elapsed() < STEP, "{name} did not settle: {last:?}");
        let d = deployments.get(name).await.unwrap();
        let observed =
            d.status.as_ref().and_then(|s| s.observed_generation) == d.metadata.generation;
        let items = rss
            .list(&ListParams::default().labels(&format!("app={name}")))
            .await
            .unwrap()
            .items;
        let created = items.iter().all(|rs| {
            rs.status
                .as_ref()
                .is_some_and(|s| s.replicas == core::replicas(rs))
        });
        let mut sizes: Vec<(i64, i32)> = items
            .iter()
            .map(|rs| (core::revision(rs), core::replicas(rs)))
            .collect();
        sizes.sort_unstable();
        match &last {
            Some((previous, since)) if *previous == sizes && observed && created => {
                if since.elapsed() >= SETTLED_FOR {
                    return sizes;
                }
            }
            _ => last = Some((sizes, Instant::now())),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// 10 replicas rolled to a template whose Pods never become Ready, then scaled to 15 and to 6
/// while stuck: the sizes at each step.
async fn stuck(
    client: &switchyard_k8s::Client,
    namespace: &str,
    name: String,
    surge: &str,
    unavailable: &str,
) -> Sizes {
    let name = name.as_str();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
    let int_or_percent = |v: &str| v.parse::<i32>().map_or(json!(v), |n| json!(n));
    let strategy = json!({"strategy": {"type": "RollingUpdate", "rollingUpdate": {
        "maxSurge": int_or_percent(surge), "maxUnavailable": int_or_percent(unavailable)}}});
    deployments
        .create(
            &PostParams::default(),
            &manifests::deployment(name, 10, strategy),
        )
        .await
        .unwrap();
    complete(client, namespace, name, 10).await;
    merge(
        &deployments,
        name,
        json!({"spec": {"template": {
            "metadata": {"annotations": {KWOK_IMAGE_PULL_FAILS: "true"}},
            "spec": {"containers": [{"name": "c", "image": "registry.example/missing:1"}]}
        }}}),
    )
    .await;
    let mut steps = vec![settled_sizes(&rss, &deployments, name).await];
    for replicas in [15, 6] {
        merge(&deployments, name, json!({"spec": {"replicas": replicas}})).await;
        steps.push(settled_sizes(&rss, &deployments, name).await);
    }
    // The harness's kwok kept every new Pod from Ready.
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let never_ready = pods
        .list(&ListParams::default().labels(&format!("app={name}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(is_active)
        .filter(|p| {
            p.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(KWOK_IMAGE_PULL_FAILS))
        })
        .collect::<Vec<_>>();
    assert!(
        !never_ready.is_empty(),
        "{name}: no Pod of the stuck template"
    );
    for pod in &never_ready {
        assert!(!is_ready(pod), "{name}: kwok made a stuck Pod Ready");
        let waiting = pod
            .status
            .as_ref()
            .unwrap()
            .container_statuses
            .as_ref()
            .unwrap()[0]
            .state
            .as_ref()
            .unwrap()
            .waiting
            .as_ref()
            .unwrap();
        assert_eq!(waiting.reason.as_deref(), Some("ImagePullBackOff"));
    }
    steps
}

// --- a namespace deleted mid-rollout ------------------------------------------------------

/// What the terminating scenario ends with: the ReplicaSets (revision, spec and status
/// replicas), the active Pods, and the Deployment's conditions and observed generation.
type Left = (Vec<(i64, i32, i32)>, usize, Vec<(String, String, String)>);

/// A Deployment of 2, then its namespace deleted, then a scale to 3 and a new image: the
/// ReplicaSets (revision, replicas in spec and status), the active Pods, and the Deployment's
/// conditions and observed generation once the controllers gave up.
async fn terminating(client: &switchyard_k8s::Client, namespace: &str) -> Left {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    deployments
        .create(
            &PostParams::default(),
            &manifests::deployment("term", 2, Value::Null),
        )
        .await
        .unwrap();
    complete(client, namespace, "term", 2).await;
    // No namespace controller runs here: the namespace stays Terminating.
    Api::<Namespace>::all(client.clone())
        .delete(namespace, &DeleteParams::default())
        .await
        .unwrap();
    merge(&deployments, "term", json!({"spec": {"replicas": 3}})).await;
    // The old ReplicaSet is scaled (updates pass), its third Pod refused.
    until(STEP, "the old ReplicaSet scaled to 3", || async {
        let items = rss.list(&ListParams::default()).await.unwrap().items;
        items.len() == 1
            && core::replicas(&items[0]) == 3
            && items[0].status.as_ref().and_then(|s| s.observed_generation)
                == items[0].metadata.generation
    })
    .await;
    merge(
        &deployments,
        "term",
        json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "registry.example/app:2"}]}}}}),
    )
    .await;
    // Nothing to wait for: the controllers are to leave no trace. Time for a creation to be
    // tried, and retried had it been.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut sets: Vec<(i64, i32, i32)> = rss
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|rs| {
            (
                core::revision(rs),
                core::replicas(rs),
                rs.status.as_ref().map_or(0, |s| s.replicas),
            )
        })
        .collect();
    sets.sort_unstable();
    let d = deployments.get("term").await.unwrap();
    let observed = d.status.as_ref().and_then(|s| s.observed_generation);
    let mut conditions: Vec<(String, String, String)> = d
        .status
        .unwrap_or_default()
        .conditions
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.status, c.reason.unwrap_or_default()))
        .collect();
    // The creation refused, the generation of the new template stays unobserved.
    conditions.push((
        "observedGeneration".into(),
        format!("{:?}", d.metadata.generation),
        format!("{observed:?}"),
    ));
    conditions.sort();
    (
        sets,
        support::active_pods(&pods, "").await.len(),
        conditions,
    )
}

// --- the comparison -----------------------------------------------------------------------

#[derive(Debug, PartialEq)]
struct Outcome {
    events: BTreeMap<String, Shown>,
    deletion: (Vec<String>, Vec<String>),
    stuck: Vec<Sizes>,
    terminating: Left,
}

/// The namespaces of one run.
struct Namespaces {
    tamper: TestNamespace,
    events: TestNamespace,
    deletion: TestNamespace,
    stuck: TestNamespace,
    terminating: TestNamespace,
}

impl Namespaces {
    async fn create(plane: &ControlPlane, client: &switchyard_k8s::Client, run: &str) -> Self {
        let ns = |what: &str| format!("lvl-{run}-{what}");
        Self {
            tamper: TestNamespace::create(plane, client, &ns("tamper"))
                .await
                .unwrap(),
            events: TestNamespace::create(plane, client, &ns("events"))
                .await
                .unwrap(),
            deletion: TestNamespace::create(plane, client, &ns("delete"))
                .await
                .unwrap(),
            stuck: TestNamespace::create(plane, client, &ns("stuck"))
                .await
                .unwrap(),
            terminating: TestNamespace::create(plane, client, &ns("term"))
                .await
                .unwrap(),
        }
    }

    fn names(&self) -> Vec<&str> {
        vec![
            self.tamper.name(),
            self.events.name(),
            self.deletion.name(),
            self.stuck.name(),
            self.terminating.name(),
        ]
    }
}

async fn run(
    plane: &ControlPlane,
    client: &switchyard_k8s::Client,
    ns: &Namespaces,
) -> (Outcome, (Duration, Duration)) {
    let (tamper, events, deletion, stuck, terminating) = tokio::join!(
        tampering(client, ns.tamper.name()),
        events(plane, client, ns.events.name()),
        deletion_order(client, ns.deletion.name(), plane.nodes()),
        futures::future::join_all(STUCK_PAIRS.iter().enumerate().map(
            |(i, (surge, unavailable))| {
                stuck(
                    client,
                    ns.stuck.name(),
                    format!("stuck-{i}"),
                    surge,
                    unavailable,
                )
            }
        )),
        terminating(client, ns.terminating.name()),
    );
    let outcome = Outcome {
        events,
        deletion,
        stuck,
        terminating,
    };
    (outcome, tamper)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn level_triggered_scenarios_end_the_same_under_kube_controller_manager_and_switchyard() {
    let plane = ControlPlane::shared().expect("control plane");
    assert!(
        plane.nodes().len() >= 2,
        "the deletion scenario needs two Nodes"
    );
    let client = plane.client().await.unwrap();

    let started = Instant::now();
    let kcm = plane
        .start_controller_manager(&["deployment-controller", "replicaset-controller"], &[])
        .await
        .expect("kube-controller-manager starts");
    let kcm_ns = Namespaces::create(plane, &client, "kcm").await;
    let (under_kcm, kcm_tamper) = run(plane, &client, &kcm_ns).await;
    drop(kcm);
    eprintln!(
        "kube-controller-manager: {:?}, repaired in {kcm_tamper:?}",
        started.elapsed()
    );

    let started = Instant::now();
    let ns = Namespaces::create(plane, &client, "sy").await;
    let queue = support::queue(switchyard_reconciler::BUILTIN, &[]).await;
    let watcher = support::watcher(
        plane,
        &support::watcher_config(&ns.names(), ""),
        queue.grpc(),
    )
    .await;
    watcher.wait_ready(WITHIN).await;
    // A process of its own, so that its log can be read.
    let queue_addr = format!("--queue-addr={}", queue.grpc());
    let watcher_addr = format!("--watcher-addr={}", watcher.grpc());
    let kubeconfig = format!("--kubeconfig={}", plane.kubeconfig().display());
    let mut reconciler = ServiceProcess::start(
        Path::new(env!("CARGO_BIN_EXE_switchyard-reconciler")),
        &[
            &kubeconfig,
            &queue_addr,
            &watcher_addr,
            "--log-format=json",
            &format!("--controllers={RS},{DEPLOY}"),
        ],
        &[],
    )
    .await
    .unwrap();
    reconciler.wait_ready().await.unwrap();
    let (under_switchyard, sy_tamper) = run(plane, &client, &ns).await;
    eprintln!(
        "switchyard: {:?}, repaired in {sy_tamper:?}",
        started.elapsed()
    );
    eprintln!("{under_switchyard:#?}");
    let log = reconciler.log();
    let (status, _) = reconciler.terminate().await.unwrap();
    assert!(status.success(), "the reconciler exits cleanly");
    watcher.stop().await;
    queue.stop().await;

    // The terminating namespace: no refusal reached the log, as a failure or a warning.
    let refusals: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains(ns.terminating.name()) && (l.contains("\"WARN\"") || l.contains("\"ERROR\""))
        })
        .filter(|l| l.contains("forbidden") || l.contains("terminat") || l.contains("403"))
        .collect();
    assert!(refusals.is_empty(), "{refusals:#?}");

    assert_eq!(under_switchyard.events, under_kcm.events);
    assert_eq!(under_switchyard.deletion, under_kcm.deletion);
    assert_eq!(under_switchyard.stuck, under_kcm.stuck);
    assert_eq!(under_switchyard.terminating, under_kcm.terminating);
    assert_eq!(under_switchyard, under_kcm);

    // And the values themselves: the two most costly Pods stay; a3, on the Node its sibling
    // crowds, goes.
    assert_eq!(
        under_switchyard.deletion,
        (
            vec!["cost-a".to_owned(), "cost-c".to_owned()],
            ["a1", "a2", "b1", "b2", "b3"].map(String::from).to_vec()
        )
    );
    assert_eq!(
        under_switchyard.terminating.0,
        [(1, 3, 2)],
        "no new ReplicaSet, no third Pod"
    );
}
