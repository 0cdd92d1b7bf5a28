//! The namespace controller on the SDK: kube-controller-manager's namespace deleter. A
//! namespace being deleted is emptied of every namespaced resource discovery finds, then its
//! `kubernetes` finalizer is removed and the apiserver lets it go. The decisions are
//! `switchyard_reconciler_core::namespace`'s; this module reads and writes.
//!
//! ```text
//!  cache: Namespace ─ not being deleted ─► Done (no apiserver call)
//!     ─► deleted less than 5 s ago ─► RequeueAfter(the rest of the 5 s)
//!     ─► apiserver: the Namespace, live ─ gone, not deleting, `kubernetes` gone ─► Done
//!     ─► status.phase Terminating, if it is not yet
//!     ─► discovery: GET /api, /apis (aggregated)
//!     ─► pods: deletecollection | list + delete each ─► list metadata ─ Pods remain ─┐
//!     ─► every other resource, 8 at once, the same                                   │
//!     ─► the conditions, written when they changed ◄─────────────────────────────────┘
//!     ─► a failure: Err (the queue backs off) │ content remaining: RequeueAfter(estimate/2 + 1 s)
//!        │ nothing left: PUT /finalize without `kubernetes`
//! ```
//!
//! Every call goes through the controller's client, behind its QPS/burst limit. Lists ask for
//! metadata only (`PartialObjectMetadataList`), and so do collection deletions, whose answer is
//! the deleted objects. Deletions propagate in the background, as kube-controller-manager's:
//! the garbage collector never orphans a namespace's objects into it. The contents' own
//! finalizers are never touched: an object they hold keeps the namespace, reported in
//! `NamespaceFinalizersRemaining`, until whoever owns the finalizer removes it.

use futures::{
    FutureExt, StreamExt, TryStreamExt,
    stream::{self},
};
use switchyard_k8s::{
    Api, Client, DeleteParams, ListParams, Namespace, Pod, PostParams,
    k8s_openapi::{api::core::v1::NamespaceSpec, jiff::Timestamp},
    kube::{
        self,
        core::{ApiResource, DynamicObject},
    },
};
use switchyard_reconciler_core::namespace::{
    self as core, Deletable, Pass, Remaining, Served, Verdict,
};
use tracing::{debug, info, warn};

use crate::builtin::{Builtin, Permission, RECORD_EVENTS};
use crate::sdk::{
    Action, Builder, Context, Controller, Error, Refusal, Request, Result, Watches, status_message,
};

pub const NAME: &str = switchyard_work::builtin::NAMESPACE;

/// This controller, as the reconciler's list of built-ins names it.
pub const BUILTIN: Builtin = Builtin {
    name: NAME,
    service_account: "switchyard-namespace-controller",
    permissions: PERMISSIONS,
    register: |registry, _| {
        registry.register(NamespaceController);
    },
};

/// What its account may do (`deploy/kustomize/base/rbac.yaml` grants exactly this): read the
/// namespace, write its conditions and remove its finalizer, empty it of every resource,
/// record Events.
pub const PERMISSIONS: &[Permission] = &[
    Permission::new("", &["namespaces"], &["get"]),
    Permission::new(
        "",
        &["namespaces/status", "namespaces/finalize"],
        &["update"],
    ),
    Permission::new("*", &["*"], &["list", "delete", "deletecollection"]),
    RECORD_EVENTS,
];
/// Resources emptied at once: the controller's QPS limit paces the calls in any case; a few
/// at once keep one slow list or deletion from holding up the rest.
const RESOURCES_AT_ONCE: usize = 8;
/// Objects deleted at once, by name, for a resource without `deletecollection`.
const DELETES_AT_ONCE: usize = 8;
/// Objects per page of a list: bounds one answer's size in a namespace of any size.
const LIST_PAGE: u32 = 500;
/// Tries of `/finalize` when the namespace changed since it was read (409), each after a
/// fresh read, as kube-controller-manager's `retryOnConflictError`; then the queue's backoff.
const FINALIZE_ATTEMPTS: usize = 5;
/// The answer to a collection deletion as object metadata, or whole objects from an
/// apiserver that cannot convert them.
const METADATA_LIST: &str =
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";

/// kube-controller-manager's namespace controller.
#[derive(Debug, Clone, Copy, Default)]
pub struct NamespaceController;

/// Every change of a Namespace: one being deleted is emptied, then its `kubernetes`
/// finalizer removed; one not being deleted is done at the cache, with no apiserver call.
pub fn watches() -> Watches {
    Builder::for_::<Namespace>().into_watches()
}

impl Controller for NamespaceController {
    fn name(&self) -> &str {
        NAME
    }

    fn watches(&self) -> Option<Watches> {
        Some(watches())
    }

    async fn reconcile(&self, ctx: &Context, request: &Request) -> Result {
        reconcile(ctx, request).await
    }
}

/// 404 or 405: the resource does not serve the call (discovery may list a resource whose
/// verbs it does not serve at this path), so the deleter goes on without it.
fn is_unsupported(error: &kube::Error) -> bool {
    error.is_not_found() || error.is_method_not_allowed()
}

async fn reconcile(ctx: &Context, request: &Request) -> Result {
    // The cache first: a namespace not being deleted costs no apiserver call.
    let Some(cached) = ctx.cache.get::<Namespace>("", &request.name, None).await? else {
        debug!("namespace gone");
        return Ok(Action::Done);
    };
    let Some(deleted_at) = cached.metadata.deletion_timestamp.as_ref().map(|t| t.0) else {
        return Ok(Action::Done);
    };
    if let Some(wait) = core::grace_left(deleted_at, Timestamp::now()) {
        debug!(
            ?wait,
            "namespace deleted moments ago, waiting out the grace period"
        );
        return Ok(Action::RequeueAfter(wait));
    }

    // Then the namespace as it is now: other controllers edit it while it terminates.
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    let Some(mut namespace) = api.get_opt(&request.name).await? else {
        debug!("namespace gone");
        return Ok(Action::Done);
    };
    let Some(deleted_at) = namespace.metadata.deletion_timestamp.as_ref().map(|t| t.0) else {
        return Ok(Action::Done);
    };
    if core::needs_terminating_phase(&namespace) {
        let mut terminating = namespace.clone();
        terminating
            .status
            .get_or_insert_with(Default::default)
            .phase = Some(core::TERMINATING.to_owned());
        namespace = match api
            .replace_status(&request.name, &PostParams::default(), &terminating)
            .await
        {
            Ok(written) => written,
            Err(error) if error.is_not_found() => return Ok(Action::Done),
            Err(error) => return Err(error.into()),
        };
    }
    if !core::is_ours(&namespace) {
        debug!("namespace finalized already");
        return Ok(Action::Done);
    }

    let pass = empty(&ctx.client, &request.name, deleted_at).await;
    let mut status = namespace.status.clone().unwrap_or_default();
    if pass.update_conditions(&mut status, Timestamp::now()) {
        let mut updated = namespace.clone();
        updated.status = Some(status);
        // As kube-controller-manager: a failed condition write is noted and the pass goes on;
        // the next pass writes them again.
        match api
            .replace_status(&request.name, &PostParams::default(), &updated)
            .await
        {
            Ok(written) => namespace = written,
            Err(error) => warn!(%error, "namespace conditions not written"),
        }
    }
    match pass.verdict() {
        Verdict::Failed(message) => Err(Error::Other(message)),
        Verdict::Wait(delay) => {
            debug!(?delay, "content remaining, looking again later");
            Ok(Action::RequeueAfter(delay))
        }
        Verdict::Finalize => {
            finalize(&api, namespace).await?;
            info!("namespace emptied, finalizer removed");
            Ok(Action::Done)
        }
    }
}

/// Removes `kubernetes` from `spec.finalizers` through `/finalize`. On a conflict the
/// namespace is read again; one recreated under the same name (another UID) is left alone.
async fn finalize(api: &Api<Namespace>, mut namespace: Namespace) -> Result<()> {
    let name = namespace.metadata.name.clone().unwrap_or_default();
    for _ in 0..FINALIZE_ATTEMPTS {
        let finalized = Namespace {
            metadata: namespace.metadata.clone(),
            spec: Some(NamespaceSpec {
                finalizers: Some(core::finalizers_after(&namespace)),
            }),
            status: None,
        };
        match api
            .replace_subresource("finalize", &name, &PostParams::default(), &finalized)
            .await
        {
            Ok(_) => return Ok(()),
            // Another controller sharing the finalizer finished first.
            Err(error) if error.is_not_found() => return Ok(()),
            Err(error) if error.is_conflict() => {
                let Some(fresh) = api.get_opt(&name).await? else {
                    return Ok(());
                };
                if fresh.metadata.uid != namespace.metadata.uid {
                    return Err(Error::Other(format!(
                        "namespace {name}: uid has changed across retries"
                    )));
                }
                namespace = fresh;
            }
            Err(error) => return Err(error.into()),
        }
    }
    Err(Error::Other(format!(
        "namespace {name}: /finalize conflicted {FINALIZE_ATTEMPTS} times"
    )))
}

/// One pass over the namespace's contents (`deleteAllContent`): what failed and what remains.
async fn empty(client: &Client, namespace: &str, deleted_at: Timestamp) -> Pass {
    let mut pass = Pass::new(namespace);
    let discovery = match discover(client).await {
        Ok(discovery) => discovery,
        Err(error) => {
            // Nothing to go through; the failure is reported and retried.
            pass.discovery_failed(status_message(&error));
            pass.counted();
            return pass;
        }
    };
    if let Some(message) = discovery.failure_message() {
        warn!(failed = ?discovery.failed, "discovery failed for some group versions");
        pass.discovery_failed(message);
    }
    if let Some(message) = discovery.parse_error.clone() {
        pass.parse_failed(message);
    }
    let contents = Contents {
        client,
        namespace,
        deleted_at,
    };
    let (pods, others): (Vec<&Deletable>, Vec<&Deletable>) =
        discovery.resources.iter().partition(|r| r.gvr.is_pods());
    // Pods go first (ordered namespace deletion): what they use stays until they are gone.
    for resource in pods {
        let (remaining, error) = contents.empty(resource).await;
        pass.resource(&resource.gvr, remaining, error);
    }
    if pass.pods_remain() {
        debug!("pods remaining, the other resources wait");
        return pass;
    }
    // Made before they are streamed, so the stream holds no closure over borrowed data.
    let each: Vec<_> = others
        .into_iter()
        .map(|resource| {
            contents
                .empty(resource)
                .map(move |emptied| (resource, emptied))
        })
        .collect();
    let emptied: Vec<_> = stream::iter(each)
        .buffer_unordered(RESOURCES_AT_ONCE)
        .collect()
        .await;
    for (resource, (remaining, error)) in emptied {
        pass.resource(&resource.gvr, remaining, error);
    }
    pass.counted();
    pass
}

/// The namespaced resources to empty, from aggregated discovery of the core group (`/api`)
/// and of every other group (`/apis`).
async fn discover(client: &Client) -> kube::Result<core::Discovery> {
    Ok(resources_to_empty(
        switchyard_k8s::discovery::preferred_resources(client).await?,
    ))
}

/// What discovery found, in the terms of the namespace deleter.
fn resources_to_empty(found: switchyard_k8s::discovery::Discovered) -> core::Discovery {
    let served: Vec<Served> = found
        .resources
        .into_iter()
        .map(|r| Served {
            group: r.resource.group,
            version: r.resource.version,
            resource: r.resource.plural,
            kind: r.resource.kind,
            namespaced: r.namespaced,
            verbs: r.verbs,
        })
        .collect();
    let failed = found
        .failures
        .into_iter()
        .map(|f| (f.group_version, f.reason))
        .collect();
    core::discover(&served, failed)
}

/// The contents of one namespace, one resource at a time.
struct Contents<'a> {
    client: &'a Client,
    namespace: &'a str,
    deleted_at: Timestamp,
}

impl Contents<'_> {
    fn api(&self, resource: &Deletable) -> Api<DynamicObject> {
        let gvr = &resource.gvr;
        let ar = ApiResource {
            group: gvr.group.clone(),
            version: gvr.version.clone(),
            api_version: gvr.api_version(),
            kind: resource.kind.clone(),
            plural: gvr.resource.clone(),
        };
        Api::namespaced_with(self.client.clone(), self.namespace, &ar)
    }

    /// Deletes every object of `resource`, then lists what remains
    /// (`deleteAllContentForGroupVersionResource`).
    async fn empty(&self, resource: &Deletable) -> (Remaining, Option<String>) {
        let failed = |estimate, error: kube::Error| {
            (
                Remaining {
                    estimate,
                    ..Remaining::default()
                },
                Some(status_message(&error)),
            )
        };
        let estimate = if resource.gvr.is_pods() {
            match self.pods_estimate().await {
                Ok(estimate) => estimate,
                Err(error) => return failed(0, error),
            }
        } else {
            0
        };
        let api = self.api(resource);
        let mut emptied = false;
        if resource.delete_collection {
            match self.delete_collection(&api).await {
                Ok(()) => emptied = true,
                Err(error) if is_unsupported(&error) => {}
                Err(error) => return failed(estimate, error),
            }
        }
        if !emptied && let Err(error) = self.delete_each(resource, &api).await {
            return failed(estimate, error);
        }
        if !resource.list {
            return (
                Remaining {
                    estimate,
                    ..Remaining::default()
                },
                None,
            );
        }
        match list_finalizers(&api).await {
            Ok(Some(listed)) => core::remaining(self.namespace, &resource.gvr, estimate, &listed),
            Ok(None) => (
                Remaining {
                    estimate,
                    ..Remaining::default()
                },
                None,
            ),
            Err(error) => failed(estimate, error),
        }
    }

    /// One `deletecollection` call; the deleted objects come back as metadata only.
    async fn delete_collection(&self, api: &Api<DynamicObject>) -> kube::Result<()> {
        let mut request = kube::core::Request::new(api.resource_url())
            .delete_collection(&DeleteParams::background(), &ListParams::default())
            .map_err(kube::Error::BuildRequest)?;
        request.headers_mut().insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static(METADATA_LIST),
        );
        self.client.request_text(request).await.map(drop)
    }

    /// Lists the objects and deletes each by name (`deleteEachItem`); one already gone, or a
    /// resource that refuses the call, is no failure.
    async fn delete_each(
        &self,
        resource: &Deletable,
        api: &Api<DynamicObject>,
    ) -> kube::Result<()> {
        if !resource.list {
            return Ok(());
        }
        let Some(names) = list_names(api).await? else {
            return Ok(());
        };
        let params = DeleteParams::background();
        let deletions: Vec<_> = names.iter().map(|name| api.delete(name, &params)).collect();
        stream::iter(deletions)
            .buffer_unordered(DELETES_AT_ONCE)
            .map(|deleted| match deleted {
                Err(error) if !is_unsupported(&error) => Err(error),
                _ => Ok(()),
            })
            .try_collect()
            .await
    }

    /// How long the namespace's Pods may take to terminate, in seconds.
    async fn pods_estimate(&self) -> kube::Result<i64> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), self.namespace);
        let mut pods = Vec::new();
        let mut params = ListParams::default().limit(LIST_PAGE);
        loop {
            let page = api.list(&params).await?;
            pods.extend(page.items);
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        Ok(core::pods_estimate(
            &pods,
            self.deleted_at,
            Timestamp::now(),
        ))
    }
}

/// The finalizers of every object listed, or `None` when the resource refuses the list.
async fn list_finalizers(api: &Api<DynamicObject>) -> kube::Result<Option<Vec<Vec<String>>>> {
    Ok(list_metadata(api).await?.map(|items| {
        items
            .into_iter()
            .map(|(_, finalizers)| finalizers)
            .collect()
    }))
}

/// The names of every object listed, or `None` when the resource refuses the list.
async fn list_names(api: &Api<DynamicObject>) -> kube::Result<Option<Vec<String>>> {
    Ok(list_metadata(api)
        .await?
        .map(|items| items.into_iter().map(|(name, _)| name).collect()))
}

/// Name and finalizers of every object, page by page, from the metadata API.
async fn list_metadata(
    api: &Api<DynamicObject>,
) -> kube::Result<Option<Vec<(String, Vec<String>)>>> {
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(LIST_PAGE);
    loop {
        let page = match api.list_metadata(&params).await {
            Ok(page) => page,
            Err(error) if is_unsupported(&error) => return Ok(None),
            Err(error) => return Err(error),
        };
        items.extend(page.items.into_iter().map(|item| {
            (
                item.metadata.name.unwrap_or_default(),
                item.metadata.finalizers.unwrap_or_default(),
            )
        }));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(Some(items)),
        }
    }
}

#[cfg(test)]
mod tests {
    use switchyard_reconciler_core::namespace::Discovery;

    use super::*;

    /// Aggregated discovery as the apiserver serves `/apis`: a stale aggregated API, and a
    /// group whose resources come in two versions.
    const APIS: &str = r#"{"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
      "items": [
        {"metadata": {"name": "apps"}, "versions": [{"version": "v1", "freshness": "Current",
          "resources": [
            {"resource": "deployments", "scope": "Namespaced",
             "responseKind": {"group": "apps", "version": "v1", "kind": "Deployment"},
             "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
             "subresources": [{"subresource": "status", "verbs": ["get", "patch", "update"],
               "responseKind": {"group": "apps", "version": "v1", "kind": "Deployment"}}]},
            {"resource": "controllerrevisions", "scope": "Namespaced",
             "responseKind": {"group": "apps", "version": "v1", "kind": "ControllerRevision"},
             "verbs": ["delete", "get", "list"]}]}]},
        {"metadata": {"name": "rbac.authorization.k8s.io"}, "versions": [{"version": "v1",
          "resources": [
            {"resource": "clusterroles", "scope": "Cluster",
             "responseKind": {"group": "rbac.authorization.k8s.io", "version": "v1", "kind": "ClusterRole"},
             "verbs": ["delete", "deletecollection", "get", "list"]}]}]},
        {"metadata": {"name": "metrics.example.com"}, "versions": [
          {"version": "v1beta1", "freshness": "Stale"}]}
      ]}"#;

    #[test]
    fn aggregated_discovery_becomes_the_resources_to_empty() {
        let list = switchyard_k8s::discovery::parse(APIS.as_bytes()).unwrap();
        let Discovery {
            resources, failed, ..
        } = resources_to_empty(switchyard_k8s::discovery::preferred(&list.items));
        let found: Vec<(String, &str, bool, bool)> = resources
            .iter()
            .map(|r| {
                (
                    r.gvr.to_string(),
                    r.kind.as_str(),
                    r.delete_collection,
                    r.list,
                )
            })
            .collect();
        // Namespaced only, no subresource; ControllerRevisions by name, for want of
        // deletecollection.
        assert_eq!(
            found,
            [
                (
                    "apps/v1, Resource=controllerrevisions".to_owned(),
                    "ControllerRevision",
                    false,
                    true
                ),
                (
                    "apps/v1, Resource=deployments".to_owned(),
                    "Deployment",
                    true,
                    true
                ),
            ]
        );
        assert_eq!(
            failed.keys().collect::<Vec<_>>(),
            ["metrics.example.com/v1beta1"]
        );
    }

    #[test]
    fn calls_a_resource_does_not_serve_are_told_apart() {
        let answer = |code: u16| {
            kube::Error::Api(Box::new(
                kube::core::Status::failure("refused", "Refused").with_code(code),
            ))
        };
        // A plain-text 404 (a path not served) has no reason the apiserver gave.
        assert!(is_unsupported(&answer(404)));
        assert!(is_unsupported(&answer(405)));
        assert!(!is_unsupported(&answer(403)));
        assert!(!is_unsupported(&answer(500)));
        assert!(answer(409).is_conflict());
        assert!(!answer(404).is_conflict());
        assert!(answer(404).is_not_found());
    }
}
