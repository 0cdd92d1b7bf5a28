//! The `RollingUpdate` strategy's steps (`rolling.go`): the new ReplicaSet up to
//! `replicas + maxSurge`, old ones down while `replicas - maxUnavailable` stay available.

use k8s_openapi::api::apps::v1::ReplicaSet;

use super::{spec::Spec, util::*};

/// `reconcileNewReplicaSet`: the size the new ReplicaSet should have now, if not its own.
pub fn rolling_new_size(spec: &Spec<'_>, new: &ReplicaSet, all: &[&ReplicaSet]) -> Option<i32> {
    let current = replicas(new);
    if current == spec.replicas {
        return None;
    }
    if current > spec.replicas {
        return Some(spec.replicas);
    }
    let size = new_rs_new_replicas(spec, all, current);
    (size != current).then_some(size)
}

/// `reconcileOldReplicaSets`: the sizes old ReplicaSets are scaled down to, by name. Replicas
/// that are not available go first (`cleanupUnhealthyReplicas`), then as many as keep
/// `replicas - maxUnavailable` Pods available (`scaleDownOldReplicaSetsForRollingUpdate`).
pub fn rolling_old_sizes(
    spec: &Spec<'_>,
    new: &ReplicaSet,
    old: &[&ReplicaSet],
) -> Vec<(String, i32)> {
    let old_count = sum(old, replicas);
    if old_count == 0 {
        return Vec::new();
    }
    let mut all: Vec<&ReplicaSet> = old.to_vec();
    all.push(new);
    let all_count = sum(&all, replicas);
    let min_available = spec.replicas - spec.max_unavailable();
    let new_unavailable = replicas(new) - status_of(new).2;
    let max_scaled_down = all_count - min_available - new_unavailable;
    if max_scaled_down <= 0 {
        return Vec::new();
    }
    let mut sorted = old.to_vec();
    sorted.sort_by(|a, b| by_creation(a, b));
    // name, replicas, available
    let mut sizes: Vec<(String, i32, i32)> = sorted
        .iter()
        .map(|rs| (name(rs).to_owned(), replicas(rs), status_of(rs).2))
        .collect();
    let mut changed = vec![false; sizes.len()];
    let mut cleaned = 0;
    for (i, (_, size, available)) in sizes.iter_mut().enumerate() {
        if cleaned >= max_scaled_down {
            break;
        }
        if *size == 0 || *size <= *available {
            continue;
        }
        let down = (max_scaled_down - cleaned).min(*size - *available);
        *size -= down;
        cleaned += down;
        changed[i] = true;
    }
    // Then healthy ones, keeping the minimum available. A ReplicaSet's available Pods count
    // up to its size only: above it, Pods are being deleted though its status may not say so
    // yet. kube-controller-manager counts the status as is, and can take such a Pod twice.
    let available: i32 = sum(&all, |rs| status_of(rs).2.min(replicas(rs)));
    if available > min_available {
        let total = available - min_available;
        let mut done = 0;
        for (i, (_, size, _)) in sizes.iter_mut().enumerate() {
            if done >= total {
                break;
            }
            if *size == 0 {
                continue;
            }
            let down = (*size).min(total - done);
            *size -= down;
            done += down;
            changed[i] = true;
        }
    }
    sizes
        .into_iter()
        .zip(changed)
        .filter(|(_, c)| *c)
        .map(|((n, size, _), _)| (n, size))
        .collect()
}
