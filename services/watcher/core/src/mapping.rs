//! From a change of one object to the work keys it causes, per the configured rules.
//!
//! - `for`: the object's own key;
//! - `owns`: the key of its controller owner when the owner is of the controller's kind
//!   (an object with no controller owner maps to nothing); when an update changes the
//!   controller owner, both the old and the new owner are keyed, as kube-controller-manager's
//!   ReplicaSet controller does; an object with no controller owner, new or just released
//!   or relabelled, keys every cached owner whose selector matches it ([`Owners::selecting`]),
//!   so that it is adopted at once;
//!   With `through`, the object's controller is of the kind between, and the key is that
//!   object's controller owner, looked up in the watcher's cache ([`Owners`]): a Pod keys
//!   the Deployment of its ReplicaSet. When the object between is not cached (yet, or any
//!   more), nothing is keyed; its own events key the owner;
//! - `mapByLabel`: the object in the same namespace that the label's value names (old and
//!   new values both, when it changed);
//! - `mapByNamespace`: the Namespace the object lives in (nothing for a cluster-scoped
//!   object);
//! - `mapBySelector`: every cached object of the controller's kind in the object's namespace
//!   whose `spec.selector` matches the object's labels, old and new ([`Owners::selecting`]):
//!   a PodDisruptionBudget for each change of a Pod it selects, its deletion included.
//! - `mapByName`: the object of the controller's kind with the same namespace and name (a
//!   Service for each change of its Endpoints);
//! - `mapByPlacement`: every cached object of the controller's kind, in any namespace, whose
//!   Pod template fits a Node differently before and after the Node's change
//!   ([`Mapper::keys_by_placement`], from the Node's JSON): the DaemonSets a Node's creation,
//!   deletion or new labels or taints concern, and no other.
//!
//! Predicates filter updates only; creations, deletions and resyncs always map. A rule's
//! batch period goes with each key it maps ([`KeySink`]).

use std::{collections::BTreeSet, sync::Arc, time::Duration};

pub use switchyard_work::WorkKey;

use crate::fields::FieldSelector;
use switchyard_selector::{
    Expression, Selector,
    placement::{Fit, Node, Placement},
};

use crate::{
    Config, ControllerRef, Predicate, Summary,
    config::{Gvk, RuleKind},
};

/// The controller owners of cached objects, for `owns` rules with `through`, and the cached
/// objects whose selectors match an object, for `owns` rules without (an orphan's owners)
/// and `mapBySelector` rules.
pub trait Owners {
    /// The controller owner of the object `namespace/name` of `resource` (an index into
    /// [`Config::resources`]), if it is cached and has one.
    fn controller(&self, resource: usize, namespace: &str, name: &str) -> Option<ControllerRef>;

    /// The names of the cached objects of `resource` in `namespace` whose `spec.selector`
    /// ([`owner_selector`]) matches `orphan`'s labels: the owners that may adopt it, or the
    /// objects that select it.
    fn selecting(&self, resource: usize, namespace: &str, orphan: &Summary) -> Vec<String> {
        let _ = (resource, namespace, orphan);
        Vec::new()
    }

    /// Calls `each` with the JSON of every cached object of `resource`, in every namespace:
    /// the objects a `mapByPlacement` rule weighs.
    fn each_object(&self, resource: usize, each: &mut dyn FnMut(&[u8])) {
        let _ = (resource, each);
    }
}

/// The selector of an owner that adopts by selector, from its JSON: `spec.selector` as a
/// `LabelSelector` (a ReplicaSet's, a Job's, a Deployment's) or as a plain map of labels (a
/// ReplicationController's). `None` for none, an empty one (it selects nothing to adopt, as
/// kube-controller-manager's controllers ignore it) or an invalid one.
pub fn owner_selector(object: &serde_json::Value) -> Option<Selector> {
    let selector = object.get("spec")?.get("selector")?.as_object()?;
    let strings = |value: &serde_json::Value| -> Option<Vec<(String, String)>> {
        value
            .as_object()?
            .iter()
            .map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect()
    };
    let selector =
        if selector.contains_key("matchLabels") || selector.contains_key("matchExpressions") {
            let labels = match selector.get("matchLabels") {
                Some(labels) => strings(labels)?,
                None => Vec::new(),
            };
            let expressions: Vec<(String, String, Vec<String>)> = selector
                .get("matchExpressions")
                .and_then(serde_json::Value::as_array)
                .into_iter()
                .flatten()
                .map(|e| {
                    Some((
                        e.get("key")?.as_str()?.to_owned(),
                        e.get("operator")?.as_str()?.to_owned(),
                        e.get("values")
                            .and_then(serde_json::Value::as_array)
                            .into_iter()
                            .flatten()
                            .map(|v| v.as_str().map(str::to_owned))
                            .collect::<Option<Vec<_>>>()?,
                    ))
                })
                .collect::<Option<_>>()?;
            Selector::from_label_selector(
                labels.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                expressions
                    .iter()
                    .map(|(key, operator, values)| Expression {
                        key,
                        operator,
                        values,
                    }),
            )
            .ok()?
        } else {
            Selector::from_labels(strings(&serde_json::Value::Object(selector.clone()))?)
        };
    (!selector.is_empty()).then_some(selector)
}

/// No cache: `through` rules map to nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoOwners;

impl Owners for NoOwners {
    fn controller(&self, _: usize, _: &str, _: &str) -> Option<ControllerRef> {
        None
    }
}

/// Where [`Mapper::keys`] puts the keys of a change, each with its rule's batch period.
pub trait KeySink {
    fn key(&mut self, key: WorkKey, batch_period: Option<Duration>);
}

/// Every key ready at once: what a resync or a relist keys is not a burst to batch.
impl KeySink for Vec<WorkKey> {
    fn key(&mut self, key: WorkKey, _: Option<Duration>) {
        self.push(key);
    }
}

/// Live events: each key with the delay its rule asks for.
impl KeySink for Vec<(WorkKey, Option<Duration>)> {
    fn key(&mut self, key: WorkKey, batch_period: Option<Duration>) {
        self.push((key, batch_period));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Added,
    Modified,
    Deleted,
    /// A resync: every rule maps, no predicate applies.
    Sync,
}

#[derive(Debug)]
struct Rule {
    controller: Arc<str>,
    kind: MapKind,
    predicates: Vec<Predicate>,
    batch_period: Option<Duration>,
    batch_status_only: bool,
    /// Only objects it matches key through the rule (the object after an update).
    selector: Option<Selector>,
    /// Only objects whose fields it matches key through the rule (the object after an
    /// update).
    fields: Option<FieldSelector>,
    /// The namespaces its keys may be in.
    scope: Scope,
}

impl Rule {
    /// Whether `object` (after an update) is one the rule's selectors admit.
    fn selects(&self, object: &Summary) -> bool {
        self.selector.as_ref().is_none_or(|s| s.matches(object))
            && self.fields.as_ref().is_none_or(|f| f.matches(object))
    }
}

/// The namespaces a controller works in.
#[derive(Debug)]
struct Scope {
    /// Sorted; empty: every namespace.
    namespaces: Vec<String>,
    /// The controller reconciles v1 Namespace: a key's name is the namespace scoped.
    of_namespaces: bool,
}

impl Scope {
    /// Whether the key (`namespace`, `name`) is in scope: any key when no namespace is
    /// named, one of a cluster-scoped object too, except a Namespace's for a controller of
    /// Namespaces.
    fn admits(&self, namespace: &str, name: &str) -> bool {
        if self.namespaces.is_empty() {
            return true;
        }
        let scoped = match (namespace.is_empty(), self.of_namespaces) {
            (false, _) => namespace,
            (true, true) => name,
            (true, false) => return true,
        };
        self.namespaces
            .binary_search_by(|n| n.as_str().cmp(scoped))
            .is_ok()
    }
}

#[derive(Debug)]
enum MapKind {
    For,
    Owns {
        group: String,
        kind: String,
        through: Option<Through>,
        /// The owner kind's cache, for orphans to adopt (`owns` without `through`).
        owner_resource: Option<usize>,
    },
    ByLabel {
        label: String,
    },
    ByNamespace,
    BySelector {
        /// The controller kind's cache, whose objects' selectors are matched.
        owner_resource: Option<usize>,
    },
    ByPlacement {
        /// The controller kind's cache, whose objects' Pod templates are placed.
        owner_resource: Option<usize>,
    },
    ByName,
}

/// The kind between an owned object and its owner's owner.
#[derive(Debug)]
struct Through {
    resource: usize,
    group: String,
    kind: String,
}

/// The rules of a configuration, grouped by resource.
#[derive(Debug)]
pub struct Mapper {
    by_resource: Vec<Vec<Rule>>,
    /// Per resource, the JSON pointers its rules' `fieldChanged` predicates name.
    fields: Vec<Vec<Arc<str>>>,
    /// Per resource, the field managers its rules' `notWrittenBy` predicates name.
    writers: Vec<Vec<Arc<str>>>,
    /// The namespace of a cluster-scoped key (`mapByNamespace` keys a Namespace), made once.
    cluster: Arc<str>,
}

impl Mapper {
    pub fn new(config: &Config) -> Self {
        let mut by_resource: Vec<Vec<Rule>> = config.resources.iter().map(|_| Vec::new()).collect();
        let mut names: Vec<Arc<str>> = Vec::new();
        for rule in &config.rules {
            let controller = match names.iter().find(|n| ***n == *rule.controller) {
                Some(name) => name.clone(),
                None => {
                    names.push(rule.controller.as_str().into());
                    names[names.len() - 1].clone()
                }
            };
            let kind = match &rule.kind {
                RuleKind::For => MapKind::For,
                RuleKind::Owns { owner, through } => {
                    let Gvk { group, kind, .. } = owner;
                    MapKind::Owns {
                        group: group.clone(),
                        kind: kind.clone(),
                        owner_resource: config
                            .resources
                            .iter()
                            .position(|r| r.gvk.group == *group && r.gvk.kind == *kind),
                        through: through.map(|resource| {
                            let via = &config.resources[resource].gvk;
                            Through {
                                resource,
                                group: via.group.clone(),
                                kind: via.kind.clone(),
                            }
                        }),
                    }
                }
                RuleKind::ByLabel { label } => MapKind::ByLabel {
                    label: label.clone(),
                },
                RuleKind::ByNamespace => MapKind::ByNamespace,
                RuleKind::BySelector { owner } => MapKind::BySelector {
                    owner_resource: resource_of(config, owner),
                },
                RuleKind::ByPlacement { owner } => MapKind::ByPlacement {
                    owner_resource: resource_of(config, owner),
                },
                RuleKind::ByName => MapKind::ByName,
            };
            by_resource[rule.resource].push(Rule {
                controller,
                kind,
                predicates: rule.predicates.clone(),
                batch_period: rule.batch_period,
                batch_status_only: rule.batch_status_only,
                // Checked when the configuration was.
                selector: rule
                    .label_selector
                    .as_deref()
                    .and_then(|s| Selector::parse(s).ok()),
                fields: rule
                    .field_selector
                    .as_deref()
                    .and_then(|s| FieldSelector::parse(s).ok()),
                scope: Scope {
                    namespaces: rule.namespaces.clone(),
                    of_namespaces: reconciles_namespaces(config, &rule.controller),
                },
            });
        }
        let fields = by_resource
            .iter()
            .map(|rules| {
                named(rules, |p| match p {
                    Predicate::FieldChanged(pointer) => Some(pointer),
                    _ => None,
                })
                .chain(
                    rules
                        .iter()
                        .filter_map(|rule| rule.fields.as_ref())
                        .flat_map(|f| f.pointers().cloned()),
                )
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect()
            })
            .collect();
        let writers = by_resource
            .iter()
            .map(|rules| {
                named(rules, |p| match p {
                    Predicate::NotWrittenBy(manager) => Some(manager),
                    _ => None,
                })
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect()
            })
            .collect();
        Self {
            by_resource,
            fields,
            writers,
            cluster: Arc::from(""),
        }
    }

    /// The field managers a summary of `resource` reads `managedFields` for
    /// ([`Summary::with_writers`]): those its rules' `notWrittenBy` predicates name.
    pub fn writers(&self, resource: usize) -> &[Arc<str>] {
        &self.writers[resource]
    }

    /// The JSON pointers whose values a summary of `resource` carries
    /// ([`Summary::with_fields`]): those its rules' `fieldChanged` predicates and field
    /// selectors name.
    pub fn fields(&self, resource: usize) -> &[Arc<str>] {
        &self.fields[resource]
    }

    /// Whether any rule maps events of `resource` (a cache-only resource has none).
    pub fn maps(&self, resource: usize) -> bool {
        !self.by_resource[resource].is_empty()
    }

    /// Whether a `mapByPlacement` rule maps events of `resource`: its changes are then
    /// passed to [`Mapper::keys_by_placement`] too, with the object's JSON before and after.
    pub fn places(&self, resource: usize) -> bool {
        self.by_resource[resource]
            .iter()
            .any(|r| matches!(r.kind, MapKind::ByPlacement { .. }))
    }

    /// Appends to `out` the keys `mapByPlacement` rules give a change of a Node of
    /// `resource`, from its JSON after the change (`new`; for a deletion, its last state)
    /// and before it (`old`, for `Modified`, when it was cached). Each cached object of the
    /// controller's kind whose Pod template fits the Node (`NodeShouldRunDaemonPod`):
    ///
    /// - a Node added: where a Pod should run;
    /// - a Node deleted: where a Pod may have run;
    /// - a Node changed: only when its labels or taints changed, where the fit changed
    ///   (kube-controller-manager's `updateNode`, then `syncNodeUpdate`, narrowed to the
    ///   DaemonSets whose answer moved);
    /// - a resync: nothing (each object is keyed by its own `for` rule).
    pub fn keys_by_placement(
        &self,
        resource: usize,
        event: EventKind,
        old: Option<&[u8]>,
        new: &[u8],
        owners: &dyn Owners,
        out: &mut dyn KeySink,
    ) {
        let parse = |json: &[u8]| {
            serde_json::from_slice::<serde_json::Value>(json)
                .ok()
                .map(|v| Node::from_json(&v))
        };
        let Ok(new_object) = serde_json::from_slice::<serde_json::Value>(new) else {
            return;
        };
        let new = Node::from_json(&new_object);
        let old = match event {
            EventKind::Modified => match old.and_then(parse) {
                Some(old) if old.same_placement(&new) => return,
                old => old,
            },
            EventKind::Sync => return,
            EventKind::Added | EventKind::Deleted => None,
        };
        let concerned = |fit_new: Fit, fit_old: Option<Fit>| match event {
            EventKind::Added => fit_new.should_run,
            EventKind::Deleted => fit_new.should_continue_running,
            // Not cached before: as an addition.
            EventKind::Modified => fit_old.map_or(fit_new.should_run, |o| o != fit_new),
            EventKind::Sync => false,
        };
        for rule in &self.by_resource[resource] {
            let MapKind::ByPlacement {
                owner_resource: Some(owner_resource),
            } = rule.kind
            else {
                continue;
            };
            if rule
                .selector
                .as_ref()
                .is_some_and(|s| !s.matches(&new.labels))
                || rule
                    .fields
                    .as_ref()
                    .is_some_and(|f| !f.matches_object(&new_object))
            {
                continue;
            }
            owners.each_object(owner_resource, &mut |json| {
                let Ok(owner) = serde_json::from_slice::<serde_json::Value>(json) else {
                    return;
                };
                let placement = Placement::from_pod_spec(
                    owner
                        .pointer("/spec/template/spec")
                        .unwrap_or(&serde_json::Value::Null),
                )
                .for_daemon();
                let fit_old = old.as_ref().map(|o| placement.daemon_fit(o));
                if !concerned(placement.daemon_fit(&new), fit_old) {
                    return;
                }
                let meta = &owner["metadata"];
                if let (Some(namespace), Some(name)) =
                    (meta["namespace"].as_str(), meta["name"].as_str())
                    && rule.scope.admits(namespace, name)
                {
                    out.key(
                        WorkKey {
                            controller: rule.controller.clone(),
                            namespace: namespace.into(),
                            name: name.into(),
                        },
                        rule.batch_period,
                    );
                }
            });
        }
    }

    /// Appends to `out` the keys caused by `event` on an object of `resource`. For
    /// `Modified`, `old` is the cached summary before the change (if it was cached).
    /// `owners` resolves the objects `through` rules pass.
    pub fn keys(
        &self,
        resource: usize,
        event: EventKind,
        old: Option<&Summary>,
        new: &Summary,
        owners: &dyn Owners,
        out: &mut dyn KeySink,
    ) {
        for rule in &self.by_resource[resource] {
            if event == EventKind::Modified
                && let Some(old) = old
                && !passes(&rule.predicates, old, new)
            {
                continue;
            }
            if !rule.selects(new) {
                continue;
            }
            let old = if event == EventKind::Modified {
                old
            } else {
                None
            };
            // A status update (the generation kept) waits; anything else is ready at once.
            let batch_period = match old {
                Some(old) if rule.batch_status_only && old.generation != new.generation => None,
                None if rule.batch_status_only => None,
                _ => rule.batch_period,
            };
            let mut push = |namespace: &Arc<str>, name: &str| {
                if !rule.scope.admits(namespace, name) {
                    return;
                }
                let key = WorkKey {
                    controller: rule.controller.clone(),
                    namespace: namespace.clone(),
                    name: name.into(),
                };
                out.key(key, batch_period);
            };
            match &rule.kind {
                MapKind::For => push(&new.namespace, &new.name),
                MapKind::Owns {
                    group,
                    kind,
                    through,
                    owner_resource,
                } => {
                    let owner = |s: &Summary| -> Option<String> {
                        let controller = s.controller.as_deref()?;
                        let controller = match through {
                            None => controller.clone(),
                            Some(via) => {
                                if controller.kind != via.kind || controller.group() != via.group {
                                    return None;
                                }
                                owners.controller(via.resource, &s.namespace, &controller.name)?
                            }
                        };
                        (controller.kind == *kind && controller.group() == group)
                            .then_some(controller.name)
                    };
                    let now = owner(new);
                    if let Some(name) = &now {
                        push(&new.namespace, name);
                    }
                    if let Some(before) = old.and_then(owner)
                        && Some(&before) != now.as_ref()
                    {
                        push(&new.namespace, &before);
                    }
                    // An orphan, new or just released or relabelled, keys every owner whose
                    // selector matches it, to adopt it (kube-controller-manager's addPod and
                    // updatePod). Not on a resync, where the owners key themselves.
                    let orphaned = new.controller.is_none()
                        && match event {
                            EventKind::Added => true,
                            EventKind::Modified => old.is_none_or(|old| {
                                old.controller.is_some() || old.labels != new.labels
                            }),
                            EventKind::Deleted | EventKind::Sync => false,
                        };
                    if let (true, None, Some(resource)) = (orphaned, through, owner_resource) {
                        for name in owners.selecting(*resource, &new.namespace, new) {
                            push(&new.namespace, &name);
                        }
                    }
                }
                MapKind::ByLabel { label } => {
                    let now = new.label(label).filter(|v| !v.is_empty());
                    if let Some(name) = now {
                        push(&new.namespace, name);
                    }
                    if let Some(before) = old.and_then(|o| o.label(label)).filter(|v| !v.is_empty())
                        && Some(before) != now
                    {
                        push(&new.namespace, before);
                    }
                }
                MapKind::ByNamespace => {
                    if !new.namespace.is_empty() {
                        push(&self.cluster, &new.namespace);
                    }
                }
                MapKind::ByName => push(&new.namespace, &new.name),
                // Weighed from the objects' JSON, in `keys_by_placement`.
                MapKind::ByPlacement { .. } => {}
                MapKind::BySelector { owner_resource } => {
                    let Some(resource) = owner_resource else {
                        continue;
                    };
                    let now = owners.selecting(*resource, &new.namespace, new);
                    for name in &now {
                        push(&new.namespace, name);
                    }
                    if let Some(old) = old.filter(|old| old.labels != new.labels) {
                        for name in owners.selecting(*resource, &old.namespace, old) {
                            if !now.contains(&name) {
                                push(&new.namespace, &name);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// What `pick` takes from the predicates of `rules`.
fn named<'r>(
    rules: &'r [Rule],
    pick: impl Fn(&'r Predicate) -> Option<&'r String> + 'r,
) -> impl Iterator<Item = Arc<str>> + 'r {
    rules
        .iter()
        .flat_map(|rule| &rule.predicates)
        .filter_map(move |p| pick(p).map(|name| Arc::from(name.as_str())))
}

/// Whether `controller` reconciles v1 Namespace (its `for` rule's kind).
fn reconciles_namespaces(config: &Config, controller: &str) -> bool {
    config.rules.iter().any(|rule| {
        let gvk = &config.resources[rule.resource].gvk;
        rule.controller == controller
            && rule.kind == RuleKind::For
            && gvk.group.is_empty()
            && gvk.kind == "Namespace"
    })
}

/// The index of the resource `gvk` names, in any version.
fn resource_of(config: &Config, gvk: &Gvk) -> Option<usize> {
    config
        .resources
        .iter()
        .position(|r| r.gvk.group == gvk.group && r.gvk.kind == gvk.kind)
}

/// An update passes when no predicate is set or any one holds.
fn passes(predicates: &[Predicate], old: &Summary, new: &Summary) -> bool {
    predicates.is_empty()
        || predicates.iter().any(|p| match p {
            Predicate::GenerationChanged => old.generation != new.generation,
            Predicate::LabelsChanged => old.labels != new.labels,
            Predicate::AnnotationsChanged => old.annotations_hash != new.annotations_hash,
            // A hash not taken (the object cached before the rule came) counts as changed.
            Predicate::FieldChanged(pointer) => match (old.field(pointer), new.field(pointer)) {
                (Some(before), Some(after)) => before != after,
                _ => true,
            },
            // Not read (the object cached before the rule came): as another's write.
            Predicate::NotWrittenBy(manager) => {
                match (old.writers(manager), new.writers(manager)) {
                    (Some(before), Some(after)) => !after.written_by_own(&before),
                    _ => true,
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ControllerRef;

    const CONFIG: &str = r#"
controllers:
  - name: apps/v1/ReplicaSet
    for: {apiVersion: apps/v1, kind: ReplicaSet, predicates: [generationChanged, labelsChanged]}
    owns:
      - {apiVersion: v1, kind: Pod}
  - name: example.com/v1/Widget
    for: {apiVersion: example.com/v1, kind: Widget}
    mapByLabel:
      - {apiVersion: v1, kind: ConfigMap, label: example.com/widget}
"#;
    const POD: usize = 1;
    const RS: usize = 0;
    const CM: usize = 3;

    fn owned_by(kind: &str, api_version: &str, name: &str) -> Option<ControllerRef> {
        Some(ControllerRef {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        })
    }

    fn mk(
        name: &str,
        generation: i64,
        labels: &[(&str, &str)],
        owner: Option<ControllerRef>,
    ) -> Summary {
        Summary::new(
            "ns",
            name,
            "1",
            Some(generation),
            labels.iter().copied(),
            [],
            owner,
        )
    }

    fn keys(
        resource: usize,
        event: EventKind,
        old: Option<&Summary>,
        new: &Summary,
    ) -> Vec<String> {
        let config = Config::from_yaml(CONFIG).unwrap();
        assert_eq!(config.resources[POD].gvk.kind, "Pod");
        assert_eq!(config.resources[CM].gvk.kind, "ConfigMap");
        keys_of(&config, resource, event, old, new)
    }

    /// The keys as `controller namespace/name`, with ` after <period>` when batched.
    fn keys_of(
        config: &Config,
        resource: usize,
        event: EventKind,
        old: Option<&Summary>,
        new: &Summary,
    ) -> Vec<String> {
        let mut out: Vec<(WorkKey, Option<Duration>)> = Vec::new();
        Mapper::new(config).keys(resource, event, old, new, &NoOwners, &mut out);
        out.iter()
            .map(|(k, batch)| {
                let after = batch
                    .map(|b| format!(" after {}", humantime::format_duration(b)))
                    .unwrap_or_default();
                format!("{} {}/{}{after}", k.controller, k.namespace, k.name)
            })
            .collect()
    }

    #[test]
    fn a_pod_maps_to_its_controller_replicaset_only() {
        let pod = mk("p", 0, &[], owned_by("ReplicaSet", "apps/v1", "rs1"));
        assert_eq!(
            keys(POD, EventKind::Added, None, &pod),
            ["apps/v1/ReplicaSet ns/rs1"]
        );
        assert_eq!(
            keys(POD, EventKind::Deleted, None, &pod),
            ["apps/v1/ReplicaSet ns/rs1"]
        );
        let orphan = mk("p", 0, &[], None);
        assert!(keys(POD, EventKind::Added, None, &orphan).is_empty());
        let wrong_kind = mk("p", 0, &[], owned_by("StatefulSet", "apps/v1", "s"));
        assert!(keys(POD, EventKind::Added, None, &wrong_kind).is_empty());
        let wrong_group = mk("p", 0, &[], owned_by("ReplicaSet", "example.com/v1", "s"));
        assert!(keys(POD, EventKind::Added, None, &wrong_group).is_empty());
    }

    #[test]
    fn a_label_selector_keys_only_the_objects_it_matches_after_the_change() {
        let config = Config::from_yaml(
            r#"
controllers:
  - name: example.com/v1/Widget
    for: {apiVersion: example.com/v1, kind: Widget, labelSelector: "tier in (web,api),!legacy"}
    owns:
      - {apiVersion: v1, kind: Pod, labelSelector: "managed=yes"}
"#,
        )
        .unwrap();
        let (widget, pod) = (0, 1);
        let web = mk("w", 1, &[("tier", "web")], None);
        let legacy = mk("w", 1, &[("tier", "web"), ("legacy", "")], None);
        let db = mk("w", 1, &[("tier", "db")], None);
        assert_eq!(
            keys_of(&config, widget, EventKind::Added, None, &web),
            ["example.com/v1/Widget ns/w"]
        );
        assert!(keys_of(&config, widget, EventKind::Added, None, &legacy).is_empty());
        assert!(keys_of(&config, widget, EventKind::Sync, None, &db).is_empty());
        // An update keys by the object after it, as controller-runtime's predicate does.
        assert!(keys_of(&config, widget, EventKind::Modified, Some(&web), &db).is_empty());
        assert_eq!(
            keys_of(&config, widget, EventKind::Modified, Some(&db), &web),
            ["example.com/v1/Widget ns/w"]
        );
        let owner = owned_by("Widget", "example.com/v1", "w");
        let managed = mk("p", 0, &[("managed", "yes")], owner.clone());
        let unmanaged = mk("p", 0, &[], owner);
        assert_eq!(
            keys_of(&config, pod, EventKind::Deleted, None, &managed),
            ["example.com/v1/Widget ns/w"]
        );
        assert!(keys_of(&config, pod, EventKind::Deleted, None, &unmanaged).is_empty());
    }

    #[test]
    fn a_field_predicate_keys_when_the_value_at_its_pointer_changes() {
        let config = Config::from_yaml(
            r#"
controllers:
  - name: example.com/v1/Widget
    for:
      apiVersion: example.com/v1
      kind: Widget
      predicates: [labelsChanged, {fieldChanged: /status/phase}]
"#,
        )
        .unwrap();
        let mapper = Mapper::new(&config);
        assert_eq!(mapper.fields(0), [Arc::from("/status/phase")]);
        let with = |labels: &[(&str, &str)], object: serde_json::Value| {
            mk("w", 1, labels, None).with_fields(mapper.fields(0), &object)
        };
        let pending = with(
            &[],
            serde_json::json!({"status": {"phase": "Pending", "n": 1}}),
        );
        let key = ["example.com/v1/Widget ns/w"];
        let update =
            |old: &Summary, new: &Summary| keys_of(&config, 0, EventKind::Modified, Some(old), new);
        let running = with(
            &[],
            serde_json::json!({"status": {"phase": "Running", "n": 1}}),
        );
        assert_eq!(update(&pending, &running), key);
        // Another field of the status: nothing.
        let counted = with(
            &[],
            serde_json::json!({"status": {"phase": "Pending", "n": 2}}),
        );
        assert!(update(&pending, &counted).is_empty());
        // The value gone, or come: keyed.
        let gone = with(&[], serde_json::json!({"status": {}}));
        assert_eq!(update(&pending, &gone), key);
        assert_eq!(update(&gone, &pending), key);
        // The other predicate still keys alone.
        let labelled = with(
            &[("a", "b")],
            serde_json::json!({"status": {"phase": "Pending"}}),
        );
        assert_eq!(update(&pending, &labelled), key);
        // An object cached before the rule came carries no hash: keyed.
        assert_eq!(update(&mk("w", 1, &[], None), &pending), key);

        let error = Config::from_yaml(
            "controllers: [{name: w, for: {apiVersion: v1, kind: Pod, predicates: [{fieldChanged: status}]}}]",
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains(
                "controllers[0].for.predicates[0]: fieldChanged \"status\" is not a JSON pointer"
            ),
            "{error}"
        );
    }

    #[test]
    fn a_not_written_by_predicate_keys_every_update_but_the_manager_s_own_write() {
        let config = Config::from_yaml(
            r#"
controllers:
  - name: example.com/v1/Widget
    for: {apiVersion: example.com/v1, kind: Widget}
    mapByLabel:
      - apiVersion: v1
        kind: ConfigMap
        label: example.com/widget
        predicates: [{notWrittenBy: widgets}]
"#,
        )
        .unwrap();
        let mapper = Mapper::new(&config);
        assert_eq!(mapper.writers(1), [Arc::from("widgets")]);
        assert!(mapper.writers(0).is_empty());
        let entry = |manager: &str, time: &str, fields: &[&str]| {
            let fields: serde_json::Map<String, serde_json::Value> = fields
                .iter()
                .map(|f| (format!("f:{f}"), serde_json::json!({})))
                .collect();
            serde_json::json!({"manager": manager, "operation": "Update", "apiVersion": "v1",
                               "time": time, "fieldsType": "FieldsV1", "fieldsV1": {"f:data": fields}})
        };
        let with = |entries: &[serde_json::Value]| {
            mk("cm", 0, &[("example.com/widget", "w")], None)
                .with_writers(mapper.writers(1), entries)
        };
        let key = ["example.com/v1/Widget ns/w"];
        let update =
            |old: &Summary, new: &Summary| keys_of(&config, 1, EventKind::Modified, Some(old), new);
        let user = entry("kubectl-edit", "2026-11-30T10:00:00Z", &["a"]);
        let before = with(&[
            user.clone(),
            entry("widgets", "2026-11-30T10:00:05Z", &["b"]),
        ]);

        // The manager's own write: its entry stamped anew, the others' as they were.
        let own = with(&[
            user.clone(),
            entry("widgets", "2026-11-30T10:00:09Z", &["b", "c"]),
        ]);
        assert!(update(&before, &own).is_empty());

        // Another manager's write: its entry changed (a new time, or fields taken).
        let other = with(&[
            entry("kubectl-edit", "2026-11-30T10:00:09Z", &["a"]),
            entry("widgets", "2026-11-30T10:00:05Z", &["b"]),
        ]);
        assert_eq!(update(&before, &other), key);
        // ... in the same second as its last, taking a field of the manager's.
        let taken = with(&[
            entry("kubectl-edit", "2026-11-30T10:00:00Z", &["a", "b"]),
            entry("widgets", "2026-11-30T10:00:05Z", &[]),
        ]);
        assert_eq!(update(&before, &taken), key);
        // ... taking every field of the manager's, so that its entry goes.
        let all_taken = with(&[entry("kubectl-edit", "2026-11-30T10:00:09Z", &["a", "b"])]);
        assert_eq!(update(&before, &all_taken), key);
        // ... in the same second as its last, to fields it alone owned: no entry changed.
        assert_eq!(update(&before, &before), key);
        // A third manager come: keyed.
        let third = with(&[
            user.clone(),
            entry("widgets", "2026-11-30T10:00:09Z", &["b"]),
            entry("helm", "2026-11-30T10:00:09Z", &["c"]),
        ]);
        assert_eq!(update(&before, &third), key);
        // An object cached before the rule came was not read: keyed.
        assert_eq!(
            update(&mk("cm", 0, &[("example.com/widget", "w")], None), &own),
            key
        );
        // Creations always key.
        assert_eq!(keys_of(&config, 1, EventKind::Added, None, &own), key);

        for (predicate, problem) in [
            ("{notWrittenBy: ''}", "notWrittenBy names no field manager"),
            (
                &format!("{{notWrittenBy: {}}}", "m".repeat(129)),
                "notWrittenBy is 129 bytes; a field manager is at most 128",
            ),
        ] {
            let error = Config::from_yaml(&format!(
                "controllers: [{{name: w, for: {{apiVersion: v1, kind: Pod, predicates: [{predicate}]}}}}]"
            ))
            .unwrap_err()
            .to_string();
            assert!(
                error.contains(&format!("controllers[0].for.predicates[0]: {problem}")),
                "{error}"
            );
        }
        let error = Config::from_yaml(
            "controllers: [{name: w, for: {apiVersion: v1, kind: Pod, \
             predicates: [{notWrittenBy: a}, {notWrittenBy: b}]}}]",
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("controllers[0].for.predicates: 2 notWrittenBy predicates; at most one"),
            "{error}"
        );
    }

    #[test]
    fn a_controller_scoped_to_namespaces_is_keyed_in_them_only() {
        let config = Config::from_yaml(
            r#"
controllers:
  - name: example.com/v1/Widget
    for: {apiVersion: example.com/v1, kind: Widget}
    namespaces: [team-b, ns]
    owns:
      - {apiVersion: v1, kind: Pod}
  - name: v1/Namespace
    for: {apiVersion: v1, kind: Namespace}
    namespaces: [ns]
    mapByNamespace:
      - {apiVersion: v1, kind: Secret}
"#,
        )
        .unwrap();
        let (widget, pod, namespace, secret) = (0, 1, 2, 3);
        let elsewhere =
            |name: &str, owner| Summary::new("team-a", name, "1", Some(1), [], [], owner);
        let owner = owned_by("Widget", "example.com/v1", "w");
        assert_eq!(
            keys_of(
                &config,
                widget,
                EventKind::Added,
                None,
                &mk("w", 1, &[], None)
            ),
            ["example.com/v1/Widget ns/w"]
        );
        assert_eq!(
            keys_of(
                &config,
                pod,
                EventKind::Deleted,
                None,
                &mk("p", 0, &[], owner.clone())
            ),
            ["example.com/v1/Widget ns/w"]
        );
        assert!(
            keys_of(
                &config,
                widget,
                EventKind::Sync,
                None,
                &elsewhere("w", None)
            )
            .is_empty()
        );
        assert!(keys_of(&config, pod, EventKind::Added, None, &elsewhere("p", owner)).is_empty());
        // A controller of Namespaces: only the Namespaces named, by their own key or by
        // what lives in them.
        let ns = |name: &str| Summary::new("", name, "1", None, [], [], None);
        assert_eq!(
            keys_of(&config, namespace, EventKind::Added, None, &ns("ns")),
            ["v1/Namespace /ns"]
        );
        assert!(keys_of(&config, namespace, EventKind::Added, None, &ns("team-a")).is_empty());
        assert_eq!(
            keys_of(
                &config,
                secret,
                EventKind::Deleted,
                None,
                &mk("s", 0, &[], None)
            ),
            ["v1/Namespace /ns"]
        );
        assert!(
            keys_of(
                &config,
                secret,
                EventKind::Deleted,
                None,
                &elsewhere("s", None)
            )
            .is_empty()
        );
    }

    #[test]
    fn a_batched_rule_delays_its_keys_only() {
        let config = Config::from_yaml(
            r#"
controllers:
  - name: apps/v1/ReplicaSet
    for: {apiVersion: apps/v1, kind: ReplicaSet}
    owns:
      - {apiVersion: v1, kind: Pod, batchPeriod: 250ms}
"#,
        )
        .unwrap();
        let (rs, pod) = (0, 1);
        let p = mk("p", 0, &[], owned_by("ReplicaSet", "apps/v1", "rs1"));
        assert_eq!(
            keys_of(&config, pod, EventKind::Modified, Some(&p), &p),
            ["apps/v1/ReplicaSet ns/rs1 after 250ms"]
        );
        let r = mk("rs1", 1, &[], None);
        assert_eq!(
            keys_of(&config, rs, EventKind::Modified, Some(&r), &r),
            ["apps/v1/ReplicaSet ns/rs1"]
        );
        let mut resync: Vec<WorkKey> = Vec::new();
        Mapper::new(&config).keys(pod, EventKind::Sync, None, &p, &NoOwners, &mut resync);
        assert_eq!(resync.len(), 1, "a plain sink takes batched keys at once");
    }

    #[test]
    fn a_rule_batching_status_updates_only_keys_the_rest_at_once() {
        let config = Config::from_yaml(
            r#"
controllers:
  - name: batch/v1/Job
    for: {apiVersion: batch/v1, kind: Job, batchPeriod: 1s, batchStatusUpdatesOnly: true}
"#,
        )
        .unwrap();
        let (old, status, spec) = (
            mk("j", 1, &[], None),
            mk("j", 1, &[], None),
            mk("j", 2, &[], None),
        );
        let job = 0;
        assert_eq!(
            keys_of(&config, job, EventKind::Modified, Some(&old), &status),
            ["batch/v1/Job ns/j after 1s"],
            "a status update waits"
        );
        assert_eq!(
            keys_of(&config, job, EventKind::Modified, Some(&old), &spec),
            ["batch/v1/Job ns/j"],
            "a spec change does not"
        );
        assert_eq!(
            keys_of(&config, job, EventKind::Added, None, &old),
            ["batch/v1/Job ns/j"]
        );
        assert_eq!(
            keys_of(&config, job, EventKind::Deleted, None, &old),
            ["batch/v1/Job ns/j"]
        );
        assert_eq!(
            keys_of(&config, job, EventKind::Modified, None, &status),
            ["batch/v1/Job ns/j"],
            "an update of an object not cached before is not known to keep its generation"
        );
    }

    #[test]
    fn a_changed_controller_keys_both_owners() {
        let old = mk("p", 0, &[], owned_by("ReplicaSet", "apps/v1", "rs1"));
        let new = mk("p", 0, &[], owned_by("ReplicaSet", "apps/v1", "rs2"));
        assert_eq!(
            keys(POD, EventKind::Modified, Some(&old), &new),
            ["apps/v1/ReplicaSet ns/rs2", "apps/v1/ReplicaSet ns/rs1"]
        );
        let released = mk("p", 0, &[], None);
        assert_eq!(
            keys(POD, EventKind::Modified, Some(&old), &released),
            ["apps/v1/ReplicaSet ns/rs1"]
        );
    }

    #[test]
    fn predicates_filter_updates_but_not_creations_or_resyncs() {
        let old = mk("rs", 1, &[("a", "1")], None);
        let status_only = mk("rs", 1, &[("a", "1")], None);
        assert!(keys(RS, EventKind::Modified, Some(&old), &status_only).is_empty());
        assert_eq!(
            keys(RS, EventKind::Sync, None, &status_only),
            ["apps/v1/ReplicaSet ns/rs"]
        );
        assert_eq!(
            keys(RS, EventKind::Added, None, &status_only),
            ["apps/v1/ReplicaSet ns/rs"]
        );
        let spec = mk("rs", 2, &[("a", "1")], None);
        assert_eq!(
            keys(RS, EventKind::Modified, Some(&old), &spec),
            ["apps/v1/ReplicaSet ns/rs"]
        );
        let relabelled = mk("rs", 1, &[("a", "2")], None);
        assert_eq!(
            keys(RS, EventKind::Modified, Some(&old), &relabelled),
            ["apps/v1/ReplicaSet ns/rs"]
        );
    }

    #[test]
    fn label_mapping_keys_the_named_object_and_the_previous_one() {
        let cm = mk("cm", 0, &[("example.com/widget", "w1")], None);
        assert_eq!(
            keys(CM, EventKind::Added, None, &cm),
            ["example.com/v1/Widget ns/w1"]
        );
        let moved = mk("cm", 0, &[("example.com/widget", "w2")], None);
        assert_eq!(
            keys(CM, EventKind::Modified, Some(&cm), &moved),
            ["example.com/v1/Widget ns/w2", "example.com/v1/Widget ns/w1"]
        );
        let unlabelled = mk("cm", 0, &[], None);
        assert!(keys(CM, EventKind::Added, None, &unlabelled).is_empty());
    }

    /// ReplicaSets `web` (selecting `app=web`) and `api` (`app=api`) in namespace `ns`.
    struct Selecting;

    impl Owners for Selecting {
        fn controller(&self, _: usize, _: &str, _: &str) -> Option<ControllerRef> {
            None
        }

        fn selecting(&self, resource: usize, namespace: &str, orphan: &Summary) -> Vec<String> {
            assert_eq!((resource, namespace), (RS, "ns"), "the ReplicaSet cache");
            [("web", "app=web"), ("api", "app=api")]
                .into_iter()
                .filter(|(_, selector)| {
                    switchyard_selector::Selector::parse(selector)
                        .unwrap()
                        .matches(orphan)
                })
                .map(|(name, _)| name.to_owned())
                .collect()
        }
    }

    #[test]
    fn an_orphan_keys_the_owners_whose_selector_matches_it() {
        let config = Config::from_yaml(CONFIG).unwrap();
        let mapper = Mapper::new(&config);
        let keys = |event, old: Option<&Summary>, new: &Summary| {
            let mut out: Vec<WorkKey> = Vec::new();
            mapper.keys(POD, event, old, new, &Selecting, &mut out);
            out.iter().map(|k| k.name.to_string()).collect::<Vec<_>>()
        };
        let orphan = mk("p", 0, &[("app", "web")], None);
        assert_eq!(keys(EventKind::Added, None, &orphan), ["web"]);
        // Relabelled to another owner's selector; released by its owner; unchanged.
        let moved = mk("p", 0, &[("app", "api")], None);
        assert_eq!(keys(EventKind::Modified, Some(&orphan), &moved), ["api"]);
        let owned = mk(
            "p",
            0,
            &[("app", "web")],
            owned_by("ReplicaSet", "apps/v1", "web"),
        );
        assert_eq!(
            keys(EventKind::Modified, Some(&owned), &orphan),
            ["web", "web"]
        );
        assert!(keys(EventKind::Modified, Some(&orphan), &orphan).is_empty());
        // Neither a deletion nor a resync adopts; an owned Pod keys its owner only.
        assert!(keys(EventKind::Deleted, None, &orphan).is_empty());
        assert!(keys(EventKind::Sync, None, &orphan).is_empty());
        assert_eq!(keys(EventKind::Added, None, &owned), ["web"]);
        let stranger = mk("q", 0, &[("app", "db")], None);
        assert!(keys(EventKind::Added, None, &stranger).is_empty());
    }

    /// PodDisruptionBudgets `web` (selecting `app=web`) and `all-web` (`app in (web, api)`).
    struct Budgets(usize);

    impl Owners for Budgets {
        fn controller(&self, _: usize, _: &str, _: &str) -> Option<ControllerRef> {
            None
        }

        fn selecting(&self, resource: usize, namespace: &str, object: &Summary) -> Vec<String> {
            assert_eq!((resource, namespace), (self.0, "ns"), "the budgets' cache");
            [("web", "app=web"), ("all-web", "app in (web,api)")]
                .into_iter()
                .filter(|(_, selector)| {
                    switchyard_selector::Selector::parse(selector)
                        .unwrap()
                        .matches(object)
                })
                .map(|(name, _)| name.to_owned())
                .collect()
        }
    }

    #[test]
    fn a_selector_mapping_keys_every_object_selecting_the_old_or_new_labels() {
        let config = Config::from_yaml(
            r#"
controllers:
  - name: policy/v1/PodDisruptionBudget
    for: {apiVersion: policy/v1, kind: PodDisruptionBudget}
    mapBySelector:
      - {apiVersion: v1, kind: Pod}
"#,
        )
        .unwrap();
        let index = |kind: &str| {
            config
                .resources
                .iter()
                .position(|r| r.gvk.kind == kind)
                .unwrap()
        };
        let (budgets, pods) = (index("PodDisruptionBudget"), index("Pod"));
        let mapper = Mapper::new(&config);
        let keys = |event, old: Option<&Summary>, new: &Summary| {
            let mut out: Vec<WorkKey> = Vec::new();
            mapper.keys(pods, event, old, new, &Budgets(budgets), &mut out);
            let mut names: Vec<String> = out.iter().map(|k| k.name.to_string()).collect();
            names.sort();
            names
        };
        let owner = owned_by("ReplicaSet", "apps/v1", "rs");
        let web = mk("p", 0, &[("app", "web")], owner.clone());
        // Owned or not, every event, deletion and resync included.
        for event in [
            EventKind::Added,
            EventKind::Deleted,
            EventKind::Sync,
            EventKind::Modified,
        ] {
            assert_eq!(keys(event, None, &web), ["all-web", "web"], "{event:?}");
        }
        // Relabelled: the budgets of the old labels too, each once.
        let api = mk("p", 0, &[("app", "api")], owner.clone());
        assert_eq!(
            keys(EventKind::Modified, Some(&web), &api),
            ["all-web", "web"]
        );
        let db = mk("p", 0, &[("app", "db")], owner);
        assert!(keys(EventKind::Added, None, &db).is_empty());
        // Its for kind still keys itself.
        let mut out: Vec<WorkKey> = Vec::new();
        mapper.keys(
            budgets,
            EventKind::Added,
            None,
            &mk("web", 1, &[], None),
            &Budgets(budgets),
            &mut out,
        );
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn a_selector_mapping_through_an_owner_is_refused() {
        let error = Config::from_yaml(
            r#"
controllers:
  - name: policy/v1/PodDisruptionBudget
    for: {apiVersion: policy/v1, kind: PodDisruptionBudget}
    mapBySelector:
      - {apiVersion: v1, kind: Pod, through: {apiVersion: apps/v1, kind: ReplicaSet}}
"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.starts_with("controllers[0].mapBySelector[0].through: only an owns entry"),
            "{error}"
        );
    }

    #[test]
    fn an_owner_selector_is_a_label_selector_or_a_map() {
        use serde_json::json;
        let of = |object: serde_json::Value| owner_selector(&object).map(|s| s.to_string());
        assert_eq!(
            of(
                json!({"spec": {"selector": {"matchLabels": {"app": "web"}, "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["a", "b"]}
                ]}}})
            ),
            Some("app=web,tier in (a,b)".to_owned())
        );
        // A ReplicationController's.
        assert_eq!(
            of(json!({"spec": {"selector": {"app": "web"}}})),
            Some("app=web".to_owned())
        );
        // None, empty or invalid: nothing to adopt with.
        assert_eq!(of(json!({"spec": {}})), None);
        assert_eq!(of(json!({"spec": {"selector": {}}})), None);
        assert_eq!(of(json!({"spec": {"selector": {"matchLabels": {}}}})), None);
        assert_eq!(
            of(
                json!({"spec": {"selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}})
            ),
            None
        );
    }

    /// A cache of ReplicaSets: `rs1` belongs to Deployment `d1`, `rs2` to `d2`, `orphan` to none.
    struct Cached;

    impl Owners for Cached {
        fn controller(
            &self,
            resource: usize,
            namespace: &str,
            name: &str,
        ) -> Option<ControllerRef> {
            assert_eq!(
                (resource, namespace),
                (1, "ns"),
                "looked up in the ReplicaSet cache"
            );
            match name {
                "rs1" => owned_by("Deployment", "apps/v1", "d1"),
                "rs2" => owned_by("Deployment", "apps/v1", "d2"),
                _ => None,
            }
        }
    }

    #[test]
    fn owns_through_keys_the_owner_of_the_owner() {
        let config = Config::from_yaml(
            r#"
controllers:
  - name: apps/v1/Deployment
    for: {apiVersion: apps/v1, kind: Deployment}
    owns:
      - {apiVersion: v1, kind: Pod, through: {apiVersion: apps/v1, kind: ReplicaSet}, predicates: [labelsChanged]}
"#,
        )
        .unwrap();
        let pod_resource = 2;
        assert_eq!(config.resources[pod_resource].gvk.kind, "Pod");
        let mapper = Mapper::new(&config);
        let keys = |event, old: Option<&Summary>, new: &Summary| {
            let mut out: Vec<WorkKey> = Vec::new();
            mapper.keys(pod_resource, event, old, new, &Cached, &mut out);
            out.iter()
                .map(|k| format!("{} {}/{}", k.controller, k.namespace, k.name))
                .collect::<Vec<_>>()
        };
        let pod = mk("p", 0, &[], owned_by("ReplicaSet", "apps/v1", "rs1"));
        assert_eq!(
            keys(EventKind::Deleted, None, &pod),
            ["apps/v1/Deployment ns/d1"]
        );
        assert_eq!(
            keys(EventKind::Added, None, &pod),
            ["apps/v1/Deployment ns/d1"]
        );
        let orphan_rs = mk("p", 0, &[], owned_by("ReplicaSet", "apps/v1", "orphan"));
        assert!(keys(EventKind::Deleted, None, &orphan_rs).is_empty());
        let not_cached = mk("p", 0, &[], owned_by("ReplicaSet", "apps/v1", "gone"));
        assert!(keys(EventKind::Deleted, None, &not_cached).is_empty());
        let other_kind = mk("p", 0, &[], owned_by("StatefulSet", "apps/v1", "rs1"));
        assert!(keys(EventKind::Deleted, None, &other_kind).is_empty());
        // A status change fails the predicate; a move to another ReplicaSet keys both.
        let relabelled = mk(
            "p",
            0,
            &[("a", "b")],
            owned_by("ReplicaSet", "apps/v1", "rs2"),
        );
        assert!(keys(EventKind::Modified, Some(&pod), &pod).is_empty());
        assert_eq!(
            keys(EventKind::Modified, Some(&pod), &relabelled),
            ["apps/v1/Deployment ns/d2", "apps/v1/Deployment ns/d1"]
        );
    }

    #[test]
    fn namespace_mapping_keys_the_namespace_an_object_lives_in() {
        let config = Config::from_yaml(
            r#"
controllers:
  - name: serviceaccount
    for: {apiVersion: v1, kind: Namespace}
    mapByNamespace:
      - {apiVersion: v1, kind: ServiceAccount, predicates: [labelsChanged]}
"#,
        )
        .unwrap();
        let account = 1;
        assert_eq!(config.resources[account].gvk.kind, "ServiceAccount");
        let default = mk("default", 0, &[], None);
        // Its deletion keys the namespace, cluster-scoped: the account is made again.
        assert_eq!(
            keys_of(&config, account, EventKind::Deleted, None, &default),
            ["serviceaccount /ns"]
        );
        // Predicates filter updates as for any rule.
        assert!(
            keys_of(
                &config,
                account,
                EventKind::Modified,
                Some(&default),
                &default
            )
            .is_empty()
        );
        // A cluster-scoped object lives in no namespace.
        let cluster_scoped = Summary::new("", "x", "1", None, [], [], None);
        assert!(keys_of(&config, account, EventKind::Deleted, None, &cluster_scoped).is_empty());
        // The namespace's own key is the Namespace's.
        let namespace = Summary::new("", "ns", "1", None, [], [], None);
        assert_eq!(
            keys_of(&config, 0, EventKind::Added, None, &namespace),
            ["serviceaccount /ns"]
        );

        let error = Config::from_yaml(
            r#"
controllers:
  - name: example.com/v1/Widget
    for: {apiVersion: example.com/v1, kind: Widget}
    mapByNamespace:
      - {apiVersion: v1, kind: ConfigMap}
"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.starts_with("controllers[0].mapByNamespace[0]: maps to the object's Namespace, so for must be v1/Namespace"),
            "{error}"
        );
    }

    #[test]
    fn name_mapping_keys_the_object_of_the_same_namespace_and_name() {
        let config = Config::from_yaml(
            r#"
controllers:
  - name: endpoints
    for: {apiVersion: v1, kind: Service}
    mapByName:
      - {apiVersion: v1, kind: Endpoints, predicates: [labelsChanged]}
"#,
        )
        .unwrap();
        let endpoints = 1;
        assert_eq!(config.resources[endpoints].gvk.kind, "Endpoints");
        let web = mk("web", 0, &[], None);
        // Its creation and deletion key the Service of its name.
        for event in [EventKind::Added, EventKind::Deleted] {
            assert_eq!(
                keys_of(&config, endpoints, event, None, &web),
                ["endpoints ns/web"]
            );
        }
        // Predicates filter updates as for any rule.
        assert!(keys_of(&config, endpoints, EventKind::Modified, Some(&web), &web).is_empty());

        let error = Config::from_yaml(
            r#"
controllers:
  - name: endpoints
    for: {apiVersion: v1, kind: Service}
    mapByName:
      - {apiVersion: v1, kind: Endpoints, through: {apiVersion: v1, kind: Pod}}
"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.starts_with("controllers[0].mapByName[0].through: only an owns entry"),
            "{error}"
        );
    }

    /// Two DaemonSets: one on every Node, one only on `role=db` Nodes and not tolerating
    /// `dedicated=db:NoExecute`.
    struct DaemonSets(Vec<Vec<u8>>);

    impl Owners for DaemonSets {
        fn controller(&self, _: usize, _: &str, _: &str) -> Option<ControllerRef> {
            None
        }

        fn each_object(&self, _: usize, each: &mut dyn FnMut(&[u8])) {
            for json in &self.0 {
                each(json);
            }
        }
    }

    #[test]
    fn a_placement_mapping_keys_only_the_daemonsets_whose_fit_on_the_node_moved() {
        let config = Config::from_yaml(
            r#"
controllers:
  - name: apps/v1/DaemonSet
    for: {apiVersion: apps/v1, kind: DaemonSet}
    mapByPlacement:
      - {apiVersion: v1, kind: Node}
"#,
        )
        .unwrap();
        let nodes = config
            .resources
            .iter()
            .position(|r| r.gvk.kind == "Node")
            .unwrap();
        let mapper = Mapper::new(&config);
        assert!(mapper.places(nodes));
        let sets = DaemonSets(vec![
            serde_json::to_vec(&serde_json::json!({
                "metadata": {"namespace": "ns", "name": "everywhere"},
                "spec": {"template": {"spec": {"tolerations": [{"operator": "Exists"}]}}}
            }))
            .unwrap(),
            serde_json::to_vec(&serde_json::json!({
                "metadata": {"namespace": "ns", "name": "db-only"},
                "spec": {"template": {"spec": {"nodeSelector": {"role": "db"}}}}
            }))
            .unwrap(),
        ]);
        let node = |labels: serde_json::Value, taints: serde_json::Value, phase: &str| {
            serde_json::to_vec(&serde_json::json!({
                "metadata": {"name": "n1", "labels": labels},
                "spec": {"taints": taints},
                "status": {"phase": phase}
            }))
            .unwrap()
        };
        let keys = |event, old: Option<&[u8]>, new: &[u8]| {
            let mut out: Vec<WorkKey> = Vec::new();
            mapper.keys_by_placement(nodes, event, old, new, &sets, &mut out);
            let mut names: Vec<String> = out.iter().map(|k| k.name.to_string()).collect();
            names.sort();
            names
        };
        let plain = node(serde_json::json!({}), serde_json::json!([]), "Running");
        let db = node(
            serde_json::json!({"role": "db"}),
            serde_json::json!([]),
            "Running",
        );
        let db_tainted = node(
            serde_json::json!({"role": "db"}),
            serde_json::json!([{"key": "dedicated", "value": "db", "effect": "NoExecute"}]),
            "Running",
        );
        // Added: where a Pod should run; deleted: where one may have run.
        assert_eq!(keys(EventKind::Added, None, &plain), ["everywhere"]);
        assert_eq!(keys(EventKind::Added, None, &db), ["db-only", "everywhere"]);
        assert_eq!(
            keys(EventKind::Deleted, None, &db),
            ["db-only", "everywhere"]
        );
        // A status change keys nothing, nor does a resync.
        let db_pending = node(
            serde_json::json!({"role": "db"}),
            serde_json::json!([]),
            "Pending",
        );
        assert!(keys(EventKind::Modified, Some(&db), &db_pending).is_empty());
        assert!(keys(EventKind::Sync, None, &db).is_empty());
        // Relabelled or tainted: only the DaemonSet whose answer moved.
        assert_eq!(keys(EventKind::Modified, Some(&plain), &db), ["db-only"]);
        assert_eq!(keys(EventKind::Modified, Some(&db), &plain), ["db-only"]);
        assert_eq!(
            keys(EventKind::Modified, Some(&db), &db_tainted),
            ["db-only"]
        );
        // A Node not cached before counts as added.
        assert_eq!(keys(EventKind::Modified, None, &plain), ["everywhere"]);
    }

    #[test]
    fn a_placement_mapping_of_a_metadata_only_kind_is_refused() {
        let error = Config::from_yaml(
            r#"
resources:
  - {apiVersion: v1, kind: Node, metadataOnly: true}
controllers:
  - name: apps/v1/DaemonSet
    for: {apiVersion: apps/v1, kind: DaemonSet}
    mapByPlacement:
      - {apiVersion: v1, kind: Node}
"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.starts_with("controllers[0].mapByPlacement[0]: reads the labels and taints"),
            "{error}"
        );
    }
}
