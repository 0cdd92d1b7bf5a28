//! The namespace controller's decisions, as kube-controller-manager's
//! `pkg/controller/namespace/deletion` makes them.
//!
//! ```text
//!  Namespace being deleted, `kubernetes` in spec.finalizers
//!   ─► discovery: the preferred version of every namespaced resource that supports delete
//!        └─ a stale group version: NamespaceDeletionDiscoveryFailure; the others go on
//!   ─► pods first: deletecollection (or list + delete each) ─► list what remains
//!        └─ some remain: the conditions, then wait (the Pods' grace period) or back off
//!   ─► every other resource, the same way
//!   ─► the conditions from what failed and what remains (counts, the contents' finalizers)
//!   ─► a failure: back off │ content remaining: wait estimate/2 + 1 s │ none: remove `kubernetes`
//! ```
//!
//! Nothing here does I/O: the service crate discovers, lists and deletes, and hands each
//! answer to these functions.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{Namespace, NamespaceCondition, NamespaceStatus, Pod},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::{SignedDuration, Timestamp},
};

/// The finalizer in `spec.finalizers` that this controller removes once the namespace is
/// empty (kube-controller-manager's `FinalizerKubernetes`).
pub const FINALIZER: &str = "kubernetes";
/// The phase of a namespace being deleted.
pub const TERMINATING: &str = "Terminating";
/// kube-controller-manager waits this long after a namespace's deletion before its first pass
/// (`namespaceDeletionGracePeriod`): HA apiservers learn of the deletion and refuse new
/// content, and etcd members catch up with last-moment creations the pass must see.
pub const DELETION_GRACE: Duration = Duration::from_secs(5);
/// How long an object held by a finalizer is expected to take (`finalizerEstimateSeconds`):
/// the namespace is looked at again after half of it.
pub const FINALIZER_ESTIMATE_SECONDS: i64 = 15;

pub const DISCOVERY_FAILURE: &str = "NamespaceDeletionDiscoveryFailure";
pub const GROUP_VERSION_PARSING_FAILURE: &str = "NamespaceDeletionGroupVersionParsingFailure";
pub const CONTENT_FAILURE: &str = "NamespaceDeletionContentFailure";
pub const CONTENT_REMAINING: &str = "NamespaceContentRemaining";
pub const FINALIZERS_REMAINING: &str = "NamespaceFinalizersRemaining";

/// The conditions the controller keeps, in kube-controller-manager's order, each with the
/// reason and message it carries when nothing is wrong (status `False`).
const KEPT: [(&str, &str, &str); 5] = [
    (
        DISCOVERY_FAILURE,
        "ResourcesDiscovered",
        "All resources successfully discovered",
    ),
    (
        GROUP_VERSION_PARSING_FAILURE,
        "ParsedGroupVersions",
        "All legacy kube types successfully parsed",
    ),
    (
        CONTENT_FAILURE,
        "ContentDeleted",
        "All content successfully deleted, may be waiting on finalization",
    ),
    (
        CONTENT_REMAINING,
        "ContentRemoved",
        "All content successfully removed",
    ),
    (
        FINALIZERS_REMAINING,
        "ContentHasNoFinalizers",
        "All content-preserving finalizers finished",
    ),
];

// --- the namespace ------------------------------------------------------------------------

/// The namespace is being deleted and still carries this controller's finalizer.
pub fn is_ours(namespace: &Namespace) -> bool {
    namespace.metadata.deletion_timestamp.is_some()
        && namespace
            .spec
            .as_ref()
            .and_then(|s| s.finalizers.as_ref())
            .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

/// How long to wait before the first pass over a namespace deleted at `deleted_at`
/// ([`DELETION_GRACE`]), or `None` once it has passed.
pub fn grace_left(deleted_at: Timestamp, now: Timestamp) -> Option<Duration> {
    let elapsed = now.duration_since(deleted_at);
    let grace = SignedDuration::try_from(DELETION_GRACE).ok()?;
    let left = grace.checked_sub(elapsed)?;
    if left.is_positive() {
        Duration::try_from(left).ok()
    } else {
        None
    }
}

/// The namespace's status phase must be set to `Terminating` first.
pub fn needs_terminating_phase(namespace: &Namespace) -> bool {
    namespace.status.as_ref().and_then(|s| s.phase.as_deref()) != Some(TERMINATING)
}

/// `spec.finalizers` once this controller is done: the others, sorted and without repeats,
/// as kube-controller-manager writes them through `/finalize`.
pub fn finalizers_after(namespace: &Namespace) -> Vec<String> {
    let others: BTreeSet<&str> = namespace
        .spec
        .as_ref()
        .and_then(|s| s.finalizers.as_ref())
        .into_iter()
        .flatten()
        .map(String::as_str)
        .filter(|f| *f != FINALIZER)
        .collect();
    others.into_iter().map(str::to_owned).collect()
}

// --- discovery ----------------------------------------------------------------------------

/// One resource as discovery serves it at its preferred version (the service crate's
/// discovery, client-go's `ServerPreferredResources`, gives these).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Served {
    /// Empty for the core group.
    pub group: String,
    pub version: String,
    /// The plural name, for example `configmaps`.
    pub resource: String,
    pub kind: String,
    pub namespaced: bool,
    pub verbs: Vec<String>,
}

/// A group, version and resource, shown as client-go shows one (`apps/v1, Resource=deployments`,
/// `/v1, Resource=pods`): kube-controller-manager's error messages carry that form.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Gvr {
    pub group: String,
    pub version: String,
    pub resource: String,
}

impl Gvr {
    pub fn new(group: &str, version: &str, resource: &str) -> Self {
        Self {
            group: group.to_owned(),
            version: version.to_owned(),
            resource: resource.to_owned(),
        }
    }

    /// `v1` pods, which go first and whose grace period sets the wait.
    pub fn pods() -> Self {
        Self::new("", "v1", "pods")
    }

    pub fn is_pods(&self) -> bool {
        self.group.is_empty() && self.resource == "pods"
    }

    /// `apps/v1`, or `v1` for the core group.
    pub fn api_version(&self) -> String {
        group_version(&self.group, &self.version)
    }
}

impl fmt::Display for Gvr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}, Resource={}",
            self.group, self.version, self.resource
        )
    }
}

fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    }
}

/// A namespaced resource to empty, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletable {
    pub gvr: Gvr,
    pub kind: String,
    /// One `deletecollection` call empties it; otherwise each object is deleted by name.
    pub delete_collection: bool,
    /// It can be listed: to delete each object, and to see what remains.
    pub list: bool,
}

/// What discovery gave: the resources to empty, and what it could not tell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovery {
    /// By group, version and resource.
    pub resources: Vec<Deletable>,
    /// Group versions that could not be discovered (`group/version` → why). Their resources
    /// are left alone; every other resource is still emptied.
    pub failed: BTreeMap<String, String>,
    /// A group version that does not parse: client-go then gives no resource at all.
    pub parse_error: Option<String>,
}

impl Discovery {
    /// The condition message for the group versions that failed, as client-go's
    /// `ErrGroupDiscoveryFailed` reads through kube-controller-manager's condition.
    pub fn failure_message(&self) -> Option<String> {
        if self.failed.is_empty() {
            return None;
        }
        let mut groups: Vec<String> = self
            .failed
            .iter()
            .map(|(gv, why)| format!("{gv}: {why}"))
            .collect();
        groups.sort();
        Some(format!(
            "Discovery failed for some groups, {} failing: unable to retrieve the complete list of server APIs: {}",
            self.failed.len(),
            groups.join(", ")
        ))
    }
}

/// The resources kube-controller-manager empties a namespace of, from the preferred
/// resources (`ServerPreferredNamespacedResources`, then those with the `delete` verb) and
/// the group versions whose discovery `failed` (`group/version` → why).
pub fn discover(served: &[Served], failed: BTreeMap<String, String>) -> Discovery {
    let mut resources = Vec::new();
    let mut parse_error = None;
    for resource in served {
        if !resource.namespaced || !has_verb(resource, "delete") {
            continue;
        }
        // client-go parses every group version again; one with a stray '/' fails them all.
        let gv = group_version(&resource.group, &resource.version);
        if gv.matches('/').count() > 1 {
            parse_error.get_or_insert(format!("unexpected GroupVersion string: {gv}"));
            continue;
        }
        resources.push(Deletable {
            gvr: Gvr::new(&resource.group, &resource.version, &resource.resource),
            kind: resource.kind.clone(),
            delete_collection: has_verb(resource, "deletecollection"),
            list: has_verb(resource, "list"),
        });
    }
    if parse_error.is_some() {
        resources.clear();
    }
    resources.sort_by(|a, b| a.gvr.cmp(&b.gvr));
    Discovery {
        resources,
        failed,
        parse_error,
    }
}

fn has_verb(resource: &Served, verb: &str) -> bool {
    resource.verbs.iter().any(|v| v == verb)
}

// --- one resource -------------------------------------------------------------------------

/// What remains of one resource after its deletion (`gvrDeletionMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Remaining {
    /// Seconds until it is expected to be gone; 0: no estimate (not: nothing remains).
    pub estimate: i64,
    pub count: usize,
    /// Finalizer → how many of the remaining objects carry it.
    pub finalizers: BTreeMap<String, usize>,
}

/// How long the namespace's Pods may take to terminate, in seconds
/// (`estimateGracefulTerminationForPods`): the longest grace period of a Pod not finished,
/// or 0 once that long has passed since the namespace's deletion.
pub fn pods_estimate(pods: &[Pod], deleted_at: Timestamp, now: Timestamp) -> i64 {
    let estimate = pods
        .iter()
        .filter(|pod| {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter_map(|pod| pod.spec.as_ref()?.termination_grace_period_seconds)
        .max()
        .unwrap_or(0)
        .max(0);
    let since_deletion = now.duration_since(deleted_at);
    if since_deletion >= SignedDuration::from_secs(estimate) {
        0
    } else {
        estimate
    }
}

/// What remains of `gvr` once deleted, from the finalizers of each object still listed
/// (`deleteAllContentForGroupVersionResource`), and the error when objects remain that
/// nothing explains: no grace period to wait for and no finalizer.
pub fn remaining(
    namespace: &str,
    gvr: &Gvr,
    estimate: i64,
    listed: &[Vec<String>],
) -> (Remaining, Option<String>) {
    if listed.is_empty() {
        return (Remaining::default(), None);
    }
    let mut finalizers = BTreeMap::new();
    for finalizer in listed.iter().flatten() {
        *finalizers.entry(finalizer.clone()).or_insert(0) += 1;
    }
    let count = listed.len();
    if estimate != 0 {
        return (
            Remaining {
                estimate,
                count,
                finalizers,
            },
            None,
        );
    }
    if !finalizers.is_empty() {
        return (
            Remaining {
                estimate: FINALIZER_ESTIMATE_SECONDS,
                count,
                finalizers,
            },
            None,
        );
    }
    (
        Remaining {
            estimate,
            count,
            finalizers,
        },
        Some(format!(
            "unexpected items still remain in namespace: {namespace} for gvr: {gvr}"
        )),
    )
}

// --- one pass -----------------------------------------------------------------------------

/// What one pass over a namespace found (`deleteAllContent`): the failures, the largest
/// estimate and, once every resource was gone through, what remains.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    pub namespace: String,
    discovery_failure: Option<String>,
    parse_failure: Option<String>,
    content_failures: Vec<String>,
    /// Every failure, in the order met: any one keeps the finalizer.
    errors: Vec<String>,
    estimate: i64,
    remaining: BTreeMap<Gvr, usize>,
    finalizers: BTreeMap<String, usize>,
    /// Every resource was gone through (not stopped at remaining Pods), so the counts are
    /// reported in the conditions.
    counted: bool,
}

/// What to do after a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Something failed: retry with backoff.
    Failed(String),
    /// Content remains that is expected to go: look again after this long.
    Wait(Duration),
    /// Nothing remains: remove the finalizer.
    Finalize,
}

impl Pass {
    pub fn new(namespace: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            ..Self::default()
        }
    }

    /// Discovery failed, as a whole or for some group versions (`message` as the condition
    /// shows it).
    pub fn discovery_failed(&mut self, message: String) {
        self.errors.push(message.clone());
        self.discovery_failure = Some(message);
    }

    pub fn parse_failed(&mut self, message: String) {
        self.errors.push(message.clone());
        self.parse_failure = Some(message);
    }

    /// One resource was deleted, with what remains of it and the error met, if any.
    pub fn resource(&mut self, gvr: &Gvr, remaining: Remaining, error: Option<String>) {
        if let Some(error) = error {
            self.errors.push(if gvr.is_pods() {
                format!(
                    "failed to delete pods for namespace: {}, err: {error}",
                    self.namespace
                )
            } else {
                error.clone()
            });
            self.content_failures.push(error);
        }
        self.estimate = self.estimate.max(remaining.estimate);
        if remaining.count > 0 {
            self.remaining.insert(gvr.clone(), remaining.count);
            for (finalizer, n) in remaining.finalizers {
                if n > 0 {
                    *self.finalizers.entry(finalizer).or_insert(0) += n;
                }
            }
        }
    }

    /// Pods remain after the Pods were deleted: kube-controller-manager leaves the other
    /// resources for a later pass (ordered namespace deletion).
    pub fn pods_remain(&self) -> bool {
        self.remaining.get(&Gvr::pods()).is_some_and(|n| *n > 0)
    }

    /// Every resource was gone through: the conditions report what remains.
    pub fn counted(&mut self) {
        self.counted = true;
    }

    /// The five conditions as this pass leaves them: (type, status, reason, message).
    pub fn conditions(&self) -> Vec<(&'static str, &'static str, String, String)> {
        let mut failing: BTreeMap<&str, (&str, String)> = BTreeMap::new();
        if let Some(message) = &self.discovery_failure {
            failing.insert(DISCOVERY_FAILURE, ("DiscoveryFailed", message.clone()));
        }
        if let Some(message) = &self.parse_failure {
            failing.insert(
                GROUP_VERSION_PARSING_FAILURE,
                ("GroupVersionParsingFailed", message.clone()),
            );
        }
        if self.counted {
            if !self.remaining.is_empty() {
                let mut each: Vec<String> = self
                    .remaining
                    .iter()
                    .map(|(gvr, n)| {
                        format!("{}.{} has {n} resource instances", gvr.resource, gvr.group)
                    })
                    .collect();
                each.sort();
                failing.insert(
                    CONTENT_REMAINING,
                    (
                        "SomeResourcesRemain",
                        format!("Some resources are remaining: {}", each.join(", ")),
                    ),
                );
            }
            if !self.finalizers.is_empty() {
                let mut each: Vec<String> = self
                    .finalizers
                    .iter()
                    .map(|(finalizer, n)| format!("{finalizer} in {n} resource instances"))
                    .collect();
                each.sort();
                failing.insert(
                    FINALIZERS_REMAINING,
                    (
                        "SomeFinalizersRemain",
                        format!(
                            "Some content in the namespace has finalizers remaining: {}",
                            each.join(", ")
                        ),
                    ),
                );
            }
        }
        if !self.content_failures.is_empty() {
            let mut messages = self.content_failures.clone();
            messages.sort();
            failing.insert(
                CONTENT_FAILURE,
                (
                    "ContentDeletionFailed",
                    format!(
                        "Failed to delete all resource types, {} remaining: {}",
                        messages.len(),
                        messages.join(", ")
                    ),
                ),
            );
        }
        KEPT.iter()
            .map(
                |(type_, ok_reason, ok_message)| match failing.remove(type_) {
                    Some((reason, message)) => (*type_, "True", reason.to_owned(), message),
                    None => (
                        *type_,
                        "False",
                        (*ok_reason).to_owned(),
                        (*ok_message).to_owned(),
                    ),
                },
            )
            .collect()
    }

    /// Writes this pass's conditions into `status` (`updateConditions`): a new type is
    /// added, a changed one updated in place, its transition time moved only when its status
    /// changes. True when anything changed.
    pub fn update_conditions(&self, status: &mut NamespaceStatus, now: Timestamp) -> bool {
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        let mut changed = false;
        for (type_, state, reason, message) in self.conditions() {
            match conditions.iter_mut().find(|c| c.type_ == type_) {
                None => {
                    conditions.push(NamespaceCondition {
                        type_: type_.to_owned(),
                        status: state.to_owned(),
                        reason: Some(reason),
                        message: Some(message),
                        last_transition_time: Some(Time(now)),
                    });
                    changed = true;
                }
                Some(old) => {
                    let same = old.status == state
                        && old.reason.as_deref().unwrap_or_default() == reason
                        && old.message.as_deref().unwrap_or_default() == message;
                    if !same {
                        if old.status != state {
                            old.last_transition_time = Some(Time(now));
                        }
                        old.status = state.to_owned();
                        old.reason = Some(reason);
                        old.message = Some(message);
                        changed = true;
                    }
                }
            }
        }
        changed
    }

    /// Fail, wait or finalize, as kube-controller-manager's worker decides: any failure backs
    /// off; content expected to go is looked at again after half its estimate, plus a second.
    pub fn verdict(&self) -> Verdict {
        if !self.errors.is_empty() {
            return Verdict::Failed(aggregate(&self.errors));
        }
        if self.estimate > 0 {
            let seconds = u64::try_from(self.estimate / 2 + 1).unwrap_or(1);
            return Verdict::Wait(Duration::from_secs(seconds));
        }
        Verdict::Finalize
    }
}

/// Several errors as one message, each once (apimachinery's aggregate error).
fn aggregate(errors: &[String]) -> String {
    let mut seen = BTreeSet::new();
    let distinct: Vec<&str> = errors
        .iter()
        .filter(|e| seen.insert(e.as_str()))
        .map(String::as_str)
        .collect();
    match distinct.as_slice() {
        [one] => (*one).to_owned(),
        many => format!("[{}]", many.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{NamespaceSpec, PodSpec, PodStatus},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };

    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn mk_ns(deleted: bool, finalizers: &[&str], phase: Option<&str>) -> Namespace {
        Namespace {
            metadata: ObjectMeta {
                name: Some("doomed".into()),
                deletion_timestamp: deleted.then(|| Time(at(0))),
                ..ObjectMeta::default()
            },
            spec: Some(NamespaceSpec {
                finalizers: Some(finalizers.iter().map(|f| (*f).to_owned()).collect()),
            }),
            status: Some(NamespaceStatus {
                phase: phase.map(str::to_owned),
                ..NamespaceStatus::default()
            }),
        }
    }

    fn mk_pod(grace: Option<i64>, phase: &str) -> Pod {
        Pod {
            spec: Some(PodSpec {
                termination_grace_period_seconds: grace,
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    fn res(gv: &str, resource: &str, kind: &str, namespaced: bool, verbs: &[&str]) -> Served {
        let (group, version) = gv.split_once('/').unwrap_or(("", gv));
        Served {
            group: group.into(),
            version: version.into(),
            resource: resource.into(),
            kind: kind.into(),
            namespaced,
            verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        }
    }

    fn stale(gvs: &[&str]) -> BTreeMap<String, String> {
        gvs.iter()
            .map(|gv| {
                (
                    (*gv).to_owned(),
                    format!("stale GroupVersion discovery: {gv}"),
                )
            })
            .collect()
    }

    const ALL: [&str; 8] = [
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ];

    #[test]
    fn only_a_deleting_namespace_with_the_finalizer_is_ours() {
        assert!(is_ours(&mk_ns(true, &["kubernetes"], Some("Terminating"))));
        assert!(!is_ours(&mk_ns(false, &["kubernetes"], Some("Active"))));
        // Finalized already (by another controller sharing the token): nothing to do.
        assert!(!is_ours(&mk_ns(true, &["example.com/other"], None)));
        assert!(!is_ours(&mk_ns(true, &[], None)));
    }

    #[test]
    fn the_first_pass_waits_out_the_deletion_grace() {
        assert_eq!(grace_left(at(0), at(0)), Some(Duration::from_secs(5)));
        assert_eq!(grace_left(at(0), at(3)), Some(Duration::from_secs(2)));
        assert_eq!(grace_left(at(0), at(5)), None);
        assert_eq!(grace_left(at(0), at(60)), None);
        // A clock behind the apiserver's waits no longer than the grace itself plus the skew.
        assert_eq!(grace_left(at(2), at(0)), Some(Duration::from_secs(7)));
    }

    #[test]
    fn the_phase_and_the_finalizers_written() {
        assert!(needs_terminating_phase(&mk_ns(true, &["kubernetes"], None)));
        assert!(needs_terminating_phase(&mk_ns(
            true,
            &["kubernetes"],
            Some("Active")
        )));
        assert!(!needs_terminating_phase(&mk_ns(
            true,
            &["kubernetes"],
            Some("Terminating")
        )));
        let ns = mk_ns(
            true,
            &["z.example/b", "kubernetes", "a.example/a", "z.example/b"],
            None,
        );
        assert_eq!(finalizers_after(&ns), ["a.example/a", "z.example/b"]);
        assert!(finalizers_after(&mk_ns(true, &["kubernetes"], None)).is_empty());
    }

    #[test]
    fn discovery_keeps_the_preferred_namespaced_deletable_resources() {
        let served = vec![
            res("v1", "pods", "Pod", true, &ALL),
            res("v1", "configmaps", "ConfigMap", true, &ALL),
            res("v1", "nodes", "Node", false, &ALL),
            res("v1", "bindings", "Binding", true, &["create"]),
            res("v1", "events", "Event", true, &ALL),
            res(
                "autoscaling/v2",
                "horizontalpodautoscalers",
                "HorizontalPodAutoscaler",
                true,
                &ALL,
            ),
            res(
                "example.com/v1",
                "widgets",
                "Widget",
                true,
                &["delete", "get", "list"],
            ),
            res("events.k8s.io/v1", "events", "Event", true, &ALL),
        ];
        let discovery = discover(&served, stale(&["example.com/v2"]));
        let found: Vec<(String, bool, bool)> = discovery
            .resources
            .iter()
            .map(|d| (d.gvr.to_string(), d.delete_collection, d.list))
            .collect();
        assert_eq!(
            found,
            [
                ("/v1, Resource=configmaps".to_owned(), true, true),
                ("/v1, Resource=events".to_owned(), true, true),
                ("/v1, Resource=pods".to_owned(), true, true),
                (
                    "autoscaling/v2, Resource=horizontalpodautoscalers".to_owned(),
                    true,
                    true
                ),
                ("events.k8s.io/v1, Resource=events".to_owned(), true, true),
                // No deletecollection: each Widget is deleted by name.
                ("example.com/v1, Resource=widgets".to_owned(), false, true),
            ]
        );
        assert_eq!(discovery.parse_error, None);
        assert_eq!(
            discovery.failure_message().as_deref(),
            Some(
                "Discovery failed for some groups, 1 failing: unable to retrieve the complete \
                 list of server APIs: example.com/v2: stale GroupVersion discovery: example.com/v2"
            )
        );
    }

    #[test]
    fn several_failed_group_versions_are_listed_sorted() {
        let discovery = discover(&[], stale(&["b.example/v1", "a.example/v1"]));
        assert!(discovery.resources.is_empty());
        assert_eq!(
            discovery.failure_message().as_deref(),
            Some(
                "Discovery failed for some groups, 2 failing: unable to retrieve the complete \
                 list of server APIs: a.example/v1: stale GroupVersion discovery: a.example/v1, \
                 b.example/v1: stale GroupVersion discovery: b.example/v1"
            )
        );
        assert_eq!(discover(&[], BTreeMap::new()).failure_message(), None);
    }

    #[test]
    fn a_group_version_that_does_not_parse_stops_every_deletion() {
        let served = vec![
            res("v1", "pods", "Pod", true, &ALL),
            res("bad.example/v1/x", "things", "Thing", true, &ALL),
        ];
        let discovery = discover(&served, BTreeMap::new());
        assert!(discovery.resources.is_empty());
        assert_eq!(
            discovery.parse_error.as_deref(),
            Some("unexpected GroupVersion string: bad.example/v1/x")
        );
    }

    #[test]
    fn the_pods_estimate_is_the_longest_grace_until_it_has_passed() {
        let pods = [
            mk_pod(Some(30), "Running"),
            mk_pod(Some(10), "Pending"),
            mk_pod(Some(600), "Succeeded"),
            mk_pod(Some(900), "Failed"),
            mk_pod(None, "Running"),
        ];
        assert_eq!(pods_estimate(&pods, at(0), at(5)), 30);
        assert_eq!(pods_estimate(&pods, at(0), at(29)), 30);
        assert_eq!(pods_estimate(&pods, at(0), at(30)), 0);
        assert_eq!(pods_estimate(&pods[2..], at(0), at(5)), 0);
        assert_eq!(pods_estimate(&[], at(0), at(5)), 0);
    }

    #[test]
    fn what_remains_of_a_resource() {
        let cms = Gvr::new("", "v1", "configmaps");
        assert_eq!(remaining("ns", &cms, 0, &[]), (Remaining::default(), None));
        // Gone: no estimate, even for Pods that had one.
        assert_eq!(
            remaining("ns", &Gvr::pods(), 30, &[]),
            (Remaining::default(), None)
        );
        // Terminating Pods: their grace period.
        let (pods, error) = remaining("ns", &Gvr::pods(), 30, &[vec![], vec![]]);
        assert_eq!((pods.estimate, pods.count, error), (30, 2, None));
        // Held by finalizers: the default estimate, and the finalizers counted.
        let held = vec![
            vec!["example.com/hold".to_owned()],
            vec![],
            vec!["example.com/hold".to_owned(), "other/x".to_owned()],
        ];
        let (left, error) = remaining("ns", &cms, 0, &held);
        assert_eq!(error, None);
        assert_eq!(
            left,
            Remaining {
                estimate: FINALIZER_ESTIMATE_SECONDS,
                count: 3,
                finalizers: BTreeMap::from([
                    ("example.com/hold".to_owned(), 2),
                    ("other/x".to_owned(), 1)
                ]),
            }
        );
        // Nothing explains them: an error, kube-controller-manager's words.
        let (left, error) = remaining("ns", &cms, 0, &[vec![]]);
        assert_eq!((left.estimate, left.count), (0, 1));
        assert_eq!(
            error.as_deref(),
            Some(
                "unexpected items still remain in namespace: ns for gvr: /v1, Resource=configmaps"
            )
        );
    }

    fn conditions_of(pass: &Pass) -> Vec<(String, String, String, String)> {
        pass.conditions()
            .into_iter()
            .map(|(t, s, r, m)| (t.to_owned(), s.to_owned(), r, m))
            .collect()
    }

    #[test]
    fn an_empty_namespace_is_finalized_with_every_condition_false() {
        let mut pass = Pass::new("ns");
        pass.resource(&Gvr::pods(), Remaining::default(), None);
        pass.counted();
        assert_eq!(pass.verdict(), Verdict::Finalize);
        let conditions = conditions_of(&pass);
        assert_eq!(conditions.len(), 5);
        assert!(conditions.iter().all(|c| c.1 == "False"), "{conditions:?}");
        assert_eq!(
            conditions[3],
            (
                CONTENT_REMAINING.to_owned(),
                "False".to_owned(),
                "ContentRemoved".to_owned(),
                "All content successfully removed".to_owned()
            )
        );
    }

    #[test]
    fn remaining_content_and_finalizers_are_counted_and_waited_for() {
        let mut pass = Pass::new("ns");
        let cms = Gvr::new("", "v1", "configmaps");
        let widgets = Gvr::new("example.com", "v1", "widgets");
        let hold = |n| Remaining {
            estimate: FINALIZER_ESTIMATE_SECONDS,
            count: n,
            finalizers: BTreeMap::from([("example.com/hold".to_owned(), n)]),
        };
        pass.resource(&widgets, hold(2), None);
        pass.resource(&cms, hold(1), None);
        pass.resource(&Gvr::new("", "v1", "secrets"), Remaining::default(), None);
        pass.counted();
        let conditions = conditions_of(&pass);
        assert_eq!(
            conditions[3],
            (
                CONTENT_REMAINING.to_owned(),
                "True".to_owned(),
                "SomeResourcesRemain".to_owned(),
                "Some resources are remaining: configmaps. has 1 resource instances, \
                 widgets.example.com has 2 resource instances"
                    .to_owned()
            )
        );
        assert_eq!(
            conditions[4],
            (
                FINALIZERS_REMAINING.to_owned(),
                "True".to_owned(),
                "SomeFinalizersRemain".to_owned(),
                "Some content in the namespace has finalizers remaining: example.com/hold in 3 \
                 resource instances"
                    .to_owned()
            )
        );
        assert!(conditions[..3].iter().all(|c| c.1 == "False"));
        // 15 s estimate: look again after 8 s, as kube-controller-manager's worker does.
        assert_eq!(pass.verdict(), Verdict::Wait(Duration::from_secs(8)));
    }

    #[test]
    fn pods_still_terminating_stop_the_pass_without_counting() {
        let mut pass = Pass::new("ns");
        pass.resource(
            &Gvr::pods(),
            Remaining {
                estimate: 30,
                count: 100,
                finalizers: BTreeMap::new(),
            },
            None,
        );
        assert!(pass.pods_remain());
        // As kube-controller-manager: the counts are not reported while Pods go first.
        assert!(conditions_of(&pass).iter().all(|c| c.1 == "False"));
        assert_eq!(pass.verdict(), Verdict::Wait(Duration::from_secs(16)));
    }

    #[test]
    fn failures_make_conditions_and_keep_the_finalizer() {
        let mut pass = Pass::new("ns");
        pass.discovery_failed("Discovery failed for some groups, ...".into());
        pass.resource(
            &Gvr::new("", "v1", "secrets"),
            Remaining::default(),
            Some("secrets is forbidden".into()),
        );
        pass.resource(
            &Gvr::pods(),
            Remaining::default(),
            Some("pods is forbidden".into()),
        );
        pass.counted();
        let conditions = conditions_of(&pass);
        assert_eq!(
            (conditions[0].1.as_str(), conditions[0].2.as_str()),
            ("True", "DiscoveryFailed")
        );
        assert_eq!(
            conditions[2],
            (
                CONTENT_FAILURE.to_owned(),
                "True".to_owned(),
                "ContentDeletionFailed".to_owned(),
                "Failed to delete all resource types, 2 remaining: pods is forbidden, secrets is \
                 forbidden"
                    .to_owned()
            )
        );
        assert_eq!(
            pass.verdict(),
            Verdict::Failed(
                "[Discovery failed for some groups, ..., secrets is forbidden, failed to delete \
                 pods for namespace: ns, err: pods is forbidden]"
                    .into()
            )
        );
        let mut parse = Pass::new("ns");
        parse.parse_failed("unexpected GroupVersion string: a/b/c".into());
        parse.counted();
        assert_eq!(
            conditions_of(&parse)[1],
            (
                GROUP_VERSION_PARSING_FAILURE.to_owned(),
                "True".to_owned(),
                "GroupVersionParsingFailed".to_owned(),
                "unexpected GroupVersion string: a/b/c".to_owned()
            )
        );
        assert_eq!(
            parse.verdict(),
            Verdict::Failed("unexpected GroupVersion string: a/b/c".into())
        );
    }

    #[test]
    fn conditions_are_added_updated_in_place_and_left_alone_when_equal() {
        let mut status = NamespaceStatus {
            phase: Some(TERMINATING.into()),
            conditions: Some(vec![NamespaceCondition {
                type_: "Example".into(),
                status: "True".into(),
                ..NamespaceCondition::default()
            }]),
        };
        let mut held = Pass::new("ns");
        held.resource(
            &Gvr::new("", "v1", "configmaps"),
            Remaining {
                estimate: FINALIZER_ESTIMATE_SECONDS,
                count: 1,
                finalizers: BTreeMap::from([("example.com/hold".to_owned(), 1)]),
            },
            None,
        );
        held.counted();
        assert!(held.update_conditions(&mut status, at(10)));
        let conditions = status.conditions.clone().unwrap_or_default();
        // Someone else's condition stays first; ours follow in kube-controller-manager's order.
        let types: Vec<&str> = conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            types,
            [
                "Example",
                DISCOVERY_FAILURE,
                GROUP_VERSION_PARSING_FAILURE,
                CONTENT_FAILURE,
                CONTENT_REMAINING,
                FINALIZERS_REMAINING
            ]
        );
        assert!(
            conditions[1..]
                .iter()
                .all(|c| c.last_transition_time == Some(Time(at(10))))
        );
        // The same pass again: nothing to write.
        assert!(!held.update_conditions(&mut status, at(20)));

        // More of the same kind remaining: the message changes, the transition time does not.
        let mut more = held.clone();
        more.resource(
            &Gvr::new("", "v1", "configmaps"),
            Remaining {
                estimate: FINALIZER_ESTIMATE_SECONDS,
                count: 2,
                finalizers: BTreeMap::new(),
            },
            None,
        );
        assert!(more.update_conditions(&mut status, at(30)));
        let remaining = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == CONTENT_REMAINING)
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            remaining.message.as_deref(),
            Some("Some resources are remaining: configmaps. has 2 resource instances")
        );
        assert_eq!(remaining.last_transition_time, Some(Time(at(10))));

        // All gone: back to False, with a new transition time.
        let mut empty = Pass::new("ns");
        empty.counted();
        assert!(empty.update_conditions(&mut status, at(40)));
        let remaining = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == CONTENT_REMAINING)
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            (remaining.status.as_str(), remaining.reason.as_deref()),
            ("False", Some("ContentRemoved"))
        );
        assert_eq!(remaining.last_transition_time, Some(Time(at(40))));
    }
}
