//! The EndpointSlice controller's decisions, as kube-controller-manager's
//! `endpointslice-controller` (the `k8s.io/endpointslice` reconciler) makes them: the
//! EndpointSlices that list a selector-based Service's Pods for kube-proxy, DNS and every
//! Gateway and mesh.
//!
//! ```text
//!  Service (not ExternalName, with a selector)
//!     ─► address types from spec.ipFamilies (IPv4, IPv6); a slice of another type: deleted
//!  per address type:
//!     Pods the selector matches, not terminal, with an IP
//!        ─► one endpoint each (its addresses of that family, ready / serving / terminating,
//!           nodeName, the Node's zone, hostname when the Pod names the Service as subdomain)
//!        ─► grouped by the ports the Service's ports resolve to on that Pod
//!     per port set, against the slices of that port set (owned by the Service):
//!        ─► an endpoint in a slice and still desired: kept there (replaced if changed)
//!        ─► a slice that lost every endpoint: deleted; one that changed: updated
//!        ─► new endpoints: into the slices already being updated (fullest first), then
//!           into the unchanged slice that they fill closest to 100, then new slices
//!     no endpoint at all ─► one empty placeholder slice (kept if already there)
//!     a slice to delete and one to create of the same type ─► the deleted one's name reused
//!     hints: topology-mode Auto ─► allotted by zone from the Nodes' CPU ([`topology`]);
//!            trafficDistribution PreferClose / PreferSameZone ─► forZones of the endpoint's
//!            zone on ready endpoints (PreferSameNode: forNodes too); otherwise none
//! ```
//!
//! The packing touches as few slices as kube-controller-manager's does. Where it picks at
//! random (which new endpoint goes into which slice, among slices of equal fill), this one
//! picks in name order, so the same inputs give the same slices.

use std::{
    borrow::Borrow,
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use k8s_openapi::{
    api::{
        core::v1::{ObjectReference, Pod, Service, ServicePort},
        discovery::v1::{
            Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForNode,
            ForZone,
        },
    },
    apimachinery::pkg::{
        apis::meta::v1::{ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
    jiff::Timestamp,
};

use crate::{
    event::Event,
    replicaset::{is_ready, ready_since},
};

pub mod topology;

#[cfg(test)]
mod tests;

/// The label naming the controller that manages a slice (`discovery.LabelManagedBy`).
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// This controller's value of [`MANAGED_BY_LABEL`], kube-controller-manager's own: a slice
/// either writes is the other's, so a handover keeps every slice.
pub const CONTROLLER_NAME: &str = "endpointslice-controller.k8s.io";
/// The label naming the Service a slice belongs to (`discovery.LabelServiceName`).
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Set (empty) on the slices of a headless Service (`v1.IsHeadlessService`).
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// When the change the slice reflects happened (`v1.EndpointsLastChangeTriggerTime`).
pub const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";
/// The zone label of a Node (`v1.LabelTopologyZone`).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// kube-controller-manager's `--max-endpoints-per-slice` default.
pub const DEFAULT_MAX_ENDPOINTS_PER_SLICE: usize = 100;
/// The most `--max-endpoints-per-slice` may be (the API's limit on a slice's endpoints).
pub const MAX_ENDPOINTS_PER_SLICE_LIMIT: usize = 1000;

pub const IPV4: &str = "IPv4";
pub const IPV6: &str = "IPv6";

/// What the Node of a Pod tells: whether it exists, and its zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeInfo {
    /// The Node is not (or not yet) in the cache.
    Missing,
    /// The Node, with its `topology.kubernetes.io/zone` label if any.
    Zone(Option<String>),
}

/// A Pod skipped because its Node is unknown (`skipping Pod ... Node ... Not Found`): the
/// reconcile writes the rest and fails, to be retried with a backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedPod {
    pub pod: String,
    pub node: String,
}

/// What one reconcile of a Service writes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Slices to create under a generated name (`<service>-`).
    pub create: Vec<EndpointSlice>,
    /// Slices to write in full over the one of the same name (its resourceVersion kept, so a
    /// stale read fails with a conflict).
    pub update: Vec<EndpointSlice>,
    /// Slices to delete, by name.
    pub delete: Vec<String>,
    /// Pods left out because their Node is not known.
    pub skipped: Vec<SkippedPod>,
    /// Whether the Service has topology-aware hints from this controller now (kept in
    /// memory, as kube-controller-manager keeps it, to tell their enabling once).
    pub hints_populated: bool,
    /// Events for the Service (topology-aware hints turned on or off).
    pub events: Vec<Event>,
}

impl Plan {
    /// The number of writes.
    pub fn writes(&self) -> usize {
        self.create.len() + self.update.len() + self.delete.len()
    }
}

/// Whether the Service gets slices from this controller at all: not an ExternalName, and
/// with a selector (a Service without one has its Endpoints written by hand, which the
/// mirroring controller turns into slices). Slices of a Service that stops qualifying are
/// left as they are, as kube-controller-manager leaves them.
pub fn manages(service: &Service) -> bool {
    let Some(spec) = service.spec.as_ref() else {
        return false;
    };
    spec.type_.as_deref() != Some("ExternalName")
        && spec.selector.as_ref().is_some_and(|s| !s.is_empty())
}

/// The Service's selector as a label selector string (`a=b,c=d`), for a cache read.
pub fn selector_string(service: &Service) -> String {
    service
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The address types the Service's slices carry (`getAddressTypesForService`).
pub fn address_types(service: &Service) -> BTreeSet<&'static str> {
    let spec = service.spec.as_ref();
    let mut types: BTreeSet<&'static str> = spec
        .and_then(|s| s.ip_families.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|family| match family.as_str() {
            "IPv4" => Some(IPV4),
            "IPv6" => Some(IPV6),
            _ => None,
        })
        .collect();
    if !types.is_empty() {
        return types;
    }
    // An apiserver too old to default ipFamilies: the family of the cluster IP, or both for
    // a headless Service.
    match spec.and_then(|s| s.cluster_ip.as_deref()) {
        Some(ip) if !ip.is_empty() && ip != "None" => {
            types.insert(if ip.contains(':') { IPV6 } else { IPV4 });
        }
        _ => {
            types.insert(IPV4);
            types.insert(IPV6);
        }
    }
    types
}

fn is_headless(service: &Service) -> bool {
    let ip = service.spec.as_ref().and_then(|s| s.cluster_ip.as_deref());
    matches!(ip, None | Some("" | "None"))
}

/// Whether a Pod belongs in endpoints at all (`ShouldPodBeInEndpoints`, terminating ones
/// included): not Succeeded or Failed, and with an IP.
pub fn should_be_in_endpoints(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return false;
    }
    status.pod_ip.as_deref().is_some_and(|ip| !ip.is_empty())
        || status.pod_ips.as_ref().is_some_and(|ips| !ips.is_empty())
}

/// The container port a Service port reaches on this Pod (`FindPort`): a number as it is;
/// a name looked up among the containers' ports, then the restartable init containers'
/// (sidecars), of the same protocol. `None` when the name matches nothing.
pub fn find_port(pod: &Pod, port: &ServicePort) -> Option<i32> {
    let protocol = port.protocol.as_deref().unwrap_or("TCP");
    match port.target_port.as_ref() {
        Some(IntOrString::Int(n)) => Some(*n),
        // Defaulted by the apiserver to the port itself.
        None => Some(port.port),
        Some(IntOrString::String(name)) => {
            let spec = pod.spec.as_ref()?;
            let sidecars = spec
                .init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"));
            spec.containers
                .iter()
                .chain(sidecars)
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| {
                    p.name.as_deref() == Some(name.as_str())
                        && p.protocol.as_deref().unwrap_or("TCP") == protocol
                })
                .map(|p| p.container_port)
        }
    }
}

/// The ports of the Pod's endpoint (`getEndpointPorts`), in a canonical order: one per
/// Service port that resolves on the Pod; none for a headless Service without ports.
pub fn endpoint_ports(service: &Service, pod: &Pod) -> Vec<EndpointPort> {
    let ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default();
    let mut out: Vec<EndpointPort> = ports
        .iter()
        .filter_map(|port| {
            let number = find_port(pod, port)?;
            Some(EndpointPort {
                name: Some(port.name.clone().unwrap_or_default()),
                port: Some(number),
                protocol: Some(port.protocol.clone().unwrap_or_else(|| "TCP".to_owned())),
                app_protocol: port.app_protocol.clone(),
            })
        })
        .collect();
    sort_ports(&mut out);
    out
}

fn port_key(port: &EndpointPort) -> (Option<&str>, Option<i32>, Option<&str>, Option<&str>) {
    (
        port.name.as_deref(),
        port.port,
        port.protocol.as_deref(),
        port.app_protocol.as_deref(),
    )
}

fn sort_ports(ports: &mut [EndpointPort]) {
    ports.sort_by(|a, b| port_key(a).cmp(&port_key(b)));
}

/// The set of ports a slice serves, as slices are grouped by it (`PortMapKey`).
pub(crate) type PortsKey = Vec<(Option<String>, Option<i32>, Option<String>, Option<String>)>;

pub(crate) fn ports_key(ports: &[EndpointPort]) -> PortsKey {
    let mut key: PortsKey = ports
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                p.port,
                p.protocol.clone(),
                p.app_protocol.clone(),
            )
        })
        .collect();
    key.sort();
    key
}

/// The Pod's IPs of one address type, in canonical text (`getEndpointAddresses`).
fn addresses(pod: &Pod, address_type: &str) -> Vec<String> {
    let status = pod.status.as_ref();
    let mut ips: Vec<&str> = status
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .map(|ip| ip.ip.as_str())
        .collect();
    if ips.is_empty()
        && let Some(ip) = status.and_then(|s| s.pod_ip.as_deref())
    {
        ips.push(ip);
    }
    ips.into_iter()
        .filter_map(|ip| ip.parse::<IpAddr>().ok())
        .filter(|ip| match ip {
            IpAddr::V4(_) => address_type == IPV4,
            IpAddr::V6(_) => address_type == IPV6,
        })
        .map(|ip| ip.to_string())
        .collect()
}

/// The Pod as an endpoint of the Service (`podToEndpoint`).
pub fn pod_endpoint(
    pod: &Pod,
    zone: Option<&str>,
    service: &Service,
    address_type: &str,
) -> Endpoint {
    let serving = is_ready(pod);
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let publish_not_ready = service
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let ready = publish_not_ready || (serving && !terminating);
    let spec = pod.spec.as_ref();
    let node_name = spec
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty());
    let hostname = spec
        .and_then(|s| s.hostname.as_deref())
        .filter(|h| !h.is_empty())
        .filter(|_| {
            spec.and_then(|s| s.subdomain.as_deref()) == service.metadata.name.as_deref()
                && pod.metadata.namespace == service.metadata.namespace
        })
        .map(str::to_owned);
    Endpoint {
        addresses: addresses(pod, address_type),
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".to_owned()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..ObjectReference::default()
        }),
        node_name,
        zone: zone.filter(|z| !z.is_empty()).map(str::to_owned),
        hostname,
        ..Endpoint::default()
    }
}

/// What tells one endpoint from another (`hashEndpoint`): its addresses, hostname and the
/// namespace and name of the object behind it. The rest may change in place.
pub(crate) type EndpointKey = (Vec<String>, Option<String>, Option<String>, Option<String>);

pub(crate) fn endpoint_key(endpoint: &Endpoint) -> EndpointKey {
    let mut addresses = endpoint.addresses.clone();
    addresses.sort();
    let target = endpoint.target_ref.as_ref();
    (
        addresses,
        endpoint.hostname.clone(),
        target.and_then(|t| t.namespace.clone()),
        target.and_then(|t| t.name.clone()),
    )
}

/// Whether two endpoints of the same key are the same in everything a slice update would
/// carry (`EndpointsEqualBeyondHash`): node, zone, conditions, target (its
/// resourceVersion aside). Hints are the heuristics' business.
pub(crate) fn same_beyond_key(a: &Endpoint, b: &Endpoint) -> bool {
    let conditions = |e: &Endpoint| {
        let c = e.conditions.clone().unwrap_or_default();
        (c.ready, c.serving, c.terminating)
    };
    let target = |e: &Endpoint| {
        e.target_ref.clone().map(|mut t| {
            t.resource_version = None;
            t
        })
    };
    a.node_name == b.node_name
        && a.zone == b.zone
        && conditions(a) == conditions(b)
        && target(a) == target(b)
}

/// The labels a slice of `service` carries (`setEndpointSliceLabels`): the Service's own
/// (the reserved ones aside), the headless marker, the Service's name and this controller's;
/// and whether the slice's own (reserved ones aside) differ from the Service's.
fn slice_labels(
    existing: Option<&BTreeMap<String, String>>,
    service: &Service,
) -> (BTreeMap<String, String>, bool) {
    let reserved = |k: &String| {
        k.as_str() == SERVICE_NAME_LABEL
            || k.as_str() == MANAGED_BY_LABEL
            || k.as_str() == HEADLESS_LABEL
    };
    let own: BTreeMap<String, String> = existing
        .into_iter()
        .flatten()
        .filter(|(k, _)| !reserved(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut labels: BTreeMap<String, String> = service
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| !reserved(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let changed = own != labels;
    if is_headless(service) {
        labels.insert(HEADLESS_LABEL.to_owned(), String::new());
    }
    labels.insert(
        SERVICE_NAME_LABEL.to_owned(),
        service.metadata.name.clone().unwrap_or_default(),
    );
    labels.insert(MANAGED_BY_LABEL.to_owned(), CONTROLLER_NAME.to_owned());
    (labels, changed)
}

/// The controller reference a slice carries to its Service.
pub fn owner_reference(service: &Service) -> OwnerReference {
    OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Service".to_owned(),
        name: service.metadata.name.clone().unwrap_or_default(),
        uid: service.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn owned_by(slice: &EndpointSlice, service: &Service) -> bool {
    let uid = service.metadata.uid.as_deref().unwrap_or_default();
    slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid && o.kind == "Service" && o.api_version == "v1")
}

/// A new slice of `service` (`newEndpointSlice`), named by the apiserver from
/// `<service>-`.
fn new_slice(service: &Service, ports: &[EndpointPort], address_type: &str) -> EndpointSlice {
    let (labels, _) = slice_labels(None, service);
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!(
                "{}-",
                service.metadata.name.as_deref().unwrap_or_default()
            )),
            namespace: service.metadata.namespace.clone(),
            labels: Some(labels),
            owner_references: Some(vec![owner_reference(service)]),
            ..ObjectMeta::default()
        },
        address_type: address_type.to_owned(),
        ports: Some(ports.to_vec()),
        endpoints: Vec::new(),
    }
}

/// Whether `slice` is already what the placeholder would be: no ports, no endpoints, the
/// same labels (`placeholderSliceCompare`, which looks at nothing else of the metadata).
fn is_placeholder(slice: &EndpointSlice, placeholder: &EndpointSlice) -> bool {
    slice.metadata.namespace == placeholder.metadata.namespace
        && slice.metadata.labels.clone().unwrap_or_default()
            == placeholder.metadata.labels.clone().unwrap_or_default()
        && slice.address_type == placeholder.address_type
        && slice.endpoints.is_empty()
        && slice.ports.as_deref().unwrap_or_default().is_empty()
}

/// How a Service's endpoints carry hints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hints {
    /// None: any found are removed.
    Off,
    /// `service.kubernetes.io/topology-mode: Auto`: allotted by [`topology`].
    Auto,
    /// `trafficDistribution: PreferClose` or `PreferSameZone`: each ready endpoint hinted
    /// for its own zone; with `nodes`, `PreferSameNode`, for its own Node too.
    Close { nodes: bool },
}

fn hints_of(service: &Service) -> Hints {
    // The topology-aware hints annotation takes precedence over trafficDistribution.
    if topology::auto(service) {
        return Hints::Auto;
    }
    match service
        .spec
        .as_ref()
        .and_then(|s| s.traffic_distribution.as_deref())
    {
        Some("PreferClose" | "PreferSameZone") => Hints::Close { nodes: false },
        Some("PreferSameNode") => Hints::Close { nodes: true },
        _ => Hints::Off,
    }
}

fn endpoint_ready(endpoint: &Endpoint) -> bool {
    endpoint
        .conditions
        .as_ref()
        .and_then(|c| c.ready)
        .unwrap_or(false)
}

/// The hints an endpoint should carry under `hints` (ready endpoints only are touched;
/// `None` for a not-ready one under `Close` means "leave as is").
fn wanted_hints(endpoint: &Endpoint, hints: Hints) -> Option<Option<EndpointHints>> {
    match hints {
        Hints::Off | Hints::Auto => Some(None),
        Hints::Close { nodes } => {
            if !endpoint_ready(endpoint) {
                return None;
            }
            let for_zones = endpoint.zone.clone().map(|name| vec![ForZone { name }]);
            let for_nodes = endpoint
                .node_name
                .clone()
                .filter(|_| nodes)
                .map(|name| vec![ForNode { name }]);
            if for_zones.is_none() && for_nodes.is_none() {
                Some(None)
            } else {
                Some(Some(EndpointHints {
                    for_zones,
                    for_nodes,
                }))
            }
        }
    }
}

fn needs_hints_update(slice: &EndpointSlice, hints: Hints) -> bool {
    slice.endpoints.iter().any(|e| match hints {
        Hints::Off | Hints::Auto => e.hints.is_some(),
        Hints::Close { nodes } => {
            if !endpoint_ready(e) {
                return false;
            }
            let zones = e.hints.as_ref().and_then(|h| h.for_zones.as_deref());
            let node_hints = e.hints.as_ref().and_then(|h| h.for_nodes.as_deref());
            let zone_wrong = match &e.zone {
                Some(zone) => !matches!(zones, Some([only]) if only.name == *zone),
                None => zones.is_some_and(|z| !z.is_empty()),
            };
            let node_wrong = match (&e.node_name, nodes) {
                (Some(node), true) => !matches!(node_hints, Some([only]) if only.name == *node),
                _ => node_hints.is_some_and(|n| !n.is_empty()),
            };
            zone_wrong || node_wrong
        }
    })
}

fn apply_hints(slice: &mut EndpointSlice, hints: Hints) {
    for endpoint in &mut slice.endpoints {
        if let Some(wanted) = wanted_hints(endpoint, hints) {
            endpoint.hints = wanted;
        }
    }
}

/// The trigger time the slices written now carry (`ComputeEndpointLastChangeTriggerTime`,
/// from what the slices already say instead of a tracker in memory): the Service's creation
/// on its first slices; otherwise the earliest Ready transition of a Pod newer than the
/// newest trigger time already written; `None` (the annotation removed) when there is none.
pub fn trigger_time(
    service: &Service,
    pods: &[impl Borrow<Pod>],
    slices: &[EndpointSlice],
) -> Option<Timestamp> {
    trigger_time_after(
        service,
        pods,
        slices.iter().filter_map(|s| {
            s.metadata
                .annotations
                .as_ref()?
                .get(TRIGGER_TIME_ANNOTATION)
        }),
    )
}

/// The trigger time after the ones already `written` (the newest counts): the Service's
/// creation when none was, then the earliest Ready change of a Pod newer than it.
pub fn trigger_time_after<'a>(
    service: &Service,
    pods: &[impl Borrow<Pod>],
    written: impl IntoIterator<Item = &'a String>,
) -> Option<Timestamp> {
    let created = service.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let Some(last) = written
        .into_iter()
        .filter_map(|t| t.parse::<Timestamp>().ok())
        .max()
    else {
        return created;
    };
    pods.iter()
        .filter_map(|pod| ready_transition(pod.borrow()))
        .chain(created)
        .filter(|t| *t > last)
        .min()
}

/// When the Pod's Ready condition last moved, either way.
fn ready_transition(pod: &Pod) -> Option<Timestamp> {
    if let Some(since) = ready_since(pod) {
        return since;
    }
    pod.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

/// The inputs of one reconcile.
pub struct Inputs<'a> {
    pub service: &'a Service,
    /// The Pods the Service's selector matches, in its namespace.
    pub pods: &'a [&'a Pod],
    /// The slices labelled as this controller's for the Service (its name and
    /// [`MANAGED_BY_LABEL`] [`CONTROLLER_NAME`]),
    /// those being deleted left out.
    pub slices: &'a [EndpointSlice],
    /// The Node of a Pod, by name.
    pub node: &'a dyn Fn(&str) -> NodeInfo,
    /// `--max-endpoints-per-slice`.
    pub max_per_slice: usize,
    /// What [`trigger_time`] gives.
    pub trigger_time: Option<Timestamp>,
    /// For a Service with topology-aware hints ([`topology::auto`]): each zone's share of the
    /// Nodes' CPU, as [`topology::zone_ratios`] gives it.
    pub zone_ratios: Option<&'a BTreeMap<String, f64>>,
    /// Whether the Service had topology-aware hints from this controller (the last
    /// [`Plan::hints_populated`]).
    pub hints_populated: bool,
}

impl std::fmt::Debug for Inputs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inputs")
            .field("service", &self.service.metadata.name)
            .field("pods", &self.pods.len())
            .field("slices", &self.slices.len())
            .field("max_per_slice", &self.max_per_slice)
            .field("trigger_time", &self.trigger_time)
            .finish_non_exhaustive()
    }
}

/// One reconcile of a Service's slices (`Reconcile`). Call it only for a Service that
/// [`manages`] says this controller manages.
pub fn reconcile(inputs: &Inputs<'_>) -> Plan {
    let service = inputs.service;
    let types = address_types(service);
    let mut plan = Plan {
        hints_populated: inputs.hints_populated,
        ..Plan::default()
    };
    let mut by_type: BTreeMap<&str, Vec<&EndpointSlice>> = BTreeMap::new();
    let mut foreign_type: Vec<String> = Vec::new();
    for slice in inputs.slices {
        match types.get(slice.address_type.as_str()) {
            Some(t) => by_type.entry(t).or_default().push(slice),
            None => foreign_type.push(slice.metadata.name.clone().unwrap_or_default()),
        }
    }
    // A family dropped forgets the Service's hints, as kube-controller-manager forgets them.
    if !foreign_type.is_empty() {
        plan.hints_populated = false;
    }
    for address_type in &types {
        let existing = by_type.remove(address_type).unwrap_or_default();
        let mut part = by_address_type(inputs, &existing, address_type, plan.hints_populated);
        plan.create.append(&mut part.create);
        plan.update.append(&mut part.update);
        plan.delete.append(&mut part.delete);
        plan.skipped.append(&mut part.skipped);
        plan.events.append(&mut part.events);
        plan.hints_populated = part.hints_populated;
    }
    plan.delete.extend(foreign_type);
    plan.skipped.dedup();
    plan
}

/// Desired endpoints, by key, in key order.
type EndpointSet = BTreeMap<EndpointKey, Endpoint>;

fn by_address_type(
    inputs: &Inputs<'_>,
    existing: &[&EndpointSlice],
    address_type: &str,
    hints_populated: bool,
) -> Plan {
    let service = inputs.service;
    let publish_not_ready = service
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let mut plan = Plan::default();
    let mut to_delete: Vec<EndpointSlice> = Vec::new();

    // Existing slices by port set; those not owned by the Service go.
    let mut existing_by_ports: BTreeMap<PortsKey, Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in existing {
        if owned_by(slice, service) {
            existing_by_ports
                .entry(ports_key(slice.ports.as_deref().unwrap_or_default()))
                .or_default()
                .push(slice);
        } else {
            to_delete.push((*slice).clone());
        }
    }

    // Desired endpoints by port set.
    let mut desired: BTreeMap<PortsKey, (Vec<EndpointPort>, EndpointSet)> = BTreeMap::new();
    for pod in inputs.pods {
        if !should_be_in_endpoints(pod) {
            continue;
        }
        let ports = endpoint_ports(service, pod);
        let entry = desired
            .entry(ports_key(&ports))
            .or_insert_with(|| (ports.clone(), EndpointSet::new()));
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let zone = match (inputs.node)(&node) {
            NodeInfo::Zone(zone) => zone,
            NodeInfo::Missing => {
                if !publish_not_ready {
                    plan.skipped.push(SkippedPod {
                        pod: pod.metadata.name.clone().unwrap_or_default(),
                        node,
                    });
                    continue;
                }
                None
            }
        };
        let endpoint = pod_endpoint(pod, zone.as_deref(), service, address_type);
        if !endpoint.addresses.is_empty() {
            entry.1.insert(endpoint_key(&endpoint), endpoint);
        }
    }

    let mut create: Vec<EndpointSlice> = Vec::new();
    let mut update: Vec<EndpointSlice> = Vec::new();
    let mut unchanged: Vec<EndpointSlice> = Vec::new();
    for (key, (ports, wanted)) in desired.iter_mut() {
        let slices = existing_by_ports
            .get(key)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let part = by_ports(
            service,
            slices,
            wanted,
            ports,
            address_type,
            inputs.max_per_slice,
        );
        create.extend(part.create);
        update.extend(part.update);
        to_delete.extend(part.delete);
        unchanged.extend(part.unchanged);
    }
    for (key, slices) in &existing_by_ports {
        if !desired.contains_key(key) {
            to_delete.extend(slices.iter().map(|s| (*s).clone()));
        }
    }

    // No endpoint at all: one placeholder slice, so that readers tell "no endpoints" from
    // "not reconciled yet".
    if existing.len() == to_delete.len() && create.is_empty() {
        let placeholder = new_slice(service, &[], address_type);
        if to_delete.len() == 1 && is_placeholder(&to_delete[0], &placeholder) {
            to_delete.clear();
        } else {
            create.push(placeholder);
        }
    }

    // Hints, on what is written anyway and on unchanged slices that carry the wrong ones.
    let hints = hints_of(service);
    if hints == Hints::Auto {
        let slices = topology::Slices {
            create: &mut create,
            update: &mut update,
            unchanged: &mut unchanged,
        };
        let allotted =
            topology::add_hints(inputs.zone_ratios, slices, address_type, hints_populated);
        plan.hints_populated = allotted.populated;
        plan.events = allotted.events;
    } else {
        if hints_populated {
            plan.events.push(topology::disabled_event(address_type));
        }
        for slice in unchanged {
            if needs_hints_update(&slice, hints) {
                update.push(slice);
            }
        }
        for slice in create.iter_mut().chain(update.iter_mut()) {
            apply_hints(slice, hints);
        }
    }

    // A slice to delete and one to create of the same type: the deleted one is overwritten
    // instead (`finalize`), one write fewer.
    let mut i = 0;
    while i < to_delete.len() && !create.is_empty() {
        if to_delete[i].address_type == address_type && owned_by(&to_delete[i], service) {
            let old = to_delete.remove(i);
            let mut slice = create.pop().expect("checked non-empty");
            slice.metadata.name = old.metadata.name.clone();
            slice.metadata.generate_name = None;
            slice.metadata.resource_version = old.metadata.resource_version;
            update.push(slice);
        } else {
            i += 1;
        }
    }

    if service.metadata.deletion_timestamp.is_some() {
        create.clear();
    }
    for slice in create.iter_mut().chain(update.iter_mut()) {
        set_trigger_time(slice, inputs.trigger_time);
    }
    plan.create = create;
    plan.update = update;
    plan.delete = to_delete
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    plan
}

fn set_trigger_time(slice: &mut EndpointSlice, time: Option<Timestamp>) {
    let annotations = slice.metadata.annotations.get_or_insert_with(BTreeMap::new);
    match time {
        Some(time) => {
            annotations.insert(TRIGGER_TIME_ANNOTATION.to_owned(), time.to_string());
        }
        None => {
            annotations.remove(TRIGGER_TIME_ANNOTATION);
        }
    }
    if annotations.is_empty() {
        slice.metadata.annotations = None;
    }
}

/// The writes for one port set.
struct PortsPlan {
    create: Vec<EndpointSlice>,
    update: Vec<EndpointSlice>,
    delete: Vec<EndpointSlice>,
    unchanged: Vec<EndpointSlice>,
}

/// `reconcileByPortMapping`: keep each desired endpoint in the slice that has it, then put
/// the new ones where they cost the fewest writes.
fn by_ports(
    service: &Service,
    existing: &[&EndpointSlice],
    wanted: &mut EndpointSet,
    ports: &[EndpointPort],
    address_type: &str,
    max: usize,
) -> PortsPlan {
    let max = max.max(1);
    let mut slices: BTreeMap<String, EndpointSlice> = BTreeMap::new();
    let mut unchanged: BTreeSet<String> = BTreeSet::new();
    let mut to_update: BTreeSet<String> = BTreeSet::new();
    let mut to_delete: BTreeSet<String> = BTreeSet::new();

    for slice in existing {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let mut kept: Vec<Endpoint> = Vec::new();
        let mut changed = false;
        for endpoint in &slice.endpoints {
            if let Some(want) = wanted.remove(&endpoint_key(endpoint)) {
                if !same_beyond_key(&want, endpoint) {
                    changed = true;
                }
                kept.push(want);
            }
        }
        let (labels, labels_changed) = slice_labels(slice.metadata.labels.as_ref(), service);
        if changed || kept.len() != slice.endpoints.len() {
            if kept.is_empty() {
                to_delete.insert(name.clone());
                slices.insert(name, (*slice).clone());
            } else {
                let mut copy = (*slice).clone();
                copy.endpoints = kept;
                copy.metadata.labels = Some(labels);
                slices.insert(name.clone(), copy);
                to_update.insert(name);
            }
        } else if labels_changed {
            let mut copy = (*slice).clone();
            copy.metadata.labels = Some(labels);
            slices.insert(name.clone(), copy);
            to_update.insert(name);
        } else {
            slices.insert(name.clone(), (*slice).clone());
            unchanged.insert(name);
        }
    }

    // New endpoints first into the slices being written anyway, fullest first.
    if !wanted.is_empty() && !to_update.is_empty() {
        let mut order: Vec<&String> = to_update.iter().collect();
        order.sort_by_key(|name| std::cmp::Reverse(slices[*name].endpoints.len()));
        let order: Vec<String> = order.into_iter().cloned().collect();
        for name in order {
            let slice = slices.get_mut(&name).expect("listed");
            while slice.endpoints.len() < max {
                let Some((_, endpoint)) = wanted.pop_first() else {
                    break;
                };
                slice.endpoints.push(endpoint);
            }
        }
    }

    // Then into an unchanged slice that the rest fills closest to the limit, or new ones.
    let mut create: Vec<EndpointSlice> = Vec::new();
    while !wanted.is_empty() {
        let fill = if wanted.len() < max {
            slice_to_fill(unchanged.iter().map(|n| &slices[n]), wanted.len(), max)
        } else {
            None
        };
        match fill {
            Some(name) => {
                let slice = slices.get_mut(&name).expect("listed");
                while slice.endpoints.len() < max {
                    let Some((_, endpoint)) = wanted.pop_first() else {
                        break;
                    };
                    slice.endpoints.push(endpoint);
                }
                unchanged.remove(&name);
                to_update.insert(name);
            }
            None => {
                let mut slice = new_slice(service, ports, address_type);
                while slice.endpoints.len() < max {
                    let Some((_, endpoint)) = wanted.pop_first() else {
                        break;
                    };
                    slice.endpoints.push(endpoint);
                }
                create.push(slice);
            }
        }
    }

    let mut take = |names: &BTreeSet<String>| -> Vec<EndpointSlice> {
        names.iter().filter_map(|n| slices.remove(n)).collect()
    };
    PortsPlan {
        create,
        update: take(&to_update),
        delete: take(&to_delete),
        unchanged: take(&unchanged),
    }
}

/// The unchanged slice that `count` more endpoints fill closest to `max` without going
/// over (`getSliceToFill`).
fn slice_to_fill<'a>(
    slices: impl Iterator<Item = &'a EndpointSlice>,
    count: usize,
    max: usize,
) -> Option<String> {
    let mut best: Option<(usize, &EndpointSlice)> = None;
    for slice in slices {
        let Some(room) = max.checked_sub(count + slice.endpoints.len()) else {
            continue;
        };
        if best.is_none_or(|(closest, _)| room < closest) {
            best = Some((room, slice));
            if room == 0 {
                break;
            }
        }
    }
    best.and_then(|(_, s)| s.metadata.name.clone())
}
