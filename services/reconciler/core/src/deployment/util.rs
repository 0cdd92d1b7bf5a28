//! What every decision uses (`util/deployment_util.go`): the annotation keys and condition
//! reasons, accessors of ReplicaSets, revisions and the annotations that carry them, the
//! `pod-template-hash` and template comparison, and conditions.

use std::{cmp::Ordering, collections::BTreeMap};

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet},
        core::v1::PodTemplateSpec,
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time},
    jiff::Timestamp,
};

use super::spec::{Spec, Strategy};
use crate::hash::{FNV32_OFFSET_BASIS, fnv32a, safe_encode};

/// The label that tells a Deployment's ReplicaSets (and their Pods) apart.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
pub const REVISION: &str = "deployment.kubernetes.io/revision";
pub const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";

/// The deprecated `extensions/v1beta1` rollback request; never copied to ReplicaSets.
const ROLLBACK_TO: &str = "deprecated.deployment.rollback.to";
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
pub const AVAILABLE: &str = "Available";
pub const PROGRESSING: &str = "Progressing";
pub const REPLICA_FAILURE: &str = "ReplicaFailure";
pub const NEW_RS_CREATED: &str = "NewReplicaSetCreated";
pub const FOUND_NEW_RS: &str = "FoundNewReplicaSet";
pub const RS_UPDATED: &str = "ReplicaSetUpdated";
pub const NEW_RS_AVAILABLE: &str = "NewReplicaSetAvailable";
pub const TIMED_OUT: &str = "ProgressDeadlineExceeded";
pub const FAILED_RS_CREATE: &str = "ReplicaSetCreateError";
pub const PAUSED: &str = "DeploymentPaused";
pub const RESUMED: &str = "DeploymentResumed";
pub const MIN_AVAILABLE: &str = "MinimumReplicasAvailable";
pub const MIN_UNAVAILABLE: &str = "MinimumReplicasUnavailable";

/// kube-controller-manager's revision-history annotation is cut at this length
/// (`maxRevHistoryLengthInChars`): an annotation must stay small.
const MAX_REVISION_HISTORY_CHARS: usize = 2000;

// --- small accessors ---------------------------------------------------------------------

pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// `spec.replicas` (unset means 1, as the apiserver defaults it).
pub fn replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

pub(super) fn status_of(rs: &ReplicaSet) -> (i32, i32, i32) {
    rs.status.as_ref().map_or((0, 0, 0), |s| {
        (
            s.replicas,
            s.ready_replicas.unwrap_or(0),
            s.available_replicas.unwrap_or(0),
        )
    })
}

pub(super) fn name(rs: &ReplicaSet) -> &str {
    rs.metadata.name.as_deref().unwrap_or_default()
}

fn annotation<'r>(meta: &'r ObjectMeta, key: &str) -> Option<&'r str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

pub(super) fn int_annotation(rs: &ReplicaSet, key: &str) -> Option<i32> {
    annotation(&rs.metadata, key)?.parse().ok()
}

pub(super) fn active<'r>(rss: &[&'r ReplicaSet]) -> Vec<&'r ReplicaSet> {
    rss.iter().copied().filter(|rs| replicas(rs) > 0).collect()
}

/// `controller.ReplicaSetsByCreationTimestamp`: older first, then by name.
pub(super) fn by_creation(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    let created = |rs: &ReplicaSet| rs.metadata.creation_timestamp.as_ref().map(|t| t.0);
    created(a)
        .cmp(&created(b))
        .then_with(|| name(a).cmp(name(b)))
}

pub(super) fn sum(rss: &[&ReplicaSet], f: impl Fn(&ReplicaSet) -> i32) -> i32 {
    rss.iter().map(|rs| f(rs)).sum()
}

// --- revisions and the annotations ReplicaSets carry -------------------------------------

/// The revision annotation of a ReplicaSet; 0 when absent or malformed.
pub fn revision(rs: &ReplicaSet) -> i64 {
    annotation(&rs.metadata, REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

pub fn max_revision(rss: &[&ReplicaSet]) -> i64 {
    rss.iter().map(|rs| revision(rs)).max().unwrap_or(0)
}

/// The revision the new ReplicaSet gets: one more than any old one's.
pub fn new_revision(old: &[&ReplicaSet]) -> i64 {
    max_revision(old) + 1
}

/// Annotations of the Deployment copied to its ReplicaSets (`skipCopyAnnotation`).
fn copied_annotations(d: &Deployment) -> impl Iterator<Item = (&String, &String)> {
    d.metadata.annotations.iter().flatten().filter(|(k, _)| {
        ![
            LAST_APPLIED,
            REVISION,
            REVISION_HISTORY,
            DESIRED_REPLICAS,
            MAX_REPLICAS,
            ROLLBACK_TO,
        ]
        .contains(&k.as_str())
    })
}

/// `SetNewReplicaSetAnnotations`: the Deployment's annotations, a revision no lower than
/// `new_revision` (with the revision it had kept in the history), and on creation the
/// replicas annotations. Returns whether anything changed.
pub(super) fn set_new_rs_annotations(
    spec: &Spec<'_>,
    rs: &mut ReplicaSet,
    new_revision: i64,
    exists: bool,
) -> bool {
    let annotations = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    for (k, v) in copied_annotations(spec.d) {
        if annotations.get(k) != Some(v) {
            annotations.insert(k.clone(), v.clone());
            changed = true;
        }
    }
    let old_revision = annotations.get(REVISION).cloned();
    let old_number: i64 = old_revision
        .as_deref()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    if old_number < new_revision {
        annotations.insert(REVISION.into(), new_revision.to_string());
        changed = true;
        if let Some(old) = old_revision.filter(|r| !r.is_empty()) {
            let history = match annotations.get(REVISION_HISTORY) {
                Some(h) if !h.is_empty() => format!("{h},{old}"),
                _ => old,
            };
            // Keep the newest revisions when the list grows too long.
            let mut parts: Vec<&str> = history.split(',').collect();
            while parts.join(",").len() > MAX_REVISION_HISTORY_CHARS && parts.len() > 1 {
                parts.remove(0);
            }
            annotations.insert(REVISION_HISTORY.into(), parts.join(","));
        }
    }
    if !exists {
        changed |= set_replicas_annotations(rs, spec.replicas, spec.replicas + spec.max_surge());
    }
    changed
}

pub(super) fn set_replicas_annotations(rs: &mut ReplicaSet, desired: i32, max: i32) -> bool {
    let annotations = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    for (key, value) in [(DESIRED_REPLICAS, desired), (MAX_REPLICAS, max)] {
        let value = value.to_string();
        if annotations.get(key) != Some(&value) {
            annotations.insert(key.into(), value);
            changed = true;
        }
    }
    changed
}

// --- the new ReplicaSet's size -----------------------------------------------------------

/// `NewRSNewReplicas`: how many replicas the new ReplicaSet may have now.
pub fn new_rs_new_replicas(spec: &Spec<'_>, all: &[&ReplicaSet], new_replicas: i32) -> i32 {
    match spec.strategy {
        Strategy::Recreate => spec.replicas,
        Strategy::RollingUpdate { .. } => {
            let current = sum(all, replicas);
            let max_total = spec.replicas + spec.max_surge();
            if current >= max_total {
                return new_replicas;
            }
            let up = (max_total - current).min(spec.replicas - new_replicas);
            new_replicas + up
        }
    }
}

// --- hashing and templates ---------------------------------------------------------------

/// The `pod-template-hash` (`controller.ComputeHash`): FNV-32a of the template, then of the
/// collision count (little-endian) if any, printed in decimal and safely encoded.
///
/// kube-controller-manager hashes a dump of its Go structs; this hashes the template's JSON,
/// so the values differ from kube-controller-manager's for the same template. That is
/// harmless: the hash only needs to be stable here and unique per template, and the new
/// ReplicaSet is found by comparing templates, never by the hash.
pub fn pod_template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    // Serialising a k8s-openapi value to JSON cannot fail.
    let json = serde_json::to_vec(template).unwrap_or_default();
    let mut hash = fnv32a(&json, FNV32_OFFSET_BASIS);
    if let Some(count) = collision_count {
        hash = fnv32a(&count.to_le_bytes(), hash);
    }
    safe_encode(&hash.to_string())
}

fn without_hash(template: &PodTemplateSpec) -> PodTemplateSpec {
    let mut template = template.clone();
    if let Some(labels) = template.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        labels.remove(POD_TEMPLATE_HASH);
    }
    template
}

/// `deploymentutil.EqualIgnoreHash`: the templates are equal but for the hash label.
pub fn equal_ignore_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    let (a, b) = (without_hash(a), without_hash(b));
    // An empty label map and none are the same to the apiserver.
    let labels = |t: &PodTemplateSpec| {
        t.metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default()
    };
    let rest = |mut t: PodTemplateSpec| {
        if let Some(m) = t.metadata.as_mut() {
            m.labels = None;
        }
        t
    };
    labels(&a) == labels(&b) && rest(a) == rest(b)
}

pub(super) fn template_of(rs: &ReplicaSet) -> PodTemplateSpec {
    rs.spec
        .as_ref()
        .and_then(|s| s.template.clone())
        .unwrap_or_default()
}

// --- conditions --------------------------------------------------------------------------

pub(super) fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: Timestamp,
) -> DeploymentCondition {
    DeploymentCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_transition_time: Some(Time(now)),
        last_update_time: Some(Time(now)),
    }
}

pub fn get_condition<'s>(
    status: &'s DeploymentStatus,
    type_: &str,
) -> Option<&'s DeploymentCondition> {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
}

pub(super) fn remove_condition(status: &mut DeploymentStatus, type_: &str) {
    if let Some(conditions) = status.conditions.as_mut() {
        conditions.retain(|c| c.type_ != type_);
        if conditions.is_empty() {
            status.conditions = None;
        }
    }
}

/// `SetDeploymentCondition`: nothing changes when status and reason are the same; the
/// transition time is kept while the status is.
pub fn set_condition(status: &mut DeploymentStatus, mut condition: DeploymentCondition) {
    if let Some(current) = get_condition(status, &condition.type_) {
        if current.status == condition.status && current.reason == condition.reason {
            return;
        }
        if current.status == condition.status {
            condition.last_transition_time = current.last_transition_time.clone();
        }
    }
    remove_condition(status, &condition.type_);
    status
        .conditions
        .get_or_insert_with(Vec::new)
        .push(condition);
}

/// `now` to the second, as the apiserver stores condition times: a condition set twice in
/// one second compares equal to what was written.
pub fn whole_seconds(now: Timestamp) -> Timestamp {
    Timestamp::from_second(now.as_second()).unwrap_or(now)
}
