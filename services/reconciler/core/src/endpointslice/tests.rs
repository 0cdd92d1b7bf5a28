#![allow(clippy::unwrap_used)]

use serde_json::json;

use super::*;

fn service(spec: serde_json::Value) -> Service {
    let mut svc = json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "svc-uid",
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"selector": {"app": "web"}, "clusterIP": "10.0.0.1", "ipFamilies": ["IPv4"],
                 "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]},
    });
    merge(&mut svc["spec"], spec);
    serde_json::from_value(svc).unwrap()
}

fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    if let (Some(into), serde_json::Value::Object(from)) = (into.as_object_mut(), from) {
        for (k, v) in from {
            into.insert(k, v);
        }
    }
}

fn pod(name: &str, ip: &str, ready: bool) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("{name}-uid"),
                     "labels": {"app": "web"}},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c",
                 "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                   "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                                   "lastTransitionTime": "2026-01-01T00:01:00Z"}]},
    }))
    .unwrap()
}

fn pods(count: usize) -> Vec<Pod> {
    (0..count)
        .map(|i| {
            pod(
                &format!("p{i:04}"),
                &format!("10.1.{}.{}", i / 250, i % 250 + 1),
                true,
            )
        })
        .collect()
}

fn zone_a(_: &str) -> NodeInfo {
    NodeInfo::Zone(Some("zone-a".to_owned()))
}

fn plan(svc: &Service, pods: &[Pod], slices: &[EndpointSlice]) -> Plan {
    reconcile(&Inputs {
        service: svc,
        pods: &pods.iter().collect::<Vec<_>>(),
        slices,
        node: &zone_a,
        max_per_slice: DEFAULT_MAX_ENDPOINTS_PER_SLICE,
        trigger_time: None,
        zone_ratios: None,
        hints_populated: false,
    })
}

/// The slices after `plan` is written over `slices`, created ones named `web-<n>`.
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
    let mut n = out.len();
    for slice in &plan.create {
        let mut slice = slice.clone();
        slice.metadata.generate_name = None;
        loop {
            let name = format!("web-{n}");
            n += 1;
            if let std::collections::btree_map::Entry::Vacant(free) = out.entry(name.clone()) {
                slice.metadata.name = Some(name);
                free.insert(slice);
                break;
            }
        }
    }
    out.into_values().collect()
}

fn sizes(slices: &[EndpointSlice]) -> Vec<usize> {
    let mut sizes: Vec<usize> = slices.iter().map(|s| s.endpoints.len()).collect();
    sizes.sort_unstable();
    sizes
}

fn names_in(slices: &[EndpointSlice]) -> BTreeSet<String> {
    slices
        .iter()
        .flat_map(|s| &s.endpoints)
        .map(|e| e.target_ref.as_ref().unwrap().name.clone().unwrap())
        .collect()
}

#[test]
fn a_new_service_gets_one_slice_with_its_ready_pods_and_named_ports_resolved() {
    let svc = service(json!({}));
    let pods = vec![pod("a", "10.1.0.1", true), pod("b", "10.1.0.2", false)];
    let plan = plan(&svc, &pods, &[]);
    assert_eq!(
        (plan.create.len(), plan.update.len(), plan.delete.len()),
        (1, 0, 0)
    );
    let slice = &plan.create[0];
    assert_eq!(slice.metadata.generate_name.as_deref(), Some("web-"));
    assert_eq!(slice.address_type, "IPv4");
    let labels = slice.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[SERVICE_NAME_LABEL], "web");
    assert_eq!(labels[MANAGED_BY_LABEL], CONTROLLER_NAME);
    assert!(!labels.contains_key(HEADLESS_LABEL));
    let owner = &slice.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Service", "svc-uid", Some(true))
    );
    let ports = slice.ports.as_ref().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(
        (ports[0].name.as_deref(), ports[0].port),
        (Some("http"), Some(8080))
    );
    let b = slice
        .endpoints
        .iter()
        .find(|e| e.target_ref.as_ref().unwrap().name.as_deref() == Some("b"))
        .unwrap();
    let c = b.conditions.as_ref().unwrap();
    assert_eq!(
        (c.ready, c.serving, c.terminating),
        (Some(false), Some(false), Some(false))
    );
    assert_eq!(b.addresses, ["10.1.0.2"]);
    assert_eq!(b.node_name.as_deref(), Some("node-a"));
    assert_eq!(b.zone.as_deref(), Some("zone-a"));
}

#[test]
fn endpoints_are_packed_a_hundred_to_a_slice() {
    let svc = service(json!({}));
    let pods = pods(250);
    let plan = plan(&svc, &pods, &[]);
    assert_eq!(sizes(&plan.create), [50, 100, 100]);
    assert_eq!(names_in(&plan.create).len(), 250);
}

#[test]
fn a_settled_service_writes_nothing() {
    let svc = service(json!({}));
    let pods = pods(250);
    let slices = apply(&[], &plan(&svc, &pods, &[]));
    assert_eq!(plan(&svc, &pods, &slices), Plan::default());
}

#[test]
fn one_pod_turning_unready_rewrites_only_its_slice() {
    let svc = service(json!({}));
    let mut pods = pods(250);
    let slices = apply(&[], &plan(&svc, &pods, &[]));
    pods[7] = pod("p0007", "10.1.0.8", false);
    let next = plan(&svc, &pods, &slices);
    assert_eq!(
        (next.create.len(), next.update.len(), next.delete.len()),
        (0, 1, 0)
    );
    let ep = next.update[0]
        .endpoints
        .iter()
        .find(|e| e.target_ref.as_ref().unwrap().name.as_deref() == Some("p0007"))
        .unwrap();
    assert_eq!(ep.conditions.as_ref().unwrap().ready, Some(false));
}

#[test]
fn new_pods_go_into_the_unchanged_slice_they_fill_closest_to_full() {
    let svc = service(json!({}));
    let all = pods(310);
    let slices = apply(&[], &plan(&svc, &all[..235], &[]));
    assert_eq!(sizes(&slices), [35, 100, 100]);
    // Five more: into the slice of 35.
    let next = plan(&svc, &all[..240], &slices);
    assert_eq!((next.create.len(), next.update.len()), (0, 1));
    assert_eq!(next.update[0].endpoints.len(), 40);
    // Seventy more do not fit beside 40: a new slice, no other touched.
    let slices = apply(&slices, &next);
    let next = plan(&svc, &all, &slices);
    assert_eq!((next.create.len(), next.update.len()), (1, 0));
    assert_eq!(next.create[0].endpoints.len(), 70);
}

#[test]
fn removed_pods_shrink_their_slice_and_new_ones_join_a_slice_already_being_written() {
    let svc = service(json!({}));
    let all = pods(200);
    let slices = apply(&[], &plan(&svc, &all, &[]));
    // One Pod goes from the first slice, one new comes: a single update.
    let mut pods: Vec<Pod> = all
        .iter()
        .filter(|p| p.metadata.name.as_deref() != Some("p0000"))
        .cloned()
        .collect();
    pods.push(pod("new", "10.9.0.1", true));
    let next = plan(&svc, &pods, &slices);
    assert_eq!(
        (next.create.len(), next.update.len(), next.delete.len()),
        (0, 1, 0)
    );
    let after = apply(&slices, &next);
    assert_eq!(names_in(&after).len(), 200);
    assert!(names_in(&after).contains("new"));
}

#[test]
fn no_endpoints_leave_one_placeholder_slice_and_it_is_kept() {
    let svc = service(json!({}));
    let first = plan(&svc, &[], &[]);
    assert_eq!(first.create.len(), 1);
    assert!(first.create[0].endpoints.is_empty());
    assert!(first.create[0].ports.as_ref().unwrap().is_empty());
    let slices = apply(&[], &first);
    assert_eq!(plan(&svc, &[], &slices), Plan::default());

    // A slice emptied is overwritten as the placeholder rather than deleted and created.
    let pods = pods(3);
    let slices = apply(&[], &plan(&svc, &pods, &[]));
    let emptied = plan(&svc, &[], &slices);
    assert_eq!(
        (
            emptied.create.len(),
            emptied.update.len(),
            emptied.delete.len()
        ),
        (0, 1, 0)
    );
    assert!(emptied.update[0].endpoints.is_empty());
}

#[test]
fn pods_without_ips_or_finished_are_left_out_and_terminating_ones_kept_not_ready() {
    let svc = service(json!({}));
    let mut no_ip = pod("no-ip", "10.1.0.1", true);
    no_ip.status.as_mut().unwrap().pod_ip = None;
    no_ip.status.as_mut().unwrap().pod_ips = None;
    let mut done = pod("done", "10.1.0.2", false);
    done.status.as_mut().unwrap().phase = Some("Succeeded".to_owned());
    let mut leaving = pod("leaving", "10.1.0.3", true);
    leaving.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
    );
    let plan = plan(&svc, &[no_ip, done, leaving], &[]);
    let eps = &plan.create[0].endpoints;
    assert_eq!(eps.len(), 1);
    let c = eps[0].conditions.as_ref().unwrap();
    assert_eq!(
        (c.ready, c.serving, c.terminating),
        (Some(false), Some(true), Some(true))
    );

    let publish = service(json!({"publishNotReadyAddresses": true}));
    let p = super::reconcile(&Inputs {
        service: &publish,
        pods: &[&pod("slow", "10.1.0.4", false)],
        slices: &[],
        node: &zone_a,
        max_per_slice: 100,
        trigger_time: None,
        zone_ratios: None,
        hints_populated: false,
    });
    assert_eq!(
        p.create[0].endpoints[0].conditions.as_ref().unwrap().ready,
        Some(true)
    );
}

#[test]
fn a_port_name_no_container_has_gives_a_slice_without_ports() {
    let svc = service(
        json!({"ports": [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]}),
    );
    let plan = plan(&svc, &[pod("a", "10.1.0.1", true)], &[]);
    assert_eq!(plan.create.len(), 1);
    assert!(plan.create[0].ports.as_ref().unwrap().is_empty());
    assert_eq!(plan.create[0].endpoints.len(), 1);
}

#[test]
fn pods_whose_ports_differ_get_slices_of_their_own() {
    let svc = service(json!({}));
    let mut other = pod("other", "10.1.0.9", true);
    other.spec.as_mut().unwrap().containers[0]
        .ports
        .as_mut()
        .unwrap()[0]
        .container_port = 9999;
    let plan = plan(&svc, &[pod("a", "10.1.0.1", true), other], &[]);
    let mut ports: Vec<i32> = plan
        .create
        .iter()
        .map(|s| s.ports.as_ref().unwrap()[0].port.unwrap())
        .collect();
    ports.sort_unstable();
    assert_eq!(ports, [8080, 9999]);
}

#[test]
fn a_sidecar_port_resolves_and_numbers_are_taken_as_they_are() {
    let svc = service(json!({"ports": [
        {"name": "side", "port": 81, "targetPort": "side", "protocol": "TCP"},
        {"name": "num", "port": 82, "targetPort": 7000, "protocol": "UDP"}]}));
    let mut p: Pod = pod("a", "10.1.0.1", true);
    p.spec.as_mut().unwrap().init_containers = Some(vec![serde_json::from_value(json!(
        {"name": "s", "restartPolicy": "Always", "ports": [{"name": "side", "containerPort": 6000}]}
    )).unwrap()]);
    let plan = plan(&svc, &[p], &[]);
    let ports: Vec<(Option<String>, Option<i32>)> = plan.create[0]
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| (p.name.clone(), p.port))
        .collect();
    assert_eq!(
        ports,
        [
            (Some("num".to_owned()), Some(7000)),
            (Some("side".to_owned()), Some(6000))
        ]
    );
}

#[test]
fn a_pod_on_an_unknown_node_is_skipped_unless_not_ready_addresses_are_published() {
    let svc = service(json!({}));
    let missing = |_: &str| NodeInfo::Missing;
    let p = super::reconcile(&Inputs {
        service: &svc,
        pods: &[&pod("a", "10.1.0.1", true)],
        slices: &[],
        node: &missing,
        max_per_slice: 100,
        trigger_time: None,
        zone_ratios: None,
        hints_populated: false,
    });
    assert_eq!(
        p.skipped,
        [SkippedPod {
            pod: "a".into(),
            node: "node-a".into()
        }]
    );
    assert!(p.create[0].endpoints.is_empty());

    let publish = service(json!({"publishNotReadyAddresses": true}));
    let p = super::reconcile(&Inputs {
        service: &publish,
        pods: &[&pod("a", "10.1.0.1", true)],
        slices: &[],
        node: &missing,
        max_per_slice: 100,
        trigger_time: None,
        zone_ratios: None,
        hints_populated: false,
    });
    assert!(p.skipped.is_empty());
    assert_eq!(p.create[0].endpoints[0].zone, None);
}

#[test]
fn hostname_is_set_when_the_pod_names_the_service_as_its_subdomain() {
    let svc = service(json!({"clusterIP": "None"}));
    let mut named = pod("a", "10.1.0.1", true);
    named.spec.as_mut().unwrap().hostname = Some("a".into());
    named.spec.as_mut().unwrap().subdomain = Some("web".into());
    let mut elsewhere = pod("b", "10.1.0.2", true);
    elsewhere.spec.as_mut().unwrap().hostname = Some("b".into());
    elsewhere.spec.as_mut().unwrap().subdomain = Some("other".into());
    let plan = plan(&svc, &[named, elsewhere], &[]);
    let slice = &plan.create[0];
    assert_eq!(slice.metadata.labels.as_ref().unwrap()[HEADLESS_LABEL], "");
    let hostnames: BTreeSet<Option<String>> =
        slice.endpoints.iter().map(|e| e.hostname.clone()).collect();
    assert_eq!(hostnames, BTreeSet::from([Some("a".into()), None]));
}

#[test]
fn a_dual_stack_service_gets_a_slice_per_family_and_a_dropped_family_is_deleted() {
    let svc = service(json!({"ipFamilies": ["IPv4", "IPv6"]}));
    let mut p = pod("a", "10.1.0.1", true);
    p.status.as_mut().unwrap().pod_ips = Some(vec![
        serde_json::from_value(json!({"ip": "10.1.0.1"})).unwrap(),
        serde_json::from_value(json!({"ip": "fd00:0:0::1"})).unwrap(),
    ]);
    let first = plan(&svc, std::slice::from_ref(&p), &[]);
    let mut found: Vec<(String, Vec<String>)> = first
        .create
        .iter()
        .map(|s| (s.address_type.clone(), s.endpoints[0].addresses.clone()))
        .collect();
    found.sort();
    assert_eq!(
        found,
        [
            ("IPv4".into(), vec!["10.1.0.1".into()]),
            ("IPv6".into(), vec!["fd00::1".into()])
        ]
    );

    let slices = apply(&[], &first);
    let single = service(json!({"ipFamilies": ["IPv4"]}));
    let next = plan(&single, &[p], &slices);
    assert_eq!(
        (next.create.len(), next.update.len(), next.delete.len()),
        (0, 0, 1)
    );
    let gone = slices.iter().find(|s| s.address_type == "IPv6").unwrap();
    assert_eq!(next.delete, [gone.metadata.name.clone().unwrap()]);
}

#[test]
fn prefer_close_hints_each_ready_endpoint_for_its_zone_and_turning_it_off_removes_them() {
    let close = service(json!({"trafficDistribution": "PreferClose"}));
    let pods = vec![pod("a", "10.1.0.1", true), pod("b", "10.1.0.2", false)];
    let first = plan(&close, &pods, &[]);
    for e in &first.create[0].endpoints {
        let ready = e.conditions.as_ref().unwrap().ready == Some(true);
        let zones = e.hints.as_ref().and_then(|h| h.for_zones.clone());
        assert_eq!(zones.is_some(), ready, "{e:?}");
    }
    let slices = apply(&[], &first);
    assert_eq!(plan(&close, &pods, &slices), Plan::default());
    let off = service(json!({}));
    let next = plan(&off, &pods, &slices);
    assert_eq!(next.update.len(), 1);
    assert!(next.update[0].endpoints.iter().all(|e| e.hints.is_none()));

    let same_node = service(json!({"trafficDistribution": "PreferSameNode"}));
    let p = plan(&same_node, &pods[..1], &[]);
    let hints = p.create[0].endpoints[0].hints.clone().unwrap();
    assert_eq!(hints.for_nodes.unwrap()[0].name, "node-a");
    assert_eq!(hints.for_zones.unwrap()[0].name, "zone-a");
}

#[test]
fn the_services_labels_are_copied_and_a_change_rewrites_the_slices() {
    let mut svc = service(json!({}));
    svc.metadata.labels = Some(BTreeMap::from([("team".to_owned(), "a".to_owned())]));
    let pods = pods(2);
    let slices = apply(&[], &plan(&svc, &pods, &[]));
    assert_eq!(slices[0].metadata.labels.as_ref().unwrap()["team"], "a");
    svc.metadata.labels = Some(BTreeMap::from([("team".to_owned(), "b".to_owned())]));
    let next = plan(&svc, &pods, &slices);
    assert_eq!(next.update.len(), 1);
    assert_eq!(
        next.update[0].metadata.labels.as_ref().unwrap()["team"],
        "b"
    );
}

#[test]
fn a_slice_the_service_does_not_own_is_replaced() {
    let svc = service(json!({}));
    let pods = pods(2);
    let mut slices = apply(&[], &plan(&svc, &pods, &[]));
    slices[0].metadata.owner_references.as_mut().unwrap()[0].uid = "old-uid".into();
    let next = plan(&svc, &pods, &slices);
    // Not reused under its name: it is the old Service's.
    assert_eq!(
        (next.create.len(), next.update.len(), next.delete.len()),
        (1, 0, 1)
    );
}

#[test]
fn a_service_being_deleted_creates_nothing() {
    let mut svc = service(json!({}));
    svc.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        Timestamp::UNIX_EPOCH,
    ));
    assert!(plan(&svc, &pods(3), &[]).create.is_empty());
}

#[test]
fn only_selector_services_that_are_not_external_names_are_managed() {
    assert!(manages(&service(json!({}))));
    assert!(!manages(&service(json!({"selector": null}))));
    assert!(!manages(&service(json!({"selector": {}}))));
    assert!(!manages(&service(
        json!({"type": "ExternalName", "externalName": "x.example"})
    )));
    assert_eq!(
        selector_string(&service(json!({"selector": {"a": "1", "b": "2"}}))),
        "a=1,b=2"
    );
}

#[test]
fn the_trigger_time_is_the_creation_first_then_the_earliest_newer_ready_change() {
    let svc = service(json!({}));
    let created: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
    assert_eq!(trigger_time(&svc, &pods(2), &[]), Some(created));
    let first = reconcile(&Inputs {
        service: &svc,
        pods: &pods(2).iter().collect::<Vec<_>>(),
        slices: &[],
        node: &zone_a,
        max_per_slice: 100,
        trigger_time: Some(created),
        zone_ratios: None,
        hints_populated: false,
    });
    let slices = apply(&[], &first);
    assert_eq!(
        slices[0].metadata.annotations.as_ref().unwrap()[TRIGGER_TIME_ANNOTATION],
        "2026-01-01T00:00:00Z"
    );
    // The Pods turned ready a minute after: newer than what was written.
    let minute: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
    assert_eq!(trigger_time(&svc, &pods(2), &slices), Some(minute));
    let mut later = slices.clone();
    later[0].metadata.annotations.as_mut().unwrap().insert(
        TRIGGER_TIME_ANNOTATION.into(),
        "2026-01-01T00:01:00Z".into(),
    );
    assert_eq!(trigger_time(&svc, &pods(2), &later), None);
}

#[test]
fn a_smaller_limit_packs_smaller_slices() {
    let svc = service(json!({}));
    let p = reconcile(&Inputs {
        service: &svc,
        pods: &pods(25).iter().collect::<Vec<_>>(),
        slices: &[],
        node: &zone_a,
        max_per_slice: 10,
        trigger_time: None,
        zone_ratios: None,
        hints_populated: false,
    });
    assert_eq!(sizes(&p.create), [5, 10, 10]);
}

#[test]
fn topology_mode_auto_allots_hints_by_zone_and_their_removal_is_told() {
    let mut svc = service(json!({}));
    svc.metadata.annotations = Some(
        [(
            topology::TOPOLOGY_MODE_ANNOTATION.to_owned(),
            "Auto".to_owned(),
        )]
        .into(),
    );
    let mut all = pods(4);
    for p in &mut all[2..] {
        p.spec.as_mut().unwrap().node_name = Some("node-b".to_owned());
    }
    let zone = |node: &str| {
        NodeInfo::Zone(Some(
            if node == "node-b" { "zone-b" } else { "zone-a" }.to_owned(),
        ))
    };
    let shares: BTreeMap<String, f64> =
        [("zone-a".to_owned(), 0.5), ("zone-b".to_owned(), 0.5)].into();
    let run = |svc: &Service, slices: &[EndpointSlice], populated: bool| {
        reconcile(&Inputs {
            service: svc,
            pods: &all.iter().collect::<Vec<_>>(),
            slices,
            node: &zone,
            max_per_slice: 100,
            trigger_time: None,
            zone_ratios: Some(&shares),
            hints_populated: populated,
        })
    };
    let first = run(&svc, &[], false);
    assert!(first.hints_populated);
    assert_eq!(
        first.events,
        vec![Event::normal(
            topology::ENABLED,
            "Topology Aware Hints has been enabled, addressType: IPv4"
        )]
    );
    let slices = apply(&[], &first);
    for e in &slices[0].endpoints {
        let hinted = &e.hints.as_ref().unwrap().for_zones.as_ref().unwrap()[0].name;
        assert_eq!(Some(hinted), e.zone.as_ref());
    }
    let again = run(&svc, &slices, true);
    assert_eq!((again.writes(), again.events.len()), (0, 0));

    svc.metadata.annotations = None;
    let off = run(&svc, &slices, true);
    assert!(!off.hints_populated);
    assert_eq!(
        off.events,
        vec![Event::warning(
            topology::DISABLED,
            "Topology Aware Hints has been disabled, addressType: IPv4"
        )]
    );
    assert_eq!(off.update.len(), 1);
    assert!(off.update[0].endpoints.iter().all(|e| e.hints.is_none()));
}
