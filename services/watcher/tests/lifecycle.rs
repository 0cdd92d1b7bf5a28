//! The binary starts, connects to the real apiserver, reports ready, serves health, metrics
//! and reflection, and drains on SIGTERM.

use switchyard_testenv::ControlPlane;

/// A watcher configuration that caches Namespaces and maps nothing: no queue is needed.
fn cache_only_config(dir: &std::path::Path) -> String {
    let path = dir.join("watcher.yaml");
    std::fs::write(&path, "resources: [{apiVersion: v1, kind: Namespace}]\n")
        .expect("write config");
    path.display().to_string()
}

#[tokio::test]
async fn starts_reports_ready_and_stops_cleanly_on_sigterm() {
    let plane = ControlPlane::shared().expect("control plane");
    let kubeconfig = plane.kubeconfig().display().to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let config = cache_only_config(dir.path());
    switchyard_testenv::assert_service_lifecycle(
        std::path::Path::new(env!("CARGO_BIN_EXE_switchyard-watcher")),
        "switchyard-watcher",
        &[
            ("KUBECONFIG", &kubeconfig),
            ("SWITCHYARD_WATCHER_CONFIG", &config),
            ("SWITCHYARD_QUEUE_ADDR", "127.0.0.1:1"),
        ],
    )
    .await;
}

/// Readiness waits for the apiserver and the initial lists; liveness does not, and shutdown
/// still drains.
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
        &[
            ("KUBECONFIG", &kubeconfig.display().to_string()),
            ("SWITCHYARD_WATCHER_CONFIG", &cache_only_config(dir.path())),
            ("SWITCHYARD_QUEUE_ADDR", "127.0.0.1:1"),
        ],
    )
    .await
    .expect("starts");
    assert_eq!(process.admin_get("/livez").await.expect("livez").0, 200);
    // The gates of the start itself (`startup`, `grpc`) open a moment after the admin port.
    let mut readyz = process.admin_get("/readyz").await.expect("readyz");
    for _ in 0..100 {
        if !(readyz.1.contains("startup") || readyz.1.contains("grpc")) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        readyz = process.admin_get("/readyz").await.expect("readyz");
    }
    let (status, body) = readyz;
    assert_eq!(
        (status, body.as_str()),
        (503, "waiting for: apiserver, initial-lists\n")
    );
    let (status, log) = process.terminate().await.expect("exits");
    assert!(status.success(), "{log}");
    assert!(log.contains("apiserver unreachable"), "{log}");
}
