//! The StatefulSet controller's decisions, as kube-controller-manager's
//! `pkg/controller/statefulset` makes them.
//!
//! ```text
//!  pods (owned ∪ selected, named <set>-<ordinal>) ─► claim (adopt, release)
//!  revisions ─► current (status.currentRevision) and update (the set's template now)
//!  replicas [start, start+replicas) ─► a missing one: created from its revision's template,
//!                                      claims (volumeClaimTemplates) first
//!                                      failed or succeeded: deleted, to be made again
//!                                      wrong name, storage or claim owners: fixed
//!  condemned (ordinal outside) ─► claim owners per whenScaled, then deleted, highest first
//!  RollingUpdate ─► the highest outdated Pod at or above the partition deleted, one at a time
//!                   (up to maxUnavailable when set)
//! ```
//!
//! `OrderedReady` goes one Pod at a time: each step waits for the Pods before it to be
//! Running, Ready and available. `Parallel` takes every step of a phase at once.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::{ControllerRevision, StatefulSet, StatefulSetStatus},
        core::v1::{
            PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodTemplateSpec, Volume,
        },
    },
    apimachinery::pkg::{
        apis::meta::v1::{ObjectMeta, OwnerReference},
        runtime::RawExtension,
        util::intstr::IntOrString,
    },
    jiff::Timestamp,
};
use serde_json::Value;

use crate::{
    deployment::scaled_value,
    history::{self, HASH_LABEL},
    replicaset::{is_available, is_ready},
    selector::{Selector, SelectorError},
};

/// The label with the Pod's own name, for a per-Pod Service.
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
/// The label with the Pod's ordinal.
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// The label naming the ControllerRevision a Pod was made from.
pub const REVISION_LABEL: &str = "controller-revision-hash";
/// `revisionHistoryLimit` when unset.
pub const DEFAULT_REVISION_HISTORY_LIMIT: i32 = 10;

/// What happens to a claim when its Pod is scaled away or its StatefulSet deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimPolicy {
    Retain,
    Delete,
}

impl ClaimPolicy {
    fn parse(value: Option<&str>) -> Self {
        // kube-controller-manager treats an unknown policy as Retain.
        if value == Some("Delete") {
            Self::Delete
        } else {
            Self::Retain
        }
    }
}

/// How a template change reaches the Pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Strategy {
    /// Only Pods deleted by someone else come back at the new revision.
    OnDelete,
    /// Highest ordinal first, down to `partition`.
    RollingUpdate {
        /// Whether `rollingUpdate` is set (the apiserver sets it, with partition 0).
        set: bool,
        partition: i32,
        /// `maxUnavailable`, resolved against `replicas`; `None` when unset: one Pod at a
        /// time, waiting on the Pods at or above the one updated (kube-controller-manager
        /// without `MaxUnavailableStatefulSet`; the apiserver keeps the field only with it).
        max_unavailable: Option<i32>,
    },
}

/// A StatefulSet as the controller needs it.
#[derive(Debug, Clone)]
pub struct Spec<'a> {
    pub set: &'a StatefulSet,
    pub name: &'a str,
    pub namespace: &'a str,
    pub uid: &'a str,
    pub replicas: i32,
    /// `.spec.ordinals.start`.
    pub start: i32,
    pub selector: Selector,
    pub min_ready_seconds: i64,
    /// `podManagementPolicy: Parallel`.
    pub parallel: bool,
    pub strategy: Strategy,
    pub when_deleted: ClaimPolicy,
    pub when_scaled: ClaimPolicy,
    pub revision_history_limit: i32,
    pub deleting: bool,
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
    #[error("spec.updateStrategy.rollingUpdate.maxUnavailable: {0}")]
    MaxUnavailable(String),
}

impl<'a> Spec<'a> {
    pub fn new(set: &'a StatefulSet) -> Result<Self, SpecError> {
        let spec = set.spec.as_ref();
        let selector = spec.map(|s| &s.selector).cloned().unwrap_or_default();
        let selector = Selector::new(&selector)?;
        if selector.is_empty() {
            return Err(SpecError::EmptySelector);
        }
        let replicas = spec.and_then(|s| s.replicas).unwrap_or(1);
        if replicas < 0 {
            return Err(SpecError::NegativeReplicas(replicas));
        }
        let strategy = spec.and_then(|s| s.update_strategy.as_ref());
        let strategy = if strategy.and_then(|s| s.type_.as_deref()) == Some("OnDelete") {
            Strategy::OnDelete
        } else {
            let rolling = strategy.and_then(|s| s.rolling_update.as_ref());
            let max_unavailable = rolling
                .and_then(|r| r.max_unavailable.as_ref())
                .map(|m| max_unavailable(m, replicas))
                .transpose()?;
            Strategy::RollingUpdate {
                set: rolling.is_some(),
                partition: rolling.and_then(|r| r.partition).unwrap_or(0),
                max_unavailable,
            }
        };
        let retention = spec.and_then(|s| s.persistent_volume_claim_retention_policy.as_ref());
        Ok(Self {
            set,
            name: set.metadata.name.as_deref().unwrap_or_default(),
            namespace: set.metadata.namespace.as_deref().unwrap_or_default(),
            uid: set
                .metadata
                .uid
                .as_deref()
                .filter(|u| !u.is_empty())
                .ok_or(SpecError::NoUid)?,
            replicas,
            start: spec
                .and_then(|s| s.ordinals.as_ref())
                .and_then(|o| o.start)
                .unwrap_or(0),
            selector,
            min_ready_seconds: spec.and_then(|s| s.min_ready_seconds).unwrap_or(0).into(),
            parallel: spec.and_then(|s| s.pod_management_policy.as_deref()) == Some("Parallel"),
            strategy,
            when_deleted: ClaimPolicy::parse(retention.and_then(|r| r.when_deleted.as_deref())),
            when_scaled: ClaimPolicy::parse(retention.and_then(|r| r.when_scaled.as_deref())),
            revision_history_limit: spec
                .and_then(|s| s.revision_history_limit)
                .unwrap_or(DEFAULT_REVISION_HISTORY_LIMIT),
            deleting: set.metadata.deletion_timestamp.is_some(),
        })
    }

    /// The last ordinal of a replica.
    pub fn end(&self) -> i32 {
        self.start + self.replicas - 1
    }

    fn in_range(&self, ordinal: i32) -> bool {
        (self.start..=self.end()).contains(&ordinal)
    }

    fn claim_templates(&self) -> &'a [PersistentVolumeClaim] {
        self.set
            .spec
            .as_ref()
            .and_then(|s| s.volume_claim_templates.as_deref())
            .unwrap_or_default()
    }

    fn match_labels(&self) -> BTreeMap<String, String> {
        self.set
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.clone())
            .unwrap_or_default()
    }

    /// The controller reference of its Pods and revisions.
    pub fn controller_ref(&self) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: "StatefulSet".into(),
            name: self.name.to_owned(),
            uid: self.uid.to_owned(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }
}

/// `getStatefulSetMaxUnavailable`: a number or a percentage of `replicas` rounded down, at
/// least 1.
fn max_unavailable(value: &IntOrString, replicas: i32) -> Result<i32, SpecError> {
    scaled_value(value, replicas, false, "maxUnavailable")
        .map(|n| n.max(1))
        .map_err(|e| SpecError::MaxUnavailable(e.to_string()))
}

// --- names and ordinals --------------------------------------------------------------------

/// The StatefulSet a Pod's name says it belongs to, and its ordinal: `<parent>-<digits>`
/// (`getParentNameAndOrdinal`). The ordinal is `None` for another name or one past `i32`.
pub fn parent_and_ordinal(name: &str) -> (&str, Option<i32>) {
    match name.rsplit_once('-') {
        Some((parent, digits))
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) =>
        {
            (parent, digits.parse().ok())
        }
        _ => ("", None),
    }
}

pub fn ordinal(pod: &Pod) -> Option<i32> {
    parent_and_ordinal(pod.metadata.name.as_deref().unwrap_or_default()).1
}

pub fn pod_name(set: &str, ordinal: i32) -> String {
    format!("{set}-{ordinal}")
}

/// `<template>-<set>-<ordinal>`: the claim of one Pod from one `volumeClaimTemplates` entry.
pub fn claim_name(template: &str, set: &str, ordinal: i32) -> String {
    format!("{template}-{set}-{ordinal}")
}

/// The revision a Pod was made from (its `controller-revision-hash` label).
pub fn pod_revision(pod: &Pod) -> &str {
    label(&pod.metadata, REVISION_LABEL)
}

fn label<'m>(meta: &'m ObjectMeta, key: &str) -> &'m str {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map_or("", String::as_str)
}

// --- Pod states ----------------------------------------------------------------------------

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

/// The apiserver gives every Pod a phase; a Pod without one is one still to be created.
fn is_created(pod: &Pod) -> bool {
    !phase(pod).is_empty()
}

fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

pub fn is_running_and_ready(pod: &Pod) -> bool {
    phase(pod) == "Running" && is_ready(pod)
}

fn is_unavailable(pod: &Pod, min_ready_seconds: i64, now: Timestamp) -> bool {
    !is_available(pod, min_ready_seconds, now) || is_terminating(pod)
}

// --- claiming Pods -------------------------------------------------------------------------

pub use crate::claim::Claim;

/// Which Pods the StatefulSet keeps, adopts and releases (`ClaimPods` with `isMemberOf`): a
/// Pod is its own when the selector matches it and its name is `<set>-<ordinal>`.
pub fn claim<'p>(spec: &Spec<'_>, pods: &'p [Pod]) -> Claim<'p> {
    crate::claim::claim(spec.namespace, spec.uid, spec.deleting, pods, |pod| {
        spec.selector.matches(pod.metadata.labels.as_ref())
            && parent_and_ordinal(pod.metadata.name.as_deref().unwrap_or_default()).0 == spec.name
    })
}

/// The revisions the StatefulSet may use ([`history::own`]); the orphans are to be adopted.
pub fn own_revisions<'r>(
    spec: &Spec<'_>,
    revisions: &'r [ControllerRevision],
) -> (Vec<&'r ControllerRevision>, Vec<&'r ControllerRevision>) {
    history::own(spec.namespace, spec.uid, &spec.selector, revisions)
}

// --- revisions -----------------------------------------------------------------------------

/// The revision data of the StatefulSet as it is now (`getPatch`): a patch that replaces its
/// template ([`history::template_patch`]).
pub fn revision_data(set: &StatefulSet) -> Value {
    history::template_patch(set.spec.as_ref().map(|s| &s.template))
}

/// The template a revision restores ([`history::patched_template`]).
pub fn revision_template(revision: &ControllerRevision) -> Result<PodTemplateSpec, String> {
    history::patched_template(revision)
}

/// A new revision of the StatefulSet (`newRevision`): its template's labels and the hash
/// label, its annotations, its controller reference, named by the hash of `data` and
/// `collision_count`.
pub fn new_revision(
    spec: &Spec<'_>,
    data: &Value,
    revision: i64,
    collision_count: i32,
) -> ControllerRevision {
    let hash = history::revision_hash(&history::go_json(data), Some(collision_count));
    let mut labels = template_meta(spec.set).labels.clone().unwrap_or_default();
    labels.insert(HASH_LABEL.into(), hash.clone());
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(history::revision_name(spec.name, &hash)),
            namespace: Some(spec.namespace.to_owned()),
            labels: Some(labels),
            annotations: spec
                .set
                .metadata
                .annotations
                .clone()
                .filter(|a| !a.is_empty()),
            owner_references: Some(vec![spec.controller_ref()]),
            ..ObjectMeta::default()
        },
        data: Some(RawExtension(data.clone())),
        revision,
    }
}

fn template_meta(set: &StatefulSet) -> ObjectMeta {
    set.spec
        .as_ref()
        .and_then(|s| s.template.metadata.clone())
        .unwrap_or_default()
}

// --- Pods and their claims -----------------------------------------------------------------

/// The claims a Pod of `ordinal` has, in `volumeClaimTemplates` order
/// (`getPersistentVolumeClaims`): each template named for the Pod, with the selector's
/// `matchLabels` added to its labels.
pub fn claims_for(spec: &Spec<'_>, ordinal: i32) -> Vec<PersistentVolumeClaim> {
    spec.claim_templates()
        .iter()
        .map(|template| {
            let mut claim = template.clone();
            let template_name = template.metadata.name.as_deref().unwrap_or_default();
            claim.metadata.name = Some(claim_name(template_name, spec.name, ordinal));
            claim.metadata.namespace = Some(spec.namespace.to_owned());
            let mut labels = claim.metadata.labels.take().unwrap_or_default();
            labels.extend(spec.match_labels());
            claim.metadata.labels = Some(labels);
            claim
        })
        .collect()
}

/// A new Pod of `ordinal` from `template` at `revision` (`newVersionedStatefulSetPod`):
/// the template's labels, annotations, finalizers and spec; its name, hostname, subdomain
/// and identity labels; a volume per claim template; the controller reference.
pub fn new_pod(spec: &Spec<'_>, template: &PodTemplateSpec, ordinal: i32, revision: &str) -> Pod {
    let meta = template.metadata.clone().unwrap_or_default();
    let name = pod_name(spec.name, ordinal);
    let mut labels = meta.labels.unwrap_or_default();
    labels.insert(POD_NAME_LABEL.into(), name.clone());
    labels.insert(POD_INDEX_LABEL.into(), ordinal.to_string());
    labels.insert(REVISION_LABEL.into(), revision.to_owned());
    let mut pod_spec = template.spec.clone().unwrap_or_default();
    pod_spec.hostname = Some(name.clone());
    pod_spec.subdomain = spec
        .set
        .spec
        .as_ref()
        .and_then(|s| s.service_name.clone())
        .filter(|s| !s.is_empty());
    let mut pod = Pod {
        metadata: ObjectMeta {
            name: Some(name),
            generate_name: Some(format!("{}-", spec.name)),
            namespace: Some(spec.namespace.to_owned()),
            labels: Some(labels),
            annotations: meta.annotations,
            finalizers: meta.finalizers,
            owner_references: Some(vec![spec.controller_ref()]),
            ..ObjectMeta::default()
        },
        spec: Some(pod_spec),
        status: None,
    };
    pod.spec = Some(with_storage(spec, &pod, ordinal));
    pod
}

/// The Pod's spec with a volume per claim template, naming the Pod's claim, first, and its
/// other volumes after (`updateStorage`).
fn with_storage(spec: &Spec<'_>, pod: &Pod, ordinal: i32) -> k8s_openapi::api::core::v1::PodSpec {
    let mut pod_spec = pod.spec.clone().unwrap_or_default();
    let templates = spec.claim_templates();
    if templates.is_empty() {
        return pod_spec;
    }
    let claim_volumes = templates.iter().map(|t| {
        let template_name = t.metadata.name.clone().unwrap_or_default();
        Volume {
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(&template_name, spec.name, ordinal),
                read_only: None,
            }),
            name: template_name,
            ..Volume::default()
        }
    });
    let is_claim = |v: &Volume| {
        templates
            .iter()
            .any(|t| t.metadata.name.as_ref() == Some(&v.name))
    };
    let others: Vec<Volume> = pod_spec
        .volumes
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|v| !is_claim(v))
        .collect();
    pod_spec.volumes = Some(claim_volumes.chain(others).collect());
    pod_spec
}

/// `identityMatches`: named `<set>-<ordinal>` in the set's namespace, with the pod-name label.
pub fn identity_matches(spec: &Spec<'_>, pod: &Pod) -> bool {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let (parent, ordinal) = parent_and_ordinal(name);
    ordinal.is_some_and(|o| o >= 0 && name == pod_name(spec.name, o))
        && parent == spec.name
        && pod.metadata.namespace.as_deref() == Some(spec.namespace)
        && label(&pod.metadata, POD_NAME_LABEL) == name
}

/// `storageMatches`: a volume per claim template, naming this Pod's claim.
pub fn storage_matches(spec: &Spec<'_>, pod: &Pod) -> bool {
    let Some(ordinal) = ordinal(pod).filter(|o| *o >= 0) else {
        return false;
    };
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default();
    spec.claim_templates().iter().all(|t| {
        let template_name = t.metadata.name.as_deref().unwrap_or_default();
        volumes.iter().any(|v| {
            v.name == template_name
                && v.persistent_volume_claim
                    .as_ref()
                    .is_some_and(|c| c.claim_name == claim_name(template_name, spec.name, ordinal))
        })
    })
}

/// The Pod with its identity and storage put right (`updateIdentity`, `updateStorage`).
pub fn fixed_pod(spec: &Spec<'_>, pod: &Pod) -> Pod {
    let mut fixed = pod.clone();
    let ordinal = ordinal(pod).unwrap_or(0);
    let name = pod_name(spec.name, ordinal);
    let labels = fixed.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(POD_NAME_LABEL.into(), name);
    labels.insert(POD_INDEX_LABEL.into(), ordinal.to_string());
    if !storage_matches(spec, pod) {
        fixed.spec = Some(with_storage(spec, pod, ordinal));
    }
    fixed
}

/// The claims of the Pod of `ordinal` that do not exist yet, or an error naming one being
/// deleted (`createPersistentVolumeClaims`).
pub fn missing_claims(
    spec: &Spec<'_>,
    ordinal: i32,
    existing: &BTreeMap<String, PersistentVolumeClaim>,
) -> Result<Vec<PersistentVolumeClaim>, String> {
    let mut missing = Vec::new();
    for claim in claims_for(spec, ordinal) {
        let name = claim.metadata.name.clone().unwrap_or_default();
        match existing.get(&name) {
            None => missing.push(claim),
            Some(found) if found.metadata.deletion_timestamp.is_some() => {
                return Err(format!("pvc {name} is being deleted"));
            }
            Some(_) => {}
        }
    }
    Ok(missing)
}

// --- claim owners (persistentVolumeClaimRetentionPolicy) -----------------------------------

/// A reference to this kind and name, whatever its UID (`matchesRef`).
fn refers_to(r: &OwnerReference, api_version: &str, kind: &str, name: &str) -> bool {
    r.api_version == api_version && r.kind == kind && r.name == name
}

fn pod_ref(pod: &Pod) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn refs(claim: &PersistentVolumeClaim) -> &[OwnerReference] {
    claim
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default()
}

fn has_ref(claim: &PersistentVolumeClaim, uid: &str) -> bool {
    refs(claim).iter().any(|r| r.uid == uid)
}

/// A reference to this kind and name with another UID: one to an object since deleted and
/// made again (`hasStaleOwnerRef`).
fn has_stale_ref(
    claim: &PersistentVolumeClaim,
    (api_version, kind, name, uid): (&str, &str, &str, &str),
) -> bool {
    refs(claim)
        .iter()
        .find(|r| refers_to(r, api_version, kind, name))
        .is_some_and(|r| r.uid != uid)
}

fn set_identity<'s>(spec: &'s Spec<'_>) -> (&'s str, &'s str, &'s str, &'s str) {
    ("apps/v1", "StatefulSet", spec.name, spec.uid)
}

fn pod_identity(pod: &Pod) -> (&str, &str, &str, &str) {
    (
        "v1",
        "Pod",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default(),
    )
}

/// Another controller owns the claim, so the retention policy leaves it alone
/// (`hasUnexpectedController`).
pub fn has_unexpected_controller(
    spec: &Spec<'_>,
    claim: &PersistentVolumeClaim,
    pod: &Pod,
) -> bool {
    if spec.when_scaled == ClaimPolicy::Retain && spec.when_deleted == ClaimPolicy::Retain {
        return false;
    }
    let (set_v, set_k, set_n, set_u) = set_identity(spec);
    let (pod_v, pod_k, pod_n, pod_u) = pod_identity(pod);
    refs(claim).iter().any(|r| {
        if refers_to(r, set_v, set_k, set_n) {
            r.uid != set_u
        } else if refers_to(r, pod_v, pod_k, pod_n) {
            r.uid != pod_u
        } else {
            r.controller == Some(true)
        }
    })
}

fn pod_scaled_down(spec: &Spec<'_>, pod: &Pod) -> bool {
    !ordinal(pod).is_some_and(|o| spec.in_range(o))
}

/// Whether the claim's owners are what the retention policy asks for this Pod
/// (`isClaimOwnerUpToDate`): the StatefulSet with `whenDeleted: Delete` while the Pod is a
/// replica, the Pod with `whenScaled: Delete` once it is condemned.
pub fn claim_owners_up_to_date(spec: &Spec<'_>, claim: &PersistentVolumeClaim, pod: &Pod) -> bool {
    if has_stale_ref(claim, set_identity(spec)) || has_stale_ref(claim, pod_identity(pod)) {
        // Being cleaned up by the garbage collector.
        return true;
    }
    let (on_set, on_pod) = (has_ref(claim, spec.uid), has_ref(claim, pod_uid(pod)));
    if has_unexpected_controller(spec, claim, pod) {
        return !(on_set || on_pod);
    }
    let uncontrolled = refs(claim)
        .iter()
        .any(|r| (r.uid == spec.uid || r.uid == pod_uid(pod)) && r.controller != Some(true));
    if uncontrolled {
        return false;
    }
    let (want_set, want_pod) = wanted_owners(spec, pod);
    on_set == want_set && on_pod == want_pod
}

fn pod_uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

/// (owned by the set, owned by the Pod) as the policy wants them.
fn wanted_owners(spec: &Spec<'_>, pod: &Pod) -> (bool, bool) {
    let scaled_down = pod_scaled_down(spec, pod);
    match (spec.when_scaled, spec.when_deleted) {
        (ClaimPolicy::Retain, ClaimPolicy::Retain) => (false, false),
        (ClaimPolicy::Retain, ClaimPolicy::Delete) => (true, false),
        (ClaimPolicy::Delete, ClaimPolicy::Retain) => (false, scaled_down),
        (ClaimPolicy::Delete, ClaimPolicy::Delete) => (!scaled_down, scaled_down),
    }
}

/// The claim with its owner references as the policy wants them
/// (`updateClaimOwnerRefForSetAndPod`): references to the set and the Pod taken out, and
/// the wanted ones added as controller references, unless another controller owns it.
pub fn claim_with_policy_owners(
    spec: &Spec<'_>,
    claim: &PersistentVolumeClaim,
    pod: &Pod,
) -> PersistentVolumeClaim {
    let unexpected = has_unexpected_controller(spec, claim, pod);
    let (set_v, set_k, set_n, _) = set_identity(spec);
    let (pod_v, pod_k, pod_n, _) = pod_identity(pod);
    let mut owners: Vec<OwnerReference> = refs(claim)
        .iter()
        .filter(|r| !refers_to(r, set_v, set_k, set_n) && !refers_to(r, pod_v, pod_k, pod_n))
        .cloned()
        .collect();
    if !unexpected {
        let (want_set, want_pod) = wanted_owners(spec, pod);
        let mut add = |reference: OwnerReference| {
            if !owners.iter().any(|r| r.uid == reference.uid) {
                owners.push(reference);
            }
        };
        if want_pod {
            add(pod_ref(pod));
        }
        if want_set {
            add(spec.controller_ref());
        }
    }
    let mut updated = claim.clone();
    updated.metadata.owner_references = Some(owners);
    updated
}

/// The existing claims of `pod` whose owners the policy would change, as they should be.
pub fn claims_out_of_policy(
    spec: &Spec<'_>,
    pod: &Pod,
    existing: &BTreeMap<String, PersistentVolumeClaim>,
) -> Vec<PersistentVolumeClaim> {
    let Some(ordinal) = ordinal(pod) else {
        return Vec::new();
    };
    claims_for(spec, ordinal)
        .iter()
        .filter_map(|c| existing.get(c.metadata.name.as_deref().unwrap_or_default()))
        .filter(|c| !claim_owners_up_to_date(spec, c, pod))
        .map(|c| claim_with_policy_owners(spec, c, pod))
        .collect()
}

/// A claim of the Pod still names a deleted Pod of the same name: the garbage collector is
/// about to delete it, so the Pod must wait (`PodClaimIsStale`).
fn claim_is_stale(
    spec: &Spec<'_>,
    ordinal: i32,
    existing: &BTreeMap<String, PersistentVolumeClaim>,
) -> bool {
    if spec.when_scaled == ClaimPolicy::Retain {
        return false;
    }
    let name = pod_name(spec.name, ordinal);
    claims_for(spec, ordinal).iter().any(|c| {
        existing
            .get(c.metadata.name.as_deref().unwrap_or_default())
            .is_some_and(|found| has_stale_ref(found, ("v1", "Pod", &name, "")))
    })
}

// --- the plan ------------------------------------------------------------------------------

/// The revisions a reconcile works with, and the templates they restore.
#[derive(Debug, Clone)]
pub struct Revisions<'r> {
    pub current: &'r str,
    pub current_template: &'r PodTemplateSpec,
    pub update: &'r str,
    pub update_template: &'r PodTemplateSpec,
    pub collision_count: i32,
}

/// One write of a reconcile.
#[derive(Debug, Clone, PartialEq)]
pub enum Step<'p> {
    /// A replica that failed or succeeded: deleted, to be made again.
    Replace(&'p Pod),
    /// A missing replica, made (its claims first).
    Create(Box<Pod>),
    /// A Pending replica: its missing claims made, their owners set.
    CreateClaims(&'p Pod),
    /// A replica whose identity, storage or claim owners are wrong: put right.
    Update(&'p Pod),
    /// A condemned Pod's claim owners set as `whenScaled` asks.
    ClaimOwners(&'p Pod),
    /// A Pod past the replicas: deleted.
    Condemn(&'p Pod),
    /// A Pod of an older revision: deleted, to come back at the update revision.
    Roll(&'p Pod),
}

/// What a reconcile does: phases run in order, a phase's steps one after another
/// (`OrderedReady`) or together in slow-start batches (`Parallel`); a failed step ends the
/// reconcile. And the status to report.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan<'p> {
    pub phases: Vec<Vec<Step<'p>>>,
    pub status: StatefulSetStatus,
}

/// A replica slot: the Pod that has its ordinal, or the one to make.
enum Slot<'p> {
    Pod(&'p Pod),
    New(Box<Pod>),
}

impl Slot<'_> {
    fn pod(&self) -> &Pod {
        match self {
            Slot::Pod(p) => p,
            Slot::New(p) => p,
        }
    }
}

/// The replica counts over `pods` (`computeReplicaStatus`).
fn counts(
    status: &mut StatefulSetStatus,
    pods: &[&Pod],
    spec: &Spec<'_>,
    revisions: &Revisions<'_>,
    now: Timestamp,
) {
    let (mut replicas, mut ready, mut available, mut current, mut updated) = (0, 0, 0, 0, 0);
    for pod in pods {
        if is_created(pod) {
            replicas += 1;
        }
        if is_running_and_ready(pod) {
            ready += 1;
            if is_available(pod, spec.min_ready_seconds, now) {
                available += 1;
            }
        }
        if is_created(pod) && !is_terminating(pod) {
            let revision = pod_revision(pod);
            if revision == revisions.current {
                current += 1;
            }
            if revision == revisions.update {
                updated += 1;
            }
        }
    }
    status.replicas = replicas;
    status.ready_replicas = Some(ready);
    status.available_replicas = Some(available);
    status.current_replicas = Some(current);
    status.updated_replicas = Some(updated);
}

/// The reconcile of a StatefulSet whose Pods are `pods` (claimed), claims `claims` (by name)
/// and revisions `revisions` (`updateStatefulSet`).
pub fn plan<'p>(
    spec: &Spec<'_>,
    revisions: &Revisions<'_>,
    pods: &[&'p Pod],
    claims: &BTreeMap<String, PersistentVolumeClaim>,
    now: Timestamp,
) -> Plan<'p> {
    let mut status = StatefulSetStatus {
        observed_generation: spec.set.metadata.generation,
        current_revision: Some(revisions.current.to_owned()),
        update_revision: Some(revisions.update.to_owned()),
        collision_count: Some(revisions.collision_count),
        ..StatefulSetStatus::default()
    };
    if spec.deleting {
        counts(&mut status, pods, spec, revisions, now);
        return Plan {
            phases: Vec::new(),
            status,
        };
    }

    // Replicas by ordinal, the missing ones made from their revision; condemned highest first.
    let mut slots: Vec<Option<&'p Pod>> = vec![None; usize::try_from(spec.replicas).unwrap_or(0)];
    let mut condemned: Vec<&'p Pod> = Vec::new();
    for pod in pods {
        match ordinal(pod) {
            Some(o) if spec.in_range(o) => {
                slots[usize::try_from(o - spec.start).unwrap_or(0)] = Some(pod);
            }
            Some(o) if o >= 0 => condemned.push(pod),
            _ => {}
        }
    }
    condemned.sort_by_key(|p| std::cmp::Reverse(ordinal(p)));
    let current_replicas = spec
        .set
        .status
        .as_ref()
        .and_then(|s| s.current_replicas)
        .unwrap_or(0);
    let replicas: Vec<Slot<'p>> = slots
        .into_iter()
        .zip(spec.start..)
        .map(|(pod, o)| match pod {
            Some(pod) => Slot::Pod(pod),
            None => {
                let at_current = match &spec.strategy {
                    Strategy::RollingUpdate { set: false, .. } => o < spec.start + current_replicas,
                    Strategy::RollingUpdate {
                        set: true,
                        partition,
                        ..
                    } => o < spec.start + partition,
                    Strategy::OnDelete => false,
                };
                Slot::New(Box::new(if at_current {
                    new_pod(spec, revisions.current_template, o, revisions.current)
                } else {
                    new_pod(spec, revisions.update_template, o, revisions.update)
                }))
            }
        })
        .collect();
    let existing: Vec<&Pod> = replicas
        .iter()
        .filter_map(|s| match s {
            Slot::Pod(p) => Some(*p),
            Slot::New(_) => None,
        })
        .chain(condemned.iter().copied())
        .collect();
    counts(&mut status, &existing, spec, revisions, now);

    let min_ready = spec.min_ready_seconds;
    let first_unhealthy = replicas
        .iter()
        .map(Slot::pod)
        .chain(condemned.iter().rev().copied())
        .find(|p| is_unavailable(p, min_ready, now))
        .and_then(|p| p.metadata.name.clone());
    let monotonic = !spec.parallel;
    let mut phases = Vec::new();
    let plan = |phases: Vec<Vec<Step<'p>>>, status| Plan { phases, status };

    // The replicas, lowest ordinal first.
    let mut steps = Vec::new();
    for slot in &replicas {
        let pod = match slot {
            Slot::New(pod) => {
                let o = ordinal(pod).unwrap_or(0);
                if claim_is_stale(spec, o, claims) {
                    if monotonic {
                        phases.push(steps);
                        return plan(phases, status);
                    }
                    continue;
                }
                steps.push(Step::Create(pod.clone()));
                if monotonic {
                    phases.push(steps);
                    return plan(phases, status);
                }
                continue;
            }
            Slot::Pod(pod) => *pod,
        };
        if matches!(phase(pod), "Failed" | "Succeeded") {
            if !is_terminating(pod) {
                steps.push(Step::Replace(pod));
            }
            if monotonic {
                phases.push(steps);
                return plan(phases, status);
            }
            continue;
        }
        let o = ordinal(pod).unwrap_or(0);
        let claims_missing = missing_claims(spec, o, claims).map_or(true, |m| !m.is_empty());
        let policy_met = claims_out_of_policy(spec, pod, claims).is_empty();
        if phase(pod) == "Pending" && (claims_missing || !policy_met) {
            steps.push(Step::CreateClaims(pod));
        }
        if monotonic
            && (is_terminating(pod)
                || !is_running_and_ready(pod)
                || !is_available(pod, min_ready, now))
        {
            phases.push(steps);
            return plan(phases, status);
        }
        if !(identity_matches(spec, pod) && storage_matches(spec, pod) && policy_met) {
            steps.push(Step::Update(pod));
        }
    }
    phases.push(steps);

    // The condemned Pods' claims, then the Pods, highest ordinal first.
    phases.push(
        condemned
            .iter()
            .filter(|p| !claims_out_of_policy(spec, p, claims).is_empty())
            .map(|p| Step::ClaimOwners(p))
            .collect(),
    );
    let mut steps = Vec::new();
    for pod in &condemned {
        if is_terminating(pod) {
            if monotonic {
                phases.push(steps);
                return plan(phases, status);
            }
            continue;
        }
        let first = first_unhealthy.as_deref() == pod.metadata.name.as_deref();
        if monotonic && !first && (!is_running_and_ready(pod) || !is_available(pod, min_ready, now))
        {
            phases.push(steps);
            return plan(phases, status);
        }
        steps.push(Step::Condemn(pod));
        if monotonic {
            phases.push(steps);
            return plan(phases, status);
        }
    }
    phases.push(steps);

    let Strategy::RollingUpdate {
        partition,
        max_unavailable,
        ..
    } = &spec.strategy
    else {
        return plan(phases, status);
    };
    let update_min = usize::try_from(*partition).unwrap_or(0);
    let outdated = |slot: &Slot<'p>| match slot {
        Slot::Pod(p) if pod_revision(p) != revisions.update && !is_terminating(p) => Some(*p),
        _ => None,
    };
    let mut steps = Vec::new();
    match max_unavailable {
        None => {
            for slot in replicas.iter().skip(update_min).rev() {
                if let Some(pod) = outdated(slot) {
                    steps.push(Step::Roll(pod));
                    break;
                }
                if is_unavailable(slot.pod(), min_ready, now) {
                    break;
                }
            }
        }
        Some(max) => {
            let unavailable = replicas
                .iter()
                .filter(|s| is_unavailable(s.pod(), min_ready, now))
                .count();
            let room = usize::try_from(*max)
                .unwrap_or(1)
                .saturating_sub(unavailable);
            steps.extend(
                replicas
                    .iter()
                    .skip(update_min)
                    .rev()
                    .filter_map(outdated)
                    .take(room)
                    .map(Step::Roll),
            );
        }
    }
    let rolled = i32::try_from(steps.len()).unwrap_or(0);
    status.current_replicas = status.current_replicas.map(|c| c - rolled);
    phases.push(steps);
    plan(phases, status)
}

/// The status to write (`completeRollingUpdate`): once every replica is updated and ready,
/// the update revision becomes the current one.
pub fn completed(spec: &Spec<'_>, mut status: StatefulSetStatus) -> StatefulSetStatus {
    let all = |v: Option<i32>| v.unwrap_or(0) == spec.replicas;
    if matches!(spec.strategy, Strategy::RollingUpdate { .. })
        && all(status.updated_replicas)
        && all(status.ready_replicas)
        && status.replicas == spec.replicas
    {
        status.current_replicas = status.updated_replicas;
        status.current_revision = status.update_revision.clone();
    }
    status
}

/// Whether `new` differs from the StatefulSet's status where kube-controller-manager looks
/// (`inconsistentStatus`).
pub fn status_changed(set: &StatefulSet, new: &StatefulSetStatus) -> bool {
    let old = set.status.clone().unwrap_or_default();
    let n = |v: Option<i32>| v.unwrap_or(0);
    let s = |v: &Option<String>| v.clone().unwrap_or_default();
    new.observed_generation.unwrap_or(0) > old.observed_generation.unwrap_or(0)
        || new.replicas != old.replicas
        || n(new.current_replicas) != n(old.current_replicas)
        || n(new.ready_replicas) != n(old.ready_replicas)
        || n(new.updated_replicas) != n(old.updated_replicas)
        || s(&new.current_revision) != s(&old.current_revision)
        || n(new.available_replicas) != n(old.available_replicas)
        || s(&new.update_revision) != s(&old.update_revision)
}

/// When to look again so that `availableReplicas` catches up with Pods ready but not yet
/// for `minReadySeconds` (`syncStatefulSet`'s requeue).
pub fn recheck_after(
    spec: &Spec<'_>,
    pods: &[&Pod],
    status: &StatefulSetStatus,
    now: Timestamp,
) -> Option<std::time::Duration> {
    if spec.min_ready_seconds <= 0 || status.ready_replicas == status.available_replicas {
        return None;
    }
    let min_ready_ms = spec.min_ready_seconds * 1000;
    pods.iter()
        .filter_map(|p| {
            let since = crate::replicaset::ready_since(p)??;
            let ready_for = now.as_millisecond() - since.as_millisecond();
            (ready_for <= min_ready_ms).then(|| {
                std::time::Duration::from_millis((min_ready_ms - ready_for + 1).unsigned_abs())
            })
        })
        .min()
        .or(Some(std::time::Duration::from_secs(
            spec.min_ready_seconds.unsigned_abs(),
        )))
}

#[cfg(test)]
mod tests;
