//! The `Recreate` strategy's gate (`recreate.go`): the new ReplicaSet waits until no old
//! Pod runs. The service crate sizes the old ReplicaSets to 0, then the new one up, with
//! [`super::scaled`].

use k8s_openapi::api::{apps::v1::ReplicaSet, core::v1::Pod};

use super::util::{status_of, sum};

/// `oldPodsRunning`: an old ReplicaSet still reports Pods, or one of `old_pods` (the Pods
/// the old ReplicaSets control) has not finished.
pub fn old_pods_running(old: &[&ReplicaSet], old_pods: &[Pod]) -> bool {
    if sum(old, |rs| status_of(rs).0) > 0 {
        return true;
    }
    old_pods.iter().any(|pod| {
        !matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
    })
}
