//! The example controller end to end on the harness's real control plane: a queue started
//! with only the built-in controllers' names (it learns the Greeting controller's when the
//! worker or the first key names it), a watcher whose configuration names no controller (the
//! reconciler registers the Greeting controller's watches when it starts) and a reconciler
//! running only that controller.

#![allow(clippy::unwrap_used)]

mod scenario;
#[path = "../../../services/reconciler/tests/support/mod.rs"]
mod support;

use std::time::Duration;

use switchyard_example_greeting::Greeting;
use switchyard_reconciler::sdk::{Registry, default_name};
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
    let queue = support::queue(switchyard_reconciler::BUILTIN, &[]).await;
    let config = format!(
        "shardCount: {}\nnamespaces:\n  include: [{}]\nregistrations:\n  - serviceAccount: switchyard-reconciler\n    kinds:\n      - {{apiVersion: example.switchyard.io/v1, kind: Greeting, objects: full}}\n      - {{apiVersion: v1, kind: ConfigMap, objects: full}}\n",
        support::SHARDS,
        ns.name()
    );
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
