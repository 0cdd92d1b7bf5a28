//! The ReplicaSet controller end to end: the real control plane (kwok makes Pods Ready), a
//! queue, a watcher and reconcilers in this process. A watch on the Pods checks, at every
//! event, that the active Pods never outnumber `replicas`.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use switchyard_k8s::{
    Api, DeleteParams, ListParams, Pod, PostParams, ReplicaSet, await_condition,
    kube::api::{Patch, PatchParams},
    watcher,
};
use switchyard_reconciler_core::replicaset::{controller_of, is_active};
use switchyard_runtime::Role;
use switchyard_testenv::{ControlPlane, Pki, TestNamespace};
use tokio::task::JoinHandle;

use support::{RS, WITHIN, converged, replica_set};

/// Watches the namespace's Pods; at every event that adds an active Pod, the active count
/// must not exceed the target.
struct Observer {
    target: Arc<AtomicUsize>,
    violations: Arc<Mutex<Vec<String>>>,
    max_active: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Observer {
    async fn start(api: Api<Pod>, target: usize) -> Self {
        let target = Arc::new(AtomicUsize::new(target));
        let violations = Arc::new(Mutex::new(Vec::new()));
        let max_active = Arc::new(AtomicUsize::new(0));
        let (synced_tx, synced) = tokio::sync::oneshot::channel();
        let task = tokio::spawn({
            let (target, violations, max_active) =
                (target.clone(), violations.clone(), max_active.clone());
            async move {
                let mut active: BTreeMap<String, bool> = BTreeMap::new();
                let mut synced_tx = Some(synced_tx);
                let mut events = watcher(api, watcher::Config::default()).boxed();
                while let Some(event) = events.try_next().await.unwrap() {
                    let before = active.values().filter(|a| **a).count();
                    match event {
                        watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                            active.insert(pod.metadata.name.clone().unwrap(), is_active(&pod));
                        }
                        watcher::Event::Delete(pod) => {
                            active.remove(pod.metadata.name.as_deref().unwrap());
                        }
                        watcher::Event::Init => active.clear(),
                        watcher::Event::InitDone => {
                            if let Some(tx) = synced_tx.take() {
                                let _ = tx.send(());
                            }
                        }
                    }
                    let now = active.values().filter(|a| **a).count();
                    max_active.fetch_max(now, Ordering::SeqCst);
                    let wanted = target.load(Ordering::SeqCst);
                    if now > before && now > wanted {
                        violations
                            .lock()
                            .unwrap()
                            .push(format!("{now} active Pods with replicas {wanted}"));
                    }
                }
            }
        });
        synced.await.unwrap();
        Self {
            target,
            violations,
            max_active,
            task,
        }
    }

    fn set_target(&self, replicas: usize) {
        self.target.store(replicas, Ordering::SeqCst);
    }

    fn assert_never_overshot(&self) {
        let violations = self.violations.lock().unwrap();
        assert!(
            violations.is_empty(),
            "more Pods than replicas: {violations:?}"
        );
    }
}

async fn scale(rs_api: &Api<ReplicaSet>, name: &str, replicas: i32) {
    rs_api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_set_gets_its_pods_scales_and_replaces_without_overshooting() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "rs-e2e")
        .await
        .unwrap();
    let queue = support::queue(&[RS], &[]).await;
    let watcher = support::watcher(
        plane,
        &support::watcher_config(&[ns.name()], ""),
        queue.grpc(),
    )
    .await;
    watcher.wait_ready(WITHIN).await;
    // Two workers: the key moves between them, and each must see the other's writes.
    let mut reconcilers = Vec::new();
    for _ in 0..2 {
        let reconciler = support::reconciler(
            plane,
            support::replica_set_controller(),
            queue.grpc(),
            watcher.grpc(),
            &[],
        )
        .await;
        reconciler.wait_ready(WITHIN).await;
        reconcilers.push(reconciler);
    }

    let rs_api: Api<ReplicaSet> = Api::namespaced(client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    let observer = Observer::start(pods.clone(), 10).await;

    rs_api
        .create(&PostParams::default(), &replica_set("web", 10))
        .await
        .unwrap();
    converged(&rs_api, &pods, "web", 10).await;

    observer.set_target(15);
    scale(&rs_api, "web", 15).await;
    converged(&rs_api, &pods, "web", 15).await;

    observer.set_target(3);
    scale(&rs_api, "web", 3).await;
    let three = converged(&rs_api, &pods, "web", 3).await;

    let victim = three[0].metadata.name.clone().unwrap();
    pods.delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    // Wait for a replacement: three active Pods, all ready, none of them the deleted one.
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let active = support::active_pods(&pods, "").await;
            if active.len() == 3
                && active
                    .iter()
                    .all(|p| p.metadata.name.as_ref() != Some(&victim))
                && active
                    .iter()
                    .all(switchyard_reconciler_core::replicaset::is_ready)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the deleted Pod is replaced by a ready one");
    let replaced = converged(&rs_api, &pods, "web", 3).await;
    assert!(
        replaced
            .iter()
            .all(|p| p.metadata.name.as_ref() != Some(&victim))
    );

    observer.assert_never_overshot();
    assert_eq!(observer.max_active.load(Ordering::SeqCst), 15);
    observer.task.abort();
    for reconciler in &reconcilers {
        let series =
            r#"switchyard_reconcile_total{controller="apps/v1/ReplicaSet",result="success"}"#;
        assert!(
            reconciler.metric(series).await > 0.0,
            "both workers reconciled"
        );
    }
    for reconciler in reconcilers {
        reconciler.stop().await;
    }
    watcher.stop().await;
    queue.stop().await;
}

fn orphan(name: &str, app: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app, "tier": "web"}},
        "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]}
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_set_adopts_matching_orphans_and_releases_pods_that_stop_matching() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "rs-adopt")
        .await
        .unwrap();
    let queue = support::queue(&[RS], &[]).await;
    let watcher = support::watcher(
        plane,
        &support::watcher_config(&[ns.name()], ""),
        queue.grpc(),
    )
    .await;
    watcher.wait_ready(WITHIN).await;
    let reconciler = support::reconciler(
        plane,
        support::replica_set_controller(),
        queue.grpc(),
        watcher.grpc(),
        &[],
    )
    .await;
    reconciler.wait_ready(WITHIN).await;
    let rs_api: Api<ReplicaSet> = Api::namespaced(client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());

    // An orphan the selector matches, and one it does not.
    let params = PostParams::default();
    pods.create(&params, &orphan("orphan", "adopt"))
        .await
        .unwrap();
    pods.create(&params, &orphan("stranger", "other"))
        .await
        .unwrap();
    rs_api
        .create(&params, &replica_set("adopt", 2))
        .await
        .unwrap();
    let owned = converged(&rs_api, &pods, "adopt", 2).await;
    assert!(
        owned
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some("orphan")),
        "the matching orphan is adopted, so only one Pod is created"
    );
    assert!(controller_of(&pods.get("stranger").await.unwrap()).is_none());

    // A Pod relabeled out of the selector is released and replaced.
    pods.patch(
        "orphan",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "gone"}}})),
    )
    .await
    .unwrap();
    let released = await_condition(pods.clone(), "orphan", |pod: Option<&Pod>| {
        pod.is_some_and(|p| controller_of(p).is_none())
    });
    tokio::time::timeout(Duration::from_secs(30), released)
        .await
        .expect("the relabeled Pod is released")
        .unwrap();
    let owned = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let owned = pods
                .list(&ListParams::default().labels("app=adopt"))
                .await
                .unwrap()
                .items;
            if owned.len() == 2
                && owned
                    .iter()
                    .all(switchyard_reconciler_core::replicaset::is_ready)
            {
                return owned;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("a replacement is created");
    assert!(
        owned
            .iter()
            .all(|p| p.metadata.name.as_deref() != Some("orphan"))
    );
    converged(&rs_api, &pods, "adopt", 2).await;

    // An orphan that comes to match later (the released Pod, relabelled back) is claimed at
    // once, as kube-controller-manager's Pod handlers key the ReplicaSets whose selector
    // matches an orphan: adopted, and then one Pod of the three goes.
    pods.patch(
        "orphan",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "adopt"}}})),
    )
    .await
    .unwrap();
    let claimed = await_condition(pods.clone(), "orphan", |pod: Option<&Pod>| {
        pod.is_none_or(|p| controller_of(p).is_some() || p.metadata.deletion_timestamp.is_some())
    });
    tokio::time::timeout(Duration::from_secs(10), claimed)
        .await
        .expect("the orphan that matches again is claimed within 10 s, not at the next resync")
        .unwrap();
    converged(&rs_api, &pods, "adopt", 2).await;

    reconciler.stop().await;
    watcher.stop().await;
    queue.stop().await;
}

/// The controller called directly, twice back to back, against the real watcher's cache and
/// the apiserver: the first reconcile counts the Pods it just created (its status reads its
/// own writes), and the second creates none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_counts_its_own_writes_and_the_next_one_adds_nothing() {
    use switchyard_sdk::{Action, Context, Controller, Request, cache::CacheClient};

    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "rs-own-writes")
        .await
        .unwrap();
    // Nobody leases from this queue: the reconciles below are the only ones.
    let queue = support::queue(&[RS], &[]).await;
    let watcher = support::watcher(
        plane,
        &support::watcher_config(&[ns.name()], ""),
        queue.grpc(),
    )
    .await;
    watcher.wait_ready(WITHIN).await;
    let _watching = support::register(watcher.grpc(), &support::replica_set_controller()).await;
    // Two watcher addresses, one of them down: every read it gets goes on to the other.
    let mut ctx = Context::new(
        client.clone(),
        CacheClient::new(
            &Pki::shared().dialer(Role::Reconciler),
            &format!("127.0.0.1:9,{}", watcher.grpc()),
        )
        .unwrap(),
        "test",
    );
    ctx.cache = ctx.cache.reading_at(Default::default(), ns.name());
    let rs_api: Api<ReplicaSet> = Api::namespaced(client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    let created = rs_api
        .create(&PostParams::default(), &replica_set("own", 5))
        .await
        .unwrap();
    // The cache has the ReplicaSet.
    ctx.cache
        .get::<ReplicaSet>(
            ns.name(),
            "own",
            created.metadata.resource_version.as_deref(),
        )
        .await
        .unwrap()
        .expect("cached");

    let request = Request {
        namespace: ns.name().to_owned(),
        name: "own".into(),
        attempt: 1,
    };
    let controller = switchyard_reconciler::replicaset::ReplicaSetController;
    let first = controller.reconcile(&ctx, &request).await.unwrap();
    assert_eq!(first, Action::Done);
    let status = rs_api.get("own").await.unwrap().status.unwrap();
    assert_eq!(
        (status.replicas, status.observed_generation),
        (5, Some(1)),
        "the status counts the Pods this reconcile created"
    );
    for _ in 0..2 {
        controller.reconcile(&ctx, &request).await.unwrap();
        let active = support::active_pods(&pods, "").await.len();
        assert_eq!(active, 5, "a reconcile right after another adds no Pod");
    }
    // What the reads were answered at, for the shard's read floor: at least the writes.
    let observed = ctx.cache.observed();
    let written = rs_api.get("own").await.unwrap().metadata.resource_version;
    let written: u64 = written.unwrap().parse().unwrap();
    for versions in [&observed.kinds, &observed.namespace] {
        assert!(versions["apps/v1/ReplicaSet"] >= written, "{observed:?}");
        assert!(versions["v1/Pod"] > 0, "{observed:?}");
    }

    watcher.stop().await;
    queue.stop().await;
}

/// kube-controller-manager's `canAdopt`: the owner is read again from the apiserver before
/// adopting. One recreated under the same name (another UID) or being deleted adopts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_rereads_the_owner_and_refuses_one_gone_or_being_deleted() {
    use switchyard_sdk::{Context, cache::CacheClient};

    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "rs-can-adopt")
        .await
        .unwrap();
    // can_adopt reads the apiserver only: the cache is never dialed.
    let ctx = Context::new(
        client.clone(),
        CacheClient::new(&Pki::shared().dialer(Role::Reconciler), "127.0.0.1:9").unwrap(),
        "test",
    );
    let rs_api: Api<ReplicaSet> = Api::namespaced(client.clone(), ns.name());
    let mut held = replica_set("owner", 0);
    held.metadata.finalizers = Some(vec!["switchyard.dev/test-hold".into()]);
    let created = rs_api.create(&PostParams::default(), &held).await.unwrap();
    switchyard_reconciler::replicaset::can_adopt(&ctx, &created)
        .await
        .expect("the owner as read may adopt");

    // The cache's copy of an owner deleted and recreated under the same name.
    let mut stale = created.clone();
    stale.metadata.uid = Some("00000000-0000-0000-0000-000000000000".into());
    let error = switchyard_reconciler::replicaset::can_adopt(&ctx, &stale)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("is gone"), "{error}");

    // Being deleted (a finalizer holds it).
    rs_api
        .delete("owner", &DeleteParams::default())
        .await
        .unwrap();
    let error = switchyard_reconciler::replicaset::can_adopt(&ctx, &created)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("has just been deleted"), "{error}");
    rs_api
        .patch(
            "owner",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();

    // The same check guards the Deployment controller's adoptions.
    let deployments: Api<switchyard_k8s::Deployment> = Api::namespaced(client.clone(), ns.name());
    let d = deployments
        .create(
            &PostParams::default(),
            &switchyard_testenv::manifests::deployment("owner", 0, serde_json::Value::Null),
        )
        .await
        .unwrap();
    switchyard_reconciler::deployment::can_adopt(&ctx, &d)
        .await
        .expect("the Deployment as read may adopt");
    let mut stale = d.clone();
    stale.metadata.uid = Some("00000000-0000-0000-0000-000000000000".into());
    let error = switchyard_reconciler::deployment::can_adopt(&ctx, &stale)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("is gone"), "{error}");
}

/// A reconcile of a key whose shard moved lately confirms with the apiserver before it
/// creates Pods that its read lacks. The watcher reaches the apiserver through a proxy that
/// is then held, so its cache answers without the two Pods created next, as it would
/// without a previous owner's last writes: told of the move, the reconcile reads again at
/// the apiserver's newest Pod, which the watcher does not reach, and fails having created
/// nothing. Not told, the same reconcile creates two more Pods, which the check prevents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_shard_move_pods_missing_from_the_cache_are_confirmed_before_creating() {
    use switchyard_reconciler_core::replicaset::{Spec, pod_from_template};
    use switchyard_sdk::{Context, Controller, Request, cache::CacheClient};

    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "rs-moved")
        .await
        .unwrap();
    let queue = support::queue(&[RS], &[]).await;
    let proxy = support::HeldProxy::start(plane).await;
    let watcher = support::watcher_reaching(
        proxy.kubeconfig(),
        &support::watcher_config(&[ns.name()], ""),
        &format!("--queue-addr={}", queue.grpc()),
        "127.0.0.1:0",
    )
    .await;
    watcher.wait_ready(WITHIN).await;
    let _watching = support::register(watcher.grpc(), &support::replica_set_controller()).await;
    let cache = CacheClient::new(
        &Pki::shared().dialer(Role::Reconciler),
        &watcher.grpc().to_string(),
    )
    .unwrap();
    let rs_api: Api<ReplicaSet> = Api::namespaced(client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    let rs = rs_api
        .create(&PostParams::default(), &replica_set("moved", 2))
        .await
        .unwrap();
    cache
        .get::<ReplicaSet>(ns.name(), "moved", rs.metadata.resource_version.as_deref())
        .await
        .unwrap()
        .expect("cached");

    proxy.hold();
    let spec = Spec::new(&rs).unwrap();
    for _ in 0..2 {
        pods.create(&PostParams::default(), &pod_from_template(&spec))
            .await
            .unwrap();
    }
    let request = Request {
        namespace: ns.name().to_owned(),
        name: "moved".into(),
        attempt: 1,
    };
    let controller = switchyard_reconciler::replicaset::ReplicaSetController;
    let reconcile = |moved: bool| {
        let ctx = Context::new(
            client.clone(),
            cache
                .reading_at(Default::default(), ns.name())
                .after_shard_move(moved),
            "test",
        );
        let request = request.clone();
        async move { controller.reconcile(&ctx, &request).await }
    };

    let error = reconcile(true)
        .await
        .expect_err("the watcher never shows the Pods");
    assert_eq!(
        support::active_pods(&pods, "app=moved").await.len(),
        2,
        "nothing created after a shard move: {error}"
    );
    // The same read without the move: the cache lacks both Pods, and two more are made.
    let _ = reconcile(false).await;
    assert_eq!(
        support::active_pods(&pods, "app=moved").await.len(),
        4,
        "a reconcile not told of the move trusts the cache"
    );

    proxy.release();
    watcher.stop().await;
    queue.stop().await;
}
