//! The TTL-after-finished controller on the SDK (kube-controller-manager's
//! `ttl-after-finished-controller`): a finished Job with `ttlSecondsAfterFinished` is deleted
//! that long after it finished, its Pods with it (foreground propagation). The decision is
//! `switchyard_reconciler_core::ttlafterfinished`'s; this module reads and writes.
//!
//! ```text
//!  keys: a Job with a TTL made, finished (its Complete or Failed condition), or given another TTL
//!  cache: Job ─ gone, being deleted, no TTL, not finished ─► Done
//!     ─ not expired yet ─► RequeueAfter(time left)      (the queue holds it; nothing runs meanwhile)
//!     ─► apiserver: the Job read again ─ not expired after all ─► Done / RequeueAfter
//!     ─► delete, foreground, precondition: that UID     (a Job made again under the name is spared)
//! ```

use switchyard_k8s::{
    Api, DeleteParams,
    k8s_openapi::api::batch::v1::Job,
    k8s_openapi::jiff::Timestamp,
    kube::api::{Preconditions, PropagationPolicy},
};
use switchyard_reconciler_core::ttlafterfinished::{Due, due};
use tracing::{debug, info};

use crate::builtin::{Builtin, Permission};
use crate::sdk::{
    Action, Builder, Context, Controller, Error, Options, Predicate, Refusal, Request, Result,
    Watches,
};

pub const NAME: &str = switchyard_work::builtin::TTL_AFTER_FINISHED;

/// This controller, as the reconciler's list of built-ins names it.
pub const BUILTIN: Builtin = Builtin {
    name: NAME,
    service_account: "switchyard-ttl-after-finished-controller",
    permissions: PERMISSIONS,
    register: |registry, _| {
        registry.register(TtlAfterFinishedController);
    },
};

/// What its account may do (`deploy/kustomize/base/rbac.yaml` grants exactly this): read a
/// Job again from the apiserver before deleting it, and delete it. Jobs are otherwise read
/// through the watcher's cache; it records no Events, as kube-controller-manager's does not.
pub const PERMISSIONS: &[Permission] = &[Permission::new("batch", &["jobs"], &["get", "delete"])];

/// A Job with a TTL keys it when made, when it finishes and when its TTL changes:
/// kube-controller-manager's controller hears only of finished Jobs with a TTL
/// (`needsCleanup`), not of Jobs without one nor of the status writes the Job controller
/// makes while a Job runs. A finished Job's conditions stay, so the change that finishes it
/// is the one to hear of; the wait is a delayed key after it.
pub fn watches() -> Watches {
    Builder::for_with::<Job>(
        Options::default()
            .field_selector(format!("{TTL_FIELD}!="))
            .predicates([
                Predicate::FieldChanged(format!("/{}", TTL_FIELD.replace('.', "/"))),
                Predicate::FieldChanged("/status/conditions[type=Complete]/status".to_owned()),
                Predicate::FieldChanged("/status/conditions[type=Failed]/status".to_owned()),
            ]),
    )
    .named(NAME)
    .into_watches()
}

/// The Job's TTL, as a field selector names it.
const TTL_FIELD: &str = "spec.ttlSecondsAfterFinished";

/// kube-controller-manager's TTL-after-finished controller.
#[derive(Debug, Clone, Copy, Default)]
pub struct TtlAfterFinishedController;

impl Controller for TtlAfterFinishedController {
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

/// What a due Job asks of the queue, or `None` to delete it now.
fn wait(job: &Job) -> Result<Option<Action>> {
    match due(job, Timestamp::now()).map_err(|e| Error::Other(e.to_string()))? {
        Due::Never => Ok(Some(Action::Done)),
        Due::After(left) => Ok(Some(Action::RequeueAfter(left))),
        Due::Now => Ok(None),
    }
}

async fn reconcile(ctx: &Context, request: &Request) -> Result {
    let (namespace, name) = (request.namespace.as_str(), request.name.as_str());
    let Some(cached) = ctx.cache.get::<Job>(namespace, name, None).await? else {
        return Ok(Action::Done);
    };
    if let Some(action) = wait(&cached)? {
        return Ok(action);
    }
    // The cache may lag a change of the TTL or a restart of the Job: the apiserver decides.
    let api: Api<Job> = ctx.api(namespace);
    let Some(fresh) = api.get_opt(name).await? else {
        return Ok(Action::Done);
    };
    if let Some(action) = wait(&fresh)? {
        debug!("not expired on a fresh read");
        return Ok(action);
    }
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        preconditions: Some(Preconditions {
            uid: fresh.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => info!("expired job deleted"),
        // Gone, or made again under the name since the read (the precondition fails).
        Err(error) if error.is_not_found() || error.is_conflict() => {
            debug!(%error, "expired job not deleted");
        }
        Err(error) => return Err(error.into()),
    }
    Ok(Action::Done)
}
