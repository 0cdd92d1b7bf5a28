//! The rollout's progress (`progress.go`, and `DeploymentComplete`, `DeploymentProgressing`,
//! `DeploymentTimedOut` of `util/deployment_util.go`): the `Progressing` condition against
//! the progress deadline, `ReplicaFailure` carried over from the ReplicaSets, and when to look
//! again for a deadline that passes.

use std::time::Duration;

use k8s_openapi::{
    api::apps::v1::{DeploymentCondition, DeploymentStatus, ReplicaSet},
    jiff::Timestamp,
};

use super::{spec::Spec, sync::calculate_status, util::*};

/// `DeploymentComplete`: every replica updated and available, for this generation.
pub fn is_complete(spec: &Spec<'_>, status: &DeploymentStatus) -> bool {
    status.updated_replicas.unwrap_or(0) == spec.replicas
        && status.replicas.unwrap_or(0) == spec.replicas
        && status.available_replicas.unwrap_or(0) == spec.replicas
        && status.observed_generation.unwrap_or(0) >= spec.d.metadata.generation.unwrap_or(0)
}

/// `DeploymentProgressing`: more updated, fewer old, more ready or more available Pods than
/// the Deployment's status says.
fn is_progressing(old: &DeploymentStatus, new: &DeploymentStatus) -> bool {
    let z = |v: Option<i32>| v.unwrap_or(0);
    let old_old = z(old.replicas) - z(old.updated_replicas);
    let new_old = z(new.replicas) - z(new.updated_replicas);
    z(new.updated_replicas) > z(old.updated_replicas)
        || new_old < old_old
        || z(new.ready_replicas) > z(old.ready_replicas)
        || z(new.available_replicas) > z(old.available_replicas)
}

fn deadline_of(spec: &Spec<'_>, status: &DeploymentStatus) -> Option<Timestamp> {
    let seconds = spec.progress_deadline_seconds?;
    let cond = get_condition(status, PROGRESSING)?;
    if matches!(cond.reason.as_deref(), Some(NEW_RS_AVAILABLE | TIMED_OUT)) {
        return None;
    }
    let from = cond.last_update_time.as_ref()?.0;
    Timestamp::from_second(from.as_second().saturating_add(i64::from(seconds))).ok()
}

/// `DeploymentTimedOut`.
fn is_timed_out(spec: &Spec<'_>, status: &DeploymentStatus, now: Timestamp) -> bool {
    if !spec.has_progress_deadline() {
        return false;
    }
    match get_condition(status, PROGRESSING) {
        Some(c) if c.reason.as_deref() == Some(TIMED_OUT) => true,
        Some(_) => deadline_of(spec, status).is_some_and(|deadline| deadline < now),
        None => false,
    }
}

/// `syncRolloutStatus`: the status with `Progressing` after this reconcile, and
/// `ReplicaFailure` carried over from the ReplicaSets. `current` is the Deployment's status
/// with the conditions this reconcile set already.
pub fn rollout_status(
    spec: &Spec<'_>,
    new: Option<&ReplicaSet>,
    all: &[&ReplicaSet],
    current: &DeploymentStatus,
    now: Timestamp,
) -> DeploymentStatus {
    let mut status = calculate_status(spec, new, all, current, now);
    if !spec.has_progress_deadline() {
        remove_condition(&mut status, PROGRESSING);
    }
    let current_cond = get_condition(current, PROGRESSING);
    let complete_before = status.replicas == status.updated_replicas
        && current_cond.is_some_and(|c| c.reason.as_deref() == Some(NEW_RS_AVAILABLE));
    if spec.has_progress_deadline() && !complete_before {
        let what = match new {
            Some(rs) => format!("ReplicaSet {:?}", name(rs)),
            None => format!("Deployment {:?}", spec.name),
        };
        if is_complete(spec, &status) {
            set_condition(
                &mut status,
                condition(
                    PROGRESSING,
                    "True",
                    NEW_RS_AVAILABLE,
                    format!("{what} has successfully progressed."),
                    now,
                ),
            );
        } else if is_progressing(current, &status) {
            let mut cond = condition(
                PROGRESSING,
                "True",
                RS_UPDATED,
                format!("{what} is progressing."),
                now,
            );
            if let Some(c) = current_cond
                && c.status == "True"
            {
                cond.last_transition_time = c.last_transition_time.clone();
            }
            remove_condition(&mut status, PROGRESSING);
            set_condition(&mut status, cond);
        } else if is_timed_out(spec, &status, now) {
            set_condition(
                &mut status,
                condition(
                    PROGRESSING,
                    "False",
                    TIMED_OUT,
                    format!("{what} has timed out progressing."),
                    now,
                ),
            );
        }
    }
    // The first ReplicaFailure of a ReplicaSet, new one first, becomes the Deployment's.
    let mut ordered: Vec<&ReplicaSet> = new.into_iter().collect();
    ordered.extend(
        all.iter()
            .copied()
            .filter(|rs| new.is_none_or(|n| name(n) != name(rs))),
    );
    let failure = ordered.iter().find_map(|rs| {
        rs.status
            .as_ref()?
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == REPLICA_FAILURE)
    });
    match failure {
        Some(f) => set_condition(
            &mut status,
            DeploymentCondition {
                type_: REPLICA_FAILURE.into(),
                status: f.status.clone(),
                reason: f.reason.clone(),
                message: f.message.clone(),
                last_transition_time: f.last_transition_time.clone(),
                last_update_time: f.last_transition_time.clone(),
            },
        ),
        None => remove_condition(&mut status, REPLICA_FAILURE),
    }
    status
}

/// When to look at a rollout again to notice that it passed its progress deadline
/// (`requeueStuckDeployment`); `None` when complete, timed out, or without a deadline.
pub fn recheck_after(
    spec: &Spec<'_>,
    status: &DeploymentStatus,
    now: Timestamp,
) -> Option<Duration> {
    if is_complete(spec, status) {
        return None;
    }
    let deadline = deadline_of(spec, status)?;
    let left = deadline.as_second() - now.as_second();
    // One second past the deadline, as kube-controller-manager: the check is "before now".
    Some(Duration::from_secs(
        u64::try_from(left.max(0)).unwrap_or(0) + 1,
    ))
}
