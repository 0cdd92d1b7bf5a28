//! The DaemonSet controller's decisions, as kube-controller-manager's `pkg/controller/daemon`
//! makes them.
//!
//! ```text
//!  Nodes ─► fit (nodeName, nodeSelector, required node affinity, taints against the
//!           template's tolerations and the ones every DaemonSet Pod gets)
//!  Pods (claimed) ─► by target Node (spec.nodeName, else the affinity's metadata.name)
//!  manage: a Node that should run one and has none ─► create, pinned by node affinity
//!          failed Pods ─► delete (with a per-Node backoff), succeeded ─► delete
//!          more than one (no surge) ─► delete all but the oldest
//!          a Node that should not keep one ─► delete
//!  nothing to manage ─► RollingUpdate: maxUnavailable old Pods deleted (no surge), or new
//!          Pods made beside old ones up to maxSurge and the old ones deleted once the new
//!          ones are available
//!  status ─► desired, current, misscheduled, ready, updated, available, unavailable
//! ```

use std::{
    borrow::Borrow,
    cmp::Ordering,
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use k8s_openapi::{
    api::{
        apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus},
        core::v1::{
            Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
            PodSpec, PodTemplateSpec, Taint, Toleration,
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
pub use switchyard_selector::placement;
use switchyard_selector::placement::{Fit, Placement};

use crate::{
    claim::{self, Claim},
    deployment::{pod_template_hash, scaled_value},
    history,
    replicaset::{available_in, is_available, is_ready, pod_from},
    selector::{Selector, SelectorError},
};

/// The label that names a Pod's (and a revision's) template hash.
pub const HASH_LABEL: &str = "controller-revision-hash";
/// The label of the template generation, from before revisions (still honoured).
pub const TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";
/// The annotation a DaemonSet carried its template generation in.
pub const TEMPLATE_GENERATION_ANNOTATION: &str = "deprecated.daemonset.template.generation";
/// The most Pods created, and the most deleted, by one reconcile (`BurstReplicas`).
pub const BURST_REPLICAS: usize = 250;
/// `revisionHistoryLimit` when unset.
pub const DEFAULT_REVISION_HISTORY_LIMIT: i32 = 10;
/// kube-controller-manager's Event reasons.
pub const SELECTING_ALL: &str = "SelectingAll";
pub const FAILED_DAEMON_POD: &str = "FailedDaemonPod";
pub const SUCCEEDED_DAEMON_POD: &str = "SucceededDaemonPod";

/// How its Pods are replaced when the template changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Strategy {
    /// Only when a Pod is deleted by someone else.
    OnDelete,
    RollingUpdate {
        max_unavailable: IntOrString,
        max_surge: Option<IntOrString>,
    },
}

/// A DaemonSet as the controller needs it.
#[derive(Debug, Clone)]
pub struct Spec<'a> {
    pub ds: &'a DaemonSet,
    pub name: &'a str,
    pub namespace: &'a str,
    pub uid: &'a str,
    pub selector: Selector,
    pub template: &'a PodTemplateSpec,
    /// Where its Pods go, with the tolerations every DaemonSet Pod gets.
    pub placement: Placement,
    pub min_ready_seconds: i64,
    pub strategy: Strategy,
    pub revision_history_limit: i32,
    /// The deprecated template generation annotation, when it parses.
    pub template_generation: Option<i64>,
    pub deleting: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("metadata.uid: empty")]
    NoUid,
    #[error("spec.{0}")]
    Selector(#[from] SelectorError),
    /// kube-controller-manager records [`SELECTING_ALL`] and does nothing.
    #[error("spec.selector: empty, it would select every Pod of the namespace")]
    SelectingAll,
    #[error("spec.template: missing")]
    NoTemplate,
}

impl<'a> Spec<'a> {
    pub fn new(ds: &'a DaemonSet) -> Result<Self, SpecError> {
        let spec = ds.spec.as_ref().ok_or(SpecError::NoTemplate)?;
        let selector = Selector::new(&spec.selector)?;
        if selector.is_empty() {
            return Err(SpecError::SelectingAll);
        }
        let template = &spec.template;
        let placement =
            Placement::from_pod_spec(&serde_json::to_value(&template.spec).unwrap_or(Value::Null))
                .for_daemon();
        let strategy = spec.update_strategy.as_ref();
        let strategy = if strategy.and_then(|s| s.type_.as_deref()) == Some("OnDelete") {
            Strategy::OnDelete
        } else {
            let rolling = strategy.and_then(|s| s.rolling_update.as_ref());
            Strategy::RollingUpdate {
                max_unavailable: rolling
                    .and_then(|r| r.max_unavailable.clone())
                    .unwrap_or(IntOrString::Int(1)),
                max_surge: rolling.and_then(|r| r.max_surge.clone()),
            }
        };
        Ok(Self {
            ds,
            name: ds.metadata.name.as_deref().unwrap_or_default(),
            namespace: ds.metadata.namespace.as_deref().unwrap_or_default(),
            uid: ds
                .metadata
                .uid
                .as_deref()
                .filter(|u| !u.is_empty())
                .ok_or(SpecError::NoUid)?,
            selector,
            template,
            placement,
            min_ready_seconds: spec.min_ready_seconds.unwrap_or(0).into(),
            strategy,
            revision_history_limit: spec
                .revision_history_limit
                .unwrap_or(DEFAULT_REVISION_HISTORY_LIMIT),
            template_generation: ds
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(TEMPLATE_GENERATION_ANNOTATION))
                .and_then(|g| g.parse().ok()),
            deleting: ds.metadata.deletion_timestamp.is_some(),
        })
    }

    /// The controller reference of its Pods and revisions.
    pub fn controller_ref(&self) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            name: self.name.to_owned(),
            uid: self.uid.to_owned(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    /// `NodeShouldRunDaemonPod`.
    pub fn fit(&self, node: &placement::Node) -> Fit {
        self.placement.daemon_fit(node)
    }

    /// `SurgeCount`: 0 without surge; a percentage of `desired` rounded up.
    pub fn max_surge(&self, desired: i32) -> Result<i32, String> {
        match &self.strategy {
            Strategy::RollingUpdate {
                max_surge: Some(surge),
                ..
            } => scaled_value(surge, desired, true, "maxSurge").map_err(|e| e.to_string()),
            _ => Ok(0),
        }
    }

    /// `UnavailableCount`: a percentage of `desired` rounded up.
    pub fn max_unavailable(&self, desired: i32) -> Result<i32, String> {
        match &self.strategy {
            Strategy::RollingUpdate {
                max_unavailable, ..
            } => scaled_value(max_unavailable, desired, true, "maxUnavailable")
                .map_err(|e| e.to_string()),
            Strategy::OnDelete => Ok(0),
        }
    }

    /// `AllowsSurge`.
    pub fn allows_surge(&self) -> bool {
        self.max_surge(1).is_ok_and(|n| n > 0)
    }

    /// `IsPodUpdated`: the Pod carries the revision's hash, or the template generation.
    pub fn is_updated(&self, pod: &Pod, hash: &str) -> bool {
        let label = |key: &str| {
            pod.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(key))
                .map(String::as_str)
        };
        let generation = self
            .template_generation
            .is_some_and(|g| label(TEMPLATE_GENERATION_LABEL) == Some(g.to_string().as_str()));
        (!hash.is_empty() && label(HASH_LABEL) == Some(hash)) || generation
    }
}

/// A Node as placement sees it, from its metadata and taints.
pub fn placement_node(meta: &ObjectMeta, taints: &[Taint]) -> placement::Node {
    placement::Node {
        name: meta.name.clone().unwrap_or_default(),
        labels: meta.labels.clone().unwrap_or_default(),
        taints: taints
            .iter()
            .map(|t| placement::Taint {
                key: t.key.clone(),
                value: t.value.clone().unwrap_or_default(),
                effect: t.effect.clone(),
            })
            .collect(),
    }
}

// --- claiming ------------------------------------------------------------------------------

/// Which Pods the DaemonSet keeps, adopts and releases: those its selector matches.
pub fn claim<'p>(spec: &Spec<'_>, pods: &'p [impl Borrow<Pod>]) -> Claim<'p> {
    claim::claim(spec.namespace, spec.uid, spec.deleting, pods, |pod| {
        spec.selector.matches(pod.metadata.labels.as_ref())
    })
}

/// The Node a DaemonSet Pod is for (`GetTargetNodeName`): its `nodeName`, or before it is
/// scheduled the single `metadata.name` its required node affinity names.
pub fn target_node(pod: &Pod) -> Option<&str> {
    let spec = pod.spec.as_ref()?;
    if let Some(name) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        return Some(name);
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .find(|r| r.key == "metadata.name" && r.operator == "In")
        .and_then(|r| match r.values.as_deref() {
            Some([one]) => Some(one.as_str()),
            _ => None,
        })
}

fn is_scheduled(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

fn deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

/// Scheduled first, then oldest, then by name (`podByCreationTimestampAndPhase`).
pub fn oldest_first(a: &Pod, b: &Pod) -> Ordering {
    let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    is_scheduled(b)
        .cmp(&is_scheduled(a))
        .then_with(|| created(a).cmp(&created(b)))
        .then_with(|| name(a).cmp(name(b)))
}

/// The owned Pods by the Node they are for (`getNodesToDaemonPods`), each list oldest first;
/// finished Pods being deleted are left out unless `with_deleted_finished`.
pub fn by_node<'p>(
    owned: &[&'p Pod],
    with_deleted_finished: bool,
) -> BTreeMap<String, Vec<&'p Pod>> {
    let mut nodes: BTreeMap<String, Vec<&'p Pod>> = BTreeMap::new();
    for pod in owned {
        if !with_deleted_finished && is_terminal(pod) && deleting(pod) {
            continue;
        }
        if let Some(node) = target_node(pod) {
            nodes.entry(node.to_owned()).or_default().push(pod);
        }
    }
    for pods in nodes.values_mut() {
        pods.sort_by(|a, b| oldest_first(a, b));
    }
    nodes
}

// --- the Pods it makes ---------------------------------------------------------------------

/// A new Pod of the DaemonSet for `node` (`CreatePodTemplate`, then
/// `ReplaceDaemonSetPodNodeNameNodeAffinity`): the template with the DaemonSet tolerations,
/// the template generation and revision hash labels, and a required node affinity on the
/// Node's name alone, for the scheduler to place it.
pub fn new_pod(spec: &Spec<'_>, node: &str, hash: &str) -> Pod {
    let mut template = spec.template.clone();
    let pod_spec = template.spec.get_or_insert_with(PodSpec::default);
    add_daemon_tolerations(pod_spec);
    pin_to_node(pod_spec, node);
    let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    if let Some(generation) = spec.template_generation {
        labels.insert(TEMPLATE_GENERATION_LABEL.into(), generation.to_string());
    }
    if !hash.is_empty() {
        labels.insert(HASH_LABEL.into(), hash.to_owned());
    }
    pod_from(template, spec.name, spec.namespace, spec.controller_ref())
}

/// `AddOrUpdateDaemonPodTolerations` on a Pod spec.
pub fn add_daemon_tolerations(pod_spec: &mut PodSpec) {
    let tolerations = pod_spec.tolerations.get_or_insert_with(Vec::new);
    for wanted in placement::daemon_tolerations(pod_spec.host_network.unwrap_or(false)) {
        let toleration = Toleration {
            key: Some(wanted.key),
            operator: Some(wanted.operator),
            effect: Some(wanted.effect),
            value: None,
            toleration_seconds: None,
        };
        let text = |v: &Option<String>| v.clone().unwrap_or_default();
        let same = |t: &Toleration| {
            text(&t.key) == text(&toleration.key)
                && text(&t.operator) == text(&toleration.operator)
                && text(&t.value) == text(&toleration.value)
                && text(&t.effect) == text(&toleration.effect)
        };
        match tolerations.iter_mut().find(|t| same(t)) {
            Some(existing) => *existing = toleration,
            None => tolerations.push(toleration),
        }
    }
}

/// The required node affinity replaced by one term: `metadata.name In [node]`.
fn pin_to_node(pod_spec: &mut PodSpec, node: &str) {
    let term = NodeSelectorTerm {
        match_fields: Some(vec![NodeSelectorRequirement {
            key: "metadata.name".into(),
            operator: "In".into(),
            values: Some(vec![node.to_owned()]),
        }]),
        match_expressions: None,
    };
    let affinity = pod_spec.affinity.get_or_insert_with(Affinity::default);
    let node_affinity = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    node_affinity.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: vec![term],
    });
}

// --- revisions -----------------------------------------------------------------------------

/// The revision data of the DaemonSet as it is now (`getPatch`).
pub fn revision_data(spec: &Spec<'_>) -> Value {
    history::template_patch(Some(spec.template))
}

/// The hash of the DaemonSet's template (`controller.ComputeHash` with its collision count),
/// which names its revision and labels its Pods.
pub fn template_hash(spec: &Spec<'_>) -> String {
    let collisions = spec.ds.status.as_ref().and_then(|s| s.collision_count);
    pod_template_hash(spec.template, collisions)
}

/// A new revision of the DaemonSet (`snapshot`): `<name>-<hash>`, the template's labels and
/// the hash label, the DaemonSet's annotations, its controller reference.
pub fn new_revision(spec: &Spec<'_>, data: &Value, revision: i64) -> ControllerRevision {
    let hash = template_hash(spec);
    let mut labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(HASH_LABEL.into(), hash.clone());
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(format!("{}-{hash}", spec.name)),
            namespace: Some(spec.namespace.to_owned()),
            labels: Some(labels),
            annotations: spec
                .ds
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

/// The DaemonSet's revisions split (`constructHistory`): those holding its template now
/// (`current`, normally one) and the others (`old`).
pub fn split_revisions<'r>(
    revisions: &'r [ControllerRevision],
    data: &Value,
) -> (Vec<&'r ControllerRevision>, Vec<&'r ControllerRevision>) {
    revisions
        .iter()
        .partition(|r| history::same_data(history::data(r), data))
}

/// Of several revisions holding the template, the one kept (`dedupCurHistories`): the
/// highest revision number, the last of equals.
pub fn keep_of<'r>(current: &[&'r ControllerRevision]) -> Option<&'r ControllerRevision> {
    current
        .iter()
        .copied()
        .fold(None, |kept: Option<&ControllerRevision>, r| match kept {
            Some(k) if r.revision < k.revision => Some(k),
            _ => Some(r),
        })
}

/// A revision's hash label.
pub fn revision_hash(revision: &ControllerRevision) -> &str {
    revision
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(HASH_LABEL))
        .map(String::as_str)
        .unwrap_or_default()
}

/// The old revisions to delete (`cleanupHistory`): oldest first, past
/// `revisionHistoryLimit`, never one a Pod still carries the hash of.
pub fn to_clean_up<'r>(
    spec: &Spec<'_>,
    old: &[&'r ControllerRevision],
    pods: &[&Pod],
) -> Vec<&'r ControllerRevision> {
    let Ok(limit) = usize::try_from(spec.revision_history_limit) else {
        return Vec::new();
    };
    let mut to_kill = old.len().saturating_sub(limit);
    if to_kill == 0 {
        return Vec::new();
    }
    let live: std::collections::BTreeSet<&str> = pods
        .iter()
        .filter_map(|p| p.metadata.labels.as_ref()?.get(HASH_LABEL))
        .map(String::as_str)
        .filter(|h| !h.is_empty())
        .collect();
    let mut sorted = old.to_vec();
    sorted.sort_by_key(|r| r.revision);
    let mut doomed = Vec::new();
    for revision in sorted {
        if to_kill == 0 {
            break;
        }
        if live.contains(revision_hash(revision)) {
            continue;
        }
        doomed.push(revision);
        to_kill -= 1;
    }
    doomed
}

// --- managing Pods -------------------------------------------------------------------------

/// `failedPodsBackoff`: a per-Node delay before a failed Pod is deleted again, 1 s doubling
/// to 15 min, forgotten after twice that without a failure. Held by the reconciler that
/// reconciles the DaemonSet (kube-controller-manager keeps it in memory too).
#[derive(Debug, Default)]
pub struct FailedPodBackoff {
    entries: HashMap<String, (Duration, Timestamp)>,
}

const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(15 * 60);

impl FailedPodBackoff {
    /// The key of a Node of a DaemonSet at its observed generation (`failedPodsBackoffKey`).
    pub fn key(spec: &Spec<'_>, node: &str) -> String {
        let generation = spec
            .ds
            .status
            .as_ref()
            .and_then(|s| s.observed_generation)
            .unwrap_or(0);
        format!("{}/{generation}/{node}", spec.uid)
    }

    /// The delay left when `key` is backing off (`IsInBackOffSinceUpdate`).
    pub fn waiting(&self, key: &str, now: Timestamp) -> Option<Duration> {
        let (delay, since) = self.entries.get(key)?;
        let elapsed = elapsed(*since, now);
        (elapsed < *delay).then(|| *delay - elapsed)
    }

    /// Counts a deletion of a failed Pod (`Next`): the next delay doubles.
    pub fn next(&mut self, key: &str, now: Timestamp) {
        let delay = match self.entries.get(key) {
            Some((delay, since)) if elapsed(*since, now) <= 2 * BACKOFF_MAX => {
                (*delay * 2).min(BACKOFF_MAX)
            }
            _ => BACKOFF_INITIAL,
        };
        self.entries.insert(key.to_owned(), (delay, now));
        self.entries
            .retain(|_, (_, since)| elapsed(*since, now) <= 2 * BACKOFF_MAX);
    }
}

fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    Duration::from_millis(
        (now.as_millisecond() - since.as_millisecond())
            .max(0)
            .unsigned_abs(),
    )
}

/// An Event about a Pod the reconcile found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// What one round of writes does: Pods to create (by Node) and to delete (by name).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Writes {
    pub create_on: Vec<String>,
    pub delete: Vec<String>,
    pub events: Vec<PodEvent>,
    /// Failed Pods whose deletion waits for their Node's backoff: check again then.
    pub recheck_after: Option<Duration>,
}

impl Writes {
    pub fn is_empty(&self) -> bool {
        self.create_on.is_empty() && self.delete.is_empty()
    }

    /// At most [`BURST_REPLICAS`] of each (`syncNodes`).
    fn bounded(mut self) -> Self {
        self.create_on.truncate(BURST_REPLICAS);
        self.delete.truncate(BURST_REPLICAS);
        self
    }
}

/// `manage`: for each Node, the Pods it lacks or has in excess (`podsShouldBeOnNode`), and
/// the unscheduled Pods of Nodes gone (`getUnscheduledPodsWithoutNode`). Failed Pods are
/// deleted at most once per backoff delay of their Node.
pub fn manage(
    spec: &Spec<'_>,
    nodes: &[placement::Node],
    pods: &BTreeMap<String, Vec<&Pod>>,
    hash: &str,
    backoff: &mut FailedPodBackoff,
    now: Timestamp,
) -> Writes {
    let mut writes = Writes::default();
    for node in nodes {
        let fit = spec.fit(node);
        let on_node = pods.get(&node.name);
        match (fit, on_node) {
            (
                Fit {
                    should_run: true, ..
                },
                None,
            ) => writes.create_on.push(node.name.clone()),
            (
                Fit {
                    should_continue_running: true,
                    should_run,
                },
                Some(on_node),
            ) => keep_one(
                spec,
                node,
                should_run,
                on_node,
                hash,
                backoff,
                now,
                &mut writes,
            ),
            (
                Fit {
                    should_continue_running: false,
                    ..
                },
                Some(on_node),
            ) => writes.delete.extend(
                on_node
                    .iter()
                    .filter(|p| !deleting(p))
                    .map(|p| name(p).to_owned()),
            ),
            _ => {}
        }
    }
    // Unscheduled Pods for Nodes that are gone.
    for (node, on_node) in pods {
        if nodes.iter().any(|n| &n.name == node) {
            continue;
        }
        writes.delete.extend(
            on_node
                .iter()
                .filter(|p| !is_scheduled(p))
                .map(|p| name(p).to_owned()),
        );
    }
    writes.bounded()
}

/// A Node that may keep its Pod: finished ones go, and of the rest one stays (with surge,
/// an old one and a new one during a rollout).
#[allow(clippy::too_many_arguments)]
fn keep_one(
    spec: &Spec<'_>,
    node: &placement::Node,
    should_run: bool,
    on_node: &[&Pod],
    hash: &str,
    backoff: &mut FailedPodBackoff,
    now: Timestamp,
    writes: &mut Writes,
) {
    let mut running: Vec<&Pod> = Vec::new();
    for pod in on_node.iter().copied().filter(|p| !deleting(p)) {
        let pod_name = format!("{}/{}", spec.namespace, name(pod));
        match phase(pod) {
            "Failed" => {
                let key = FailedPodBackoff::key(spec, &node.name);
                if let Some(wait) = backoff.waiting(&key, now) {
                    writes.recheck_after = Some(writes.recheck_after.map_or(wait, |w| w.min(wait)));
                    continue;
                }
                backoff.next(&key, now);
                writes.events.push(PodEvent {
                    warning: true,
                    reason: FAILED_DAEMON_POD,
                    message: format!(
                        "Found failed daemon pod {pod_name} on node {}, will try to kill it",
                        node.name
                    ),
                });
                writes.delete.push(name(pod).to_owned());
            }
            "Succeeded" => {
                writes.events.push(PodEvent {
                    warning: false,
                    reason: SUCCEEDED_DAEMON_POD,
                    message: format!(
                        "Found succeeded daemon pod {pod_name} on node {}, will try to delete it",
                        node.name
                    ),
                });
                writes.delete.push(name(pod).to_owned());
            }
            _ => running.push(pod),
        }
    }
    // `on_node` is oldest first, so `running` is too.
    if !spec.allows_surge() {
        writes
            .delete
            .extend(running.iter().skip(1).map(|p| name(p).to_owned()));
        return;
    }
    if running.is_empty() {
        if should_run {
            writes.create_on.push(node.name.clone());
        }
        return;
    }
    if running.len() == 1 {
        return;
    }
    // With surge: the oldest new Pod and the oldest old one stay; an old one goes once it
    // is not ready or the new one is available.
    let (mut oldest_new, mut oldest_old) = (None, None);
    for pod in running {
        let slot = if label(pod, HASH_LABEL) == Some(hash) {
            &mut oldest_new
        } else {
            &mut oldest_old
        };
        if slot.is_none() {
            *slot = Some(pod);
        } else {
            writes.delete.push(name(pod).to_owned());
        }
    }
    if let (Some(new), Some(old)) = (oldest_new, oldest_old)
        && (!is_ready(old) || is_available(new, spec.min_ready_seconds, now))
    {
        writes.delete.push(name(old).to_owned());
    }
}

fn label<'p>(pod: &'p Pod, key: &str) -> Option<&'p str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// The new and old Pod on a Node, not counting ones being deleted (`findUpdatedPodsOnNode`);
/// `None` when it has two of either (the manage round deals with those first).
fn new_and_old<'p>(
    spec: &Spec<'_>,
    on_node: &[&'p Pod],
    hash: &str,
) -> Option<(Option<&'p Pod>, Option<&'p Pod>)> {
    let (mut new, mut old) = (None, None);
    for pod in on_node.iter().copied().filter(|p| !deleting(p)) {
        let slot = if spec.is_updated(pod, hash) {
            &mut new
        } else {
            &mut old
        };
        if slot.replace(pod).is_some() {
            return None;
        }
    }
    Some((new, old))
}

/// `rollingUpdate`: without surge, delete old Pods while fewer than `maxUnavailable` are
/// unavailable (an unavailable old one at once); with surge, create new Pods beside old ones
/// up to `maxSurge` (at once where the old one is unavailable) and delete each old one when
/// its new one is available.
pub fn rolling_update(
    spec: &Spec<'_>,
    nodes: &[placement::Node],
    pods: &BTreeMap<String, Vec<&Pod>>,
    hash: &str,
    now: Timestamp,
) -> Result<Writes, String> {
    let fits: BTreeMap<&str, Fit> = nodes
        .iter()
        .map(|n| (n.name.as_str(), spec.fit(n)))
        .collect();
    // Every Node that should run one is weighed, with or without a Pod.
    let mut weighed: BTreeMap<&str, &[&Pod]> = pods
        .iter()
        .map(|(n, p)| (n.as_str(), p.as_slice()))
        .collect();
    let mut desired = 0;
    for node in nodes {
        if fits[node.name.as_str()].should_run {
            desired += 1;
            weighed.entry(node.name.as_str()).or_insert(&[]);
        }
    }
    let max_surge = spec
        .max_surge(desired)
        .map_err(|e| format!("invalid value for MaxSurge: {e}"))?;
    let mut max_unavailable = spec
        .max_unavailable(desired)
        .map_err(|e| format!("invalid value for MaxUnavailable: {e}"))?;
    if desired > 0 && max_unavailable == 0 && max_surge == 0 {
        max_unavailable = 1;
    }
    let available = |pod: &Pod| is_available(pod, spec.min_ready_seconds, now);
    let mut writes = Writes::default();

    if max_surge == 0 {
        let mut unavailable = 0;
        let mut candidates = Vec::new();
        for on_node in weighed.values() {
            let Some((new, old)) = new_and_old(spec, on_node, hash) else {
                unavailable += 1;
                continue;
            };
            match (new, old) {
                (None, None) | (Some(_), Some(_)) => unavailable += 1,
                (Some(new), None) => {
                    if !available(new) {
                        unavailable += 1;
                    }
                }
                (None, Some(old)) => {
                    if !available(old) {
                        writes.delete.push(name(old).to_owned());
                        unavailable += 1;
                    } else if unavailable < max_unavailable {
                        candidates.push(name(old).to_owned());
                    }
                }
            }
        }
        let room = usize::try_from(max_unavailable - unavailable).unwrap_or(0);
        writes.delete.extend(candidates.into_iter().take(room));
        return Ok(writes.bounded());
    }

    let mut surge = 0;
    let mut available_count = 0;
    let mut candidates = Vec::new();
    let mut should_not_run = Vec::new();
    for (node, on_node) in &weighed {
        let Some((new, old)) = new_and_old(spec, on_node, hash) else {
            surge += 1;
            continue;
        };
        if let Some(pod) = old.or(new)
            && available(pod)
        {
            available_count += 1;
        }
        let should_run = fits.get(node).is_some_and(|f| f.should_run);
        match (new, old) {
            (_, None) => {}
            (None, Some(old)) => {
                if !available(old) {
                    if should_run {
                        writes.create_on.push((*node).to_owned());
                    } else {
                        writes.delete.push(name(old).to_owned());
                    }
                } else if !should_run {
                    should_not_run.push(name(old).to_owned());
                } else if surge < max_surge {
                    candidates.push((*node).to_owned());
                }
            }
            (Some(new), Some(old)) => {
                if available(new) {
                    writes.delete.push(name(old).to_owned());
                } else {
                    surge += 1;
                }
            }
        }
    }
    // Old Pods on Nodes they should leave, as far as the available ones exceed the desired.
    let deletable = usize::try_from(available_count - desired).unwrap_or(0);
    writes
        .delete
        .extend(should_not_run.into_iter().take(deletable));
    let room = usize::try_from(max_surge - surge).unwrap_or(0);
    writes.create_on.extend(candidates.into_iter().take(room));
    Ok(writes.bounded())
}

// --- status --------------------------------------------------------------------------------

/// The status counts (`updateDaemonSetStatus`), from the oldest Pod of each Node; the
/// observed generation is raised when `observed`.
pub fn status(
    spec: &Spec<'_>,
    nodes: &[placement::Node],
    pods: &BTreeMap<String, Vec<&Pod>>,
    hash: &str,
    observed: bool,
    now: Timestamp,
) -> DaemonSetStatus {
    let mut status = spec.ds.status.clone().unwrap_or_default();
    let (mut desired, mut current, mut misscheduled) = (0, 0, 0);
    let (mut ready, mut updated, mut available) = (0, 0, 0);
    for node in nodes {
        let on_node = pods.get(&node.name).filter(|p| !p.is_empty());
        if spec.fit(node).should_run {
            desired += 1;
            let Some(on_node) = on_node else { continue };
            current += 1;
            let pod = on_node[0];
            if is_ready(pod) {
                ready += 1;
                if is_available(pod, spec.min_ready_seconds, now) {
                    available += 1;
                }
            }
            if spec.is_updated(pod, hash) {
                updated += 1;
            }
        } else if on_node.is_some() {
            misscheduled += 1;
        }
    }
    status.desired_number_scheduled = desired;
    status.current_number_scheduled = current;
    status.number_misscheduled = misscheduled;
    status.number_ready = ready;
    status.updated_number_scheduled = Some(updated);
    status.number_available = Some(available);
    status.number_unavailable = Some(desired - available);
    if observed {
        status.observed_generation = spec.ds.metadata.generation;
    }
    status
}

/// Whether `new` differs from the DaemonSet's status (`storeDaemonSetStatus` skips a write
/// when every count is equal and the generation observed).
pub fn status_changed(ds: &DaemonSet, new: &DaemonSetStatus) -> bool {
    let old = ds.status.clone().unwrap_or_default();
    let count = |n: Option<i32>| n.unwrap_or(0);
    old.desired_number_scheduled != new.desired_number_scheduled
        || old.current_number_scheduled != new.current_number_scheduled
        || old.number_misscheduled != new.number_misscheduled
        || old.number_ready != new.number_ready
        || count(old.updated_number_scheduled) != count(new.updated_number_scheduled)
        || count(old.number_available) != count(new.number_available)
        || count(old.number_unavailable) != count(new.number_unavailable)
        || old.observed_generation.unwrap_or(0) < ds.metadata.generation.unwrap_or(0)
}

/// When to reconcile again for a ready Pod to count as available (`minReadySeconds`).
pub fn recheck_after(
    spec: &Spec<'_>,
    pods: &BTreeMap<String, Vec<&Pod>>,
    now: Timestamp,
) -> Option<Duration> {
    if spec.min_ready_seconds <= 0 {
        return None;
    }
    pods.values()
        .flatten()
        .filter_map(|p| available_in(p, spec.min_ready_seconds, now))
        .filter(|d| !d.is_zero())
        .min()
}

#[cfg(test)]
mod tests;
