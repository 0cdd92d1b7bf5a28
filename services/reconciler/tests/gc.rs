//! The garbage collector end to end, against the real control plane with no
//! kube-controller-manager at all: a queue, a watcher keeping the graph, and a reconciler
//! running every built-in controller, in this process.
//!
//! One namespace pair per test; the watcher admits only those namespaces (and cluster-scoped
//! objects), so tests running side by side do not see each other's objects.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard_k8s::{
    Api, DeleteParams, Deployment, ListParams, Pod, PostParams, ReplicaSet,
    k8s_openapi::{
        api::{core::v1::ConfigMap, events::v1::Event, rbac::v1::ClusterRole},
        apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    },
    kube::api::{ApiResource, DynamicObject, GroupVersionKind},
};
use switchyard_reconciler_core::replicaset::{controller_of, is_active};
use switchyard_testenv::{ControlPlane, InProcess, ServiceProcess, TestNamespace, manifests};

use support::{DEPLOY, RS, SHARDS, WITHIN, converged, replica_set};

const COLLECTED_WITHIN: Duration = Duration::from_secs(30);

/// A queue, a watcher with the graph and the workload rules for `namespaces`, and a
/// reconciler with every built-in controller.
struct Stack {
    queue: InProcess,
    watcher: InProcess,
    reconciler: Option<InProcess>,
}

impl Stack {
    async fn start(plane: &ControlPlane, namespaces: &[&str]) -> Self {
        let queue = support::queue(switchyard_reconciler::BUILTIN, &[]).await;
        let config = format!(
            r#"
shardCount: {SHARDS}
namespaces:
  include: [{}]
garbageCollector: {{rediscoveryPeriod: 30s}}
controllers:
  - name: {RS}
    for: {{apiVersion: apps/v1, kind: ReplicaSet}}
    owns:
      - {{apiVersion: v1, kind: Pod}}
  - name: {DEPLOY}
    for: {{apiVersion: apps/v1, kind: Deployment}}
    owns:
      - {{apiVersion: apps/v1, kind: ReplicaSet}}
"#,
            namespaces.join(", ")
        );
        let watcher = support::watcher(plane, &config, queue.grpc()).await;
        watcher.wait_ready(Duration::from_secs(60)).await;
        let mut stack = Self {
            queue,
            watcher,
            reconciler: None,
        };
        stack.start_reconciler(plane).await;
        stack
    }

    async fn start_reconciler(&mut self, plane: &ControlPlane) {
        let reconciler = support::reconciler(
            plane,
            switchyard_reconciler::builtin_controllers(),
            self.queue.grpc(),
            self.watcher.grpc(),
            &[],
        )
        .await;
        reconciler.wait_ready(WITHIN).await;
        self.reconciler = Some(reconciler);
    }

    async fn stop(self) {
        if let Some(reconciler) = self.reconciler {
            reconciler.stop().await;
        }
        self.watcher.stop().await;
        self.queue.stop().await;
    }
}

fn config_map(name: &str, owners: Value) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "ownerReferences": owners},
        "data": {"k": "v"},
    }))
    .unwrap()
}

fn owner_ref(api_version: &str, kind: &str, name: &str, uid: &str, block: bool) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid,
           "blockOwnerDeletion": block})
}

async fn create_cm(api: &Api<ConfigMap>, name: &str, owners: Value) -> String {
    let cm = api
        .create(&PostParams::default(), &config_map(name, owners))
        .await
        .unwrap();
    cm.metadata.uid.unwrap()
}

/// Polls `check` every 100 ms until it holds, or fails naming `what`.
async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn exists<K>(api: &Api<K>, name: &str) -> bool
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + switchyard_k8s::kube::Resource,
{
    api.get_metadata_opt(name).await.unwrap().is_some()
}

#[tokio::test]
async fn dependents_of_a_deleted_owner_are_collected_and_dangling_references_resolved() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "gc-bg")
        .await
        .unwrap();
    let other = TestNamespace::create(plane, &client, "gc-bg-other")
        .await
        .unwrap();
    let stack = Stack::start(plane, &[ns.name(), other.name()]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    let other_cms: Api<ConfigMap> = Api::namespaced(client.clone(), other.name());

    // Background: the owner goes, its three dependents follow; a dependent with a second,
    // live owner only loses the reference to the one that went.
    let owner = create_cm(&cms, "owner", json!([])).await;
    let keeper = create_cm(&cms, "keeper", json!([])).await;
    for i in 0..3 {
        let refs = json!([owner_ref("v1", "ConfigMap", "owner", &owner, false)]);
        create_cm(&cms, &format!("dep-{i}"), refs).await;
    }
    let shared = json!([
        owner_ref("v1", "ConfigMap", "owner", &owner, false),
        owner_ref("v1", "ConfigMap", "keeper", &keeper, false)
    ]);
    create_cm(&cms, "shared", shared).await;
    // A reference to an owner that never existed, and one to a kind the apiserver does not
    // serve (never resolvable: kept, retried, and nothing else is held up by it).
    create_cm(
        &cms,
        "dangling",
        json!([owner_ref(
            "v1",
            "ConfigMap",
            "ghost",
            "00000000-0000-0000-0000-000000000001",
            false
        )]),
    )
    .await;
    create_cm(
        &cms,
        "unknown-kind",
        json!([owner_ref(
            "nothing.example.com/v1",
            "Nothing",
            "n",
            "00000000-0000-0000-0000-000000000002",
            false
        )]),
    )
    .await;
    // A cluster-scoped owner of a namespaced dependent.
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let role_name = format!("{}-owner", ns.name());
    let role: ClusterRole =
        serde_json::from_value(json!({"metadata": {"name": role_name}})).unwrap();
    let role_uid = roles
        .create(&PostParams::default(), &role)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    create_cm(
        &cms,
        "of-cluster-owner",
        json!([owner_ref(
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            &role_name,
            &role_uid,
            false
        )]),
    )
    .await;
    // A reference across namespaces: the owner exists, but in another namespace, so the
    // reference resolves nowhere: collected, with kube-controller-manager's warning.
    create_cm(
        &other_cms,
        "cross-namespace",
        json!([owner_ref("v1", "ConfigMap", "keeper", &keeper, false)]),
    )
    .await;

    eventually("the dangling reference collected", COLLECTED_WITHIN, || {
        let cms = cms.clone();
        async move { !exists(&cms, "dangling").await }
    })
    .await;
    eventually(
        "the cross-namespace dependent collected",
        COLLECTED_WITHIN,
        || {
            let api = other_cms.clone();
            async move { !exists(&api, "cross-namespace").await }
        },
    )
    .await;
    let events: Api<Event> = Api::namespaced(client.clone(), other.name());
    eventually(
        "an OwnerRefInvalidNamespace event",
        COLLECTED_WITHIN,
        || {
            let events = events.clone();
            async move {
                events
                    .list(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                    .iter()
                    .any(|e| {
                        e.reason.as_deref() == Some("OwnerRefInvalidNamespace")
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                                == Some("cross-namespace")
                    })
            }
        },
    )
    .await;
    // Nothing with a live owner was touched so far.
    for name in ["dep-0", "dep-1", "dep-2", "shared", "of-cluster-owner"] {
        assert!(exists(&cms, name).await, "{name} was collected too early");
    }

    cms.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    roles
        .delete(&role_name, &DeleteParams::default())
        .await
        .unwrap();
    for name in ["dep-0", "dep-1", "dep-2", "of-cluster-owner"] {
        eventually(&format!("{name} collected"), COLLECTED_WITHIN, || {
            let cms = cms.clone();
            async move { !exists(&cms, name).await }
        })
        .await;
    }
    eventually(
        "the shared dependent keeps only its live owner",
        COLLECTED_WITHIN,
        || {
            let cms = cms.clone();
            async move {
                let cm = cms.get("shared").await.unwrap();
                let owners: Vec<String> = cm
                    .metadata
                    .owner_references
                    .unwrap_or_default()
                    .into_iter()
                    .map(|o| o.name)
                    .collect();
                owners == ["keeper"]
            }
        },
    )
    .await;
    assert!(
        exists(&cms, "unknown-kind").await,
        "an unresolvable reference keeps the object"
    );
    stack.stop().await;
}

#[tokio::test]
async fn foreground_deletion_takes_the_dependents_first_and_orphaning_leaves_them_for_adoption() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "gc-fg")
        .await
        .unwrap();
    let stack = Stack::start(plane, &[ns.name()]).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());

    // Foreground: Deployment -> ReplicaSet -> Pods. The Deployment stays (with its
    // finalizer) until its ReplicaSet is gone, which stays until its Pods are.
    let web: Deployment =
        serde_json::from_value(manifests::workload("Deployment", "web", 3, Value::Null)).unwrap();
    deployments
        .create(&PostParams::default(), &web)
        .await
        .unwrap();
    eventually("web rolled out", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move { active(&pods, "app=web").await == 3 }
    })
    .await;
    deployments
        .delete("web", &DeleteParams::foreground())
        .await
        .unwrap();
    let mut saw_waiting = false;
    let deadline = Instant::now() + COLLECTED_WITHIN;
    loop {
        let deployment = deployments.get_metadata_opt("web").await.unwrap();
        let rs_left = replica_sets
            .list_metadata(&ListParams::default())
            .await
            .unwrap()
            .items
            .len();
        let pods_left = pods
            .list_metadata(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items
            .len();
        match deployment {
            Some(d) => {
                let finalizers = d.metadata.finalizers.unwrap_or_default();
                saw_waiting |= finalizers.iter().any(|f| f == "foregroundDeletion");
            }
            None => {
                assert_eq!(
                    (rs_left, pods_left),
                    (0, 0),
                    "the Deployment went before its dependents"
                );
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "foreground deletion of web: not within {COLLECTED_WITHIN:?} ({rs_left} ReplicaSets, {pods_left} Pods left)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        saw_waiting,
        "the Deployment waited with the foregroundDeletion finalizer"
    );

    // Orphan: the ReplicaSet goes, its Pods stay without the reference, and a new
    // ReplicaSet with the same selector adopts them instead of creating Pods.
    replica_sets
        .create(&PostParams::default(), &replica_set("lone", 2))
        .await
        .unwrap();
    let before = converged(&replica_sets, &pods, "lone", 2).await;
    replica_sets
        .delete("lone", &DeleteParams::orphan())
        .await
        .unwrap();
    eventually("lone deleted", COLLECTED_WITHIN, || {
        let api = replica_sets.clone();
        async move { !exists(&api, "lone").await }
    })
    .await;
    let orphans: Vec<Pod> = pods
        .list(&ListParams::default().labels("app=lone"))
        .await
        .unwrap()
        .items;
    assert_eq!(orphans.len(), 2, "the Pods stay");
    for pod in &orphans {
        assert!(
            pod.metadata
                .owner_references
                .clone()
                .unwrap_or_default()
                .is_empty(),
            "{:?} still references its owner",
            pod.metadata.name
        );
    }
    let mut adopter = replica_set("adopter", 2);
    adopter.spec.as_mut().unwrap().selector = before_selector("lone");
    adopter
        .spec
        .as_mut()
        .unwrap()
        .template
        .as_mut()
        .unwrap()
        .metadata
        .as_mut()
        .unwrap()
        .labels = Some(
        [
            ("app".to_owned(), "lone".to_owned()),
            ("tier".to_owned(), "web".to_owned()),
        ]
        .into(),
    );
    replica_sets
        .create(&PostParams::default(), &adopter)
        .await
        .unwrap();
    let adopter_uid = replica_sets
        .get("adopter")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    eventually("the orphans adopted", COLLECTED_WITHIN, || {
        let pods = pods.clone();
        let uid = adopter_uid.clone();
        async move {
            let list = pods
                .list(&ListParams::default().labels("app=lone"))
                .await
                .unwrap()
                .items;
            list.len() == 2
                && list
                    .iter()
                    .all(|p| controller_of(p).is_some_and(|o| o.uid == uid))
        }
    })
    .await;
    let names = |pods: &[Pod]| {
        let mut n: Vec<String> = pods
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        n.sort();
        n
    };
    let after = pods
        .list(&ListParams::default().labels("app=lone"))
        .await
        .unwrap()
        .items;
    assert_eq!(names(&before), names(&after), "adopted, not replaced");
    stack.stop().await;
}

fn before_selector(
    app: &str,
) -> switchyard_k8s::k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
    serde_json::from_value(json!({"matchLabels": {"app": app}})).unwrap()
}

async fn active(pods: &Api<Pod>, labels: &str) -> usize {
    pods.list(&ListParams::default().labels(labels))
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| is_active(p))
        .count()
}

#[tokio::test]
async fn custom_resources_of_a_crd_created_while_running_are_collected() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "gc-crd")
        .await
        .unwrap();
    let stack = Stack::start(plane, &[ns.name()]).await;
    // A CRD of its own per run (a unique group), created after the watcher started.
    let group = format!("{}.gc.example.com", ns.name());
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group,
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&group, "v1", "Widget"),
        "widgets",
    );
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns.name(), &resource);
    let owner = create_widget(&widgets, &resource, "owner", json!([])).await;
    for i in 0..3 {
        let refs = json!([owner_ref(
            &format!("{group}/v1"),
            "Widget",
            "owner",
            &owner,
            true
        )]);
        create_widget(&widgets, &resource, &format!("part-{i}"), refs).await;
    }
    // A ConfigMap owned by a custom resource, too.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    create_cm(
        &cms,
        "widget-config",
        json!([owner_ref(
            &format!("{group}/v1"),
            "Widget",
            "owner",
            &owner,
            false
        )]),
    )
    .await;
    // Give the graph time to pick the new resource up (a CRD event rediscovers at once).
    tokio::time::sleep(Duration::from_secs(3)).await;
    widgets
        .delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    for name in ["part-0", "part-1", "part-2"] {
        eventually(&format!("{name} collected"), COLLECTED_WITHIN, || {
            let widgets = widgets.clone();
            async move { !exists(&widgets, name).await }
        })
        .await;
    }
    eventually("widget-config collected", COLLECTED_WITHIN, || {
        let cms = cms.clone();
        async move { !exists(&cms, "widget-config").await }
    })
    .await;
    crds.delete(&format!("widgets.{group}"), &DeleteParams::default())
        .await
        .unwrap();
    stack.stop().await;
}

async fn create_widget(
    api: &Api<DynamicObject>,
    resource: &ApiResource,
    name: &str,
    owners: Value,
) -> String {
    let mut widget = DynamicObject::new(name, resource);
    widget.metadata.owner_references = serde_json::from_value(owners).ok();
    widget.data = json!({"spec": {"size": 1}});
    api.create(&PostParams::default(), &widget)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap()
}

#[tokio::test]
async fn a_cascade_goes_on_when_its_reconciler_is_killed_midway() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "gc-kill")
        .await
        .unwrap();
    let mut stack = Stack::start(plane, &[ns.name()]).await;
    // The in-process reconciler leaves; a process that can be killed takes its place.
    stack.reconciler.take().unwrap().stop().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    let owner = create_cm(&cms, "owner", json!([])).await;
    const DEPENDENTS: usize = 300;
    for i in 0..DEPENDENTS {
        let refs = json!([owner_ref("v1", "ConfigMap", "owner", &owner, false)]);
        create_cm(&cms, &format!("dep-{i}"), refs).await;
    }
    let left = |cms: Api<ConfigMap>| async move {
        cms.list_metadata(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|cm| {
                cm.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("dep-"))
            })
            .count()
    };
    let args = [
        format!("--kubeconfig={}", plane.kubeconfig().display()),
        format!("--queue-addr={}", stack.queue.grpc()),
        format!("--watcher-addr={}", stack.watcher.grpc()),
        // Slow enough that the kill lands mid-cascade.
        "--kube-api-qps=20".to_owned(),
        "--kube-api-burst=1".to_owned(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_switchyard-reconciler"));
    let mut first = ServiceProcess::start(binary, &args, &[]).await.unwrap();
    first.wait_ready().await.unwrap();
    cms.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    eventually("the cascade started", COLLECTED_WITHIN, || {
        let cms = cms.clone();
        async move { left(cms).await < DEPENDENTS }
    })
    .await;
    first.kill();
    let at_kill = left(cms.clone()).await;
    assert!(at_kill > 0, "the cascade finished before the kill");
    eprintln!("reconciler killed with {at_kill} of {DEPENDENTS} dependents left");
    // Its leases expire (the queue's lease timeout) or its stream's end returns them.
    let mut second = ServiceProcess::start(binary, &args, &[]).await.unwrap();
    second.wait_ready().await.unwrap();
    eventually(
        "every dependent collected after the restart",
        Duration::from_secs(120),
        || {
            let cms = cms.clone();
            async move { left(cms).await == 0 }
        },
    )
    .await;
    second.terminate().await.unwrap();
    stack.stop().await;
}
