//! The EndpointSlice mirroring controller on the SDK (kube-controller-manager's
//! `endpointslice-mirroring-controller`): the Endpoints of Services without a selector,
//! written by hand, mirrored into EndpointSlices, decided with
//! `switchyard_reconciler_core::mirroring`.
//!
//! ```text
//!  keys: an Endpoints' change; a change of the Service of its name (the watcher's
//!        mapByName); a change of a slice labelled with its name (held 1 s): of a slice it
//!        manages, unless its own write; of another, its creation, deletion or relabelling
//!  cache: the Endpoints, the Service, the slices it mirrored (by label, being deleted left out)
//!     ─ not to be mirrored (gone, a selector, skip-mirror, a leader record) ─► every
//!       mirrored slice deleted
//!     ─► plan: create, update (at the read resourceVersion), delete; Events for addresses
//!        skipped
//! ```

use switchyard_k8s::k8s_openapi::api::{
    core::v1::{Endpoints, Service},
    discovery::v1::EndpointSlice,
};
use switchyard_reconciler_core::{
    endpointslice::{MANAGED_BY_LABEL, SERVICE_NAME_LABEL},
    mirroring::{self as core, CONTROLLER_NAME, Plan},
};

use crate::builtin::{Builtin, Permission, RECORD_EVENTS, Tuning};
use crate::cache::ListFilter;
use crate::endpointslice::{SLICE_CHANGE_DELAY, write_slices};
use crate::sdk::{
    Action, Builder, Context, Controller, EventType, Map, Options, Predicate, Request, Result,
    Watches,
};

pub const NAME: &str = switchyard_work::builtin::ENDPOINTSLICE_MIRRORING;

/// This controller, as the reconciler's list of built-ins names it.
pub const BUILTIN: Builtin = Builtin {
    name: NAME,
    service_account: "switchyard-endpointslicemirroring-controller",
    permissions: PERMISSIONS,
    register: |registry, tuning| {
        registry.register(MirroringController::new(tuning));
    },
};

/// What its account may do (`deploy/kustomize/base/rbac.yaml` grants exactly this): write
/// EndpointSlices, set `blockOwnerDeletion` on their owner reference to the Endpoints
/// (`endpoints/finalizers`), record Events. Reads go through the watcher's cache.
pub const PERMISSIONS: &[Permission] = &[
    Permission::new(
        "discovery.k8s.io",
        &["endpointslices"],
        &["create", "update", "delete"],
    ),
    Permission::new("", &["endpoints/finalizers"], &["update"]),
    RECORD_EVENTS,
];

/// kube-controller-manager's EndpointSlice mirroring controller.
#[derive(Debug, Clone, Copy)]
pub struct MirroringController {
    max_per_subset: usize,
}

impl MirroringController {
    pub fn new(tuning: &Tuning) -> Self {
        Self {
            max_per_subset: tuning.mirroring_max_endpoints_per_subset,
        }
    }
}

/// Every change of Endpoints; of the Service of their name; of a slice labelled with their
/// name, held a second, as kube-controller-manager's mirroring controller hears of slices:
/// a slice it manages, unless the change is its own write (its `EndpointSliceTracker`; the
/// watcher reads who wrote from `managedFields`, and the slices are written as [`NAME`]);
/// any other slice only when created, deleted, or relabelled to another Service or manager.
pub fn watches() -> Watches {
    Builder::for_::<Endpoints>()
        .named(NAME)
        .watches::<Service>(Map::name())
        .watches_with::<EndpointSlice>(
            Map::label(SERVICE_NAME_LABEL),
            Options::default()
                .batch_period(SLICE_CHANGE_DELAY)
                .label_selector(format!("{MANAGED_BY_LABEL}={CONTROLLER_NAME}"))
                .predicates([Predicate::NotWrittenBy(NAME.to_owned())]),
        )
        .watches_with::<EndpointSlice>(
            Map::label(SERVICE_NAME_LABEL),
            Options::default()
                .batch_period(SLICE_CHANGE_DELAY)
                .label_selector(format!("{MANAGED_BY_LABEL}!={CONTROLLER_NAME}"))
                .predicates([
                    Predicate::FieldChanged(label_pointer(MANAGED_BY_LABEL)),
                    Predicate::FieldChanged(label_pointer(SERVICE_NAME_LABEL)),
                ]),
        )
        .into_watches()
}

/// The JSON pointer of the label `key` (RFC 6901: a `/` in it is `~1`).
fn label_pointer(key: &str) -> String {
    format!(
        "/metadata/labels/{}",
        key.replace('~', "~0").replace('/', "~1")
    )
}

impl Controller for MirroringController {
    fn name(&self) -> &str {
        NAME
    }

    fn watches(&self) -> Option<Watches> {
        Some(watches())
    }

    async fn reconcile(&self, ctx: &Context, request: &Request) -> Result {
        reconcile(ctx, request, self.max_per_subset).await
    }
}

/// One reconcile of an Endpoints' mirrored slices (`syncEndpoints`).
pub async fn reconcile(ctx: &Context, request: &Request, max_per_subset: usize) -> Result {
    let (namespace, name) = (request.namespace.as_str(), request.name.as_str());
    let endpoints = ctx.cache.get::<Endpoints>(namespace, name, None).await?;
    let service = ctx.cache.get::<Service>(namespace, name, None).await?;
    let selector = format!("{SERVICE_NAME_LABEL}={name},{MANAGED_BY_LABEL}={CONTROLLER_NAME}");
    let slices: Vec<EndpointSlice> = ctx
        .cache
        .list::<EndpointSlice>(
            namespace,
            ListFilter {
                label_selector: &selector,
                ..ListFilter::default()
            },
        )
        .await?
        .into_iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .collect();
    let plan = match endpoints.as_ref() {
        Some(endpoints) if core::should_mirror(Some(endpoints), service.as_ref()) => {
            let plan = core::reconcile(endpoints, &slices, max_per_subset);
            if plan.invalid > 0 {
                ctx.events.publish(
                    endpoints,
                    EventType::Warning,
                    core::INVALID_IP_ADDRESS,
                    "Sync",
                    format!(
                        "Skipped {} invalid IP addresses when mirroring to EndpointSlices",
                        plan.invalid
                    ),
                );
            }
            if plan.skipped > plan.invalid {
                ctx.events.publish(
                    endpoints,
                    EventType::Warning,
                    core::TOO_MANY_ADDRESSES,
                    "Sync",
                    format!(
                        "A max of {max_per_subset} addresses can be mirrored to EndpointSlices per Endpoints subset. {} addresses were skipped",
                        plan.skipped
                    ),
                );
            }
            plan
        }
        _ => Plan {
            delete: slices
                .iter()
                .filter_map(|s| s.metadata.name.clone())
                .collect(),
            ..Plan::default()
        },
    };
    match write_slices(ctx, namespace, &plan.create, &plan.update, &plan.delete).await {
        Some(error) => Err(error),
        None => Ok(Action::Done),
    }
}
