//! Switchyard's controller SDK: write a controller as a reconcile function over one kind,
//! declare what it watches, and run it in a reconciler of its own that leases keys from
//! Switchyard's sharded queue and reads objects from the watcher's cache. The built-in
//! controllers of `switchyard-reconciler` are written with it.
//!
//! ```text
//!  queue ─ leased key (controller, namespace, name) ─► worker ─► Controller::reconcile(ctx, request)
//!                                                                   │ reads: ctx.cache (watcher)
//!                                                                   │ writes: ctx.client (apiserver, rate-limited)
//!                                                                   ▼
//!        Ok(Action) ─► done | requeue after | forget | backoff          ─► outcome to the queue
//!        Err(error) ─► Controller::error_policy(error) ─► an Action (backoff by default)
//! ```
//!
//! A controller is registered under the name its keys carry (`apps/v1/ReplicaSet`). What it
//! watches is declared in code ([`Builder`], registered with the watcher at start) or named
//! in the watcher's configuration file (the built-in controllers). A reconcile reads fresh
//! state (a key is not a snapshot), may be run on any worker, is never run twice at once for
//! one key, and is bounded by the worker's reconcile timeout.
//!
//! The crate re-exports the [`kube`] and [`k8s_openapi`] it was built with: a controller
//! crate that names them through it never has to match their versions by hand.
//!
//! # Example
//!
//! A controller that labels every ConfigMap it is given, and the binary that runs it:
//!
//! ```
//! use std::sync::Arc;
//!
//! use switchyard_sdk::{
//!     Action, Builder, Context, Registry, Result,
//!     k8s_openapi::api::core::v1::ConfigMap,
//!     kube::{Api, ResourceExt, api::{Patch, PatchParams}},
//! };
//!
//! async fn reconcile(map: Arc<ConfigMap>, ctx: Context) -> Result {
//!     if map.labels().contains_key("example.com/seen") {
//!         return Ok(Action::Done);
//!     }
//!     let maps: Api<ConfigMap> = ctx.api(&map.namespace().unwrap_or_default());
//!     let patch = serde_json::json!({"metadata": {"labels": {"example.com/seen": "true"}}});
//!     maps.patch(&map.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
//!         .await?;
//!     Ok(Action::Done)
//! }
//!
//! let mut controllers = Registry::default();
//! controllers.register(
//!     Builder::for_::<ConfigMap>()
//!         .named("example.com/v1/SeenConfigMap")
//!         .reconcile(reconcile),
//! );
//! assert_eq!(controllers.names(), ["example.com/v1/SeenConfigMap"]);
//!
//! // The binary's `main` (under `#[tokio::main]`): the reconciler's flags (`--queue-addr`,
//! // `--watcher-addr`, TLS) and its service, until SIGTERM.
//! async fn main(controllers: Registry) -> Result<(), switchyard_sdk::ServiceError> {
//!     switchyard_sdk::run(controllers).await
//! }
//! ```
//!
//! `switchyard-sdk-test` runs a queue, a watcher and a reconciler in a test's process, so
//! that a controller's tests exercise it against a real apiserver.

#![deny(missing_docs)]

mod adoption;
mod apply;
mod builder;
pub mod cache;
pub mod conditions;
mod controller;
pub mod events;
pub mod finalizer;
mod mapping;
mod metrics;
mod ratelimit;
mod refusal;
pub mod registration;
mod service;
mod watches;
pub mod webhook;
mod worker;
pub mod writes;

use std::{fmt, sync::Arc, time::Duration};

use serde::de::DeserializeOwned;
/// What a mapping function returns ([`Map::with`]): kube-rs's reference to an object.
pub use switchyard_k8s::kube::runtime::reflector::ObjectRef;
use switchyard_k8s::{Client, kube::Resource};
use switchyard_queue_client::{Add, Enqueuer, Priority};
/// The clients' runtime: what [`Args::start`] returns, run until shutdown.
pub use switchyard_runtime::Runtime;
pub use {k8s_openapi, kube};

pub use self::events::EventType;
use self::events::Recorder;
pub use self::{
    adoption::{can_adopt, newest_version, owner_references, set_controller_ref},
    builder::{Builder, Built, MAX_REMEMBERED, Map, Policy, backoff},
    controller::{Controller, Registered, Registry},
    refusal::Refusal,
    service::{Args, Config, ReconcilerArgs, SERVICE, ServiceError, WebhookServing, run},
    watches::{Options, Predicate, Watch, Watches, default_name, gvk_of},
    webhook::{Verdict, Webhooks},
    writes::Write,
};
use crate::cache::{CacheClient, CacheError};

/// A kind a controller reconciles: any `kube::Resource` of a static type that the cache can
/// decode (k8s-openapi's types, and `#[derive(CustomResource)]` ones).
pub trait Object:
    Resource<DynamicType = ()> + DeserializeOwned + Clone + fmt::Debug + Send + Sync + 'static
{
}

impl<K> Object for K where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + fmt::Debug + Send + Sync + 'static
{
}

/// What a reconcile asks for next: the queue's outcomes, in kube-rs's and client-go's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Reconciled; the key's failures are forgotten and nothing happens until its next
    /// change (kube-rs's `await_change`).
    Done,
    /// Look again after the delay (for example when something becomes due); kube-rs's
    /// `requeue`, controller-runtime's `RequeueAfter`.
    RequeueAfter(Duration),
    /// Drop the key and its failure count without retrying, even after an error
    /// (client-go's `Forget`, controller-runtime's `TerminalError`): for an error no retry
    /// can fix. A later change keys it again.
    Forget,
    /// Retry with the queue's per-key exponential backoff (client-go's `AddRateLimited`):
    /// what an error asks for unless the controller's error policy says otherwise.
    Backoff,
}

impl Action {
    /// [`Action::Done`].
    pub fn await_change() -> Self {
        Self::Done
    }

    /// [`Action::RequeueAfter`].
    pub fn requeue(after: Duration) -> Self {
        Self::RequeueAfter(after)
    }

    /// [`Action::Forget`].
    pub fn forget() -> Self {
        Self::Forget
    }
}

/// A failed reconcile: the queue retries the key with per-key exponential backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An apiserver call failed. A 409 conflict lands here too: the queue's backoff retries
    /// it, not a loop in the reconcile.
    #[error("apiserver: {}", kube_message(.0))]
    Kube(#[from] switchyard_k8s::kube::Error),
    /// The watcher's cache could not be read.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// Anything else, with its message.
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
        matches!(self, Self::Kube(error) if error.is_conflict())
    }

    /// The apiserver refused a creation because the namespace is being deleted. The worker
    /// reports such a reconcile as done: no retry, no warning (kube-controller-manager's
    /// `handleErr` forgets the key the same way).
    pub fn is_namespace_terminating(&self) -> bool {
        matches!(self, Self::Kube(error) if is_namespace_terminating(error))
    }
}

/// Keeps the first error of a reconcile in `first`, so that the rest of its writes still go
/// ahead and the reconcile fails with that one at the end.
pub fn keep_first(first: &mut Option<Error>, error: impl Into<Error>) {
    if first.is_none() {
        *first = Some(error.into());
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

/// A reconcile's result: the [`Action`] it asks for, or the [`Error`] it failed with.
pub type Result<T = Action, E = Error> = std::result::Result<T, E>;

/// The key being reconciled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Empty for a cluster-scoped object.
    pub namespace: String,
    /// Its name.
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
    /// The queue, for the keys mapping functions return; none outside a running reconciler.
    queue: Option<Arc<Enqueuer>>,
    /// What [`Context::apply`] writes as: the controller's name.
    field_manager: Arc<str>,
}

impl Context {
    /// A context whose events name `instance` (this worker) as their reporting instance.
    pub fn new(client: Client, cache: CacheClient, instance: &str) -> Self {
        let events = Events::new(client.clone(), instance);
        Self::of(client, cache, events)
    }

    /// A context of these parts, without a queue to enqueue to.
    pub fn of(client: Client, cache: CacheClient, events: Events) -> Self {
        Self {
            client,
            cache,
            events,
            queue: None,
            field_manager: SERVICE.into(),
        }
    }

    /// The same context, applying as `controller` ([`Context::apply`]).
    pub fn managed_as(mut self, controller: &str) -> Self {
        self.field_manager = apply::field_manager_of(controller).into();
        self
    }

    /// The same context, enqueueing what mapping functions return through `queue`.
    pub(crate) fn enqueueing_to(mut self, queue: Arc<Enqueuer>) -> Self {
        self.queue = Some(queue);
        self
    }

    /// Sends `keys` to the queue (each ready at once, or after its delay: a key already
    /// waiting keeps the earlier time), each carrying the current span's trace context;
    /// returns once they wait in the reconciler's pending set (from where they are sent, and
    /// resent until a queue takes them), which is bounded: a slow queue makes this wait.
    pub async fn enqueue(&self, keys: impl IntoIterator<Item = impl Into<Add>>) -> Result<()> {
        let keys: Vec<Add> = keys.into_iter().map(Into::into).collect();
        if keys.is_empty() {
            return Ok(());
        }
        let queue = self.queue.as_ref().ok_or_else(|| {
            Error::Other("no queue to enqueue to: this context is not a reconciler's".into())
        })?;
        let fields = switchyard_runtime::trace::inject(&tracing::Span::current());
        let cause = (!fields.is_empty()).then(|| Arc::new(fields));
        // Caused by a reconcile, not by a watch event: no observation time to hand on.
        queue.push(keys, Priority::Normal, cause, None).await;
        Ok(())
    }
}

/// Publishes `events.k8s.io/v1` Events, reported by `switchyard-reconciler` and this worker,
/// correlated as kube-controller-manager's recorder correlates them ([`events`]): each
/// distinct note is an Event of its own, and its repeats within six minutes raise its
/// `series.count`.
#[derive(Clone, Debug)]
pub struct Events(Recorder);

impl Events {
    /// Events reported by this reconciler, with `instance` (the worker) as the reporting instance.
    pub fn new(client: Client, instance: &str) -> Self {
        Self(Recorder::new(client, SERVICE, instance))
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

impl Context {
    /// An `Api` for the namespaced `K` objects of `namespace`, through this controller's
    /// rate-limited client.
    pub fn api<K>(&self, namespace: &str) -> kube::Api<K>
    where
        K: kube::Resource<
                DynamicType = (),
                Scope = switchyard_k8s::k8s_openapi::NamespaceResourceScope,
            >,
    {
        kube::Api::namespaced(self.client.clone(), namespace)
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
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
