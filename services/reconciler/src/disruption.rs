//! The disruption controller on the SDK: a PodDisruptionBudget's status, which the
//! apiserver's eviction API (and so `kubectl drain`) honours, decided with
//! `switchyard_reconciler_core::disruption`.
//!
//! ```text
//!  cache: the budget, the Pods its selector matches (a Pod's every change keys the budgets
//!         selecting it: the watcher's mapBySelector)
//!     ─► the scale of each Pod's controller, when maxUnavailable or a percentage asks:
//!        ReplicaSet (its Deployment's, when it has one), StatefulSet, ReplicationController
//!        from the cache; any other kind's /scale from the apiserver
//!     ─► status, written when it differs (409 on a stale read: failed, queue backoff);
//!        a failure to work it out writes disruptionsAllowed 0 and SyncFailed instead
//!     ─► looked at again when the earliest recorded disruption expires
//! ```
//!
//! Its other half, as kube-controller-manager's `stalePodDisruptionQueue`, is a controller
//! of Pods of its own ([`StalePodDisruption`], `stale-pod-disruption`): any Pod, whether a
//! budget selects it or not, whose DisruptionTarget condition has been True for 2 minutes
//! while the Pod was neither deleted nor finished (an eviction whose delete failed) has it
//! set back to False. The watcher keys it only for Pods that carry the condition True and
//! are not being deleted (a field selector on the condition), so a readiness flip keys
//! nothing.

use std::{collections::BTreeMap, time::Duration};

use switchyard_k8s::{
    Api, Deployment, Pod, PostParams, ReplicaSet,
    k8s_openapi::{
        api::{
            apps::v1::StatefulSet, core::v1::ReplicationController, policy::v1::PodDisruptionBudget,
        },
        jiff::Timestamp,
    },
    kube::{
        api::{DynamicObject, GroupVersionKind},
        discovery,
    },
};
use switchyard_reconciler_core::disruption::{self as core, BudgetError};
use tracing::{debug, warn};

use crate::builtin::{Builtin, Permission, RECORD_EVENTS};
use crate::cache::ListFilter;
use crate::sdk::{
    Action, Builder, Context, Controller, Error, EventType, Map, Options, Request, Result, Watches,
    status_message,
};

pub const NAME: &str = switchyard_work::builtin::DISRUPTION;

/// This controller, as the reconciler's list of built-ins names it.
pub const BUILTIN: Builtin = Builtin {
    name: NAME,
    service_account: "switchyard-disruption-controller",
    permissions: PERMISSIONS,
    register: |registry, _| {
        registry.register(DisruptionController);
    },
};

/// What its account may do (`deploy/kustomize/base/rbac.yaml` grants exactly this): write a
/// budget's status, read the scale of any kind's controller not cached here (a custom
/// resource with a `/scale` subresource), record Events. Reads go through the watcher's
/// cache.
pub const PERMISSIONS: &[Permission] = &[
    Permission::new("policy", &["poddisruptionbudgets/status"], &["update"]),
    Permission::new("*", &["*/scale"], &["get"]),
    RECORD_EVENTS,
];

/// kube-controller-manager's disruption controller.
#[derive(Debug, Clone, Copy, Default)]
pub struct DisruptionController;

pub const STALE_NAME: &str = switchyard_work::builtin::STALE_POD_DISRUPTION;

/// The stale-DisruptionTarget half of kube-controller-manager's disruption controller, as
/// the reconciler's list of built-ins names it.
pub const STALE_BUILTIN: Builtin = Builtin {
    name: STALE_NAME,
    service_account: "switchyard-stale-pod-disruption-controller",
    permissions: STALE_PERMISSIONS,
    register: |registry, _| {
        registry.register(StalePodDisruption);
    },
};

/// What its account may do: set a Pod's stale DisruptionTarget condition back to False.
pub const STALE_PERMISSIONS: &[Permission] = &[Permission::new("", &["pods/status"], &["update"])];

/// The Pods whose changes key [`StalePodDisruption`]: a DisruptionTarget condition True, no
/// deletion under way.
pub const STALE_SELECTOR: &str =
    "status.conditions[type=DisruptionTarget].status=True,metadata.deletionTimestamp=";

/// kube-controller-manager's `stalePodDisruptionQueue` and its worker: a Pod's
/// DisruptionTarget condition set back to False once stale.
#[derive(Debug, Clone, Copy, Default)]
pub struct StalePodDisruption;

/// The changes of Pods that carry a DisruptionTarget condition True and are not being
/// deleted; no other Pod's.
pub fn stale_watches() -> Watches {
    Builder::for_with::<Pod>(Options::default().field_selector(STALE_SELECTOR)).into_watches()
}

impl Controller for StalePodDisruption {
    fn name(&self) -> &str {
        STALE_NAME
    }

    fn watches(&self) -> Option<Watches> {
        Some(stale_watches())
    }

    async fn reconcile(&self, ctx: &Context, request: &Request) -> Result {
        reconcile_stale(ctx, request).await
    }
}

/// One reconcile of a Pod (`syncStalePodDisruption`): reset when stale, looked at again when
/// it will be.
pub async fn reconcile_stale(ctx: &Context, request: &Request) -> Result {
    let Some(pod) = ctx
        .cache
        .get::<Pod>(&request.namespace, &request.name, None)
        .await?
    else {
        debug!("pod gone");
        return Ok(Action::Done);
    };
    let now = Timestamp::now();
    match core::stale_disruption_in(&pod, now) {
        None => Ok(Action::Done),
        Some(left) if left.is_zero() => {
            reset_disruption(ctx, &pod, now).await?;
            Ok(Action::Done)
        }
        Some(left) => Ok(Action::RequeueAfter(left)),
    }
}

/// Every change of a budget, and every change of a Pod a budget selects (before or after
/// it), deletions included. ReplicaSets, Deployments, StatefulSets and
/// ReplicationControllers are cached for their scale: no budget controls one, so their
/// changes key nothing.
pub fn watches() -> Watches {
    Builder::for_::<PodDisruptionBudget>()
        .watches_with::<Pod>(Map::selector(), Options::default())
        .owns::<ReplicaSet>()
        .owns::<Deployment>()
        .owns::<StatefulSet>()
        .owns::<ReplicationController>()
        .into_watches()
}

impl Controller for DisruptionController {
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

/// One reconcile of a PodDisruptionBudget (`sync`).
pub async fn reconcile(ctx: &Context, request: &Request) -> Result {
    let Some(pdb) = ctx
        .cache
        .get::<PodDisruptionBudget>(&request.namespace, &request.name, None)
        .await?
    else {
        debug!("budget gone");
        return Ok(Action::Done);
    };
    let now = Timestamp::now();
    match sync(ctx, &pdb, now).await {
        Ok(action) => Ok(action),
        Err(error) if error.is_conflict() => Err(error),
        Err(error) => {
            // As kube-controller-manager's failSafe: no disruption while the status cannot
            // be worked out, and why.
            warn!(%error, "budget not worked out; allowing no disruption");
            let status = core::fail_safe(&pdb, &error.to_string(), now);
            write_status(ctx, &pdb, status).await?;
            Err(error)
        }
    }
}

async fn sync(ctx: &Context, pdb: &PodDisruptionBudget, now: Timestamp) -> Result<Action> {
    let namespace = pdb.metadata.namespace.as_deref().unwrap_or_default();
    let selector = core::selector(pdb).map_err(|e| Error::Other(e.to_string()))?;
    let query = selector.to_query();
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
    let pods: Vec<&Pod> = pods.iter().collect();
    if pods.is_empty() {
        ctx.events.publish(
            pdb,
            EventType::Normal,
            "NoPods",
            "Sync",
            "No matching pods found",
        );
    }
    let scales = if core::needs_scale(pdb) {
        scales(ctx, namespace, &pods).await?
    } else {
        BTreeMap::new()
    };
    let (expected, desired, unmanaged) = match core::expected(pdb, &pods, &scales) {
        Ok(found) => found,
        Err(error) => {
            ctx.events.publish(
                pdb,
                EventType::Warning,
                "CalculateExpectedPodCountFailed",
                "Sync",
                format!("Failed to calculate the number of expected pods: {error}"),
            );
            return Err(Error::Other(error.to_string()));
        }
    };
    if !unmanaged.is_empty() {
        ctx.events.publish(
            pdb,
            EventType::Warning,
            "UnmanagedPods",
            "Sync",
            format!(
                "Pods selected by this PodDisruptionBudget (selector: {query}) were found to be unmanaged. As a result, the status of the PDB cannot be calculated correctly, which may result in undefined behavior. To account for these pods please set \".spec.minAvailable\" field of the PDB to an integer value."
            ),
        );
    }
    let (disrupted, recheck, overdue) = core::disrupted(pdb, &pods, now);
    let name = pdb.metadata.name.as_deref().unwrap_or_default();
    for pod in pods.iter().filter(|p| {
        overdue
            .iter()
            .any(|o| Some(o.as_str()) == p.metadata.name.as_deref())
    }) {
        ctx.events.publish(
            *pod,
            EventType::Warning,
            "NotDeleted",
            "Sync",
            format!("Pod was expected by PDB {namespace}/{name} to be deleted but it wasn't"),
        );
    }
    let healthy = core::current_healthy(&pods, &disrupted, now);
    let status = core::status(pdb, healthy, desired, expected, disrupted, now);
    debug!(
        healthy,
        desired,
        expected,
        allowed = status.disruptions_allowed,
        "budget worked out"
    );
    write_status(ctx, pdb, status).await?;
    Ok(
        match recheck.map(|at| Duration::try_from(at.duration_since(now)).unwrap_or_default()) {
            Some(after) => Action::RequeueAfter(after),
            None => Action::Done,
        },
    )
}

/// Sets the Pod's stale DisruptionTarget condition back to False, at the resourceVersion
/// read (`syncStalePodDisruption`).
async fn reset_disruption(ctx: &Context, pod: &Pod, now: Timestamp) -> Result<()> {
    let mut pod = pod.clone();
    pod.metadata.managed_fields = None;
    let conditions = core::without_disruption(&pod, now);
    pod.status.get_or_insert_with(Default::default).conditions = Some(conditions);
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    Api::<Pod>::namespaced(ctx.client.clone(), namespace)
        .replace_status(name, &PostParams::default(), &pod)
        .await?;
    debug!(
        pod = name,
        "stale DisruptionTarget condition reset to False"
    );
    Ok(())
}

/// Writes the status when it differs from the budget's, then waits for the cache to hold it
/// (the next reconcile compares against the cached budget).
async fn write_status(
    ctx: &Context,
    pdb: &PodDisruptionBudget,
    status: switchyard_k8s::k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus,
) -> Result<()> {
    if !core::status_changed(pdb, &status) {
        return Ok(());
    }
    let namespace = pdb.metadata.namespace.as_deref().unwrap_or_default();
    let name = pdb.metadata.name.as_deref().unwrap_or_default();
    let mut updated = pdb.clone();
    updated.status = Some(status);
    let written = Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), namespace)
        .replace_status(name, &PostParams::default(), &updated)
        .await?;
    if let Some(rv) = written.metadata.resource_version.as_deref() {
        ctx.cache
            .get::<PodDisruptionBudget>(namespace, name, Some(rv))
            .await?;
    }
    Ok(())
}

/// The replicas each Pod's controller wants, by controller UID (`getExpectedScale`'s
/// finders): a ReplicaSet's (its Deployment's when a Deployment controls it), a
/// StatefulSet's, a ReplicationController's, from the cache; any other kind's from its
/// `/scale` subresource. A controller gone, or replaced under its name, is left out (the
/// core then names the Pod).
async fn scales(ctx: &Context, namespace: &str, pods: &[&Pod]) -> Result<BTreeMap<String, i32>> {
    let mut scales = BTreeMap::new();
    for reference in core::controllers(pods) {
        let group = reference
            .api_version
            .split_once('/')
            .map_or("", |(group, _)| group);
        let found = match (group, reference.kind.as_str()) {
            ("apps" | "extensions", "ReplicaSet") => {
                replica_set_scale(ctx, namespace, &reference.name, &reference.uid).await?
            }
            ("apps", "StatefulSet") => ctx
                .cache
                .get::<StatefulSet>(namespace, &reference.name, None)
                .await?
                .filter(|s| s.metadata.uid.as_deref() == Some(&reference.uid))
                .map(|s| s.spec.and_then(|s| s.replicas).unwrap_or(1)),
            ("", "ReplicationController") => ctx
                .cache
                .get::<ReplicationController>(namespace, &reference.name, None)
                .await?
                .filter(|s| s.metadata.uid.as_deref() == Some(&reference.uid))
                .map(|s| s.spec.and_then(|s| s.replicas).unwrap_or(1)),
            _ => custom_scale(ctx, namespace, reference).await?,
        };
        if let Some(replicas) = found {
            scales.insert(reference.uid.clone(), replicas);
        }
    }
    Ok(scales)
}

async fn replica_set_scale(
    ctx: &Context,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<Option<i32>> {
    let Some(rs) = ctx
        .cache
        .get::<ReplicaSet>(namespace, name, None)
        .await?
        .filter(|rs| rs.metadata.uid.as_deref() == Some(uid))
    else {
        return Ok(None);
    };
    let owner = rs
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true));
    match owner {
        Some(owner) if owner.kind == "Deployment" => Ok(ctx
            .cache
            .get::<Deployment>(namespace, &owner.name, None)
            .await?
            .filter(|d| d.metadata.uid.as_deref() == Some(&owner.uid))
            .map(|d| d.spec.and_then(|s| s.replicas).unwrap_or(1))),
        _ => Ok(Some(rs.spec.and_then(|s| s.replicas).unwrap_or(1))),
    }
}

/// The `/scale` of a controller of another kind (a custom resource's), from the apiserver.
async fn custom_scale(
    ctx: &Context,
    namespace: &str,
    reference: &switchyard_k8s::OwnerReference,
) -> Result<Option<i32>> {
    let (group, version) = reference
        .api_version
        .split_once('/')
        .unwrap_or(("", reference.api_version.as_str()));
    let gvk = GroupVersionKind::gvk(group, version, &reference.kind);
    let (resource, capabilities) =
        discovery::pinned_kind(&ctx.client, &gvk)
            .await
            .map_err(|e| {
                Error::Other(format!(
                    "{}/{}: the apiserver serves no such kind ({e})",
                    reference.api_version, reference.kind
                ))
            })?;
    if !capabilities
        .subresources
        .iter()
        .any(|(s, _)| s.plural == "scale")
    {
        return Err(Error::Other(
            BudgetError::Scale(format!(
                "{}.{} does not implement the scale subresource",
                resource.plural, resource.group
            ))
            .to_string(),
        ));
    }
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), namespace, &resource);
    match api.get_scale(&reference.name).await {
        Ok(scale) if scale.metadata.uid.as_deref() == Some(&reference.uid) => {
            Ok(Some(scale.spec.and_then(|s| s.replicas).unwrap_or(0)))
        }
        Ok(_) => Ok(None),
        Err(error) if crate::sdk::Refusal::is_not_found(&error) => Ok(None),
        Err(error) => Err(Error::Other(format!(
            "the scale of {} {}: {}",
            reference.kind,
            reference.name,
            status_message(&error)
        ))),
    }
}
