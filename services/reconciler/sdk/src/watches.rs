//! What a controller watches, declared in code: the same rules as an entry of the watcher's
//! configuration file (`for`, `owns`, `mapByLabel`, `mapByNamespace`, `mapBySelector`,
//! `mapByPlacement`, `mapByName`), registered with the watcher when the
//! reconciler starts (`switchyard.watcher.v1.Watches/Register`).

use std::time::Duration;

use switchyard_k8s::kube::{Resource, api::GroupVersionKind};

/// When an update keys the controller: any one of the listed predicates holding is enough
/// (controller-runtime's `predicate.Or`); none listed means every update. Creations,
/// deletions and resyncs always key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Predicate {
    /// `metadata.generation` changed: a spec change, for kinds with a status subresource.
    GenerationChanged,
    /// `metadata.labels` changed.
    LabelsChanged,
    /// `metadata.annotations` changed.
    AnnotationsChanged,
    /// The value at this JSON pointer (`/spec/replicas`, `/status/phase`) changed, appeared
    /// or went: a custom predicate over one field of the old and new object, evaluated by the
    /// watcher (it keeps a hash of the value per cached object of the kind). A token may pick
    /// a list's element by one of its fields: `/status/conditions[type=Ready]/status` is the
    /// `Ready` condition's status.
    FieldChanged(String),
    /// The update was not this field manager's write: a controller that writes as this
    /// manager is not keyed by its own writes, only by everyone else's
    /// (kube-controller-manager's `EndpointSliceTracker.ShouldSync`). The watcher reads it
    /// from `managedFields`: an update is the manager's own when its entry changed and no
    /// other manager's did. Writes by [`crate::Context::apply`] carry the controller's
    /// ([`crate::Context::field_manager`]); a `create` or `replace` names it in its
    /// `PostParams::field_manager`. At most one per watch.
    NotWrittenBy(String),
}

/// How one kind is watched.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Keys only the changes that pass any of these (none: every change); creations, deletions and
    /// resyncs always key.
    pub predicates: Vec<Predicate>,
    /// Cache only the objects' metadata (the metadata API), for a kind the controller reads
    /// only the metadata of. An informer shared with a controller that needs the kind in
    /// full caches it in full.
    pub metadata_only: bool,
    /// Hold the keys of this kind's changes this long before they are ready, so that a burst
    /// of changes is one reconcile (the watcher's `batchPeriod`; at most 60 s).
    pub batch_period: Option<Duration>,
    /// The batch period holds only updates that keep `metadata.generation` (the object's
    /// status written); creations, deletions and spec changes key at once.
    pub batch_status_updates_only: bool,
    /// Only objects whose labels match key the controller through this watch (kubectl's
    /// syntax; for an update, the object after it). The watcher checks it when the
    /// controller registers, and runs it: no event it filters out reaches the reconciler.
    pub label_selector: Option<String>,
    /// Only objects whose fields match key the controller through this watch (the
    /// apiserver's syntax, `"spec.nodeName=node-1,status.phase!=Running"`; for an update,
    /// the object after it). Checked and run by the watcher, as the label selector is.
    pub field_selector: Option<String>,
}

impl Options {
    /// Key updates only when one of `predicates` holds.
    pub fn predicates(mut self, predicates: impl IntoIterator<Item = Predicate>) -> Self {
        self.predicates.extend(predicates);
        self
    }

    /// Caches only the objects' metadata: the controller reads them with
    /// [`crate::cache::CacheClient::get_metadata`].
    pub fn metadata_only(mut self) -> Self {
        self.metadata_only = true;
        self
    }

    /// Batch the keys of this kind's changes: a status that moves through several values
    /// in quick succession (Pods turning Ready one after another) is written once.
    pub fn batch_period(mut self, period: Duration) -> Self {
        self.batch_period = Some(period);
        self
    }

    /// Key only the objects whose labels `selector` matches (`"app=web,tier in (a,b)"`),
    /// controller-runtime's `predicate.LabelSelectorPredicate`. The cache still holds every
    /// object of the kind.
    pub fn label_selector(mut self, selector: impl Into<String>) -> Self {
        self.label_selector = Some(selector.into());
        self
    }

    /// Key only the objects whose fields `selector` matches (`"spec.nodeName=node-1"`,
    /// `"status.phase!=Succeeded"`; `=`, `==`, `!=`, requirements joined by commas), as a
    /// field selector narrows a controller-runtime or kube-rs watch: a field absent or null
    /// reads as `""`, a number or boolean matches its JSON text. A name may pick a list's
    /// element by one of its fields, as `status.conditions[type=Ready].status=True` (the
    /// apiserver has no such selector). The watcher's cache still holds every object of the
    /// kind (it is shared), and the watcher evaluates it.
    pub fn field_selector(mut self, selector: impl Into<String>) -> Self {
        self.field_selector = Some(selector.into());
        self
    }

    /// Batch only this kind's status updates (the generation kept) for `period`, as
    /// kube-controller-manager's Job controller does with a Job's own updates: a status
    /// written is one reconcile with the Pod changes of the same second, while a creation or
    /// a spec change is reconciled at once.
    pub fn batch_status_updates(mut self, period: Duration) -> Self {
        self.batch_period = Some(period);
        self.batch_status_updates_only = true;
        self
    }
}

/// One watched kind and how its changes become keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watch {
    /// The watched kind.
    pub gvk: GroupVersionKind,
    /// How it is watched.
    pub options: Options,
    /// `owns` only: the kind between the object and the owner.
    pub through: Option<GroupVersionKind>,
    /// `by_label` only: the label whose value names the object to key.
    pub label: Option<String>,
}

impl Watch {
    /// The watch of `K` with these options.
    pub fn of<K: Resource<DynamicType = ()>>(options: Options) -> Self {
        Self {
            gvk: gvk_of::<K>(),
            options,
            through: None,
            label: None,
        }
    }
}

/// Everything one controller watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watches {
    /// The kind reconciled (For): a change keys the object itself.
    pub reconciles: Watch,
    /// Kinds controlled (Owns): a change keys the controller owner.
    pub owns: Vec<Watch>,
    /// Kinds mapped by a label: a change keys the object its label's value names.
    pub by_label: Vec<Watch>,
    /// Kinds mapped to their namespace: a change keys the Namespace the object lives in
    /// (for a controller of Namespaces).
    pub by_namespace: Vec<Watch>,
    /// Kinds mapped by the reconciled kind's `spec.selector`: a change keys every object of
    /// the reconciled kind in its namespace whose selector matches its labels.
    pub by_selector: Vec<Watch>,
    /// Nodes mapped by placement: a Node's creation, deletion or change of labels or taints
    /// keys every object of the reconciled kind whose Pod template fits it differently.
    pub by_placement: Vec<Watch>,
    /// Kinds mapped by name: a change keys the object of the reconciled kind with the same
    /// namespace and name (a Service for its Endpoints).
    pub by_name: Vec<Watch>,
    /// The namespaces the controller works in ([`super::Builder::namespaces`]); empty:
    /// every one.
    pub namespaces: Vec<String>,
}

impl Watches {
    /// Every watch: the reconciled kind's, then each mapping's.
    pub fn all(&self) -> impl Iterator<Item = &Watch> {
        std::iter::once(&self.reconciles)
            .chain(&self.owns)
            .chain(&self.by_label)
            .chain(&self.by_namespace)
            .chain(&self.by_selector)
            .chain(&self.by_placement)
            .chain(&self.by_name)
    }
}

/// The group, version and kind of `K`.
pub fn gvk_of<K: Resource<DynamicType = ()>>() -> GroupVersionKind {
    GroupVersionKind::gvk(&K::group(&()), &K::version(&()), &K::kind(&()))
}

/// The name a controller of `K` takes unless it is given one: `group/version/Kind`
/// (`apps/v1/ReplicaSet`; `v1/Pod` in the core group), as the built-in controllers are named.
pub fn default_name<K: Resource<DynamicType = ()>>() -> String {
    crate::cache::kind_key::<K>()
}
