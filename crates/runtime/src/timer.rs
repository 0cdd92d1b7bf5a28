//! An optional deadline as a `select!` branch.

use tokio::time::Instant;

/// Waits until `deadline`, or forever when there is none: the branch of a `select!` for a
/// timer that may not be set.
pub async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
