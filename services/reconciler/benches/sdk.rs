//! `make bench-sdk`: what a predicate the watcher cannot run costs in the reconciler
//! (`Builder::when`), against the shared control plane, with a queue, a watcher and one
//! reconciler in this process (`switchyard_sdk_test::Env`).
//!
//! 1,000 ConfigMaps are created and reconciled; then, per round, every one is relabelled (a
//! change the predicate, which compares `data`, holds back) and then given new data (which
//! passes it, to a reconcile that does nothing). The reconciler's own time per key is read
//! from `switchyard_reconcile_time_seconds` (sum and count, their growth over each phase):
//!
//! - `sdk.when_held_us_per_key` (µs): a key the predicate held back: the cache read and the
//!   predicate, no reconcile;
//! - `sdk.when_passed_us_per_key` (µs): a key it let through to an empty reconcile, for
//!   comparison;
//! - `sdk.when_held_keys` (keys): keys held back over the rounds, which must be every
//!   relabelling (`sdk.when_reconciles_on_labels`, reconciles run for them, must be 0).
//!
//! Each held key also costs what any key costs (the watcher's enqueue, the queue's lease and
//! outcome: `make bench-queue`, `make bench-watcher`); a declarative predicate the watcher
//! runs (`Predicate::FieldChanged`) keys nothing for such a change and costs
//! `watcher.field_predicate_us_per_pod` per event. No peer figure: kube-rs and
//! controller-runtime run their predicates on the watch event in the controller's process,
//! before any queue, which is the watcher's place here.
//! `SWITCHYARD_BENCH_ROUNDS` rounds (2 by default); each figure is the median.

#![allow(clippy::unwrap_used)]

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use futures::{StreamExt, stream};
use serde_json::json;
use switchyard_k8s::{
    Api, PostParams,
    k8s_openapi::api::core::v1::ConfigMap,
    kube::api::{Patch, PatchParams},
};
use switchyard_sdk::{Action, Builder, Registry};
use switchyard_sdk_test::{Env, EnvOptions, eventually_within};

const OBJECTS: usize = 1_000;
const WRITERS: usize = 16;
const CONTROLLER: &str = "example.com/v1/Bench";

/// The reconciler's time spent on the controller's keys so far: seconds, and keys.
async fn spent(env: &Env) -> (f64, f64) {
    let series = |suffix: &str| {
        format!("switchyard_reconcile_time_seconds_{suffix}{{controller=\"{CONTROLLER}\"}}")
    };
    let reconciler = env.reconciler();
    (
        reconciler.metric(&series("sum")).await,
        reconciler.metric(&series("count")).await,
    )
}

/// Patches every ConfigMap with `patch(i)`, `WRITERS` at a time.
async fn patch_all(maps: &Api<ConfigMap>, patch: impl Fn(usize) -> serde_json::Value) {
    stream::iter(0..OBJECTS)
        .for_each_concurrent(WRITERS, |i| {
            let body = patch(i);
            async move {
                maps.patch(
                    &format!("m{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(&body),
                )
                .await
                .unwrap();
            }
        })
        .await;
}

/// Waits until the controller has finished `keys` keys in all, then returns the µs per key
/// spent since `before`.
async fn per_key_since(env: &Env, before: (f64, f64), keys: f64) -> f64 {
    let what = format!("{keys} keys done");
    eventually_within(&what, std::time::Duration::from_secs(300), || async {
        (spent(env).await.1 >= keys).then_some(())
    })
    .await;
    let after = spent(env).await;
    (after.0 - before.0) * 1e6 / (after.1 - before.1)
}

async fn run() {
    let reconciles = Arc::new(AtomicUsize::new(0));
    let mut registry = Registry::default();
    registry.register(
        Builder::for_::<ConfigMap>()
            .named(CONTROLLER)
            .when(|old, new| old.is_none_or(|old| old.data != new.data))
            .reconcile({
                let reconciles = reconciles.clone();
                move |_, _| {
                    reconciles.fetch_add(1, Ordering::SeqCst);
                    async { Ok(Action::Done) }
                }
            }),
    );
    let env = Env::start_with(
        "bench-sdk",
        registry,
        EnvOptions {
            reconciler_flags: vec!["--concurrency=16".into()],
            ..EnvOptions::default()
        },
    )
    .await;
    let maps: Api<ConfigMap> = Api::namespaced(env.client(), env.namespace());
    stream::iter(0..OBJECTS)
        .for_each_concurrent(WRITERS, |i| {
            let maps = maps.clone();
            async move {
                let map: ConfigMap = serde_json::from_value(json!({
                    "metadata": {"name": format!("m{i}")},
                    "data": {"round": "0"},
                }))
                .unwrap();
                maps.create(&PostParams::default(), &map).await.unwrap();
            }
        })
        .await;
    let mut keys = OBJECTS as f64;
    per_key_since(&env, (0.0, 0.0), keys).await;

    let (mut held, mut passed) = (Vec::new(), Vec::new());
    let (mut held_keys, mut reconciles_on_labels) = (0.0, 0);
    for round in 1..=switchyard_testenv::bench_rounds() {
        let before = spent(&env).await;
        let reconciled = reconciles.load(Ordering::SeqCst);
        patch_all(
            &maps,
            |_| json!({"metadata": {"labels": {"round": round.to_string()}}}),
        )
        .await;
        keys += OBJECTS as f64;
        held.push(per_key_since(&env, before, keys).await);
        held_keys += spent(&env).await.1 - before.1;
        reconciles_on_labels += reconciles.load(Ordering::SeqCst) - reconciled;

        let before = spent(&env).await;
        patch_all(&maps, |_| json!({"data": {"round": round.to_string()}})).await;
        keys += OBJECTS as f64;
        passed.push(per_key_since(&env, before, keys).await);
    }
    eprintln!("sdk: µs per key: held {held:?}, passed {passed:?}");
    let median = |runs| switchyard_testenv::median(runs).expect("a round");
    println!("bench sdk.when_held_us_per_key {:.1} us", median(held));
    println!("bench sdk.when_passed_us_per_key {:.1} us", median(passed));
    println!("bench sdk.when_held_keys {held_keys} keys");
    println!("bench sdk.when_reconciles_on_labels {reconciles_on_labels} reconciles");
    env.stop().await;
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run());
}
