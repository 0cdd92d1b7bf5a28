//! The binary starts, connects to the real apiserver and a queue, reports ready, serves
//! health, metrics and reflection, and drains on SIGTERM.

mod support;

use switchyard_testenv::ControlPlane;

#[tokio::test]
async fn starts_reports_ready_and_stops_cleanly_on_sigterm() {
    let plane = ControlPlane::shared().expect("control plane");
    let kubeconfig = plane.kubeconfig().display().to_string();
    // The binary runs every built-in controller; the queue serves them all.
    let queue = support::queue(switchyard_reconciler::BUILTIN, &[]).await;
    let queue_addr = queue.grpc().to_string();
    // The controllers register their watches before the workers start.
    let watcher = support::watcher(plane, &support::watcher_config(&[], ""), queue.grpc()).await;
    let watcher_addr = watcher.grpc().to_string();
    switchyard_testenv::assert_service_lifecycle(
        std::path::Path::new(env!("CARGO_BIN_EXE_switchyard-reconciler")),
        "switchyard-reconciler",
        &[
            ("KUBECONFIG", &kubeconfig),
            ("SWITCHYARD_QUEUE_ADDR", &queue_addr),
            ("SWITCHYARD_WATCHER_ADDR", &watcher_addr),
        ],
    )
    .await;
    watcher.stop().await;
    queue.stop().await;
}

/// A queue started with its defaults serves every controller the reconciler runs by default:
/// a queue that does not know one of them refuses the reconciler's work stream, and the
/// watcher's keys for it (`make run`, the kustomize base, the services started by the tests).
#[test]
fn a_queue_with_its_defaults_serves_every_built_in_controller() {
    use clap::Parser;
    let args = switchyard_queue::Args::try_parse_from([
        "switchyard-queue",
        "--tls-cert=tls.crt",
        "--tls-key=tls.key",
        "--tls-ca=ca.crt",
    ])
    .unwrap();
    assert_eq!(args.queue.controllers, switchyard_reconciler::BUILTIN);
}
