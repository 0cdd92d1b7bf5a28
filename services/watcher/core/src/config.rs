//! The watcher's configuration file: what to watch and how events become keys.
//!
//! ```yaml
//! shardCount: 256              # must match the queue's --shard-count
//! resyncPeriod: 10m            # every cached object's keys again, at low priority; 0s = off
//! namespaces:
//!   exclude: [kube-system]     # or include: [a, b]; cluster-scoped objects ignore both
//! resources:                   # optional per-resource settings (and cache-only resources)
//!   - apiVersion: v1
//!     kind: Pod
//!     metadataOnly: true
//! controllers:
//!   - name: apps/v1/ReplicaSet
//!     for: {apiVersion: apps/v1, kind: ReplicaSet}
//!     owns:
//!       - {apiVersion: v1, kind: Pod}
//!     mapByLabel:
//!       - {apiVersion: v1, kind: ConfigMap, label: example.com/replicaset}
//!   - name: apps/v1/Deployment
//!     for: {apiVersion: apps/v1, kind: Deployment}
//!     namespaces: [team-a, team-b]  # keyed only in these (optional; default every one)
//!     owns:
//!       - {apiVersion: apps/v1, kind: ReplicaSet}
//!       # a Pod's controller ReplicaSet, looked up in the cache, and that one's Deployment
//!       - {apiVersion: v1, kind: Pod, through: {apiVersion: apps/v1, kind: ReplicaSet}}
//! ```
//!
//!
//! The garbage collector's graph is configured apart: every resource discovery lists with
//! `list`, `watch` and `delete`, metadata only, minus an ignore list (kube-controller-manager's
//! by default), rediscovered while the watcher runs:
//!
//! ```yaml
//! garbageCollector:
//!   controller: garbage-collector       # the name its keys carry (the default)
//!   ignoredResources:                   # the default: events, in both groups
//!     - {group: "", resource: events}
//!     - {group: events.k8s.io, resource: events}
//!   rediscoveryPeriod: 30s              # the default; CRD and APIService changes also rediscover
//! ```
//!
//! What reconcilers may register and read, per service account of their certificate
//! ([`Grants`]; nothing unless listed):
//!
//! ```yaml
//! registrations:
//!   - serviceAccount: switchyard-reconciler
//!     graph: true                       # may read the garbage collector's graph
//!     kinds:
//!       - {apiVersion: v1, kind: Pod, objects: full}
//!       - {apiVersion: v1, kind: ConfigMap}   # metadata only
//! ```
//!
//! Every error names the field that is wrong (`controllers[1].owns[0].kind: ...`).
//!
//! Every section is optional. A file with no `controllers`, `resources` nor
//! `garbageCollector` (`shardCount: 256` alone, or `{}`) watches nothing until reconcilers
//! register their controllers' watches over gRPC ([`crate::watches`]); a controller named
//! both here and in a registration must declare the same watches in both.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    time::Duration,
};

use serde::Deserialize;

/// Longest controller name: it travels in every work key.
const MAX_CONTROLLER_NAME: usize = 253;
/// client-go's default informer resync is off; ten minutes is kube-controller-manager's
/// `--min-resync-period` scale. Zero turns it off.
const DEFAULT_RESYNC: Duration = Duration::from_secs(0);
const DEFAULT_SHARD_COUNT: u32 = 256;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("the configuration is not valid YAML for this schema: {0}")]
    Parse(#[from] serde_norway::Error),
    #[error("{field}: {problem}")]
    Invalid { field: String, problem: String },
}

pub type Result<T, E = ConfigError> = std::result::Result<T, E>;

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        problem: problem.into(),
    }
}

/// A group/version/kind, as written in manifests (`apiVersion` + `kind`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gvk {
    pub group: String,
    pub version: String,
    pub kind: String,
}

impl Gvk {
    /// Parses `apps/v1` + `ReplicaSet` (or `v1` + `Pod` for the core group).
    pub fn parse(api_version: &str, kind: &str) -> std::result::Result<Self, String> {
        let (group, version) = match api_version.split_once('/') {
            Some((group, version)) => (group, version),
            None => ("", api_version),
        };
        if version.is_empty() || version.contains('/') {
            return Err(format!(
                "apiVersion {api_version:?} is not of the form version or group/version"
            ));
        }
        if api_version.split_once('/').is_some() && group.is_empty() {
            return Err(format!("apiVersion {api_version:?} has an empty group"));
        }
        if !is_kind(kind) {
            return Err(format!(
                "kind {kind:?} must be a CamelCase name such as ReplicaSet"
            ));
        }
        Ok(Self {
            group: group.to_owned(),
            version: version.to_owned(),
            kind: kind.to_owned(),
        })
    }

    /// `v1` `Namespace`: the only kind a `mapByNamespace` rule keys.
    pub fn is_namespace(&self) -> bool {
        self.group.is_empty() && self.version == "v1" && self.kind == "Namespace"
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

impl fmt::Display for Gvk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.api_version(), self.kind)
    }
}

/// A kind's name: CamelCase letters and digits (`ReplicaSet`).
pub(crate) fn is_kind(kind: &str) -> bool {
    kind.starts_with(|c: char| c.is_ascii_uppercase())
        && kind.chars().all(|c| c.is_ascii_alphanumeric())
}

/// When an update passes a rule: any one of the listed predicates holding is enough
/// (controller-runtime's `predicate.Or`). Creations, deletions and resyncs always pass.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(try_from = "RawPredicate")]
pub enum Predicate {
    GenerationChanged,
    LabelsChanged,
    AnnotationsChanged,
    /// The value at this JSON pointer (RFC 6901: `/spec/replicas`, `/status/phase`,
    /// `/metadata/labels/app`) changed, appeared or went: the custom predicates of
    /// controller-runtime that compare one field of the old and new object. A token may pick
    /// a list's element by one of its fields (`/status/conditions[type=Ready]/status`). The
    /// watcher keeps a hash of the value per cached object, taken as the object comes.
    FieldChanged(String),
    /// The update was not this field manager's write: kube-controller-manager's
    /// `EndpointSliceTracker.ShouldSync`, which spares a controller the reconcile its own
    /// write would cause. Read from `managedFields`: an update is this manager's when its
    /// entry changed and no other entry did ([`crate::store::Writers`]).
    NotWrittenBy(String),
}

/// A predicate as the file writes it: a name (`generationChanged`), or a map of one key
/// (`{fieldChanged: /status/phase}`).
#[derive(Deserialize)]
#[serde(untagged)]
enum RawPredicate {
    Name(String),
    Field {
        #[serde(rename = "fieldChanged")]
        field_changed: String,
    },
    Writer {
        #[serde(rename = "notWrittenBy")]
        not_written_by: String,
    },
}

impl TryFrom<RawPredicate> for Predicate {
    type Error = String;

    fn try_from(raw: RawPredicate) -> std::result::Result<Self, String> {
        match raw {
            RawPredicate::Name(name) => match name.as_str() {
                "generationChanged" => Ok(Self::GenerationChanged),
                "labelsChanged" => Ok(Self::LabelsChanged),
                "annotationsChanged" => Ok(Self::AnnotationsChanged),
                _ => Err(format!(
                    "unknown predicate {name:?}: expected generationChanged, labelsChanged, \
                     annotationsChanged, {{fieldChanged: /json/pointer}} or \
                     {{notWrittenBy: field-manager}}"
                )),
            },
            RawPredicate::Field { field_changed } => Ok(Self::FieldChanged(field_changed)),
            RawPredicate::Writer { not_written_by } => Ok(Self::NotWrittenBy(not_written_by)),
        }
    }
}

/// The longest JSON pointer a `fieldChanged` predicate may name.
pub const MAX_FIELD_POINTER: usize = 256;

/// The most `fieldChanged` predicates one rule may have.
pub const MAX_FIELD_PREDICATES: usize = 16;

/// The longest field manager the apiserver takes.
pub const MAX_FIELD_MANAGER: usize = 128;

impl Predicate {
    /// What is wrong with it, if anything.
    pub fn problem(&self) -> Option<String> {
        let pointer = match self {
            Self::FieldChanged(pointer) => pointer,
            Self::NotWrittenBy(manager) if manager.is_empty() => {
                return Some("notWrittenBy names no field manager".into());
            }
            Self::NotWrittenBy(manager) if manager.len() > MAX_FIELD_MANAGER => {
                return Some(format!(
                    "notWrittenBy is {} bytes; a field manager is at most {MAX_FIELD_MANAGER}",
                    manager.len()
                ));
            }
            _ => return None,
        };
        if !pointer.starts_with('/') {
            return Some(format!(
                "fieldChanged {pointer:?} is not a JSON pointer: it starts with '/', as \"/status/phase\""
            ));
        }
        if pointer.len() > MAX_FIELD_POINTER {
            return Some(format!(
                "fieldChanged is {} characters; at most {MAX_FIELD_POINTER}",
                pointer.len()
            ));
        }
        None
    }
}

/// `predicates`, checked: each [`Predicate::problem`] named by its index, at most
/// [`MAX_FIELD_PREDICATES`] `fieldChanged` and one `notWrittenBy`.
pub fn checked_predicates(
    predicates: Vec<Predicate>,
) -> std::result::Result<Vec<Predicate>, (Option<usize>, String)> {
    for (i, predicate) in predicates.iter().enumerate() {
        if let Some(problem) = predicate.problem() {
            return Err((Some(i), problem));
        }
    }
    let fields = predicates
        .iter()
        .filter(|p| matches!(p, Predicate::FieldChanged(_)))
        .count();
    if fields > MAX_FIELD_PREDICATES {
        return Err((
            None,
            format!("{fields} fieldChanged predicates; at most {MAX_FIELD_PREDICATES}"),
        ));
    }
    let writers = predicates
        .iter()
        .filter(|p| matches!(p, Predicate::NotWrittenBy(_)))
        .count();
    if writers > 1 {
        return Err((
            None,
            format!("{writers} notWrittenBy predicates; at most one"),
        ));
    }
    Ok(predicates)
}

/// [`checked_predicates`] for the rule at `rule` of the file.
fn predicates_of(rule: &str, predicates: Vec<Predicate>) -> Result<Vec<Predicate>> {
    checked_predicates(predicates).map_err(|(i, problem)| match i {
        Some(i) => invalid(format!("{rule}.predicates[{i}]"), problem),
        None => invalid(format!("{rule}.predicates"), problem),
    })
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    shard_count: Option<u32>,
    #[serde(default)]
    resync_period: Option<String>,
    #[serde(default)]
    namespaces: RawNamespaces,
    #[serde(default)]
    resources: Vec<RawResource>,
    #[serde(default)]
    controllers: Vec<RawController>,
    #[serde(default)]
    garbage_collector: Option<RawCollector>,
    #[serde(default)]
    registrations: Vec<RawGrant>,
}

/// A file of grants beside the configuration ([`Config::from_yaml_with_grants`]).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawGrantsFile {
    registrations: Vec<RawGrant>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawGrant {
    #[serde(default)]
    service_account: String,
    #[serde(default)]
    kinds: Vec<RawGrantKind>,
    #[serde(default)]
    graph: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawGrantKind {
    api_version: String,
    kind: String,
    #[serde(default)]
    objects: Objects,
}

/// How much of a kind's objects a caller may have: their metadata, or all of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Objects {
    #[default]
    Metadata,
    Full,
}

/// `registrations`: the kinds each service account may register watches of, and so read
/// from the cache, and whether in full; and whether it may read the garbage collector's
/// graph. Deny by default: a kind no entry lists (`v1/Secret` among them) is refused, a kind
/// listed without `objects: full` is metadata only, and the graph (names and owner references
/// of every kind, Secrets included) is read only by the accounts given `graph: true`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants {
    by_account: BTreeMap<String, BTreeMap<Gvk, Objects>>,
    graph: BTreeSet<String>,
}

impl Grants {
    /// What `account` was granted of `gvk`, if anything.
    pub fn granted(&self, account: &str, gvk: &Gvk) -> Option<Objects> {
        self.by_account.get(account)?.get(gvk).copied()
    }

    /// Whether `account` may read the garbage collector's graph.
    pub fn reads_graph(&self, account: &str) -> bool {
        self.graph.contains(account)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawCollector {
    #[serde(default)]
    controller: Option<String>,
    #[serde(default)]
    ignored_resources: Option<Vec<GroupResource>>,
    #[serde(default)]
    rediscovery_period: Option<String>,
}

/// A resource by group and plural name, as kube-controller-manager's ignore lists name them.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupResource {
    #[serde(default)]
    pub group: String,
    pub resource: String,
}

impl GroupResource {
    fn new(group: &str, resource: &str) -> Self {
        Self {
            group: group.to_owned(),
            resource: resource.to_owned(),
        }
    }
}

/// The name the garbage collector's keys carry unless the configuration says otherwise.
pub const DEFAULT_COLLECTOR: &str = "garbage-collector";
/// kube-controller-manager rediscovers deletable resources every 30 s.
const DEFAULT_REDISCOVERY: Duration = Duration::from_secs(30);

/// The garbage collector's graph: which resources it holds and what its keys carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectorConfig {
    /// The controller name of its keys.
    pub controller: String,
    /// Resources never held, whatever discovery says.
    pub ignored: Vec<GroupResource>,
    pub rediscovery_period: Duration,
}

impl CollectorConfig {
    /// kube-controller-manager's `DefaultIgnoredResources`: Events, which have no owners
    /// worth collecting and change too often to be worth watching.
    pub fn default_ignored() -> Vec<GroupResource> {
        vec![
            GroupResource::new("", "events"),
            GroupResource::new("events.k8s.io", "events"),
        ]
    }

    pub fn ignores(&self, group: &str, resource: &str) -> bool {
        self.ignored
            .iter()
            .any(|r| r.group == group && r.resource == resource)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawNamespaces {
    #[serde(default)]
    include: Vec<String>,
    #[serde(default)]
    exclude: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawResource {
    api_version: String,
    kind: String,
    #[serde(default)]
    metadata_only: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawController {
    name: String,
    #[serde(rename = "for")]
    for_: Option<RawRule>,
    #[serde(default)]
    owns: Vec<RawRule>,
    #[serde(default)]
    map_by_label: Vec<RawLabelRule>,
    #[serde(default)]
    map_by_namespace: Vec<RawRule>,
    #[serde(default)]
    map_by_selector: Vec<RawRule>,
    #[serde(default)]
    map_by_placement: Vec<RawRule>,
    #[serde(default)]
    map_by_name: Vec<RawRule>,
    #[serde(default)]
    namespaces: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawRule {
    api_version: String,
    kind: String,
    #[serde(default)]
    predicates: Vec<Predicate>,
    /// `owns` only: the kind between the object and the owner (`Pod` -> `ReplicaSet` ->
    /// `Deployment`).
    #[serde(default)]
    through: Option<RawKind>,
    #[serde(default)]
    batch_period: Option<String>,
    #[serde(default)]
    batch_status_updates_only: bool,
    #[serde(default)]
    label_selector: Option<String>,
    #[serde(default)]
    field_selector: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawKind {
    api_version: String,
    kind: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawLabelRule {
    api_version: String,
    kind: String,
    label: String,
    #[serde(default)]
    predicates: Vec<Predicate>,
    #[serde(default)]
    batch_period: Option<String>,
    #[serde(default)]
    batch_status_updates_only: bool,
    #[serde(default)]
    label_selector: Option<String>,
    #[serde(default)]
    field_selector: Option<String>,
}

/// One watched resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceConfig {
    pub gvk: Gvk,
    /// Watch and cache only `metadata` (the metadata API), not the whole object.
    pub metadata_only: bool,
}

/// How events of one resource become keys of one controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleKind {
    /// The object's own key.
    For,
    /// The key of the object's controller owner, when that owner is of this kind. With
    /// `through`, the object's controller is of that kind instead (a resource, by index into
    /// [`Config::resources`], so it is cached), and the key is that object's controller owner,
    /// looked up in the cache.
    Owns { owner: Gvk, through: Option<usize> },
    /// The key named by this label's value, in the object's namespace.
    ByLabel { label: String },
    /// The key of the Namespace the object lives in (the controller reconciles Namespaces);
    /// a cluster-scoped object maps to nothing.
    ByNamespace,
    /// The keys of the cached objects of the `for` kind (`owner`) in the object's namespace
    /// whose `spec.selector` matches its labels (a PodDisruptionBudget's Pods).
    BySelector { owner: Gvk },
    /// The keys of the cached objects of the `for` kind (`owner`), in every namespace, whose
    /// Pod template (`spec.template.spec`, with the tolerations every DaemonSet Pod gets)
    /// fits the object, a Node, differently before and after its change: the DaemonSets a
    /// Node's labels or taints concern.
    ByPlacement { owner: Gvk },
    /// The key of the same namespace and name as the object (a Service's Endpoints).
    ByName,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Index into [`Config::resources`].
    pub resource: usize,
    pub controller: String,
    pub kind: RuleKind,
    pub predicates: Vec<Predicate>,
    /// Keys of live events are ready only this long after the event (the queue's delay;
    /// the earliest ready time wins), so that a burst of changes to the objects one key
    /// covers is one reconcile: kube-controller-manager's Job and EndpointSlice
    /// controllers' batch periods. `None`: ready at once.
    pub batch_period: Option<Duration>,
    /// The batch period holds only updates that leave `metadata.generation` as it was (a
    /// status written): creations, deletions and spec changes are ready at once, as
    /// kube-controller-manager's Job controller batches a Job's own updates
    /// (`batchStatusUpdatesOnly`).
    pub batch_status_only: bool,
    /// Only objects whose labels match key through this rule (for an update, the object
    /// after it: controller-runtime's `LabelSelectorPredicate`); the cache holds every object
    /// of the kind all the same. A label selector in kubectl's syntax, as validated.
    pub label_selector: Option<String>,
    /// Only objects whose fields match key through this rule (the apiserver's syntax,
    /// `spec.nodeName=node-1`, as validated; evaluated by the watcher: [`crate::fields`]).
    pub field_selector: Option<String>,
    /// The namespaces the controller works in, sorted (its `namespaces`): a key in another
    /// namespace is dropped (and for a controller of Namespaces, a key of another
    /// Namespace). Empty: every namespace.
    pub namespaces: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Namespaces {
    pub include: Vec<String>,
    pub exclude: Vec<String>,
}

impl Namespaces {
    /// Whether objects of `namespace` are watched (cluster-scoped objects always are).
    pub fn admits(&self, namespace: &str) -> bool {
        if namespace.is_empty() {
            return true;
        }
        if !self.include.is_empty() {
            return self.include.iter().any(|n| n == namespace);
        }
        !self.exclude.iter().any(|n| n == namespace)
    }
}

/// A validated configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub shard_count: u32,
    pub resync_period: Option<Duration>,
    pub namespaces: Namespaces,
    /// Every resource to watch, once each, in the order first named.
    pub resources: Vec<ResourceConfig>,
    pub rules: Vec<Rule>,
    /// The garbage collector's graph, when configured.
    pub collector: Option<CollectorConfig>,
    /// What registrations may watch, by the registrant's service account.
    pub grants: Grants,
}

impl Config {
    /// What `account` may register of `gvk` and read of it from the cache: what the file
    /// itself watches of it (any caller may read the file's kinds, which are the built-in
    /// controllers'), or what `registrations` grants the account, whichever is more.
    pub fn access(&self, account: &str, gvk: &Gvk) -> Option<Objects> {
        let file = self.resources.iter().find(|r| &r.gvk == gvk).map(|r| {
            if r.metadata_only {
                Objects::Metadata
            } else {
                Objects::Full
            }
        });
        file.max(self.grants.granted(account, gvk))
    }

    /// Parses and validates a YAML document.
    pub fn from_yaml(text: &str) -> Result<Self> {
        Self::from_yaml_with_grants(text, &[])
    }

    /// The configuration of `text`, with the `registrations` of each `(name, text)` in `more`
    /// after its own: the grants a controller's installation adds in a file of its own (a
    /// kustomize component merging a key into the watcher's ConfigMap), which may hold
    /// `registrations` and nothing else. An error in one names it.
    pub fn from_yaml_with_grants(text: &str, more: &[(String, String)]) -> Result<Self> {
        let mut raw: RawConfig = serde_norway::from_str(text)?;
        for (name, text) in more {
            let file: RawGrantsFile = serde_norway::from_str(text)
                .map_err(|e| invalid(name, format!("not a file of registrations only: {e}")))?;
            raw.registrations.extend(file.registrations);
        }
        Self::validate(raw)
    }

    /// The controllers that reconcile the objects of resource `index` themselves (`for`):
    /// those whose status they own.
    pub fn reconciled_by(&self, index: usize) -> impl Iterator<Item = &str> {
        self.rules
            .iter()
            .filter(move |r| r.resource == index && r.kind == RuleKind::For)
            .map(|r| r.controller.as_str())
    }

    /// Whether keys are produced for `controller`.
    pub fn runs(&self, controller: &str) -> bool {
        self.rules.iter().any(|r| r.controller == controller)
    }

    /// The controller names keys are produced for.
    pub fn controllers(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.rules.iter().map(|r| r.controller.as_str()).collect();
        names.dedup();
        names.extend(self.collector.as_ref().map(|c| c.controller.as_str()));
        names
    }

    fn validate(raw: RawConfig) -> Result<Self> {
        let RawConfig {
            shard_count,
            resync_period,
            namespaces,
            resources: raw_resources,
            controllers,
            garbage_collector,
            registrations,
        } = raw;
        let shard_count = shard_count.unwrap_or(DEFAULT_SHARD_COUNT);
        if shard_count == 0 {
            return Err(invalid("shardCount", "must be at least 1"));
        }
        let resync_period = match resync_period {
            None => DEFAULT_RESYNC,
            Some(text) => duration("resyncPeriod", &text)?,
        };
        let namespaces = validate_namespaces(namespaces)?;

        let mut resources: Vec<ResourceConfig> = Vec::new();
        let mut explicit: BTreeMap<Gvk, usize> = BTreeMap::new();
        for (i, r) in raw_resources.into_iter().enumerate() {
            let field = format!("resources[{i}]");
            let gvk = Gvk::parse(&r.api_version, &r.kind).map_err(|e| invalid(&field, e))?;
            if let Some(first) = explicit.insert(gvk.clone(), i) {
                return Err(invalid(
                    field,
                    format!("{gvk} is already listed as resources[{first}]"),
                ));
            }
            resources.push(ResourceConfig {
                gvk,
                metadata_only: r.metadata_only,
            });
        }
        let mut index_of = |gvk: &Gvk| -> usize {
            match resources.iter().position(|r| &r.gvk == gvk) {
                Some(i) => i,
                None => {
                    resources.push(ResourceConfig {
                        gvk: gvk.clone(),
                        metadata_only: false,
                    });
                    resources.len() - 1
                }
            }
        };

        let mut rules = Vec::new();
        // The kinds `mapByPlacement` rules read in full, with where each was named.
        let mut placed: Vec<(String, Gvk)> = Vec::new();
        let mut names: BTreeMap<String, usize> = BTreeMap::new();
        for (c, controller) in controllers.into_iter().enumerate() {
            let field = format!("controllers[{c}]");
            let RawController {
                name,
                for_,
                owns,
                map_by_label,
                map_by_namespace,
                map_by_selector,
                map_by_placement,
                map_by_name,
                namespaces,
            } = controller;
            let namespaces = checked_namespaces(&namespaces)
                .map_err(|(i, problem)| invalid(format!("{field}.namespaces[{i}]"), problem))?;
            if name.trim().is_empty() {
                return Err(invalid(format!("{field}.name"), "must not be empty"));
            }
            if name.len() > MAX_CONTROLLER_NAME {
                return Err(invalid(
                    format!("{field}.name"),
                    format!(
                        "is {} characters; at most {MAX_CONTROLLER_NAME}",
                        name.len()
                    ),
                ));
            }
            if let Some(first) = names.insert(name.clone(), c) {
                return Err(invalid(
                    format!("{field}.name"),
                    format!("{name:?} is already used by controllers[{first}]"),
                ));
            }
            let Some(for_) = for_ else {
                return Err(invalid(
                    format!("{field}.for"),
                    "is required: the kind this controller reconciles",
                ));
            };
            let owner = Gvk::parse(&for_.api_version, &for_.kind)
                .map_err(|e| invalid(format!("{field}.for"), e))?;
            if for_.through.is_some() {
                return Err(invalid(
                    format!("{field}.for.through"),
                    "only an owns entry maps through an owner",
                ));
            }
            rules.push(Rule {
                resource: index_of(&owner),
                controller: name.clone(),
                namespaces: namespaces.clone(),
                kind: RuleKind::For,
                predicates: predicates_of(&format!("{field}.for"), for_.predicates)?,
                label_selector: label_selector(&format!("{field}.for"), for_.label_selector)?,
                field_selector: field_selector(&format!("{field}.for"), for_.field_selector)?,
                batch_period: batch_period(format!("{field}.for"), for_.batch_period)?,
                batch_status_only: for_.batch_status_updates_only,
            });
            for (i, rule) in owns.into_iter().enumerate() {
                let gvk = Gvk::parse(&rule.api_version, &rule.kind)
                    .map_err(|e| invalid(format!("{field}.owns[{i}]"), e))?;
                let through = match rule.through {
                    None => None,
                    Some(through) => {
                        let at = format!("{field}.owns[{i}].through");
                        let via = Gvk::parse(&through.api_version, &through.kind)
                            .map_err(|e| invalid(&at, e))?;
                        if via == gvk {
                            return Err(invalid(
                                at,
                                format!(
                                    "{via} is the owned kind itself; name the kind between it and {owner}"
                                ),
                            ));
                        }
                        if via == owner {
                            return Err(invalid(
                                at,
                                format!(
                                    "{via} is the for kind; an owns entry without through maps to it"
                                ),
                            ));
                        }
                        Some(index_of(&via))
                    }
                };
                rules.push(Rule {
                    resource: index_of(&gvk),
                    controller: name.clone(),
                    namespaces: namespaces.clone(),
                    kind: RuleKind::Owns {
                        owner: owner.clone(),
                        through,
                    },
                    predicates: predicates_of(&format!("{field}.owns[{i}]"), rule.predicates)?,
                    label_selector: label_selector(
                        &format!("{field}.owns[{i}]"),
                        rule.label_selector,
                    )?,
                    field_selector: field_selector(
                        &format!("{field}.owns[{i}]"),
                        rule.field_selector,
                    )?,
                    batch_period: batch_period(format!("{field}.owns[{i}]"), rule.batch_period)?,
                    batch_status_only: rule.batch_status_updates_only,
                });
            }
            for (i, rule) in map_by_label.into_iter().enumerate() {
                let at = format!("{field}.mapByLabel[{i}]");
                let gvk = Gvk::parse(&rule.api_version, &rule.kind).map_err(|e| invalid(&at, e))?;
                if rule.label.trim().is_empty() {
                    return Err(invalid(format!("{at}.label"), "must not be empty"));
                }
                rules.push(Rule {
                    resource: index_of(&gvk),
                    controller: name.clone(),
                    namespaces: namespaces.clone(),
                    kind: RuleKind::ByLabel { label: rule.label },
                    predicates: predicates_of(&at, rule.predicates)?,
                    label_selector: label_selector(&at, rule.label_selector)?,
                    field_selector: field_selector(&at, rule.field_selector)?,
                    batch_period: batch_period(at, rule.batch_period)?,
                    batch_status_only: rule.batch_status_updates_only,
                });
            }
            for (i, rule) in map_by_namespace.into_iter().enumerate() {
                let at = format!("{field}.mapByNamespace[{i}]");
                let gvk = Gvk::parse(&rule.api_version, &rule.kind).map_err(|e| invalid(&at, e))?;
                if !owner.is_namespace() {
                    return Err(invalid(
                        &at,
                        format!(
                            "maps to the object's Namespace, so for must be v1/Namespace, not {owner}"
                        ),
                    ));
                }
                if rule.through.is_some() {
                    return Err(invalid(
                        format!("{at}.through"),
                        "only an owns entry maps through an owner",
                    ));
                }
                rules.push(Rule {
                    resource: index_of(&gvk),
                    controller: name.clone(),
                    namespaces: namespaces.clone(),
                    kind: RuleKind::ByNamespace,
                    predicates: predicates_of(&at, rule.predicates)?,
                    label_selector: label_selector(&at, rule.label_selector)?,
                    field_selector: field_selector(&at, rule.field_selector)?,
                    batch_period: batch_period(at, rule.batch_period)?,
                    batch_status_only: rule.batch_status_updates_only,
                });
            }
            for (i, rule) in map_by_name.into_iter().enumerate() {
                let at = format!("{field}.mapByName[{i}]");
                let gvk = Gvk::parse(&rule.api_version, &rule.kind).map_err(|e| invalid(&at, e))?;
                if rule.through.is_some() {
                    return Err(invalid(
                        format!("{at}.through"),
                        "only an owns entry maps through an owner",
                    ));
                }
                rules.push(Rule {
                    resource: index_of(&gvk),
                    controller: name.clone(),
                    namespaces: namespaces.clone(),
                    kind: RuleKind::ByName,
                    predicates: predicates_of(&at, rule.predicates)?,
                    label_selector: label_selector(&at, rule.label_selector)?,
                    field_selector: field_selector(&at, rule.field_selector)?,
                    batch_period: batch_period(at, rule.batch_period)?,
                    batch_status_only: rule.batch_status_updates_only,
                });
            }
            let by_owner = map_by_selector
                .into_iter()
                .enumerate()
                .map(|(i, rule)| {
                    (
                        "mapBySelector",
                        i,
                        rule,
                        RuleKind::BySelector {
                            owner: owner.clone(),
                        },
                    )
                })
                .chain(map_by_placement.into_iter().enumerate().map(|(i, rule)| {
                    (
                        "mapByPlacement",
                        i,
                        rule,
                        RuleKind::ByPlacement {
                            owner: owner.clone(),
                        },
                    )
                }));
            for (list, i, rule, kind) in by_owner {
                let at = format!("{field}.{list}[{i}]");
                let gvk = Gvk::parse(&rule.api_version, &rule.kind).map_err(|e| invalid(&at, e))?;
                if rule.through.is_some() {
                    return Err(invalid(
                        format!("{at}.through"),
                        "only an owns entry maps through an owner",
                    ));
                }
                if matches!(kind, RuleKind::ByPlacement { .. }) {
                    placed.push((at.clone(), gvk.clone()));
                }
                rules.push(Rule {
                    resource: index_of(&gvk),
                    controller: name.clone(),
                    namespaces: namespaces.clone(),
                    kind,
                    predicates: predicates_of(&at, rule.predicates)?,
                    label_selector: label_selector(&at, rule.label_selector)?,
                    field_selector: field_selector(&at, rule.field_selector)?,
                    batch_period: batch_period(at, rule.batch_period)?,
                    batch_status_only: rule.batch_status_updates_only,
                });
            }
        }
        for (at, gvk) in placed {
            if resources.iter().any(|r| r.gvk == gvk && r.metadata_only) {
                return Err(invalid(
                    at,
                    format!("reads the labels and taints of {gvk}, so it must not be metadataOnly"),
                ));
            }
        }
        let collector = garbage_collector
            .map(|raw| validate_collector(raw, &names))
            .transpose()?;
        let grants = validate_grants(registrations)?;
        Ok(Self {
            shard_count,
            resync_period: (!resync_period.is_zero()).then_some(resync_period),
            namespaces,
            resources,
            rules,
            collector,
            grants,
        })
    }
}

fn validate_grants(raw: Vec<RawGrant>) -> Result<Grants> {
    let mut grants = Grants::default();
    for (g, grant) in raw.into_iter().enumerate() {
        let field = format!("registrations[{g}]");
        let account = grant.service_account.trim();
        if account.is_empty() {
            return Err(invalid(
                format!("{field}.serviceAccount"),
                "required: the service account of the registrant's certificate",
            ));
        }
        if !is_service_account(account) {
            return Err(invalid(
                format!("{field}.serviceAccount"),
                format!(
                    "{account:?} is not a service account name (lowercase letters, digits, '-' \
                     and '.', at most {MAX_SERVICE_ACCOUNT}): write the <name> of the \
                     certificate's spiffe://<trust domain>/ns/<namespace>/sa/<name>"
                ),
            ));
        }
        if grants.by_account.contains_key(account) {
            return Err(invalid(
                format!("{field}.serviceAccount"),
                format!("{account:?} is already listed; list all its kinds in one entry"),
            ));
        }
        // Without a garbageCollector section there is no graph to read: the grant stays
        // unused, so that a file can drop the collector without editing its grants.
        if grant.graph {
            grants.graph.insert(account.to_owned());
        }
        let kinds = grants.by_account.entry(account.to_owned()).or_default();
        for (k, kind) in grant.kinds.into_iter().enumerate() {
            let at = format!("{field}.kinds[{k}]");
            let gvk = Gvk::parse(&kind.api_version, &kind.kind).map_err(|e| invalid(&at, e))?;
            if kinds.insert(gvk.clone(), kind.objects).is_some() {
                return Err(invalid(at, format!("{gvk} is listed twice")));
            }
        }
    }
    Ok(grants)
}

/// Longest service account name: Kubernetes names them as DNS subdomains (RFC 1123).
const MAX_SERVICE_ACCOUNT: usize = 253;

/// Whether `name` can be a service account's name, as a certificate's SPIFFE URI carries it
/// (a DNS subdomain): a full URI or a name with capitals would never match a caller, and its
/// grant would be lost.
fn is_service_account(name: &str) -> bool {
    switchyard_selector::names::is_dns_subdomain(name)
}

/// Longest batch period: a key held longer than this is a controller that reacts late, not
/// a burst coalesced.
pub(crate) const MAX_BATCH_PERIOD: Duration = Duration::from_secs(60);

fn duration(field: &str, text: &str) -> Result<Duration> {
    humantime::parse_duration(text).map_err(|e| {
        invalid(
            field,
            format!("{text:?} is not a duration such as 10m: {e}"),
        )
    })
}

/// A rule's `batchPeriod`: zero or absent is none.
/// A rule's `labelSelector`, checked: `None` when unset or empty.
fn label_selector(rule: &str, text: Option<String>) -> Result<Option<String>> {
    checked_label_selector(text.as_deref().unwrap_or_default())
        .map_err(|problem| invalid(format!("{rule}.labelSelector"), problem))
}

/// A rule's `fieldSelector`, checked: `None` when unset or empty.
fn field_selector(rule: &str, text: Option<String>) -> Result<Option<String>> {
    crate::fields::checked_field_selector(text.as_deref().unwrap_or_default())
        .map_err(|problem| invalid(format!("{rule}.fieldSelector"), problem))
}

/// A watch's label selector (kubectl's syntax), trimmed: `None` when empty; otherwise what
/// is wrong with it.
pub fn checked_label_selector(text: &str) -> std::result::Result<Option<String>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    if text.len() > MAX_LABEL_SELECTOR {
        return Err(format!(
            "is {} characters; at most {MAX_LABEL_SELECTOR}",
            text.len()
        ));
    }
    switchyard_selector::Selector::parse(text).map_err(|e| e.to_string())?;
    Ok(Some(text.to_owned()))
}

/// The longest label selector a watch may have.
pub const MAX_LABEL_SELECTOR: usize = 4096;

fn batch_period(rule: String, text: Option<String>) -> Result<Option<Duration>> {
    let Some(text) = text else { return Ok(None) };
    let field = format!("{rule}.batchPeriod");
    let period = duration(&field, &text)?;
    if period > MAX_BATCH_PERIOD {
        return Err(invalid(
            field,
            format!(
                "{text:?} is longer than {}",
                humantime::format_duration(MAX_BATCH_PERIOD)
            ),
        ));
    }
    Ok((!period.is_zero()).then_some(period))
}

fn validate_collector(
    raw: RawCollector,
    controllers: &BTreeMap<String, usize>,
) -> Result<CollectorConfig> {
    let RawCollector {
        controller,
        ignored_resources,
        rediscovery_period,
    } = raw;
    let controller = controller.unwrap_or_else(|| DEFAULT_COLLECTOR.to_owned());
    if controller.trim().is_empty() || controller.len() > MAX_CONTROLLER_NAME {
        return Err(invalid(
            "garbageCollector.controller",
            format!("must be 1 to {MAX_CONTROLLER_NAME} characters"),
        ));
    }
    if let Some(c) = controllers.get(&controller) {
        return Err(invalid(
            "garbageCollector.controller",
            format!("{controller:?} is already used by controllers[{c}]"),
        ));
    }
    let ignored = ignored_resources.unwrap_or_else(CollectorConfig::default_ignored);
    for (i, r) in ignored.iter().enumerate() {
        if r.resource.is_empty() || r.resource.contains('/') {
            return Err(invalid(
                format!("garbageCollector.ignoredResources[{i}].resource"),
                format!(
                    "{:?} is not a resource's plural name such as events",
                    r.resource
                ),
            ));
        }
    }
    let rediscovery_period = match rediscovery_period {
        None => DEFAULT_REDISCOVERY,
        Some(text) => humantime::parse_duration(&text)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                invalid(
                    "garbageCollector.rediscoveryPeriod",
                    format!("{text:?} is not a positive duration such as 30s"),
                )
            })?,
    };
    Ok(CollectorConfig {
        controller,
        ignored,
        rediscovery_period,
    })
}

/// The most namespaces one controller may be scoped to.
pub const MAX_CONTROLLER_NAMESPACES: usize = 256;

/// A controller's `namespaces`, sorted and each once; otherwise which one is wrong (its
/// index; the list's length when there are too many) and why.
pub fn checked_namespaces(names: &[String]) -> std::result::Result<Vec<String>, (usize, String)> {
    if names.len() > MAX_CONTROLLER_NAMESPACES {
        return Err((
            names.len(),
            format!(
                "{} namespaces given; at most {MAX_CONTROLLER_NAMESPACES}",
                names.len()
            ),
        ));
    }
    for (i, name) in names.iter().enumerate() {
        if !switchyard_selector::names::is_dns_label(name) {
            return Err((
                i,
                format!("{name:?} is not a namespace name (a DNS label of at most 63 characters)"),
            ));
        }
    }
    let mut names = names.to_vec();
    names.sort();
    names.dedup();
    Ok(names)
}

fn validate_namespaces(raw: RawNamespaces) -> Result<Namespaces> {
    let RawNamespaces { include, exclude } = raw;
    if !include.is_empty() && !exclude.is_empty() {
        return Err(invalid("namespaces", "set include or exclude, not both"));
    }
    for (list, names) in [("include", &include), ("exclude", &exclude)] {
        for (i, name) in names.iter().enumerate() {
            if !switchyard_selector::names::is_dns_label(name) {
                return Err(invalid(
                    format!("namespaces.{list}[{i}]"),
                    format!(
                        "{name:?} is not a namespace name (a DNS label of at most 63 characters)"
                    ),
                ));
            }
        }
    }
    Ok(Namespaces { include, exclude })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RS_CONFIG: &str = r#"
shardCount: 16
resyncPeriod: 10m
namespaces:
  exclude: [kube-system]
resources:
  - apiVersion: v1
    kind: Pod
    metadataOnly: true
controllers:
  - name: apps/v1/ReplicaSet
    for: {apiVersion: apps/v1, kind: ReplicaSet, predicates: [generationChanged]}
    owns:
      - {apiVersion: v1, kind: Pod}
  - name: apps/v1/Deployment
    for: {apiVersion: apps/v1, kind: Deployment}
    owns:
      - {apiVersion: apps/v1, kind: ReplicaSet}
    mapByLabel:
      - {apiVersion: v1, kind: ConfigMap, label: example.com/deployment}
"#;

    fn error(text: &str) -> String {
        Config::from_yaml(text).unwrap_err().to_string()
    }

    #[test]
    fn resources_are_the_union_of_every_rule_once() {
        let config = Config::from_yaml(RS_CONFIG).unwrap();
        let kinds: Vec<String> = config.resources.iter().map(|r| r.gvk.to_string()).collect();
        assert_eq!(
            kinds,
            [
                "v1/Pod",
                "apps/v1/ReplicaSet",
                "apps/v1/Deployment",
                "v1/ConfigMap"
            ]
        );
        assert!(config.resources[0].metadata_only);
        assert!(!config.resources[1].metadata_only);
        assert_eq!(config.shard_count, 16);
        assert_eq!(config.resync_period, Some(Duration::from_secs(600)));
        assert_eq!(config.rules.len(), 5);
        assert_eq!(
            config.controllers(),
            ["apps/v1/ReplicaSet", "apps/v1/Deployment"]
        );
        let owns_rs = &config.rules[3];
        assert_eq!(config.resources[owns_rs.resource].gvk.kind, "ReplicaSet");
        assert_eq!(
            owns_rs.kind,
            RuleKind::Owns {
                owner: Gvk::parse("apps/v1", "Deployment").unwrap(),
                through: None,
            }
        );
        assert!(!config.namespaces.admits("kube-system"));
        assert!(config.namespaces.admits("default"));
        assert!(config.namespaces.admits(""));
    }

    #[test]
    fn errors_name_the_field() {
        assert!(error("controllers: [{name: x}]").contains("controllers[0].for: is required"));
        assert!(
            error("controllers: [{name: a, for: {apiVersion: v1, kind: Pod}, owns: [{apiVersion: v1, kind: pod}]}]")
                .contains("controllers[0].owns[0]: kind \"pod\"")
        );
        assert!(
            error("controllers: [{name: a, for: {apiVersion: /v1, kind: Pod}}]")
                .contains("controllers[0].for: apiVersion \"/v1\"")
        );
        assert!(
            error("shardCount: 0\nresources: [{apiVersion: v1, kind: Pod}]")
                .contains("shardCount: must be at least 1")
        );
        assert!(
            error("resyncPeriod: soon\nresources: [{apiVersion: v1, kind: Pod}]")
                .contains("resyncPeriod: \"soon\"")
        );
        assert!(
            error("namespaces: {include: [a], exclude: [b]}")
                .contains("namespaces: set include or exclude")
        );
        assert!(error("namespaces: {include: [Bad_NS]}").contains("namespaces.include[0]"));
        assert!(
            error("controllers: [{name: a, for: {apiVersion: v1, kind: Pod}}, {name: a, for: {apiVersion: v1, kind: Pod}}]")
                .contains("controllers[1].name: \"a\" is already used by controllers[0]")
        );
        assert!(
            error("resources: [{apiVersion: v1, kind: Pod}, {apiVersion: v1, kind: Pod}]")
                .contains("resources[1]: v1/Pod is already listed as resources[0]")
        );
        assert!(
            error("controllers: [{name: a, for: {apiVersion: v1, kind: Pod}, mapByLabel: [{apiVersion: v1, kind: Pod, label: ''}]}]")
                .contains("controllers[0].mapByLabel[0].label: must not be empty")
        );
    }

    #[test]
    fn owns_through_caches_the_kind_between_and_is_validated() {
        let config = Config::from_yaml(
            "controllers: [{name: d, for: {apiVersion: apps/v1, kind: Deployment}, owns: [{apiVersion: v1, kind: Pod, through: {apiVersion: apps/v1, kind: ReplicaSet}}]}]",
        )
        .unwrap();
        let kinds: Vec<String> = config.resources.iter().map(|r| r.gvk.to_string()).collect();
        assert_eq!(
            kinds,
            ["apps/v1/Deployment", "apps/v1/ReplicaSet", "v1/Pod"]
        );
        assert_eq!(
            config.rules[1].kind,
            RuleKind::Owns {
                owner: Gvk::parse("apps/v1", "Deployment").unwrap(),
                through: Some(1),
            }
        );
        assert!(
            error("controllers: [{name: d, for: {apiVersion: apps/v1, kind: Deployment}, owns: [{apiVersion: v1, kind: Pod, through: {apiVersion: v1, kind: Pod}}]}]")
                .contains("controllers[0].owns[0].through: v1/Pod is the owned kind itself")
        );
        assert!(
            error("controllers: [{name: d, for: {apiVersion: apps/v1, kind: Deployment}, owns: [{apiVersion: v1, kind: Pod, through: {apiVersion: apps/v1, kind: Deployment}}]}]")
                .contains("controllers[0].owns[0].through: apps/v1/Deployment is the for kind")
        );
        assert!(
            error("controllers: [{name: d, for: {apiVersion: apps/v1, kind: Deployment}, owns: [{apiVersion: v1, kind: Pod, through: {apiVersion: apps/v1, kind: replicaset}}]}]")
                .contains("controllers[0].owns[0].through: kind \"replicaset\"")
        );
        assert!(
            error("controllers: [{name: d, for: {apiVersion: apps/v1, kind: Deployment, through: {apiVersion: apps/v1, kind: ReplicaSet}}}]")
                .contains("controllers[0].for.through: only an owns entry")
        );
    }

    #[test]
    fn a_field_selector_is_checked_and_named_by_its_field_when_wrong() {
        let config = Config::from_yaml(
            "controllers: [{name: c, for: {apiVersion: v1, kind: Pod, fieldSelector: ' spec.nodeName=n1 '}}]",
        )
        .unwrap();
        assert_eq!(
            config.rules[0].field_selector.as_deref(),
            Some("spec.nodeName=n1")
        );
        let error = Config::from_yaml(
            "controllers: [{name: c, for: {apiVersion: v1, kind: Pod, fieldSelector: 'spec..nodeName=n1'}}]",
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("controllers[0].for.fieldSelector: \"spec..nodeName\" is no field"),
            "{error}"
        );
    }

    #[test]
    fn a_label_selector_is_checked_and_named_by_its_field_when_wrong() {
        let config = Config::from_yaml(
            "controllers:\n  - name: w\n    for: {apiVersion: v1, kind: ConfigMap, labelSelector: ' app = web '}\n",
        )
        .unwrap();
        assert_eq!(config.rules[0].label_selector.as_deref(), Some("app = web"));
        let empty = Config::from_yaml(
            "controllers:\n  - name: w\n    for: {apiVersion: v1, kind: ConfigMap, labelSelector: ''}\n",
        )
        .unwrap();
        assert_eq!(empty.rules[0].label_selector, None);
        let error = Config::from_yaml(
            "controllers:\n  - name: w\n    for: {apiVersion: v1, kind: ConfigMap}\n    mapByName:\n      - {apiVersion: v1, kind: Secret, labelSelector: 'app in web'}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("controllers[0].mapByName[0].labelSelector"),
            "{error}"
        );
        let long = format!("a={}", "x".repeat(MAX_LABEL_SELECTOR));
        assert!(
            checked_label_selector(&long)
                .unwrap_err()
                .contains("at most 4096")
        );
    }

    #[test]
    fn a_controllers_namespaces_are_names_sorted_once_and_on_every_rule() {
        let config = Config::from_yaml(
            "controllers:\n  - name: w\n    for: {apiVersion: v1, kind: ConfigMap}\n    namespaces: [b, a, b]\n    owns:\n      - {apiVersion: v1, kind: Pod}\n",
        )
        .unwrap();
        for rule in &config.rules {
            assert_eq!(rule.namespaces, ["a", "b"]);
        }
        let error = Config::from_yaml(
            "controllers:\n  - name: w\n    for: {apiVersion: v1, kind: ConfigMap}\n    namespaces: [a, Team_B]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("controllers[0].namespaces[1]"), "{error}");
        assert!(
            error.contains("\"Team_B\" is not a namespace name"),
            "{error}"
        );
        let many: Vec<String> = (0..=MAX_CONTROLLER_NAMESPACES)
            .map(|i| format!("n{i}"))
            .collect();
        assert!(
            checked_namespaces(&many)
                .unwrap_err()
                .1
                .contains("at most 256")
        );
    }

    #[test]
    fn batch_periods_are_durations_up_to_a_minute() {
        let rules = |batch: &str| {
            format!(
                "controllers: [{{name: r, for: {{apiVersion: apps/v1, kind: ReplicaSet}}, owns: [{{apiVersion: v1, kind: Pod, batchPeriod: {batch}}}]}}]"
            )
        };
        let config = Config::from_yaml(&rules("250ms")).unwrap();
        assert_eq!(config.rules[0].batch_period, None);
        assert_eq!(
            config.rules[1].batch_period,
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            Config::from_yaml(&rules("0s")).unwrap().rules[1].batch_period,
            None
        );
        assert!(
            error(&rules("soon"))
                .contains("controllers[0].owns[0].batchPeriod: \"soon\" is not a duration")
        );
        assert!(
            error(&rules("2m"))
                .contains("controllers[0].owns[0].batchPeriod: \"2m\" is longer than 1m")
        );
    }

    #[test]
    fn unknown_fields_and_bad_predicates_are_named() {
        assert!(
            error("resources: [{apiVersion: v1, kind: Pod, metaOnly: true}]").contains("metaOnly")
        );
        assert!(
            error(
                "controllers: [{name: a, for: {apiVersion: v1, kind: Pod, predicates: [always]}}]"
            )
            .contains("always")
        );
    }

    #[test]
    fn the_shipped_configuration_keeps_the_graph_and_grants_and_no_controller() {
        let shipped = include_str!("../../../../deploy/kustomize/base/watcher-config.yaml");
        let config = Config::from_yaml(shipped).unwrap();
        // The built-in controllers register their watches; the file keys the graph alone.
        assert_eq!(config.controllers(), [DEFAULT_COLLECTOR]);
        assert!(config.resources.is_empty() && config.rules.is_empty());
        let pod = Gvk::parse("v1", "Pod").unwrap();
        assert_eq!(
            config.access("switchyard-reconciler", &pod),
            Some(Objects::Full)
        );
        assert_eq!(config.access("someone-else", &pod), None);
        let secret = Gvk::parse("v1", "Secret").unwrap();
        assert_eq!(config.access("switchyard-reconciler", &secret), None);
    }

    #[test]
    fn grants_in_files_of_their_own_add_to_the_file_s_and_are_checked_alike() {
        let file = "registrations:\n  - serviceAccount: switchyard-reconciler\n    kinds: [{apiVersion: v1, kind: ConfigMap, objects: full}]\n";
        let greeting = "registrations:\n  - serviceAccount: greeting-switchyard-reconciler\n    kinds: [{apiVersion: example.switchyard.io/v1, kind: Greeting, objects: full}]\n";
        let config = Config::from_yaml_with_grants(
            file,
            &[("greeting.registrations.yaml".into(), greeting.into())],
        )
        .unwrap();
        let greetings = Gvk::parse("example.switchyard.io/v1", "Greeting").unwrap();
        assert_eq!(
            config
                .grants
                .granted("greeting-switchyard-reconciler", &greetings),
            Some(Objects::Full)
        );
        assert_eq!(
            config.grants.granted("switchyard-reconciler", &greetings),
            None
        );
        // Anything but registrations, named by the file.
        let error = Config::from_yaml_with_grants(
            file,
            &[("bad.registrations.yaml".into(), "shardCount: 4\n".into())],
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.starts_with("bad.registrations.yaml: not a file of registrations only"),
            "{error}"
        );
        // An account granted twice, across files, is refused as within one.
        let error = Config::from_yaml_with_grants(
            file,
            &[("again.registrations.yaml".into(), file.into())],
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("\"switchyard-reconciler\" is already listed"),
            "{error}"
        );
    }

    #[test]
    fn a_configuration_without_controllers_waits_for_registrations() {
        let config =
            Config::from_yaml("shardCount: 8\nnamespaces: {exclude: [kube-system]}\n").unwrap();
        assert!(config.resources.is_empty() && config.rules.is_empty());
        assert_eq!(config.shard_count, 8);
        assert!(!config.namespaces.admits("kube-system"));
        assert_eq!(
            Config::from_yaml("{}").unwrap().shard_count,
            DEFAULT_SHARD_COUNT
        );
    }

    #[test]
    fn include_admits_only_the_listed_namespaces() {
        let ns = Namespaces {
            include: vec!["a".into()],
            exclude: vec![],
        };
        assert!(ns.admits("a"));
        assert!(!ns.admits("b"));
        assert!(ns.admits(""));
    }

    #[test]
    fn the_garbage_collector_alone_is_a_configuration_with_kcm_defaults() {
        let config = Config::from_yaml("garbageCollector: {}\n").unwrap();
        let collector = config.collector.as_ref().unwrap();
        assert_eq!(collector.controller, DEFAULT_COLLECTOR);
        assert_eq!(collector.rediscovery_period, Duration::from_secs(30));
        assert!(collector.ignores("", "events"));
        assert!(collector.ignores("events.k8s.io", "events"));
        assert!(!collector.ignores("", "pods"));
        assert_eq!(config.controllers(), [DEFAULT_COLLECTOR]);
        let config = Config::from_yaml(
            "garbageCollector: {controller: gc, ignoredResources: [], rediscoveryPeriod: 1m}\n",
        )
        .unwrap();
        let collector = config.collector.unwrap();
        assert!(collector.ignored.is_empty());
        assert_eq!(collector.rediscovery_period, Duration::from_secs(60));
    }

    #[test]
    fn garbage_collector_errors_name_the_field() {
        for (text, field) in [
            (
                "garbageCollector: {rediscoveryPeriod: 0s}",
                "garbageCollector.rediscoveryPeriod",
            ),
            (
                "garbageCollector: {rediscoveryPeriod: soon}",
                "garbageCollector.rediscoveryPeriod",
            ),
            (
                "garbageCollector: {controller: \"\"}",
                "garbageCollector.controller",
            ),
            (
                "garbageCollector: {ignoredResources: [{group: apps, resource: \"a/b\"}]}",
                "garbageCollector.ignoredResources[0].resource",
            ),
            (
                "controllers: [{name: gc, for: {apiVersion: v1, kind: Pod}}]\ngarbageCollector: {controller: gc}",
                "garbageCollector.controller",
            ),
        ] {
            assert!(error(text).starts_with(field), "{text}: {}", error(text));
        }
    }

    const GRANTS: &str = r#"
resources:
  - {apiVersion: v1, kind: Pod, metadataOnly: true}
controllers:
  - name: apps/v1/ReplicaSet
    for: {apiVersion: apps/v1, kind: ReplicaSet}
registrations:
  - serviceAccount: greeting-switchyard-reconciler
    kinds:
      - {apiVersion: example.switchyard.io/v1, kind: Greeting, objects: full}
      - {apiVersion: v1, kind: ConfigMap}
      - {apiVersion: v1, kind: Pod, objects: full}
  - serviceAccount: switchyard-reconciler
    kinds: []
"#;

    #[test]
    fn grants_are_per_account_deny_by_default_and_metadata_unless_full() {
        let config = Config::from_yaml(GRANTS).unwrap();
        let gvk = |api_version, kind| Gvk::parse(api_version, kind).unwrap();
        let greeting = "greeting-switchyard-reconciler";
        // The file's kinds, to any account, as the file caches them; a grant adds to them.
        for account in ["switchyard-reconciler", "other-switchyard-reconciler"] {
            assert_eq!(
                config.access(account, &gvk("apps/v1", "ReplicaSet")),
                Some(Objects::Full)
            );
            assert_eq!(
                config.access(account, &gvk("v1", "Pod")),
                Some(Objects::Metadata)
            );
            assert_eq!(config.access(account, &gvk("v1", "ConfigMap")), None);
        }
        assert_eq!(
            config.access(greeting, &gvk("v1", "Pod")),
            Some(Objects::Full)
        );
        assert_eq!(
            config.access(greeting, &gvk("example.switchyard.io/v1", "Greeting")),
            Some(Objects::Full)
        );
        assert_eq!(
            config.access(greeting, &gvk("v1", "ConfigMap")),
            Some(Objects::Metadata)
        );
        // Nothing listed is granted: Secrets, another version of a granted kind.
        assert_eq!(config.access(greeting, &gvk("v1", "Secret")), None);
        assert_eq!(
            config.access(greeting, &gvk("example.switchyard.io/v2", "Greeting")),
            None
        );
    }

    #[test]
    fn malformed_grants_name_the_field() {
        let grants = |text: &str| error(&format!("registrations:\n{text}"));
        assert_eq!(
            grants("  - kinds: [{apiVersion: v1, kind: Pod}]"),
            "registrations[0].serviceAccount: required: the service account of the \
             registrant's certificate"
        );
        assert_eq!(
            grants(
                "  - {serviceAccount: a-switchyard-reconciler, kinds: []}\n  - {serviceAccount: a-switchyard-reconciler, kinds: [{apiVersion: v1, kind: Pod}]}"
            ),
            "registrations[1].serviceAccount: \"a-switchyard-reconciler\" is already listed; \
             list all its kinds in one entry"
        );
        assert_eq!(
            grants(
                "  - serviceAccount: spiffe://cluster.local/ns/switchyard/sa/switchyard-reconciler"
            ),
            "registrations[0].serviceAccount: \"spiffe://cluster.local/ns/switchyard/sa/\
             switchyard-reconciler\" is not a service account name (lowercase letters, digits, \
             '-' and '.', at most 253): write the <name> of the certificate's \
             spiffe://<trust domain>/ns/<namespace>/sa/<name>"
        );
        assert_eq!(
            grants(
                "  - serviceAccount: a-switchyard-reconciler\n    kinds: [{apiVersion: v1, kind: Pod}, {apiVersion: v1, kind: Pod, objects: full}]"
            ),
            "registrations[0].kinds[1]: v1/Pod is listed twice"
        );
        assert!(
            grants(
                "  - serviceAccount: a-switchyard-reconciler\n    kinds: [{apiVersion: v1/, kind: Pod}]"
            )
            .starts_with("registrations[0].kinds[0]: apiVersion \"v1/\""),
        );
        assert!(
            grants(
                "  - serviceAccount: a-switchyard-reconciler\n    kinds: [{apiVersion: v1, kind: Pod, objects: all}]"
            )
            .contains("unknown variant `all`"),
        );
    }

    #[test]
    fn a_resource_is_reconciled_by_the_controllers_it_is_for() {
        let config = Config::from_yaml(GRANTS).unwrap();
        let index = |kind: &str| {
            config
                .resources
                .iter()
                .position(|r| r.gvk.kind == kind)
                .unwrap()
        };
        let of = |kind| config.reconciled_by(index(kind)).collect::<Vec<_>>();
        assert_eq!(of("ReplicaSet"), ["apps/v1/ReplicaSet"]);
        assert!(of("Pod").is_empty(), "cached only");
    }

    #[test]
    fn the_graph_is_read_only_by_the_accounts_granted_it() {
        let config = Config::from_yaml(
            "garbageCollector: {}
registrations:
  - {serviceAccount: switchyard-reconciler, graph: true}
  - {serviceAccount: vault-switchyard-reconciler, kinds: [{apiVersion: v1, kind: Secret, objects: full}]}",
        )
        .unwrap();
        assert!(config.grants.reads_graph("switchyard-reconciler"));
        assert!(!config.grants.reads_graph("vault-switchyard-reconciler"));
        assert!(!config.grants.reads_graph("other-switchyard-reconciler"));
    }
}
