//! A controller from a typed reconcile function and its watches, in controller-runtime's
//! words:
//!
//! ```ignore
//! Builder::for_::<Greeting>()            // a change to a Greeting keys it
//!     .owns::<ConfigMap>()               // a change to a ConfigMap it controls keys it
//!     .watches::<Secret>(Map::with(refs))// a change to a Secret keys what refs returns
//!     .reconcile(reconcile)              // async fn(Arc<Greeting>, Context) -> Result
//!     .error_policy(error_policy)        // optional: fn(&Error, &Request) -> Action
//! ```
//!
//! The worker leases a key, the controller reads the object from the watcher's cache and
//! calls the function with it; an object gone from the cache is done (its deletion's
//! effects belong to a finalizer or the garbage collector). The watches are registered with
//! the watcher when the reconciler starts ([`super::Controller::watches`]).

use std::{fmt, future::Future, marker::PhantomData, sync::Arc};

use switchyard_k8s::{
    Namespace,
    kube::{Resource, runtime::reflector::ObjectRef},
};

use super::{
    Action, Context, Controller, Error, Object, Registered, Request, Result,
    mapping::{MapFn, Mapping, erase, mapping_name},
    watches::{Options, Watch, Watches, default_name},
    writes::Write,
};

/// How a change of a watched kind `V` maps to keys of the reconciled kind `K`
/// (`Builder::watches`).
pub struct Map<V, K: Resource>(MapBy<V, K>);

enum MapBy<V, K: Resource> {
    /// Evaluated by the watcher: no user code runs there.
    Label(String),
    /// The object's Namespace, evaluated by the watcher.
    Namespace,
    /// The objects whose `spec.selector` matches the object, evaluated by the watcher.
    Selector,
    /// The objects whose Pod template fits the Node differently, evaluated by the watcher.
    Placement,
    /// The object of the same namespace and name, evaluated by the watcher.
    Name,
    /// Run in the reconciler ([`super::mapping`]).
    With(MapFn<V, K>),
}

impl<V, K: Resource> Map<V, K> {
    /// The object of the reconciled kind, in the same namespace, that this label's value
    /// names: the common case of a mapping, evaluated by the watcher.
    pub fn label(label: impl Into<String>) -> Self {
        Self(MapBy::Label(label.into()))
    }

    /// Every object of the reconciled kind, in the changed object's namespace, whose
    /// `spec.selector` (a `LabelSelector`, or a plain map of labels) matches its labels,
    /// before or after the change: kube-controller-manager's disruption controller hears of
    /// the Pods a PodDisruptionBudget selects this way. Evaluated by the watcher, on
    /// deletions too; the reconciled kind is cached in full; an empty selector selects
    /// nothing.
    pub fn selector() -> Self {
        Self(MapBy::Selector)
    }

    /// For a watch of Nodes: every object of the reconciled kind, in any namespace, whose Pod
    /// template (`spec.template.spec`) fits the Node differently before and after its
    /// creation, deletion or change of labels or taints, as kube-controller-manager decides
    /// where a DaemonSet's Pods run (`NodeShouldRunDaemonPod`, the tolerations it adds
    /// included). A Node's status changes key nothing. Evaluated by the watcher; both kinds
    /// are cached in full.
    pub fn placement() -> Self {
        Self(MapBy::Placement)
    }

    /// The object of the reconciled kind with the changed object's namespace and name
    /// (controller-runtime's `EnqueueRequestForObject` on another kind): kube-controller-
    /// manager's Endpoints controller hears of a Service's Endpoints this way. Evaluated by
    /// the watcher, on deletions too.
    pub fn name() -> Self {
        Self(MapBy::Name)
    }

    /// The objects `map` returns for the changed object (controller-runtime's
    /// `EnqueueRequestsFromMapFunc`, kube-rs's `watches` mapper): any number, in any
    /// namespace (`ObjectRef::new(name).within(namespace)`; no namespace for a
    /// cluster-scoped kind). It runs in a reconciler, on the object read from the watcher's
    /// cache, with the controller's [`Context`] (its cache reads and apiserver client).
    pub fn with<F, Fut>(map: F) -> Self
    where
        F: Fn(Arc<V>, Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<ObjectRef<K>>> + Send + 'static,
    {
        Self(MapBy::With(erase(map)))
    }
}

impl<V> Map<V, Namespace> {
    /// The Namespace the changed object lives in, for a controller of Namespaces: evaluated
    /// by the watcher, on deletions too (kube-controller-manager's service account
    /// controller hears of a deleted ServiceAccount this way). A cluster-scoped object maps
    /// to nothing.
    pub fn namespace() -> Self {
        Self(MapBy::Namespace)
    }
}

impl<V, K: Resource> fmt::Debug for Map<V, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            MapBy::Label(label) => f.debug_tuple("Map::label").field(label).finish(),
            MapBy::Namespace => f.write_str("Map::namespace"),
            MapBy::Selector => f.write_str("Map::selector"),
            MapBy::Placement => f.write_str("Map::placement"),
            MapBy::Name => f.write_str("Map::name"),
            MapBy::With(_) => f.write_str("Map::with(..)"),
        }
    }
}

/// A mapping function waiting for the controller's name (given by `named` at any point
/// of the builder) to become a controller of its own.
struct PendingMapping {
    kind: String,
    make: MakeMapping,
}

/// Makes a mapping controller from its name, its controller's, and the controller's
/// namespaces.
type MakeMapping = Box<dyn FnOnce(String, Arc<str>, Vec<String>) -> Registered + Send + Sync>;

/// Declares a controller: the kind it reconciles, what else it watches, then its reconcile.
pub struct Builder<K = ()> {
    name: Option<String>,
    watches: Watches,
    mappings: Vec<PendingMapping>,
    when: Option<Arc<When<K>>>,
    writes: Vec<Write>,
    kind: PhantomData<fn() -> K>,
}

/// Objects a [`Builder::when`] predicate remembers per controller, at most: past it, it
/// forgets them all, and the next key of each reconciles (fails open).
pub const MAX_REMEMBERED: usize = 10_000;

/// Whether an object changed enough to be reconciled: `(as last reconciled, as it is now)`.
type Changed<K> = Box<dyn Fn(Option<&K>, &K) -> bool + Send + Sync>;

/// A predicate over the object as this reconciler last reconciled it and as it is now, run
/// in the reconciler ([`Builder::when`]).
struct When<K> {
    changed: Changed<K>,
    /// The object at each key's last reconcile that asked for nothing more, by namespace and
    /// name.
    last: std::sync::Mutex<std::collections::HashMap<(String, String), Arc<K>>>,
}

impl<K> When<K> {
    fn last(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<(String, String), Arc<K>>> {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `object` at `key` is to be reconciled.
    fn passes(&self, key: &(String, String), object: &K) -> bool {
        let last = self.last().get(key).cloned();
        (self.changed)(last.as_deref(), object)
    }

    /// Keeps `object` as reconciled when the reconcile asked for nothing more; forgets the
    /// key otherwise, so that a retry or a requeue reconciles whatever the predicate says.
    fn settle(&self, key: (String, String), object: Arc<K>, result: &Result) {
        let mut last = self.last();
        if matches!(result, Ok(Action::Done)) {
            if last.len() >= MAX_REMEMBERED && !last.contains_key(&key) {
                last.clear();
            }
            last.insert(key, object);
        } else {
            last.remove(&key);
        }
    }
}

impl Builder {
    /// A controller of `K`: a change to a `K` keys that object.
    pub fn for_<K: Object>() -> Builder<K> {
        Self::for_with::<K>(Options::default())
    }

    /// [`Builder::for_`] with predicates or metadata only.
    pub fn for_with<K: Object>(options: Options) -> Builder<K> {
        Builder {
            name: None,
            watches: Watches {
                reconciles: Watch::of::<K>(options),
                owns: Vec::new(),
                by_label: Vec::new(),
                by_namespace: Vec::new(),
                by_selector: Vec::new(),
                by_placement: Vec::new(),
                by_name: Vec::new(),
                namespaces: Vec::new(),
            },
            mappings: Vec::new(),
            when: None,
            writes: Vec::new(),
            kind: PhantomData,
        }
    }
}

impl<K: Object> Builder<K> {
    /// The name the controller's keys carry; by default `group/version/Kind` of `K`.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Works in these namespaces only (controller-runtime's `DefaultNamespaces`, a kube-rs
    /// `Controller` over `Api::namespaced`): the watcher drops the keys of objects in any
    /// other namespace, whichever watch made them, and so do [`Map::with`] mappings. A
    /// cluster-scoped object still keys, except a Namespace outside them for a controller of
    /// Namespaces. Reads through the cache are not narrowed. By default every namespace.
    pub fn namespaces(mut self, namespaces: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.watches
            .namespaces
            .extend(namespaces.into_iter().map(Into::into));
        self
    }

    /// Reconciles a key only when `changed(old, new)` holds, `old` being the object as this
    /// reconciler last reconciled it (`None`: never, or forgotten) and `new` as the cache has
    /// it now: controller-runtime's `predicate.Funcs{UpdateFunc}`, kube-rs's
    /// `predicate_filter`, for a predicate the watcher cannot evaluate (it runs no user code;
    /// prefer [`crate::Predicate`]s, which it evaluates before anything is queued).
    ///
    /// It runs in the reconciler, after the key's lease and the cache read, before the
    /// reconcile function: a key it refuses costs a lease and a read, never the reconcile,
    /// and is reported done. A reconcile that fails or asks to be requeued makes the key
    /// forgotten, so a retry or a requeue always passes `None` as `old`. Another replica
    /// has not seen what this one reconciled, so a key it leases passes `None` too: the
    /// predicate may let a reconcile through, never hold one back for good. At most
    /// [`MAX_REMEMBERED`] objects are kept per controller.
    pub fn when<F>(mut self, changed: F) -> Self
    where
        F: Fn(Option<&K>, &K) -> bool + Send + Sync + 'static,
    {
        self.when = Some(Arc::new(When {
            changed: Box::new(changed),
            last: std::sync::Mutex::default(),
        }));
        self
    }

    /// Declares that the controller writes the objects of `U` with `verbs` (`create`,
    /// `patch`, `update`, `delete`): what its identity's RBAC must grant
    /// ([`crate::Registry::rbac_rules`]). Reads need no declaration: they go through the
    /// watcher.
    pub fn writes<U: Resource<DynamicType = ()>>(mut self, verbs: &[&str]) -> Self {
        self.writes.push(Write::of::<U>(verbs));
        self
    }

    /// [`Builder::writes`] for a subresource of `U` (`status`, `scale`).
    pub fn writes_subresource<U: Resource<DynamicType = ()>>(
        mut self,
        subresource: &str,
        verbs: &[&str],
    ) -> Self {
        self.writes
            .push(Write::subresource_of::<U>(subresource, verbs));
        self
    }

    /// A change to a `U` whose controller owner is a `K` keys that owner.
    pub fn owns<U: Resource<DynamicType = ()>>(self) -> Self {
        self.owns_with::<U>(Options::default())
    }

    /// Also keys the owner of each `U` this controller controls, with these watch options.
    pub fn owns_with<U: Resource<DynamicType = ()>>(mut self, options: Options) -> Self {
        self.watches.owns.push(Watch::of::<U>(options));
        self
    }

    /// A change to a `U` controlled by a `Between` that a `K` controls keys that `K` (a Pod
    /// keys the Deployment of its ReplicaSet). The watcher caches `Between` to look it up.
    pub fn owns_through<U, Between>(mut self, options: Options) -> Self
    where
        U: Resource<DynamicType = ()>,
        Between: Resource<DynamicType = ()>,
    {
        let mut watch = Watch::of::<U>(options);
        watch.through = Some(super::watches::gvk_of::<Between>());
        self.watches.owns.push(watch);
        self
    }

    /// A change to a `V` keys the objects of kind `K` that `map` names.
    pub fn watches<V: Object>(self, map: Map<V, K>) -> Self {
        self.watches_with::<V>(map, Options::default())
    }

    /// [`Builder::watches`] with these watch options.
    pub fn watches_with<V: Object>(mut self, map: Map<V, K>, options: Options) -> Self {
        let mut watch = Watch::of::<V>(options);
        match map.0 {
            MapBy::Label(label) => {
                watch.label = Some(label);
                self.watches.by_label.push(watch);
            }
            MapBy::Namespace => self.watches.by_namespace.push(watch),
            MapBy::Selector => self.watches.by_selector.push(watch),
            MapBy::Placement => self.watches.by_placement.push(watch),
            MapBy::Name => self.watches.by_name.push(watch),
            MapBy::With(map) => self.mappings.push(PendingMapping {
                kind: default_name::<V>(),
                make: Box::new(move |name, target, namespaces| {
                    Registered::new(Mapping {
                        name,
                        target,
                        watch,
                        namespaces,
                        map,
                        kinds: PhantomData,
                    })
                }),
            }),
        }
        self
    }

    /// The watches alone, for a controller that implements [`Controller`] itself and
    /// returns them from [`Controller::watches`] (the built-in controllers do). A
    /// [`Map::with`] function runs in the reconcile of a controller the builder makes, so
    /// it needs [`Builder::reconcile`] instead.
    ///
    /// # Panics
    ///
    /// If a [`Map::with`] was given: a programming error, met when the controller starts.
    pub fn into_watches(self) -> Watches {
        assert!(
            self.mappings.is_empty(),
            "Builder::into_watches: a Map::with mapping needs Builder::reconcile"
        );
        self.watches
    }

    /// The controller, reconciling with `reconcile(object, ctx)`; a failure is retried with
    /// the queue's backoff unless an [`Built::error_policy`] says otherwise.
    pub fn reconcile<F, Fut>(self, reconcile: F) -> Built<K, F, Policy>
    where
        F: Fn(Arc<K>, Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result> + Send + 'static,
    {
        let name = self.name.unwrap_or_else(default_name::<K>);
        let target: Arc<str> = Arc::from(name.as_str());
        let mut per_kind: Vec<&str> = Vec::new();
        let mut mappings = Vec::new();
        for pending in &self.mappings {
            per_kind.push(&pending.kind);
            let n = per_kind.iter().filter(|k| **k == pending.kind).count();
            mappings.push(mapping_name(&name, &pending.kind, n));
        }
        let mappings = self
            .mappings
            .into_iter()
            .zip(mappings)
            .map(|(pending, mapping)| {
                (pending.make)(mapping, target.clone(), self.watches.namespaces.clone())
            })
            .collect();
        Built {
            name,
            watches: self.watches,
            mappings,
            reconcile,
            error_policy: backoff,
            when: self.when,
            writes: self.writes,
            kind: PhantomData,
        }
    }
}

impl<K> fmt::Debug for Builder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("name", &self.name)
            .field("watches", &self.watches)
            .field("mappings", &self.mappings.len())
            .finish()
    }
}

/// An error policy: what a failed reconcile of `request` asks for.
pub type Policy = fn(&Error, &Request) -> Action;

/// The default error policy: retry with the queue's per-key exponential backoff.
pub fn backoff(_: &Error, _: &Request) -> Action {
    Action::Backoff
}

/// A controller made by [`Builder`].
pub struct Built<K, F, P> {
    name: String,
    watches: Watches,
    /// The controllers that run its mapping functions.
    mappings: Vec<Registered>,
    reconcile: F,
    error_policy: P,
    when: Option<Arc<When<K>>>,
    writes: Vec<Write>,
    kind: PhantomData<fn() -> K>,
}

impl<K, F, P> Built<K, F, P> {
    /// What a failed reconcile asks for instead of the default backoff (kube-rs's
    /// `error_policy`): [`Action::requeue`] after a fixed delay, [`Action::forget`] for an
    /// error no retry can fix.
    pub fn error_policy<Q>(self, error_policy: Q) -> Built<K, F, Q>
    where
        Q: Fn(&Error, &Request) -> Action + Send + Sync + 'static,
    {
        Built {
            name: self.name,
            watches: self.watches,
            mappings: self.mappings,
            reconcile: self.reconcile,
            error_policy,
            when: self.when,
            writes: self.writes,
            kind: PhantomData,
        }
    }
}

impl<K, F, P> fmt::Debug for Built<K, F, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Built")
            .field("name", &self.name)
            .field("watches", &self.watches)
            .finish_non_exhaustive()
    }
}

impl<K, F, Fut, P> Controller for Built<K, F, P>
where
    K: Object,
    F: Fn(Arc<K>, Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result> + Send + 'static,
    P: Fn(&Error, &Request) -> Action + Send + Sync + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    async fn reconcile(&self, ctx: &Context, request: &Request) -> Result {
        let object = ctx
            .cache
            .get::<K>(&request.namespace, &request.name, None)
            .await?;
        let Some(when) = &self.when else {
            return match object {
                Some(object) => (self.reconcile)(Arc::new(object), ctx.clone()).await,
                None => Ok(Action::Done),
            };
        };
        let key = (request.namespace.clone(), request.name.clone());
        let Some(object) = object else {
            when.last().remove(&key);
            return Ok(Action::Done);
        };
        if !when.passes(&key, &object) {
            tracing::debug!(namespace = %key.0, name = %key.1, "the predicate holds the reconcile back");
            return Ok(Action::Done);
        }
        let object = Arc::new(object);
        let result = (self.reconcile)(object.clone(), ctx.clone()).await;
        when.settle(key, object, &result);
        result
    }

    fn error_policy(&self, error: &Error, request: &Request) -> Action {
        (self.error_policy)(error, request)
    }

    fn watches(&self) -> Option<Watches> {
        Some(self.watches.clone())
    }

    fn mappings(&self) -> Vec<Registered> {
        self.mappings.clone()
    }

    fn writes(&self) -> Vec<Write> {
        self.writes.clone()
    }
}

#[cfg(test)]
mod tests {
    use switchyard_k8s::k8s_openapi::api::{
        apps::v1::{Deployment, ReplicaSet},
        core::v1::{ConfigMap, Pod},
    };

    use super::*;
    use crate::Predicate;

    async fn noop(_: Arc<Deployment>, _: Context) -> Result {
        Ok(Action::await_change())
    }

    #[test]
    fn the_builder_declares_what_the_configuration_file_would() {
        let built = Builder::for_with::<Deployment>(
            Options::default().predicates([Predicate::GenerationChanged]),
        )
        .owns::<ReplicaSet>()
        .owns_through::<Pod, ReplicaSet>(Options::default().metadata_only())
        .watches::<ConfigMap>(Map::label("example.com/deployment"))
        .reconcile(noop);
        assert_eq!(Controller::name(&built), "apps/v1/Deployment");
        let watches = Controller::watches(&built).expect("declared");
        assert_eq!(watches.reconciles.gvk.kind, "Deployment");
        assert_eq!(
            watches.reconciles.options.predicates,
            [Predicate::GenerationChanged]
        );
        let kinds: Vec<_> = watches.owns.iter().map(|w| w.gvk.kind.as_str()).collect();
        assert_eq!(kinds, ["ReplicaSet", "Pod"]);
        let through = watches.owns[1].through.as_ref().expect("through");
        assert_eq!(
            (through.group.as_str(), through.kind.as_str()),
            ("apps", "ReplicaSet")
        );
        assert!(watches.owns[1].options.metadata_only);
        assert_eq!(
            watches.by_label[0].label.as_deref(),
            Some("example.com/deployment")
        );
        assert_eq!(watches.by_label[0].gvk.group, "");
    }

    #[test]
    fn mapping_functions_become_controllers_of_their_own_named_after_the_controller() {
        use crate::{ObjectRef, Registry};

        let refs = |_: Arc<ConfigMap>, _: Context| async { Vec::<ObjectRef<Deployment>>::new() };
        let built = Builder::for_::<Deployment>()
            .watches::<ConfigMap>(Map::with(refs))
            .watches::<ConfigMap>(Map::with(refs))
            .watches::<Pod>(Map::with(|_: Arc<Pod>, _| async { Vec::new() }))
            // Named after the watches: the mappings still take the final name.
            .named("example.com/deployments")
            .reconcile(noop);
        let mappings: Vec<String> = Controller::mappings(&built)
            .iter()
            .map(|m| m.name().to_owned())
            .collect();
        assert_eq!(
            mappings,
            [
                "example.com/deployments/map/v1/ConfigMap",
                "example.com/deployments/map/v1/ConfigMap/2",
                "example.com/deployments/map/v1/Pod",
            ]
        );
        // Each watches its kind as a plain `for`; the controller's own watches do not list
        // them (the watcher never sees the function).
        let watches = Controller::mappings(&built)[2].watches().expect("declared");
        assert_eq!(watches.reconciles.gvk.kind, "Pod");
        assert!(
            Controller::watches(&built)
                .expect("declared")
                .by_label
                .is_empty()
        );

        let mut registry = Registry::default();
        registry.register(built);
        registry.register(
            Builder::for_::<ConfigMap>()
                .reconcile(|_: Arc<ConfigMap>, _| async { Ok(Action::Done) }),
        );
        assert_eq!(registry.names().len(), 5);
        assert_eq!(
            registry.watches().len(),
            5,
            "each mapping registers its watch"
        );
        // Keeping a controller keeps its mappings.
        registry
            .retain(&["example.com/deployments".to_owned()])
            .unwrap();
        assert_eq!(
            registry.names(),
            [
                "example.com/deployments",
                "example.com/deployments/map/v1/ConfigMap",
                "example.com/deployments/map/v1/ConfigMap/2",
                "example.com/deployments/map/v1/Pod",
            ]
        );
    }

    #[test]
    fn a_controller_can_be_named_and_given_an_error_policy() {
        let built = Builder::for_::<ConfigMap>()
            .named("example.com/maps")
            .reconcile(|_: Arc<ConfigMap>, _| async { Ok(Action::Done) })
            .error_policy(|_: &Error, _: &Request| Action::forget());
        assert_eq!(Controller::name(&built), "example.com/maps");
        let request = Request {
            namespace: "ns".into(),
            name: "n".into(),
            attempt: 1,
        };
        let error = Error::Other("boom".into());
        assert_eq!(
            Controller::error_policy(&built, &error, &request),
            Action::Forget
        );
        let default = Builder::for_::<ConfigMap>()
            .reconcile(|_: Arc<ConfigMap>, _| async { Ok(Action::Done) });
        assert_eq!(Controller::name(&default), "v1/ConfigMap");
        assert_eq!(
            Controller::error_policy(&default, &error, &request),
            Action::Backoff
        );
    }

    #[test]
    fn a_when_predicate_sees_the_object_as_last_reconciled_and_forgets_it_after_a_retry() {
        let map = |value: &str| ConfigMap {
            data: Some([("v".to_owned(), value.to_owned())].into()),
            ..ConfigMap::default()
        };
        let when = When::<ConfigMap> {
            changed: Box::new(|old, new| old.is_none_or(|old| old.data != new.data)),
            last: std::sync::Mutex::default(),
        };
        let key = ("team".to_owned(), "web".to_owned());
        // Never reconciled: passes; reconciled (done): the same object no longer does.
        assert!(when.passes(&key, &map("1")));
        when.settle(key.clone(), Arc::new(map("1")), &Ok(Action::Done));
        assert!(!when.passes(&key, &map("1")));
        assert!(when.passes(&key, &map("2")));
        // A requeue or a failure is forgotten: the next lease reconciles.
        when.settle(
            key.clone(),
            Arc::new(map("1")),
            &Ok(Action::requeue(std::time::Duration::from_secs(1))),
        );
        assert!(when.passes(&key, &map("1")));
        when.settle(key.clone(), Arc::new(map("1")), &Ok(Action::Done));
        when.settle(
            key.clone(),
            Arc::new(map("1")),
            &Err(Error::Other("boom".into())),
        );
        assert!(when.passes(&key, &map("1")));
        // Past the bound, everything is forgotten (and reconciles again).
        when.settle(key.clone(), Arc::new(map("1")), &Ok(Action::Done));
        for i in 0..MAX_REMEMBERED {
            when.settle(
                ("team".into(), format!("n{i}")),
                Arc::new(map("1")),
                &Ok(Action::Done),
            );
        }
        assert!(when.passes(&key, &map("1")));
        assert!(when.last().len() <= MAX_REMEMBERED);
    }
}
