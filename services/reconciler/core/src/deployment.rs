//! The Deployment controller's decisions, as kube-controller-manager's
//! `pkg/controller/deployment` makes them (sync.go, rolling.go, recreate.go, progress.go and
//! `util/deployment_util.go`).
//!
//! ```text
//!  ReplicaSets (owned ∪ selected) ─► claim ─► owned ─► new (template equal, hash ignored) + old
//!                                      ├─► adopt orphans the selector matches
//!                                      └─► release owned ones it no longer matches
//!  paused or replicas changed (desired-replicas annotation) ─► scale: the one active RS, or
//!                                                              proportionally over all of them
//!  RollingUpdate ─► create new RS │ scale new up to replicas + maxSurge │ scale old down to
//!                   keep replicas - maxUnavailable available (unhealthy ones first)
//!  Recreate      ─► old RSs to 0 ─► wait until no old Pod runs ─► create/scale new RS
//!  complete ─► delete old RSs with 0 replicas past revisionHistoryLimit
//!  status: sums over the RSs ─► Available (min availability), Progressing (progress deadline)
//! ```
//!
//! Every function here takes the objects it decides on (and `now`); the service crate reads
//! the cache, calls these, and performs the writes.

use std::{cmp::Ordering, collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet, ReplicaSetSpec},
        core::v1::{Pod, PodTemplateSpec},
    },
    apimachinery::pkg::{
        apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference, Time},
        util::intstr::IntOrString,
    },
    jiff::Timestamp,
};

use crate::selector::{Selector, SelectorError};

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
/// `progressDeadlineSeconds` of `MaxInt32` means no deadline (the API's convention).
const NO_DEADLINE: i32 = i32::MAX;

/// How Pods are replaced, with `maxSurge`/`maxUnavailable` resolved against `replicas`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    Recreate,
    RollingUpdate {
        max_surge: i32,
        max_unavailable: i32,
    },
}

/// A Deployment as the controller needs it.
#[derive(Debug, Clone)]
pub struct Spec<'a> {
    pub d: &'a Deployment,
    pub uid: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    pub replicas: i32,
    pub selector: Selector,
    pub strategy: Strategy,
    pub min_ready_seconds: i32,
    pub revision_history_limit: Option<i32>,
    pub progress_deadline_seconds: Option<i32>,
    pub paused: bool,
    pub deleting: bool,
    pub template: PodTemplateSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("metadata.uid: empty")]
    NoUid,
    #[error("metadata.name: empty")]
    NoName,
    #[error("spec.{0}")]
    Selector(#[from] SelectorError),
    #[error("spec.selector: empty, it would select every ReplicaSet of the namespace")]
    EmptySelector,
    #[error("spec.replicas: negative ({0})")]
    NegativeReplicas(i32),
    #[error(
        "spec.strategy.rollingUpdate.{field}: {value:?} is neither an integer nor a percentage"
    )]
    IntOrPercent { field: &'static str, value: String },
    #[error("spec.strategy.type: unknown strategy {0:?} (expected RollingUpdate or Recreate)")]
    Strategy(String),
}

/// `intstr.GetScaledValueFromIntOrPercent`: a percentage of `total`, rounded up or down.
pub fn scaled_value(
    value: &IntOrString,
    total: i32,
    round_up: bool,
    field: &'static str,
) -> Result<i32, SpecError> {
    match value {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(s) => {
            let bad = || SpecError::IntOrPercent {
                field,
                value: s.clone(),
            };
            let percent: i64 = s
                .strip_suffix('%')
                .ok_or_else(bad)?
                .parse()
                .map_err(|_| bad())?;
            let product = percent * i64::from(total);
            let scaled = if round_up {
                product.div_euclid(100) + i64::from(product.rem_euclid(100) != 0)
            } else {
                product.div_euclid(100)
            };
            i32::try_from(scaled).map_err(|_| bad())
        }
    }
}

/// `deploymentutil.ResolveFenceposts`: surge rounds up, unavailable rounds down, and both
/// zero would deadlock a rollout, so unavailable becomes 1.
pub fn resolve_fenceposts(
    max_surge: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    desired: i32,
) -> Result<(i32, i32), SpecError> {
    let default = IntOrString::String("25%".into());
    let surge = scaled_value(max_surge.unwrap_or(&default), desired, true, "maxSurge")?;
    let unavailable = scaled_value(
        max_unavailable.unwrap_or(&default),
        desired,
        false,
        "maxUnavailable",
    )?;
    if surge == 0 && unavailable == 0 {
        return Ok((0, 1));
    }
    Ok((surge, unavailable))
}

impl<'a> Spec<'a> {
    pub fn new(d: &'a Deployment) -> Result<Self, SpecError> {
        let uid = d
            .metadata
            .uid
            .as_deref()
            .filter(|u| !u.is_empty())
            .ok_or(SpecError::NoUid)?;
        let name = d
            .metadata
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or(SpecError::NoName)?;
        let spec = d.spec.clone().unwrap_or_default();
        if spec
            .selector
            .match_labels
            .as_ref()
            .is_none_or(BTreeMap::is_empty)
            && spec
                .selector
                .match_expressions
                .as_ref()
                .is_none_or(Vec::is_empty)
        {
            return Err(SpecError::EmptySelector);
        }
        let replicas = spec.replicas.unwrap_or(1);
        if replicas < 0 {
            return Err(SpecError::NegativeReplicas(replicas));
        }
        let strategy_spec = spec.strategy.unwrap_or_default();
        let strategy = match strategy_spec.type_.as_deref() {
            Some("Recreate") => Strategy::Recreate,
            None | Some("RollingUpdate") => {
                let rolling = strategy_spec.rolling_update.unwrap_or_default();
                let (max_surge, max_unavailable) = resolve_fenceposts(
                    rolling.max_surge.as_ref(),
                    rolling.max_unavailable.as_ref(),
                    replicas,
                )?;
                Strategy::RollingUpdate {
                    max_surge,
                    max_unavailable,
                }
            }
            Some(other) => return Err(SpecError::Strategy(other.to_owned())),
        };
        Ok(Self {
            d,
            uid,
            name,
            namespace: d.metadata.namespace.as_deref().unwrap_or_default(),
            replicas,
            selector: Selector::new(&spec.selector)?,
            strategy,
            min_ready_seconds: spec.min_ready_seconds.unwrap_or(0),
            revision_history_limit: spec.revision_history_limit,
            progress_deadline_seconds: spec.progress_deadline_seconds.filter(|s| *s != NO_DEADLINE),
            paused: spec.paused.unwrap_or(false),
            deleting: d.metadata.deletion_timestamp.is_some(),
            template: spec.template,
        })
    }

    /// `deploymentutil.MaxSurge`.
    pub fn max_surge(&self) -> i32 {
        match self.strategy {
            Strategy::RollingUpdate { max_surge, .. } => max_surge,
            Strategy::Recreate => 0,
        }
    }

    /// `deploymentutil.MaxUnavailable`: never more than `replicas`.
    pub fn max_unavailable(&self) -> i32 {
        match self.strategy {
            Strategy::RollingUpdate {
                max_unavailable, ..
            } if self.replicas > 0 => max_unavailable.min(self.replicas),
            _ => 0,
        }
    }

    pub fn has_progress_deadline(&self) -> bool {
        self.progress_deadline_seconds.is_some()
    }

    fn status(&self) -> DeploymentStatus {
        self.d.status.clone().unwrap_or_default()
    }

    /// The controller reference each of the Deployment's ReplicaSets carries.
    pub fn controller_ref(&self) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: self.name.to_owned(),
            uid: self.uid.to_owned(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }
}

// --- small accessors ----------------------------------------------------------------------

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

fn status_of(rs: &ReplicaSet) -> (i32, i32, i32) {
    rs.status.as_ref().map_or((0, 0, 0), |s| {
        (
            s.replicas,
            s.ready_replicas.unwrap_or(0),
            s.available_replicas.unwrap_or(0),
        )
    })
}

fn name(rs: &ReplicaSet) -> &str {
    rs.metadata.name.as_deref().unwrap_or_default()
}

fn annotation<'r>(meta: &'r ObjectMeta, key: &str) -> Option<&'r str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

fn int_annotation(rs: &ReplicaSet, key: &str) -> Option<i32> {
    annotation(&rs.metadata, key)?.parse().ok()
}

/// The revision annotation of a ReplicaSet; 0 when absent or malformed.
pub fn revision(rs: &ReplicaSet) -> i64 {
    annotation(&rs.metadata, REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

pub fn max_revision(rss: &[&ReplicaSet]) -> i64 {
    rss.iter().map(|rs| revision(rs)).max().unwrap_or(0)
}

/// `controller.ReplicaSetsByCreationTimestamp`: older first, then by name.
fn by_creation(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    let created = |rs: &ReplicaSet| rs.metadata.creation_timestamp.as_ref().map(|t| t.0);
    created(a)
        .cmp(&created(b))
        .then_with(|| name(a).cmp(name(b)))
}

fn sum(rss: &[&ReplicaSet], f: impl Fn(&ReplicaSet) -> i32) -> i32 {
    rss.iter().map(|rs| f(rs)).sum()
}

// --- hashing and templates ----------------------------------------------------------------

/// FNV-1a, 32 bits, as Go's `hash/fnv` that kube-controller-manager uses.
fn fnv32a(bytes: &[u8], mut hash: u32) -> u32 {
    for byte in bytes {
        hash ^= u32::from(*byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// `rand.SafeEncodeString`: no vowels and no look-alike characters, so no words are spelled.
fn safe_encode(text: &str) -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    text.bytes()
        .map(|b| char::from(ALPHANUMS[usize::from(b) % ALPHANUMS.len()]))
        .collect()
}

/// The `pod-template-hash` (`controller.ComputeHash`): FNV-32a of the template, then of the
/// collision count (little-endian) if any, printed in decimal and safely encoded.
///
/// kube-controller-manager hashes a dump of its Go structs; this hashes the template's JSON,
/// so the values differ from kube-controller-manager's for the same template. That is
/// harmless: the hash only needs to be stable here and unique per template, and the new
/// ReplicaSet is found by comparing templates, never by the hash.
pub fn pod_template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    const OFFSET_BASIS: u32 = 0x811c_9dc5;
    // Serialising a k8s-openapi value to JSON cannot fail.
    let json = serde_json::to_vec(template).unwrap_or_default();
    let mut hash = fnv32a(&json, OFFSET_BASIS);
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

fn template_of(rs: &ReplicaSet) -> PodTemplateSpec {
    rs.spec
        .as_ref()
        .and_then(|s| s.template.clone())
        .unwrap_or_default()
}

// --- claiming -----------------------------------------------------------------------------

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

fn active<'r>(rss: &[&'r ReplicaSet]) -> Vec<&'r ReplicaSet> {
    rss.iter().copied().filter(|rs| replicas(rs) > 0).collect()
}

// --- ReplicaSet annotations and the new ReplicaSet ----------------------------------------

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
fn set_new_rs_annotations(
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

fn set_replicas_annotations(rs: &mut ReplicaSet, desired: i32, max: i32) -> bool {
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

/// The revision the new ReplicaSet gets: one more than any old one's.
pub fn new_revision(old: &[&ReplicaSet]) -> i64 {
    max_revision(old) + 1
}

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

// --- scaling (sync.go) --------------------------------------------------------------------

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
            let share = if to_add == 0 { 0 } else { fraction(spec, rs) };
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

// --- RollingUpdate (rolling.go) -------------------------------------------------------------

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

// --- Recreate (recreate.go) ---------------------------------------------------------------

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

// --- history (cleanupDeployment) ------------------------------------------------------------

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

// --- status and conditions (progress.go) ----------------------------------------------------

fn condition(
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

fn remove_condition(status: &mut DeploymentStatus, type_: &str) {
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
        terminating_replicas: current.terminating_replicas,
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

/// Whether `new` differs from `old` (unset counts as zero), so that a write is needed.
pub fn status_changed(old: &DeploymentStatus, new: &DeploymentStatus) -> bool {
    let z = |v: Option<i32>| v.unwrap_or(0);
    z(old.replicas) != z(new.replicas)
        || z(old.updated_replicas) != z(new.updated_replicas)
        || z(old.ready_replicas) != z(new.ready_replicas)
        || z(old.available_replicas) != z(new.available_replicas)
        || z(old.unavailable_replicas) != z(new.unavailable_replicas)
        || old.observed_generation != new.observed_generation
        || old.collision_count != new.collision_count
        || old.conditions.clone().unwrap_or_default() != new.conditions.clone().unwrap_or_default()
}

/// `now` to the second, as the apiserver stores condition times: a condition set twice in
/// one second compares equal to what was written.
pub fn whole_seconds(now: Timestamp) -> Timestamp {
    Timestamp::from_second(now.as_second()).unwrap_or(now)
}

#[cfg(test)]
mod tests;
