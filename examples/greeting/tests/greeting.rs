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
use switchyard_runtime::Role;
use switchyard_sdk::{Registry, default_name};
use switchyard_testenv::{ControlPlane, Pki, TestNamespace};

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

/// The controller as `deploy/kustomize/components/controller` deploys it: an identity of its
/// own (`greeting-switchyard-reconciler`, a reconciler's role by its name), granted its kinds
/// by the component's file of grants beside the watcher's configuration, and let work on
/// its controller by the queue's `--work-grant`. The reconciler's own identity, which that
/// file does not name, is refused the same watches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_runs_as_an_identity_of_its_own_with_the_component_s_grants() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    scenario::install_crd(&client).await;
    let ns = TestNamespace::create(plane, &client, "greeting-own")
        .await
        .unwrap();
    // The queue lets the identity work on the controller, as the component's flag does.
    let queue = support::queue(
        &[],
        &["--work-grant=greeting-switchyard-reconciler=example.switchyard.io/v1/Greeting"],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("watcher.yaml");
    std::fs::write(
        &config,
        format!(
            "shardCount: {}\nnamespaces:\n  include: [{}]\n",
            support::SHARDS,
            ns.name()
        ),
    )
    .unwrap();
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/kustomize/components/controller/greeting.registrations.yaml"
        ),
        dir.path().join("greeting.registrations.yaml"),
    )
    .unwrap();
    let watcher = support::watcher_of_file(
        plane.kubeconfig(),
        &config,
        &format!("--queue-addr={}", queue.grpc()),
        "127.0.0.1:0",
    )
    .await;
    watcher.wait_ready(Duration::from_secs(60)).await;
    let controllers = || {
        let mut registry = Registry::default();
        registry.register(switchyard_example_greeting::controller());
        registry
    };

    // The reconciler's own identity: refused, naming the account.
    let refused = <switchyard_sdk::Args as clap::Parser>::try_parse_from(
        [
            "switchyard-reconciler".to_owned(),
            "--admin-addr=127.0.0.1:0".into(),
            "--grpc-addr=127.0.0.1:0".into(),
            format!("--kubeconfig={}", plane.kubeconfig().display()),
            format!("--queue-addr={}", queue.grpc()),
            format!("--watcher-addr={}", watcher.grpc()),
            format!("--shard-count={}", support::SHARDS),
        ]
        .into_iter()
        .chain(Pki::shared().flags(Role::Reconciler)),
    )
    .unwrap()
    .start(controllers())
    .await
    .unwrap_err()
    .to_string();
    assert!(
        refused.contains("PermissionDenied") && refused.contains("switchyard-reconciler"),
        "{refused}"
    );

    // Its own: granted, and the controller does its work.
    let own = Pki::shared()
        .issue_as(
            "greeting-switchyard-reconciler",
            "greeting-switchyard-reconciler",
        )
        .unwrap();
    let flags = own.flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let reconciler =
        support::reconciler(plane, controllers(), queue.grpc(), watcher.grpc(), &flags).await;
    scenario::greeting_lifecycle(&client, ns.name(), "switchyard-reconciler").await;

    reconciler.stop().await;
    watcher.stop().await;
    queue.stop().await;
}
