//! The garbage collector end to end, against the real control plane with no
//! kube-controller-manager at all: a queue, a watcher keeping the graph, and a reconciler
//! running every built-in controller, in this process.
//!
//! One namespace pair per test; the watcher admits only those namespaces (and cluster-scoped
//! objects), so tests running side by side do not see each other's objects.

#![allow(clippy::unwrap_used)]

mod gc_scenarios;
mod support;

use std::time::Duration;

use gc_scenarios::{
    Background, COLLECTED_WITHIN, Circle, Foreground, Orphaned, Stack, StaleReferences, create_cm,
    eventually, exists, owner_ref,
};
use serde_json::{Value, json};
use switchyard_k8s::{
    Api, DeleteParams, ListParams, PostParams,
    k8s_openapi::{
        api::core::v1::ConfigMap,
        apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    },
    kube::api::{ApiResource, DynamicObject, GroupVersionKind},
};
use switchyard_testenv::{ControlPlane, InProcess, ServiceProcess, TestNamespace};

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
    let seen = gc_scenarios::background(&client, ns.name(), other.name()).await;
    assert_eq!(seen, Background::expected());
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
    assert_eq!(
        gc_scenarios::foreground(&client, ns.name()).await,
        Foreground::expected()
    );
    assert_eq!(
        gc_scenarios::orphan(&client, ns.name()).await,
        Orphaned::expected()
    );
    stack.stop().await;
}

#[tokio::test]
async fn a_dependent_that_dropped_its_owner_is_kept_however_stale_the_graph() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "gc-stale")
        .await
        .unwrap();
    let flood = TestNamespace::create(plane, &client, "gc-stale-flood")
        .await
        .unwrap();
    let stack = Stack::start(plane, &[ns.name()]).await;
    // The dependents' events wait in the watcher: its graph still has each reference when
    // the owner's deletion keys the dependent.
    let seen = gc_scenarios::stale_references(&client, ns.name(), flood.name(), || {
        switchyard_watcher::graph::hold::events("", "configmaps", ns.name())
    })
    .await;
    assert_eq!(seen, StaleReferences::expected());
    stack.stop().await;
}

#[tokio::test]
async fn a_dependency_circle_deleted_in_the_foreground_is_collected() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "gc-circle")
        .await
        .unwrap();
    let stack = Stack::start(plane, &[ns.name()]).await;
    assert_eq!(
        gc_scenarios::circle(&client, ns.name()).await,
        Circle::expected()
    );
    stack.stop().await;
}

#[tokio::test]
async fn custom_resources_of_a_crd_created_while_running_are_collected_in_every_mode() {
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
    let before = graph_resources(&stack.watcher).await;
    crds.create(&PostParams::default(), &crd).await.unwrap();
    // Picked up without a restart: a CRD event rediscovers at once.
    eventually("the new resource watched", COLLECTED_WITHIN, || async {
        graph_resources(&stack.watcher).await > before
    })
    .await;
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

    // Foreground: a custom resource owner waits for its blocking custom dependent.
    let api_version = format!("{group}/v1");
    let front = create_widget(&widgets, &resource, "front", json!([])).await;
    let blocking = json!([owner_ref(&api_version, "Widget", "front", &front, true)]);
    create_widget(&widgets, &resource, "front-part", blocking).await;
    widgets
        .delete("front", &DeleteParams::foreground())
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + COLLECTED_WITHIN;
    while exists(&widgets, "front").await {
        assert!(std::time::Instant::now() < deadline, "front not deleted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !exists(&widgets, "front-part").await,
        "the owner went before its blocking dependent"
    );

    // Orphan: the owner goes, its custom dependent stays without the reference.
    let keep = create_widget(&widgets, &resource, "keep", json!([])).await;
    let refs = json!([owner_ref(&api_version, "Widget", "keep", &keep, true)]);
    create_widget(&widgets, &resource, "kept-part", refs).await;
    widgets
        .delete("keep", &DeleteParams::orphan())
        .await
        .unwrap();
    eventually("keep deleted", COLLECTED_WITHIN, || {
        let widgets = widgets.clone();
        async move { !exists(&widgets, "keep").await }
    })
    .await;
    let kept = widgets.get("kept-part").await.unwrap();
    assert!(
        kept.metadata
            .owner_references
            .unwrap_or_default()
            .is_empty(),
        "the orphaned dependent still references its owner"
    );
    crds.delete(&format!("widgets.{group}"), &DeleteParams::default())
        .await
        .unwrap();
    // And dropped without a restart once the apiserver no longer serves it.
    eventually(
        "the resource no longer watched",
        COLLECTED_WITHIN,
        || async { graph_resources(&stack.watcher).await == before },
    )
    .await;
    stack.stop().await;
}

async fn graph_resources(watcher: &InProcess) -> f64 {
    watcher.metric("switchyard_watcher_graph_resources").await
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
