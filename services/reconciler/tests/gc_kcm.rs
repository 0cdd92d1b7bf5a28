//! The garbage collector's scenarios run under kube-controller-manager (its
//! garbage-collector, deployment and replicaset controllers) and then under Switchyard, on
//! fresh namespaces of one control plane, and compared: each collector must end in the same
//! state, and that state must be the one the scenario expects.
//!
//! A binary of its own: kube-controller-manager's controllers act on every namespace, so no
//! other test may run controllers on this control plane while it runs.

#![allow(clippy::unwrap_used)]

mod gc_scenarios;
mod support;

use std::time::Instant;

use gc_scenarios::{Background, Circle, Foreground, Orphaned, Stack, StaleReferences};
use switchyard_k8s::Client;
use switchyard_testenv::{ControlPlane, TestNamespace};

#[derive(Debug, PartialEq, Eq)]
struct Ends {
    background: Background,
    foreground: Foreground,
    orphan: Orphaned,
    circle: Circle,
    stale: StaleReferences,
}

/// The background scenario's pair, one for the workloads and the circle, one for the stale
/// references and one for the writes that flood the watch meanwhile.
async fn namespaces(plane: &ControlPlane, client: &Client, prefix: &str) -> [TestNamespace; 5] {
    let mut made = Vec::new();
    for suffix in ["", "-other", "-fg", "-stale", "-flood"] {
        made.push(
            TestNamespace::create(plane, client, &format!("{prefix}{suffix}"))
                .await
                .unwrap(),
        );
    }
    made.try_into().ok().unwrap()
}

/// Runs every scenario; `hold` is the stale-references scenario's (see there).
async fn run<H>(
    client: &Client,
    [ns, other, fg, stale, flood]: &[TestNamespace; 5],
    hold: impl FnOnce(&str) -> H,
) -> Ends {
    Ends {
        background: gc_scenarios::background(client, ns.name(), other.name()).await,
        foreground: gc_scenarios::foreground(client, fg.name()).await,
        orphan: gc_scenarios::orphan(client, fg.name()).await,
        circle: gc_scenarios::circle(client, fg.name()).await,
        stale: gc_scenarios::stale_references(client, stale.name(), flood.name(), || {
            hold(stale.name())
        })
        .await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_ends_the_same_under_kube_controller_manager_and_switchyard() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();

    let started = Instant::now();
    let kcm = plane
        .start_controller_manager(
            &[
                "garbage-collector-controller",
                "deployment-controller",
                "replicaset-controller",
            ],
            &[],
        )
        .await
        .expect("kube-controller-manager starts");
    let kcm_namespaces = namespaces(plane, &client, "gc-kcm").await;
    let under_kcm = run(&client, &kcm_namespaces, |_| ()).await;
    drop(kcm);
    eprintln!(
        "kube-controller-manager: {:?}, {under_kcm:?}",
        started.elapsed()
    );

    let started = Instant::now();
    // The watcher admits the scenario's namespaces only.
    let sy_namespaces = namespaces(plane, &client, "gc-sy").await;
    let names: Vec<&str> = sy_namespaces.iter().map(TestNamespace::name).collect();
    let stack = Stack::start(plane, &names).await;
    // Switchyard's graph is also held stale while the references go (a watcher behind).
    let under_switchyard = run(&client, &sy_namespaces, |ns| {
        switchyard_watcher::graph::hold::events("", "configmaps", ns)
    })
    .await;
    eprintln!("switchyard: {:?}, {under_switchyard:?}", started.elapsed());
    stack.stop().await;

    assert_eq!(
        under_kcm, under_switchyard,
        "kube-controller-manager vs Switchyard"
    );
    assert_eq!(
        under_switchyard,
        Ends {
            background: Background::expected(),
            foreground: Foreground::expected(),
            orphan: Orphaned::expected(),
            circle: Circle::expected(),
            stale: StaleReferences::expected(),
        }
    );
}
