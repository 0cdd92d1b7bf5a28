//! The binary starts, reports ready, serves health, metrics and reflection, and drains on
//! SIGTERM.

#[tokio::test]
async fn starts_reports_ready_and_stops_cleanly_on_sigterm() {
    switchyard_testenv::assert_service_lifecycle(
        std::path::Path::new(env!("CARGO_BIN_EXE_switchyard-elector")),
        "switchyard-elector",
        &[],
    )
    .await;
}
