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
