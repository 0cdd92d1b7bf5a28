//! What a controller implements, and the registry a worker runs them from.

use std::{collections::BTreeMap, fmt, future::Future, sync::Arc, time::Duration};

use futures::future::BoxFuture;

use super::{Action, Context, Error, Request, Result, Watches, webhook::Webhooks, writes::Write};

/// A controller: a name its keys carry and a reconcile. Implement it with `async fn`:
///
/// ```ignore
/// impl Controller for Mine {
///     fn name(&self) -> &str { "example.com/v1/Thing" }
///     async fn reconcile(&self, ctx: &Context, request: &Request) -> Result { ... }
/// }
/// ```
///
/// or let [`super::Builder`] make one from a typed reconcile function and its watches.
pub trait Controller: Send + Sync + 'static {
    /// The name the keys carry, for example `apps/v1/ReplicaSet`.
    fn name(&self) -> &str;

    /// Reconciles the object the request names, reading fresh state: what to do next, or an error
    /// (retried with backoff unless [`Controller::error_policy`] says otherwise).
    fn reconcile(&self, ctx: &Context, request: &Request) -> impl Future<Output = Result> + Send;

    /// What a failed reconcile asks for (kube-rs's `error_policy`): by default a retry with
    /// the queue's per-key exponential backoff ([`Action::Backoff`]).
    fn error_policy(&self, _error: &Error, _request: &Request) -> Action {
        Action::Backoff
    }

    /// The watches this controller declares in code, registered with the watcher when the
    /// reconciler starts; `None` when the watcher's configuration file names them (the
    /// built-in controllers).
    fn watches(&self) -> Option<Watches> {
        None
    }

    /// The controllers that run this controller's mapping functions
    /// ([`super::Map::with`]), registered beside it; none unless [`super::Builder`] made it.
    fn mappings(&self) -> Vec<Registered> {
        Vec::new()
    }

    /// What this controller writes to the apiserver ([`crate::Builder::writes`]): what its
    /// identity's RBAC must grant.
    fn writes(&self) -> Vec<Write> {
        Vec::new()
    }
}

/// [`Controller`] behind a pointer: what the registry holds.
pub(crate) trait DynController: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn reconcile<'a>(&'a self, ctx: &'a Context, request: &'a Request) -> BoxFuture<'a, Result>;
    fn error_policy(&self, error: &Error, request: &Request) -> Action;
    fn watches(&self) -> Option<Watches>;
    fn writes(&self) -> Vec<Write>;
}

impl<C: Controller> DynController for C {
    fn name(&self) -> &str {
        Controller::name(self)
    }

    fn reconcile<'a>(&'a self, ctx: &'a Context, request: &'a Request) -> BoxFuture<'a, Result> {
        Box::pin(Controller::reconcile(self, ctx, request))
    }

    fn error_policy(&self, error: &Error, request: &Request) -> Action {
        Controller::error_policy(self, error, request)
    }

    fn watches(&self) -> Option<Watches> {
        Controller::watches(self)
    }

    fn writes(&self) -> Vec<Write> {
        Controller::writes(self)
    }
}

/// A registered controller, as a worker calls it.
#[derive(Clone)]
pub struct Registered(Arc<dyn DynController>);

impl Registered {
    pub(crate) fn new(controller: impl Controller) -> Self {
        Self(Arc::new(controller))
    }

    /// The name its keys carry.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// Runs one reconcile.
    pub async fn reconcile(&self, ctx: &Context, request: &Request) -> Result {
        self.0.reconcile(ctx, request).await
    }

    /// What a failed reconcile asks for.
    pub fn error_policy(&self, error: &Error, request: &Request) -> Action {
        self.0.error_policy(error, request)
    }

    /// The watches it declares in code.
    pub fn watches(&self) -> Option<Watches> {
        self.0.watches()
    }

    /// What it declares it writes.
    pub fn writes(&self) -> Vec<Write> {
        self.0.writes()
    }
}

impl fmt::Debug for Registered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Registered").field(&self.name()).finish()
    }
}

/// The controllers a worker runs, by name: those registered and the ones that run their
/// mapping functions.
#[derive(Clone, Default)]
pub struct Registry {
    controllers: BTreeMap<String, Registered>,
    /// Each mapping controller's name, and the name of the controller it maps for.
    mapping_for: BTreeMap<String, String>,
    /// The user each controller's requests impersonate, where it acts as one of its own.
    users: BTreeMap<String, String>,
    /// The admission and conversion webhooks the binary serves beside its controllers.
    pub(crate) webhooks: Webhooks,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.controllers.keys()).finish()
    }
}

impl Registry {
    /// Adds a controller and its mapping controllers; a second one with the same name
    /// replaces the first.
    pub fn register(&mut self, controller: impl Controller) -> &mut Self {
        let name = Controller::name(&controller).to_owned();
        self.mapping_for.retain(|_, target| *target != name);
        for mapping in Controller::mappings(&controller) {
            self.mapping_for
                .insert(mapping.name().to_owned(), name.clone());
            self.controllers.insert(mapping.name().to_owned(), mapping);
        }
        self.controllers
            .insert(name, Registered(Arc::new(controller)));
        self
    }

    /// Makes the apiserver requests of the controller `name` (its Events' included)
    /// impersonate `user` (`system:serviceaccount:<namespace>:<name>`), as
    /// kube-controller-manager's `--use-service-account-credentials` makes each of its
    /// controllers act as its own service account; the reconciler's identity must be allowed
    /// to impersonate it.
    pub fn act_as(&mut self, name: &str, user: impl Into<String>) -> &mut Self {
        self.users.insert(name.to_owned(), user.into());
        self
    }

    /// The user the controller `name` acts as ([`Registry::act_as`]); `None`: the
    /// reconciler's own identity.
    pub fn user(&self, name: &str) -> Option<&str> {
        self.users.get(name).map(String::as_str)
    }

    /// Every controller that acts as a user of its own, with that user.
    pub fn users(&self) -> &BTreeMap<String, String> {
        &self.users
    }

    /// Adds admission and conversion webhooks for the reconciler to serve over HTTPS
    /// (`--webhook-addr`) beside its controllers.
    ///
    /// # Panics
    ///
    /// If a path already has a webhook.
    pub fn webhooks(&mut self, webhooks: Webhooks) -> &mut Self {
        self.webhooks.merge(webhooks);
        self
    }

    /// The controller registered as `name`.
    pub fn get(&self, name: &str) -> Option<Registered> {
        self.controllers.get(name).cloned()
    }

    /// Every controller's name, mapping controllers' included: what the worker leases.
    pub fn names(&self) -> Vec<String> {
        self.controllers.keys().cloned().collect()
    }

    /// The ClusterRole rules the controllers' identity needs for what they declare they
    /// write ([`crate::Builder::writes`]), with the Events every controller writes: one rule
    /// per group and resource, verbs merged and sorted. What a deployment grants the
    /// identity, derived from the code (`tests/deploy.rs` holds the shipped component to it).
    pub fn rbac_rules(&self) -> Vec<switchyard_k8s::k8s_openapi::api::rbac::v1::PolicyRule> {
        let writes: Vec<Write> = self
            .controllers
            .values()
            .flat_map(Registered::writes)
            .collect();
        crate::writes::rules(&writes)
    }

    /// The watches the controllers declare in code, by controller name.
    pub fn watches(&self) -> Vec<(String, Watches)> {
        self.controllers
            .iter()
            .filter_map(|(name, c)| c.watches().map(|w| (name.clone(), w)))
            .collect()
    }

    /// Makes every reconcile first wait `delay`, as if each called a slow external system
    /// (`--simulated-latency`, for benchmarks).
    pub fn add_latency(&mut self, delay: Duration) {
        for (name, controller) in &mut self.controllers {
            if self.mapping_for.contains_key(name) {
                continue;
            }
            *controller = Registered(Arc::new(WithLatency {
                inner: controller.clone(),
                delay,
            }));
        }
    }

    /// Keeps only the named controllers and their mapping controllers; an unknown name is
    /// returned as the error.
    pub fn retain(&mut self, names: &[String]) -> std::result::Result<(), String> {
        if let Some(unknown) = names
            .iter()
            .find(|n| !self.controllers.contains_key(n.as_str()))
        {
            return Err(unknown.clone());
        }
        let mapping_for = &self.mapping_for;
        self.controllers.retain(|name, _| {
            names.contains(name) || mapping_for.get(name).is_some_and(|t| names.contains(t))
        });
        let kept = &self.controllers;
        self.mapping_for.retain(|name, _| kept.contains_key(name));
        self.users.retain(|name, _| kept.contains_key(name));
        Ok(())
    }
}

/// A controller whose reconciles start with a wait.
struct WithLatency {
    inner: Registered,
    delay: Duration,
}

impl Controller for WithLatency {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn reconcile(&self, ctx: &Context, request: &Request) -> Result {
        tokio::time::sleep(self.delay).await;
        self.inner.reconcile(ctx, request).await
    }

    fn error_policy(&self, error: &Error, request: &Request) -> Action {
        self.inner.error_policy(error, request)
    }

    fn watches(&self) -> Option<Watches> {
        self.inner.watches()
    }

    fn writes(&self) -> Vec<Write> {
        self.inner.writes()
    }
}
