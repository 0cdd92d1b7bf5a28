//! The EndpointSlice controller on the SDK (kube-controller-manager's
//! `endpointslice-controller`): reads from the watcher's cache, decides with
//! `switchyard_reconciler_core::endpointslice`, writes to the apiserver.
//!
//! ```text
//!  keys: a Service's change; a change of a Pod its selector matches, before or after (the
//!        watcher's mapBySelector, held `--endpointslice-updates-batch-period`); a change of
//!        a slice labelled with its name that is not this controller's own write (held 1 s,
//!        as kube-controller-manager's)
//!  cache: the Service ─ gone, ExternalName, no selector ─► Done (slices left to the
//!         garbage collector, or as they are)
//!     ─► its Pods (by selector), its slices (by label, those being deleted left out), the
//!        zone of each Pod's Node (read again at most every 10 s per Node); with
//!        topology-mode Auto, every Node's zone, readiness and CPU (at most every 10 s)
//!     ─► plan: create (generated name), update (full, at the read resourceVersion: 409 on
//!        a stale read), delete; Events on hints turned on or off
//!     ─► a Pod on an unknown Node left out: written without it, then failed (retried)
//!     ─► topology-mode Auto: looked at again after 30 s, for the Nodes' changes
//! ```
//!
//! kube-controller-manager keeps an `EndpointSliceTracker` so that a sync never acts on
//! slices older than its own last write, and so that its own writes key no sync. Here each
//! write raises the key's read floor ([`crate::cache::CacheClient::wrote`]): the next
//! reconcile of the Service, in any reconciler, reads a cache that holds it, and an update
//! made from an older read fails on its resourceVersion. The slices are written under the
//! controller's field manager, and the watcher keys no Service for a change that was that
//! manager's write alone (`Predicate::NotWrittenBy`).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use futures::future::join_all;
use switchyard_k8s::{
    Api, DeleteParams, Pod, PostParams,
    k8s_openapi::api::{
        core::v1::{Node, Service},
        discovery::v1::EndpointSlice,
    },
};
use switchyard_reconciler_core::endpointslice::{
    self as core, Inputs, MANAGED_BY_LABEL, NodeInfo, SERVICE_NAME_LABEL, ZONE_LABEL, topology,
};
use tracing::debug;

use crate::builtin::{Builtin, Permission, RECORD_EVENTS, Tuning, publish};
use crate::cache::ListFilter;
use crate::sdk::{
    Action, Builder, Context, Controller, Error, EventType, Map, Options, Predicate, Refusal,
    Request, Result, Watches, keep_first, status_message,
};

pub const NAME: &str = switchyard_work::builtin::ENDPOINTSLICE;

/// This controller, as the reconciler's list of built-ins names it.
pub const BUILTIN: Builtin = Builtin {
    name: NAME,
    service_account: "switchyard-endpointslice-controller",
    permissions: PERMISSIONS,
    register: |registry, tuning| {
        registry.register(EndpointSliceController::new(tuning));
    },
};

/// What its account may do (`deploy/kustomize/base/rbac.yaml` grants exactly this): write
/// EndpointSlices, set `blockOwnerDeletion` on their owner reference to the Service
/// (`services/finalizers`), record Events. Services, Pods, Nodes and slices are read
/// through the watcher's cache.
pub const PERMISSIONS: &[Permission] = &[
    Permission::new(
        "discovery.k8s.io",
        &["endpointslices"],
        &["create", "update", "delete"],
    ),
    Permission::new("", &["services/finalizers"], &["update"]),
    RECORD_EVENTS,
];

/// How long a slice's change is held before it keys its Service
/// (`endpointSliceChangeMinSyncDelay`).
pub const SLICE_CHANGE_DELAY: Duration = Duration::from_secs(1);

/// `FailedToUpdateEndpointSlices`: a reconcile failed; its error follows.
pub const FAILED_TO_UPDATE: &str = "FailedToUpdateEndpointSlices";

/// How long a Node's zone, once read, is used without reading the Node again: a reconcile
/// of a Service over Pods on many Nodes reads each Node at most this often. A Node that
/// changes zone is seen within it (kube-controller-manager's EndpointSlice controller does
/// not look at a Service again for a Node's change either).
pub const ZONE_TTL: Duration = Duration::from_secs(10);

/// How soon a Service with topology-aware hints is looked at again: kube-controller-manager
/// looks again at such a Service whose zones went over their share when a Node comes, goes,
/// turns ready or not, or changes zone; here Node changes key no Service, and the look
/// again catches them.
pub const TOPOLOGY_RECHECK: Duration = Duration::from_secs(30);

/// The zones read lately, by Node.
type Zones = Arc<Mutex<HashMap<String, (Option<String>, Instant)>>>;

/// What the Nodes said lately of the zones' shares of CPU.
type Shares = Arc<Mutex<Option<(Option<BTreeMap<String, f64>>, Instant)>>>;

/// kube-controller-manager's EndpointSlice controller.
#[derive(Debug, Clone)]
pub struct EndpointSliceController {
    max_per_slice: usize,
    batch_period: Duration,
    memory: Memory,
}

/// What this reconciler keeps between reconciles: nothing a reconcile elsewhere needs.
#[derive(Debug, Clone, Default)]
struct Memory {
    zones: Zones,
    shares: Shares,
    /// The Services (`namespace/name`) with topology-aware hints from this reconciler, so
    /// that turning them on or off is told once (kube-controller-manager keeps this in
    /// memory too; a restart tells it again).
    hinted: Arc<Mutex<HashSet<String>>>,
}

impl EndpointSliceController {
    pub fn new(tuning: &Tuning) -> Self {
        Self {
            max_per_slice: tuning.max_endpoints_per_slice,
            batch_period: tuning.endpoint_updates_batch_period,
            memory: Memory::default(),
        }
    }
}

/// Every change of a Service; a change of a Pod its selector matches (before or after the
/// change) that an endpoint reads ([`pod_changes`]), held `batch_period`; of a slice labelled with its name, held a second, unless the change
/// is this controller's own write (kube-controller-manager's `EndpointSliceTracker`, which
/// keys a Service only for slices changed since its own last write: here the watcher reads
/// who wrote from `managedFields`, and the slices are written as [`NAME`]). Nodes are cached
/// for their zone, readiness and CPU; their changes key nothing.
pub fn watches(batch_period: Duration) -> Watches {
    Builder::for_::<Service>()
        .named(NAME)
        .watches_with::<Pod>(Map::selector(), pod_changes(batch_period))
        .watches_with::<EndpointSlice>(
            Map::label(SERVICE_NAME_LABEL),
            Options::default()
                .batch_period(SLICE_CHANGE_DELAY)
                .predicates([Predicate::NotWrittenBy(NAME.to_owned())]),
        )
        .owns::<Node>()
        .into_watches()
}

/// The Pod changes that key the Services selecting the Pod, in this controller and the
/// Endpoints controller, held `batch_period`: kube-controller-manager's
/// `podEndpointsChanged`. Its labels (which Services select it), its deletion starting, its
/// readiness and its IPs; and its phase, since a Pod that ended leaves the endpoints whatever
/// its readiness said. Name, node, hostname, subdomain and ports are set before the Pod has
/// an IP, and an annotation or a container's restart count keys nothing.
pub fn pod_changes(batch_period: Duration) -> Options {
    let options = Options::default().predicates([
        Predicate::LabelsChanged,
        Predicate::FieldChanged("/metadata/deletionTimestamp".to_owned()),
        Predicate::FieldChanged("/status/conditions[type=Ready]/status".to_owned()),
        Predicate::FieldChanged("/status/podIPs".to_owned()),
        Predicate::FieldChanged("/status/phase".to_owned()),
    ]);
    if batch_period.is_zero() {
        options
    } else {
        options.batch_period(batch_period)
    }
}

impl Controller for EndpointSliceController {
    fn name(&self) -> &str {
        NAME
    }

    fn watches(&self) -> Option<Watches> {
        Some(watches(self.batch_period))
    }

    async fn reconcile(&self, ctx: &Context, request: &Request) -> Result {
        reconcile(ctx, request, self.max_per_slice, &self.memory).await
    }
}

/// One reconcile of a Service's slices (`syncService`).
async fn reconcile(
    ctx: &Context,
    request: &Request,
    max_per_slice: usize,
    memory: &Memory,
) -> Result {
    let (namespace, name) = (request.namespace.as_str(), request.name.as_str());
    // A Service deleted takes its slices with it through their owner reference.
    let Some(service) = ctx.cache.get::<Service>(namespace, name, None).await? else {
        debug!("service gone");
        return Ok(Action::Done);
    };
    if !core::manages(&service) {
        return Ok(Action::Done);
    }
    let selector = core::selector_string(&service);
    let slice_selector = format!(
        "{SERVICE_NAME_LABEL}={name},{MANAGED_BY_LABEL}={}",
        core::CONTROLLER_NAME
    );
    // The Pods and the slices read side by side: a flip's delay is the reads' in a row.
    let (pods, slices) = futures::try_join!(
        ctx.cache.list_shared::<Pod>(
            namespace,
            ListFilter {
                label_selector: &selector,
                ..ListFilter::default()
            },
        ),
        ctx.cache.list::<EndpointSlice>(
            namespace,
            ListFilter {
                label_selector: &slice_selector,
                ..ListFilter::default()
            },
        ),
    )?;
    let slices: Vec<EndpointSlice> = slices
        .into_iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .collect();
    let pods: Vec<&Pod> = pods.iter().map(|pod| &**pod).collect();
    let nodes = node_zones(ctx, &pods, &memory.zones).await?;
    let node = |name: &str| nodes.get(name).cloned().unwrap_or(NodeInfo::Missing);
    let auto = topology::auto(&service);
    let shares = if auto {
        zone_shares(ctx, &memory.shares).await?
    } else {
        None
    };
    let key = format!("{namespace}/{name}");
    let hinted = memory
        .hinted
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(&key);
    let plan = core::reconcile(&Inputs {
        service: &service,
        pods: &pods,
        slices: &slices,
        node: &node,
        max_per_slice,
        trigger_time: core::trigger_time(&service, &pods, &slices),
        zone_ratios: shares.as_ref(),
        hints_populated: hinted,
    });
    {
        let mut memory = memory.hinted.lock().unwrap_or_else(PoisonError::into_inner);
        if plan.hints_populated {
            memory.insert(key);
        } else {
            memory.remove(&key);
        }
    }
    publish(ctx, &service, &plan.events);
    let mut first_error =
        write_slices(ctx, namespace, &plan.create, &plan.update, &plan.delete).await;
    if let Some(skipped) = plan.skipped.first() {
        keep_first(
            &mut first_error,
            Error::Other(format!(
                "skipping Pod {} for Service {namespace}/{name}: Node {} Not Found",
                skipped.pod, skipped.node
            )),
        );
    }
    match first_error {
        None if auto => Ok(Action::RequeueAfter(TOPOLOGY_RECHECK)),
        None => Ok(Action::Done),
        Some(error) => {
            ctx.events.publish(
                &service,
                EventType::Warning,
                FAILED_TO_UPDATE,
                "Sync",
                format!("Error updating Endpoint Slices for Service {namespace}/{name}: {error}"),
            );
            Err(error)
        }
    }
}

/// Each zone's share of the ready Nodes' CPU ([`topology::zone_ratios`]), as read within
/// [`ZONE_TTL`] or from the cache.
async fn zone_shares(ctx: &Context, known: &Shares) -> Result<Option<BTreeMap<String, f64>>> {
    if let Some((shares, at)) = known
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        && at.elapsed() < ZONE_TTL
    {
        return Ok(shares.clone());
    }
    let nodes: Vec<Node> = ctx.cache.list("", ListFilter::default()).await?;
    let shares = topology::zone_ratios(&nodes);
    *known.lock().unwrap_or_else(PoisonError::into_inner) = Some((shares.clone(), Instant::now()));
    Ok(shares)
}

/// The zone of each Node the Pods run on: as read within [`ZONE_TTL`], or from the cache
/// (metadata: its labels). A Node the cache lacks is read again each time.
async fn node_zones(
    ctx: &Context,
    pods: &[&Pod],
    known: &Zones,
) -> Result<BTreeMap<String, NodeInfo>> {
    let mut names: Vec<&str> = pods
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.as_deref())
        .filter(|n| !n.is_empty())
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut zones = BTreeMap::new();
    let mut unknown = Vec::new();
    {
        let known = known.lock().unwrap_or_else(PoisonError::into_inner);
        for name in names {
            match known.get(name) {
                Some((zone, at)) if at.elapsed() < ZONE_TTL => {
                    zones.insert(name.to_owned(), NodeInfo::Zone(zone.clone()));
                }
                _ => unknown.push(name),
            }
        }
    }
    if unknown.is_empty() {
        return Ok(zones);
    }
    let read = join_all(
        unknown
            .iter()
            .map(|name| ctx.cache.get_metadata::<Node>("", name, None)),
    )
    .await;
    let now = Instant::now();
    let mut known = known.lock().unwrap_or_else(PoisonError::into_inner);
    known.retain(|_, (_, at)| at.elapsed() < ZONE_TTL);
    for (name, node) in unknown.into_iter().zip(read) {
        let info = match node? {
            Some(node) => {
                let zone = node
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(ZONE_LABEL))
                    .cloned();
                known.insert(name.to_owned(), (zone.clone(), now));
                NodeInfo::Zone(zone)
            }
            None => NodeInfo::Missing,
        };
        zones.insert(name.to_owned(), info);
    }
    Ok(zones)
}

/// Writes slices in kube-controller-manager's order (creations, updates, deletions) under
/// the controller's field manager, stopping at the first failure, which it returns; each
/// write raises the key's read floor.
/// A creation refused because the namespace is being deleted ends the writes quietly. The
/// mirroring controller writes its slices this way too.
pub(crate) async fn write_slices(
    ctx: &Context,
    namespace: &str,
    create: &[EndpointSlice],
    update: &[EndpointSlice],
    delete: &[String],
) -> Option<Error> {
    let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), namespace);
    let failed = |verb: &str, error: &switchyard_k8s::kube::Error| {
        Error::Other(format!(
            "failed to {verb} EndpointSlice: {}",
            status_message(error)
        ))
    };
    // Written as the controller, so that the watcher tells its writes from others'.
    let params = PostParams {
        field_manager: Some(ctx.field_manager().to_owned()),
        ..PostParams::default()
    };
    for slice in create {
        match api.create(&params, slice).await {
            Ok(created) => ctx.cache.wrote(&created),
            Err(error) if crate::sdk::is_namespace_terminating(&error) => return None,
            Err(error) => return Some(failed("create", &error)),
        }
    }
    for slice in update {
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        match api.replace(name, &params, slice).await {
            Ok(updated) => ctx.cache.wrote(&updated),
            // A conflict: the read was stale; the queue's backoff retries with a newer one.
            Err(error) if error.is_conflict() => return Some(Error::Kube(error)),
            Err(error) => return Some(failed(&format!("update {name}"), &error)),
        }
    }
    for name in delete {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(error) if error.is_not_found() => {}
            Err(error) => return Some(failed(&format!("delete {name}"), &error)),
        }
    }
    None
}
