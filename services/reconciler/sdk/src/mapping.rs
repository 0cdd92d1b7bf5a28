//! A user's mapping function (controller-runtime's `EnqueueRequestsFromMapFunc`, kube-rs's
//! `watches` mapper), run in the reconciler, never in the watcher:
//!
//! ```text
//!  watcher ── key (C/map/v1/Secret, ns, name) ──► queue ──► reconciler: mapping controller
//!  (a plain `for` watch of the watched kind,                   │ reads the Secret from the cache
//!   registered under the mapping's name)                       │ runs the user's function
//!                                                              ▼
//!                            queue ◄── Enqueue (C, ns, name) × the keys it returned
//! ```
//!
//! The watcher holds no user code: it keys the watched object under a name of its own (the
//! controller's name, `/map/` and the watched kind), as it keys the object of any `for`
//! watch. That name is a controller of its own in the registry, leased and reconciled like
//! any other (one lease per object at a time, retried with backoff when the cache or the
//! queue fails); its reconcile runs the function on the object read from the cache and
//! enqueues the keys it returns under the controller's name, each carrying the trace of the
//! reconcile that mapped it.
//!
//! An object gone from the cache is not mapped (there is nothing to run the function on):
//! a controller that must react to the deletion of a watched object keeps a finalizer on it
//! or an owner reference to it.

use std::{fmt, future::Future, marker::PhantomData, sync::Arc};

use futures::future::BoxFuture;
use switchyard_k8s::kube::{Resource, runtime::reflector::ObjectRef};
use switchyard_queue_client::WorkKey;

use super::{
    Action, Context, Controller, Object, Result,
    watches::{Watch, Watches},
};

/// A mapping function, its types erased: an object of the watched kind to keys of `K`.
pub(super) type MapFn<V, K> =
    Arc<dyn Fn(Arc<V>, Context) -> BoxFuture<'static, Vec<ObjectRef<K>>> + Send + Sync>;

/// Wraps a user's function.
pub(super) fn erase<V, K, F, Fut>(map: F) -> MapFn<V, K>
where
    F: Fn(Arc<V>, Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<ObjectRef<K>>> + Send + 'static,
    K: Resource,
{
    Arc::new(move |object, ctx| Box::pin(map(object, ctx)))
}

/// The name of a controller's mapping of `kind` (its `group/version/Kind`): the controller's
/// own, `/map/`, and the kind; the `n`th mapping of one kind (from 2) adds `/n`.
pub(super) fn mapping_name(controller: &str, kind: &str, n: usize) -> String {
    match n {
        0 | 1 => format!("{controller}/map/{kind}"),
        n => format!("{controller}/map/{kind}/{n}"),
    }
}

/// The controller that runs one mapping function.
pub(super) struct Mapping<V, K: Resource> {
    pub(super) name: String,
    /// The controller the returned keys are for.
    pub(super) target: Arc<str>,
    pub(super) watch: Watch,
    /// The controller's namespaces: keys in others are dropped. Empty: every one.
    pub(super) namespaces: Vec<String>,
    pub(super) map: MapFn<V, K>,
    pub(super) kinds: PhantomData<fn() -> (V, K)>,
}

impl<V, K: Resource> fmt::Debug for Mapping<V, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mapping")
            .field("name", &self.name)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl<V, K> Controller for Mapping<V, K>
where
    V: Object,
    K: Resource + Send + Sync + 'static,
    K::DynamicType: Send + Sync,
{
    fn name(&self) -> &str {
        &self.name
    }

    async fn reconcile(&self, ctx: &Context, request: &super::Request) -> Result {
        let Some(object) = ctx
            .cache
            .get::<V>(&request.namespace, &request.name, None)
            .await?
        else {
            return Ok(Action::Done);
        };
        let keys: Vec<WorkKey> = (self.map)(Arc::new(object), ctx.clone())
            .await
            .into_iter()
            .filter(|target| in_scope(&self.namespaces, target.namespace.as_deref()))
            .map(|target| {
                WorkKey::new(
                    self.target.clone(),
                    target.namespace.unwrap_or_default(),
                    target.name,
                )
            })
            .collect();
        ctx.enqueue(keys).await?;
        Ok(Action::Done)
    }

    fn watches(&self) -> Option<Watches> {
        Some(Watches {
            reconciles: self.watch.clone(),
            owns: Vec::new(),
            by_label: Vec::new(),
            by_namespace: Vec::new(),
            by_selector: Vec::new(),
            by_placement: Vec::new(),
            by_name: Vec::new(),
            namespaces: self.namespaces.clone(),
        })
    }
}

/// Whether a key of `namespace` (`None`: a cluster-scoped object) is among `namespaces`
/// (empty: every one), as the watcher scopes the keys it makes.
fn in_scope(namespaces: &[String], namespace: Option<&str>) -> bool {
    match namespace.filter(|n| !n.is_empty()) {
        Some(namespace) => namespaces.is_empty() || namespaces.iter().any(|n| n == namespace),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scoped_mapping_drops_keys_of_other_namespaces_and_keeps_cluster_scoped_ones() {
        let scoped = ["a".to_owned()];
        assert!(in_scope(&scoped, Some("a")));
        assert!(!in_scope(&scoped, Some("b")));
        assert!(in_scope(&scoped, None));
        assert!(in_scope(&[], Some("b")));
    }

    #[test]
    fn a_mapping_is_named_by_its_controller_and_kind() {
        assert_eq!(
            mapping_name("example.com/v1/Thing", "v1/Secret", 1),
            "example.com/v1/Thing/map/v1/Secret"
        );
        assert_eq!(
            mapping_name("example.com/v1/Thing", "v1/Secret", 2),
            "example.com/v1/Thing/map/v1/Secret/2"
        );
    }
}
