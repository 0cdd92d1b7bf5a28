//! The Job controller on the SDK (kube-controller-manager's `job-controller`): reads from
//! the watcher's cache, decides with `switchyard_reconciler_core::job`, writes to the
//! apiserver.
//!
//! ```text
//!  cache: Job ─ gone, or finished ─► remove the tracking finalizer from its stray Pods ─► Done
//!          └ managed by another controller ─► Done
//!  cache: its Pods (by controller UID) ∪ the Pods labelled with its name (or its selector's)
//!     ─► claim: adopt orphans, release Pods that stopped matching  (patches, resourceVersion-guarded)
//!     ─► manage: delete (finalizer first when not to be counted) | create (slow start) | wait
//!     ─► status write 1: finished Pods' UIDs into uncountedTerminatedPods (resourceVersion-guarded)
//!     ─► remove those Pods' tracking finalizers
//!     ─► status write 2: the UIDs moved to succeeded / failed; Complete or Failed once done
//! ```
//!
//! Each write raises the reconcile's read floor, so the key's next reconcile, on any
//! replica, reads a cache that has seen them: this takes the place of kube-controller-
//! manager's expectations (Pods created or deleted, finalizers removed, the Job finished).
//! A reconcile cut short between the writes (a crash, a shard move) leaves UIDs in
//! `uncountedTerminatedPods`, which the next one finishes counting: no Pod is counted twice
//! or lost.

use std::collections::BTreeSet;

use futures::future::join_all;
use serde_json::json;
use switchyard_k8s::{
    Api, DeleteParams, Pod, PostParams,
    k8s_openapi::{api::batch::v1::Job, jiff::Timestamp},
    kube::{
        self,
        api::{Patch, PatchParams},
    },
};
use switchyard_reconciler_core::job::{
    self as core, Claim, Manage, Managed, Spec, SpecError, Sync, TRACKING_FINALIZER,
    has_tracking_finalizer, is_finished, managed_by_other, pod_from_template, slow_start_batches,
};
use tracing::{debug, warn};

use crate::builtin::{Builtin, Permission, RECORD_EVENTS};
use crate::{
    cache::ListFilter,
    sdk::{
        self, Action, Builder, Context, Controller, Error, EventType, Options, Refusal, Request,
        Result, Watches, is_namespace_terminating, keep_first, status_message,
    },
};

pub const NAME: &str = switchyard_work::builtin::JOB;

/// This controller, as the reconciler's list of built-ins names it.
pub const BUILTIN: Builtin = Builtin {
    name: NAME,
    service_account: "switchyard-job-controller",
    permissions: PERMISSIONS,
    register: |registry, _| {
        registry.register(JobController);
    },
};

/// What its account may do (`deploy/kustomize/base/rbac.yaml` grants exactly this): write
/// Pods (create, delete, and patch owner references and the tracking finalizer) and list
/// their metadata, read a Job before adopting, write its status and set blockOwnerDeletion
/// (`finalizers`), record Events. Reads go through the watcher's cache.
pub const PERMISSIONS: &[Permission] = &[
    Permission::new("", &["pods"], &["list", "create", "delete", "patch"]),
    Permission::new("batch", &["jobs"], &["get"]),
    Permission::new("batch", &["jobs/status", "jobs/finalizers"], &["update"]),
    RECORD_EVENTS,
];

/// kube-controller-manager's Event reasons for the Pods a Job creates and deletes.
const SUCCESSFUL_CREATE: &str = "SuccessfulCreate";
const FAILED_CREATE: &str = "FailedCreate";
const SUCCESSFUL_DELETE: &str = "SuccessfulDelete";
const FAILED_DELETE: &str = "FailedDelete";

/// The label the apiserver sets on a Job's Pod template: the Job's name.
const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";

/// Pod changes are held 1 s, so that Pods finishing one after another are one reconcile
/// (kube-controller-manager's `SyncJobBatchPeriod`).
const POD_BATCH_PERIOD: std::time::Duration = core::SYNC_PERIOD;

/// Every change of a Job, and every change of a Pod it controls. A Job's status updates
/// (its own writes, mostly) are held 1 s like Pod changes, its creation and spec changes not
/// (kube-controller-manager's `updateJob` batches an update that keeps the generation).
pub fn watches() -> Watches {
    Builder::for_with::<Job>(Options::default().batch_status_updates(POD_BATCH_PERIOD))
        .owns_with::<Pod>(Options::default().batch_period(POD_BATCH_PERIOD))
        .into_watches()
}

/// kube-controller-manager's Job controller.
#[derive(Debug, Clone, Copy, Default)]
pub struct JobController;

impl Controller for JobController {
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

fn name_of(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

/// The Job's Pods as the cache has them: those it controls, and those labelled with its
/// name (orphans it may adopt, and strays of an earlier Job of the same name); for a Job
/// with a manual selector, those its selector matches instead of the label.
async fn read_pods(
    ctx: &Context,
    namespace: &str,
    name: &str,
    spec: Option<&Spec<'_>>,
    min_rv: Option<&str>,
) -> Result<Vec<Pod>> {
    let manual = spec.is_some_and(|s| s.job_spec.manual_selector == Some(true));
    let query = match spec {
        Some(spec) if manual => spec.selector.to_query(),
        _ => format!("{JOB_NAME_LABEL}={name}"),
    };
    Ok(ctx
        .cache
        .list::<Pod>(
            namespace,
            ListFilter {
                label_selector: &query,
                controller_uid: spec.map_or("", |s| s.uid),
                min_resource_version: min_rv,
                either: spec.is_some(),
            },
        )
        .await?)
}

/// Pods that keep the tracking finalizer with no Job of this name to count them: no
/// controller, or a Job of this name with another UID (one deleted and made again). With
/// `finished`, the finished Job's own Pods too, which it no longer counts.
fn strays<'p>(name: &str, uid: Option<&str>, pods: &'p [Pod], finished: bool) -> Vec<&'p Pod> {
    pods.iter()
        .filter(|p| has_tracking_finalizer(p))
        .filter(|p| match core_controller(p) {
            None => uid.is_none(),
            Some(owner) if owner.kind == "Job" && owner.api_version == "batch/v1" => {
                owner.name == name && (Some(owner.uid.as_str()) != uid || finished)
            }
            Some(_) => false,
        })
        .collect()
}

fn core_controller(pod: &Pod) -> Option<&switchyard_k8s::OwnerReference> {
    switchyard_reconciler_core::replicaset::controller_of(pod)
}

/// Removes the tracking finalizer (`removeTrackingFinalizerPatch`), a strategic merge patch
/// that touches no other finalizer. The patched Pod, or `None` if it is gone.
async fn remove_finalizer(api: &Api<Pod>, pod: &Pod) -> kube::Result<Option<Pod>> {
    let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [TRACKING_FINALIZER]}});
    match api
        .patch(
            name_of(pod),
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
    {
        Ok(pod) => Ok(Some(pod)),
        Err(error) if error.is_not_found() => Ok(None),
        Err(error) => Err(error),
    }
}

/// Removes the tracking finalizer of each Pod; the UIDs whose finalizer is gone and the
/// first failure.
async fn remove_finalizers(
    ctx: &Context,
    api: &Api<Pod>,
    pods: &[&Pod],
) -> (BTreeSet<String>, Option<Error>) {
    let results = join_all(pods.iter().map(|pod| remove_finalizer(api, pod))).await;
    let mut removed = BTreeSet::new();
    let mut first = None;
    for (pod, result) in pods.iter().zip(results) {
        match result {
            Ok(written) => {
                if let Some(written) = written {
                    ctx.cache.wrote(&written);
                }
                removed.insert(pod.metadata.uid.clone().unwrap_or_default());
            }
            Err(error) => keep_first(&mut first, error),
        }
    }
    (removed, first)
}

/// Adopts (`controller` set: the owner reference and the tracking finalizer added) or
/// releases (both taken out) a Pod, at the resourceVersion it was read at.
async fn set_owner(
    api: &Api<Pod>,
    pod: &Pod,
    uid: &str,
    controller: Option<switchyard_k8s::OwnerReference>,
) -> kube::Result<Pod> {
    let adopting = controller.is_some();
    let mut finalizers: Vec<String> = pod
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != TRACKING_FINALIZER)
        .cloned()
        .collect();
    if adopting {
        finalizers.push(TRACKING_FINALIZER.into());
    }
    let patch = json!({
        "metadata": {
            "ownerReferences": sdk::owner_references(pod, uid, controller),
            "finalizers": finalizers,
            "resourceVersion": pod.metadata.resource_version,
        }
    });
    api.patch(name_of(pod), &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

async fn reconcile(ctx: &Context, request: &Request) -> Result {
    let (namespace, name) = (request.namespace.as_str(), request.name.as_str());
    let pods_api: Api<Pod> = ctx.api(namespace);
    let cached = ctx.cache.get::<Job>(namespace, name, None).await?;
    let Some(job) = cached else {
        debug!("job gone; removing its pods' tracking finalizers");
        let pods = read_pods(ctx, namespace, name, None, None).await?;
        return clean_strays(ctx, &pods_api, strays(name, None, &pods, false)).await;
    };
    if let Some(manager) = managed_by_other(&job) {
        debug!(manager, "job managed by another controller; left alone");
        return Ok(Action::Done);
    }
    let spec = match Spec::new(&job) {
        Ok(spec) => spec,
        Err(SpecError::UnknownCompletionMode(_)) => {
            ctx.events.publish(
                &job,
                EventType::Warning,
                "UnknownCompletionMode",
                "Sync",
                "Skipped Job sync because completion mode is unknown",
            );
            return Ok(Action::Done);
        }
        Err(error) => {
            // Retrying cannot fix the object; its next change is keyed again.
            warn!(%error, "invalid job, not reconciled");
            return Ok(Action::Done);
        }
    };
    let mut pods = read_pods(ctx, namespace, name, Some(&spec), None).await?;
    if is_finished(&job) {
        let finished = strays(name, Some(spec.uid), &pods, true);
        return clean_strays(ctx, &pods_api, finished).await;
    }
    if ctx.cache.may_lack_writes() {
        // The key's shard moved lately: the previous owner's last Pod writes may not be in
        // the cache yet. Read again at least at the apiserver's newest of the Job's Pods.
        if let Some(newest) = sdk::newest_version(&pods_api, &spec.selector.to_query()).await? {
            debug!(
                newest,
                "shard moved lately; reading pods again at the apiserver's newest"
            );
            pods = read_pods(ctx, namespace, name, Some(&spec), Some(&newest)).await?;
        }
    }
    let stray = strays(name, Some(spec.uid), &pods, false);
    let mut first_error = None;
    if !stray.is_empty() {
        let (_, error) = remove_finalizers(ctx, &pods_api, &stray).await;
        if let Some(error) = error {
            keep_first(&mut first_error, error);
        }
    }

    let claim = core::claim(&spec, &pods);
    let settled;
    let claim = if claim.adopt.is_empty() && claim.release.is_empty() {
        claim
    } else {
        let floor = adopt_and_release(ctx, &pods_api, &job, &spec, &claim).await?;
        settled = read_pods(ctx, namespace, name, Some(&spec), floor.as_deref()).await?;
        core::claim(&spec, &settled)
    };

    let now = Timestamp::now();
    let mut sync = Sync::new(&spec, claim.pods.clone(), now);
    let manage = sync.manage(now);
    let done = manage_pods(
        ctx,
        &pods_api,
        &job,
        &spec,
        &sync,
        &manage,
        &mut first_error,
    )
    .await;
    sync.managed(&manage, done, now);
    let track = sync.track(now);

    let jobs: Api<Job> = ctx.api(namespace);
    let mut current = job.clone();
    if track.flush {
        current.status = Some(track.status.clone());
        current = jobs
            .replace_status(name, &PostParams::default(), &current)
            .await?;
        ctx.cache.wrote(&current);
    }
    let (removed, removal_error) =
        remove_finalizers(ctx, &pods_api, &track.remove_finalizers).await;
    let status = current.status.clone().unwrap_or_default();
    let finish = track.finish(status, &removed, removal_error.is_some(), Timestamp::now());
    if let Some(status) = finish.status {
        current.status = Some(status);
        current = jobs
            .replace_status(name, &PostParams::default(), &current)
            .await?;
        ctx.cache.wrote(&current);
    }
    crate::builtin::publish(ctx, &current, &finish.events);
    if finish.finished {
        debug!("job finished");
    }
    if let Some(error) = removal_error.or(first_error) {
        return Err(error);
    }
    Ok(match finish.requeue_after {
        Some(delay) if !finish.finished => Action::RequeueAfter(delay),
        _ => Action::Done,
    })
}

/// Removes the tracking finalizer from Pods no Job counts any more.
async fn clean_strays(ctx: &Context, api: &Api<Pod>, pods: Vec<&Pod>) -> Result {
    if pods.is_empty() {
        return Ok(Action::Done);
    }
    debug!(
        count = pods.len(),
        "removing tracking finalizers of stray pods"
    );
    let (_, error) = remove_finalizers(ctx, api, &pods).await;
    match error {
        Some(error) => Err(error),
        None => Ok(Action::Done),
    }
}

/// Adopts the claim's orphans and releases what stopped matching; the newest version
/// written, for the read that follows. As kube-controller-manager, a failure stops the
/// reconcile before any Pod is created.
async fn adopt_and_release(
    ctx: &Context,
    api: &Api<Pod>,
    job: &Job,
    spec: &Spec<'_>,
    claim: &Claim<'_>,
) -> Result<Option<String>> {
    if !claim.adopt.is_empty() {
        sdk::can_adopt(ctx, job, "job").await?;
    }
    let controller = core::controller_ref(spec);
    let writes = claim
        .adopt
        .iter()
        .map(|pod| (pod, Some(controller.clone())))
        .chain(claim.release.iter().map(|pod| (pod, None)));
    let results =
        join_all(writes.map(|(pod, controller)| set_owner(api, pod, spec.uid, controller))).await;
    let mut newest: Option<(u64, String)> = None;
    let mut first = None;
    for result in results {
        match result {
            Ok(pod) => {
                ctx.cache.wrote(&pod);
                if let Some(rv) = pod.metadata.resource_version.as_deref()
                    && let Ok(number) = rv.parse::<u64>()
                    && newest.as_ref().is_none_or(|(n, _)| number > *n)
                {
                    newest = Some((number, rv.to_owned()));
                }
            }
            Err(error) if error.is_not_found() => {}
            Err(error) => keep_first(&mut first, error),
        }
    }
    match first {
        Some(error) => Err(error),
        None => Ok(newest.map(|(_, rv)| rv)),
    }
}

/// Performs what [`Sync::manage`] decided, with kube-controller-manager's Events.
async fn manage_pods(
    ctx: &Context,
    api: &Api<Pod>,
    job: &Job,
    spec: &Spec<'_>,
    sync: &Sync<'_>,
    manage: &Manage<'_>,
    first_error: &mut Option<Error>,
) -> Managed {
    let mut done = Managed::default();
    match manage {
        Manage::None => {}
        Manage::Wait(delay) => debug!(?delay, "pod failure backoff"),
        Manage::Delete {
            pods,
            remove_finalizer: remove,
        } => {
            let results = join_all(pods.iter().map(|pod| delete_pod(ctx, api, pod, *remove))).await;
            for (pod, result) in pods.iter().zip(results) {
                match result {
                    Ok(()) => {
                        done.deleted += 1;
                        if switchyard_reconciler_core::replicaset::is_ready(pod) {
                            done.deleted_ready += 1;
                        }
                        ctx.events.publish(
                            job,
                            EventType::Normal,
                            SUCCESSFUL_DELETE,
                            "Delete",
                            format!("Deleted pod: {}", name_of(pod)),
                        );
                    }
                    Err(error) => {
                        let message = match &error {
                            Error::Kube(error) => status_message(error),
                            other => other.to_string(),
                        };
                        ctx.events.publish(
                            job,
                            EventType::Warning,
                            FAILED_DELETE,
                            "Delete",
                            format!("Error deleting: {message}"),
                        );
                        keep_first(first_error, error);
                    }
                }
            }
            debug!(count = pods.len(), deleted = done.deleted, "deleted pods");
        }
        Manage::Create(indexes) => {
            let params = PostParams::default();
            let mut rest = indexes.as_slice();
            let mut failed = false;
            for batch in slow_start_batches(indexes.len()) {
                let (now, later) = rest.split_at(batch);
                rest = later;
                let templates: Vec<Pod> = now
                    .iter()
                    .map(|ix| pod_from_template(spec, *ix, sync.replaced(*ix)))
                    .collect();
                let created = join_all(templates.iter().map(|pod| api.create(&params, pod))).await;
                for result in created {
                    match result {
                        Ok(pod) => {
                            ctx.cache.wrote(&pod);
                            done.created += 1;
                            ctx.events.publish(
                                job,
                                EventType::Normal,
                                SUCCESSFUL_CREATE,
                                "Create",
                                format!("Created pod: {}", name_of(&pod)),
                            );
                        }
                        // Every creation fails in a namespace being deleted: not a failure.
                        Err(error) if is_namespace_terminating(&error) => {}
                        Err(error) => {
                            ctx.events.publish(
                                job,
                                EventType::Warning,
                                FAILED_CREATE,
                                "Create",
                                format!("Error creating: {}", status_message(&error)),
                            );
                            keep_first(first_error, error);
                            failed = true;
                        }
                    }
                }
                // The rest are skipped: the template is likely refused again.
                if failed {
                    break;
                }
            }
            debug!(
                count = indexes.len(),
                created = done.created,
                "created pods"
            );
        }
    }
    done
}

/// Deletes a Pod, its tracking finalizer removed first when it is not to be counted. Gone
/// already counts as deleted.
async fn delete_pod(ctx: &Context, api: &Api<Pod>, pod: &Pod, remove: bool) -> Result<()> {
    if remove && has_tracking_finalizer(pod) {
        match remove_finalizer(api, pod).await? {
            Some(written) => ctx.cache.wrote(&written),
            None => return Ok(()),
        }
    }
    match api.delete(name_of(pod), &DeleteParams::default()).await {
        Ok(either) => {
            if let Some(pod) = either.left() {
                ctx.cache.wrote(&pod);
            }
            Ok(())
        }
        Err(error) if error.is_not_found() => Ok(()),
        Err(error) => Err(error.into()),
    }
}
