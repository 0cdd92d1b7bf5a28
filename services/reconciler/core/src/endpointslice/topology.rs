//! Topology-aware hints (`service.kubernetes.io/topology-mode: Auto`), allotted as
//! kube-controller-manager's `topologycache` allots them: each zone gets a share of a
//! Service's ready endpoints in proportion to the allocatable CPU of its ready Nodes.
//!
//! ```text
//!  Nodes (ready, not control-plane) ─► allocatable CPU per zone; a Node without a zone or
//!     CPU, or fewer than two zones ─► no ratios: hints removed, a warning Event
//!  per address type, n ready endpoints:
//!     fewer than one per zone, or each zone's minimum (its share / 1.2, rounded up) over n
//!        ─► hints removed, a warning Event
//!     unchanged slices whose hints still fit each zone's maximum: kept; others rewritten
//!     each ready endpoint of a slice being written: hinted for its own zone (one without a
//!        zone ─► hints removed, a warning Event)
//!     zones over their share give endpoints (hinted for another zone) to zones under it
//!     first time hints are on ─► TopologyAwareHintsEnabled
//! ```
//!
//! Where kube-controller-manager walks a Go map (which zone gives to which first, among
//! zones as far from their share), this walks zones in name order.

use std::collections::BTreeMap;

use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::{EndpointHints, EndpointSlice, ForZone},
};

use super::{ZONE_LABEL, endpoint_ready};
use crate::event::Event;

/// The annotation that turns topology-aware hints on (`v1.AnnotationTopologyMode`).
pub const TOPOLOGY_MODE_ANNOTATION: &str = "service.kubernetes.io/topology-mode";
/// Its deprecated name, which wins when both are set.
pub const DEPRECATED_ANNOTATION: &str = "service.kubernetes.io/topology-aware-hints";
/// How far over its share of endpoints a zone may be before the hints are redone
/// (`overloadThreshold`).
pub const OVERLOAD_THRESHOLD: f64 = 0.2;

pub const ENABLED: &str = "TopologyAwareHintsEnabled";
pub const DISABLED: &str = "TopologyAwareHintsDisabled";

pub const NO_ZONE_SPECIFIED: &str = "One or more endpoints do not have a zone specified";
pub const NO_ALLOCATED_HINTS: &str = "No hints allocated for zones";
pub const ENABLED_MESSAGE: &str = "Topology Aware Hints has been enabled";
pub const DISABLED_MESSAGE: &str = "Topology Aware Hints has been disabled";
pub const INSUFFICIENT_NODE_INFO: &str =
    "Insufficient Node information: allocatable CPU or zone not specified on one or more nodes";
pub const INSUFFICIENT_ENDPOINTS: &str = "Insufficient number of endpoints";
pub const MIN_ALLOCATION_EXCEEDS: &str = "Unable to allocate minimum required endpoints to each zone without exceeding overload threshold";

/// The labels that keep a Node out of the shares.
const EXCLUDED_LABELS: [&str; 2] = [
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
];

/// Whether the Service asks for topology-aware hints: `Auto` (or `auto`) in the deprecated
/// annotation if it is set, otherwise in `service.kubernetes.io/topology-mode`.
pub fn auto(service: &Service) -> bool {
    let Some(annotations) = service.metadata.annotations.as_ref() else {
        return false;
    };
    annotations
        .get(DEPRECATED_ANNOTATION)
        .or_else(|| annotations.get(TOPOLOGY_MODE_ANNOTATION))
        .is_some_and(|mode| mode == "Auto" || mode == "auto")
}

/// Each zone's share of the ready Nodes' allocatable CPU (`SetNodes`), or `None` when hints
/// cannot be allotted: a ready Node (not a control-plane one) without a zone or without
/// allocatable CPU, no CPU at all, or fewer than two zones.
pub fn zone_ratios(nodes: &[Node]) -> Option<BTreeMap<String, f64>> {
    let mut by_zone: BTreeMap<String, u128> = BTreeMap::new();
    for node in nodes {
        let labels = node.metadata.labels.as_ref();
        if labels.is_some_and(|l| EXCLUDED_LABELS.iter().any(|e| l.contains_key(*e))) {
            continue;
        }
        if !node_ready(node) {
            continue;
        }
        let zone = labels
            .and_then(|l| l.get(ZONE_LABEL))
            .filter(|z| !z.is_empty());
        let cpu = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get("cpu"))
            .and_then(|q| milli_value(&q.0))
            .unwrap_or(0);
        let zone = zone.filter(|_| cpu > 0)?;
        *by_zone.entry(zone.clone()).or_default() += cpu;
    }
    let total: u128 = by_zone.values().sum();
    if total == 0 || by_zone.len() < 2 {
        return None;
    }
    Some(
        by_zone
            .into_iter()
            .map(|(zone, cpu)| (zone, cpu as f64 / total as f64))
            .collect(),
    )
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// A quantity in thousandths, rounded up (`Quantity.MilliValue`): `"4"` is 4000, `"250m"` is
/// 250, `"1.5k"` is 1,500,000. `None` for what is not a quantity, or is negative.
pub fn milli_value(quantity: &str) -> Option<u128> {
    let quantity = quantity.trim();
    let split = quantity
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(quantity.len());
    let (number, suffix) = quantity.split_at(split);
    // A number may carry a decimal exponent instead of a suffix ("1e3").
    let (mantissa, exponent) = match number.find(['e', 'E']) {
        Some(at) => (&number[..at], number[at + 1..].parse::<i32>().ok()?),
        None => (number, 0),
    };
    let (base, power): (u128, i32) = match suffix {
        "" => (1, exponent),
        "m" => (1, exponent - 3),
        "k" => (1, exponent + 3),
        "M" => (1, exponent + 6),
        "G" => (1, exponent + 9),
        "T" => (1, exponent + 12),
        "P" => (1, exponent + 15),
        "E" => (1, exponent + 18),
        "Ki" => (1 << 10, exponent),
        "Mi" => (1 << 20, exponent),
        "Gi" => (1 << 30, exponent),
        "Ti" => (1 << 40, exponent),
        "Pi" => (1 << 50, exponent),
        "Ei" => (1 << 60, exponent),
        _ => return None,
    };
    let mantissa = mantissa.strip_prefix('+').unwrap_or(mantissa);
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if whole.is_empty() && fraction.is_empty()
        || !whole
            .chars()
            .chain(fraction.chars())
            .all(|c| c.is_ascii_digit())
    {
        return None;
    }
    // digits × 10^(power + 3 - fraction digits) × base, rounded up.
    let digits: u128 = format!("{whole}{fraction}").parse().ok()?;
    let scale = power + 3 - i32::try_from(fraction.len()).ok()?;
    let value = digits.checked_mul(base)?;
    if scale >= 0 {
        value.checked_mul(10u128.checked_pow(scale.unsigned_abs())?)
    } else {
        let divisor = 10u128.checked_pow(scale.unsigned_abs())?;
        Some(value.div_ceil(divisor))
    }
}

/// A zone's share of a Service's ready endpoints.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Allocation {
    minimum: usize,
    maximum: usize,
    desired: f64,
}

/// Each zone's share of `ready` endpoints (`getAllocations`), or the message saying why
/// there is none.
fn allocations(
    ratios: Option<&BTreeMap<String, f64>>,
    ready: usize,
) -> Result<BTreeMap<String, Allocation>, String> {
    let Some(ratios) = ratios else {
        return Err(INSUFFICIENT_NODE_INFO.to_owned());
    };
    let zones = ratios.len();
    if zones > ready {
        return Err(format!(
            "{INSUFFICIENT_ENDPOINTS} ({ready} endpoints, {zones} zones)"
        ));
    }
    let mut shares = BTreeMap::new();
    let mut minimum_total = 0;
    for (zone, ratio) in ratios {
        let desired = ratio * ready as f64;
        let minimum = (desired * (1.0 / (1.0 + OVERLOAD_THRESHOLD))).ceil() as usize;
        minimum_total += minimum;
        if minimum_total > ready {
            return Err(format!(
                "{MIN_ALLOCATION_EXCEEDS} ({ready} endpoints, {zones} zones)"
            ));
        }
        shares.insert(
            zone.clone(),
            Allocation {
                minimum,
                maximum: 0,
                desired: desired.max(minimum as f64),
            },
        );
    }
    for share in shares.values_mut() {
        share.maximum = share.minimum + ready - minimum_total;
    }
    Ok(shares)
}

/// The slices of one address type of a Service, as the packing left them.
#[derive(Debug)]
pub struct Slices<'a> {
    pub create: &'a mut Vec<EndpointSlice>,
    pub update: &'a mut Vec<EndpointSlice>,
    pub unchanged: &'a mut Vec<EndpointSlice>,
}

/// What [`add_hints`] decided beside the slices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allotted {
    /// Whether the Service has hints from this now.
    pub populated: bool,
    pub events: Vec<Event>,
}

/// `AddHints`: hints for the ready endpoints of one address type, written into the slices
/// to create or update; an unchanged slice whose hints no longer fit moves to the updates.
/// `populated` says whether the Service already had hints from this, so that enabling is
/// told once.
pub fn add_hints(
    ratios: Option<&BTreeMap<String, f64>>,
    slices: Slices<'_>,
    address_type: &str,
    populated: bool,
) -> Allotted {
    let with_type = |message: &str| format!("{message}, addressType: {address_type}");
    let disabled = |message: &str, slices: Slices<'_>| {
        remove_hints(slices);
        Allotted {
            populated: false,
            events: vec![Event::warning(DISABLED, with_type(message))],
        }
    };
    let ready = slices
        .create
        .iter()
        .chain(slices.update.iter())
        .chain(slices.unchanged.iter())
        .flat_map(|s| &s.endpoints)
        .filter(|e| endpoint_ready(e))
        .count();
    let shares = match allocations(ratios, ready) {
        Ok(shares) => shares,
        Err(message) => return disabled(&message, slices),
    };

    // Unchanged slices whose hints still fit are kept; the others are rewritten.
    let mut allotted: BTreeMap<String, usize> = BTreeMap::new();
    let mut kept = Vec::new();
    for slice in slices.unchanged.drain(..) {
        match hints_by_zone(&slice, &allotted, &shares) {
            Some(by_zone) => {
                for (zone, n) in by_zone {
                    *allotted.entry(zone).or_default() += n;
                }
                kept.push(slice);
            }
            None => slices.update.push(slice),
        }
    }
    *slices.unchanged = kept;

    // Each ready endpoint written hinted for its own zone.
    let mut missing_zone = false;
    for endpoint in slices
        .create
        .iter_mut()
        .chain(slices.update.iter_mut())
        .flat_map(|s| s.endpoints.iter_mut())
        .filter(|e| endpoint_ready(e))
    {
        let Some(zone) = endpoint.zone.clone().filter(|z| !z.is_empty()) else {
            missing_zone = true;
            break;
        };
        *allotted.entry(zone.clone()).or_default() += 1;
        endpoint.hints = Some(zone_hint(zone));
    }
    if missing_zone {
        return disabled(NO_ZONE_SPECIFIED, slices);
    }

    let (mut giving, mut receiving) = giving_and_receiving(&shares, &allotted);
    redistribute(
        &mut *slices.create,
        &mut giving,
        &mut receiving,
        &mut allotted,
    );
    redistribute(
        &mut *slices.update,
        &mut giving,
        &mut receiving,
        &mut allotted,
    );

    if allotted.is_empty() {
        return disabled(NO_ALLOCATED_HINTS, slices);
    }
    let events = if populated {
        Vec::new()
    } else {
        vec![Event::normal(ENABLED, with_type(ENABLED_MESSAGE))]
    };
    Allotted {
        populated: true,
        events,
    }
}

/// The Event telling that hints are off once the annotation is gone.
pub fn disabled_event(address_type: &str) -> Event {
    Event::warning(
        DISABLED,
        format!("{DISABLED_MESSAGE}, addressType: {address_type}"),
    )
}

fn zone_hint(zone: String) -> EndpointHints {
    EndpointHints {
        for_zones: Some(vec![ForZone { name: zone }]),
        for_nodes: None,
    }
}

/// `RemoveHintsFromSlices`: no hints on the slices written; an unchanged slice with hints is
/// rewritten without them.
pub fn remove_hints(slices: Slices<'_>) {
    for slice in slices.create.iter_mut().chain(slices.update.iter_mut()) {
        for endpoint in &mut slice.endpoints {
            endpoint.hints = None;
        }
    }
    let mut kept = Vec::new();
    for mut slice in slices.unchanged.drain(..) {
        if slice.endpoints.iter().any(|e| e.hints.is_some()) {
            for endpoint in &mut slice.endpoints {
                endpoint.hints = None;
            }
            slices.update.push(slice);
        } else {
            kept.push(slice);
        }
    }
    *slices.unchanged = kept;
}

/// The hints per zone of an unchanged slice, if every ready endpoint has hints for zones of
/// the shares and they keep each zone within its maximum (`getHintsByZone`).
fn hints_by_zone(
    slice: &EndpointSlice,
    allotted: &BTreeMap<String, usize>,
    shares: &BTreeMap<String, Allocation>,
) -> Option<BTreeMap<String, usize>> {
    let mut by_zone: BTreeMap<String, usize> = BTreeMap::new();
    for endpoint in slice.endpoints.iter().filter(|e| endpoint_ready(e)) {
        let zones = endpoint.hints.as_ref()?.for_zones.as_deref()?;
        if zones.is_empty() {
            return None;
        }
        for zone in zones {
            shares.get(&zone.name)?;
            *by_zone.entry(zone.name.clone()).or_default() += 1;
        }
    }
    for (zone, n) in &by_zone {
        let already = allotted.get(zone).copied().unwrap_or(0);
        if n + already > shares.get(zone)?.maximum {
            return None;
        }
    }
    Some(by_zone)
}

/// How many endpoints each zone over its share gives, and each zone under it receives
/// (`getGivingAndReceivingZones`): whole endpoints while both sides are at least half an
/// endpoint away and one of them a whole one.
fn giving_and_receiving(
    shares: &BTreeMap<String, Allocation>,
    allotted: &BTreeMap<String, usize>,
) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
    let mut to_give: BTreeMap<&str, f64> = BTreeMap::new();
    let mut to_receive: BTreeMap<&str, f64> = BTreeMap::new();
    for (zone, share) in shares {
        let have = allotted.get(zone).copied().unwrap_or(0) as f64;
        if have > share.desired {
            to_give.insert(zone, have - share.desired);
        } else if have < share.desired {
            to_receive.insert(zone, share.desired - have);
        }
    }
    let most = |zones: &BTreeMap<&str, f64>| -> Option<(String, f64)> {
        let mut best: Option<(&str, f64)> = None;
        for (zone, n) in zones {
            if *n > best.map_or(0.0, |b| b.1) {
                best = Some((zone, *n));
            }
        }
        best.map(|(z, n)| (z.to_owned(), n))
    };
    let mut giving: BTreeMap<String, usize> = BTreeMap::new();
    let mut receiving: BTreeMap<String, usize> = BTreeMap::new();
    while let (Some((giver, give)), Some((receiver, receive))) = (most(&to_give), most(&to_receive))
    {
        if (give < 1.0 && receive < 1.0) || give < 0.5 || receive < 0.5 {
            break;
        }
        *giving.entry(giver.clone()).or_default() += 1;
        *to_give.get_mut(giver.as_str()).expect("just found") -= 1.0;
        *receiving.entry(receiver.clone()).or_default() += 1;
        *to_receive.get_mut(receiver.as_str()).expect("just found") -= 1.0;
    }
    (giving, receiving)
}

/// Rehints ready endpoints of giving zones for receiving zones (`redistributeHints`).
fn redistribute(
    slices: &mut [EndpointSlice],
    giving: &mut BTreeMap<String, usize>,
    receiving: &mut BTreeMap<String, usize>,
    allotted: &mut BTreeMap<String, usize>,
) {
    for endpoint in slices
        .iter_mut()
        .flat_map(|s| s.endpoints.iter_mut())
        .filter(|e| endpoint_ready(e))
    {
        if giving.is_empty() || receiving.is_empty() {
            return;
        }
        let Some(zone) = endpoint.zone.clone().filter(|z| !z.is_empty()) else {
            continue;
        };
        let Some(give) = giving.get_mut(&zone) else {
            continue;
        };
        let Some((receiver, receive)) = receiving.iter_mut().find(|(_, n)| **n > 0) else {
            continue;
        };
        let receiver = receiver.clone();
        endpoint.hints = Some(zone_hint(receiver.clone()));
        *give -= 1;
        if *give == 0 {
            giving.remove(&zone);
        }
        *receive -= 1;
        if *receive == 0 {
            receiving.remove(&receiver);
        }
        *allotted.entry(receiver).or_default() += 1;
        if let Some(n) = allotted.get_mut(&zone) {
            *n = n.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests;
