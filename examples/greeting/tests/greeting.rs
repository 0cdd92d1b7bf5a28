//! The example controller end to end on the harness's real control plane: a queue started
//! with only the built-in controllers' names (it learns the Greeting controller's when the
//! worker or the first key names it), a watcher with the configuration of
//! `deploy/kustomize/overlays/sdk-only`, which names no controller (the reconciler registers
//! the Greeting controller's watches when it starts) and no garbage collector, and a
//! reconciler running only that controller.

#![allow(clippy::unwrap_used)]

mod scenario;

use std::time::Duration;
use switchyard_sdk_test as support;

use switchyard_example_greeting::Greeting;
use switchyard_sdk::{Registry, default_name};
use switchyard_testenv::{ControlPlane, TestNamespace};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_greeting_gets_its_config_map_and_the_finalizer_cleans_it_up() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    scenario::install_crd(&client).await;
    let ns = TestNamespace::create(plane, &client, "greeting")
        .await
        .unwrap();

    let name = default_name::<Greeting>();
    assert_eq!(name, "example.switchyard.io/v1/Greeting");
    let queue = support::queue(&[], &[]).await;
    // The watcher configuration deploy/kustomize/overlays/sdk-only ships for this controller
    // (no garbage collector; its kinds granted to the reconciler's identity), with the test's
    // shard count and confined to the test's namespace.
    let mut config: serde_norway::Value = serde_norway::from_str(include_str!(
        "../../../deploy/kustomize/overlays/sdk-only/watcher-config.yaml"
    ))
    .unwrap();
    config["shardCount"] = support::SHARDS.into();
    config["namespaces"] = serde_norway::from_str(&format!("include: [{}]", ns.name())).unwrap();
    let config = serde_norway::to_string(&config).unwrap();
    let watcher = support::watcher(plane, &config, queue.grpc()).await;
    watcher.wait_ready(Duration::from_secs(60)).await;
    let mut registry = Registry::default();
    registry.register(switchyard_example_greeting::controller());
    // Returns once the watcher has listed what the controller's watches need.
    let reconciler = support::reconciler(plane, registry, queue.grpc(), watcher.grpc(), &[]).await;

    scenario::greeting_lifecycle(&client, ns.name(), "switchyard-reconciler").await;

    reconciler.stop().await;
    watcher.stop().await;
    queue.stop().await;
}
