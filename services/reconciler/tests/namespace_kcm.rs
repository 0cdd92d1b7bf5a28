//! A namespace deleted with 1,000 objects of five kinds in it, one held by a finalizer of its
//! own, run under kube-controller-manager's namespace controller and then under Switchyard's,
//! on fresh namespaces of one control plane, and compared:
//!
//! - the namespace stays `Terminating`, emptied of everything but the held ConfigMap, with
//!   `NamespaceContentRemaining` and `NamespaceFinalizersRemaining` saying why;
//! - an aggregated API that cannot be reached (an APIService without its Service) puts
//!   `NamespaceDeletionDiscoveryFailure` on it, while the rest is still counted;
//! - once the API is gone and the finalizer removed, the namespace goes;
//! - every condition seen on the way (type, status, reason, message) is the same.
//!
//! A binary of its own: kube-controller-manager's controllers act on every namespace, so no
//! other test may run a namespace controller on this control plane while it runs.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt};
use serde_json::{Value, json};
use switchyard_k8s::{
    Api, Client, DeleteParams, ListParams, Namespace, Pod, PostParams, await_condition,
    k8s_openapi::{
        api::core::v1::{ConfigMap, Secret, ServiceAccount},
        apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        kube_aggregator::pkg::apis::apiregistration::v1::APIService,
    },
    kube::{
        api::{ApiResource, DynamicObject, Patch, PatchParams},
        runtime::watcher::{self, Event},
    },
};
use switchyard_reconciler_core::namespace::{
    CONTENT_REMAINING, DISCOVERY_FAILURE, FINALIZERS_REMAINING, TERMINATING,
};
use switchyard_testenv::{ControlPlane, TestNamespace};

use support::{NS, WITHIN};

const GROUP: &str = "namespace-test.switchyard.dev";
/// The finalizer of the one object that holds the namespace until the test lets it go.
const HOLD: &str = "namespace-test.switchyard.dev/hold";
const HELD: &str = "held";
/// The APIService whose Service does not exist: its group version is stale in discovery.
const BROKEN_API: &str = "v1.broken.namespace-test.switchyard.dev";
const BROKEN_GROUP_VERSION: &str = "broken.namespace-test.switchyard.dev/v1";
/// The 1,000 objects: (kind, how many). The namespace's `default` ServiceAccount comes on top.
const CONTENTS: [(&str, usize); 5] = [
    ("ConfigMap", 300),
    ("Secret", 300),
    ("ServiceAccount", 200),
    ("Widget", 100),
    ("Pod", 100),
];
/// Creations at once while filling the namespace.
const CREATES_AT_ONCE: usize = 32;
/// How long each step may take. Both controllers look again 8 s after a pass that left
/// content held by a finalizer, and wait up to 16 s for Pods to terminate.
const STEP: Duration = Duration::from_secs(90);

/// A condition as a user compares it: type, status, reason, message.
type Condition = (String, String, String, String);

#[derive(Debug, PartialEq)]
struct Outcome {
    /// The conditions while only the held ConfigMap remains.
    held: Vec<Condition>,
    phase: String,
    /// What is left then, by kind, and whether the held ConfigMap is marked for deletion.
    left: BTreeMap<&'static str, usize>,
    held_deleting: bool,
    /// The conditions while the broken API is there.
    discovery: Vec<Condition>,
    /// Every condition the namespace carried on the way.
    seen: BTreeSet<Condition>,
    /// The namespace and its contents are gone at the end.
    gone: bool,
}

struct Timings {
    held: Duration,
    discovery: Duration,
    gone: Duration,
}

fn widgets() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: "Widget".into(),
        plural: "widgets".into(),
    }
}

/// The namespaced Widget kind, created once for both runs.
async fn install_widgets(client: &Client) -> Api<CustomResourceDefinition> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{GROUP}")},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let name = format!("widgets.{GROUP}");
    let established = await_condition(
        crds.clone(),
        &name,
        |crd: Option<&CustomResourceDefinition>| {
            crd.and_then(|c| c.status.as_ref())
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                })
        },
    );
    tokio::time::timeout(WITHIN, established)
        .await
        .expect("the Widget CRD is established")
        .unwrap();
    crds
}

fn object(kind: &str, i: usize, node: &str) -> Value {
    let name = format!("{}-{i}", kind.to_lowercase());
    match kind {
        "ConfigMap" => json!({"metadata": {"name": name}, "data": {"i": i.to_string()}}),
        "Secret" => json!({"metadata": {"name": name}, "stringData": {"i": i.to_string()}}),
        "ServiceAccount" => json!({"metadata": {"name": name}}),
        "Widget" => json!({
            "apiVersion": format!("{GROUP}/v1"), "kind": "Widget",
            "metadata": {"name": name}, "spec": {"i": i}
        }),
        "Pod" => json!({
            "metadata": {"name": name},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "image": "registry.example/app:1"}]
            }
        }),
        other => panic!("no kind {other}"),
    }
}

async fn create(client: &Client, namespace: &str, kind: &str, value: Value) {
    let params = PostParams::default();
    match kind {
        "ConfigMap" => drop(
            Api::<ConfigMap>::namespaced(client.clone(), namespace)
                .create(&params, &serde_json::from_value(value).unwrap())
                .await
                .unwrap(),
        ),
        "Secret" => drop(
            Api::<Secret>::namespaced(client.clone(), namespace)
                .create(&params, &serde_json::from_value(value).unwrap())
                .await
                .unwrap(),
        ),
        "ServiceAccount" => drop(
            Api::<ServiceAccount>::namespaced(client.clone(), namespace)
                .create(&params, &serde_json::from_value(value).unwrap())
                .await
                .unwrap(),
        ),
        "Widget" => drop(
            Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &widgets())
                .create(&params, &serde_json::from_value(value).unwrap())
                .await
                .unwrap(),
        ),
        "Pod" => drop(
            Api::<Pod>::namespaced(client.clone(), namespace)
                .create(&params, &serde_json::from_value(value).unwrap())
                .await
                .unwrap(),
        ),
        other => panic!("no kind {other}"),
    }
}

/// The objects of each kind left in the namespace (the `default` ServiceAccount included).
async fn census(client: &Client, namespace: &str) -> BTreeMap<&'static str, usize> {
    let params = ListParams::default();
    let mut left = BTreeMap::new();
    for (kind, _) in CONTENTS {
        let n = match kind {
            "ConfigMap" => Api::<ConfigMap>::namespaced(client.clone(), namespace)
                .list_metadata(&params)
                .await
                .unwrap()
                .items
                .len(),
            "Secret" => Api::<Secret>::namespaced(client.clone(), namespace)
                .list_metadata(&params)
                .await
                .unwrap()
                .items
                .len(),
            "ServiceAccount" => Api::<ServiceAccount>::namespaced(client.clone(), namespace)
                .list_metadata(&params)
                .await
                .unwrap()
                .items
                .len(),
            "Widget" => {
                Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &widgets())
                    .list_metadata(&params)
                    .await
                    .unwrap()
                    .items
                    .len()
            }
            "Pod" => Api::<Pod>::namespaced(client.clone(), namespace)
                .list_metadata(&params)
                .await
                .unwrap()
                .items
                .len(),
            other => panic!("no kind {other}"),
        };
        left.insert(kind, n);
    }
    left
}

/// Fills the namespace: 1,000 objects, the Pods on kwok's Nodes and running, one ConfigMap
/// carrying a finalizer of its own.
async fn fill(client: &Client, namespace: &str, nodes: &[String]) {
    let mut objects = Vec::new();
    for (kind, n) in CONTENTS {
        for i in 0..n {
            objects.push((kind, object(kind, i, &nodes[i % nodes.len()])));
        }
    }
    // One of the 300 ConfigMaps is the held one.
    objects[0].1 = json!({"metadata": {"name": HELD, "finalizers": [HOLD]}});
    futures::stream::iter(objects)
        .map(|(kind, value)| create(client, namespace, kind, value))
        .buffer_unordered(CREATES_AT_ONCE)
        .collect::<Vec<()>>()
        .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let start = Instant::now();
    loop {
        let running = pods
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if running == 100 {
            break;
        }
        assert!(start.elapsed() < STEP, "{running} of 100 Pods running");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let left = census(client, namespace).await;
    assert_eq!(
        left.values().sum::<usize>(),
        1_001,
        "1,000 objects and the default ServiceAccount: {left:?}"
    );
}

fn conditions(namespace: &Namespace) -> Vec<Condition> {
    let mut conditions: Vec<Condition> = namespace
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
        .collect();
    conditions.sort();
    conditions
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.0 == type_)
}

/// Records every condition the namespace carries, from a watch, until dropped.
struct Seen {
    seen: Arc<Mutex<BTreeSet<Condition>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Seen {
    fn start(client: &Client, namespace: &str) -> Self {
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let api: Api<Namespace> = Api::all(client.clone());
        let config = watcher::Config::default().fields(&format!("metadata.name={namespace}"));
        let task = tokio::spawn({
            let seen = seen.clone();
            async move {
                let mut events = std::pin::pin!(watcher::watcher(api, config));
                while let Ok(Some(event)) = events.try_next().await {
                    if let Event::Apply(ns) | Event::InitApply(ns) = event {
                        seen.lock().unwrap().extend(conditions(&ns));
                    }
                }
            }
        });
        Self { seen, task }
    }

    fn stop(self) -> BTreeSet<Condition> {
        self.task.abort();
        self.seen.lock().unwrap().clone()
    }
}

/// Waits until the namespace's conditions satisfy `check`; returns them.
async fn conditions_until(
    namespaces: &Api<Namespace>,
    name: &str,
    what: &str,
    check: impl Fn(&[Condition]) -> bool + Send + 'static,
) -> (Vec<Condition>, Namespace) {
    let wait = await_condition(namespaces.clone(), name, move |ns: Option<&Namespace>| {
        ns.is_some_and(|ns| check(&conditions(ns)))
    });
    match tokio::time::timeout(STEP, wait).await {
        Ok(Ok(Some(ns))) => (conditions(&ns), ns),
        _ => {
            let now = namespaces.get_opt(name).await.unwrap();
            panic!(
                "{what}: not seen within {STEP:?}; the namespace: {:?}",
                now.as_ref().map(conditions)
            );
        }
    }
}

fn broken_api() -> APIService {
    serde_json::from_value(json!({
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": BROKEN_API},
        "spec": {
            "group": format!("broken.{GROUP}"),
            "version": "v1",
            "groupPriorityMinimum": 1000,
            "versionPriority": 15,
            "insecureSkipTLSVerify": true,
            "service": {"namespace": "default", "name": "no-such-service", "port": 443}
        }
    }))
    .unwrap()
}

/// Fill, delete, wait until only the held ConfigMap remains, break discovery, then mend it
/// and remove the finalizer: what the namespace showed, and when.
async fn scenario(plane: &ControlPlane, client: &Client, namespace: &str) -> (Outcome, Timings) {
    fill(client, namespace, plane.nodes()).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let seen = Seen::start(client, namespace);

    let deleted = Instant::now();
    namespaces
        .delete(namespace, &DeleteParams::default())
        .await
        .unwrap();
    let held_message = "Some resources are remaining: configmaps. has 1 resource instances";
    let (held, ns) = conditions_until(
        &namespaces,
        namespace,
        "only the held ConfigMap remaining",
        move |c| {
            condition(c, CONTENT_REMAINING).is_some_and(|c| c.1 == "True" && c.3 == held_message)
                && condition(c, FINALIZERS_REMAINING).is_some_and(|c| c.1 == "True")
        },
    )
    .await;
    let held_after = deleted.elapsed();
    let phase = ns.status.and_then(|s| s.phase).unwrap_or_default();
    let left = census(client, namespace).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let held_deleting = config_maps
        .get(HELD)
        .await
        .unwrap()
        .metadata
        .deletion_timestamp
        .is_some();

    // An aggregated API nothing serves: its group version is stale in discovery.
    let apis: Api<APIService> = Api::all(client.clone());
    apis.create(&PostParams::default(), &broken_api())
        .await
        .unwrap();
    let broken = Instant::now();
    let (discovery, _) = conditions_until(&namespaces, namespace, "the discovery failure", |c| {
        condition(c, DISCOVERY_FAILURE).is_some_and(|c| c.1 == "True")
    })
    .await;
    let discovery_after = broken.elapsed();

    apis.delete(BROKEN_API, &DeleteParams::default())
        .await
        .unwrap();
    config_maps
        .patch(
            HELD,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    let released = Instant::now();
    let uid = namespaces
        .get_opt(namespace)
        .await
        .unwrap()
        .and_then(|ns| ns.metadata.uid);
    let gone = await_condition(
        namespaces.clone(),
        namespace,
        move |ns: Option<&Namespace>| ns.is_none_or(|ns| ns.metadata.uid != uid),
    );
    if tokio::time::timeout(STEP, gone).await.is_err() {
        let now = namespaces.get_opt(namespace).await.unwrap();
        panic!(
            "the namespace is not gone within {STEP:?}: {:?}",
            now.as_ref().map(conditions)
        );
    }
    let gone_after = released.elapsed();
    let empty = census(client, namespace).await.values().all(|n| *n == 0);
    (
        Outcome {
            held,
            phase,
            left,
            held_deleting,
            discovery,
            seen: seen.stop(),
            gone: empty && namespaces.get_opt(namespace).await.unwrap().is_none(),
        },
        Timings {
            held: held_after,
            discovery: discovery_after,
            gone: gone_after,
        },
    )
}

fn expected(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
    (type_.into(), status.into(), reason.into(), message.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_of_1000_objects_ends_the_same_under_kube_controller_manager_and_switchyard() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let crds = install_widgets(&client).await;

    let started = Instant::now();
    let kcm = plane
        .start_controller_manager(&["namespace-controller"], &[])
        .await
        .expect("kube-controller-manager starts");
    let kcm_ns = TestNamespace::create(plane, &client, "ns-kcm")
        .await
        .unwrap();
    let (under_kcm, kcm_timings) = scenario(plane, &client, kcm_ns.name()).await;
    drop(kcm);
    let kcm_took = started.elapsed();

    let started = Instant::now();
    let ns = TestNamespace::create(plane, &client, "ns-sy")
        .await
        .unwrap();
    let queue = support::queue(&[NS], &[]).await;
    let watcher = support::watcher(plane, &support::watcher_config(&[], ""), queue.grpc()).await;
    watcher.wait_ready(WITHIN).await;
    let reconciler = support::reconciler(
        plane,
        support::namespace_controller(),
        queue.grpc(),
        watcher.grpc(),
        &[],
    )
    .await;
    reconciler.wait_ready(WITHIN).await;
    let (under_switchyard, sy_timings) = scenario(plane, &client, ns.name()).await;
    let switchyard_took = started.elapsed();
    for (who, took, t) in [
        ("kube-controller-manager", kcm_took, &kcm_timings),
        ("switchyard", switchyard_took, &sy_timings),
    ] {
        eprintln!(
            "{who}: {took:?} in all; held after {:?}, discovery failure after {:?}, gone {:?} \
             after the finalizer's removal",
            t.held, t.discovery, t.gone
        );
    }
    eprintln!("{under_switchyard:#?}");
    // What the namespace controller asked of the apiserver, by verb and code.
    let (_, metrics) = reconciler.admin_get("/metrics").await;
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("switchyard_apiserver_requests_total{"))
    {
        eprintln!("{line}");
    }
    reconciler.stop().await;
    watcher.stop().await;
    queue.stop().await;
    crds.delete(&format!("widgets.{GROUP}"), &DeleteParams::default())
        .await
        .unwrap();

    assert_eq!(under_switchyard.held, under_kcm.held);
    assert_eq!(under_switchyard.discovery, under_kcm.discovery);
    assert_eq!(under_switchyard.seen, under_kcm.seen);
    assert_eq!(under_switchyard, under_kcm);

    // And the values themselves: Terminating, emptied but for the held ConfigMap, which is
    // marked for deletion and keeps its finalizer until the test removes it.
    assert_eq!(under_switchyard.phase, TERMINATING);
    assert_eq!(
        under_switchyard.left,
        BTreeMap::from([
            ("ConfigMap", 1),
            ("Pod", 0),
            ("Secret", 0),
            ("ServiceAccount", 0),
            ("Widget", 0)
        ])
    );
    assert!(under_switchyard.held_deleting);
    let failed = format!(
        "Discovery failed for some groups, 1 failing: unable to retrieve the complete list of \
         server APIs: {BROKEN_GROUP_VERSION}: stale GroupVersion discovery: {BROKEN_GROUP_VERSION}"
    );
    let remaining = expected(
        CONTENT_REMAINING,
        "True",
        "SomeResourcesRemain",
        "Some resources are remaining: configmaps. has 1 resource instances",
    );
    let finalizers = expected(
        FINALIZERS_REMAINING,
        "True",
        "SomeFinalizersRemain",
        &format!(
            "Some content in the namespace has finalizers remaining: {HOLD} in 1 resource instances"
        ),
    );
    assert!(under_switchyard.held.contains(&remaining));
    assert!(under_switchyard.held.contains(&finalizers));
    assert!(
        under_switchyard
            .held
            .iter()
            .filter(|c| c.0 != CONTENT_REMAINING && c.0 != FINALIZERS_REMAINING)
            .all(|c| c.1 == "False"),
        "{:?}",
        under_switchyard.held
    );
    // The broken API did not stop the rest: the ConfigMap is still counted beside it.
    assert!(under_switchyard.discovery.contains(&expected(
        DISCOVERY_FAILURE,
        "True",
        "DiscoveryFailed",
        &failed
    )));
    assert!(under_switchyard.discovery.contains(&remaining));
    assert!(under_switchyard.gone);
}
