//! Watch events become the right keys at a real queue; the Cache API answers from the cache.
//! Against the harness's real control plane.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use clap::Parser;
use switchyard_k8s::{
    Api, DeleteParams, ListParams, Pod, PostParams, ReplicaSet,
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    kube::{
        Resource,
        api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams},
    },
};
use switchyard_proto::{
    common::v1::GroupVersionKind as ProtoGvk,
    watcher::v1::{Freshness, GetRequest, ListRequest, cache_client::CacheClient},
};
use switchyard_runtime::Role;
use switchyard_testenv::{ControlPlane, Pki, TestNamespace};
use tonic::Code;

use support::*;

#[tokio::test]
async fn typed_changes_become_replicaset_keys() {
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watch-typed")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let queue = queue(&[RS], &[]).await;
    let mut worker = Worker::start(queue.grpc()).await;
    let watcher = watcher(
        plane,
        &rs_config(&ns, false),
        &format!("--queue-addr={}", queue.grpc()),
    )
    .await;
    watcher.wait_ready(WITHIN).await;

    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let web = sets
        .create(&PostParams::default(), &replica_set("web", 0))
        .await
        .unwrap();
    let web_key = key(RS, &ns, "web");
    worker.expect(&web_key, WITHIN).await;

    let uid = web.meta().uid.clone().unwrap();
    // A Pod owned by another kind, or with no controller owner that no ReplicaSet's selector
    // matches, maps to nothing. (Before any owned Pod exists: an owned Pod's every change,
    // scheduling and readiness included, keys its ReplicaSet, as in kube-controller-manager.)
    let pods_added = r#"switchyard_watch_events_total{resource="v1/Pod",event="added"}"#;
    let before = watcher.metric(pods_added).await;
    pods.create(
        &PostParams::default(),
        &pod("stray", &[("app", "other")], None),
    )
    .await
    .unwrap();
    let foreign = Some((
        "StatefulSet",
        "apps/v1",
        "db",
        "7d6f2c1e-0000-4000-8000-000000000001",
    ));
    pods.create(
        &PostParams::default(),
        &pod("foreign", &[("app", "web")], foreign),
    )
    .await
    .unwrap();
    let start = std::time::Instant::now();
    while watcher.metric(pods_added).await < before + 2.0 {
        assert!(start.elapsed() < WITHIN, "the watcher did not see the pods");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let leased = worker.leased_during(Duration::from_millis(700)).await;
    assert!(
        leased.is_empty(),
        "pods without a ReplicaSet controller made keys: {leased:?}"
    );
    // An orphan the ReplicaSet's selector matches keys it, to be adopted.
    pods.create(
        &PostParams::default(),
        &pod("orphan", &[("app", "web")], None),
    )
    .await
    .unwrap();
    worker.expect(&web_key, WITHIN).await;

    // A spec change (generation) maps; a status-only change is filtered by the predicate.
    sets.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 2}})),
    )
    .await
    .unwrap();
    worker.expect(&web_key, WITHIN).await;
    let status_before = watcher
        .metric(r#"switchyard_watch_events_total{resource="apps/v1/ReplicaSet",event="modified"}"#)
        .await;
    sets.patch_status(
        "web",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"replicas": 0, "observedGeneration": 2}})),
    )
    .await
    .unwrap();
    let start = std::time::Instant::now();
    while watcher
        .metric(r#"switchyard_watch_events_total{resource="apps/v1/ReplicaSet",event="modified"}"#)
        .await
        < status_before + 1.0
    {
        assert!(
            start.elapsed() < WITHIN,
            "the watcher did not see the status change"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let leased = worker.leased_during(Duration::from_millis(700)).await;
    assert!(
        leased.is_empty(),
        "a status-only change passed generationChanged: {leased:?}"
    );

    // A Pod change maps to its controller ReplicaSet.
    let owner = Some(("ReplicaSet", "apps/v1", "web", uid.as_str()));
    pods.create(
        &PostParams::default(),
        &pod("owned", &[("app", "web")], owner),
    )
    .await
    .unwrap();
    worker.expect(&web_key, WITHIN).await;

    // Deletion maps too.
    sets.delete("web", &DeleteParams::default()).await.unwrap();
    worker.expect(&web_key, WITHIN).await;

    watcher.stop().await;
    queue.stop().await;
}

#[tokio::test]
async fn owned_changes_within_the_batch_period_are_one_delayed_key() {
    const PERIOD: Duration = Duration::from_secs(2);
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watch-batch")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let queue = queue(&[RS], &[]).await;
    let mut worker = Worker::start(queue.grpc()).await;
    let config = rs_config(&ns, false).replace("kind: Pod}", "kind: Pod, batchPeriod: 2s}");
    assert!(config.contains("batchPeriod"), "{config}");
    let watcher = watcher(plane, &config, &format!("--queue-addr={}", queue.grpc())).await;
    watcher.wait_ready(WITHIN).await;

    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let web = sets
        .create(&PostParams::default(), &replica_set("web", 0))
        .await
        .unwrap();
    let web_key = key(RS, &ns, "web");
    worker.expect(&web_key, WITHIN).await;

    // Three Pods no scheduler picks up (so no later status change keys again): their
    // creations are one key, ready a batch period after the first.
    let uid = web.meta().uid.clone().unwrap();
    let owner = Some(("ReplicaSet", "apps/v1", "web", uid.as_str()));
    let start = std::time::Instant::now();
    for name in ["a", "b", "c"] {
        let mut pod = pod(name, &[], owner);
        pod.spec.as_mut().unwrap().scheduler_name = Some("switchyard-test-nobody".into());
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let created = start.elapsed();
    assert!(
        created < PERIOD / 2,
        "creating three Pods took {created:?}: too slow to show them batched"
    );
    worker.expect(&web_key, WITHIN).await;
    let leased = start.elapsed();
    assert!(
        leased >= PERIOD,
        "the key was leased {leased:?} after the first Pod, inside the batch period"
    );
    let again = worker.leased_during(PERIOD + created).await;
    assert!(
        again.is_empty(),
        "the Pods created {created:?} apart were more than one key: {again:?}"
    );

    watcher.stop().await;
    queue.stop().await;
}

#[tokio::test]
async fn a_field_predicate_keys_only_updates_that_change_its_field() {
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watch-field")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let queue = queue(&[RS], &[]).await;
    let mut worker = Worker::start(queue.grpc()).await;
    let config = rs_config(&ns, false).replace(
        "predicates: [generationChanged, labelsChanged]",
        "predicates: [{fieldChanged: /metadata/annotations/example.com~1phase}]",
    );
    assert!(config.contains("fieldChanged"), "{config}");
    let watcher = watcher(plane, &config, &format!("--queue-addr={}", queue.grpc())).await;
    watcher.wait_ready(WITHIN).await;

    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    sets.create(&PostParams::default(), &replica_set("web", 0))
        .await
        .unwrap();
    let web = key(RS, &ns, "web");
    worker.expect(&web, WITHIN).await;
    let annotate =
        |name: &str, value: &str| serde_json::json!({"metadata": {"annotations": {name: value}}});
    // Another annotation, then the spec: neither is the field.
    sets.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(annotate("example.com/other", "x")),
    )
    .await
    .unwrap();
    sets.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 1}})),
    )
    .await
    .unwrap();
    let leased = worker.leased_during(Duration::from_secs(1)).await;
    assert!(
        leased.is_empty(),
        "keyed without the field changing: {leased:?}"
    );
    // The field set, then changed: keyed each time.
    for phase in ["a", "b"] {
        sets.patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(annotate("example.com/phase", phase)),
        )
        .await
        .unwrap();
        worker.expect(&web, WITHIN).await;
    }

    watcher.stop().await;
    queue.stop().await;
}

fn widget_crd() -> CustomResourceDefinition {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn a_crd_created_while_running_is_watched() {
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watch-crd")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let queue = queue(&[WIDGET], &[]).await;
    let mut worker = Worker::start(queue.grpc()).await;
    let config = format!(
        r#"
shardCount: {SHARDS}
namespaces: {{include: [{ns}]}}
controllers:
  - name: {WIDGET}
    for: {{apiVersion: example.com/v1, kind: Widget}}
    mapByLabel:
      - {{apiVersion: v1, kind: ConfigMap, label: example.com/widget}}
"#
    );
    let watcher = watcher(plane, &config, &format!("--queue-addr={}", queue.grpc())).await;
    // ConfigMaps list at once; Widgets are not served yet, so the watcher is not ready.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!watcher.is_ready().await, "ready before the Widget list");
    assert!(
        watcher
            .admin_get("/readyz")
            .await
            .1
            .contains("initial-lists")
    );

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &widget_crd())
        .await
        .unwrap();
    watcher.wait_ready(Duration::from_secs(60)).await;

    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"));
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
    let mut widget = DynamicObject::new("w1", &resource);
    widget.data = serde_json::json!({"spec": {"size": 1}});
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
    let w1 = key(WIDGET, &ns, "w1");
    worker.expect(&w1, WITHIN).await;

    // A ConfigMap labelled with a Widget's name maps to that Widget.
    let maps: Api<switchyard_k8s::k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), &ns);
    let cm = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "labels": {"example.com/widget": "w1"}},
        "data": {"a": "1"}
    }))
    .unwrap();
    maps.create(&PostParams::default(), &cm).await.unwrap();
    worker.expect(&w1, WITHIN).await;

    widgets
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap();
    worker.expect(&w1, WITHIN).await;

    watcher.stop().await;
    queue.stop().await;
}

fn gvk(group: &str, version: &str, kind: &str) -> Option<ProtoGvk> {
    Some(ProtoGvk {
        group: group.into(),
        version: version.into(),
        kind: kind.into(),
    })
}

async fn list_names(
    cache: &mut CacheClient<tonic::transport::Channel>,
    request: ListRequest,
) -> Vec<String> {
    let either = request.either;
    let mut stream = cache.list(request).await.unwrap().into_inner();
    let mut names = Vec::new();
    while let Some(chunk) = stream.message().await.unwrap() {
        assert_eq!(
            chunk.either, either,
            "the answer acknowledges `either` as asked"
        );
        for json in chunk.objects_json {
            let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
            names.push(value["metadata"]["name"].as_str().unwrap().to_owned());
        }
    }
    names.sort();
    names
}

#[tokio::test]
async fn the_cache_answers_owner_label_and_fresh_reads() {
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watch-cache")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let queue = queue(&[RS], &[]).await;
    let watcher = watcher(
        plane,
        &rs_config(&ns, true),
        &format!("--queue-addr={}", queue.grpc()),
    )
    .await;
    watcher.wait_ready(WITHIN).await;
    let mut cache = cache_client(watcher.grpc()).await;

    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let a = sets
        .create(&PostParams::default(), &replica_set("a", 0))
        .await
        .unwrap();
    let b = sets
        .create(&PostParams::default(), &replica_set("b", 0))
        .await
        .unwrap();
    let (a_uid, b_uid) = (a.meta().uid.clone().unwrap(), b.meta().uid.clone().unwrap());
    let owned_by =
        |name: &'static str, uid: &str| Some(("ReplicaSet", "apps/v1", name, uid.to_owned()));
    for (name, labels, owner) in [
        (
            "a-1",
            vec![("app", "a"), ("tier", "x")],
            owned_by("a", &a_uid),
        ),
        (
            "a-2",
            vec![("app", "a"), ("tier", "x")],
            owned_by("a", &a_uid),
        ),
        ("b-1", vec![("app", "b")], owned_by("b", &b_uid)),
        ("lone", vec![("app", "a")], None),
    ] {
        let owner = owner.as_ref().map(|(k, v, n, u)| (*k, *v, *n, u.as_str()));
        pods.create(&PostParams::default(), &pod(name, &labels, owner))
            .await
            .unwrap();
    }
    // Read your own write: the last Pod's resourceVersion.
    let last = pods.get("lone").await.unwrap();
    let last_rv = last.meta().resource_version.clone().unwrap();
    let fresh = |rv: &str, wait_ms: u64| freshness(rv, "", wait_ms);
    let list = |label_selector: &str, controller_uid: &str| ListRequest {
        gvk: gvk("", "v1", "Pod"),
        namespace: ns.clone(),
        label_selector: label_selector.into(),
        controller_uid: controller_uid.into(),
        freshness: fresh(&last_rv, 900),
        either: false,
    };
    let either = |label_selector: &str, controller_uid: &str| ListRequest {
        either: true,
        ..list(label_selector, controller_uid)
    };
    assert_eq!(
        list_names(&mut cache, list("", &a_uid)).await,
        ["a-1", "a-2"]
    );
    assert_eq!(list_names(&mut cache, list("", &b_uid)).await, ["b-1"]);
    assert_eq!(
        list_names(&mut cache, list("app=a", "")).await,
        ["a-1", "a-2", "lone"]
    );
    assert_eq!(
        list_names(&mut cache, list("app=a,!tier", "")).await,
        ["lone"]
    );
    assert_eq!(
        list_names(&mut cache, list("tier in (x,y)", &a_uid)).await,
        ["a-1", "a-2"]
    );
    assert_eq!(
        list_names(&mut cache, list("app notin (a,b)", "")).await,
        Vec::<String>::new()
    );
    // The union of what an owner controls and what a selector matches, each once.
    assert_eq!(
        list_names(&mut cache, either("app=a,!tier", &b_uid)).await,
        ["b-1", "lone"]
    );
    assert_eq!(
        list_names(&mut cache, either("app=a", &a_uid)).await,
        ["a-1", "a-2", "lone"]
    );
    assert_eq!(
        list_names(&mut cache, either("app=none", &b_uid)).await,
        ["b-1"]
    );

    // Metadata-only Pods have no spec; ReplicaSets are cached whole.
    let get = |kind: ProtoGvk, name: &str, freshness| GetRequest {
        gvk: Some(kind),
        namespace: ns.clone(),
        name: name.into(),
        freshness,
    };
    let pod_gvk = gvk("", "v1", "Pod").unwrap();
    let got = cache
        .get(get(pod_gvk.clone(), "a-1", None))
        .await
        .unwrap()
        .into_inner();
    assert!(got.found);
    let value: serde_json::Value = serde_json::from_slice(&got.object_json).unwrap();
    assert_eq!(value["metadata"]["labels"]["app"], "a");
    assert!(
        value.get("spec").is_none(),
        "metadata-only pod has a spec: {value}"
    );
    assert!(value["metadata"].get("managedFields").is_none());
    let got = cache
        .get(get(gvk("apps", "v1", "ReplicaSet").unwrap(), "a", None))
        .await
        .unwrap()
        .into_inner();
    let value: serde_json::Value = serde_json::from_slice(&got.object_json).unwrap();
    assert_eq!(value["spec"]["selector"]["matchLabels"]["app"], "a");
    assert!(value["metadata"].get("managedFields").is_none());
    let missing = cache
        .get(get(pod_gvk.clone(), "nope", None))
        .await
        .unwrap()
        .into_inner();
    assert!(!missing.found);

    // A write, then a read that waits for it.
    let patched = pods
        .patch(
            "a-1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"v": "2"}}})),
        )
        .await
        .unwrap();
    let rv = patched.meta().resource_version.clone().unwrap();
    let got = cache
        .get(get(pod_gvk.clone(), "a-1", fresh(&rv, 900)))
        .await
        .unwrap()
        .into_inner();
    let value: serde_json::Value = serde_json::from_slice(&got.object_json).unwrap();
    assert_eq!(
        value["metadata"]["labels"]["v"], "2",
        "the cache returned the object before the write"
    );
    assert!(got.cache_resource_version.parse::<u64>().unwrap() >= rv.parse::<u64>().unwrap());

    // A resourceVersion the cache does not reach: bounded wait, then a clear error.
    let far = (rv.parse::<u64>().unwrap() + 1_000_000).to_string();
    let status = cache
        .get(get(pod_gvk.clone(), "a-1", fresh(&far, 200)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert!(status.message().contains(&far), "{}", status.message());

    // Bad requests name the problem.
    let status = cache
        .list(ListRequest {
            label_selector: "app in (a".into(),
            ..list("", "")
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().starts_with("label_selector: "),
        "{}",
        status.message()
    );
    // A kind neither the file nor a grant gives the caller is refused before anything else.
    let status = cache
        .get(get(gvk("", "v1", "Secret").unwrap(), "x", None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(
        status
            .message()
            .contains("v1/Secret is neither in the watcher's configuration nor granted"),
        "{}",
        status.message()
    );
    let status = cache
        .get(get(pod_gvk.clone(), "a-1", fresh("abc", 10)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("freshness.min_resource_version"));
    let status = cache.get(get(pod_gvk, "", None)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "name: required");

    watcher.stop().await;
    queue.stop().await;
}

/// A read at `own` (in the namespace read) and `kind` (over every namespace), waiting at
/// most `wait_ms`; an empty version asks for nothing.
fn freshness(own: &str, kind: &str, wait_ms: u64) -> Option<Freshness> {
    Some(Freshness {
        min_resource_version: own.to_owned(),
        max_wait: Some(prost_types::Duration {
            seconds: 0,
            nanos: (wait_ms * 1_000_000) as i32,
        }),
        kind_min_resource_version: kind.to_owned(),
    })
}

/// Two fresh namespaces, deleted when dropped.
async fn two_namespaces(
    plane: &ControlPlane,
    client: &switchyard_k8s::Client,
    prefix: &str,
) -> (TestNamespace, TestNamespace) {
    let (a, b) = (format!("{prefix}-a"), format!("{prefix}-b"));
    (
        TestNamespace::create(plane, client, &a).await.unwrap(),
        TestNamespace::create(plane, client, &b).await.unwrap(),
    )
}

/// A queue, and a ready watcher with one stream per namespace, `a` and `b`.
async fn watching_both(
    plane: &ControlPlane,
    a: &str,
    b: &str,
) -> (InProcess, InProcess, CacheClient<tonic::transport::Channel>) {
    let queue = queue(&[RS], &[]).await;
    let watcher = watcher(
        plane,
        &rs_config(&format!("{a}, {b}"), true),
        &format!("--queue-addr={}", queue.grpc()),
    )
    .await;
    watcher.wait_ready(WITHIN).await;
    let cache = cache_client(watcher.grpc()).await;
    (queue, watcher, cache)
}

/// With one stream per included namespace, a read waits for its own namespace's stream: a
/// version another namespace's stream reached says nothing about it.
#[tokio::test]
async fn a_read_of_one_of_several_namespaces_waits_for_that_namespaces_stream() {
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let namespaces = two_namespaces(plane, &client, "fence").await;
    let (a, b) = (
        namespaces.0.name().to_owned(),
        namespaces.1.name().to_owned(),
    );
    let (queue, watcher, mut cache) = watching_both(plane, &a, &b).await;

    // ReplicaSets of none, which nothing else here changes (a Pod would be scheduled).
    let created = |namespace: &str| {
        let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
        async move {
            let set = sets
                .create(&PostParams::default(), &replica_set("r", 0))
                .await
                .unwrap();
            set.meta().resource_version.clone().unwrap()
        }
    };
    let in_a = created(&a).await;
    let in_b = created(&b).await;
    assert!(in_b.parse::<u64>().unwrap() > in_a.parse::<u64>().unwrap());
    let get = |namespace: &str, freshness| GetRequest {
        gvk: gvk("apps", "v1", "ReplicaSet"),
        namespace: namespace.to_owned(),
        name: "r".into(),
        freshness,
    };

    // Each namespace's own write is read back from its own stream.
    for (namespace, rv) in [(&a, &in_a), (&b, &in_b)] {
        let got = cache
            .get(get(namespace, freshness(rv, "", 5_000)))
            .await
            .unwrap()
            .into_inner();
        assert!(got.found, "{namespace}");
    }
    // b's version is past everything a's stream carries: a read of a that asks for it
    // waits for a's stream, which does not reach it, and says so.
    let status = cache
        .get(get(&a, freshness(&in_b, "", 300)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains(&format!(
            "(the stream of namespace {a}) is at resourceVersion {in_a}"
        )),
        "{}",
        status.message()
    );
    // The three reads that asked for a version count their waits, the one that gave up
    // after its 300 ms among them.
    let resource = r#"resource="apps/v1/ReplicaSet""#;
    let wait = "switchyard_cache_read_wait_seconds";
    assert_eq!(
        watcher.metric(&format!("{wait}_count{{{resource}}}")).await,
        3.0
    );
    assert_eq!(
        watcher
            .metric(&format!(r#"{wait}_bucket{{le="0.256",{resource}}}"#))
            .await,
        2.0,
        "only the read that gave up waited 300 ms"
    );
    // A floor over every namespace cannot be ordered against one namespace's stream: it is
    // not waited for.
    let got = cache
        .get(get(&a, freshness("", &in_b, 300)))
        .await
        .unwrap()
        .into_inner();
    assert!(got.found);
    // A read of every namespace cannot be fenced by one version, and is told why.
    let every = |freshness| ListRequest {
        gvk: gvk("apps", "v1", "ReplicaSet"),
        namespace: String::new(),
        label_selector: String::new(),
        controller_uid: String::new(),
        freshness,
        either: false,
    };
    let status = cache
        .list(every(freshness(&in_a, "", 300)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        status
            .message()
            .contains("one stream per namespace (namespaces.include)"),
        "{}",
        status.message()
    );
    assert_eq!(
        list_names(&mut cache, every(freshness("", &in_b, 300))).await,
        ["r", "r"]
    );

    watcher.stop().await;
    queue.stop().await;
}

/// A namespace's stream has every change committed before its list: a read of a version
/// whose object was deleted before the watcher started is answered, not left waiting for the
/// namespace's next change.
#[tokio::test]
async fn a_namespaces_stream_has_every_version_before_its_list() {
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let namespaces = two_namespaces(plane, &client, "listed").await;
    let (a, b) = (
        namespaces.0.name().to_owned(),
        namespaces.1.name().to_owned(),
    );
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &a);
    let gone = sets
        .create(&PostParams::default(), &replica_set("gone", 0))
        .await
        .unwrap();
    let written = gone.meta().resource_version.clone().unwrap();
    sets.delete("gone", &DeleteParams::default()).await.unwrap();

    let (queue, watcher, mut cache) = watching_both(plane, &a, &b).await;
    let got = cache
        .get(GetRequest {
            gvk: gvk("apps", "v1", "ReplicaSet"),
            namespace: a.clone(),
            name: "gone".into(),
            freshness: freshness(&written, "", 2_000),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!got.found);

    watcher.stop().await;
    queue.stop().await;
}

/// The same for a stream of every namespace, whose initial list is a watch stream
/// (`sendInitialEvents`): a version whose object was deleted before the watcher started is
/// answered, not left waiting for the kind's next change anywhere. (A reconciler that took
/// over a key after its previous owner deleted a Pod, and whose watcher had just restarted
/// its informer, waited on that Pod's version for as long as no Pod changed.)
#[tokio::test]
async fn a_stream_of_every_namespace_has_every_version_before_its_list() {
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "streamed")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    let gone = sets
        .create(&PostParams::default(), &replica_set("gone", 0))
        .await
        .unwrap();
    sets.delete("gone", &DeleteParams::default()).await.unwrap();
    // The deletion's version: the newest the apiserver had committed once it returned.
    let written = sets
        .list_metadata(&ListParams::default().limit(1))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    assert!(
        written.parse::<u64>().unwrap()
            > gone
                .meta()
                .resource_version
                .as_ref()
                .unwrap()
                .parse::<u64>()
                .unwrap()
    );

    let queue = queue(&[RS], &[]).await;
    let watcher = watcher(
        plane,
        &rs_config("", false).replace("namespaces:\n  include: []\n", ""),
        &format!("--queue-addr={}", queue.grpc()),
    )
    .await;
    watcher.wait_ready(WITHIN).await;
    let mut cache = cache_client(watcher.grpc()).await;
    let got = cache
        .get(GetRequest {
            gvk: gvk("apps", "v1", "ReplicaSet"),
            namespace: ns.clone(),
            name: "gone".into(),
            freshness: freshness("", &written, 2_000),
        })
        .await;
    watcher.stop().await;
    queue.stop().await;
    let got = got.expect("a read at the deletion's version is answered");
    assert!(!got.into_inner().found);
}

#[tokio::test]
async fn bad_configuration_and_flags_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let start = |config: &str, route: &str| {
        let path = dir.path().join("watcher.yaml");
        std::fs::write(&path, config).unwrap();
        let mut args = vec![
            "switchyard-watcher".to_owned(),
            "--admin-addr=127.0.0.1:0".into(),
            "--grpc-addr=127.0.0.1:0".into(),
            format!("--config={}", path.display()),
        ];
        if !route.is_empty() {
            args.push(route.to_owned());
        }
        args.extend(Pki::shared().flags(Role::Watcher));
        switchyard_watcher::Args::try_parse_from(args)
            .unwrap()
            .start()
    };
    let error = start(
        "controllers: [{name: x, for: {apiVersion: apps/v1, kind: replicaset}}]",
        "--queue-addr=127.0.0.1:1",
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(error.contains("watcher.yaml"), "{error}");
    assert!(
        error.contains("controllers[0].for: kind \"replicaset\""),
        "{error}"
    );
    let error = start(
        "controllers: [{name: x, for: {apiVersion: v1, kind: Pod}, own: []}]",
        "--queue-addr=127.0.0.1:1",
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(error.contains("unknown field `own`"), "{error}");
    let error = start("resources: [{apiVersion: v1, kind: Pod}]", "")
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("--queue-addr"), "{error}");
    let missing = switchyard_watcher::Args::try_parse_from(
        [
            "switchyard-watcher".to_owned(),
            "--config=/nonexistent/watcher.yaml".into(),
            "--queue-addr=127.0.0.1:1".into(),
        ]
        .into_iter()
        .chain(Pki::shared().flags(Role::Watcher)),
    )
    .unwrap()
    .start()
    .await
    .unwrap_err()
    .to_string();
    assert!(missing.contains("/nonexistent/watcher.yaml"), "{missing}");
}

#[tokio::test]
async fn two_watchers_run_active_active_and_the_queue_keeps_each_key_once() {
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watch-twice")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let queue = queue(&[RS], &[]).await;
    let route = format!("--queue-addr={}", queue.grpc());
    let first = watcher(plane, &rs_config(&ns, false), &route).await;
    let second = watcher(plane, &rs_config(&ns, false), &route).await;
    first.wait_ready(WITHIN).await;
    second.wait_ready(WITHIN).await;
    let sent = "switchyard_watcher_keys_sent_total";
    let before = (first.metric(sent).await, second.metric(sent).await);

    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    let names: Vec<String> = (0..10).map(|i| format!("rs-{i}")).collect();
    for name in &names {
        sets.create(&PostParams::default(), &replica_set(name, 0))
            .await
            .unwrap();
    }
    // Both watchers send every key; no worker leases yet, so the queue holds them.
    let start = std::time::Instant::now();
    while first.metric(sent).await < before.0 + 10.0 || second.metric(sent).await < before.1 + 10.0
    {
        assert!(
            start.elapsed() < WITHIN,
            "the watchers did not both send the keys"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut stats = queue_client(Role::Observer, queue.grpc()).await;
    let depth: u64 = stats
        .stats(switchyard_proto::queue::v1::StatsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .shards
        .iter()
        .map(|s| s.depth)
        .sum();
    assert_eq!(
        depth, 10,
        "each key queued once though both watchers sent it"
    );
    let mut worker = Worker::start(queue.grpc()).await;
    let wanted: Vec<String> = names.iter().map(|n| key(RS, &ns, n)).collect();
    worker.expect_all(&wanted, WITHIN).await;
    let again = worker.leased_during(Duration::from_millis(700)).await;
    assert!(again.is_empty(), "a key was leased twice: {again:?}");

    first.stop().await;
    second.stop().await;
    queue.stop().await;
}

/// `owns` with `through`: a Pod keys the Deployment of its controller ReplicaSet, found in
/// the watcher's ReplicaSet cache; creations and deletions always, updates by the predicate.
#[tokio::test]
async fn a_pod_keys_the_deployment_of_its_replica_set() {
    const DEPLOY: &str = "apps/v1/Deployment";
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watch-through")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let queue = queue(&[DEPLOY], &[]).await;
    let mut worker = Worker::start(queue.grpc()).await;
    let config = format!(
        r#"
shardCount: {SHARDS}
namespaces:
  include: [{ns}]
controllers:
  - name: {DEPLOY}
    for: {{apiVersion: apps/v1, kind: Deployment}}
    owns:
      - {{apiVersion: apps/v1, kind: ReplicaSet}}
      - {{apiVersion: v1, kind: Pod, through: {{apiVersion: apps/v1, kind: ReplicaSet}}, predicates: [labelsChanged]}}
"#
    );
    let watcher = watcher(plane, &config, &format!("--queue-addr={}", queue.grpc())).await;
    watcher.wait_ready(WITHIN).await;

    let deployments: Api<switchyard_k8s::Deployment> = Api::namespaced(client.clone(), &ns);
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let front: switchyard_k8s::Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "front"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "front"}},
            "template": {
                "metadata": {"labels": {"app": "front"}},
                "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]}
            }
        }
    }))
    .unwrap();
    let front = deployments
        .create(&PostParams::default(), &front)
        .await
        .unwrap();
    let front_key = key(DEPLOY, &ns, "front");
    worker.expect(&front_key, WITHIN).await;

    let mut rs = replica_set("front-1", 0);
    rs.metadata.owner_references = Some(vec![switchyard_k8s::OwnerReference {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        name: "front".into(),
        uid: front.metadata.uid.clone().unwrap(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    let rs = sets.create(&PostParams::default(), &rs).await.unwrap();
    worker.expect(&front_key, WITHIN).await;
    // A ReplicaSet nobody controls: its Pods key nothing.
    let orphan_rs = sets
        .create(&PostParams::default(), &replica_set("loose", 0))
        .await
        .unwrap();
    worker.leased_during(Duration::from_millis(500)).await;

    let rs_uid = rs.metadata.uid.clone().unwrap();
    let owner = Some(("ReplicaSet", "apps/v1", "front-1", rs_uid.as_str()));
    pods.create(
        &PostParams::default(),
        &pod("p", &[("app", "front-1")], owner),
    )
    .await
    .unwrap();
    worker.expect(&front_key, WITHIN).await;

    let loose_uid = orphan_rs.metadata.uid.clone().unwrap();
    let loose = Some(("ReplicaSet", "apps/v1", "loose", loose_uid.as_str()));
    pods.create(
        &PostParams::default(),
        &pod("q", &[("app", "loose")], loose),
    )
    .await
    .unwrap();
    // An annotation change fails labelsChanged.
    pods.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"touched": "yes"}}})),
    )
    .await
    .unwrap();
    let leased = worker.leased_during(Duration::from_millis(700)).await;
    assert!(
        leased.is_empty(),
        "a Pod of an uncontrolled ReplicaSet, or a Pod update failing the predicate, made keys: {leased:?}"
    );

    pods.delete("p", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    worker.expect(&front_key, WITHIN).await;

    watcher.stop().await;
    queue.stop().await;
}

#[tokio::test]
async fn a_list_larger_than_a_grpc_message_arrives_whole_in_several() {
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watch-big-list")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let queue = queue(&[RS], &[]).await;
    let watcher = watcher(
        plane,
        &rs_config(&ns, false),
        &format!("--queue-addr={}", queue.grpc()),
    )
    .await;
    watcher.wait_ready(WITHIN).await;
    // 200 Pods of 30 KiB each: 6 MiB, beyond gRPC's default 4 MiB message limit that a
    // client decodes with.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let filler = "x".repeat(30 * 1024);
    let mut created = tokio::task::JoinSet::new();
    for i in 0..200 {
        let pods = pods.clone();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("big-{i}"), "annotations": {"filler": filler}},
            "spec": {"containers": [{"name": "c", "image": switchyard_testenv::manifests::IMAGE}]},
        }))
        .unwrap();
        created.spawn(async move { pods.create(&PostParams::default(), &pod).await.unwrap() });
    }
    let versions: Vec<u64> = created
        .join_all()
        .await
        .iter()
        .map(|p| {
            p.metadata
                .resource_version
                .as_deref()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    let newest = versions.iter().max().unwrap().to_string();
    let mut cache = cache_client(watcher.grpc()).await;
    let mut stream = cache
        .list(ListRequest {
            gvk: Some(ProtoGvk {
                group: String::new(),
                version: "v1".into(),
                kind: "Pod".into(),
            }),
            namespace: ns.clone(),
            freshness: Some(Freshness {
                min_resource_version: newest,
                ..Freshness::default()
            }),
            ..ListRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (mut objects, mut messages) = (0, 0);
    while let Some(chunk) = stream.message().await.unwrap() {
        messages += 1;
        objects += chunk.objects_json.len();
    }
    assert_eq!(objects, 200);
    assert!(messages >= 2, "{messages} messages");
}
