//! The CronJob controller on the SDK (kube-controller-manager's `cronjob-controller`):
//! reads from the watcher's cache, decides with `switchyard_reconciler_core::cronjob`,
//! writes to the apiserver.
//!
//! ```text
//!  cache: CronJob, and the Jobs it controls
//!     ─► delete the oldest finished Jobs past the history limits (background)
//!     ─► active list: finished out; an unknown running Job checked against a fresh read of
//!        the CronJob; a missing one looked up in the apiserver
//!     ─► due? Replace: delete the active Jobs ─► create `<cronjob>-<minute>`
//!     ─► status (active, lastScheduleTime, lastSuccessfulTime), at the version read
//!     ─► RequeueAfter(the next schedule time + 100 ms)
//! ```
//!
//! Between its runs a CronJob is a delayed key in the queue: nothing runs for it. The Job's
//! name is the scheduled minute's, so a reconcile that runs twice for one start time (a
//! retry, a shard move) creates it once: the second creation is refused as existing and the
//! existing Job, if this CronJob's, is recorded instead.

use switchyard_k8s::{
    Api, DeleteParams, PostParams,
    k8s_openapi::{
        api::batch::v1::{CronJob, Job},
        jiff::Timestamp,
    },
    kube::api::PropagationPolicy,
};
use switchyard_reconciler_core::cronjob::{
    self as core, Event, Start, account, forget_active, job_from_template, past_history,
    record_start, time_zone,
};
use tracing::debug;

use crate::builtin::{Builtin, Permission, RECORD_EVENTS};
use crate::{
    cache::ListFilter,
    sdk::{
        Action, Builder, Context, Controller, Error, Refusal, Request, Result, Watches,
        is_namespace_terminating, keep_first, status_message,
    },
};

pub const NAME: &str = switchyard_work::builtin::CRONJOB;

/// This controller, as the reconciler's list of built-ins names it.
pub const BUILTIN: Builtin = Builtin {
    name: NAME,
    service_account: "switchyard-cronjob-controller",
    permissions: PERMISSIONS,
    register: |registry, _| {
        registry.register(CronJobController);
    },
};

/// What its account may do (`deploy/kustomize/base/rbac.yaml` grants exactly this): create,
/// read and delete Jobs, read a CronJob again, write its status and set blockOwnerDeletion
/// (`finalizers`) on its Jobs, record Events. Reads otherwise go through the watcher's cache.
pub const PERMISSIONS: &[Permission] = &[
    Permission::new("batch", &["jobs"], &["get", "create", "delete"]),
    Permission::new("batch", &["cronjobs"], &["get"]),
    Permission::new(
        "batch",
        &["cronjobs/status", "cronjobs/finalizers"],
        &["update"],
    ),
    RECORD_EVENTS,
];

/// Every change of a CronJob, and of a Job it controls.
pub fn watches() -> Watches {
    Builder::for_::<CronJob>().owns::<Job>().into_watches()
}

/// kube-controller-manager's CronJob controller.
#[derive(Debug, Clone, Copy, Default)]
pub struct CronJobController;

impl Controller for CronJobController {
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

fn name_of(job: &Job) -> &str {
    job.metadata.name.as_deref().unwrap_or_default()
}

/// Deletes a Job with its Pods in the background (`realJobControl.DeleteJob`), with the
/// Events kube-controller-manager records; gone already counts as deleted.
async fn delete_job(
    api: &Api<Job>,
    cj: &mut CronJob,
    job: &Job,
    events: &mut Vec<Event>,
) -> Result<()> {
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    match api.delete(name_of(job), &params).await {
        Ok(_) => {}
        Err(error) if error.is_not_found() => {}
        Err(error) => {
            events.push(Event::warning(
                "FailedDelete",
                format!("Deleted job: {}", status_message(&error)),
            ));
            return Err(error.into());
        }
    }
    forget_active(cj, job.metadata.uid.as_deref());
    events.push(Event::normal(
        "SuccessfulDelete",
        format!("Deleted job {}", name_of(job)),
    ));
    Ok(())
}

async fn reconcile(ctx: &Context, request: &Request) -> Result {
    let (namespace, name) = (request.namespace.as_str(), request.name.as_str());
    let Some(cached) = ctx.cache.get::<CronJob>(namespace, name, None).await? else {
        debug!("cronjob gone");
        return Ok(Action::Done);
    };
    let uid = cached.metadata.uid.clone().unwrap_or_default();
    let owned = ctx
        .cache
        .list::<Job>(
            namespace,
            ListFilter {
                controller_uid: &uid,
                ..ListFilter::default()
            },
        )
        .await?;
    let jobs: Vec<&Job> = owned.iter().collect();
    let jobs_api: Api<Job> = ctx.api(namespace);
    let cronjobs: Api<CronJob> = ctx.api(namespace);
    let mut cj = cached.clone();
    let mut events = Vec::new();
    let mut changed = false;
    let mut first_error: Option<Error> = None;

    for job in past_history(&cj, &jobs) {
        match delete_job(&jobs_api, &mut cj, job, &mut events).await {
            Ok(()) => changed = true,
            Err(error) => keep_first(&mut first_error, error),
        }
    }

    let (accounted, unexpected, unaccounted) = account(&mut cj, &jobs, &mut events);
    changed |= accounted;
    if !unexpected.is_empty() {
        // A Job the cached active list lacks may be one this controller just started: the
        // apiserver's copy of the CronJob says.
        let fresh = cronjobs.get(name).await?;
        let knows = |job: &Job| {
            fresh
                .status
                .iter()
                .flat_map(|s| s.active.iter().flatten())
                .any(|r| r.uid == job.metadata.uid)
        };
        if unexpected.iter().any(knows) {
            cj = fresh.clone();
            let (accounted, _, _) = account(&mut cj, &jobs, &mut Vec::new());
            changed = accounted;
        }
        for job in unexpected.iter().filter(|j| !knows(j)) {
            events.push(Event::warning(
                "UnexpectedJob",
                format!(
                    "Saw a job that the controller did not create or forgot: {}",
                    name_of(job)
                ),
            ));
        }
    }
    for reference in unaccounted {
        let job_name = reference.name.clone().unwrap_or_default();
        if jobs_api.get_opt(&job_name).await?.is_none() {
            events.push(Event::normal(
                "MissingJob",
                format!("Active job went missing: {job_name}"),
            ));
            forget_active(&mut cj, reference.uid.as_deref());
            changed = true;
        }
    }

    let now = Timestamp::now();
    let mut requeue = None;
    match core::start(&cj, now, &mut events) {
        Start::Never => {}
        Start::Later(after) => requeue = Some(after),
        Start::Now {
            scheduled,
            replace,
            then,
        } => {
            let started = async {
                for reference in &replace {
                    let job_name = reference.name.clone().unwrap_or_default();
                    let job = match jobs_api.get(&job_name).await {
                        Ok(job) => job,
                        Err(error) => {
                            events.push(Event::warning(
                                "FailedGet",
                                format!("Get job: {}", status_message(&error)),
                            ));
                            return Err(Error::from(error));
                        }
                    };
                    delete_job(&jobs_api, &mut cj, &job, &mut events).await?;
                    changed = true;
                }
                let tz = time_zone(&cj).map_err(Error::Other)?;
                let wanted = job_from_template(&cj, scheduled, &tz);
                let job = match jobs_api.create(&PostParams::default(), &wanted).await {
                    Ok(job) => {
                        ctx.cache.wrote(&job);
                        events.push(Event::normal(
                            "SuccessfulCreate",
                            format!("Created job {}", name_of(&job)),
                        ));
                        job
                    }
                    Err(error) if is_namespace_terminating(&error) => {
                        return Err(Error::from(error));
                    }
                    Err(error) if error.is_already_exists() => {
                        // Made by an earlier reconcile for the same start time.
                        let job = jobs_api.get(name_of(&wanted)).await?;
                        let ours = job
                            .metadata
                            .owner_references
                            .iter()
                            .flatten()
                            .any(|r| r.controller == Some(true) && r.uid == uid);
                        let listed = cj
                            .status
                            .iter()
                            .flat_map(|s| s.active.iter().flatten())
                            .any(|r| r.uid == job.metadata.uid);
                        if !ours || listed {
                            return Ok(None);
                        }
                        job
                    }
                    Err(error) => {
                        events.push(Event::warning(
                            "FailedCreate",
                            format!("Error creating job: {}", status_message(&error)),
                        ));
                        return Err(Error::from(error));
                    }
                };
                record_start(&mut cj, Some(&job), scheduled);
                changed = true;
                Ok(Some(then))
            }
            .await;
            match started {
                Ok(then) => requeue = then,
                Err(error) => keep_first(&mut first_error, error),
            }
        }
    }

    if changed {
        let written = cronjobs
            .replace_status(name, &PostParams::default(), &cj)
            .await?;
        ctx.cache.wrote(&written);
    }
    crate::builtin::publish(ctx, &cached, &events);
    if let Some(error) = first_error {
        return Err(error);
    }
    Ok(requeue.map_or(Action::Done, Action::RequeueAfter))
}
