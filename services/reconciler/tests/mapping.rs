//! A user's mapping function (`Map::with`) on the real control plane: a change to a watched
//! kind keys the objects the function returns, through the watcher (which runs no user
//! code), the queue and the reconciler that runs the function.
//!
//! The controller keeps, on each ConfigMap, the names of the Secrets whose annotation lists
//! it. A Secret created or changed keys every ConfigMap it lists, which no label mapping can
//! express (one Secret, several ConfigMaps); the ConfigMaps themselves do not change, so
//! nothing but the mapping can key them again.
//!
//! It writes the annotation by server-side apply (`Context::apply`), so the ConfigMap's
//! managed fields name the controller as the annotation's manager. Its Secret watch has a
//! label selector: a Secret labelled `example.com/quiet: yes` keys nothing. A second test applies a
//! status with `Context::apply_status` and the `conditions` helpers: the condition's time
//! moves only when its status turns, and another manager's condition stays. A third scopes
//! the controller to one namespace (`Builder::namespaces`): nothing of another keys it, not
//! even the keys its mapping function returns there. A fourth holds reconciles back with a
//! predicate the watcher cannot run (`Builder::when`, in the reconciler). A fifth keys a
//! controller by every change but its own writes (`Predicate::NotWrittenBy`).

#![allow(clippy::unwrap_used)]

mod support;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use serde_json::json;
use switchyard_k8s::{
    Api, PostParams,
    k8s_openapi::{
        api::{
            core::v1::{ConfigMap, Secret},
            policy::v1::PodDisruptionBudget,
        },
        jiff::Timestamp,
    },
    kube::{
        ResourceExt,
        api::{Patch, PatchParams},
    },
};
use switchyard_proto::queue::v1::StatsRequest;
use switchyard_runtime::{Dialer, Role};
use switchyard_sdk::{
    Action, Builder, Context, Events, Map, ObjectRef, Options, Predicate, Registry, Result,
    cache::{CacheClient, ListFilter},
    conditions::{self, NewCondition, Status},
};
use switchyard_testenv::{ControlPlane, TestNamespace};

const CONTROLLER: &str = "example.com/v1/SecretsOfConfigMap";
/// A Secret's annotation: the ConfigMaps it is for, comma-separated.
const FOR: &str = "example.com/for";
/// A ConfigMap's annotation: the Secrets that list it, sorted, comma-separated.
const LISTED_BY: &str = "example.com/listed-by";
/// A Secret's label: `yes` keeps its changes from keying anything (the watch's selector).
const QUIET: &str = "example.com/quiet";

/// The ConfigMaps `secret` lists, in its namespace.
fn listed(secret: &Secret) -> Vec<String> {
    secret
        .annotations()
        .get(FOR)
        .map(|names| {
            names
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

async fn reconcile(map: Arc<ConfigMap>, ctx: Context) -> Result {
    let namespace = map.namespace().unwrap_or_default();
    let secrets: Vec<Secret> = ctx.cache.list(&namespace, ListFilter::default()).await?;
    let mut by: Vec<String> = secrets
        .iter()
        .filter(|s| listed(s).contains(&map.name_any()))
        .map(ResourceExt::name_any)
        .collect();
    by.sort();
    let by = by.join(",");
    if map.annotations().get(LISTED_BY) != Some(&by) {
        let mut applied = ConfigMap::default();
        applied.metadata.name = Some(map.name_any());
        applied.metadata.namespace = Some(namespace);
        applied.metadata.annotations = Some([(LISTED_BY.to_owned(), by)].into());
        ctx.apply(&applied).await?;
    }
    Ok(Action::await_change())
}

fn controller() -> Registry {
    let mut registry = Registry::default();
    registry.register(
        Builder::for_::<ConfigMap>()
            .named(CONTROLLER)
            .watches_with::<Secret>(
                Map::with(|secret: Arc<Secret>, _ctx| async move {
                    let namespace = secret.namespace().unwrap_or_default();
                    listed(&secret)
                        .into_iter()
                        .map(|name| ObjectRef::new(&name).within(&namespace))
                        .collect()
                }),
                // The watcher filters: a Secret labelled quiet keys nothing.
                Options::default().label_selector(format!("{QUIET}!=yes")),
            )
            .reconcile(reconcile),
    );
    registry
}

/// Waits until every ConfigMap of `expected` carries its annotation.
async fn await_listed(maps: &Api<ConfigMap>, expected: &[(&str, &str)]) {
    let deadline = tokio::time::Instant::now() + support::WITHIN;
    loop {
        let mut got = BTreeMap::new();
        for (name, _) in expected {
            let map = maps.get(name).await.unwrap();
            got.insert(*name, map.annotations().get(LISTED_BY).cloned());
        }
        let want: BTreeMap<&str, Option<String>> = expected
            .iter()
            .map(|(name, by)| (*name, Some((*by).to_owned())))
            .collect();
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "annotations {got:?}, expected {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn secret(name: &str, listed: &str) -> Secret {
    let mut secret = Secret::default();
    secret.metadata.name = Some(name.to_owned());
    secret.metadata.annotations = Some([(FOR.to_owned(), listed.to_owned())].into());
    secret
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_keys_the_objects_the_mapping_function_returns() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "mapping")
        .await
        .unwrap();
    // A queue that knows the built-in controllers only: it learns this controller's name and
    // its mapping's when they are first used.
    let queue = support::queue(switchyard_reconciler::BUILTIN, &[]).await;
    let config = format!(
        "shardCount: {}\nnamespaces:\n  include: [{}]\nregistrations:\n  - serviceAccount: switchyard-reconciler\n    kinds:\n      - {{apiVersion: v1, kind: ConfigMap, objects: full}}\n      - {{apiVersion: v1, kind: Secret, objects: full}}\n",
        support::SHARDS,
        ns.name()
    );
    let watcher = support::watcher(plane, &config, queue.grpc()).await;
    watcher.wait_ready(Duration::from_secs(60)).await;
    // The reconciler sends the mapped keys to the shards they hash to: its shard count must
    // be the queue's.
    let shards = format!("--shard-count={}", support::SHARDS);
    let reconciler = support::reconciler(
        plane,
        controller(),
        queue.grpc(),
        watcher.grpc(),
        &[&shards],
    )
    .await;

    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns.name());
    for name in ["a", "b", "c"] {
        let mut map = ConfigMap::default();
        map.metadata.name = Some(name.to_owned());
        maps.create(&PostParams::default(), &map).await.unwrap();
    }
    // Each reconciled once, for its creation: no Secret lists it yet.
    await_listed(&maps, &[("a", ""), ("b", ""), ("c", "")]).await;

    // One Secret keys two ConfigMaps; the third is not keyed.
    secrets
        .create(&PostParams::default(), &secret("s1", "a, b"))
        .await
        .unwrap();
    await_listed(&maps, &[("a", "s1"), ("b", "s1"), ("c", "")]).await;
    let managers = applied_by(maps.get("a").await.unwrap().metadata.managed_fields);
    assert!(
        managers.iter().any(|(manager, _)| manager == CONTROLLER),
        "{managers:?}"
    );

    // A change to what it lists keys the ConfigMaps it lists now: c gains it. (b, no longer
    // listed and not keyed, keeps its annotation until it is reconciled for another reason:
    // a mapping keys what the object names, as controller-runtime's does.)
    let patch = json!({"metadata": {"annotations": {FOR: "a,c,missing"}}});
    secrets
        .patch("s1", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    secrets
        .create(&PostParams::default(), &secret("s2", "a"))
        .await
        .unwrap();
    await_listed(&maps, &[("a", "s1,s2"), ("c", "s1")]).await;

    // A quiet Secret listing b keys nothing (the watch's label selector); one created after
    // it, listing a, does: b is not reconciled, a is.
    let mut quiet = secret("s3", "b");
    quiet.metadata.labels = Some([(QUIET.to_owned(), "yes".to_owned())].into());
    secrets
        .create(&PostParams::default(), &quiet)
        .await
        .unwrap();
    secrets
        .create(&PostParams::default(), &secret("s4", "a"))
        .await
        .unwrap();
    await_listed(&maps, &[("a", "s1,s2,s4")]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    await_listed(&maps, &[("b", "s1")]).await;

    // The mapping is a controller of the queue's, beside the one it keys, learned at run
    // time; nothing it returned is left waiting (the missing ConfigMap's key is done too).
    let mut stats = support::queue_client(Role::Observer, queue.grpc()).await;
    let mapping = format!("{CONTROLLER}/map/v1/Secret");
    for name in [CONTROLLER, mapping.as_str()] {
        let deadline = tokio::time::Instant::now() + support::WITHIN;
        loop {
            let shards = stats
                .stats(StatsRequest {
                    controller: name.to_owned(),
                })
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .into_inner()
                .shards;
            if shards.iter().all(|s| s.depth + s.in_flight == 0) {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{name}: {shards:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    reconciler.stop().await;
    watcher.stop().await;
    queue.stop().await;
}

/// Waits a second, then asserts that `map` carries no annotation: it was never reconciled.
async fn never_reconciled(maps: &Api<ConfigMap>, map: &str) {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let map = maps.get(map).await.unwrap();
    assert_eq!(map.annotations().get(LISTED_BY), None, "{map:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_scoped_to_a_namespace_is_keyed_there_only() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let inside = TestNamespace::create(plane, &client, "scoped")
        .await
        .unwrap();
    let outside = TestNamespace::create(plane, &client, "unscoped")
        .await
        .unwrap();
    let queue = support::queue(switchyard_reconciler::BUILTIN, &[]).await;
    let config = format!(
        "shardCount: {}\nnamespaces:\n  include: [{}, {}]\nregistrations:\n  - serviceAccount: switchyard-reconciler\n    kinds:\n      - {{apiVersion: v1, kind: ConfigMap, objects: full}}\n      - {{apiVersion: v1, kind: Secret, objects: full}}\n",
        support::SHARDS,
        inside.name(),
        outside.name()
    );
    let watcher = support::watcher(plane, &config, queue.grpc()).await;
    watcher.wait_ready(Duration::from_secs(60)).await;
    // The mapping names the ConfigMaps a Secret lists in both namespaces, whichever the
    // Secret's: the keys of the other namespace are dropped all the same.
    let both = [inside.name().to_owned(), outside.name().to_owned()];
    let mut registry = Registry::default();
    registry.register(
        Builder::for_::<ConfigMap>()
            .named(CONTROLLER)
            .namespaces([inside.name()])
            .watches::<Secret>(Map::with(move |secret: Arc<Secret>, _ctx| {
                let refs = listed(&secret)
                    .into_iter()
                    .flat_map(|name| both.clone().map(|ns| ObjectRef::new(&name).within(&ns)))
                    .collect();
                async move { refs }
            }))
            .reconcile(reconcile),
    );
    let shards = format!("--shard-count={}", support::SHARDS);
    let reconciler =
        support::reconciler(plane, registry, queue.grpc(), watcher.grpc(), &[&shards]).await;

    let maps_in: Api<ConfigMap> = Api::namespaced(client.clone(), inside.name());
    let maps_out: Api<ConfigMap> = Api::namespaced(client.clone(), outside.name());
    for maps in [&maps_out, &maps_in] {
        let mut map = ConfigMap::default();
        map.metadata.name = Some("a".to_owned());
        maps.create(&PostParams::default(), &map).await.unwrap();
    }
    // Created in both, after the one outside: reconciled inside only.
    await_listed(&maps_in, &[("a", "")]).await;
    never_reconciled(&maps_out, "a").await;

    // A Secret outside keys nothing, not even the ConfigMap inside its mapping names; one
    // inside keys the ConfigMap inside only.
    let secrets_out: Api<Secret> = Api::namespaced(client.clone(), outside.name());
    let secrets_in: Api<Secret> = Api::namespaced(client.clone(), inside.name());
    secrets_out
        .create(&PostParams::default(), &secret("s1", "a"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    secrets_in
        .create(&PostParams::default(), &secret("s2", "a"))
        .await
        .unwrap();
    await_listed(&maps_in, &[("a", "s2")]).await;
    never_reconciled(&maps_out, "a").await;

    reconciler.stop().await;
    watcher.stop().await;
    queue.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_is_applied_as_the_controller_with_its_conditions() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "apply")
        .await
        .unwrap();
    // No watcher: a write only raises the read floor, which nothing reads here.
    let cache = CacheClient::new(&Dialer::plaintext(), "127.0.0.1:1").unwrap();
    let ctx = Context::of(client.clone(), cache, Events::new(client.clone(), "test"))
        .managed_as("example.com/v1/Budgeter");
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns.name());
    let budget: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "b"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "b"}}},
    }))
    .unwrap();
    budgets
        .create(&PostParams::default(), &budget)
        .await
        .unwrap();

    // Another manager's condition first; then the controller's.
    budgets
        .patch_status(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{
                "type": "Audited", "status": "True", "reason": "Checked", "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }]}})),
        )
        .await
        .unwrap();
    let t0: Timestamp = "2026-11-01T00:00:00Z".parse().unwrap();
    let written = ctx
        .apply_status::<PodDisruptionBudget>(
            "b",
            Some(ns.name()),
            &json!({"conditions": healthy(Status::False, "Waiting", t0, &[]), "observedGeneration": 1}),
        )
        .await
        .unwrap();
    let conditions = written.status.unwrap().conditions.unwrap_or_default();
    assert!(
        conditions::is(&conditions, "Audited", Status::True),
        "{conditions:?}"
    );
    assert!(
        conditions::is(&conditions, "Healthy", Status::False),
        "{conditions:?}"
    );

    // Read back, set again: the same status keeps its time; a new one moves it.
    let later: Timestamp = "2026-11-01T00:05:00Z".parse().unwrap();
    let same = healthy(Status::False, "StillWaiting", later, &conditions);
    let found = conditions::find(&same, "Healthy").unwrap();
    assert_eq!(found.last_transition_time.0, t0);
    let turned = healthy(Status::True, "Ready", later, &conditions);
    let written = ctx
        .apply_status::<PodDisruptionBudget>(
            "b",
            Some(ns.name()),
            &json!({"conditions": turned.iter().filter(|c| c.type_ == "Healthy").collect::<Vec<_>>()}),
        )
        .await
        .unwrap();
    let conditions = written.status.unwrap().conditions.unwrap_or_default();
    assert!(conditions::is_true_for(&conditions, "Healthy", Some(1)));
    assert_eq!(
        conditions::find(&conditions, "Healthy")
            .unwrap()
            .last_transition_time
            .0,
        later
    );
    assert!(
        conditions::is_true(&conditions, "Audited"),
        "the other manager's condition stays"
    );
    let status_managers: Vec<String> = applied_by(
        budgets
            .get_status("b")
            .await
            .unwrap()
            .metadata
            .managed_fields,
    )
    .into_iter()
    .filter(|(_, subresource)| subresource == "status")
    .map(|(manager, _)| manager)
    .collect();
    assert_eq!(status_managers, [ctx.field_manager()]);
}

/// The managers that wrote by server-side apply, each with the subresource written (empty:
/// the object itself).
fn applied_by(
    fields: Option<
        Vec<switchyard_k8s::k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry>,
    >,
) -> Vec<(String, String)> {
    fields
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f.operation.as_deref() == Some("Apply"))
        .map(|f| {
            (
                f.manager.unwrap_or_default(),
                f.subresource.unwrap_or_default(),
            )
        })
        .collect()
}

/// `conditions` with the controller's `Healthy` condition set as `status` for `reason` at `now`.
fn healthy(
    status: Status,
    reason: &str,
    now: Timestamp,
    conditions: &[switchyard_k8s::k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Vec<switchyard_k8s::k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    let mut conditions = conditions.to_vec();
    conditions::set(
        &mut conditions,
        NewCondition {
            type_: "Healthy",
            status,
            reason,
            message: "",
            observed_generation: Some(1),
        },
        now,
    );
    conditions
}

/// A predicate over the object as last reconciled and as it is now, which the watcher
/// cannot evaluate (it compares ConfigMaps' data, and any change keys them): a label's
/// change is leased and reported done without a reconcile; a data change reconciles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciler_predicate_holds_back_reconciles_of_unchanged_data() {
    let reconciles = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut registry = Registry::default();
    registry.register(
        Builder::for_::<ConfigMap>()
            .named("example.com/v1/DataWatcher")
            .when(|old, new| old.is_none_or(|old| old.data != new.data))
            .reconcile({
                let reconciles = reconciles.clone();
                move |_, _| {
                    reconciles.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    async { Ok(Action::Done) }
                }
            }),
    );
    let env = switchyard_sdk_test::Env::start("when", registry).await;
    let maps: Api<ConfigMap> = Api::namespaced(env.client(), env.namespace());
    let done = || async {
        env.reconciler()
            .metric(
                "switchyard_reconcile_total{controller=\"example.com/v1/DataWatcher\",result=\"success\"}",
            )
            .await
    };
    let count = || reconciles.load(std::sync::atomic::Ordering::SeqCst);
    let map: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "settings"},
        "data": {"size": "1"},
    }))
    .unwrap();
    maps.create(&PostParams::default(), &map).await.unwrap();
    switchyard_sdk_test::eventually("the creation is reconciled", || async {
        (done().await >= 1.0).then_some(())
    })
    .await;
    assert_eq!(count(), 1);

    let label = json!({"metadata": {"labels": {"touched": "yes"}}});
    maps.patch("settings", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    switchyard_sdk_test::eventually("the label's change is leased and done", || async {
        (done().await >= 2.0).then_some(())
    })
    .await;
    assert_eq!(count(), 1, "no reconcile for a change of labels only");

    let data = json!({"data": {"size": "2"}});
    maps.patch("settings", &PatchParams::default(), &Patch::Merge(&data))
        .await
        .unwrap();
    switchyard_sdk_test::eventually("the data's change is reconciled", || async {
        (count() == 2).then_some(())
    })
    .await;
    env.stop().await;
}

/// A field selector per watch (`Options::field_selector`), evaluated by the watcher: only the
/// ConfigMaps whose fields match key the controller, on creation and on a change that makes
/// them match.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_selector_keys_only_the_objects_whose_fields_match() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut registry = Registry::default();
    registry.register(
        Builder::for_with::<ConfigMap>(
            Options::default().field_selector("data.tier=gold, metadata.name!=skipped"),
        )
        .named("example.com/v1/GoldOnly")
        .reconcile({
            let seen = seen.clone();
            move |map: Arc<ConfigMap>, _| {
                seen.lock().unwrap().push(map.name_any());
                async { Ok(Action::Done) }
            }
        }),
    );
    let env = switchyard_sdk_test::Env::start("fields", registry).await;
    let maps: Api<ConfigMap> = Api::namespaced(env.client(), env.namespace());
    for (name, tier) in [("silver", "silver"), ("skipped", "gold"), ("gold", "gold")] {
        let map: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": name},
            "data": {"tier": tier},
        }))
        .unwrap();
        maps.create(&PostParams::default(), &map).await.unwrap();
    }
    switchyard_sdk_test::eventually("the gold ConfigMap is reconciled", || async {
        seen.lock()
            .unwrap()
            .contains(&"gold".to_owned())
            .then_some(())
    })
    .await;
    // Created before it: the others were never keyed.
    assert_eq!(*seen.lock().unwrap(), ["gold"]);
    // Changed so that it matches: keyed.
    let upgrade = json!({"data": {"tier": "gold"}});
    maps.patch("silver", &PatchParams::default(), &Patch::Merge(&upgrade))
        .await
        .unwrap();
    switchyard_sdk_test::eventually("the upgraded ConfigMap is reconciled", || async {
        seen.lock()
            .unwrap()
            .contains(&"silver".to_owned())
            .then_some(())
    })
    .await;
    assert!(!seen.lock().unwrap().contains(&"skipped".to_owned()));
    env.stop().await;
}

/// `Predicate::NotWrittenBy`, evaluated by the watcher from `managedFields`: a controller that
/// copies a ConfigMap's `data.source` into an annotation, by server-side apply under its own
/// field manager, is keyed by everyone's changes but its own writes. Without the predicate,
/// each of its writes would key it once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_is_not_keyed_by_its_own_writes() {
    const COPIER: &str = "example.com/v1/Copier";
    const COPIED: &str = "example.com/copied";
    let reconciles = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut registry = Registry::default();
    registry.register(
        Builder::for_with::<ConfigMap>(
            Options::default().predicates([Predicate::NotWrittenBy(COPIER.to_owned())]),
        )
        .named(COPIER)
        .reconcile({
            let reconciles = reconciles.clone();
            move |map: Arc<ConfigMap>, ctx: Context| {
                reconciles.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async move {
                    let source = map
                        .data
                        .as_ref()
                        .and_then(|d| d.get("source"))
                        .cloned()
                        .unwrap_or_default();
                    if map.annotations().get(COPIED) != Some(&source) {
                        let mut copy = ConfigMap::default();
                        copy.metadata.name = Some(map.name_any());
                        copy.metadata.namespace = map.namespace();
                        copy.metadata.annotations = Some([(COPIED.to_owned(), source)].into());
                        ctx.apply(&copy).await?;
                    }
                    Ok(Action::Done)
                }
            }
        }),
    );
    let env = switchyard_sdk_test::Env::start("writers", registry).await;
    let maps: Api<ConfigMap> = Api::namespaced(env.client(), env.namespace());
    let count = || reconciles.load(std::sync::atomic::Ordering::SeqCst);
    let copied = || async {
        maps.get("settings")
            .await
            .unwrap()
            .annotations()
            .get(COPIED)
            .cloned()
    };
    // Long enough for a key of the controller's own write to come through.
    let quiet = || tokio::time::sleep(Duration::from_secs(3));

    let map: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "settings"},
        "data": {"source": "a"},
    }))
    .unwrap();
    maps.create(&PostParams::default(), &map).await.unwrap();
    switchyard_sdk_test::eventually("the creation is copied", || async {
        (copied().await.as_deref() == Some("a")).then_some(())
    })
    .await;
    quiet().await;
    assert_eq!(count(), 1, "the controller's own write keyed it");

    // Another manager's change keys it; its write back again does not.
    let tester = PatchParams {
        field_manager: Some("tester".into()),
        ..PatchParams::default()
    };
    let source = json!({"data": {"source": "b"}});
    maps.patch("settings", &tester, &Patch::Merge(&source))
        .await
        .unwrap();
    switchyard_sdk_test::eventually("the change is copied", || async {
        (copied().await.as_deref() == Some("b")).then_some(())
    })
    .await;
    quiet().await;
    assert_eq!(count(), 2, "the controller's own write keyed it");

    // A change to a field nobody else reads, by another manager: keyed all the same.
    let other = json!({"data": {"other": "x"}});
    maps.patch("settings", &tester, &Patch::Merge(&other))
        .await
        .unwrap();
    switchyard_sdk_test::eventually("another manager's change is reconciled", || async {
        (count() == 3).then_some(())
    })
    .await;
    env.stop().await;
}
