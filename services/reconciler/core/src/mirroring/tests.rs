#![allow(clippy::unwrap_used)]

use serde_json::json;

use super::*;

fn endpoints(subsets: serde_json::Value) -> Endpoints {
    serde_json::from_value(json!({
        "metadata": {"name": "ext", "namespace": "ns", "uid": "ep-uid",
                     "labels": {"team": "a"},
                     "annotations": {"note": "x", TRIGGER_TIME_ANNOTATION: "2026-01-01T00:00:00Z"}},
        "subsets": subsets,
    }))
    .unwrap()
}

fn service(selector: serde_json::Value) -> Service {
    serde_json::from_value(json!({"metadata": {"name": "ext", "namespace": "ns"},
                                  "spec": {"selector": selector}}))
    .unwrap()
}

fn two_addresses() -> Endpoints {
    endpoints(json!([{
        "addresses": [{"ip": "10.9.0.1"}, {"ip": "fd00::1"}],
        "notReadyAddresses": [{"ip": "10.9.0.2", "hostname": "b", "nodeName": "n1"}],
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
    }]))
}

/// As the apiserver stores `plan` over `slices`, created ones named `ext-<n>`.
fn apply(slices: &[EndpointSlice], plan: &Plan) -> Vec<EndpointSlice> {
    let mut out: BTreeMap<String, EndpointSlice> = slices
        .iter()
        .map(|s| (s.metadata.name.clone().unwrap(), s.clone()))
        .collect();
    for name in &plan.delete {
        out.remove(name);
    }
    for slice in &plan.update {
        out.insert(slice.metadata.name.clone().unwrap(), slice.clone());
    }
    for (i, slice) in plan.create.iter().enumerate() {
        let mut slice = slice.clone();
        let name = format!("ext-{}{i}", out.len());
        slice.metadata.name = Some(name.clone());
        slice.metadata.generate_name = None;
        out.insert(name, slice);
    }
    out.into_values().collect()
}

#[test]
fn only_selectorless_services_endpoints_are_mirrored() {
    let e = two_addresses();
    assert!(should_mirror(Some(&e), Some(&service(json!(null)))));
    assert!(!should_mirror(
        Some(&e),
        Some(&service(json!({"app": "x"})))
    ));
    assert!(!should_mirror(Some(&e), None));
    assert!(!should_mirror(None, Some(&service(json!(null)))));
    let mut skip = e.clone();
    skip.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(SKIP_MIRROR_LABEL.into(), "true".into());
    assert!(!should_mirror(Some(&skip), Some(&service(json!(null)))));
    let mut leader = e;
    leader
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(LEADER_ANNOTATION.into(), "{}".into());
    assert!(!should_mirror(Some(&leader), Some(&service(json!(null)))));
}

#[test]
fn each_family_gets_a_slice_with_the_endpoints_labels_and_annotations() {
    let e = two_addresses();
    let plan = reconcile(&e, &[], DEFAULT_MAX_ENDPOINTS_PER_SUBSET);
    assert_eq!(
        (plan.create.len(), plan.update.len(), plan.delete.len()),
        (2, 0, 0)
    );
    let v4 = plan.create.iter().find(|s| s.address_type == IPV4).unwrap();
    assert_eq!(v4.endpoints.len(), 2);
    let labels = v4.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[MANAGED_BY_LABEL], CONTROLLER_NAME);
    assert_eq!(labels[SERVICE_NAME_LABEL], "ext");
    assert_eq!(labels["team"], "a");
    let annotations = v4.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations["note"], "x");
    assert!(!annotations.contains_key(TRIGGER_TIME_ANNOTATION));
    let owner = &v4.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Endpoints", "ep-uid")
    );
    let b = v4
        .endpoints
        .iter()
        .find(|e| e.addresses == ["10.9.0.2"])
        .unwrap();
    assert_eq!(b.conditions.as_ref().unwrap().ready, Some(false));
    assert_eq!(
        (b.hostname.as_deref(), b.node_name.as_deref()),
        (Some("b"), Some("n1"))
    );
    let v6 = plan.create.iter().find(|s| s.address_type == IPV6).unwrap();
    assert_eq!(v6.endpoints[0].addresses, ["fd00::1"]);
    assert_eq!(v6.ports.as_ref().unwrap()[0].port, Some(80));
}

#[test]
fn mirrored_slices_are_left_alone_until_the_endpoints_change() {
    let e = two_addresses();
    let slices = apply(&[], &reconcile(&e, &[], 1000));
    assert_eq!(reconcile(&e, &slices, 1000), Plan::default());
    // An address goes: the IPv4 slice is rewritten under its name.
    let fewer = endpoints(json!([{
        "addresses": [{"ip": "10.9.0.1"}, {"ip": "fd00::1"}],
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
    }]));
    let next = reconcile(&fewer, &slices, 1000);
    assert_eq!(
        (next.create.len(), next.update.len(), next.delete.len()),
        (0, 1, 0)
    );
    assert_eq!(next.update[0].endpoints.len(), 1);
    // A label of the Endpoints changes: rewritten too.
    let mut relabelled = e.clone();
    relabelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("team".into(), "b".into());
    assert_eq!(reconcile(&relabelled, &slices, 1000).update.len(), 2);
}

#[test]
fn a_port_change_moves_the_endpoints_into_a_reused_slice() {
    let e = two_addresses();
    let slices = apply(&[], &reconcile(&e, &[], 1000));
    let moved = endpoints(json!([{
        "addresses": [{"ip": "10.9.0.1"}, {"ip": "fd00::1"}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }]));
    let next = reconcile(&moved, &slices, 1000);
    // Both families' slices are overwritten with the new ports rather than deleted and made.
    assert_eq!(
        (next.create.len(), next.update.len(), next.delete.len()),
        (0, 2, 0)
    );
    assert!(
        next.update
            .iter()
            .all(|s| s.ports.as_ref().unwrap()[0].port == Some(8080))
    );
}

#[test]
fn addresses_past_the_limit_and_invalid_ones_are_skipped_and_counted() {
    let addresses: Vec<serde_json::Value> = (0..5)
        .map(|i| json!({"ip": format!("10.9.0.{}", i + 1)}))
        .collect();
    let mut all = addresses.clone();
    all.push(json!({"ip": "not-an-ip"}));
    let e = endpoints(json!([{"addresses": all, "ports": [{"port": 80}]}]));
    let plan = reconcile(&e, &[], 3);
    assert_eq!(plan.create.len(), 1);
    assert_eq!(plan.create[0].endpoints.len(), 3);
    assert_eq!(plan.skipped, 3);
    // The invalid address sorts after the IPs and is past the limit: not looked at.
    let plan = reconcile(&e, &[], 1000);
    assert_eq!((plan.skipped, plan.invalid), (1, 1));
}

#[test]
fn endpoints_without_subsets_leave_no_slices() {
    let e = two_addresses();
    let slices = apply(&[], &reconcile(&e, &[], 1000));
    let empty = endpoints(json!(null));
    let next = reconcile(&empty, &slices, 1000);
    assert_eq!(next.delete.len(), 2);
    assert!(next.create.is_empty() && next.update.is_empty());
}

#[test]
fn slices_of_a_former_object_of_the_same_name_are_rewritten() {
    let e = two_addresses();
    let slices = apply(&[], &reconcile(&e, &[], 1000));
    let mut again = e;
    again.metadata.uid = Some("new-uid".into());
    let next = reconcile(&again, &slices, 1000);
    assert_eq!(next.update.len(), 2);
    assert!(
        next.update
            .iter()
            .all(|s| s.metadata.owner_references.as_ref().unwrap()[0].uid == "new-uid")
    );
}
