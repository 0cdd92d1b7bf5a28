//! The Endpoints controller's decisions, as kube-controller-manager's `endpoints-controller`
//! (`pkg/controller/endpoint`) makes them: the legacy `v1/Endpoints` of a selector-based
//! Service, which older proxies, DNS servers and tools still read.
//!
//! ```text
//!  Service gone ─► its Endpoints deleted (unless a leader-election record)
//!  Service (not ExternalName, with a selector)
//!     Pods the selector matches, not terminal, with an IP, not terminating (unless
//!     publishNotReadyAddresses) ─► one address each, of the Service's first IP family
//!        ─► per Service port that resolves on the Pod: ready or not ready
//!     ─► repacked: one subset per group of ports with the same addresses
//!     ─► more than 1,000 addresses: truncated (ready ones first, each subset in
//!        proportion) and annotated `endpoints.kubernetes.io/over-capacity: truncated`
//!  the Endpoints written only when its subsets, labels or capacity annotation differ
//! ```

use std::{
    borrow::Borrow,
    collections::{BTreeMap, BTreeSet},
};

use k8s_openapi::{
    api::core::v1::{
        EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Pod, Service,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    jiff::Timestamp,
};

use crate::endpointslice::{HEADLESS_LABEL, TRIGGER_TIME_ANNOTATION, find_port};
use crate::replicaset::is_ready;

/// The label marking Endpoints this controller manages (`LabelManagedBy`).
pub const MANAGED_BY_LABEL: &str = "endpoints.kubernetes.io/managed-by";
/// This controller's value of [`MANAGED_BY_LABEL`], kube-controller-manager's own.
pub const CONTROLLER_NAME: &str = "endpoint-controller";
/// Set to `truncated` on Endpoints cut down to [`MAX_CAPACITY`] addresses.
pub const OVER_CAPACITY_ANNOTATION: &str = "endpoints.kubernetes.io/over-capacity";
pub const TRUNCATED: &str = "truncated";
/// The most addresses one Endpoints object carries (`maxCapacity`).
pub const MAX_CAPACITY: usize = 1000;
/// Endpoints holding a leader-election record (of components that still elect through
/// Endpoints) are no Service's, and never deleted.
pub const LEADER_ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";

/// What one reconcile of a Service does to its Endpoints.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Nothing: the Endpoints are right, or the Service is not this controller's.
    Nothing,
    /// Delete the Endpoints of the Service's name: the Service is gone.
    Delete,
    /// Create (no resourceVersion) or update (at the read resourceVersion) these Endpoints.
    Write(Box<Endpoints>),
}

/// Whether a Pod's address belongs in the Endpoints (`ShouldPodBeInEndpoints` with
/// terminating Pods only when not-ready addresses are published).
fn belongs(pod: &Pod, publish_not_ready: bool) -> bool {
    crate::endpointslice::should_be_in_endpoints(pod)
        && (publish_not_ready || pod.metadata.deletion_timestamp.is_none())
}

fn publishes_not_ready(service: &Service) -> bool {
    service
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false)
}

fn is_headless(service: &Service) -> bool {
    let ip = service.spec.as_ref().and_then(|s| s.cluster_ip.as_deref());
    matches!(ip, None | Some("" | "None"))
}

/// The Pod's address for the Service (`podToEndpointAddressForService`): its first IP of
/// the Service's first family. `None` when it has none.
fn address(service: &Service, pod: &Pod) -> Option<EndpointAddress> {
    let want_v6 = service
        .spec
        .as_ref()
        .and_then(|s| s.ip_families.as_ref())
        .and_then(|f| f.first())
        .is_some_and(|f| f == "IPv6");
    let ip = pod
        .status
        .as_ref()?
        .pod_ips
        .iter()
        .flatten()
        .filter_map(|ip| ip.ip.parse::<std::net::IpAddr>().ok())
        .find(|ip| ip.is_ipv6() == want_v6)?;
    let spec = pod.spec.as_ref();
    let hostname = spec
        .and_then(|s| s.hostname.as_deref())
        .filter(|h| !h.is_empty())
        .filter(|_| {
            spec.and_then(|s| s.subdomain.as_deref()) == service.metadata.name.as_deref()
                && pod.metadata.namespace == service.metadata.namespace
        })
        .map(str::to_owned);
    Some(EndpointAddress {
        ip: ip.to_string(),
        hostname,
        node_name: Some(spec.and_then(|s| s.node_name.clone()).unwrap_or_default()),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".to_owned()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..ObjectReference::default()
        }),
    })
}

/// The subsets the Pods give the Service, repacked.
pub fn subsets(service: &Service, pods: &[impl Borrow<Pod>]) -> Vec<EndpointSubset> {
    let publish = publishes_not_ready(service);
    let ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default();
    let mut raw: Vec<EndpointSubset> = Vec::new();
    for pod in pods {
        let pod = pod.borrow();
        if !belongs(pod, publish) {
            continue;
        }
        let Some(address) = address(service, pod) else {
            continue;
        };
        let ready = publish || is_ready(pod);
        let subset = |port: Option<EndpointPort>| {
            let (addresses, not_ready) = if ready {
                (Some(vec![address.clone()]), None)
            } else {
                (None, Some(vec![address.clone()]))
            };
            EndpointSubset {
                addresses,
                not_ready_addresses: not_ready,
                ports: port.map(|p| vec![p]),
            }
        };
        if ports.is_empty() {
            if is_headless(service) {
                raw.push(subset(None));
            }
            continue;
        }
        for port in ports {
            let Some(number) = find_port(pod, port) else {
                continue;
            };
            raw.push(subset(Some(EndpointPort {
                name: Some(port.name.clone().unwrap_or_default()).filter(|n| !n.is_empty()),
                port: number,
                protocol: Some(port.protocol.clone().unwrap_or_else(|| "TCP".to_owned())),
                app_protocol: port.app_protocol.clone(),
            })));
        }
    }
    repack(&raw)
}

/// An address as repacking tells them apart: IP and the UID of the object behind it.
type AddressKey = (String, Option<String>);

fn address_key(a: &EndpointAddress) -> AddressKey {
    (
        a.ip.clone(),
        a.target_ref.as_ref().and_then(|t| t.uid.clone()),
    )
}

/// A port as a map key; `None` stands for "no port" (a headless Service without ports).
type PortKey = Option<(Option<String>, i32, Option<String>, Option<String>)>;

fn port_key(port: &EndpointPort) -> PortKey {
    Some((
        port.name.clone().filter(|n| !n.is_empty()),
        port.port,
        port.protocol.clone(),
        port.app_protocol.clone(),
    ))
}

/// Subsets regrouped so that each holds the ports that share exactly the same addresses
/// and readiness (`RepackSubsets`); an address ready on one occasion and not on another for
/// the same port counts as not ready. Addresses sorted by IP then UID, ports and subsets in
/// a canonical order.
pub fn repack(subsets: &[EndpointSubset]) -> Vec<EndpointSubset> {
    let mut first_seen: BTreeMap<AddressKey, EndpointAddress> = BTreeMap::new();
    let mut by_port: BTreeMap<PortKey, BTreeMap<AddressKey, bool>> = BTreeMap::new();
    for subset in subsets {
        let ports: Vec<PortKey> = match subset.ports.as_deref() {
            None | Some([]) => vec![None],
            Some(ports) => ports.iter().map(port_key).collect(),
        };
        let addresses = subset.addresses.iter().flatten().map(|a| (a, true)).chain(
            subset
                .not_ready_addresses
                .iter()
                .flatten()
                .map(|a| (a, false)),
        );
        let addresses: Vec<(&EndpointAddress, bool)> = addresses.collect();
        for port in &ports {
            for (address, ready) in &addresses {
                let key = address_key(address);
                first_seen
                    .entry(key.clone())
                    .or_insert_with(|| (*address).clone());
                let set = by_port.entry(port.clone()).or_default();
                let was = set.entry(key).or_insert(*ready);
                *was = *was && *ready;
            }
        }
    }
    // Ports with identical address sets share a subset.
    let mut groups: BTreeMap<Vec<(AddressKey, bool)>, Vec<PortKey>> = BTreeMap::new();
    for (port, addresses) in by_port {
        let set: Vec<(AddressKey, bool)> = addresses.into_iter().collect();
        groups.entry(set).or_default().push(port);
    }
    let mut out: Vec<EndpointSubset> = groups
        .into_iter()
        .map(|(addresses, ports)| {
            let mut ready: Vec<EndpointAddress> = Vec::new();
            let mut not_ready: Vec<EndpointAddress> = Vec::new();
            for (key, is_ready) in addresses {
                let address = first_seen[&key].clone();
                if is_ready {
                    ready.push(address);
                } else {
                    not_ready.push(address);
                }
            }
            let ports: Vec<EndpointPort> = ports
                .into_iter()
                .flatten()
                .map(|(name, port, protocol, app_protocol)| EndpointPort {
                    name,
                    port,
                    protocol,
                    app_protocol,
                })
                .collect();
            EndpointSubset {
                addresses: (!ready.is_empty()).then_some(ready),
                not_ready_addresses: (!not_ready.is_empty()).then_some(not_ready),
                ports: (!ports.is_empty()).then_some(ports),
            }
        })
        .collect();
    out.sort_by_key(subset_order);
    out
}

/// The order subsets are listed in: by their ports, then their addresses.
fn subset_order(subset: &EndpointSubset) -> (Vec<PortKey>, Vec<AddressKey>) {
    (
        subset.ports.iter().flatten().map(port_key).collect(),
        subset
            .addresses
            .iter()
            .flatten()
            .chain(subset.not_ready_addresses.iter().flatten())
            .map(address_key)
            .collect(),
    )
}

/// Subsets as compared: empty lists and absent ones alike, target resourceVersions aside.
fn normalized(subsets: &[EndpointSubset]) -> Vec<EndpointSubset> {
    let address = |a: &EndpointAddress| {
        let mut a = a.clone();
        if let Some(t) = a.target_ref.as_mut() {
            t.resource_version = None;
        }
        a
    };
    let list = |l: &Option<Vec<EndpointAddress>>| {
        l.as_ref()
            .filter(|l| !l.is_empty())
            .map(|l| l.iter().map(address).collect())
    };
    subsets
        .iter()
        .map(|s| EndpointSubset {
            addresses: list(&s.addresses),
            not_ready_addresses: list(&s.not_ready_addresses),
            ports: s.ports.clone().filter(|p| !p.is_empty()),
        })
        .collect()
}

/// Whether the Endpoints' labels are the Service's own plus this controller's
/// (`labelsCorrectForEndpoints`).
fn labels_correct(
    endpoints: &BTreeMap<String, String>,
    service: &BTreeMap<String, String>,
) -> bool {
    if endpoints.get(MANAGED_BY_LABEL).map(String::as_str) != Some(CONTROLLER_NAME) {
        return false;
    }
    let own: BTreeMap<&String, &String> = endpoints
        .iter()
        .filter(|(k, _)| k.as_str() != HEADLESS_LABEL && k.as_str() != MANAGED_BY_LABEL)
        .collect();
    own == service.iter().collect::<BTreeMap<_, _>>()
}

fn count(subsets: &[EndpointSubset]) -> (usize, usize) {
    subsets.iter().fold((0, 0), |(r, n), s| {
        (
            r + s.addresses.as_ref().map_or(0, Vec::len),
            n + s.not_ready_addresses.as_ref().map_or(0, Vec::len),
        )
    })
}

/// Whether the capacity annotation is as it should be (`capacityAnnotationSetCorrectly`):
/// absent, over no more than the capacity.
fn capacity_correct(
    annotations: Option<&BTreeMap<String, String>>,
    subsets: &[EndpointSubset],
) -> bool {
    let (ready, not_ready) = count(subsets);
    ready + not_ready <= MAX_CAPACITY
        && !annotations.is_some_and(|a| a.contains_key(OVER_CAPACITY_ANNOTATION))
}

/// Cuts the subsets down to [`MAX_CAPACITY`] addresses (`truncateEndpoints`): not-ready ones
/// go first; each subset keeps its share, rounded up, while room remains. Whether it cut.
pub fn truncate(subsets: &mut [EndpointSubset]) -> bool {
    let (ready, not_ready) = count(subsets);
    if ready + not_ready <= MAX_CAPACITY {
        return false;
    }
    let truncate_ready = ready > MAX_CAPACITY;
    let (max, total) = if truncate_ready {
        (MAX_CAPACITY, ready)
    } else {
        (MAX_CAPACITY - ready, not_ready)
    };
    let mut room = max;
    for subset in subsets.iter_mut() {
        let list = if truncate_ready {
            &mut subset.addresses
        } else {
            &mut subset.not_ready_addresses
        };
        let here = list.as_ref().map_or(0, Vec::len);
        let share = (here * max).div_ceil(total).min(room);
        if let Some(list) = list.as_mut() {
            list.truncate(share);
        }
        room -= list.as_ref().map_or(0, Vec::len);
        if truncate_ready {
            subset.not_ready_addresses = None;
        }
    }
    true
}

/// One reconcile of the Service `name`: `service` as cached (`None`: gone), the Pods its
/// selector matches, its Endpoints as cached, and the trigger time to write.
pub fn sync(
    service: Option<&Service>,
    pods: &[impl Borrow<Pod>],
    current: Option<&Endpoints>,
    trigger_time: Option<Timestamp>,
) -> Decision {
    let Some(service) = service else {
        let leader = current
            .and_then(|e| e.metadata.annotations.as_ref())
            .is_some_and(|a| a.contains_key(LEADER_ANNOTATION));
        return if current.is_some() && !leader {
            Decision::Delete
        } else {
            Decision::Nothing
        };
    };
    if !crate::endpointslice::manages(service) {
        return Decision::Nothing;
    }
    let desired = subsets(service, pods);
    let service_labels = service.metadata.labels.clone().unwrap_or_default();
    if let Some(current) = current {
        let now = normalized(current.subsets.as_deref().unwrap_or_default());
        let same = now == normalized(&desired)
            || normalized(&repack(current.subsets.as_deref().unwrap_or_default()))
                == normalized(&desired);
        if same
            && labels_correct(
                current.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
                &service_labels,
            )
            && capacity_correct(
                current.metadata.annotations.as_ref(),
                current.subsets.as_deref().unwrap_or_default(),
            )
        {
            return Decision::Nothing;
        }
    }
    let mut endpoints = current.cloned().unwrap_or_else(|| Endpoints {
        metadata: ObjectMeta {
            name: service.metadata.name.clone(),
            namespace: service.metadata.namespace.clone(),
            ..ObjectMeta::default()
        },
        ..Endpoints::default()
    });
    let mut subsets = desired;
    let truncated = truncate(&mut subsets);
    endpoints.subsets = (!subsets.is_empty()).then_some(subsets);
    let annotations = endpoints
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new);
    match trigger_time {
        Some(time) => {
            annotations.insert(TRIGGER_TIME_ANNOTATION.to_owned(), time.to_string());
        }
        None => {
            annotations.remove(TRIGGER_TIME_ANNOTATION);
        }
    }
    if truncated {
        annotations.insert(OVER_CAPACITY_ANNOTATION.to_owned(), TRUNCATED.to_owned());
    } else {
        annotations.remove(OVER_CAPACITY_ANNOTATION);
    }
    if annotations.is_empty() {
        endpoints.metadata.annotations = None;
    }
    let mut labels = service_labels;
    if is_headless(service) {
        labels.insert(HEADLESS_LABEL.to_owned(), String::new());
    } else {
        labels.remove(HEADLESS_LABEL);
    }
    labels.insert(MANAGED_BY_LABEL.to_owned(), CONTROLLER_NAME.to_owned());
    endpoints.metadata.labels = Some(labels);
    Decision::Write(Box::new(endpoints))
}

/// The trigger time the Endpoints written now carry: the Service's creation when none were
/// written with one, then the earliest Ready change of a Pod newer than the one written.
pub fn trigger_time(
    service: &Service,
    pods: &[impl Borrow<Pod>],
    current: Option<&Endpoints>,
) -> Option<Timestamp> {
    crate::endpointslice::trigger_time_after(
        service,
        pods,
        current
            .and_then(|e| e.metadata.annotations.as_ref())
            .and_then(|a| a.get(TRIGGER_TIME_ANNOTATION)),
    )
}

/// The addresses of the Endpoints, by the Pod behind each: ready or not. For tests and
/// comparisons.
pub fn addresses_by_pod(endpoints: &Endpoints) -> BTreeSet<(String, bool)> {
    endpoints
        .subsets
        .iter()
        .flatten()
        .flat_map(|s| {
            let ready = s.addresses.iter().flatten().map(|a| (a, true));
            let not_ready = s.not_ready_addresses.iter().flatten().map(|a| (a, false));
            ready.chain(not_ready)
        })
        .map(|(a, ready)| {
            (
                a.target_ref
                    .as_ref()
                    .and_then(|t| t.name.clone())
                    .unwrap_or_else(|| a.ip.clone()),
                ready,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests;
