//! The decisions of every sync (`sync.go`, and the claiming of `deployment_controller.go`):
//! which ReplicaSets the Deployment owns and which is new, the new ReplicaSet and its
//! `Progressing` notes, scaling (one active ReplicaSet, or proportionally over all of them),
//! the cleanup of old ReplicaSets past `revisionHistoryLimit`, and the status.

use std::{cmp::Ordering, collections::BTreeMap};

use k8s_openapi::{
    api::apps::v1::{DeploymentStatus, ReplicaSet, ReplicaSetSpec},
    apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta},
    jiff::Timestamp,
};

use super::{
    spec::{Spec, Strategy},
    util::*,
};

// --- claiming (`getReplicaSetsForDeployment`) and the new/old split ----------------------

/// Which ReplicaSets the Deployment keeps, adopts and releases (`ClaimReplicaSets`).
#[derive(Debug, Default, PartialEq)]
pub struct Claim<'r> {
    pub owned: Vec<&'r ReplicaSet>,
    pub adopt: Vec<&'r ReplicaSet>,
    pub release: Vec<&'r ReplicaSet>,
}

pub fn claim<'r>(spec: &Spec<'_>, rss: &'r [ReplicaSet]) -> Claim<'r> {
    let mut claim = Claim::default();
    for rs in rss {
        if rs.metadata.namespace.as_deref().unwrap_or_default() != spec.namespace {
            continue;
        }
        let labels = rs.metadata.labels.as_ref();
        let matches = spec.selector.matches(labels);
        match controller_of(&rs.metadata) {
            Some(owner) if owner.uid == spec.uid => {
                if matches {
                    claim.owned.push(rs);
                } else if !spec.deleting {
                    claim.release.push(rs);
                }
            }
            Some(_) => {}
            None => {
                if matches && !spec.deleting && rs.metadata.deletion_timestamp.is_none() {
                    claim.adopt.push(rs);
                }
            }
        }
    }
    claim
}

/// The new ReplicaSet (the oldest whose template is the Deployment's, hash aside) and the
/// others, old (`FindNewReplicaSet`, `FindOldReplicaSets`).
pub fn split<'r>(
    spec: &Spec<'_>,
    owned: &[&'r ReplicaSet],
) -> (Option<&'r ReplicaSet>, Vec<&'r ReplicaSet>) {
    let mut sorted = owned.to_vec();
    sorted.sort_by(|a, b| by_creation(a, b));
    let new = sorted
        .iter()
        .copied()
        .find(|rs| equal_ignore_hash(&template_of(rs), &spec.template));
    let old = sorted
        .into_iter()
        .filter(|rs| new.is_none_or(|n| !std::ptr::eq(*rs, n)))
        .collect();
    (new, old)
}

// --- the new ReplicaSet (`getNewReplicaSet`) ---------------------------------------------

/// The ReplicaSet to create for the Deployment's template (`getNewReplicaSet`): named
/// `<deployment>-<hash>`, the hash on its labels, selector and template, controlled by the
/// Deployment, with the replicas the strategy allows now.
pub fn new_replica_set(spec: &Spec<'_>, old: &[&ReplicaSet]) -> ReplicaSet {
    let collision_count = spec.status().collision_count;
    let hash = pod_template_hash(&spec.template, collision_count);
    let mut template = spec.template.clone();
    let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(POD_TEMPLATE_HASH.into(), hash.clone());
    let labels = meta.labels.clone();
    let mut selector: LabelSelector = spec
        .d
        .spec
        .as_ref()
        .map(|s| s.selector.clone())
        .unwrap_or_default();
    selector
        .match_labels
        .get_or_insert_with(BTreeMap::new)
        .insert(POD_TEMPLATE_HASH.into(), hash.clone());
    let mut rs = ReplicaSet {
        metadata: ObjectMeta {
            name: Some(format!("{}-{hash}", spec.name)),
            namespace: Some(spec.namespace.to_owned()),
            labels,
            owner_references: Some(vec![spec.controller_ref()]),
            ..ObjectMeta::default()
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(0),
            min_ready_seconds: Some(spec.min_ready_seconds),
            selector,
            template: Some(template),
        }),
        status: None,
    };
    let mut all = old.to_vec();
    all.push(&rs);
    let count = new_rs_new_replicas(spec, &all, 0);
    if let Some(s) = rs.spec.as_mut() {
        s.replicas = Some(count);
    }
    set_new_rs_annotations(spec, &mut rs, new_revision(old), false);
    rs
}

/// Whether a ReplicaSet that exists under the new one's name may be taken as the new one
/// (it is the Deployment's and has its template); otherwise the hash collided.
pub fn is_ours_with_template(spec: &Spec<'_>, rs: &ReplicaSet) -> bool {
    controller_of(&rs.metadata).is_some_and(|r| r.uid == spec.uid)
        && equal_ignore_hash(&template_of(rs), &spec.template)
}

/// The existing new ReplicaSet brought up to date: the revision (a rollback to an old
/// template makes it the newest), the Deployment's annotations and `minReadySeconds`.
/// `None` when it is up to date.
pub fn refresh_new_replica_set(
    spec: &Spec<'_>,
    rs: &ReplicaSet,
    old: &[&ReplicaSet],
) -> Option<ReplicaSet> {
    let mut updated = rs.clone();
    let annotations_changed = set_new_rs_annotations(spec, &mut updated, new_revision(old), true);
    let min_ready = rs
        .spec
        .as_ref()
        .and_then(|s| s.min_ready_seconds)
        .unwrap_or(0);
    if !annotations_changed && min_ready == spec.min_ready_seconds {
        return None;
    }
    if let Some(s) = updated.spec.as_mut() {
        s.min_ready_seconds = Some(spec.min_ready_seconds);
    }
    Some(updated)
}

/// The `Progressing` condition for a new ReplicaSet just created, or found when the
/// Deployment had none.
pub fn note_new_replica_set(
    status: &mut DeploymentStatus,
    spec: &Spec<'_>,
    rs_name: &str,
    created: bool,
    now: Timestamp,
) {
    if !spec.has_progress_deadline() {
        return;
    }
    if created {
        set_condition(
            status,
            condition(
                PROGRESSING,
                "True",
                NEW_RS_CREATED,
                format!("Created new replica set {rs_name:?}"),
                now,
            ),
        );
    } else if get_condition(status, PROGRESSING).is_none() {
        set_condition(
            status,
            condition(
                PROGRESSING,
                "True",
                FOUND_NEW_RS,
                format!("Found new replica set {rs_name:?}"),
                now,
            ),
        );
    }
}

/// The `Progressing` condition after the new ReplicaSet could not be created.
pub fn note_create_failure(
    status: &mut DeploymentStatus,
    spec: &Spec<'_>,
    rs_name: &str,
    error: &str,
    now: Timestamp,
) {
    if spec.has_progress_deadline() {
        set_condition(
            status,
            condition(
                PROGRESSING,
                "False",
                FAILED_RS_CREATE,
                format!("Failed to create new replica set {rs_name:?}: {error}"),
                now,
            ),
        );
    }
}

// --- scaling (`scale`, `scaleReplicaSet`) ------------------------------------------------

/// `scaleReplicaSet`: the ReplicaSet with `to` replicas and the Deployment's replicas
/// annotations; `None` when both are already so.
pub fn scaled(spec: &Spec<'_>, rs: &ReplicaSet, to: i32) -> Option<ReplicaSet> {
    let mut updated = rs.clone();
    let annotations_changed = set_replicas_annotations(
        &mut updated,
        spec.replicas,
        spec.replicas + spec.max_surge(),
    );
    if replicas(rs) == to && !annotations_changed {
        return None;
    }
    updated
        .spec
        .get_or_insert_with(ReplicaSetSpec::default)
        .replicas = Some(to);
    Some(updated)
}

/// `isScalingEvent`: an active ReplicaSet was sized for another `replicas`.
pub fn is_scaling_event(spec: &Spec<'_>, owned: &[&ReplicaSet]) -> bool {
    active(owned)
        .iter()
        .filter_map(|rs| int_annotation(rs, DESIRED_REPLICAS))
        .any(|desired| desired != spec.replicas)
}

/// `FindActiveOrLatest`: the one ReplicaSet with replicas, or the newest when none has any;
/// `None` when several have.
fn active_or_latest<'r>(
    new: Option<&'r ReplicaSet>,
    old: &[&'r ReplicaSet],
) -> Option<&'r ReplicaSet> {
    let mut all: Vec<&ReplicaSet> = old.to_vec();
    all.extend(new);
    let actives = active(&all);
    match actives.len() {
        0 => new.or_else(|| old.iter().copied().max_by(|a, b| by_creation(a, b))),
        1 => Some(actives[0]),
        _ => None,
    }
}

/// `getReplicaSetFraction`: this ReplicaSet's share of the change, rounded half away from
/// zero, from the size the Deployment had when it was last scaled (`max-replicas`).
fn fraction(spec: &Spec<'_>, rs: &ReplicaSet) -> i32 {
    if spec.replicas == 0 {
        return -replicas(rs);
    }
    let deployment_replicas = spec.replicas + spec.max_surge();
    let annotated = int_annotation(rs, MAX_REPLICAS).unwrap_or(spec.status().replicas.unwrap_or(0));
    if annotated == 0 {
        return 0;
    }
    let size = f64::from(replicas(rs)) * f64::from(deployment_replicas) / f64::from(annotated);
    // f64::round is half away from zero, as Go's math.Round.
    #[allow(clippy::cast_possible_truncation)]
    let rounded = size.round() as i32;
    rounded - replicas(rs)
}

/// One ReplicaSet's share of `to_add` when `added` is already given out
/// (`GetProportion`): its fraction, but never past what is left to give (or to take).
fn proportion(spec: &Spec<'_>, rs: &ReplicaSet, to_add: i32, added: i32) -> i32 {
    if replicas(rs) == 0 || to_add == 0 || to_add == added {
        return 0;
    }
    let share = fraction(spec, rs);
    let left = to_add - added;
    if to_add > 0 {
        share.min(left)
    } else {
        share.max(left)
    }
}

/// The sizes `scale` gives to the ReplicaSets (`DeploymentController.scale`), by name. The
/// caller writes those that differ with [`scaled`].
pub fn scale(spec: &Spec<'_>, new: Option<&ReplicaSet>, old: &[&ReplicaSet]) -> Vec<(String, i32)> {
    if let Some(rs) = active_or_latest(new, old) {
        return vec![(name(rs).to_owned(), spec.replicas)];
    }
    // A saturated new ReplicaSet: the old ones go to zero.
    if let Some(new) = new
        && replicas(new) == spec.replicas
        && int_annotation(new, DESIRED_REPLICAS) == Some(spec.replicas)
        && status_of(new).2 == spec.replicas
    {
        return active(old)
            .iter()
            .map(|rs| (name(rs).to_owned(), 0))
            .collect();
    }
    if !matches!(spec.strategy, Strategy::RollingUpdate { .. }) {
        return Vec::new();
    }
    let mut all: Vec<&ReplicaSet> = old.to_vec();
    all.extend(new);
    let mut all = active(&all);
    let current = sum(&all, replicas);
    let allowed = if spec.replicas > 0 {
        spec.replicas + spec.max_surge()
    } else {
        0
    };
    let to_add = allowed - current;
    match to_add.cmp(&0) {
        // Bigger first; among equals, newer first when growing, older first when shrinking.
        Ordering::Greater => all.sort_by(|a, b| {
            replicas(b)
                .cmp(&replicas(a))
                .then_with(|| by_creation(b, a))
        }),
        Ordering::Less => all.sort_by(|a, b| {
            replicas(b)
                .cmp(&replicas(a))
                .then_with(|| by_creation(a, b))
        }),
        Ordering::Equal => {}
    }
    let mut added = 0;
    let mut sizes: Vec<(String, i32)> = all
        .iter()
        .map(|rs| {
            let share = proportion(spec, rs, to_add, added);
            added += share;
            (name(rs).to_owned(), replicas(rs) + share)
        })
        .collect();
    // What rounding left over goes to the biggest ReplicaSet.
    if let Some(first) = sizes.first_mut()
        && added != to_add
    {
        first.1 = (first.1 + to_add - added).max(0);
    }
    sizes
}

// --- history (`cleanupDeployment`) -------------------------------------------------------

/// The old ReplicaSets to delete so that at most `revisionHistoryLimit` remain, oldest
/// revision first; only those with no replicas that their controller has caught up with.
pub fn to_clean_up<'r>(spec: &Spec<'_>, old: &[&'r ReplicaSet]) -> Vec<&'r ReplicaSet> {
    let Some(limit) = spec.revision_history_limit else {
        return Vec::new();
    };
    let mut alive: Vec<&ReplicaSet> = old
        .iter()
        .copied()
        .filter(|rs| rs.metadata.deletion_timestamp.is_none())
        .collect();
    let excess = usize::try_from(i64::try_from(alive.len()).unwrap_or(i64::MAX) - i64::from(limit))
        .unwrap_or(0);
    if excess == 0 {
        return Vec::new();
    }
    alive.sort_by(|a, b| {
        revision(a)
            .cmp(&revision(b))
            .then_with(|| by_creation(a, b))
    });
    alive
        .into_iter()
        .take(excess)
        .filter(|rs| {
            let observed = rs
                .status
                .as_ref()
                .and_then(|s| s.observed_generation)
                .unwrap_or(0);
            status_of(rs).0 == 0
                && replicas(rs) == 0
                && rs.metadata.generation.unwrap_or(0) <= observed
        })
        .collect()
}

// --- status (`syncDeploymentStatus`, `checkPausedConditions`) ----------------------------

/// `calculateStatus`: the counts over every ReplicaSet, and `Available`.
pub fn calculate_status(
    spec: &Spec<'_>,
    new: Option<&ReplicaSet>,
    all: &[&ReplicaSet],
    current: &DeploymentStatus,
    now: Timestamp,
) -> DeploymentStatus {
    let available = sum(all, |rs| status_of(rs).2);
    let total = sum(all, replicas);
    let mut status = DeploymentStatus {
        observed_generation: spec.d.metadata.generation,
        replicas: Some(sum(all, |rs| status_of(rs).0)),
        updated_replicas: Some(new.map_or(0, |rs| status_of(rs).0)),
        ready_replicas: Some(sum(all, |rs| status_of(rs).1)),
        available_replicas: Some(available),
        unavailable_replicas: Some((total - available).max(0)),
        collision_count: current.collision_count,
        conditions: current.conditions.clone(),
        terminating_replicas: terminating_replicas(all),
    };
    if available >= spec.replicas - spec.max_unavailable() {
        set_condition(
            &mut status,
            condition(
                AVAILABLE,
                "True",
                MIN_AVAILABLE,
                "Deployment has minimum availability.".into(),
                now,
            ),
        );
    } else {
        set_condition(
            &mut status,
            condition(
                AVAILABLE,
                "False",
                MIN_UNAVAILABLE,
                "Deployment does not have minimum availability.".into(),
                now,
            ),
        );
    }
    status
}

/// The ReplicaSets' `terminatingReplicas` summed; unknown (`None`) while any ReplicaSet's
/// controller has not reported it (`GetTerminatingReplicaCountForReplicaSets`).
pub fn terminating_replicas(all: &[&ReplicaSet]) -> Option<i32> {
    all.iter().try_fold(0i32, |sum, rs| {
        let own = rs.status.as_ref()?.terminating_replicas?;
        Some(sum.saturating_add(own))
    })
}

/// Whether `new` differs from `old` (unset counts as zero, except `terminatingReplicas`,
/// where unset means unknown), so that a write is needed.
pub fn status_changed(old: &DeploymentStatus, new: &DeploymentStatus) -> bool {
    let z = |v: Option<i32>| v.unwrap_or(0);
    z(old.replicas) != z(new.replicas)
        || z(old.updated_replicas) != z(new.updated_replicas)
        || z(old.ready_replicas) != z(new.ready_replicas)
        || z(old.available_replicas) != z(new.available_replicas)
        || z(old.unavailable_replicas) != z(new.unavailable_replicas)
        || old.observed_generation != new.observed_generation
        || old.collision_count != new.collision_count
        || old.terminating_replicas != new.terminating_replicas
        || old.conditions.clone().unwrap_or_default() != new.conditions.clone().unwrap_or_default()
}

/// `checkPausedConditions`: `Progressing` says paused or resumed; `None` when it already
/// does (or has timed out, which is kept).
pub fn paused_status(spec: &Spec<'_>, now: Timestamp) -> Option<DeploymentStatus> {
    if !spec.has_progress_deadline() {
        return None;
    }
    let mut status = spec.status();
    let cond = get_condition(&status, PROGRESSING);
    if cond.is_some_and(|c| c.reason.as_deref() == Some(TIMED_OUT)) {
        return None;
    }
    let paused_now = cond.is_some_and(|c| c.reason.as_deref() == Some(PAUSED));
    if spec.paused && !paused_now {
        set_condition(
            &mut status,
            condition(
                PROGRESSING,
                "Unknown",
                PAUSED,
                "Deployment is paused".into(),
                now,
            ),
        );
    } else if !spec.paused && paused_now {
        set_condition(
            &mut status,
            condition(
                PROGRESSING,
                "Unknown",
                RESUMED,
                "Deployment is resumed".into(),
                now,
            ),
        );
    } else {
        return None;
    }
    Some(status)
}
