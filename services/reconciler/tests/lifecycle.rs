//! The binary starts, connects to the real apiserver, reports ready, serves health, metrics
//! and reflection, and drains on SIGTERM.

use switchyard_testenv::ControlPlane;

#[tokio::test]
async fn starts_reports_ready_and_stops_cleanly_on_sigterm() {
    let plane = ControlPlane::shared().expect("control plane");
    let kubeconfig = plane.kubeconfig().display().to_string();
    switchyard_testenv::assert_service_lifecycle(
        std::path::Path::new(env!("CARGO_BIN_EXE_switchyard-reconciler")),
        "switchyard-reconciler",
        &[("KUBECONFIG", &kubeconfig)],
    )
    .await;
}
