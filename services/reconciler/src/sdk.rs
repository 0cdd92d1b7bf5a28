//! The controller SDK: what a controller implements and what it is given.
//!
//! ```text
//!  queue ─ leased key (controller, namespace, name) ─► worker ─► Controller::reconcile(ctx, request)
//!                                                                   │ reads: ctx.cache (watcher)
//!                                                                   │ writes: ctx.client (apiserver, rate-limited)
//!                                                                   ▼
//!                                    Done | RequeueAfter(d) | Err (backoff) ─► outcome to the queue
//! ```
//!
//! A controller is registered under the name its keys carry (`apps/v1/ReplicaSet`); the
//! watcher's configuration maps events to keys of that name. A reconcile reads fresh state
//! (a key is not a snapshot), may be run on any worker, is never run twice at once for one
//! key, and is bounded by the worker's reconcile timeout.

use std::{collections::BTreeMap, fmt, sync::Arc, time::Duration};

use futures::future::BoxFuture;
use switchyard_k8s::{Client, kube};

pub use crate::events::EventType;
use crate::{
    cache::{CacheClient, CacheError},
    events::Recorder,
};

/// What a successful reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Reconciled; the key's failures are forgotten.
    Done,
    /// Reconciled; look again after the delay (for example when something becomes due).
    RequeueAfter(Duration),
}

/// A failed reconcile: the queue retries the key with per-key exponential backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An apiserver call failed. A 409 conflict lands here too: the queue's backoff retries
    /// it, not a loop in the reconcile.
    #[error("apiserver: {}", kube_message(.0))]
    Kube(#[from] switchyard_k8s::kube::Error),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("{0}")]
    Other(String),
}

/// An apiserver refusal as `409 Conflict: <message>`, without the debug dump of the status.
fn kube_message(error: &switchyard_k8s::kube::Error) -> String {
    match error {
        switchyard_k8s::kube::Error::Api(status) => {
            format!("{} {}: {}", status.code, status.reason, status.message)
        }
        other => other.to_string(),
    }
}

impl Error {
    /// A 409 from the apiserver (a write based on a stale read).
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Kube(switchyard_k8s::kube::Error::Api(status)) if status.is_conflict())
    }

    /// The apiserver refused a creation because the namespace is being deleted. The worker
    /// reports such a reconcile as done: no retry, no warning (kube-controller-manager's
    /// `handleErr` forgets the key the same way).
    pub fn is_namespace_terminating(&self) -> bool {
        matches!(self, Self::Kube(error) if is_namespace_terminating(error))
    }
}

/// The apiserver's message for a refusal (what client-go's `StatusError.Error()` says), or
/// the error itself for any other failure: the text kube-controller-manager's Events carry.
pub fn status_message(error: &switchyard_k8s::kube::Error) -> String {
    match error {
        switchyard_k8s::kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

/// The cause the apiserver gives when it refuses a creation in a namespace being deleted.
pub const NAMESPACE_TERMINATING: &str = "NamespaceTerminating";

/// A 403 with the cause `NamespaceTerminating` (`apierrors.HasStatusCause(err,
/// v1.NamespaceTerminatingCause)`).
pub fn is_namespace_terminating(error: &switchyard_k8s::kube::Error) -> bool {
    matches!(error, switchyard_k8s::kube::Error::Api(status)
    if status.details.as_ref().is_some_and(|d| {
        d.causes.iter().any(|c| c.reason == NAMESPACE_TERMINATING)
    }))
}

pub type Result<T = Action, E = Error> = std::result::Result<T, E>;

/// The key being reconciled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Empty for a cluster-scoped object.
    pub namespace: String,
    pub name: String,
    /// 1 for the first attempt since the key's failures were last forgotten.
    pub attempt: u32,
}

/// What a reconcile may use: the apiserver client for writes, the watcher's cache for
/// reads, and an events recorder. Cheap to clone.
#[derive(Clone)]
pub struct Context {
    /// The apiserver, behind this controller's QPS/burst limit.
    pub client: Client,
    /// The watcher's Cache API.
    pub cache: CacheClient,
    /// Events (`events.k8s.io/v1`) about the objects reconciled, as `kubectl describe`
    /// shows them.
    pub events: Events,
}

impl Context {
    /// A context whose events name `instance` (this worker) as their reporting instance.
    pub fn new(client: Client, cache: CacheClient, instance: &str) -> Self {
        let events = Events::new(client.clone(), instance);
        Self {
            client,
            cache,
            events,
        }
    }
}

/// Publishes `events.k8s.io/v1` Events, reported by `switchyard-reconciler` and this worker,
/// correlated as kube-controller-manager's recorder correlates them ([`crate::events`]): each
/// distinct note is an Event of its own, and its repeats within six minutes raise its
/// `series.count`.
#[derive(Clone, Debug)]
pub struct Events(Recorder);

impl Events {
    pub fn new(client: Client, instance: &str) -> Self {
        Self(Recorder::new(client, crate::SERVICE, instance))
    }

    /// Records `reason` (PascalCase, at most 128 characters) for the `action` taken on
    /// `object`, with a human-readable `note`. The Event is written in the background, in
    /// order; the reconcile does not wait for it, and a failure to write it is logged.
    pub fn publish<K>(
        &self,
        object: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: impl Into<String>,
    ) where
        K: kube::Resource<DynamicType = ()>,
    {
        self.0
            .publish(&object.object_ref(&()), type_, reason, action, &note.into());
    }

    /// [`Events::publish`] about an object named by reference (one of any kind, as the
    /// garbage collector sees them).
    pub fn publish_reference(
        &self,
        regarding: &switchyard_k8s::k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: impl Into<String>,
    ) {
        self.0
            .publish(regarding, type_, reason, action, &note.into());
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

/// A controller. Implement `reconcile` with `Box::pin(async move { ... })`.
pub trait Controller: Send + Sync + 'static {
    /// The name the keys carry, for example `apps/v1/ReplicaSet`.
    fn name(&self) -> &str;

    fn reconcile<'a>(&'a self, ctx: &'a Context, request: &'a Request) -> BoxFuture<'a, Result>;
}

/// The controllers a worker runs, by name.
#[derive(Clone, Default)]
pub struct Registry(BTreeMap<String, Arc<dyn Controller>>);

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl Registry {
    /// Adds a controller; a second one with the same name replaces the first.
    pub fn register(&mut self, controller: impl Controller) -> &mut Self {
        self.0
            .insert(controller.name().to_owned(), Arc::new(controller));
        self
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn Controller>> {
        self.0.get(name).cloned()
    }

    pub fn names(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }

    /// Makes every reconcile first wait `delay`, as if each called a slow external system
    /// (`--simulated-latency`, for benchmarks).
    pub fn add_latency(&mut self, delay: Duration) {
        for controller in self.0.values_mut() {
            *controller = Arc::new(WithLatency {
                inner: controller.clone(),
                delay,
            });
        }
    }

    /// Keeps only the named controllers; an unknown name is returned as the error.
    pub fn retain(&mut self, names: &[String]) -> std::result::Result<(), String> {
        if let Some(unknown) = names.iter().find(|n| !self.0.contains_key(n.as_str())) {
            return Err(unknown.clone());
        }
        self.0.retain(|name, _| names.contains(name));
        Ok(())
    }
}

/// A controller whose reconciles start with a wait.
struct WithLatency {
    inner: Arc<dyn Controller>,
    delay: Duration,
}

impl Controller for WithLatency {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn reconcile<'a>(&'a self, ctx: &'a Context, request: &'a Request) -> BoxFuture<'a, Result> {
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            self.inner.reconcile(ctx, request).await
        })
    }
}

#[cfg(test)]
mod tests {
    use switchyard_k8s::kube::core::{
        Status,
        response::{StatusCause, StatusDetails},
    };

    use super::*;

    fn refused(cause: &str) -> Error {
        let mut status = Status::failure(
            "pods \"web-x\" is forbidden: unable to create new content in namespace t because it is being terminated",
            "Forbidden",
        )
        .with_code(403);
        status.details = Some(StatusDetails {
            name: "web-x".into(),
            group: String::new(),
            kind: "pods".into(),
            uid: String::new(),
            causes: vec![StatusCause {
                reason: cause.into(),
                message: "namespace t is being terminated".into(),
                field: "metadata.namespace".into(),
            }],
            retry_after_seconds: 0,
        });
        Error::Kube(switchyard_k8s::kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn a_refusal_in_a_terminating_namespace_is_told_apart_by_its_cause() {
        assert!(refused(NAMESPACE_TERMINATING).is_namespace_terminating());
        // Another 403 (RBAC, admission) is a failure like any other.
        assert!(!refused("FieldValueForbidden").is_namespace_terminating());
        assert!(!Error::Other("namespace terminating".into()).is_namespace_terminating());
        let Error::Kube(error) = refused(NAMESPACE_TERMINATING) else {
            unreachable!()
        };
        assert!(status_message(&error).starts_with("pods \"web-x\" is forbidden"));
    }
}
