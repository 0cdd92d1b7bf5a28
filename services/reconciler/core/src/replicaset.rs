//! The ReplicaSet controller's decisions, as kube-controller-manager's
//! `pkg/controller/replicaset` makes them; also the ReplicationController's, through its
//! ReplicaSet form (`pkg/controller/replication` converts the same way).
//!
//! ```text
//!  pods (owned ∪ selected) ─► claim ─► owned active pods ─► diff ─► create n (slow start) | delete ranked
//!                               ├─► adopt: orphans the selector matches
//!                               └─► release: owned pods it no longer matches
//!  owned pods after the writes ─► status (replicas, fullyLabeled, ready, available, terminating)
//! ```

use std::{cmp::Ordering, collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::{
        apps::v1::{ReplicaSet, ReplicaSetCondition, ReplicaSetSpec, ReplicaSetStatus},
        core::v1::{
            Pod, PodTemplateSpec, ReplicationController, ReplicationControllerCondition,
            ReplicationControllerStatus,
        },
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference, Time},
    jiff::Timestamp,
};

use crate::selector::{Selector, SelectorError};

/// The most Pods created or deleted by one reconcile (kube-controller-manager's
/// `BurstReplicas`): bounds a single reconcile's apiserver calls; the rest come next time.
pub const BURST_REPLICAS: usize = 500;
/// Creations start with up to four Pods, then double: a template the apiserver refuses
/// (quota, admission) costs at most four calls, not `replicas` calls.
///
/// kube-controller-manager starts with one (`SlowStartInitialBatchSize`). A ReplicaSet of
/// four then creates its Pods in three round trips, and with many reconciles in flight on a
/// busy apiserver they reach the scheduler, and turn Ready, up to a second apart: each step
/// is one more status write for the ReplicaSet and its Deployment (docs/benchmarks.md, "A
/// ReplicaSet's Pods created together").
pub const SLOW_START_INITIAL_BATCH: usize = 4;
/// The condition set while creating or deleting Pods fails.
pub const REPLICA_FAILURE: &str = "ReplicaFailure";

/// A ReplicaSet as the controller needs it.
#[derive(Debug, Clone)]
pub struct Spec<'a> {
    pub rs: &'a ReplicaSet,
    pub uid: &'a str,
    pub replicas: usize,
    pub selector: Selector,
    pub min_ready_seconds: i64,
    pub deleting: bool,
    /// The kind the Pods' controller references name.
    pub owner: Owner,
}

/// What this controller reconciles: ReplicaSets, or ReplicationControllers in their
/// ReplicaSet form ([`replication_controller_as_replica_set`]), as kube-controller-manager's
/// replication manager is its ReplicaSet controller over a conversion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    ReplicaSet,
    ReplicationController,
}

impl Owner {
    /// `apiVersion` and `kind` of the controller references.
    pub fn type_meta(self) -> (&'static str, &'static str) {
        match self {
            Owner::ReplicaSet => ("apps/v1", "ReplicaSet"),
            Owner::ReplicationController => ("v1", "ReplicationController"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("metadata.uid: empty")]
    NoUid,
    #[error("spec.{0}")]
    Selector(#[from] SelectorError),
    #[error("spec.selector: empty, it would select every Pod of the namespace")]
    EmptySelector,
    #[error("spec.replicas: negative ({0})")]
    NegativeReplicas(i32),
}

impl<'a> Spec<'a> {
    pub fn new(rs: &'a ReplicaSet) -> Result<Self, SpecError> {
        let uid = rs.metadata.uid.as_deref().filter(|u| !u.is_empty());
        let spec = rs.spec.as_ref();
        let selector = spec.map(|s| &s.selector).cloned().unwrap_or_default();
        if selector
            .match_labels
            .as_ref()
            .is_none_or(BTreeMap::is_empty)
            && selector
                .match_expressions
                .as_ref()
                .is_none_or(Vec::is_empty)
        {
            return Err(SpecError::EmptySelector);
        }
        // An unset replicas means 1, as the apiserver defaults it.
        let replicas = spec.and_then(|s| s.replicas).unwrap_or(1);
        Ok(Self {
            rs,
            uid: uid.ok_or(SpecError::NoUid)?,
            replicas: usize::try_from(replicas)
                .map_err(|_| SpecError::NegativeReplicas(replicas))?,
            selector: Selector::new(&selector)?,
            min_ready_seconds: spec.and_then(|s| s.min_ready_seconds).unwrap_or(0).into(),
            deleting: rs.metadata.deletion_timestamp.is_some(),
            owner: Owner::ReplicaSet,
        })
    }

    /// The same for the ReplicaSet form of a ReplicationController.
    pub fn of(rs: &'a ReplicaSet, owner: Owner) -> Result<Self, SpecError> {
        Ok(Self {
            owner,
            ..Self::new(rs)?
        })
    }

    fn controls(&self, pod: &Pod) -> bool {
        controller_of(pod).is_some_and(|r| r.uid == self.uid)
    }
}

/// The owner reference with `controller: true`, if any.
pub fn controller_of(pod: &Pod) -> Option<&OwnerReference> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// Not finished and not being deleted (`controller.FilterActivePods`).
pub fn is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed")) && pod.metadata.deletion_timestamp.is_none()
}

/// Being deleted and not finished (`controller.FilterTerminatingPods`).
pub fn is_terminating(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed")) && pod.metadata.deletion_timestamp.is_some()
}

/// When the Pod's `Ready` condition last turned true; `None` while not ready.
pub fn ready_since(pod: &Pod) -> Option<Option<Timestamp>> {
    pod.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .map(|c| c.last_transition_time.as_ref().map(|t| t.0))
}

pub fn is_ready(pod: &Pod) -> bool {
    ready_since(pod).is_some()
}

/// Ready for at least `min_ready_seconds` (`podutil.IsPodAvailable`).
pub fn is_available(pod: &Pod, min_ready_seconds: i64, now: Timestamp) -> bool {
    available_in(pod, min_ready_seconds, now) == Some(Duration::ZERO)
}

/// How long until the Pod counts as available: zero when it is, `None` while not ready.
pub fn available_in(pod: &Pod, min_ready_seconds: i64, now: Timestamp) -> Option<Duration> {
    let since = ready_since(pod)?;
    if min_ready_seconds <= 0 {
        return Some(Duration::ZERO);
    }
    let Some(since) = since else {
        return Some(Duration::ZERO);
    };
    let ready_for = now.as_millisecond() - since.as_millisecond();
    let wanted = min_ready_seconds * 1000;
    // kube-controller-manager requires strictly more than minReadySeconds.
    Some(if ready_for > wanted {
        Duration::ZERO
    } else {
        Duration::from_millis((wanted - ready_for + 1).unsigned_abs())
    })
}

/// Which Pods the ReplicaSet keeps, adopts and releases (`PodControllerRefManager.ClaimPods`).
#[derive(Debug, Default, PartialEq)]
pub struct Claim<'p> {
    /// Controlled by the ReplicaSet, matching its selector, active.
    pub owned: Vec<&'p Pod>,
    /// Controlled, matching and being deleted: counted as `terminatingReplicas`.
    pub terminating: Vec<&'p Pod>,
    /// Orphans the selector matches: to be given a controller reference.
    pub adopt: Vec<&'p Pod>,
    /// Controlled but no longer matching: the controller reference is to be removed.
    pub release: Vec<&'p Pod>,
}

pub fn claim<'p>(spec: &Spec<'_>, pods: &'p [Pod]) -> Claim<'p> {
    let mut claim = Claim::default();
    let namespace = spec.rs.metadata.namespace.as_deref();
    for pod in pods {
        if pod.metadata.namespace.as_deref() != namespace {
            continue;
        }
        let matches = spec.selector.matches(pod.metadata.labels.as_ref());
        if spec.controls(pod) {
            if !matches {
                // A ReplicaSet being deleted leaves its Pods to the garbage collector.
                if !spec.deleting && is_active(pod) {
                    claim.release.push(pod);
                }
            } else if is_active(pod) {
                claim.owned.push(pod);
            } else if is_terminating(pod) {
                claim.terminating.push(pod);
            }
        } else if controller_of(pod).is_none()
            && matches
            && !spec.deleting
            && pod.metadata.deletion_timestamp.is_none()
            && is_active(pod)
        {
            claim.adopt.push(pod);
        }
    }
    claim
}

/// What to do about the number of Pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Diff {
    Create(usize),
    Delete(usize),
    None,
}

/// `replicas` against the active owned Pods, at most [`BURST_REPLICAS`] at a time.
pub fn diff(spec: &Spec<'_>, active: usize) -> Diff {
    if spec.deleting {
        return Diff::None;
    }
    match active.cmp(&spec.replicas) {
        Ordering::Less => Diff::Create((spec.replicas - active).min(BURST_REPLICAS)),
        Ordering::Greater => Diff::Delete((active - spec.replicas).min(BURST_REPLICAS)),
        Ordering::Equal => Diff::None,
    }
}

/// Batch sizes for creating `count` Pods: 1, 2, 4, … (the last one what is left). The caller
/// stops at the first batch with a failure and skips the rest.
pub fn slow_start_batches(count: usize) -> Vec<usize> {
    let mut batches = Vec::new();
    let (mut left, mut size) = (count, SLOW_START_INITIAL_BATCH);
    while left > 0 {
        let batch = size.min(left);
        batches.push(batch);
        left -= batch;
        size *= 2;
    }
    batches
}

/// The annotation that tells which Pods a scale-down takes first (lower cost first).
pub const POD_DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The `count` Pods of `owned` to delete, first to go first (`getPodsToDelete` and
/// `controller.ActivePodsWithRanks`, with `PodDeletionCost` and `LogarithmicScaleDown` on, as
/// in kube-controller-manager 1.35):
///
/// 1. unscheduled before scheduled;
/// 2. Pending before Unknown before Running;
/// 3. not ready before ready;
/// 4. lower `controller.kubernetes.io/pod-deletion-cost` first;
/// 5. more active `related` Pods on the same Node first;
/// 6. both ready: ready more recently first, compared by `log2` of the time ready (a Pod
///    whose ready time is unknown first); same bucket: by UID;
/// 7. more container restarts first;
/// 8. created more recently first, compared by `log2` of the age; same bucket: by UID.
///
/// `related` are the Pods of every ReplicaSet with the same controller as this one
/// (`getIndirectlyRelatedPods`): none for a ReplicaSet without a controller, whose Pods then
/// all rank alike on step 5.
pub fn pods_to_delete<'p>(
    owned: &[&'p Pod],
    related: &[&Pod],
    count: usize,
    now: Timestamp,
) -> Vec<&'p Pod> {
    let mut ranked = owned.to_vec();
    // kube-controller-manager sorts only when some Pods stay.
    if count < ranked.len() {
        let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
        for pod in related.iter().filter(|p| is_active(p)) {
            *per_node.entry(node_name(pod)).or_default() += 1;
        }
        let rank = |pod: &Pod| per_node.get(node_name(pod)).copied().unwrap_or(0);
        ranked.sort_by(|a, b| deletion_order(a, rank(a), b, rank(b), now));
    }
    ranked.truncate(count);
    ranked
}

fn node_name(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

fn node_of(pod: &Pod) -> Option<&str> {
    Some(node_name(pod)).filter(|n| !n.is_empty())
}

fn phase_rank(pod: &Pod) -> u8 {
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Unknown") => 1,
        Some("Running") => 2,
        _ => 0,
    }
}

fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |cs| {
            cs.iter().map(|c| c.restart_count).max().unwrap_or(0).max(0)
        })
}

/// The Pod's deletion cost; unset or not an `int32` counts as 0, as in
/// kube-controller-manager.
pub fn deletion_cost(pod: &Pod) -> i32 {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(POD_DELETION_COST))
        .and_then(|v| v.parse::<i32>().ok())
        .unwrap_or(0)
}

/// `floor(log2(now - t))` in nanoseconds, or -1 for a time not in the past
/// (`logarithmicRankDiff`'s rank of one time).
fn log_bucket(t: Timestamp, now: Timestamp) -> i64 {
    let nanos = now.as_nanosecond() - t.as_nanosecond();
    if nanos <= 0 {
        return -1;
    }
    // ilog2 is floor(log2) for a positive integer, what Go's int64(math.Log2(..)) gives.
    i64::from(nanos.unsigned_abs().ilog2())
}

/// Later first, an unknown time before any known one (`afterOrZero`), or by logarithmic
/// bucket and then UID when both are known.
fn newer_first(
    a: &Pod,
    ta: Option<Timestamp>,
    b: &Pod,
    tb: Option<Timestamp>,
    now: Timestamp,
) -> Ordering {
    match (ta, tb) {
        (Some(x), Some(y)) if x == y => Ordering::Equal,
        (Some(x), Some(y)) => match log_bucket(x, now).cmp(&log_bucket(y, now)) {
            Ordering::Equal => a.metadata.uid.cmp(&b.metadata.uid),
            other => other,
        },
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
    }
}

/// Less means deleted first.
fn deletion_order(a: &Pod, rank_a: usize, b: &Pod, rank_b: usize, now: Timestamp) -> Ordering {
    let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    node_of(a)
        .is_some()
        .cmp(&node_of(b).is_some())
        .then(phase_rank(a).cmp(&phase_rank(b)))
        .then(is_ready(a).cmp(&is_ready(b)))
        .then(deletion_cost(a).cmp(&deletion_cost(b)))
        .then(rank_b.cmp(&rank_a))
        .then_with(|| {
            if is_ready(a) && is_ready(b) {
                newer_first(
                    a,
                    ready_since(a).flatten(),
                    b,
                    ready_since(b).flatten(),
                    now,
                )
            } else {
                Ordering::Equal
            }
        })
        .then(restarts(b).cmp(&restarts(a)))
        .then_with(|| newer_first(a, created(a), b, created(b), now))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// The controller reference every Pod of the ReplicaSet carries.
pub fn controller_ref(spec: &Spec<'_>) -> OwnerReference {
    let (api_version, kind) = spec.owner.type_meta();
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: spec.rs.metadata.name.clone().unwrap_or_default(),
        uid: spec.uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// A new Pod from the template (`controller.GetPodFromTemplate`): `generateName`
/// `<replicaset>-`, the template's labels, annotations, finalizers and spec, and the
/// controller reference.
pub fn pod_from_template(spec: &Spec<'_>) -> Pod {
    let template = spec
        .rs
        .spec
        .as_ref()
        .and_then(|s| s.template.clone())
        .unwrap_or_default();
    pod_from(
        template,
        spec.rs.metadata.name.as_deref().unwrap_or_default(),
        spec.rs.metadata.namespace.as_deref().unwrap_or_default(),
        controller_ref(spec),
    )
}

/// A new Pod of `owner` from `template` (`controller.GetPodFromTemplate`): `generateName`
/// `<owner>-`, the template's labels, annotations, finalizers and spec, and the controller
/// reference.
pub fn pod_from(
    template: PodTemplateSpec,
    owner: &str,
    namespace: &str,
    controller: OwnerReference,
) -> Pod {
    let meta = template.metadata.unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{owner}-")),
            namespace: Some(namespace.to_owned()),
            labels: meta.labels,
            annotations: meta.annotations,
            finalizers: meta.finalizers,
            owner_references: Some(vec![controller]),
            ..ObjectMeta::default()
        },
        spec: template.spec,
        status: None,
    }
}

/// A failure of the last create or delete round, reported as the `ReplicaFailure` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManageFailure {
    /// `FailedCreate` or `FailedDelete`.
    pub reason: &'static str,
    pub message: String,
}

/// The status kube-controller-manager would write (`calculateStatus`), from the owned Pods
/// as read after this reconcile's writes.
pub fn status(
    spec: &Spec<'_>,
    claim: &Claim<'_>,
    failure: Option<&ManageFailure>,
    now: Timestamp,
) -> ReplicaSetStatus {
    let template_labels = spec
        .rs
        .spec
        .as_ref()
        .and_then(|s| s.template.as_ref())
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let fully = Selector::from_labels(&template_labels);
    let count = |f: &dyn Fn(&Pod) -> bool| {
        i32::try_from(claim.owned.iter().filter(|p| f(p)).count()).unwrap_or(i32::MAX)
    };
    let old = spec.rs.status.clone().unwrap_or_default();
    let mut conditions: Vec<ReplicaSetCondition> = old
        .conditions
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ != REPLICA_FAILURE)
        .collect();
    if let Some(failure) = failure {
        let previous = spec
            .rs
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == REPLICA_FAILURE));
        conditions.push(ReplicaSetCondition {
            type_: REPLICA_FAILURE.into(),
            status: "True".into(),
            reason: Some(failure.reason.into()),
            message: Some(failure.message.clone()),
            // Kept from the previous condition so that a persisting failure does not rewrite
            // the status on every retry.
            last_transition_time: previous
                .and_then(|c| c.last_transition_time.clone())
                .or(Some(Time(now))),
        });
    }
    ReplicaSetStatus {
        replicas: count(&|_| true),
        fully_labeled_replicas: Some(count(&|p| fully.matches(p.metadata.labels.as_ref()))),
        ready_replicas: Some(count(&is_ready)),
        available_replicas: Some(count(&|p| is_available(p, spec.min_ready_seconds, now))),
        // A ReplicationController's status has no such field (kube-controller-manager's
        // replication manager runs without EnableStatusTerminatingReplicas).
        terminating_replicas: (spec.owner == Owner::ReplicaSet)
            .then(|| i32::try_from(claim.terminating.len()).unwrap_or(i32::MAX)),
        observed_generation: spec.rs.metadata.generation,
        conditions: (!conditions.is_empty()).then_some(conditions),
    }
}

/// Whether `new` differs from the status the ReplicaSet has, so that a write is needed.
pub fn status_changed(rs: &ReplicaSet, new: &ReplicaSetStatus) -> bool {
    let old = rs.status.clone().unwrap_or_default();
    let zero = |v: Option<i32>| v.unwrap_or(0);
    old.replicas != new.replicas
        || zero(old.fully_labeled_replicas) != zero(new.fully_labeled_replicas)
        || zero(old.ready_replicas) != zero(new.ready_replicas)
        || zero(old.available_replicas) != zero(new.available_replicas)
        || old.terminating_replicas != new.terminating_replicas
        || old.observed_generation != new.observed_generation
        || old.conditions.unwrap_or_default() != new.conditions.clone().unwrap_or_default()
}

/// When to look again so that `availableReplicas` catches up with Pods that are ready but not
/// yet for `minReadySeconds`.
pub fn recheck_after(spec: &Spec<'_>, claim: &Claim<'_>, now: Timestamp) -> Option<Duration> {
    claim
        .owned
        .iter()
        .filter_map(|p| available_in(p, spec.min_ready_seconds, now))
        .filter(|d| !d.is_zero())
        .min()
}

/// A ReplicationController as a ReplicaSet (kube-controller-manager's `convertRCtoRS`): the
/// same metadata, its selector map as `matchLabels`, its template, replicas,
/// `minReadySeconds` and status.
pub fn replication_controller_as_replica_set(rc: &ReplicationController) -> ReplicaSet {
    let spec = rc.spec.clone().unwrap_or_default();
    let status = rc.status.clone().map(|s| ReplicaSetStatus {
        replicas: s.replicas,
        fully_labeled_replicas: s.fully_labeled_replicas,
        ready_replicas: s.ready_replicas,
        available_replicas: s.available_replicas,
        terminating_replicas: None,
        observed_generation: s.observed_generation,
        conditions: s.conditions.map(|cs| {
            cs.into_iter()
                .map(|c| ReplicaSetCondition {
                    type_: c.type_,
                    status: c.status,
                    reason: c.reason,
                    message: c.message,
                    last_transition_time: c.last_transition_time,
                })
                .collect()
        }),
    });
    ReplicaSet {
        metadata: rc.metadata.clone(),
        spec: Some(ReplicaSetSpec {
            replicas: spec.replicas,
            min_ready_seconds: spec.min_ready_seconds,
            selector: LabelSelector {
                match_labels: spec.selector,
                match_expressions: None,
            },
            template: spec.template,
        }),
        status,
    }
}

/// A ReplicaSet status as a ReplicationController's (`convertRStoRC`).
pub fn replication_controller_status(status: ReplicaSetStatus) -> ReplicationControllerStatus {
    ReplicationControllerStatus {
        replicas: status.replicas,
        fully_labeled_replicas: status.fully_labeled_replicas,
        ready_replicas: status.ready_replicas,
        available_replicas: status.available_replicas,
        observed_generation: status.observed_generation,
        conditions: status.conditions.map(|cs| {
            cs.into_iter()
                .map(|c| ReplicationControllerCondition {
                    type_: c.type_,
                    status: c.status,
                    reason: c.reason,
                    message: c.message,
                    last_transition_time: c.last_transition_time,
                })
                .collect()
        }),
    }
}

#[cfg(test)]
mod tests;
