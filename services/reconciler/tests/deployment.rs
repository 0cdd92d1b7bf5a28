//! The Deployment controller end to end: the real control plane (kwok makes Pods Ready; the
//! scheduler binds them), and a queue, a watcher and a reconciler running the ReplicaSet and
//! Deployment controllers in this process. Each test has a namespace and services of its own.
//! Watches on the Pods check the strategies' promises at every event.

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
    Api, DeleteParams, Deployment, ListParams, Pod, PostParams, ReplicaSet, await_condition,
    k8s_openapi::api::events::v1::Event,
    kube::api::{Patch, PatchParams},
    watcher,
};
use switchyard_reconciler_core::{
    deployment::{
        self as core, AVAILABLE, NEW_RS_AVAILABLE, PAUSED, PROGRESSING, REVISION, REVISION_HISTORY,
        controller_of, get_condition,
    },
    replicaset::{is_active, is_ready},
};
use switchyard_testenv::{ControlPlane, InProcess, TestNamespace, manifests};
use tokio::task::JoinHandle;

use support::WITHIN;

/// How long a rollout may take here: 10 Pods on kwok converge in seconds; this bounds a
/// broken controller's test.
const ROLLOUT: Duration = Duration::from_secs(60);
/// A finalizer the tests put on Pods to keep them terminating.
const HOLD: &str = "example.com/hold";

/// A queue, a watcher and one reconciler for one namespace.
struct Stack {
    queue: InProcess,
    watcher: InProcess,
    reconciler: InProcess,
}

impl Stack {
    async fn start(plane: &ControlPlane, namespace: &str) -> Self {
        let queue = support::queue(switchyard_reconciler::BUILTIN, &[]).await;
        let watcher = support::watcher(
            plane,
            &support::watcher_config(&[namespace], ""),
            queue.grpc(),
        )
        .await;
        watcher.wait_ready(WITHIN).await;
        let reconciler = support::reconciler(
            plane,
            support::builtins(&[support::RS, support::DEPLOY]),
            queue.grpc(),
            watcher.grpc(),
            &[],
        )
        .await;
        reconciler.wait_ready(WITHIN).await;
        Self {
            queue,
            watcher,
            reconciler,
        }
    }

    async fn stop(self) {
        self.reconciler.stop().await;
        self.watcher.stop().await;
        self.queue.stop().await;
    }
}

fn deployment(name: &str, replicas: i32, image: &str, extra_spec: Value) -> Deployment {
    let mut value = manifests::workload("Deployment", name, replicas, extra_spec);
    value["spec"]["template"]["spec"]["containers"][0]["image"] = json!(image);
    serde_json::from_value(value).unwrap()
}

fn image_of(pod: &Pod) -> String {
    pod.spec.as_ref().unwrap().containers[0]
        .image
        .clone()
        .unwrap_or_default()
}

async fn patch(api: &Api<Deployment>, name: &str, patch: Value) {
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

async fn set_image(api: &Api<Deployment>, name: &str, image: &str) {
    patch(
        api,
        name,
        json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}}}),
    )
    .await;
}

/// Waits until the Deployment's status says the rollout of `image` to `n` replicas is
/// complete, as `kubectl rollout status` would, then checks the Pods themselves: `n` active,
/// ready, of `image`, each controlled by a ReplicaSet the Deployment controls.
async fn complete(
    deployments: &Api<Deployment>,
    pods: &Api<Pod>,
    name: &str,
    n: i32,
    image: &str,
) -> Deployment {
    let done = await_condition(deployments.clone(), name, move |d: Option<&Deployment>| {
        d.is_some_and(|d| {
            let status = d.status.clone().unwrap_or_default();
            let reason = |t: &str| {
                get_condition(&status, t)
                    .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
            };
            status.observed_generation >= d.metadata.generation
                && status.replicas.unwrap_or(0) == n
                && status.updated_replicas.unwrap_or(0) == n
                && status.ready_replicas.unwrap_or(0) == n
                && status.available_replicas.unwrap_or(0) == n
                && status.unavailable_replicas.unwrap_or(0) == 0
                && reason(AVAILABLE).is_some_and(|(s, _)| s == "True")
                && reason(PROGRESSING).is_some_and(|(s, r)| s == "True" && r == NEW_RS_AVAILABLE)
        })
    });
    if tokio::time::timeout(ROLLOUT, done).await.is_err() {
        let d = deployments.get(name).await.unwrap();
        panic!(
            "{name} did not complete a rollout of {image} to {n}: status {:?}",
            d.status
        );
    }
    let d = deployments.get(name).await.unwrap();
    let uid = d.metadata.uid.clone().unwrap();
    let client: switchyard_k8s::Client = deployments.clone().into();
    let rss: Api<ReplicaSet> = Api::namespaced(client, &namespace_of(&d));
    let owned: BTreeMap<String, ReplicaSet> = rss
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|rs| controller_of(&rs.metadata).is_some_and(|r| r.uid == uid))
        .map(|rs| (rs.metadata.uid.clone().unwrap(), rs))
        .collect();
    let active = active_pods(pods, name).await;
    assert_eq!(active.len(), n as usize, "active Pods");
    for pod in &active {
        assert!(is_ready(pod), "every Pod is ready");
        assert_eq!(image_of(pod), image);
        let owner = controller_of(&pod.metadata).expect("a controller");
        assert!(
            owned.contains_key(&owner.uid),
            "the Pod's ReplicaSet is the Deployment's"
        );
    }
    d
}

fn namespace_of(d: &Deployment) -> String {
    d.metadata.namespace.clone().unwrap()
}

async fn active_pods(pods: &Api<Pod>, app: &str) -> Vec<Pod> {
    support::active_pods(pods, &format!("app={app}")).await
}

/// The Deployment's ReplicaSets, lowest revision first.
async fn replica_sets(api: &Api<ReplicaSet>, app: &str) -> Vec<ReplicaSet> {
    let mut rss = api
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items;
    rss.sort_by_key(core::revision);
    rss
}

fn annotation(rs: &ReplicaSet, key: &str) -> Option<String> {
    rs.metadata.annotations.as_ref()?.get(key).cloned()
}

fn rs_image(rs: &ReplicaSet) -> String {
    rs.spec
        .as_ref()
        .unwrap()
        .template
        .as_ref()
        .unwrap()
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .image
        .clone()
        .unwrap_or_default()
}

/// Aborts a task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Watches the namespace's Pods (and its ReplicaSets' sizes) and runs `check` on every Pod
/// state after the initial list; a message it returns is a violation.
struct PodWatch {
    violations: Arc<Mutex<Vec<String>>>,
    images_together: Arc<Mutex<BTreeSet<usize>>>,
    task: JoinHandle<()>,
}

/// The check sees the Pods and each ReplicaSet's `spec.replicas` by UID (as last watched).
type Check = Box<dyn Fn(&BTreeMap<String, Pod>, &BTreeMap<String, i32>) -> Option<String> + Send>;

impl PodWatch {
    async fn start(api: Api<Pod>, sets: Api<ReplicaSet>, check: Check) -> Self {
        let violations = Arc::new(Mutex::new(Vec::new()));
        let images_together = Arc::new(Mutex::new(BTreeSet::new()));
        let specs: Arc<Mutex<BTreeMap<String, i32>>> = Arc::default();
        let (synced_tx, synced) = tokio::sync::oneshot::channel();
        let (sets_synced_tx, sets_synced) = tokio::sync::oneshot::channel();
        let sets_task = tokio::spawn({
            let specs = specs.clone();
            async move {
                let mut synced_tx = Some(sets_synced_tx);
                let mut events = watcher(sets, watcher::Config::default()).boxed();
                while let Some(event) = events.try_next().await.unwrap() {
                    let mut specs = specs.lock().unwrap();
                    match event {
                        watcher::Event::Apply(rs) | watcher::Event::InitApply(rs) => {
                            let replicas = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                            specs.insert(rs.metadata.uid.clone().unwrap(), replicas);
                        }
                        watcher::Event::Delete(rs) => {
                            specs.remove(rs.metadata.uid.as_deref().unwrap());
                        }
                        watcher::Event::Init => specs.clear(),
                        watcher::Event::InitDone => {
                            if let Some(tx) = synced_tx.take() {
                                let _ = tx.send(());
                            }
                        }
                    }
                }
            }
        });
        sets_synced.await.unwrap();
        let task = tokio::spawn({
            let (violations, images_together) = (violations.clone(), images_together.clone());
            async move {
                let _sets = AbortOnDrop(sets_task);
                let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
                let mut synced_tx = Some(synced_tx);
                let mut events = watcher(api, watcher::Config::default()).boxed();
                while let Some(event) = events.try_next().await.unwrap() {
                    match event {
                        watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                            pods.insert(pod.metadata.name.clone().unwrap(), pod);
                        }
                        watcher::Event::Delete(pod) => {
                            pods.remove(pod.metadata.name.as_deref().unwrap());
                        }
                        watcher::Event::Init => pods.clear(),
                        watcher::Event::InitDone => {
                            if let Some(tx) = synced_tx.take() {
                                let _ = tx.send(());
                            }
                        }
                    }
                    if synced_tx.is_some() {
                        continue;
                    }
                    let images: BTreeSet<String> = pods.values().map(image_of).collect();
                    images_together.lock().unwrap().insert(images.len());
                    let specs = specs.lock().unwrap().clone();
                    if let Some(violation) = check(&pods, &specs) {
                        violations.lock().unwrap().push(violation);
                    }
                }
            }
        });
        synced.await.unwrap();
        Self {
            violations,
            images_together,
            task,
        }
    }

    fn assert_no_violation(&self) {
        let violations = self.violations.lock().unwrap();
        assert!(violations.is_empty(), "{violations:?}");
    }

    /// Whether Pods of two images were ever there at once.
    fn saw_images_together(&self) -> bool {
        self.images_together.lock().unwrap().iter().any(|n| *n > 1)
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_becomes_available_scales_and_replaces_a_deleted_pod() {
    let started = Instant::now();
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "deploy-e2e")
        .await
        .unwrap();
    let stack = Stack::start(plane, ns.name()).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), ns.name());

    deployments
        .create(
            &PostParams::default(),
            &deployment("web", 10, "registry.example/web:1", json!({})),
        )
        .await
        .unwrap();
    let d = complete(&deployments, &pods, "web", 10, "registry.example/web:1").await;
    support::kubectl_rollout_status(plane, ns.name(), "deployment/web").await;

    // One ReplicaSet, named and labelled with the pod-template-hash, at revision 1.
    let owned = replica_sets(&rss, "web").await;
    assert_eq!(owned.len(), 1);
    let rs = &owned[0];
    let hash = rs.metadata.labels.as_ref().unwrap()[core::POD_TEMPLATE_HASH].clone();
    assert_eq!(
        rs.metadata.name.as_deref(),
        Some(format!("web-{hash}").as_str())
    );
    assert_eq!(
        rs.spec
            .as_ref()
            .unwrap()
            .selector
            .match_labels
            .as_ref()
            .unwrap()[core::POD_TEMPLATE_HASH],
        hash
    );
    assert_eq!(annotation(rs, REVISION).as_deref(), Some("1"));
    assert_eq!(
        annotation(rs, core::DESIRED_REPLICAS).as_deref(),
        Some("10")
    );
    assert_eq!(
        d.metadata.annotations.as_ref().unwrap()[REVISION],
        "1",
        "the Deployment carries its revision"
    );
    for pod in active_pods(&pods, "web").await {
        assert_eq!(
            pod.metadata.labels.as_ref().unwrap()[core::POD_TEMPLATE_HASH],
            hash
        );
    }
    // kube-controller-manager's event, as `kubectl describe deployment` shows it.
    let events: Api<Event> = Api::namespaced(client.clone(), ns.name());
    let scaled = format!("Scaled up replica set web-{hash} from 0 to 10");
    let notes: Vec<String> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ScalingReplicaSet"))
        .filter_map(|e| e.note)
        .collect();
    assert!(notes.contains(&scaled), "{notes:?}");

    patch(&deployments, "web", json!({"spec": {"replicas": 15}})).await;
    complete(&deployments, &pods, "web", 15, "registry.example/web:1").await;
    patch(&deployments, "web", json!({"spec": {"replicas": 4}})).await;
    complete(&deployments, &pods, "web", 4, "registry.example/web:1").await;
    assert_eq!(
        replica_sets(&rss, "web").await.len(),
        1,
        "scaling makes no new ReplicaSet"
    );

    let victim = active_pods(&pods, "web").await[0]
        .metadata
        .name
        .clone()
        .unwrap();
    pods.delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::timeout(ROLLOUT, async {
        loop {
            let active = active_pods(&pods, "web").await;
            if active.len() == 4
                && active.iter().all(is_ready)
                && active
                    .iter()
                    .all(|p| p.metadata.name.as_ref() != Some(&victim))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the deleted Pod is replaced by a ready one");
    complete(&deployments, &pods, "web", 4, "registry.example/web:1").await;

    let series = r#"switchyard_reconcile_total{controller="apps/v1/Deployment",result="success"}"#;
    assert!(stack.reconciler.metric(series).await > 0.0);
    stack.stop().await;
    eprintln!("available, scaled and replaced in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_update_keeps_max_unavailable_prunes_history_and_rolls_back() {
    let started = Instant::now();
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "deploy-roll")
        .await
        .unwrap();
    let stack = Stack::start(plane, ns.name()).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), ns.name());

    // 6 replicas, maxSurge 2 (of 6, 25% rounds up to 2), maxUnavailable 1 (25% rounds down).
    let (replicas, surge, unavailable) = (6, 2, 1);
    deployments
        .create(
            &PostParams::default(),
            &deployment(
                "roll",
                replicas,
                "registry.example/roll:a",
                json!({"revisionHistoryLimit": 1}),
            ),
        )
        .await
        .unwrap();
    complete(
        &deployments,
        &pods,
        "roll",
        replicas,
        "registry.example/roll:a",
    )
    .await;

    // The surge bound holds for the ReplicaSets' sizes (kube-controller-manager's, too): a
    // Pod of a ReplicaSet just scaled down stays active until its ReplicaSet deletes it, so
    // each ReplicaSet's active Pods count up to its size. Readiness is checked on every Pod.
    let check: Check = Box::new(move |pods: &BTreeMap<String, Pod>, specs| {
        let active: Vec<&Pod> = pods.values().filter(|p| is_active(p)).collect();
        let ready = active.iter().filter(|p| is_ready(p)).count();
        let mut per_set: BTreeMap<String, usize> = BTreeMap::new();
        for pod in &active {
            let owner = controller_of(&pod.metadata)
                .map(|o| o.uid.clone())
                .unwrap_or_default();
            *per_set.entry(owner).or_default() += 1;
        }
        let counted: usize = per_set
            .iter()
            .map(|(uid, n)| match specs.get(uid) {
                Some(spec) => (*n).min(usize::try_from(*spec).unwrap_or(0)),
                None => *n,
            })
            .sum();
        let max = usize::try_from(replicas + surge).unwrap();
        let min = usize::try_from(replicas - unavailable).unwrap();
        (counted > max || ready < min).then(|| {
            format!(
                "{counted} active within their ReplicaSets' sizes ({} in all; at most {max}), \
                 {ready} ready (at least {min})",
                active.len()
            )
        })
    });
    let watch = PodWatch::start(pods.clone(), rss.clone(), check).await;

    set_image(&deployments, "roll", "registry.example/roll:b").await;
    let d = complete(
        &deployments,
        &pods,
        "roll",
        replicas,
        "registry.example/roll:b",
    )
    .await;
    support::kubectl_rollout_status(plane, ns.name(), "deployment/roll").await;
    watch.assert_no_violation();
    assert!(
        watch.saw_images_together(),
        "a rolling update overlaps old and new Pods"
    );
    assert_eq!(d.metadata.annotations.as_ref().unwrap()[REVISION], "2");
    let owned = replica_sets(&rss, "roll").await;
    assert_eq!(owned.len(), 2);
    assert_eq!(
        owned.iter().map(core::replicas).collect::<Vec<_>>(),
        [0, replicas],
        "the old ReplicaSet is scaled to 0"
    );
    let b = owned[1].clone();
    assert_eq!(annotation(&b, REVISION).as_deref(), Some("2"));

    set_image(&deployments, "roll", "registry.example/roll:c").await;
    complete(
        &deployments,
        &pods,
        "roll",
        replicas,
        "registry.example/roll:c",
    )
    .await;
    watch.assert_no_violation();
    // revisionHistoryLimit 1: the oldest (a) is deleted, b stays, c is new.
    let pruned = tokio::time::timeout(ROLLOUT, async {
        loop {
            let owned = replica_sets(&rss, "roll").await;
            if owned.len() == 2 {
                return owned;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the history beyond revisionHistoryLimit is deleted");
    assert_eq!(
        pruned.iter().map(rs_image).collect::<Vec<_>>(),
        ["registry.example/roll:b", "registry.example/roll:c"]
    );

    // Back to b, as a user does it: kubectl copies b's template (revision 2) into the
    // Deployment. b's ReplicaSet becomes the new one again, at revision 4.
    let undo = support::kubectl(
        plane,
        &["rollout", "undo", "deployment/roll", "-n", ns.name()],
    )
    .await;
    assert!(undo.contains("rolled back"), "{undo}");
    let d = complete(
        &deployments,
        &pods,
        "roll",
        replicas,
        "registry.example/roll:b",
    )
    .await;
    watch.assert_no_violation();
    let owned = replica_sets(&rss, "roll").await;
    assert_eq!(owned.len(), 2, "no ReplicaSet is created for a rollback");
    let back = owned
        .iter()
        .find(|rs| rs.metadata.name == b.metadata.name)
        .expect("b's ReplicaSet is reused");
    assert_eq!(core::replicas(back), replicas);
    assert_eq!(annotation(back, REVISION).as_deref(), Some("4"));
    assert_eq!(annotation(back, REVISION_HISTORY).as_deref(), Some("2"));
    assert_eq!(d.metadata.annotations.as_ref().unwrap()[REVISION], "4");
    let history = support::kubectl(
        plane,
        &["rollout", "history", "deployment/roll", "-n", ns.name()],
    )
    .await;
    let revisions: Vec<&str> = history
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.parse::<u32>().is_ok())
        .collect();
    assert_eq!(revisions, ["3", "4"], "{history}");
    for pod in active_pods(&pods, "roll").await {
        assert_eq!(
            controller_of(&pod.metadata).unwrap().name,
            b.metadata.name.clone().unwrap()
        );
    }

    drop(watch);
    stack.stop().await;
    eprintln!(
        "rolled out, pruned and rolled back in {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreate_never_runs_old_and_new_pods_together() {
    let started = Instant::now();
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "deploy-recreate")
        .await
        .unwrap();
    let stack = Stack::start(plane, ns.name()).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());

    deployments
        .create(
            &PostParams::default(),
            &deployment(
                "once",
                4,
                "registry.example/once:a",
                json!({"strategy": {"type": "Recreate"}}),
            ),
        )
        .await
        .unwrap();
    complete(&deployments, &pods, "once", 4, "registry.example/once:a").await;

    // Every Pod still there counts, terminating or not: Recreate waits until the old ones
    // are gone.
    let check: Check = Box::new(|pods: &BTreeMap<String, Pod>, _| {
        let images: BTreeSet<String> = pods.values().map(image_of).collect();
        (images.len() > 1).then(|| format!("old and new Pods at once: {images:?}"))
    });
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), ns.name());
    let watch = PodWatch::start(pods.clone(), sets, check).await;
    // A finalizer holds the old Pods while they terminate.
    let old: Vec<String> = active_pods(&pods, "once")
        .await
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    for name in &old {
        pods.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": [HOLD]}})),
        )
        .await
        .unwrap();
    }
    set_image(&deployments, "once", "registry.example/once:b").await;
    // The old ReplicaSet reports no Pods (they are terminating) and the Deployment's status
    // has caught up with that: the reconcile that could start the new Pods has run.
    let drained = await_condition(deployments.clone(), "once", |d: Option<&Deployment>| {
        d.is_some_and(|d| {
            let status = d.status.clone().unwrap_or_default();
            status.observed_generation == d.metadata.generation && status.replicas.unwrap_or(0) == 0
        })
    });
    tokio::time::timeout(ROLLOUT, drained)
        .await
        .expect("the old ReplicaSet is scaled to 0")
        .unwrap();
    let terminating = pods.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(terminating.len(), 4, "the old Pods are held");
    assert!(terminating.iter().all(|p| !is_active(p)));
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), ns.name());
    assert!(
        replica_sets(&rss, "once")
            .await
            .iter()
            .all(|rs| rs_image(rs) == "registry.example/once:a"),
        "no new ReplicaSet while old Pods remain"
    );
    for name in &old {
        pods.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    }
    // Their deletion (a Pod event, mapped through the ReplicaSet) keys the Deployment.
    complete(&deployments, &pods, "once", 4, "registry.example/once:b").await;
    support::kubectl_rollout_status(plane, ns.name(), "deployment/once").await;
    watch.assert_no_violation();
    assert!(!watch.saw_images_together());

    drop(watch);
    stack.stop().await;
    eprintln!("recreated in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_deployment_scales_but_does_not_roll_out_until_resumed() {
    let started = Instant::now();
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "deploy-pause")
        .await
        .unwrap();
    let stack = Stack::start(plane, ns.name()).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), ns.name());

    deployments
        .create(
            &PostParams::default(),
            &deployment("hold", 3, "registry.example/hold:a", json!({})),
        )
        .await
        .unwrap();
    complete(&deployments, &pods, "hold", 3, "registry.example/hold:a").await;

    patch(&deployments, "hold", json!({"spec": {"paused": true}})).await;
    set_image(&deployments, "hold", "registry.example/hold:b").await;
    patch(&deployments, "hold", json!({"spec": {"replicas": 5}})).await;
    // The controller has seen the last change when observedGeneration reaches it; a paused
    // Deployment says so in Progressing.
    let observed = await_condition(deployments.clone(), "hold", |d: Option<&Deployment>| {
        d.is_some_and(|d| {
            let status = d.status.clone().unwrap_or_default();
            status.observed_generation == d.metadata.generation
                && get_condition(&status, PROGRESSING)
                    .is_some_and(|c| c.reason.as_deref() == Some(PAUSED))
        })
    });
    tokio::time::timeout(ROLLOUT, observed)
        .await
        .expect("the paused Deployment is observed")
        .unwrap();
    let owned = replica_sets(&rss, "hold").await;
    assert_eq!(owned.len(), 1, "no new ReplicaSet while paused");
    assert_eq!(
        core::replicas(&owned[0]),
        5,
        "a paused Deployment still scales"
    );
    tokio::time::timeout(ROLLOUT, async {
        loop {
            let active = active_pods(&pods, "hold").await;
            if active.len() == 5 && active.iter().all(is_ready) {
                return active;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("five ready Pods")
    .iter()
    .for_each(|p| assert_eq!(image_of(p), "registry.example/hold:a"));

    patch(&deployments, "hold", json!({"spec": {"paused": false}})).await;
    complete(&deployments, &pods, "hold", 5, "registry.example/hold:b").await;
    assert_eq!(replica_sets(&rss, "hold").await.len(), 2);

    stack.stop().await;
    eprintln!("paused and resumed in {:?}", started.elapsed());
}

/// Relabels a ReplicaSet out of the Deployment's selector and scales it to 0, so that its
/// Pods go too.
async fn cut_loose(rss: &Api<ReplicaSet>, name: &str) {
    rss.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "gone"}}, "spec": {"replicas": 0}})),
    )
    .await
    .unwrap();
}

/// Waits until `name` is released with no Pods left, and another ReplicaSet of the
/// Deployment has `n` available. (The Deployment's status said complete before: it is no
/// sign of the replacement.)
async fn replaced(rss: &Api<ReplicaSet>, name: &str, n: i32) {
    tokio::time::timeout(ROLLOUT, async {
        loop {
            let all = rss.list(&ListParams::default()).await.unwrap().items;
            let old_gone = all.iter().any(|rs| {
                rs.metadata.name.as_deref() == Some(name)
                    && controller_of(&rs.metadata).is_none()
                    && rs.status.as_ref().is_some_and(|s| s.replicas == 0)
            });
            let new_up = all.iter().any(|rs| {
                rs.metadata.name.as_deref() != Some(name)
                    && controller_of(&rs.metadata).is_some_and(|r| r.kind == "Deployment")
                    && rs.status.as_ref().and_then(|s| s.available_replicas) == Some(n)
            });
            if old_gone && new_up {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{name} was not released and replaced"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_adopted_and_a_released_name_forces_a_new_hash() {
    let started = Instant::now();
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "deploy-adopt")
        .await
        .unwrap();
    let stack = Stack::start(plane, ns.name()).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), ns.name());

    // An orphan ReplicaSet with the Deployment's template (and a hash label of its own).
    let labels = json!({"app": "adopt", core::POD_TEMPLATE_HASH: "manual"});
    let orphan: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "adopt-manual", "labels": labels},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "registry.example/adopt:1"}]}
            }
        }
    }))
    .unwrap();
    rss.create(&PostParams::default(), &orphan).await.unwrap();
    deployments
        .create(
            &PostParams::default(),
            &deployment("adopt", 2, "registry.example/adopt:1", json!({})),
        )
        .await
        .unwrap();
    complete(&deployments, &pods, "adopt", 2, "registry.example/adopt:1").await;
    let owned = replica_sets(&rss, "adopt").await;
    assert_eq!(
        owned
            .iter()
            .map(|rs| rs.metadata.name.clone().unwrap())
            .collect::<Vec<_>>(),
        ["adopt-manual"],
        "the orphan is adopted as the new ReplicaSet, none is created"
    );
    assert_eq!(
        controller_of(&owned[0].metadata).unwrap().kind,
        "Deployment"
    );

    // Released, it is replaced by one named by the hash.
    cut_loose(&rss, "adopt-manual").await;
    replaced(&rss, "adopt-manual", 2).await;
    complete(&deployments, &pods, "adopt", 2, "registry.example/adopt:1").await;
    let owned = replica_sets(&rss, "adopt").await;
    assert_eq!(owned.len(), 1);
    let first = owned[0].metadata.name.clone().unwrap();
    assert_ne!(first, "adopt-manual");

    // Released too, its name is taken by a ReplicaSet that is not the Deployment's: the
    // collision count goes up and the next hash names the new one.
    cut_loose(&rss, &first).await;
    replaced(&rss, &first, 2).await;
    let d = complete(&deployments, &pods, "adopt", 2, "registry.example/adopt:1").await;
    assert_eq!(d.status.unwrap().collision_count, Some(1));
    let owned = replica_sets(&rss, "adopt").await;
    assert_eq!(owned.len(), 1);
    assert_ne!(owned[0].metadata.name.as_ref(), Some(&first));

    stack.stop().await;
    eprintln!("adopted, released and collided in {:?}", started.elapsed());
}
