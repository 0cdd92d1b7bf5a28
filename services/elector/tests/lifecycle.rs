//! The binary starts, reaches etcd, reports ready, serves health, metrics and reflection,
//! and drains on SIGTERM.

use switchyard_testenv::Etcd;

#[tokio::test]
async fn starts_reports_ready_and_stops_cleanly_on_sigterm() {
    let etcd = Etcd::start().await.expect("etcd");
    switchyard_testenv::assert_service_lifecycle(
        std::path::Path::new(env!("CARGO_BIN_EXE_switchyard-elector")),
        "switchyard-elector",
        &[("SWITCHYARD_ETCD_ENDPOINTS", etcd.endpoint())],
    )
    .await;
}

/// Readiness waits for etcd; liveness does not, and shutdown still drains.
#[tokio::test]
async fn is_not_ready_while_etcd_is_unreachable() {
    let process = switchyard_testenv::ServiceProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_switchyard-elector")),
        &[],
        // Port 1 on loopback: nothing listens there.
        &[("SWITCHYARD_ETCD_ENDPOINTS", "https://127.0.0.1:1")],
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
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        readyz = process.admin_get("/readyz").await.expect("readyz");
    }
    let (status, body) = readyz;
    assert_eq!((status, body.as_str()), (503, "waiting for: etcd\n"));
    let (status, log) = process.terminate().await.expect("exits");
    assert!(status.success(), "{log}");
    assert!(log.contains("etcd unreachable"), "{log}");
}

/// etcd follows the gRPC rule: an `http://` endpoint is refused at start unless plaintext was
/// asked for with `--etcd-insecure-plaintext`, and then the start says so in a warning.
#[tokio::test]
async fn plaintext_etcd_is_refused_unless_asked_for_and_then_warned_about() {
    let program = std::path::Path::new(env!("CARGO_BIN_EXE_switchyard-elector"));
    let pki = switchyard_testenv::Pki::shared();
    let refused = std::process::Command::new(program)
        .args(pki.flags(switchyard_runtime::Role::Elector))
        .args([
            "--admin-addr=127.0.0.1:0",
            "--grpc-addr=127.0.0.1:0",
            "--etcd-endpoints=http://127.0.0.1:1",
        ])
        .env_remove("SWITCHYARD_ETCD_INSECURE_PLAINTEXT")
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("http://127.0.0.1:1 is plaintext")
            && stderr.contains("--etcd-insecure-plaintext"),
        "the error names the endpoint and the flag: {stderr}"
    );

    let process = switchyard_testenv::ServiceProcess::start(
        program,
        &["--etcd-insecure-plaintext"],
        &[("SWITCHYARD_ETCD_ENDPOINTS", "http://127.0.0.1:1")],
    )
    .await
    .expect("starts with the flag");
    let (status, log) = process.terminate().await.expect("exits");
    assert!(status.success(), "{log}");
    assert!(
        log.contains(
            "--etcd-insecure-plaintext: etcd is reached neither encrypted nor authenticated"
        ),
        "{log}"
    );
}
