//! A reconciler killed (SIGKILL) in the middle of a rolling update or of readiness churn, and
//! another started in its place: the rollout completes, within its promise throughout, with
//! no revision beyond the two; the slices end right.
//!
//! - a StatefulSet of five: one Pod at a time (never two unavailable at once,
//!   `OrderedReady`'s promise), every Pod at the new revision, with its claim;
//! - a DaemonSet on ten Nodes with `maxUnavailable: 2`: never more than two of its Nodes
//!   without an available Pod, one Pod per Node at the end, at the new image;
//! - a Service of 120 Pods whose readiness flips 300 times, the reconciler killed a third of
//!   the way: its slices end listing each Pod once, as ready as it is, in the slices they
//!   started in.
//!
//! A binary of its own: its reconcilers act on every namespace.

#![allow(clippy::unwrap_used)]

mod support;

/// The reconciler binary its processes run.
const RECONCILER: &str = env!("CARGO_BIN_EXE_switchyard-reconciler");

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::json;
use switchyard_k8s::{
    Api, DeleteParams, ListParams, Pod, PostParams,
    k8s_openapi::api::{
        apps::v1::{ControllerRevision, DaemonSet, StatefulSet},
        core::v1::{Node, PersistentVolumeClaim, Service},
        discovery::v1::EndpointSlice,
    },
    kube::{
        Resource,
        api::{Patch, PatchParams, WatchEvent, WatchParams},
    },
};
use switchyard_reconciler::{daemonset, endpointslice, statefulset::NAME};
use switchyard_reconciler_core::{
    daemonset::target_node,
    replicaset::is_ready,
    statefulset::{is_running_and_ready, pod_revision},
};
use switchyard_testenv::{ControlPlane, TestNamespace};

const REPLICAS: usize = 5;
/// Pods at the new revision when the reconciler is killed.
const KILL_AT: i32 = 2;
/// The longest each phase may take.
const PHASE: Duration = Duration::from_secs(90);

/// Each Pod of the namespace: its Node and whether it counts as up.
type Seen = BTreeMap<String, (String, bool)>;

/// The most `down` ever says at once, from the moment it is called, as the apiserver's watch
/// tells the Pods' changes (`up` says whether a Pod counts).
async fn watch_worst(
    pods: Api<Pod>,
    up: fn(&Pod) -> bool,
    down: fn(&Seen) -> usize,
) -> Arc<Mutex<usize>> {
    let worst = Arc::new(Mutex::new(0));
    let listed = pods.list(&ListParams::default()).await.unwrap();
    let entry = move |p: &Pod| {
        let node = target_node(p).unwrap_or_default().to_owned();
        (p.metadata.name.clone().unwrap(), (node, up(p)))
    };
    let mut seen: Seen = listed.items.iter().map(entry).collect();
    let version = listed.metadata.resource_version.unwrap();
    let mut stream = pods
        .watch(&WatchParams::default().timeout(290), &version)
        .await
        .unwrap()
        .boxed();
    let into = worst.clone();
    tokio::spawn(async move {
        while let Ok(Some(event)) = stream.try_next().await {
            match event {
                WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                    let (name, value) = entry(&pod);
                    seen.insert(name, value);
                }
                WatchEvent::Deleted(pod) => {
                    seen.remove(pod.metadata.name.as_deref().unwrap());
                }
                _ => continue,
            }
            let mut worst = into.lock().unwrap();
            *worst = (*worst).max(down(&seen));
        }
    });
    worst
}

/// The set's Pods unavailable (missing, not Ready, or being deleted).
fn replicas_down(seen: &Seen) -> usize {
    REPLICAS.saturating_sub(seen.values().filter(|(_, up)| *up).count())
}

fn available(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && is_running_and_ready(pod)
}

/// Waits until `done` holds for the object `name`; when it does not in time, fails with
/// `context` (the reconciler's log).
async fn until<K, Fut>(
    api: &Api<K>,
    name: &str,
    what: &str,
    done: impl Fn(&K) -> Fut,
    context: impl Fn() -> String,
) where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + PHASE;
    loop {
        let object = api.get(name).await.unwrap();
        let status = serde_json::to_value(&object).unwrap()["status"].clone();
        if done(&object).await {
            eprintln!("{what}: {status}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not within {PHASE:?}: {status}\n{}",
            context()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_survives_its_reconciler_killed_one_pod_at_a_time() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let namespace = TestNamespace::create(plane, &client, "sts-restart")
        .await
        .unwrap();
    let ns = namespace.name().to_owned();

    // The killed reconciler's lease on the key lapses after this, and the other takes it.
    let queue = support::queue(&[NAME], &["--lease-timeout=10s"]).await;
    let watcher = support::watcher(plane, &support::watcher_config(&[], ""), queue.grpc()).await;
    watcher.wait_ready(support::WITHIN).await;
    let first = support::reconciler_process(
        Path::new(RECONCILER),
        plane,
        queue.grpc(),
        watcher.grpc(),
        NAME,
    )
    .await;

    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let set: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {
            "replicas": REPLICAS,
            "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {
                    "nodeName": plane.nodes()[0],
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "db", "image": "registry.example/db:1"}],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }],
        },
    }))
    .unwrap();
    sets.create(&PostParams::default(), &set).await.unwrap();
    // The status of the StatefulSet as it is now: `n` updated Pods at a revision other
    // than `not` (the first one, once it is known), all ready when `n` is all of them.
    let updated = |n: i32, not: Option<String>| {
        move |s: &StatefulSet| {
            let status = s.status.clone().unwrap_or_default();
            std::future::ready(
                status.observed_generation == s.metadata.generation
                    && status.updated_replicas.unwrap_or(0) >= n
                    && status.update_revision != not
                    && (n < 5
                        || status.ready_replicas == Some(5)
                            && status.current_revision == status.update_revision),
            )
        }
    };
    until(&sets, "db", "five ready", updated(5, None), || first.log()).await;
    let first_revision = sets
        .get("db")
        .await
        .unwrap()
        .status
        .unwrap()
        .update_revision;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let worst = watch_worst(pods.clone(), available, replicas_down).await;
    sets.patch(
        "db",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [
            {"name": "db", "image": "registry.example/db:2"},
        ]}}}})),
    )
    .await
    .unwrap();
    until(
        &sets,
        "db",
        "two updated",
        updated(KILL_AT, first_revision.clone()),
        || first.log(),
    )
    .await;
    let log = first.kill();
    eprintln!(
        "killed the first reconciler ({} log lines)",
        log.lines().count()
    );
    let second = support::reconciler_process(
        Path::new(RECONCILER),
        plane,
        queue.grpc(),
        watcher.grpc(),
        NAME,
    )
    .await;
    until(
        &sets,
        "db",
        "the rollout complete",
        updated(5, first_revision),
        || second.log(),
    )
    .await;
    second.terminate().await.unwrap();
    watcher.stop().await;
    queue.stop().await;

    let set = sets.get("db").await.unwrap();
    let update = set.status.unwrap().update_revision.unwrap();
    let listed = pods.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(listed.len(), REPLICAS);
    for pod in &listed {
        assert_eq!(pod_revision(pod), update);
        assert!(available(pod));
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    assert_eq!(
        claims
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        REPLICAS
    );
    let revisions: Api<ControllerRevision> = Api::namespaced(client.clone(), &ns);
    let listed: Vec<(String, i64)> = revisions
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|r| (r.metadata.name.unwrap(), r.revision))
        .collect();
    assert_eq!(listed.len(), 2, "revisions {listed:?}, update {update}");
    let worst = *worst.lock().unwrap();
    assert_eq!(
        worst, 1,
        "at most one Pod unavailable at a time, and one was"
    );
}

/// Nodes of the DaemonSet test.
const DS_NODES: usize = 10;

/// The DaemonSet's Nodes without an available Pod.
fn nodes_down(seen: &Seen) -> usize {
    let covered: std::collections::BTreeSet<&str> = seen
        .values()
        .filter(|(_, up)| *up)
        .map(|(node, _)| node.as_str())
        .collect();
    DS_NODES.saturating_sub(covered.len())
}

fn ready_not_deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && is_ready(pod)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_set_rollout_survives_its_reconciler_killed_within_max_unavailable() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let namespace = TestNamespace::create(plane, &client, "ds-restart")
        .await
        .unwrap();
    let ns = namespace.name().to_owned();
    let node_names: Vec<String> = (0..DS_NODES).map(|i| format!("ds-restart-{i}")).collect();
    for name in &node_names {
        support::kwok_node(&client, name, json!({"ds-restart": "yes"}), json!({})).await;
    }

    let queue = support::queue(&[daemonset::NAME], &["--lease-timeout=10s"]).await;
    let watcher = support::watcher(plane, &support::watcher_config(&[], ""), queue.grpc()).await;
    watcher.wait_ready(support::WITHIN).await;
    let first = support::reconciler_process(
        Path::new(RECONCILER),
        plane,
        queue.grpc(),
        watcher.grpc(),
        daemonset::NAME,
    )
    .await;

    let sets: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
    let set: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {
                    "nodeSelector": {"ds-restart": "yes"},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "agent", "image": "registry.example/agent:1"}],
                },
            },
        },
    }))
    .unwrap();
    sets.create(&PostParams::default(), &set).await.unwrap();
    let image = |tag: u32| format!("registry.example/agent:{tag}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // `n` Pods at image `tag`, and when `n` is all of them, the status says the rollout is
    // done.
    let at = |n: usize, tag: u32| {
        let (pods, image) = (pods.clone(), image(tag));
        move |ds: &DaemonSet| {
            let (pods, image) = (pods.clone(), image.clone());
            let status = ds.status.clone().unwrap_or_default();
            let done = status.observed_generation == ds.metadata.generation
                && status.updated_number_scheduled == Some(10)
                && status.number_available == Some(10);
            async move {
                let listed = pods.list(&ListParams::default()).await.unwrap().items;
                let at_image = listed
                    .iter()
                    .filter(|p| {
                        p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some(&image)
                    })
                    .count();
                at_image >= n && (n < DS_NODES || done && listed.len() == DS_NODES)
            }
        }
    };
    until(&sets, "agent", "ten ready", at(DS_NODES, 1), || first.log()).await;
    let worst = watch_worst(pods.clone(), ready_not_deleting, nodes_down).await;
    sets.patch(
        "agent",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [
            {"name": "agent", "image": image(2)},
        ]}}}})),
    )
    .await
    .unwrap();
    until(&sets, "agent", "three updated", at(3, 2), || first.log()).await;
    let log = first.kill();
    eprintln!(
        "killed the first reconciler ({} log lines)",
        log.lines().count()
    );
    let second = support::reconciler_process(
        Path::new(RECONCILER),
        plane,
        queue.grpc(),
        watcher.grpc(),
        daemonset::NAME,
    )
    .await;
    until(
        &sets,
        "agent",
        "the rollout complete",
        at(DS_NODES, 2),
        || second.log(),
    )
    .await;
    second.terminate().await.unwrap();
    watcher.stop().await;
    queue.stop().await;

    let listed = pods.list(&ListParams::default()).await.unwrap().items;
    let nodes: std::collections::BTreeSet<&str> =
        listed.iter().filter_map(|p| target_node(p)).collect();
    assert_eq!(listed.len(), DS_NODES, "one Pod per Node");
    assert_eq!(nodes.len(), DS_NODES, "one Pod per Node");
    let revisions: Api<ControllerRevision> = Api::namespaced(client.clone(), &ns);
    let count = revisions
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    assert_eq!(count, 2, "no revision beyond the two");
    let worst = *worst.lock().unwrap();
    assert!(
        (1..=2).contains(&worst),
        "at most maxUnavailable (2) Nodes without an available Pod, and some: {worst}"
    );
    let api: Api<Node> = Api::all(client.clone());
    for name in &node_names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
}

/// Pods of the Service whose readiness churns.
const CHURN_PODS: usize = 120;
/// Readiness flips, one every 20 ms; the reconciler is killed after a third of them.
const FLIPS: usize = 300;

/// Each Pod listed in the Service's slices: how many times, and ready or not at its last
/// listing; and the slices' sizes.
async fn listed(
    slices: &Api<EndpointSlice>,
) -> (BTreeMap<String, (usize, Option<bool>)>, Vec<usize>) {
    let mut pods: BTreeMap<String, (usize, Option<bool>)> = BTreeMap::new();
    let mut sizes = Vec::new();
    let selector = "kubernetes.io/service-name=churn";
    for slice in slices
        .list(&ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
    {
        sizes.push(slice.endpoints.len());
        for e in &slice.endpoints {
            let name = e.target_ref.as_ref().unwrap().name.clone().unwrap();
            let entry = pods.entry(name).or_default();
            entry.0 += 1;
            entry.1 = e.conditions.as_ref().and_then(|c| c.ready);
        }
    }
    sizes.sort_unstable();
    (pods, sizes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_end_right_after_readiness_churn_with_their_reconciler_killed() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let namespace = TestNamespace::create(plane, &client, "es-restart")
        .await
        .unwrap();
    let ns = namespace.name().to_owned();
    let queue = support::queue(&[endpointslice::NAME], &["--lease-timeout=10s"]).await;
    let watcher = support::watcher(plane, &support::watcher_config(&[], ""), queue.grpc()).await;
    watcher.wait_ready(support::WITHIN).await;
    let mut first = Some(
        support::reconciler_process(
            Path::new(RECONCILER),
            plane,
            queue.grpc(),
            watcher.grpc(),
            endpointslice::NAME,
        )
        .await,
    );

    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "churn"},
        "spec": {"selector": {"app": "churn"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }))
    .unwrap();
    services
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let node = plane.nodes()[0].clone();
    futures::stream::iter(0..CHURN_PODS)
        .for_each_concurrent(16, |i| {
            let (pods, node) = (pods.clone(), node.clone());
            async move {
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": format!("c{i:03}"), "labels": {"app": "churn"}},
                    "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                             "containers": [{"name": "c", "image": "registry.example/web:1"}]},
                }))
                .unwrap();
                pods.create(&PostParams::default(), &pod).await.unwrap();
            }
        })
        .await;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
    let settled = |want: BTreeMap<String, bool>, context: &'static str| {
        let slices = slices.clone();
        async move {
            let deadline = Instant::now() + PHASE;
            loop {
                let (seen, sizes) = listed(&slices).await;
                let ready: BTreeMap<String, bool> = seen
                    .iter()
                    .map(|(name, (_, ready))| (name.clone(), *ready == Some(true)))
                    .collect();
                if ready == want {
                    return (seen, sizes);
                }
                assert!(Instant::now() < deadline, "{context}: {seen:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let mut want: BTreeMap<String, bool> = (0..CHURN_PODS)
        .map(|i| (format!("c{i:03}"), true))
        .collect();
    let (_, before) = settled(want.clone(), "every Pod listed ready").await;

    // Flips, each to the opposite of the Pod's last: the reconciler killed a third of the way.
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let mut second = None;
    for i in 0..FLIPS {
        tick.tick().await;
        if let Some(first) = first.take_if(|_| i == FLIPS / 3) {
            let log = first.kill();
            eprintln!(
                "killed the first reconciler ({} log lines)",
                log.lines().count()
            );
            second = Some(
                support::reconciler_process(
                    Path::new(RECONCILER),
                    plane,
                    queue.grpc(),
                    watcher.grpc(),
                    endpointslice::NAME,
                )
                .await,
            );
        }
        let name = format!("c{:03}", (i * 37) % CHURN_PODS);
        let ready = !want[&name];
        want.insert(name.clone(), ready);
        let status = if ready { "True" } else { "False" };
        pods.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"status": {"conditions": [{"type": "Ready", "status": status}]}}),
            ),
        )
        .await
        .unwrap();
    }
    let (seen, sizes) = settled(want, "the slices after the churn").await;
    second.unwrap().terminate().await.unwrap();
    watcher.stop().await;
    queue.stop().await;
    assert!(
        seen.values().all(|(times, _)| *times == 1),
        "each Pod listed once: {seen:?}"
    );
    // Flips move no Pod between slices: each is written in place throughout.
    assert_eq!(sizes, before, "slice sizes before the churn and after");
}
