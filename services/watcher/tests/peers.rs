//! The handover check against a real kube-controller-manager, on a control plane of the
//! test's own (kube-controller-manager acts on every namespace): run with the flags
//! docs/deploy.md gives for handing the controllers over, it writes no status Switchyard's
//! controllers own and the watcher sees no peer; run with its defaults, it writes the
//! Deployments' status, the watcher counts it against the Deployment controller and, under
//! `--on-peer-writes=stand-down`, holds that controller's keys back until the peer has been
//! quiet for `--peer-write-window`, when they flow again.
//!
//! The EndpointSlice, Endpoints and mirroring controllers write no status: the watcher knows
//! kube-controller-manager runs them by the slices and Endpoints it writes, labelled as
//! theirs. Not with the documented flags; with its defaults, each of them.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use serde_json::json;
use switchyard_k8s::{
    Api, PostParams,
    k8s_openapi::api::{
        apps::v1::Deployment,
        core::v1::{Endpoints, Service},
    },
    kube::api::{Patch, PatchParams},
};
use switchyard_testenv::{ControlPlane, ControlPlaneOptions, InProcess, TestNamespace};
use switchyard_work::builtin::{ENDPOINTS, ENDPOINTSLICE, ENDPOINTSLICE_MIRRORING};

use support::*;

const DEPLOYMENT: &str = "apps/v1/Deployment";
const WINDOW: Duration = Duration::from_secs(10);
const PEER: &str = r#"controller="apps/v1/Deployment",manager="kube-controller-manager""#;

/// The full `--controllers` flag docs/deploy.md gives for running kube-controller-manager
/// beside every built-in controller of Switchyard.
fn documented_flag() -> String {
    let doc = include_str!("../../../docs/deploy.md");
    doc.lines()
        .map(str::trim)
        .find(|l| l.starts_with("--controllers=*,") && l.contains("-deployment-controller"))
        .expect("docs/deploy.md gives the --controllers flag for the handover")
        .to_owned()
}

fn deployment(name: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "registry.example/c:1"}]},
            },
        },
    }))
    .unwrap()
}

/// Changes `name`'s labels, so that the watcher keys it.
async fn touch(api: &Api<Deployment>, name: &str, value: &str) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"touched": value}}})),
    )
    .await
    .unwrap();
}

async fn peer_writes(watcher: &InProcess) -> f64 {
    watcher
        .metric(&format!(
            "switchyard_watcher_peer_status_writes_total{{{PEER}}}"
        ))
        .await
}

/// The writes of kube-controller-manager's counted against `controller`.
async fn peer_writes_of(watcher: &InProcess, controller: &str) -> f64 {
    watcher
        .metric(&format!(
            r#"switchyard_watcher_peer_status_writes_total{{controller="{controller}",manager="kube-controller-manager"}}"#
        ))
        .await
}

/// The controllers that write slices and Endpoints, as the built-in ones register them (so
/// that the watcher caches what they write).
fn networking_controllers() -> String {
    format!(
        "  - name: {ENDPOINTSLICE}\n    for: {{apiVersion: v1, kind: Service}}\n    mapByLabel:\n      - {{apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, label: kubernetes.io/service-name}}\n  - name: {ENDPOINTS}\n    for: {{apiVersion: v1, kind: Service}}\n    mapByName:\n      - {{apiVersion: v1, kind: Endpoints}}\n  - name: {ENDPOINTSLICE_MIRRORING}\n    for: {{apiVersion: v1, kind: Service}}\n    mapByName:\n      - {{apiVersion: v1, kind: Endpoints}}\n"
    )
}

/// A Service with a selector, for slices and Endpoints; one without, with Endpoints written
/// by hand, for mirrored slices.
async fn services(client: &switchyard_k8s::Client, ns: &str) {
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    for (name, selector) in [("web", json!({"app": "web"})), ("ext", json!(null))] {
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"selector": selector, "ports": [{"port": 80}]},
        }))
        .unwrap();
        services
            .create(&PostParams::default(), &service)
            .await
            .unwrap();
    }
    let endpoints: Endpoints = serde_json::from_value(json!({
        "metadata": {"name": "ext"},
        "subsets": [{"addresses": [{"ip": "192.0.2.1"}], "ports": [{"port": 80}]}],
    }))
    .unwrap();
    Api::<Endpoints>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &endpoints)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_sees_kube_controller_manager_run_a_controller_it_keys_and_stands_down() {
    let plane = ControlPlane::start(ControlPlaneOptions {
        nodes: 1,
        dir: None,
    })
    .await
    .expect("a control plane of the test's own");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(&plane, &client, "peers")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let queue = queue(
        &[
            DEPLOYMENT,
            ENDPOINTSLICE,
            ENDPOINTS,
            ENDPOINTSLICE_MIRRORING,
        ],
        &[],
    )
    .await;
    let config = format!(
        "shardCount: {SHARDS}\nnamespaces: {{include: [{ns}]}}\ncontrollers:\n  - name: {DEPLOYMENT}\n    for: {{apiVersion: apps/v1, kind: Deployment}}\n{}",
        networking_controllers()
    );
    let watcher = watcher_with(
        &plane,
        &config,
        &[
            &format!("--queue-addr={}", queue.grpc()),
            "--on-peer-writes=stand-down",
            &format!("--peer-write-window={}s", WINDOW.as_secs()),
        ],
    )
    .await;
    watcher.wait_ready(WITHIN).await;
    let mut worker = Worker::start(queue.grpc()).await;
    let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);

    // With the documented flags: kube-controller-manager leaves the Deployment alone; its
    // status is written by another manager (as Switchyard's controller would), and keys flow.
    let flag = documented_flag();
    let handed_over = plane
        .start_controller_manager(&[], &[&flag])
        .await
        .expect("kube-controller-manager with the documented flags");
    api.create(&PostParams::default(), &deployment("web"))
        .await
        .unwrap();
    services(&client, &ns).await;
    worker.expect(&key(DEPLOYMENT, &ns, "web"), WITHIN).await;
    api.patch_status(
        "web",
        &PatchParams::apply("switchyard-deployment").force(),
        &Patch::Apply(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "status": {"observedGeneration": 1, "replicas": 0},
        })),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    touch(&api, "web", "1").await;
    worker.expect(&key(DEPLOYMENT, &ns, "web"), WITHIN).await;
    assert_eq!(
        peer_writes(&watcher).await,
        0.0,
        "kube-controller-manager run with {flag} wrote a Deployment's status"
    );
    for controller in [ENDPOINTSLICE, ENDPOINTS, ENDPOINTSLICE_MIRRORING] {
        assert_eq!(
            peer_writes_of(&watcher, controller).await,
            0.0,
            "kube-controller-manager run with {flag} wrote what {controller} writes"
        );
    }
    drop(handed_over);

    // With its defaults it runs the Deployment controller, which writes the status: counted,
    // and the Deployment controller stands down.
    let peer = plane
        .start_controller_manager(&["*"], &[])
        .await
        .expect("kube-controller-manager with its default controllers");
    let mut waited = Duration::ZERO;
    while peer_writes(&watcher).await == 0.0 {
        assert!(
            waited < Duration::from_secs(30),
            "no peer status write seen within {waited:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        waited += Duration::from_millis(200);
    }
    assert_eq!(
        watcher
            .metric(r#"switchyard_watcher_standing_down{controller="apps/v1/Deployment"}"#)
            .await,
        1.0
    );
    // The slices and Endpoints it writes tell of its other three.
    for controller in [ENDPOINTSLICE, ENDPOINTS, ENDPOINTSLICE_MIRRORING] {
        let mut waited = Duration::ZERO;
        while peer_writes_of(&watcher, controller).await == 0.0 {
            assert!(
                waited < Duration::from_secs(30),
                "{controller}: no peer write seen within {waited:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
            waited += Duration::from_millis(200);
        }
    }
    // Keys sent before the first peer write was seen (kube-controller-manager writes the
    // Deployment's revision annotation before its status) are leased as usual.
    worker.leased_during(Duration::from_secs(2)).await;
    touch(&api, "web", "2").await;
    let leased = worker.leased_during(Duration::from_secs(3)).await;
    assert!(
        leased.is_empty(),
        "keys were sent while standing down: {leased:?}"
    );
    assert!(
        watcher
            .metric(r#"switchyard_watcher_stood_down_keys_total{controller="apps/v1/Deployment"}"#)
            .await
            >= 1.0
    );

    // The peer stops: once it has been quiet for the window, the controller's keys flow again.
    drop(peer);
    tokio::time::sleep(WINDOW + Duration::from_secs(1)).await;
    touch(&api, "web", "3").await;
    worker.expect(&key(DEPLOYMENT, &ns, "web"), WITHIN).await;
    assert_eq!(
        watcher
            .metric(r#"switchyard_watcher_standing_down{controller="apps/v1/Deployment"}"#)
            .await,
        0.0
    );

    watcher.stop().await;
    queue.stop().await;
}
