//! Watches declared in code, from the reconciler's side: a kind the apiserver does not serve
//! fails the start, naming it; a watcher that restarts gets the registration again from the
//! running reconciler, whose controller goes on getting keys without a restart.

#![allow(clippy::unwrap_used)]

use std::{net::SocketAddr, sync::Arc, time::Duration};
use switchyard_sdk_test as support;

use clap::Parser;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use switchyard_k8s::{
    Api, ObjectMeta, PostParams, k8s_openapi::api::core::v1::ConfigMap, kube::ResourceExt,
};
use switchyard_runtime::Role;
use switchyard_sdk::{Action, Builder, Context, Registry};
use switchyard_testenv::{ControlPlane, InProcess, Pki, TestNamespace};
use tokio::sync::mpsc;

/// A kind no CRD defines.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "missing.switchyard.io",
    version = "v1",
    kind = "Missing",
    namespaced
)]
pub struct MissingSpec {
    pub size: u32,
}

const MAPS: &str = "test.switchyard.io/config-maps";

/// A watcher whose configuration names no controller, for one namespace, on `grpc`.
async fn watcher(
    plane: &ControlPlane,
    namespace: &str,
    queue: SocketAddr,
    grpc: &str,
) -> InProcess {
    let config = format!(
        "shardCount: {}\nnamespaces:\n  include: [{namespace}]\nregistrations:\n  - serviceAccount: switchyard-reconciler\n    kinds:\n      - {{apiVersion: example.switchyard.io/v1, kind: Greeting, objects: full}}\n      - {{apiVersion: v1, kind: ConfigMap, objects: full}}\n      - {{apiVersion: missing.switchyard.io/v1, kind: Missing, objects: full}}\n",
        support::SHARDS
    );
    support::watcher_on(plane, &config, &format!("--queue-addr={queue}"), grpc).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_the_apiserver_does_not_serve_fails_the_start_naming_it() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "register-missing")
        .await
        .unwrap();
    let queue = support::queue(&["missing.switchyard.io/v1/Missing"], &[]).await;
    let watcher = watcher(plane, ns.name(), queue.grpc(), "127.0.0.1:0").await;
    watcher.wait_ready(support::WITHIN).await;

    let mut registry = Registry::default();
    registry.register(
        Builder::for_::<Missing>()
            .owns::<ConfigMap>()
            .reconcile(|_: Arc<Missing>, _| async { Ok(Action::await_change()) }),
    );
    let args = vec![
        "switchyard-reconciler".to_owned(),
        "--admin-addr=127.0.0.1:0".into(),
        "--grpc-addr=127.0.0.1:0".into(),
        format!("--kubeconfig={}", plane.kubeconfig().display()),
        format!("--queue-addr={}", queue.grpc()),
        format!("--watcher-addr={}", watcher.grpc()),
    ]
    .into_iter()
    .chain(Pki::shared().flags(Role::Reconciler));
    let error = switchyard_sdk::Args::try_parse_from(args)
        .unwrap()
        .start(registry)
        .await
        .expect_err("the start fails");
    let message = error.to_string();
    assert!(
        message.contains("missing.switchyard.io/v1/Missing") && message.contains("NotFound"),
        "{message}"
    );

    watcher.stop().await;
    queue.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_watcher_gets_the_registration_again_without_a_reconciler_restart() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "register-restart")
        .await
        .unwrap();
    let queue = support::queue(&[MAPS], &[]).await;
    let first = watcher(plane, ns.name(), queue.grpc(), "127.0.0.1:0").await;
    first.wait_ready(support::WITHIN).await;
    let address = first.grpc();

    let (seen, mut reconciled) = mpsc::unbounded_channel();
    let mut registry = Registry::default();
    registry.register(Builder::for_::<ConfigMap>().named(MAPS).reconcile(
        move |map: Arc<ConfigMap>, _: Context| {
            let seen = seen.clone();
            async move {
                let _ = seen.send(map.name_any());
                Ok(Action::await_change())
            }
        },
    ));
    let reconciler = support::reconciler(plane, registry, queue.grpc(), address, &[]).await;
    assert_eq!(first.metric("switchyard_watcher_registrations").await, 1.0);

    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    let create = |name: &str| {
        let map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        let maps = maps.clone();
        async move { maps.create(&PostParams::default(), &map).await.unwrap() }
    };
    let expect = async |reconciled: &mut mpsc::UnboundedReceiver<String>, name: &str| {
        let deadline = tokio::time::Instant::now() + support::WITHIN;
        loop {
            match tokio::time::timeout_at(deadline, reconciled.recv()).await {
                Ok(Some(got)) if got == name => return,
                Ok(Some(_)) => {}
                _ => panic!("{name} was not reconciled within {:?}", support::WITHIN),
            }
        }
    };
    create("before").await;
    expect(&mut reconciled, "before").await;

    // The watcher goes and a new one takes its address: the reconciler registers again by
    // itself, and the new watcher's first list keys what it finds.
    first.stop().await;
    let second = watcher(plane, ns.name(), queue.grpc(), &address.to_string()).await;
    second.wait_ready(support::WITHIN).await;
    let deadline = tokio::time::Instant::now() + support::WITHIN;
    while second.metric("switchyard_watcher_registrations").await < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reconciler registers with the new watcher"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    create("after").await;
    expect(&mut reconciled, "after").await;

    reconciler.stop().await;
    second.stop().await;
    queue.stop().await;
}
