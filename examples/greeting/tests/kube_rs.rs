//! The same Greeting controller written with kube-rs's `Controller` (`kube_rs/controller.rs`),
//! run through the same scenario as the Switchyard one, and the two compared by length, as
//! docs/sdk.md shows them side by side.

#![allow(clippy::unwrap_used)]

#[path = "kube_rs/controller.rs"]
mod controller;
mod scenario;

use switchyard_testenv::{ControlPlane, TestNamespace};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kube_rs_version_does_the_same() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    scenario::install_crd(&client).await;
    let ns = TestNamespace::create(plane, &client, "greeting-kube-rs")
        .await
        .unwrap();
    let run = tokio::spawn({
        let (client, namespace) = (client.clone(), ns.name().to_owned());
        async move { controller::run(client, &namespace).await }
    });

    scenario::greeting_lifecycle(&client, ns.name(), "greeting-kube-rs").await;
    run.abort();
}

/// Lines of code: neither blank nor a comment.
fn code_lines(source: &str) -> usize {
    source
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .count()
}

/// The Switchyard controller (its library and its `main`) against the kube-rs one (which
/// includes what its `main` would wire: the client, the watches and the run). The Greeting
/// type is shared (`src/greeting.rs`) and counted in neither.
#[test]
fn the_switchyard_controller_is_no_longer_than_the_kube_rs_one() {
    let switchyard =
        code_lines(include_str!("../src/lib.rs")) + code_lines(include_str!("../src/main.rs"));
    let kube_rs = code_lines(include_str!("kube_rs/controller.rs"));
    println!("lines of code: switchyard {switchyard}, kube-rs {kube_rs}");
    assert!(
        switchyard <= kube_rs,
        "switchyard {switchyard} lines, kube-rs {kube_rs}"
    );
}
