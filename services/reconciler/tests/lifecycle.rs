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
    switchyard_testenv::assert_service_lifecycle(
        std::path::Path::new(env!("CARGO_BIN_EXE_switchyard-reconciler")),
        "switchyard-reconciler",
        &[
            ("KUBECONFIG", &kubeconfig),
            ("SWITCHYARD_QUEUE_ADDR", &queue_addr),
            // Read lazily: nothing is reconciled in this test.
            ("SWITCHYARD_WATCHER_ADDR", "127.0.0.1:1"),
        ],
    )
    .await;
    queue.stop().await;
}
