//! The binary starts, connects to the real apiserver, reports ready, serves health, metrics
//! and reflection, and drains on SIGTERM.

use switchyard_testenv::ControlPlane;

#[tokio::test]
async fn starts_reports_ready_and_stops_cleanly_on_sigterm() {
    let plane = ControlPlane::shared().expect("control plane");
    let kubeconfig = plane.kubeconfig().display().to_string();
    switchyard_testenv::assert_service_lifecycle(
        std::path::Path::new(env!("CARGO_BIN_EXE_switchyard-watcher")),
        "switchyard-watcher",
        &[("KUBECONFIG", &kubeconfig)],
    )
    .await;
}

/// Readiness waits for the apiserver; liveness does not, and shutdown still drains.
#[tokio::test]
async fn is_not_ready_while_the_apiserver_is_unreachable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    // Port 1 on loopback: nothing listens there.
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n",
    )
    .expect("write kubeconfig");
    let process = switchyard_testenv::ServiceProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_switchyard-watcher")),
        &[],
        &[("KUBECONFIG", &kubeconfig.display().to_string())],
    )
    .await
    .expect("starts");
    assert_eq!(process.admin_get("/livez").await.expect("livez").0, 200);
    let (status, body) = process.admin_get("/readyz").await.expect("readyz");
    assert_eq!((status, body.as_str()), (503, "waiting for: apiserver\n"));
    let (status, log) = process.terminate().await.expect("exits");
    assert!(status.success(), "{log}");
    assert!(log.contains("apiserver unreachable"), "{log}");
}
