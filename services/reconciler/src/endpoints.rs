//! The Endpoints controller on the SDK (kube-controller-manager's `endpoints-controller`):
//! a selector-based Service's legacy `v1/Endpoints`, decided with
//! `switchyard_reconciler_core::endpoints`.
//!
//! ```text
//!  keys: a Service's change; a change of a Pod its selector matches, before or after (held
//!        `--endpoint-updates-batch-period`); the creation, deletion or relabelling of the
//!        Endpoints of its name (the watcher's mapByName)
//!  cache: the Service, its Pods (by selector), the Endpoints of its name
//!     ─ Service gone ─► the Endpoints deleted (UID precondition), unless a leader record
//!     ─► written when subsets, labels or the capacity annotation differ: created, or
//!        updated at the read resourceVersion (409 on a stale read: retried)
//! ```
//!
//! kube-controller-manager remembers the resourceVersion of Endpoints it replaced, so that
//! a sync never acts on an older copy; here the write raises the key's read floor, and an
//! update from a stale read fails on its resourceVersion.

use std::time::Duration;

use switchyard_k8s::{
    Api, DeleteParams, Pod, PostParams,
    k8s_openapi::api::core::v1::{Endpoints, Service},
    kube::api::Preconditions,
};
use switchyard_reconciler_core::endpoints::{self as core, Decision};
use tracing::debug;

use crate::builtin::{Builtin, Permission, RECORD_EVENTS, Tuning};
use crate::cache::ListFilter;
use crate::sdk::{
    Action, Builder, Context, Controller, Error, EventType, Map, Options, Predicate, Refusal,
    Request, Result, Watches, is_namespace_terminating, status_message,
};

pub const NAME: &str = switchyard_work::builtin::ENDPOINTS;

/// This controller, as the reconciler's list of built-ins names it.
pub const BUILTIN: Builtin = Builtin {
    name: NAME,
    service_account: "switchyard-endpoint-controller",
    permissions: PERMISSIONS,
    register: |registry, tuning| {
        registry.register(EndpointsController::new(tuning));
    },
};

/// What its account may do (`deploy/kustomize/base/rbac.yaml` grants exactly this): write
/// Endpoints (`endpoints/restricted` for addresses the apiserver guards, as
/// kube-controller-manager's role has it), record Events. Reads go through the watcher's
/// cache.
pub const PERMISSIONS: &[Permission] = &[
    Permission::new("", &["endpoints"], &["create", "update", "delete"]),
    Permission::new("", &["endpoints/restricted"], &["create"]),
    RECORD_EVENTS,
];

pub const FAILED_TO_CREATE: &str = "FailedToCreateEndpoint";
pub const FAILED_TO_UPDATE: &str = "FailedToUpdateEndpoint";

/// kube-controller-manager's Endpoints controller.
#[derive(Debug, Clone, Copy)]
pub struct EndpointsController {
    batch_period: Duration,
}

impl EndpointsController {
    pub fn new(tuning: &Tuning) -> Self {
        Self {
            batch_period: tuning.endpoints_batch_period,
        }
    }
}

/// Every change of a Service; a change of a Pod its selector matches that an endpoint reads
/// ([`crate::endpointslice::pod_changes`]), held `batch_period`; the
/// creation, deletion or relabelling of the Endpoints of its name (its own updates key
/// nothing: kube-controller-manager hears only of deletions).
pub fn watches(batch_period: Duration) -> Watches {
    Builder::for_::<Service>()
        .named(NAME)
        .watches_with::<Pod>(
            Map::selector(),
            crate::endpointslice::pod_changes(batch_period),
        )
        .watches_with::<Endpoints>(
            Map::name(),
            Options::default().predicates([Predicate::LabelsChanged]),
        )
        .into_watches()
}

impl Controller for EndpointsController {
    fn name(&self) -> &str {
        NAME
    }

    fn watches(&self) -> Option<Watches> {
        Some(watches(self.batch_period))
    }

    async fn reconcile(&self, ctx: &Context, request: &Request) -> Result {
        reconcile(ctx, request).await
    }
}

/// One reconcile of a Service's Endpoints (`syncService`).
pub async fn reconcile(ctx: &Context, request: &Request) -> Result {
    let (namespace, name) = (request.namespace.as_str(), request.name.as_str());
    let service = ctx.cache.get::<Service>(namespace, name, None).await?;
    // The Endpoints and the Pods read side by side: a flip's delay is the reads' in a row.
    let selector = service
        .as_ref()
        .filter(|s| switchyard_reconciler_core::endpointslice::manages(s))
        .map(switchyard_reconciler_core::endpointslice::selector_string);
    let pods = async {
        match &selector {
            Some(selector) => {
                let filter = ListFilter {
                    label_selector: selector,
                    ..ListFilter::default()
                };
                ctx.cache.list_shared::<Pod>(namespace, filter).await
            }
            None => Ok(Vec::new()),
        }
    };
    let (current, pods) =
        futures::try_join!(ctx.cache.get::<Endpoints>(namespace, name, None), pods)?;
    let trigger = service
        .as_ref()
        .and_then(|s| core::trigger_time(s, &pods, current.as_ref()));
    let api: Api<Endpoints> = Api::namespaced(ctx.client.clone(), namespace);
    match core::sync(service.as_ref(), &pods, current.as_ref(), trigger) {
        Decision::Nothing => Ok(Action::Done),
        Decision::Delete => {
            let uid = current.and_then(|e| e.metadata.uid);
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid,
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(name, &params).await {
                Ok(_) => debug!("endpoints of a deleted service deleted"),
                Err(error) if error.is_not_found() || error.is_conflict() => {}
                Err(error) => return Err(error.into()),
            }
            Ok(Action::Done)
        }
        Decision::Write(endpoints) => {
            let creating = endpoints.metadata.resource_version.is_none();
            let written = if creating {
                api.create(&PostParams::default(), &endpoints).await
            } else {
                api.replace(name, &PostParams::default(), &endpoints).await
            };
            match written {
                Ok(written) => {
                    ctx.cache.wrote(&written);
                    Ok(Action::Done)
                }
                Err(error) if creating && is_namespace_terminating(&error) => Ok(Action::Done),
                Err(error) => {
                    let (reason, message) = if creating {
                        (
                            FAILED_TO_CREATE,
                            format!(
                                "Failed to create endpoint for service {namespace}/{name}: {}",
                                status_message(&error)
                            ),
                        )
                    } else {
                        (
                            FAILED_TO_UPDATE,
                            format!(
                                "Failed to update endpoint {namespace}/{name}: {}",
                                status_message(&error)
                            ),
                        )
                    };
                    ctx.events
                        .publish(&*endpoints, EventType::Warning, reason, "Sync", message);
                    Err(Error::Kube(error))
                }
            }
        }
    }
}
