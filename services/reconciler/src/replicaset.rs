//! The ReplicaSet controller on the SDK: reads from the watcher's cache, decides with
//! `switchyard_reconciler_core::replicaset`, writes to the apiserver.
//!
//! ```text
//!  cache: ReplicaSet, its Pods (by controller UID) ∪ the selector's Pods
//!     ─► short of Pods and the key's shard moved lately: the cache again, at least at the
//!        apiserver's newest version of the selector's Pods   (the previous owner's writes)
//!     ─► claim: adopt orphans, release Pods that stopped matching   (patches, resourceVersion-guarded)
//!     ─► diff:  create in slow-start batches | delete the lowest-ranked
//!     ─► cache again, at least at the resourceVersion of the last write   (reads its own writes)
//!     ─► status from that read ─► replace status (409 on a stale read: failed, queue backoff)
//!     ─► cache again, at least at the status write's resourceVersion
//! ```
//!
//! Why the second read: the Pods are counted from a cache that has seen every write of this
//! reconcile, and the next reconcile of the key (on any worker) starts after this one's
//! outcome, from a cache at least as new. So no reconcile counts a stale set of Pods and
//! creates more than `replicas`: this takes the place of kube-controller-manager's
//! expectations. A shard that moved to another queue replica starts without a floor, so
//! for a while after ([`CacheClient::may_lack_writes`]) a reconcile about to create Pods
//! first asks the apiserver how new its Pods are, as kube-controller-manager's new leader
//! starts from a fresh list.

use std::collections::BTreeMap;

use futures::future::join_all;
use serde::{Serialize, de::DeserializeOwned};
use switchyard_k8s::{
    Api, DeleteParams, Pod, PostParams, ReplicaSet,
    k8s_openapi::{
        NamespaceResourceScope,
        api::{apps::v1::ReplicaSetStatus, core::v1::ReplicationController},
        jiff::Timestamp,
    },
    kube::Resource,
};
use switchyard_reconciler_core::{
    replicaset::{
        self as core, Diff, ManageFailure, Owner, Spec, controller_of, pod_from_template,
        pods_to_delete, replication_controller_as_replica_set, replication_controller_status,
        slow_start_batches,
    },
    selector::Selector,
};
use tracing::{debug, warn};

use crate::builtin::{Builtin, Permission, RECORD_EVENTS};
use crate::{
    cache::{CacheClient, ListFilter},
    sdk::{
        self, Action, Builder, Context, Controller, Error, EventType, Options, Refusal, Request,
        Result, Watches, is_namespace_terminating, keep_first, status_message,
    },
};

/// kube-controller-manager's Event reasons for the Pods a ReplicaSet creates and deletes.
pub(crate) const SUCCESSFUL_CREATE: &str = "SuccessfulCreate";
pub(crate) const FAILED_CREATE: &str = "FailedCreate";
pub(crate) const SUCCESSFUL_DELETE: &str = "SuccessfulDelete";
pub(crate) const FAILED_DELETE: &str = "FailedDelete";

pub const NAME: &str = switchyard_work::builtin::REPLICASET;

/// This controller, as the reconciler's list of built-ins names it.
pub const BUILTIN: Builtin = Builtin {
    name: NAME,
    service_account: "switchyard-replicaset-controller",
    permissions: PERMISSIONS,
    register: |registry, _| {
        registry.register(ReplicaSetController);
    },
};

/// What its account may do (`deploy/kustomize/base/rbac.yaml` grants exactly this): write
/// Pods and list their metadata, read a ReplicaSet before adopting, write the status and set
/// blockOwnerDeletion (`finalizers`), record Events. Reads go through the watcher's cache.
pub const PERMISSIONS: &[Permission] = &[
    Permission::new("", &["pods"], &["list", "create", "delete", "patch"]),
    Permission::new("apps", &["replicasets"], &["get"]),
    Permission::new(
        "apps",
        &["replicasets/status", "replicasets/finalizers"],
        &["update"],
    ),
    RECORD_EVENTS,
];

/// kube-controller-manager's ReplicaSet controller.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReplicaSetController;

/// Every change of a ReplicaSet, its status included (whoever changes it, the controller
/// repairs the drift, as kube-controller-manager does), and every change of a Pod it
/// controls: the status counts ready and available Pods. Pod changes are held 250 ms, so
/// that Pods turning Ready one after another are one status write, not one each
/// (kube-controller-manager's Job controller batches its Pod events for 1 s).
pub fn watches() -> Watches {
    Builder::for_::<ReplicaSet>()
        .owns_with::<Pod>(Options::default().batch_period(POD_BATCH_PERIOD))
        .into_watches()
}

/// How long a Pod change's key is held (`watches`).
pub(crate) const POD_BATCH_PERIOD: std::time::Duration = std::time::Duration::from_millis(250);

impl Controller for ReplicaSetController {
    fn name(&self) -> &str {
        NAME
    }

    fn watches(&self) -> Option<Watches> {
        Some(watches())
    }

    async fn reconcile(&self, ctx: &Context, request: &Request) -> Result {
        reconcile::<ReplicaSet>(ctx, request).await
    }
}

/// What this controller reconciles: a ReplicaSet, or a ReplicationController through its
/// ReplicaSet form, as kube-controller-manager's replication manager is its ReplicaSet
/// controller over a conversion (`crate::replicationcontroller`).
pub trait Replicated:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The kind the Pods' controller references name.
    const OWNER: Owner;
    /// How kube-controller-manager's messages name it ("replica set").
    const NOUN: &'static str;
    /// Its ReplicaSet form, which the decisions are made on.
    fn as_replica_set(&self) -> ReplicaSet;
    /// It with `status` (computed on the ReplicaSet form) as its own.
    fn with_status(&self, status: ReplicaSetStatus) -> Self;
}

impl Replicated for ReplicaSet {
    const OWNER: Owner = Owner::ReplicaSet;
    const NOUN: &'static str = "replica set";

    fn as_replica_set(&self) -> ReplicaSet {
        self.clone()
    }

    fn with_status(&self, status: ReplicaSetStatus) -> Self {
        let mut updated = self.clone();
        updated.status = Some(status);
        updated
    }
}

impl Replicated for ReplicationController {
    const OWNER: Owner = Owner::ReplicationController;
    const NOUN: &'static str = "replication controller";

    fn as_replica_set(&self) -> ReplicaSet {
        replication_controller_as_replica_set(self)
    }

    fn with_status(&self, status: ReplicaSetStatus) -> Self {
        let mut updated = self.clone();
        updated.status = Some(replication_controller_status(status));
        updated
    }
}

/// The highest resourceVersion of this reconcile's Pod writes, each also raising the
/// reconcile's read floor as it is made ([`CacheClient::wrote`]).
#[derive(Debug)]
struct Writes<'a> {
    cache: &'a CacheClient,
    max: Option<(u64, String)>,
}

impl<'a> Writes<'a> {
    fn new(cache: &'a CacheClient) -> Self {
        Self { cache, max: None }
    }

    fn saw(&mut self, pod: &Pod) {
        self.cache.wrote(pod);
        let Some(rv) = pod.metadata.resource_version.as_deref() else {
            return;
        };
        // resourceVersions are etcd revisions; the watcher compares them as numbers too.
        let Ok(number) = rv.parse::<u64>() else {
            return;
        };
        if self.max.as_ref().is_none_or(|(max, _)| number > *max) {
            self.max = Some((number, rv.to_owned()));
        }
    }

    fn resource_version(&self) -> Option<&str> {
        self.max.as_ref().map(|(_, rv)| rv.as_str())
    }
}

/// The Pods the ReplicaSet controls and those its selector matches (orphans to adopt), in
/// name order.
async fn read_pods(ctx: &Context, spec: &Spec<'_>, min_rv: Option<&str>) -> Result<Vec<Pod>> {
    let namespace = spec.rs.metadata.namespace.as_deref().unwrap_or_default();
    let query = spec.selector.to_query();
    let pods = ctx
        .cache
        .list::<Pod>(
            namespace,
            ListFilter {
                label_selector: &query,
                controller_uid: spec.uid,
                min_resource_version: min_rv,
                either: true,
            },
        )
        .await?;
    Ok(pods)
}

/// kube-controller-manager's `canAdopt` for a ReplicaSet ([`sdk::can_adopt`]).
pub async fn can_adopt(ctx: &Context, rs: &ReplicaSet) -> Result<()> {
    sdk::can_adopt(ctx, rs, ReplicaSet::NOUN).await
}

/// The Pods of every ReplicaSet controlled by this one's controller, this one's included
/// (`getIndirectlyRelatedPods`): each ReplicaSet's selector, over the namespace. None for a
/// ReplicaSet without a controller. The siblings of one Deployment share its selector's
/// requirements, so one read with those, kept where a sibling's selector matches, finds what
/// a read per sibling would; siblings that share none are read one by one.
async fn related_pods<K: Replicated>(ctx: &Context, rs: &ReplicaSet) -> Result<Vec<Pod>> {
    let Some(owner) = rs
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
    else {
        return Ok(Vec::new());
    };
    let namespace = rs.metadata.namespace.as_deref().unwrap_or_default();
    let siblings: Vec<ReplicaSet> = ctx
        .cache
        .list::<K>(
            namespace,
            ListFilter {
                controller_uid: &owner.uid,
                ..ListFilter::default()
            },
        )
        .await?
        .iter()
        .map(K::as_replica_set)
        .collect();
    let selectors: Vec<Selector> = siblings
        .iter()
        .filter_map(|sibling| Spec::new(sibling).ok().map(|spec| spec.selector))
        .collect();
    let common = Selector::common(&selectors);
    let reads = if common.is_empty() {
        selectors.iter().collect()
    } else {
        vec![&common]
    };
    let mut by_uid: BTreeMap<String, Pod> = BTreeMap::new();
    for read in reads {
        let query = read.to_query();
        let pods = ctx
            .cache
            .list::<Pod>(
                namespace,
                ListFilter {
                    label_selector: &query,
                    ..ListFilter::default()
                },
            )
            .await?;
        for pod in pods {
            let labels = pod.metadata.labels.as_ref();
            if selectors.iter().any(|s| s.matches(labels)) {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                by_uid.entry(uid).or_insert(pod);
            }
        }
    }
    Ok(by_uid.into_values().collect())
}

/// One reconcile of a ReplicaSet, or of a ReplicationController in its ReplicaSet form:
/// decided on that form, its status written back as the object's own, its Events on it.
pub async fn reconcile<K: Replicated>(ctx: &Context, request: &Request) -> Result {
    let Some(object) = ctx
        .cache
        .get::<K>(&request.namespace, &request.name, None)
        .await?
    else {
        debug!("{} gone", K::NOUN);
        return Ok(Action::Done);
    };
    let rs = object.as_replica_set();
    let spec = match Spec::of(&rs, K::OWNER) {
        Ok(spec) => spec,
        Err(error) => {
            // Retrying cannot fix the object; its next change is keyed again.
            warn!(%error, "invalid {}, not reconciled", K::NOUN);
            return Ok(Action::Done);
        }
    };
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &request.namespace);
    let mut pods = read_pods(ctx, &spec, None).await?;
    // Only counted here after a shard move, off the common path.
    if ctx.cache.may_lack_writes()
        && matches!(
            core::diff(&spec, core::claim(&spec, &pods).owned.len()),
            Diff::Create(_)
        )
    {
        // The key's shard moved lately: the Pods missing may be ones the previous owner's
        // last reconcile created, which the watcher has not shown yet. Read again at least
        // at the apiserver's newest version of the selector's Pods.
        if let Some(newest) = sdk::newest_version(&pods_api, &spec.selector.to_query()).await? {
            debug!(
                newest,
                "shard moved lately; reading pods again at the apiserver's newest"
            );
            pods = read_pods(ctx, &spec, Some(&newest)).await?;
        }
    }
    let claim = core::claim(&spec, &pods);

    let mut writes = Writes::new(&ctx.cache);
    let mut first_error: Option<Error> = None;

    if !claim.adopt.is_empty() {
        sdk::can_adopt(ctx, &object, K::NOUN).await?;
    }
    let adopted = join_all(claim.adopt.iter().map(|pod| {
        sdk::set_controller_ref(&pods_api, pod, spec.uid, Some(core::controller_ref(&spec)))
    }))
    .await;
    let released = join_all(
        claim
            .release
            .iter()
            .map(|pod| sdk::set_controller_ref(&pods_api, pod, spec.uid, None)),
    )
    .await;
    let mut adopted_pods = Vec::new();
    for result in adopted {
        match result {
            Ok(pod) => {
                writes.saw(&pod);
                adopted_pods.push(pod);
            }
            // Gone since the read: nothing to adopt.
            Err(error) if error.is_not_found() => {}
            Err(error) => keep_first(&mut first_error, error),
        }
    }
    for result in released {
        match result {
            Ok(pod) => writes.saw(&pod),
            Err(error) if error.is_not_found() => {}
            Err(error) => keep_first(&mut first_error, error),
        }
    }
    // As kube-controller-manager does: no scaling on a failed claim (a Pod not adopted now
    // would be adopted later, on top of a replacement created for it).
    if let Some(error) = first_error {
        return Err(error);
    }
    let mut owned: Vec<&Pod> = claim.owned.clone();
    owned.extend(adopted_pods.iter().filter(|p| controller_of(p).is_some()));

    let mut failure = None;
    let mut namespace_terminating = false;
    let diff = core::diff(&spec, owned.len());
    debug!(
        read = pods.len(),
        owned = owned.len(),
        ?diff,
        "counted pods"
    );
    match diff {
        Diff::Create(count) => {
            let template = pod_from_template(&spec);
            let params = PostParams::default();
            for batch in slow_start_batches(count) {
                let created =
                    join_all((0..batch).map(|_| pods_api.create(&params, &template))).await;
                for result in created {
                    match result {
                        Ok(pod) => {
                            writes.saw(&pod);
                            ctx.events.publish(
                                &object,
                                EventType::Normal,
                                SUCCESSFUL_CREATE,
                                "Create",
                                format!(
                                    "Created pod: {}",
                                    pod.metadata.name.as_deref().unwrap_or_default()
                                ),
                            );
                        }
                        // Every creation fails in a namespace being deleted, and nothing is
                        // left to do there: as kube-controller-manager, not a failure, and
                        // no Event.
                        Err(error) if is_namespace_terminating(&error) => {
                            namespace_terminating = true;
                        }
                        Err(error) => {
                            let message = status_message(&error);
                            ctx.events.publish(
                                &object,
                                EventType::Warning,
                                FAILED_CREATE,
                                "Create",
                                format!("Error creating: {message}"),
                            );
                            failure.get_or_insert(ManageFailure {
                                reason: FAILED_CREATE,
                                message,
                            });
                            keep_first(&mut first_error, error);
                        }
                    }
                }
                // The rest of the batches are skipped: the template is likely refused again.
                if failure.is_some() || namespace_terminating {
                    break;
                }
            }
            debug!(count, failed = failure.is_some(), "created pods");
        }
        Diff::Delete(count) => {
            let related = if count < owned.len() {
                related_pods::<K>(ctx, &rs).await?
            } else {
                Vec::new()
            };
            let related: Vec<&Pod> = related.iter().collect();
            let victims = pods_to_delete(&owned, &related, count, Timestamp::now());
            let params = DeleteParams::default();
            let deleted = join_all(victims.iter().map(|pod| {
                pods_api.delete(pod.metadata.name.as_deref().unwrap_or_default(), &params)
            }))
            .await;
            for (victim, result) in victims.iter().zip(deleted) {
                let name = victim.metadata.name.as_deref().unwrap_or_default();
                match result {
                    // Graceful deletion returns the Pod marked for deletion, immediate deletion
                    // the deleted Pod: either carries the write's resourceVersion.
                    Ok(either) => {
                        if let Some(pod) = either.left() {
                            writes.saw(&pod);
                        }
                        ctx.events.publish(
                            &object,
                            EventType::Normal,
                            SUCCESSFUL_DELETE,
                            "Delete",
                            format!("Deleted pod: {name}"),
                        );
                    }
                    Err(error) if error.is_not_found() => {}
                    Err(error) => {
                        let message = status_message(&error);
                        ctx.events.publish(
                            &object,
                            EventType::Warning,
                            FAILED_DELETE,
                            "Delete",
                            format!("Error deleting: {message}"),
                        );
                        failure.get_or_insert(ManageFailure {
                            reason: FAILED_DELETE,
                            message,
                        });
                        keep_first(&mut first_error, error);
                    }
                }
            }
            debug!(count, failed = failure.is_some(), "deleted pods");
        }
        Diff::None => {}
    }

    // Count from a read that reflects every write above.
    let settled;
    let claim = match writes.resource_version() {
        Some(rv) => {
            settled = read_pods(ctx, &spec, Some(rv)).await?;
            core::claim(&spec, &settled)
        }
        None => claim,
    };
    let now = Timestamp::now();
    let status = core::status(&spec, &claim, failure.as_ref(), now);
    if core::status_changed(&rs, &status) {
        let updated = object.with_status(status);
        let written = Api::<K>::namespaced(ctx.client.clone(), &request.namespace)
            .replace_status(&request.name, &PostParams::default(), &updated)
            .await?;
        // The next reconcile of this key starts after this one's outcome. It compares the
        // status it computes with the cached ReplicaSet's and skips an equal one, so that
        // cache must hold this write: a cache still showing the status from before it would
        // make an unchanged-looking status skip a needed write until some later event.
        if let Some(rv) = written.meta().resource_version.as_deref() {
            ctx.cache
                .get::<K>(&request.namespace, &request.name, Some(rv))
                .await?;
        }
    }
    if let Some(error) = first_error {
        return Err(error);
    }
    Ok(match core::recheck_after(&spec, &claim, now) {
        Some(delay) => Action::RequeueAfter(delay),
        None => Action::Done,
    })
}
