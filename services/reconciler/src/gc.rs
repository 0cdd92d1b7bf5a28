//! The garbage collector: kube-controller-manager's `garbagecollector` controller, keyed per
//! object by UID and sharded like every controller. The watcher keeps the graph (every
//! deletable resource, metadata only) and keys the objects a change concerns; a reconcile
//! reads one object with its owners and dependents from the watcher, decides as
//! [`switchyard_reconciler_core::gc`] says, and confirms with the apiserver before it acts:
//!
//! - an owner missing from the graph is read from the apiserver (not found, or found with
//!   another UID: dangling; remembered, since a UID is never reused);
//! - every delete and patch carries the object's UID and the resourceVersion the decision
//!   was made on as preconditions: a decision on a stale graph fails (409), and the object is
//!   then read live and decided again, so no object is deleted for references it no longer
//!   has.
//!
//! ```text
//!  key (garbage-collector, namespace, uid) ─► Cache.GetGraphNode ─► decide ─► delete / patch
//! ```

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Mutex, PoisonError},
};

use serde_json::json;
use switchyard_k8s::{
    Api, Client, ObjectMeta,
    k8s_openapi::api::core::v1::ObjectReference,
    kube::{
        self,
        api::{
            ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
            Preconditions, PropagationPolicy,
        },
        discovery::{self, Scope},
    },
};
use switchyard_proto::watcher::v1::{GetGraphNodeResponse, GraphNode, OwnerReference};
use switchyard_reconciler_core::gc::{
    self as core, Decision, OwnerState, Propagation, Subject, existing_owner,
    invalid_namespace_note,
};
use tracing::{debug, info};

use crate::builtin::{Builtin, Permission, RECORD_EVENTS};
use crate::sdk::{Action, Context, Controller, Error, EventType, Refusal, Request, Result};

/// The name the collector's keys carry (the watcher's `garbageCollector.controller`).
pub const NAME: &str = switchyard_work::builtin::GARBAGE_COLLECTOR;

/// This controller, as the reconciler's list of built-ins names it.
pub const BUILTIN: Builtin = Builtin {
    name: NAME,
    service_account: "switchyard-garbage-collector",
    permissions: PERMISSIONS,
    register: |registry, _| {
        registry.register(GarbageCollector::default());
    },
};

/// What its account may do (`deploy/kustomize/base/rbac.yaml` grants exactly this): read
/// owners and dependents, delete dependents and patch away owner references and its
/// finalizers, on any resource; record Events.
pub const PERMISSIONS: &[Permission] = &[
    Permission::new("*", &["*"], &["get", "patch", "delete"]),
    RECORD_EVENTS,
];

const FOREGROUND: &str = "foregroundDeletion";
const ORPHAN: &str = "orphan";

/// Decisions one reconcile makes about an object that changes under its writes (each
/// write's precondition failed) before it leaves the key to the queue's backoff.
const DECISIONS: usize = 4;

/// Owner UIDs confirmed absent, remembered: a UID is never reused, so one found absent stays
/// absent, and the dependents of one deleted owner cost one read of it, not one each
/// (kube-controller-manager's `absentOwnerCache`, also bounded).
const ABSENT_OWNERS: usize = 4096;

/// The garbage collector.
#[derive(Debug, Default)]
pub struct GarbageCollector {
    mapper: RestMapper,
    absent: Mutex<AbsentOwners>,
}

/// A bounded set of owner UIDs, the oldest forgotten first.
#[derive(Debug, Default)]
struct AbsentOwners {
    uids: HashSet<String>,
    order: VecDeque<String>,
}

impl AbsentOwners {
    fn contains(&self, uid: &str) -> bool {
        self.uids.contains(uid)
    }

    fn insert(&mut self, uid: &str) {
        if !self.uids.insert(uid.to_owned()) {
            return;
        }
        self.order.push_back(uid.to_owned());
        if self.order.len() > ABSENT_OWNERS
            && let Some(oldest) = self.order.pop_front()
        {
            self.uids.remove(&oldest);
        }
    }
}

impl Controller for GarbageCollector {
    fn name(&self) -> &str {
        NAME
    }

    async fn reconcile(&self, ctx: &Context, request: &Request) -> Result {
        self.collect(ctx, &request.name).await
    }
}

impl GarbageCollector {
    async fn collect(&self, ctx: &Context, uid: &str) -> Result {
        let mut view = ctx.cache.graph_node(uid).await?;
        let Some(mut node) = view.node.take() else {
            // Gone: its dependents were keyed when it went.
            return Ok(Action::Done);
        };
        // The graph is a cache. A decision made on it is written with the object's UID and
        // the resourceVersion the graph holds as preconditions, so it takes effect only if
        // the object is still exactly what was decided on; when it is not (409), the object
        // is read live and decided again. A stale graph can cost a request, never an object.
        for _ in 0..DECISIONS {
            if node.deleting {
                if node.orphan {
                    return self.orphan_dependents(ctx, &node, &view.dependents).await;
                }
                if node.foreground_deletion {
                    return self.finish_foreground(ctx, &node, &view.dependents).await;
                }
                // Its deletion finishes without the collector.
                return Ok(Action::Done);
            }
            // References that name an owner in another namespace, recorded as Events once
            // the decision they are part of is final.
            let mut invalid = Vec::new();
            let decision = self.decide(ctx, &node, &view, &mut invalid).await?;
            let Some(decision) = decision.filter(|d| *d != Decision::Keep) else {
                invalid_namespace(ctx, &node, &invalid);
                return Ok(Action::Done);
            };
            match self.act(ctx, &node, decision).await? {
                Some(current) => node = current,
                None => {
                    invalid_namespace(ctx, &node, &invalid);
                    return Ok(Action::Done);
                }
            }
        }
        Err(Error::Other(format!(
            "{} changed under each of {DECISIONS} decisions; retrying",
            describe(&node)
        )))
    }

    /// The decision about `node`, not being deleted; `None` when a reference can never
    /// resolve (kube-controller-manager leaves such an object alone). The references that
    /// name an owner of another namespace are added to `invalid`.
    async fn decide(
        &self,
        ctx: &Context,
        node: &GraphNode,
        view: &GetGraphNodeResponse,
        invalid: &mut Vec<OwnerReference>,
    ) -> Result<Option<Decision>> {
        let mut states = Vec::with_capacity(node.owner_references.len());
        for reference in &node.owner_references {
            match self
                .classify(ctx, node, reference, &view.owners, invalid)
                .await?
            {
                Some(state) => states.push((reference.uid.clone(), state)),
                None => return Ok(None),
            }
        }
        let subject = Subject {
            orphan: node.orphan,
            foreground: node.foreground_deletion,
            has_dependents: !view.dependents.is_empty(),
            dependent_deleting_dependents: view
                .dependents
                .iter()
                .any(|d| d.deleting && d.foreground_deletion),
        };
        Ok(Some(core::decide(&states, subject)))
    }

    /// Carries out a decision made on `node` (the graph's, or the object read live), with
    /// preconditions on its UID and resourceVersion. `None` when it is done (or the object
    /// is gone); otherwise the object changed since `node`, as it is now, to decide again.
    async fn act(
        &self,
        ctx: &Context,
        node: &GraphNode,
        decision: Decision,
    ) -> Result<Option<GraphNode>> {
        match decision {
            Decision::Keep => Ok(None),
            Decision::DropReferences(uids) => {
                info!(object = %describe(node), owners = ?uids, "dropping references to dangling or waiting owners");
                let remaining: Vec<&OwnerReference> = node
                    .owner_references
                    .iter()
                    .filter(|r| !uids.contains(&r.uid))
                    .collect();
                changed_if_conflict(ctx, node, patch_references(ctx, node, &remaining).await).await
            }
            Decision::Delete {
                propagation,
                unblock,
            } => {
                let mut node = node.clone();
                if unblock {
                    info!(object = %describe(&node), "an owner and a dependent of it are both deleting in the foreground: its references stop blocking, so that a circle cannot wait on itself");
                    let unblocked: Vec<OwnerReference> = node
                        .owner_references
                        .iter()
                        .map(|r| OwnerReference {
                            block_owner_deletion: false,
                            ..r.clone()
                        })
                        .collect();
                    let unblocked: Vec<&OwnerReference> = unblocked.iter().collect();
                    match patch_references(ctx, &node, &unblocked).await {
                        Ok(Some(meta)) => node = refreshed(&node, &meta),
                        other => return changed_if_conflict(ctx, &node, other).await,
                    }
                }
                info!(object = %describe(&node), ?propagation, "deleting: no owner is left, or one waits for it to go first");
                delete(ctx, &node, propagation).await
            }
        }
    }

    /// The state of one owner reference; `None` when it can never resolve (a cluster-scoped
    /// object naming a namespaced owner). A reference to an owner of another namespace is
    /// added to `invalid`.
    async fn classify(
        &self,
        ctx: &Context,
        node: &GraphNode,
        reference: &OwnerReference,
        owners: &[GraphNode],
        invalid: &mut Vec<OwnerReference>,
    ) -> Result<Option<OwnerState>> {
        if let Some(owner) = owners.iter().find(|o| o.uid == reference.uid) {
            if !owner.namespaced || owner.namespace == node.namespace {
                return Ok(Some(existing_owner(
                    owner.deleting,
                    owner.foreground_deletion,
                    reference.block_owner_deletion,
                )));
            }
            // An owner of this UID lives in another namespace: the reference resolves only
            // in the object's own namespace.
            if !node.namespace.is_empty() {
                invalid.push(reference.clone());
            }
        }
        if self.absent().contains(&reference.uid) {
            return Ok(Some(OwnerState::Dangling));
        }
        let (resource, namespaced) = self
            .mapper
            .resolve(&ctx.client, &reference.api_version, &reference.kind)
            .await?;
        if namespaced && node.namespace.is_empty() {
            invalid.push(reference.clone());
            return Ok(None);
        }
        let api: Api<DynamicObject> = if namespaced {
            Api::namespaced_with(ctx.client.clone(), &node.namespace, &resource)
        } else {
            Api::all_with(ctx.client.clone(), &resource)
        };
        let state = match api.get_metadata_opt(&reference.name).await? {
            Some(owner) if owner.metadata.uid.as_deref() == Some(reference.uid.as_str()) => {
                let finalizers = owner.metadata.finalizers.unwrap_or_default();
                existing_owner(
                    owner.metadata.deletion_timestamp.is_some(),
                    finalizers.iter().any(|f| f == FOREGROUND),
                    reference.block_owner_deletion,
                )
            }
            _ => {
                self.absent().insert(&reference.uid);
                OwnerState::Dangling
            }
        };
        debug!(object = %describe(node), owner = %reference.name, ?state, "owner read from the apiserver");
        Ok(Some(state))
    }

    fn absent(&self) -> std::sync::MutexGuard<'_, AbsentOwners> {
        self.absent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn drop_references(
        &self,
        ctx: &Context,
        node: &GraphNode,
        uids: &[String],
    ) -> Result<()> {
        let api = api_of(ctx, node);
        let Some(live) = api.get_metadata_opt(&node.name).await? else {
            return Ok(());
        };
        if live.metadata.uid.as_deref() != Some(node.uid.as_str()) {
            return Ok(());
        }
        let remaining: Vec<_> = live
            .metadata
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .filter(|r| !uids.contains(&r.uid))
            .collect();
        let patch = json!({"metadata": {
            "uid": node.uid,
            "resourceVersion": live.metadata.resource_version,
            "ownerReferences": remaining,
        }});
        gone_is_done(
            api.patch(&node.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(drop),
        )
    }

    /// The owner is deleting in the foreground: once no dependent blocks it, its finalizer
    /// goes and the apiserver finishes the deletion. Until then its blocking dependents are
    /// keyed by the watcher (they go first) and each one's removal keys the owner again.
    async fn finish_foreground(
        &self,
        ctx: &Context,
        node: &GraphNode,
        dependents: &[GraphNode],
    ) -> Result {
        let blocking = dependents
            .iter()
            .filter(|d| {
                d.owner_references
                    .iter()
                    .any(|r| r.uid == node.uid && r.block_owner_deletion)
            })
            .count();
        if blocking > 0 {
            debug!(object = %describe(node), blocking, "waiting for blocking dependents");
            return Ok(Action::Done);
        }
        info!(object = %describe(node), "no dependent blocks the foreground deletion; removing its finalizer");
        remove_finalizer(ctx, node, FOREGROUND).await?;
        Ok(Action::Done)
    }

    /// The owner is deleted with `propagationPolicy: Orphan`: every dependent loses its
    /// reference to it, then the owner its finalizer.
    async fn orphan_dependents(
        &self,
        ctx: &Context,
        node: &GraphNode,
        dependents: &[GraphNode],
    ) -> Result {
        for dependent in dependents {
            self.drop_references(ctx, dependent, std::slice::from_ref(&node.uid))
                .await?;
        }
        info!(object = %describe(node), dependents = dependents.len(), "dependents orphaned; removing the orphan finalizer");
        remove_finalizer(ctx, node, ORPHAN).await?;
        Ok(Action::Done)
    }
}

fn describe(node: &GraphNode) -> String {
    let kind = node
        .gvk
        .as_ref()
        .map(|g| g.kind.as_str())
        .unwrap_or_default();
    if node.namespace.is_empty() {
        format!("{kind}/{}", node.name)
    } else {
        format!("{kind} {}/{}", node.namespace, node.name)
    }
}

fn resource_of(node: &GraphNode) -> ApiResource {
    let gvk = node.gvk.clone().unwrap_or_default();
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&gvk.group, &gvk.version, &gvk.kind),
        &node.resource,
    )
}

fn api_of(ctx: &Context, node: &GraphNode) -> Api<DynamicObject> {
    let resource = resource_of(node);
    if node.namespaced {
        Api::namespaced_with(ctx.client.clone(), &node.namespace, &resource)
    } else {
        Api::all_with(ctx.client.clone(), &resource)
    }
}

/// Deletes the object as read at `node.resource_version`, as kube-controller-manager does:
/// with its UID and resourceVersion as preconditions. When it changed meanwhile but its
/// references did not, the delete is made again with the UID alone, so that an object whose
/// status changes often is still collected; when its references changed, it is returned to
/// decide again.
async fn delete(
    ctx: &Context,
    node: &GraphNode,
    propagation: Propagation,
) -> Result<Option<GraphNode>> {
    let api = api_of(ctx, node);
    let params = |resource_version: Option<String>| DeleteParams {
        propagation_policy: Some(match propagation {
            Propagation::Orphan => PropagationPolicy::Orphan,
            Propagation::Foreground => PropagationPolicy::Foreground,
            Propagation::Background => PropagationPolicy::Background,
        }),
        preconditions: Some(Preconditions {
            uid: Some(node.uid.clone()),
            resource_version,
        }),
        ..DeleteParams::default()
    };
    let result = api
        .delete(&node.name, &params(Some(node.resource_version.clone())))
        .await
        .map(drop);
    let Some(current) = changed_if_conflict(ctx, node, settled(result)).await? else {
        return Ok(None);
    };
    if current.owner_references == node.owner_references && !current.deleting {
        debug!(object = %describe(node), "changed since read, its references did not: deleting by UID");
        let result = api.delete(&node.name, &params(None)).await.map(drop);
        return changed_if_conflict(ctx, node, settled(result)).await;
    }
    Ok(Some(current))
}

/// The object as the apiserver has it now, `None` when it is gone or replaced by another of
/// the same name.
async fn read_live(ctx: &Context, node: &GraphNode) -> Result<Option<GraphNode>> {
    let live = api_of(ctx, node).get_metadata_opt(&node.name).await?;
    Ok(live
        .filter(|live| live.metadata.uid.as_deref() == Some(node.uid.as_str()))
        .map(|live| refreshed(node, &live.metadata)))
}

/// A write's outcome: done (`Ok(None)`); or, when it met a conflict (the object changed
/// since it was read), the object as it is now.
async fn changed_if_conflict<T>(
    ctx: &Context,
    node: &GraphNode,
    result: Result<Option<T>>,
) -> Result<Option<GraphNode>> {
    match result {
        Ok(_) => Ok(None),
        Err(error) if error.is_conflict() => {
            debug!(object = %describe(node), %error, "changed since read; deciding again");
            read_live(ctx, node).await
        }
        Err(error) => Err(error),
    }
}

/// A write whose object is gone has nothing left to do.
fn settled(result: kube::Result<()>) -> Result<Option<()>> {
    match result {
        Ok(()) => Ok(Some(())),
        Err(error) if error.is_not_found() => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// Sets the object's owner references, as read at `node.resource_version`; the object's
/// metadata after the write, `None` when it is gone.
async fn patch_references(
    ctx: &Context,
    node: &GraphNode,
    references: &[&OwnerReference],
) -> Result<Option<ObjectMeta>> {
    let references: Vec<serde_json::Value> = references
        .iter()
        .map(|r| {
            json!({
                "apiVersion": r.api_version,
                "kind": r.kind,
                "name": r.name,
                "uid": r.uid,
                "controller": r.controller,
                "blockOwnerDeletion": r.block_owner_deletion,
            })
        })
        .collect();
    let patch = json!({"metadata": {
        "uid": node.uid,
        "resourceVersion": node.resource_version,
        "ownerReferences": references,
    }});
    match api_of(ctx, node)
        .patch_metadata(&node.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(object) => Ok(Some(object.metadata)),
        Err(error) if error.is_not_found() => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// `node` as the object's metadata `meta` says it is now.
fn refreshed(node: &GraphNode, meta: &ObjectMeta) -> GraphNode {
    let finalizers = meta.finalizers.as_deref().unwrap_or_default();
    GraphNode {
        resource_version: meta.resource_version.clone().unwrap_or_default(),
        owner_references: meta
            .owner_references
            .iter()
            .flatten()
            .map(|r| OwnerReference {
                api_version: r.api_version.clone(),
                kind: r.kind.clone(),
                name: r.name.clone(),
                uid: r.uid.clone(),
                controller: r.controller.unwrap_or_default(),
                block_owner_deletion: r.block_owner_deletion.unwrap_or_default(),
            })
            .collect(),
        deleting: meta.deletion_timestamp.is_some(),
        foreground_deletion: finalizers.iter().any(|f| f == FOREGROUND),
        orphan: finalizers.iter().any(|f| f == ORPHAN),
        ..node.clone()
    }
}

/// Removes one finalizer from the object, read fresh, unless it changed meanwhile.
async fn remove_finalizer(ctx: &Context, node: &GraphNode, finalizer: &str) -> Result<()> {
    let api = api_of(ctx, node);
    let Some(live) = api.get_metadata_opt(&node.name).await? else {
        return Ok(());
    };
    if live.metadata.uid.as_deref() != Some(node.uid.as_str()) {
        return Ok(());
    }
    let finalizers = live.metadata.finalizers.unwrap_or_default();
    if !finalizers.iter().any(|f| f == finalizer) {
        return Ok(());
    }
    let remaining: Vec<&String> = finalizers.iter().filter(|f| *f != finalizer).collect();
    let patch = json!({"metadata": {
        "uid": node.uid,
        "resourceVersion": live.metadata.resource_version,
        "finalizers": remaining,
    }});
    gone_is_done(
        api.patch(&node.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop),
    )
}

/// A delete or patch of an object that is gone, or was replaced by another of the same name
/// (a UID precondition that failed), has nothing left to do.
fn gone_is_done(result: kube::Result<()>) -> Result<()> {
    match result {
        Err(kube::Error::Api(status))
            if status.is_not_found()
                || (status.is_conflict() && status.message.contains("Precondition failed")) =>
        {
            Ok(())
        }
        other => Ok(other?),
    }
}

/// Records kube-controller-manager's `OwnerRefInvalidNamespace` warning on `node` for each
/// of these references.
fn invalid_namespace(ctx: &Context, node: &GraphNode, references: &[OwnerReference]) {
    if references.is_empty() {
        return;
    }
    let gvk = node.gvk.clone().unwrap_or_default();
    let api_version = if gvk.group.is_empty() {
        gvk.version.clone()
    } else {
        format!("{}/{}", gvk.group, gvk.version)
    };
    let regarding = ObjectReference {
        api_version: Some(api_version),
        kind: Some(gvk.kind),
        namespace: (!node.namespace.is_empty()).then(|| node.namespace.clone()),
        name: Some(node.name.clone()),
        uid: Some(node.uid.clone()),
        ..ObjectReference::default()
    };
    for reference in references {
        ctx.events.publish_reference(
            &regarding,
            EventType::Warning,
            "OwnerRefInvalidNamespace",
            "GarbageCollect",
            invalid_namespace_note(
                &reference.api_version,
                &reference.kind,
                &node.namespace,
                &reference.name,
                &reference.uid,
            ),
        );
    }
}

/// An owner reference's kind to its resource, from discovery, remembered: kinds rarely
/// change their resource. A kind discovery does not know is an error (the key is retried
/// with backoff, as kube-controller-manager retries a REST mapping failure).
#[derive(Debug, Default)]
struct RestMapper {
    /// By apiVersion and kind: the resource, and whether it is namespaced.
    known: Mutex<HashMap<(String, String), Mapping>>,
}

type Mapping = (ApiResource, bool);

impl RestMapper {
    async fn resolve(&self, client: &Client, api_version: &str, kind: &str) -> Result<Mapping> {
        let key = (api_version.to_owned(), kind.to_owned());
        if let Some(found) = self
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return Ok(found.clone());
        }
        let (group, version) = match api_version.split_once('/') {
            Some((group, version)) => (group, version),
            None => ("", api_version),
        };
        let (resource, capabilities) = discovery::pinned_kind(
            client,
            &GroupVersionKind::gvk(group, version, kind),
        )
        .await
        .map_err(|e| {
            Error::Other(format!(
                "owner reference to {api_version}/{kind}: the apiserver serves no such kind ({e})"
            ))
        })?;
        let found = (resource, capabilities.scope == Scope::Namespaced);
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, found.clone());
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_owners_are_bounded_and_forget_the_oldest_first() {
        let mut absent = AbsentOwners::default();
        for i in 0..=ABSENT_OWNERS {
            absent.insert(&format!("u{i}"));
        }
        absent.insert("u5");
        assert!(!absent.contains("u0"));
        assert!(absent.contains("u1"));
        assert!(absent.contains(&format!("u{ABSENT_OWNERS}")));
        assert_eq!(absent.uids.len(), ABSENT_OWNERS);
        assert_eq!(absent.order.len(), ABSENT_OWNERS);
    }
}
