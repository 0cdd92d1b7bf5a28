//! The garbage collector's scenarios, run by `gc.rs` under Switchyard and by `gc_kcm.rs`
//! under kube-controller-manager and Switchyard in turn. Each sets up its objects, makes its
//! deletions, waits until the expected end state is reached (or its time is up) and returns
//! what it saw, so that both collectors' results can be compared as values.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard_k8s::{
    Api, Client, DeleteParams, Deployment, ListParams, Pod, PostParams, ReplicaSet,
    k8s_openapi::api::{
        core::v1::{ConfigMap, PodTemplate},
        events::v1::Event,
        rbac::v1::ClusterRole,
    },
    kube::api::{Patch, PatchParams},
};
use switchyard_reconciler_core::replicaset::{controller_of, is_active};
use switchyard_testenv::{ControlPlane, InProcess, manifests};

use crate::support::{self, DEPLOY, RS, WITHIN};

/// How long a collector may take to reach a scenario's end state.
pub const COLLECTED_WITHIN: Duration = Duration::from_secs(30);

pub fn owner_ref(api_version: &str, kind: &str, name: &str, uid: &str, block: bool) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid,
           "blockOwnerDeletion": block})
}

pub async fn create_cm(api: &Api<ConfigMap>, name: &str, owners: Value) -> String {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name, "ownerReferences": owners},
        "data": {"k": "v"},
    }))
    .unwrap();
    api.create(&PostParams::default(), &cm)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap()
}

/// Polls `check` every 100 ms until it holds; false when `within` passed first.
pub async fn settles<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls like [`settles`]; panics naming `what` when it does not.
pub async fn eventually<F, Fut>(what: &str, within: Duration, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    assert!(
        settles(within, check).await,
        "{what}: not within {within:?}"
    );
}

pub async fn exists<K>(api: &Api<K>, name: &str) -> bool
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + switchyard_k8s::kube::Resource,
{
    api.get_metadata_opt(name).await.unwrap().is_some()
}

async fn names<K>(api: &Api<K>, labels: &str) -> Vec<String>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + switchyard_k8s::kube::Resource,
{
    let mut names: Vec<String> = api
        .list_metadata(&ListParams::default().labels(labels))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    names.sort();
    names
}

/// A queue, a watcher with the graph and the workload rules for `namespaces`, and a
/// reconciler with every built-in controller.
pub struct Stack {
    pub queue: InProcess,
    pub watcher: InProcess,
    pub reconciler: Option<InProcess>,
}

impl Stack {
    pub async fn start(plane: &ControlPlane, namespaces: &[&str]) -> Self {
        Self::start_with(plane, namespaces, None).await
    }

    /// As [`Stack::start`], the reconciler with these flags besides.
    /// [`Stack::start`], each controller acting as its own service account in
    /// `service_accounts` when given (`--controller-service-accounts`).
    pub async fn start_with(
        plane: &ControlPlane,
        namespaces: &[&str],
        service_accounts: Option<&str>,
    ) -> Self {
        let queue = support::queue(switchyard_reconciler::BUILTIN, &[]).await;
        let config = support::watcher_config(namespaces, "garbageCollector: {}\n");
        let watcher = support::watcher(plane, &config, queue.grpc()).await;
        watcher.wait_ready(Duration::from_secs(60)).await;
        let mut stack = Self {
            queue,
            watcher,
            reconciler: None,
        };
        stack.start_reconciler_with(plane, service_accounts).await;
        stack
    }

    pub async fn start_reconciler(&mut self, plane: &ControlPlane) {
        self.start_reconciler_with(plane, None).await;
    }

    async fn start_reconciler_with(
        &mut self,
        plane: &ControlPlane,
        service_accounts: Option<&str>,
    ) {
        let mut registry = support::builtins(&[RS, DEPLOY, switchyard_reconciler::gc::NAME]);
        if let Some(namespace) = service_accounts {
            switchyard_reconciler::acting_as_service_accounts(&mut registry, namespace);
        }
        let reconciler =
            support::reconciler(plane, registry, self.queue.grpc(), self.watcher.grpc(), &[]).await;
        reconciler.wait_ready(WITHIN).await;
        self.reconciler = Some(reconciler);
    }

    pub async fn stop(self) {
        if let Some(reconciler) = self.reconciler {
            reconciler.stop().await;
        }
        self.watcher.stop().await;
        self.queue.stop().await;
    }
}

/// What the background scenario ends with.
#[derive(Debug, PartialEq, Eq)]
pub struct Background {
    /// The scenario's ConfigMaps left in the first namespace.
    pub remaining: Vec<String>,
    /// And in the second.
    pub other_remaining: Vec<String>,
    /// The owners the dependent with two owners keeps.
    pub shared_owners: Vec<String>,
    /// An `OwnerRefInvalidNamespace` warning about the cross-namespace dependent.
    pub invalid_namespace_event: bool,
}

impl Background {
    pub fn expected() -> Self {
        Self {
            remaining: vec!["keeper".into(), "shared".into(), "unknown-kind".into()],
            other_remaining: vec![],
            shared_owners: vec!["keeper".into()],
            invalid_namespace_event: true,
        }
    }
}

/// Background deletion, dangling references, a cluster-scoped owner, a reference across
/// namespaces and one to a kind that does not exist.
pub async fn background(client: &Client, ns: &str, other: &str) -> Background {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let other_cms: Api<ConfigMap> = Api::namespaced(client.clone(), other);
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
    let ghost = "00000000-0000-0000-0000-000000000001";
    create_cm(
        &cms,
        "dangling",
        json!([owner_ref("v1", "ConfigMap", "ghost", ghost, false)]),
    )
    .await;
    let nothing = "00000000-0000-0000-0000-000000000002";
    create_cm(
        &cms,
        "unknown-kind",
        json!([owner_ref(
            "nothing.example.com/v1",
            "Nothing",
            "n",
            nothing,
            false
        )]),
    )
    .await;
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let role_name = format!("{ns}-owner");
    let role: ClusterRole =
        serde_json::from_value(json!({"metadata": {"name": role_name}})).unwrap();
    let role_uid = roles
        .create(&PostParams::default(), &role)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let rbac = "rbac.authorization.k8s.io/v1";
    create_cm(
        &cms,
        "of-cluster-owner",
        json!([owner_ref(rbac, "ClusterRole", &role_name, &role_uid, false)]),
    )
    .await;
    create_cm(
        &other_cms,
        "cross-namespace",
        json!([owner_ref("v1", "ConfigMap", "keeper", &keeper, false)]),
    )
    .await;
    // What resolves at once: the dangling and the cross-namespace references.
    settles(COLLECTED_WITHIN, || {
        let (cms, other_cms) = (cms.clone(), other_cms.clone());
        async move { !exists(&cms, "dangling").await && !exists(&other_cms, "cross-namespace").await }
    })
    .await;
    for name in ["dep-0", "dep-1", "dep-2", "shared", "of-cluster-owner"] {
        assert!(
            exists(&cms, name).await,
            "{name} was collected while its owner lived"
        );
    }
    cms.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    roles
        .delete(&role_name, &DeleteParams::default())
        .await
        .unwrap();
    let expected = Background::expected();
    settles(COLLECTED_WITHIN, || {
        let cms = cms.clone();
        let want = expected.remaining.clone();
        async move {
            let left = names(&cms, "").await;
            let shared = cms.get("shared").await.unwrap();
            left == want && shared.metadata.owner_references.unwrap_or_default().len() == 1
        }
    })
    .await;
    let events: Api<Event> = Api::namespaced(client.clone(), other);
    let invalid_namespace_event = settles(COLLECTED_WITHIN, || {
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
    })
    .await;
    let mut shared_owners: Vec<String> = cms
        .get("shared")
        .await
        .unwrap()
        .metadata
        .owner_references
        .unwrap_or_default()
        .into_iter()
        .map(|o| o.name)
        .collect();
    shared_owners.sort();
    Background {
        remaining: names(&cms, "").await,
        other_remaining: names(&other_cms, "").await,
        shared_owners,
        invalid_namespace_event,
    }
}

/// What the foreground scenario ends with.
#[derive(Debug, PartialEq, Eq)]
pub struct Foreground {
    /// The Deployment was seen waiting with the `foregroundDeletion` finalizer.
    pub waited: bool,
    /// When the Deployment went, no ReplicaSet or Pod of it was left.
    pub dependents_went_first: bool,
    /// Everything is gone in the end.
    pub all_gone: bool,
}

impl Foreground {
    pub fn expected() -> Self {
        Self {
            waited: true,
            dependents_went_first: true,
            all_gone: true,
        }
    }
}

/// Deployment -> ReplicaSet -> Pods, deleted in the foreground.
pub async fn foreground(client: &Client, ns: &str) -> Foreground {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    deployments
        .create(
            &PostParams::default(),
            &manifests::deployment("web", 3, Value::Null),
        )
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
    let mut outcome = Foreground {
        waited: false,
        dependents_went_first: false,
        all_gone: false,
    };
    let deadline = Instant::now() + COLLECTED_WITHIN;
    while Instant::now() < deadline {
        let deployment = deployments.get_metadata_opt("web").await.unwrap();
        let sets = names(&replica_sets, "").await.len();
        let left = names(&pods, "app=web").await.len();
        match deployment {
            Some(d) => {
                let finalizers = d.metadata.finalizers.unwrap_or_default();
                outcome.waited |= finalizers.iter().any(|f| f == "foregroundDeletion");
            }
            None => {
                outcome.dependents_went_first = (sets, left) == (0, 0);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    outcome.all_gone = settles(COLLECTED_WITHIN, || {
        let (d, r, p) = (deployments.clone(), replica_sets.clone(), pods.clone());
        async move {
            !exists(&d, "web").await
                && names(&r, "").await.is_empty()
                && names(&p, "").await.is_empty()
        }
    })
    .await;
    outcome
}

/// What the orphan scenario ends with.
#[derive(Debug, PartialEq, Eq)]
pub struct Orphaned {
    pub owner_gone: bool,
    /// Pods left after the owner went.
    pub pods_kept: usize,
    /// None of them references the deleted owner.
    pub references_dropped: bool,
    /// A new ReplicaSet with the same selector adopted those very Pods.
    pub adopted_the_same_pods: bool,
}

impl Orphaned {
    pub fn expected() -> Self {
        Self {
            owner_gone: true,
            pods_kept: 2,
            references_dropped: true,
            adopted_the_same_pods: true,
        }
    }
}

/// A ReplicaSet deleted with `propagationPolicy: Orphan`, then a new one adopting its Pods.
pub async fn orphan(client: &Client, ns: &str) -> Orphaned {
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let rs = |name: &str| -> ReplicaSet {
        let mut value = manifests::workload("ReplicaSet", name, 2, Value::Null);
        value["spec"]["selector"] = json!({"matchLabels": {"app": "lone"}});
        value["spec"]["template"]["metadata"]["labels"] = json!({"app": "lone"});
        serde_json::from_value(value).unwrap()
    };
    replica_sets
        .create(&PostParams::default(), &rs("lone"))
        .await
        .unwrap();
    eventually("lone's Pods", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move { active(&pods, "app=lone").await == 2 }
    })
    .await;
    let before = names(&pods, "app=lone").await;
    replica_sets
        .delete("lone", &DeleteParams::orphan())
        .await
        .unwrap();
    let owner_gone = settles(COLLECTED_WITHIN, || {
        let api = replica_sets.clone();
        async move { !exists(&api, "lone").await }
    })
    .await;
    let orphans = pods
        .list(&ListParams::default().labels("app=lone"))
        .await
        .unwrap()
        .items;
    let references_dropped = orphans.iter().all(|p| {
        p.metadata
            .owner_references
            .clone()
            .unwrap_or_default()
            .is_empty()
    });
    let pods_kept = orphans.len();
    replica_sets
        .create(&PostParams::default(), &rs("adopter"))
        .await
        .unwrap();
    let uid = replica_sets
        .get("adopter")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let adopted = settles(COLLECTED_WITHIN, || {
        let pods = pods.clone();
        let uid = uid.clone();
        async move {
            let list = pods
                .list(&ListParams::default().labels("app=lone"))
                .await
                .unwrap()
                .items;
            list.iter().filter(|p| is_active(p)).count() == 2
                && list
                    .iter()
                    .filter(|p| is_active(p))
                    .all(|p| controller_of(p).is_some_and(|o| o.uid == uid))
        }
    })
    .await;
    Orphaned {
        owner_gone,
        pods_kept,
        references_dropped,
        adopted_the_same_pods: adopted && names(&pods, "app=lone").await == before,
    }
}

pub async fn active(pods: &Api<Pod>, labels: &str) -> usize {
    pods.list(&ListParams::default().labels(labels))
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| is_active(p))
        .count()
}

/// Owner and dependent pairs whose reference is removed before the owner goes.
pub const STALE_PAIRS: usize = 60;
/// Pairs whose dependent keeps its reference: collected, so the collector was at work.
pub const CONTROL_PAIRS: usize = 10;
/// ConfigMaps written in another namespace meanwhile: a busy watch stream, as in a real
/// cluster where one kind's events lag behind another's.
pub const FLOOD: usize = 600;

/// What the stale-references scenario ends with.
#[derive(Debug, PartialEq, Eq)]
pub struct StaleReferences {
    /// Dependents that dropped their owner reference before the owner went, left at the end.
    pub kept: usize,
    /// Dependents that kept their reference, left at the end.
    pub controls_left: usize,
}

impl StaleReferences {
    pub fn expected() -> Self {
        Self {
            kept: STALE_PAIRS,
            controls_left: 0,
        }
    }
}

/// ConfigMaps owned by PodTemplates: each of the first [`STALE_PAIRS`] loses its reference,
/// then its owner is deleted; the owners of [`CONTROL_PAIRS`] more are deleted with the
/// references in place; [`FLOOD`] ConfigMaps are written to `flood_ns` meanwhile. No collector
/// may delete a dependent that no longer names its owner, whatever its cache still says.
/// `hold` is called once everything is in place and before the changes, and what it returns
/// lives until the controls are collected: under Switchyard, a hold on the dependents' watch
/// events in the watcher, so that its graph is stale for as long as it takes.
pub async fn stale_references<H>(
    client: &Client,
    ns: &str,
    flood_ns: &str,
    hold: impl FnOnce() -> H,
) -> StaleReferences {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let templates: Api<PodTemplate> = Api::namespaced(client.clone(), ns);
    let pairs = STALE_PAIRS + CONTROL_PAIRS;
    let mut owners = Vec::with_capacity(pairs);
    for i in 0..pairs {
        let template: PodTemplate = serde_json::from_value(json!({
            "metadata": {"name": format!("owner-{i}")},
            "template": {"spec": {"containers": [{"name": "c", "image": manifests::IMAGE}]}},
        }))
        .unwrap();
        let uid = templates
            .create(&PostParams::default(), &template)
            .await
            .unwrap()
            .metadata
            .uid
            .unwrap();
        let refs = json!([owner_ref(
            "v1",
            "PodTemplate",
            &format!("owner-{i}"),
            &uid,
            false
        )]);
        create_cm(&cms, &format!("dep-{i}"), refs).await;
        owners.push(format!("owner-{i}"));
    }
    // The collector's cache has every pair before the changes start.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = hold();
    let flood = {
        let flood_cms: Api<ConfigMap> = Api::namespaced(client.clone(), flood_ns);
        tokio::spawn(async move {
            for i in 0..FLOOD {
                create_cm(&flood_cms, &format!("flood-{i}"), json!([])).await;
            }
        })
    };
    let unowned = json!({"metadata": {"ownerReferences": null}});
    for (i, owner) in owners[..STALE_PAIRS].iter().enumerate() {
        cms.patch(
            &format!("dep-{i}"),
            &PatchParams::default(),
            &Patch::Merge(&unowned),
        )
        .await
        .unwrap();
        templates
            .delete(owner, &DeleteParams::background())
            .await
            .unwrap();
    }
    for owner in &owners[STALE_PAIRS..] {
        templates
            .delete(owner, &DeleteParams::background())
            .await
            .unwrap();
    }
    let controls: Vec<String> = (STALE_PAIRS..pairs).map(|i| format!("dep-{i}")).collect();
    // The controls' keys followed the others': once they are collected, so were any of the
    // others the collector would take.
    settles(COLLECTED_WITHIN, || {
        let (cms, controls) = (cms.clone(), controls.clone());
        async move {
            let left = names(&cms, "").await;
            !controls.iter().any(|c| left.contains(c))
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(held);
    flood.await.unwrap();
    // And nothing is taken once the cache catches up.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let left = names(&cms, "").await;
    StaleReferences {
        kept: (0..STALE_PAIRS)
            .filter(|i| left.contains(&format!("dep-{i}")))
            .count(),
        controls_left: controls.iter().filter(|c| left.contains(c)).count(),
    }
}

/// What the dependency-circle scenario ends with.
#[derive(Debug, PartialEq, Eq)]
pub struct Circle {
    /// The circle's Pods left when the collector's time was up.
    pub remaining: Vec<String>,
}

impl Circle {
    pub fn expected() -> Self {
        Self { remaining: vec![] }
    }
}

/// Kubernetes' `[Conformance]` garbage collector spec "should not be blocked by dependency
/// circle": three Pods own each other in a circle (pod1 ← pod2 ← pod3 ← pod1), every
/// reference with `blockOwnerDeletion`, and pod1 is deleted in the foreground.
pub async fn circle(client: &Client, ns: &str) -> Circle {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = |name: &str, owners: Value| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"circle": "yes"}, "ownerReferences": owners},
            "spec": {"containers": [{"name": "c", "image": manifests::IMAGE}]},
        }))
        .unwrap()
    };
    let create = |name: &'static str, owners: Value| {
        let pods = pods.clone();
        let pod = pod(name, owners);
        async move {
            pods.create(&PostParams::default(), &pod)
                .await
                .unwrap()
                .metadata
                .uid
                .unwrap()
        }
    };
    let pod1 = create("pod1", json!([])).await;
    let pod2 = create("pod2", json!([owner_ref("v1", "Pod", "pod1", &pod1, true)])).await;
    let pod3 = create("pod3", json!([owner_ref("v1", "Pod", "pod2", &pod2, true)])).await;
    let closing =
        json!({"metadata": {"ownerReferences": [owner_ref("v1", "Pod", "pod3", &pod3, true)]}});
    pods.patch("pod1", &PatchParams::default(), &Patch::Merge(&closing))
        .await
        .unwrap();
    pods.delete("pod1", &DeleteParams::foreground())
        .await
        .unwrap();
    settles(COLLECTED_WITHIN, || {
        let pods = pods.clone();
        async move { names(&pods, "circle=yes").await.is_empty() }
    })
    .await;
    Circle {
        remaining: names(&pods, "circle=yes").await,
    }
}
