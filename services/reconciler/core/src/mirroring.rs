//! The EndpointSlice mirroring controller's decisions, as kube-controller-manager's
//! `endpointslice-mirroring-controller` makes them: the Endpoints a user writes by hand for a
//! Service without a selector, mirrored into EndpointSlices so that readers of slices alone
//! see them.
//!
//! ```text
//!  Endpoints, their Service without a selector, no skip-mirror label, no leader record
//!     ─► subsets repacked; per subset at most 1,000 addresses (ready first), each an
//!        endpoint of its family (an address that is no IP skipped)
//!     ─► one slice per address type and port set: the first kept (rewritten only when its
//!        endpoints, labels or annotations differ), the others deleted
//!     ─► a slice to delete and one to create of the same type: the deleted one reused
//!  otherwise (Endpoints or Service gone, a selector, skip-mirror) ─► every mirrored slice
//!  deleted
//! ```

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    api::{
        core::v1::{EndpointAddress, Endpoints, Service},
        discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice},
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};

use crate::endpoints::{LEADER_ANNOTATION, repack};
use crate::endpointslice::{
    EndpointKey, IPV4, IPV6, MANAGED_BY_LABEL, PortsKey, SERVICE_NAME_LABEL,
    TRIGGER_TIME_ANNOTATION, endpoint_key, ports_key, same_beyond_key,
};

/// This controller's value of the managed-by label, kube-controller-manager's own.
pub const CONTROLLER_NAME: &str = "endpointslicemirroring-controller.k8s.io";
/// `"true"` on Endpoints that must not be mirrored (`discovery.LabelSkipMirror`).
pub const SKIP_MIRROR_LABEL: &str = "endpointslice.kubernetes.io/skip-mirror";
/// `kubectl apply`'s record, never copied onto a slice.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// kube-controller-manager's `--mirroring-max-endpoints-per-subset` default.
pub const DEFAULT_MAX_ENDPOINTS_PER_SUBSET: usize = 1000;
/// Event reasons.
pub const INVALID_IP_ADDRESS: &str = "InvalidIPAddress";
pub const TOO_MANY_ADDRESSES: &str = "TooManyAddressesToMirror";

/// What one reconcile writes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub create: Vec<EndpointSlice>,
    pub update: Vec<EndpointSlice>,
    /// Slices to delete, by name.
    pub delete: Vec<String>,
    /// Addresses that are no IP, left out.
    pub invalid: usize,
    /// Addresses past the limit per subset, left out (invalid ones included).
    pub skipped: usize,
}

/// Whether these Endpoints are mirrored (`shouldMirror`, and a Service without a selector).
pub fn should_mirror(endpoints: Option<&Endpoints>, service: Option<&Service>) -> bool {
    let Some(endpoints) = endpoints else {
        return false;
    };
    let skip = endpoints
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SKIP_MIRROR_LABEL))
        .is_some_and(|v| v == "true");
    let leader = endpoints
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(LEADER_ANNOTATION));
    let selectorless = service.is_some_and(|s| {
        s.spec
            .as_ref()
            .and_then(|spec| spec.selector.as_ref())
            .is_none_or(BTreeMap::is_empty)
    });
    !skip && !leader && selectorless
}

/// An Endpoints address as a slice's endpoint (`addressToEndpoint`), with its type; `None`
/// for an address that is no IP.
fn endpoint(address: &EndpointAddress, ready: bool) -> Option<(Endpoint, &'static str)> {
    let ip: std::net::IpAddr = address.ip.parse().ok()?;
    let address_type = if ip.is_ipv4() { IPV4 } else { IPV6 };
    Some((
        Endpoint {
            addresses: vec![ip.to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                ..EndpointConditions::default()
            }),
            target_ref: address.target_ref.clone(),
            node_name: address.node_name.clone(),
            hostname: address.hostname.clone().filter(|h| !h.is_empty()),
            ..Endpoint::default()
        },
        address_type,
    ))
}

/// The labels a mirrored slice carries: the Endpoints' own, the Service's name and this
/// controller's.
fn labels(endpoints: &Endpoints) -> BTreeMap<String, String> {
    let mut labels = endpoints.metadata.labels.clone().unwrap_or_default();
    labels.insert(
        SERVICE_NAME_LABEL.to_owned(),
        endpoints.metadata.name.clone().unwrap_or_default(),
    );
    labels.insert(MANAGED_BY_LABEL.to_owned(), CONTROLLER_NAME.to_owned());
    labels
}

/// The annotations a mirrored slice carries: the Endpoints' own but the trigger time and
/// `kubectl apply`'s record.
fn annotations(endpoints: &Endpoints) -> BTreeMap<String, String> {
    let mut annotations = endpoints.metadata.annotations.clone().unwrap_or_default();
    annotations.remove(TRIGGER_TIME_ANNOTATION);
    annotations.remove(LAST_APPLIED_ANNOTATION);
    annotations
}

fn new_slice(
    endpoints: &Endpoints,
    ports: &[EndpointPort],
    address_type: &str,
    name: Option<String>,
) -> EndpointSlice {
    let annotations = annotations(endpoints);
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: name.is_none().then(|| {
                format!(
                    "{}-",
                    endpoints.metadata.name.as_deref().unwrap_or_default()
                )
            }),
            name,
            namespace: endpoints.metadata.namespace.clone(),
            labels: Some(labels(endpoints)),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Endpoints".to_owned(),
                name: endpoints.metadata.name.clone().unwrap_or_default(),
                uid: endpoints.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        address_type: address_type.to_owned(),
        ports: Some(ports.to_vec()),
        endpoints: Vec::new(),
    }
}

/// Whether the slice stands as it should (`totalChanges` all zero, same labels and
/// annotations, owned by these Endpoints and not a former object of their name).
fn unchanged(
    slice: &EndpointSlice,
    endpoints: &Endpoints,
    wanted: &BTreeMap<EndpointKey, Endpoint>,
) -> bool {
    let mut matched = 0;
    for endpoint in &slice.endpoints {
        match wanted.get(&endpoint_key(endpoint)) {
            None => return false,
            Some(want) if !same_beyond_key(want, endpoint) => return false,
            Some(_) => matched += 1,
        }
    }
    let mut own = slice.metadata.labels.clone().unwrap_or_default();
    own.remove(MANAGED_BY_LABEL);
    own.remove(SERVICE_NAME_LABEL);
    let stale_owner = slice.metadata.owner_references.iter().flatten().any(|o| {
        o.kind == "Endpoints"
            && Some(&o.name) == endpoints.metadata.name.as_ref()
            && Some(&o.uid) != endpoints.metadata.uid.as_ref()
    });
    matched == wanted.len()
        && own == endpoints.metadata.labels.clone().unwrap_or_default()
        && slice.metadata.annotations.clone().unwrap_or_default() == annotations(endpoints)
        && !stale_owner
}

/// One reconcile of mirrored Endpoints (`reconcile`): `slices` are those it mirrored before
/// (being deleted left out), `max_per_subset` `--mirroring-max-endpoints-per-subset`.
pub fn reconcile(endpoints: &Endpoints, slices: &[EndpointSlice], max_per_subset: usize) -> Plan {
    let mut plan = Plan::default();
    // Per address type and port set: the ports and the endpoints.
    type Desired =
        BTreeMap<(&'static str, PortsKey), (Vec<EndpointPort>, BTreeMap<EndpointKey, Endpoint>)>;
    let mut desired: Desired = BTreeMap::new();
    for subset in repack(endpoints.subsets.as_deref().unwrap_or_default()) {
        let ports: Vec<EndpointPort> = subset
            .ports
            .iter()
            .flatten()
            .map(|p| EndpointPort {
                name: Some(p.name.clone().unwrap_or_default()),
                port: Some(p.port),
                protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".to_owned())),
                app_protocol: p.app_protocol.clone(),
            })
            .collect();
        for address_type in [IPV4, IPV6] {
            desired
                .entry((address_type, ports_key(&ports)))
                .or_insert_with(|| (ports.clone(), BTreeMap::new()));
        }
        let addresses = subset.addresses.iter().flatten().map(|a| (a, true)).chain(
            subset
                .not_ready_addresses
                .iter()
                .flatten()
                .map(|a| (a, false)),
        );
        let mut added = 0;
        let mut total = 0;
        for (address, ready) in addresses {
            total += 1;
            if added >= max_per_subset {
                continue;
            }
            match endpoint(address, ready) {
                Some((endpoint, address_type)) => {
                    desired
                        .get_mut(&(address_type, ports_key(&ports)))
                        .expect("made above")
                        .1
                        .insert(endpoint_key(&endpoint), endpoint);
                    added += 1;
                }
                None => plan.invalid += 1,
            }
        }
        plan.skipped += total - added;
    }

    let mut existing: BTreeMap<(&'static str, PortsKey), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices {
        let address_type = if slice.address_type == IPV6 {
            IPV6
        } else {
            IPV4
        };
        existing
            .entry((
                address_type,
                ports_key(slice.ports.as_deref().unwrap_or_default()),
            ))
            .or_default()
            .push(slice);
    }
    for list in existing.values_mut() {
        list.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    }

    let mut to_delete: Vec<&EndpointSlice> = Vec::new();
    for (key, (ports, wanted)) in &desired {
        let have = existing.remove(key).unwrap_or_default();
        if wanted.is_empty() {
            to_delete.extend(have);
            continue;
        }
        let keep = have.first().copied();
        to_delete.extend(have.iter().skip(1));
        if keep.is_some_and(|slice| unchanged(slice, endpoints, wanted)) {
            continue;
        }
        let mut slice = new_slice(
            endpoints,
            ports,
            key.0,
            keep.and_then(|s| s.metadata.name.clone()),
        );
        if let Some(keep) = keep {
            slice.metadata.resource_version = keep.metadata.resource_version.clone();
        }
        slice.endpoints = wanted.values().take(max_per_subset).cloned().collect();
        if keep.is_some() {
            plan.update.push(slice);
        } else {
            plan.create.push(slice);
        }
    }
    to_delete.extend(existing.into_values().flatten());

    // A slice to create takes the name of one to delete of its type (`recycleSlices`).
    let mut deleting: Vec<&EndpointSlice> = to_delete;
    let mut creating = std::mem::take(&mut plan.create);
    let mut kept: Vec<EndpointSlice> = Vec::new();
    for mut slice in creating.drain(..) {
        match deleting
            .iter()
            .position(|d| d.address_type == slice.address_type)
        {
            Some(i) => {
                let old = deleting.remove(i);
                slice.metadata.name = old.metadata.name.clone();
                slice.metadata.generate_name = None;
                slice.metadata.resource_version = old.metadata.resource_version.clone();
                plan.update.push(slice);
            }
            None => kept.push(slice),
        }
    }
    plan.create = if endpoints.metadata.deletion_timestamp.is_some() {
        Vec::new()
    } else {
        kept
    };
    plan.delete = deleting
        .into_iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    plan
}

#[cfg(test)]
mod tests;
