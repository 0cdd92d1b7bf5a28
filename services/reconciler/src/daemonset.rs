//! The DaemonSet controller on the SDK: reads from the watcher's cache, decides with
//! `switchyard_reconciler_core::daemonset`, writes to the apiserver.
//!
//! ```text
//!  keys: a DaemonSet's change; a Pod or ControllerRevision it controls; a Node whose
//!        creation, deletion or labels or taints change where this DaemonSet's Pods fit
//!        (the watcher's placement rule: a Node's status keys nothing)
//!  cache: the DaemonSet, every Node, its revisions and Pods (by controller UID) ∪ the selector's
//!     ─► revisions: adopt orphans; the one holding the template now, else a new one named
//!        by the template's hash (collisionCount raised on a clash); duplicates merged
//!     ─► Pods: adopt orphans, release those that stopped matching; by target Node
//!     ─► manage: create (pinned by node affinity, slow-start batches) and delete, ≤ 250 each
//!     ─► nothing to manage and RollingUpdate: replace within maxUnavailable / maxSurge
//!     ─► history past revisionHistoryLimit deleted (never one a Pod still carries)
//!     ─► status from the Pods as read (409 on a stale read)
//! ```
//!
//! As with ReplicaSets, a reconcile after one that wrote reads a cache holding those writes
//! ([`crate::cache::CacheClient::wrote`]), which takes the place of kube-controller-manager's
//! expectations: a reconcile never makes a second Pod for a Node whose first one the cache
//! has not shown. The failed-Pod backoff lives in the reconciler that deleted the Pod; a key
//! that moves to another reconciler starts it again.

use std::{
    borrow::Cow,
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use futures::future::join_all;
use serde_json::json;
use switchyard_k8s::{
    Api, DeleteParams, Pod, PostParams,
    k8s_openapi::{
        ClusterResourceScope,
        api::{
            apps::v1::{ControllerRevision, DaemonSet},
            core::v1::{Node, Taint},
        },
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
        jiff::Timestamp,
    },
    kube::{
        Resource,
        api::{Patch, PatchParams},
    },
};
use switchyard_reconciler_core::{
    daemonset::{
        self as core, FailedPodBackoff, HASH_LABEL, SELECTING_ALL, Spec, SpecError, Strategy,
        placement,
    },
    history,
    replicaset::slow_start_batches,
};
use tracing::{debug, warn};

use crate::builtin::{Builtin, Permission, RECORD_EVENTS};
use crate::cache::ListFilter;
use crate::claim::Owner;
use crate::replicaset::{
    FAILED_CREATE, FAILED_DELETE, POD_BATCH_PERIOD, SUCCESSFUL_CREATE, SUCCESSFUL_DELETE,
};

/// A Node as the DaemonSet controller reads it from the cache: its metadata and taints. The
/// rest (its status: conditions, addresses, images), most of a Node's bytes, is skipped while
/// decoding, for a list of every Node at each reconcile.
#[derive(Clone, Debug, serde::Deserialize)]
struct NodePlacement {
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<NodeTaints>,
}

#[derive(Clone, Debug, serde::Deserialize)]
struct NodeTaints {
    #[serde(default)]
    taints: Option<Vec<Taint>>,
}

impl NodePlacement {
    fn taints(&self) -> &[Taint] {
        self.spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or_default()
    }
}

impl Resource for NodePlacement {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Node::kind(&())
    }

    fn group(_: &()) -> Cow<'_, str> {
        Node::group(&())
    }

    fn version(_: &()) -> Cow<'_, str> {
        Node::version(&())
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Node::plural(&())
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
use crate::sdk::{
    Action, Builder, Context, Controller, Error, EventType, Map, Options, Refusal, Request, Result,
    Watches, is_namespace_terminating, keep_first, status_message,
};

pub const NAME: &str = switchyard_work::builtin::DAEMONSET;

/// This controller, as the reconciler's list of built-ins names it.
pub const BUILTIN: Builtin = Builtin {
    name: NAME,
    service_account: "switchyard-daemon-set-controller",
    permissions: PERMISSIONS,
    register: |registry, _| {
        registry.register(DaemonSetController::default());
    },
};

/// What its account may do (`deploy/kustomize/base/rbac.yaml` grants exactly this): create
/// and delete Pods, patch them (adopt, release, relabel a merged revision's), keep the
/// ControllerRevisions, read a DaemonSet live before adopting or raising its collision count,
/// write the status and set blockOwnerDeletion (`finalizers`), record Events. Reads go
/// through the watcher's cache.
pub const PERMISSIONS: &[Permission] = &[
    Permission::new("", &["pods"], &["create", "delete", "patch"]),
    Permission::new(
        "apps",
        &["controllerrevisions"],
        &["get", "create", "update", "patch", "delete"],
    ),
    Permission::new("apps", &["daemonsets"], &["get"]),
    Permission::new(
        "apps",
        &["daemonsets/status", "daemonsets/finalizers"],
        &["update"],
    ),
    RECORD_EVENTS,
];

/// kube-controller-manager's DaemonSet controller.
#[derive(Debug, Clone, Default)]
pub struct DaemonSetController {
    backoff: Arc<Mutex<FailedPodBackoff>>,
}

/// Every change of a DaemonSet, of a Pod it controls (held as the ReplicaSet controller's
/// are) and of a ControllerRevision it controls; and of a Node, keying only the DaemonSets
/// whose Pods' fit on it moved.
pub fn watches() -> Watches {
    Builder::for_::<DaemonSet>()
        .owns_with::<Pod>(Options::default().batch_period(POD_BATCH_PERIOD))
        .owns::<ControllerRevision>()
        .watches::<Node>(Map::placement())
        .into_watches()
}

impl Controller for DaemonSetController {
    fn name(&self) -> &str {
        NAME
    }

    fn watches(&self) -> Option<Watches> {
        Some(watches())
    }

    async fn reconcile(&self, ctx: &Context, request: &Request) -> Result {
        reconcile(ctx, request, &self.backoff).await
    }
}

/// How kube-controller-manager's messages name the kind.
const NOUN: &str = "daemon set";

/// One reconcile of a DaemonSet (`syncDaemonSet`).
pub async fn reconcile(
    ctx: &Context,
    request: &Request,
    backoff: &Mutex<FailedPodBackoff>,
) -> Result {
    let Some(ds) = ctx
        .cache
        .get::<DaemonSet>(&request.namespace, &request.name, None)
        .await?
    else {
        debug!("daemonset gone");
        return Ok(Action::Done);
    };
    let spec = match Spec::new(&ds) {
        Ok(spec) => spec,
        Err(SpecError::SelectingAll) => {
            ctx.events.publish(
                &ds,
                EventType::Warning,
                SELECTING_ALL,
                "Sync",
                "This daemon set is selecting all pods. A non-empty selector is required."
                    .to_owned(),
            );
            return Ok(Action::Done);
        }
        Err(error) => {
            // Retrying cannot fix the object; its next change is keyed again.
            warn!(%error, "invalid daemonset, not reconciled");
            return Ok(Action::Done);
        }
    };
    // A DaemonSet being deleted leaves its Pods to the garbage collector.
    if spec.deleting {
        return Ok(Action::Done);
    }
    let namespace = spec.namespace;
    let query = spec.selector.to_query();
    let owner = Owner {
        object: &ds,
        noun: NOUN,
        controller: spec.controller_ref(),
    };

    let nodes: Vec<placement::Node> = ctx
        .cache
        .list_shared::<NodePlacement>("", ListFilter::default())
        .await?
        .iter()
        .map(|n| core::placement_node(&n.metadata, n.taints()))
        .collect();
    let listed = ctx
        .cache
        .list::<ControllerRevision>(
            namespace,
            ListFilter {
                label_selector: &query,
                ..ListFilter::default()
            },
        )
        .await?;
    let (owned, orphans) = history::own(namespace, spec.uid, &spec.selector, &listed);
    let revisions = owner.adopt_revisions(ctx, owned, orphans).await?;
    let pods = read_pods(ctx, &spec, &query, None).await?;
    let pods = owner.settle(ctx, core::claim(&spec, &pods)).await?;
    let owned: Vec<&Pod> = pods.iter().map(|pod| &**pod).collect();
    let (current, old) = construct_history(ctx, &spec, revisions, &owned).await?;
    let hash = core::revision_hash(&current).to_owned();

    let now = Timestamp::now();
    let by_node = core::by_node(&owned, false);
    let managed = {
        let mut backoff = backoff.lock().unwrap_or_else(PoisonError::into_inner);
        core::manage(&spec, &nodes, &by_node, &hash, &mut backoff, now)
    };
    for event in &managed.events {
        let type_ = if event.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        ctx.events
            .publish(&ds, type_, event.reason, "Sync", event.message.clone());
    }
    let mut first_error = None;
    let recheck = managed.recheck_after;
    if !managed.is_empty() {
        if let Err(error) = sync_nodes(ctx, &ds, &spec, &managed, &hash).await {
            keep_first(&mut first_error, error);
        }
    } else if matches!(spec.strategy, Strategy::RollingUpdate { .. }) {
        // As kube-controller-manager: the rollout moves only in a reconcile with nothing to
        // manage, so it weighs Pods that are all accounted for.
        match core::rolling_update(&spec, &nodes, &by_node, &hash, now) {
            Ok(rolled) if !rolled.is_empty() => {
                if let Err(error) = sync_nodes(ctx, &ds, &spec, &rolled, &hash).await {
                    keep_first(&mut first_error, error);
                }
            }
            Ok(_) => {}
            Err(message) => keep_first(&mut first_error, Error::Other(message)),
        }
    }

    // History past the limit, never a revision a Pod still carries.
    let revisions_api: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), namespace);
    for doomed in core::to_clean_up(&spec, &old.iter().collect::<Vec<_>>(), &owned) {
        let name = doomed.metadata.name.as_deref().unwrap_or_default();
        match revisions_api.delete(name, &DeleteParams::default()).await {
            Ok(_) => debug!(revision = name, "deleted old revision"),
            Err(error) if error.is_not_found() => {}
            Err(error) => keep_first(
                &mut first_error,
                Error::Other(format!(
                    "failed to clean up revisions of DaemonSet: {}",
                    status_message(&error)
                )),
            ),
        }
    }

    // The status, as kube-controller-manager's, from the Pods as read: when this reconcile
    // wrote, their events key the DaemonSet again, and that reconcile (reading a cache that
    // holds these writes) counts them. Not read again here: at a thousand Nodes a read of
    // the Pods is most of a reconcile's work.
    let now = Timestamp::now();
    let status = core::status(&spec, &nodes, &by_node, &hash, true, now);
    if core::status_changed(&ds, &status) {
        let mut updated = ds.clone();
        updated.status = Some(status);
        let sets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), namespace);
        match sets
            .replace_status(&request.name, &PostParams::default(), &updated)
            .await
        {
            // The next reconcile compares against the cached status, so it must read one
            // that holds this write: the key's read floor says so, and only that reconcile
            // waits for the watcher, if it still lags by then.
            Ok(written) => ctx.cache.wrote(&written),
            Err(error) => keep_first(&mut first_error, error),
        }
    }
    debug!(
        nodes = nodes.len(),
        pods = owned.len(),
        hash,
        failed = first_error.is_some(),
        "reconciled daemonset"
    );
    if let Some(error) = first_error {
        return Err(error);
    }
    let later = [recheck, core::recheck_after(&spec, &by_node, now)]
        .into_iter()
        .flatten()
        .min();
    Ok(match later {
        Some(delay) => Action::RequeueAfter(delay + Duration::from_millis(100)),
        None => Action::Done,
    })
}

/// The Pods the DaemonSet controls and those its selector matches, at least at `min_rv`:
/// shared with the reconciles before, which decoded those that did not change since.
async fn read_pods(
    ctx: &Context,
    spec: &Spec<'_>,
    query: &str,
    min_rv: Option<&str>,
) -> Result<Vec<Arc<Pod>>> {
    Ok(ctx
        .cache
        .list_shared::<Pod>(
            spec.namespace,
            ListFilter {
                label_selector: query,
                controller_uid: spec.uid,
                either: true,
                min_resource_version: min_rv,
            },
        )
        .await?)
}

/// The revision holding the template now, and the others (`constructHistory`): a revision
/// without the hash label gets its name as one; none holding the template makes one; of
/// several, the newest is kept, the Pods of the others relabelled and the others deleted;
/// the kept one is renumbered newest.
async fn construct_history(
    ctx: &Context,
    spec: &Spec<'_>,
    revisions: Vec<ControllerRevision>,
    pods: &[&Pod],
) -> Result<(ControllerRevision, Vec<ControllerRevision>)> {
    let api: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), spec.namespace);
    let mut labelled = Vec::with_capacity(revisions.len());
    for mut revision in revisions {
        if core::revision_hash(&revision).is_empty() {
            let name = revision.metadata.name.clone().unwrap_or_default();
            revision
                .metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .insert(HASH_LABEL.into(), name.clone());
            revision = api
                .replace(&name, &PostParams::default(), &revision)
                .await?;
            ctx.cache.wrote(&revision);
        }
        labelled.push(revision);
    }
    let data = core::revision_data(spec);
    let (current, old) = core::split_revisions(&labelled, &data);
    let next = old.iter().map(|r| r.revision).max().unwrap_or(0) + 1;
    let old: Vec<ControllerRevision> = old.into_iter().cloned().collect();
    let kept = match core::keep_of(&current) {
        None => snapshot(ctx, spec, &data, next).await?,
        Some(kept) => {
            let kept = kept.clone();
            if current.len() > 1 {
                merge_duplicates(ctx, spec, &kept, &current, pods).await?;
            }
            if kept.revision < next {
                let mut renumbered = kept.clone();
                renumbered.revision = next;
                let name = kept.metadata.name.clone().unwrap_or_default();
                let written = api
                    .replace(&name, &PostParams::default(), &renumbered)
                    .await?;
                ctx.cache.wrote(&written);
                written
            } else {
                kept
            }
        }
    };
    Ok((kept, old))
}

/// `dedupCurHistories`: the Pods of the other revisions holding the template take the kept
/// one's hash, and the others are deleted.
async fn merge_duplicates(
    ctx: &Context,
    spec: &Spec<'_>,
    kept: &ControllerRevision,
    current: &[&ControllerRevision],
    pods: &[&Pod],
) -> Result<()> {
    let hash = core::revision_hash(kept);
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), spec.namespace);
    for pod in pods {
        let label = pod.metadata.labels.as_ref().and_then(|l| l.get(HASH_LABEL));
        if label.map(String::as_str) == Some(hash) {
            continue;
        }
        let patch = json!({"metadata": {"labels": {HASH_LABEL: hash}}});
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let patched = pods_api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        ctx.cache.wrote(&patched);
    }
    let api: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), spec.namespace);
    for duplicate in current
        .iter()
        .filter(|r| r.metadata.name != kept.metadata.name)
    {
        let name = duplicate.metadata.name.as_deref().unwrap_or_default();
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(error) if error.is_not_found() => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

/// `snapshot`: a new revision named by the template's hash. A name taken by a revision with
/// other data is a hash collision: the DaemonSet's `collisionCount` is raised (on a live
/// read) and the reconcile fails, to name it anew on the next.
async fn snapshot(
    ctx: &Context,
    spec: &Spec<'_>,
    data: &serde_json::Value,
    revision: i64,
) -> Result<ControllerRevision> {
    let api: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), spec.namespace);
    let new = core::new_revision(spec, data, revision);
    let name = new.metadata.name.clone().unwrap_or_default();
    match api.create(&PostParams::default(), &new).await {
        Ok(created) => {
            ctx.cache.wrote(&created);
            Ok(created)
        }
        Err(error) if error.is_already_exists() => {
            let existing = api.get(&name).await?;
            if history::same_data(history::data(&existing), data) {
                return Ok(existing);
            }
            let sets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), spec.namespace);
            let mut fresh = sets.get(spec.name).await?;
            let seen = spec.ds.status.as_ref().and_then(|s| s.collision_count);
            let live = fresh.status.as_ref().and_then(|s| s.collision_count);
            if live != seen {
                return Err(Error::Other(format!(
                    "found a stale collision count ({}, expected {}) of DaemonSet {:?} while processing; will retry until it is updated",
                    seen.unwrap_or(0),
                    live.unwrap_or(0),
                    spec.name
                )));
            }
            let status = fresh.status.get_or_insert_with(Default::default);
            status.collision_count = Some(live.unwrap_or(0) + 1);
            let written = sets
                .replace_status(spec.name, &PostParams::default(), &fresh)
                .await?;
            ctx.cache.wrote(&written);
            debug!(
                revision = name,
                "revision name taken; collision count raised"
            );
            Err(error.into())
        }
        Err(error) => Err(error.into()),
    }
}

/// `syncNodes`: the Pods of `writes` created (in slow-start batches, the rest skipped after
/// a failing batch) and deleted, each with kube-controller-manager's Event.
async fn sync_nodes(
    ctx: &Context,
    ds: &DaemonSet,
    spec: &Spec<'_>,
    writes: &core::Writes,
    hash: &str,
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), spec.namespace);
    let (post, delete) = (PostParams::default(), DeleteParams::default());
    let mut first_error = None;
    let mut nodes = writes.create_on.iter();
    'batches: for batch in slow_start_batches(writes.create_on.len()) {
        let pods: Vec<Pod> = nodes
            .by_ref()
            .take(batch)
            .map(|node| core::new_pod(spec, node, hash))
            .collect();
        let created = join_all(pods.iter().map(|pod| api.create(&post, pod))).await;
        let mut failed = false;
        for result in created {
            match result {
                Ok(pod) => {
                    ctx.cache.wrote(&pod);
                    ctx.events.publish(
                        ds,
                        EventType::Normal,
                        SUCCESSFUL_CREATE,
                        "Create",
                        format!(
                            "Created pod: {}",
                            pod.metadata.name.as_deref().unwrap_or_default()
                        ),
                    );
                }
                // Nothing can be made in a namespace being deleted, and nothing is left to do.
                Err(error) if is_namespace_terminating(&error) => break 'batches,
                Err(error) => {
                    ctx.events.publish(
                        ds,
                        EventType::Warning,
                        FAILED_CREATE,
                        "Create",
                        format!("Error creating: {}", status_message(&error)),
                    );
                    keep_first(&mut first_error, error);
                    failed = true;
                }
            }
        }
        if failed {
            break;
        }
    }
    let deleted = join_all(writes.delete.iter().map(|name| api.delete(name, &delete))).await;
    for (name, result) in writes.delete.iter().zip(deleted) {
        match result {
            Ok(either) => {
                if let Some(pod) = either.left() {
                    ctx.cache.wrote(&pod);
                }
                ctx.events.publish(
                    ds,
                    EventType::Normal,
                    SUCCESSFUL_DELETE,
                    "Delete",
                    format!("Deleted pod: {name}"),
                );
            }
            Err(error) if error.is_not_found() => {}
            Err(error) => {
                ctx.events.publish(
                    ds,
                    EventType::Warning,
                    FAILED_DELETE,
                    "Delete",
                    format!("Error deleting: {}", status_message(&error)),
                );
                keep_first(&mut first_error, error);
            }
        }
    }
    debug!(
        created = writes.create_on.len(),
        deleted = writes.delete.len(),
        failed = first_error.is_some(),
        "synced nodes"
    );
    match first_error {
        Some(error) => Err(error),
        None => Ok(()),
    }
}
