#![allow(clippy::unwrap_used)]

use serde_json::json;

use super::*;

fn service(spec: serde_json::Value) -> Service {
    let mut svc = json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "svc-uid",
                     "labels": {"app": "web"},
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"selector": {"app": "web"}, "clusterIP": "10.0.0.1", "ipFamilies": ["IPv4"],
                 "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
                           {"name": "admin", "port": 81, "targetPort": 9000, "protocol": "TCP"}]},
    });
    if let (Some(into), serde_json::Value::Object(from)) = (svc["spec"].as_object_mut(), spec) {
        into.extend(from);
    }
    serde_json::from_value(svc).unwrap()
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

fn written(decision: Decision) -> Endpoints {
    match decision {
        Decision::Write(endpoints) => *endpoints,
        other => panic!("expected a write, got {other:?}"),
    }
}

/// As the apiserver stores a write: with a resourceVersion.
fn stored(mut endpoints: Endpoints) -> Endpoints {
    endpoints.metadata.resource_version = Some("1".into());
    endpoints
}

fn names(list: &Option<Vec<EndpointAddress>>) -> Vec<String> {
    list.iter()
        .flatten()
        .map(|a| a.target_ref.as_ref().unwrap().name.clone().unwrap())
        .collect()
}

#[test]
fn ports_with_the_same_addresses_share_a_subset_and_unready_pods_are_listed_apart() {
    let svc = service(json!({}));
    let pods = [pod("a", "10.1.0.2", true), pod("b", "10.1.0.1", false)];
    let e = written(sync(Some(&svc), &pods, None, None));
    let subsets = e.subsets.as_ref().unwrap();
    assert_eq!(subsets.len(), 1);
    let ports: Vec<(Option<String>, i32)> = subsets[0]
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone(), p.port))
        .collect();
    assert_eq!(
        ports,
        [(Some("admin".into()), 9000), (Some("http".into()), 8080)]
    );
    assert_eq!(names(&subsets[0].addresses), ["a"]);
    assert_eq!(names(&subsets[0].not_ready_addresses), ["b"]);
    let labels = e.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[MANAGED_BY_LABEL], CONTROLLER_NAME);
    assert_eq!(labels["app"], "web");
    assert_eq!(e.metadata.name.as_deref(), Some("web"));
    assert!(e.metadata.resource_version.is_none());
}

#[test]
fn a_port_only_some_pods_have_splits_the_subsets() {
    let svc = service(json!({}));
    let mut bare = pod("bare", "10.1.0.3", true);
    bare.spec.as_mut().unwrap().containers[0].ports = None;
    let pods = [pod("a", "10.1.0.2", true), bare];
    let e = written(sync(Some(&svc), &pods, None, None));
    let mut found: Vec<(Vec<i32>, Vec<String>)> = e
        .subsets
        .unwrap()
        .iter()
        .map(|s| {
            (
                s.ports.iter().flatten().map(|p| p.port).collect(),
                names(&s.addresses),
            )
        })
        .collect();
    found.sort();
    // Both have the numeric port; only `a` the named one.
    assert_eq!(
        found,
        [
            (vec![8080], vec!["a".into()]),
            (vec![9000], vec!["a".into(), "bare".into()])
        ]
    );
}

#[test]
fn settled_endpoints_are_left_alone_even_in_another_order() {
    let svc = service(json!({}));
    let pods = [pod("a", "10.1.0.2", true), pod("b", "10.1.0.1", true)];
    let mut e = stored(written(sync(Some(&svc), &pods, None, None)));
    assert_eq!(sync(Some(&svc), &pods, Some(&e), None), Decision::Nothing);
    // kube-controller-manager's order (by hash) differs from ours: still no write.
    e.subsets.as_mut().unwrap()[0]
        .ports
        .as_mut()
        .unwrap()
        .reverse();
    e.subsets.as_mut().unwrap()[0]
        .addresses
        .as_mut()
        .unwrap()
        .reverse();
    assert_eq!(sync(Some(&svc), &pods, Some(&e), None), Decision::Nothing);
    // A label of the Service's changed: rewritten, at the read resourceVersion.
    let mut relabelled = svc.clone();
    relabelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("team".into(), "x".into());
    let next = written(sync(Some(&relabelled), &pods, Some(&e), None));
    assert_eq!(next.metadata.resource_version.as_deref(), Some("1"));
    assert_eq!(next.metadata.labels.unwrap()["team"], "x");
}

#[test]
fn terminating_and_finished_pods_and_pods_without_ips_are_left_out() {
    let svc = service(json!({}));
    let mut leaving = pod("leaving", "10.1.0.3", true);
    leaving.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
    );
    let mut done = pod("done", "10.1.0.4", true);
    done.status.as_mut().unwrap().phase = Some("Failed".into());
    let mut no_ip = pod("no-ip", "10.1.0.5", true);
    no_ip.status.as_mut().unwrap().pod_ips = None;
    no_ip.status.as_mut().unwrap().pod_ip = None;
    let e = written(sync(
        Some(&svc),
        &[leaving.clone(), done, no_ip],
        None,
        None,
    ));
    assert!(e.subsets.is_none());
    // Published not-ready addresses include terminating Pods, as ready.
    let publish = service(json!({"publishNotReadyAddresses": true}));
    let e = written(sync(Some(&publish), &[leaving], None, None));
    assert_eq!(names(&e.subsets.unwrap()[0].addresses), ["leaving"]);
}

#[test]
fn a_headless_service_without_ports_lists_addresses_with_hostnames() {
    let svc = service(json!({"clusterIP": "None", "ports": null}));
    let mut p = pod("a", "10.1.0.2", true);
    p.spec.as_mut().unwrap().hostname = Some("a".into());
    p.spec.as_mut().unwrap().subdomain = Some("web".into());
    let e = written(sync(Some(&svc), &[p], None, None));
    let subset = &e.subsets.as_ref().unwrap()[0];
    assert!(subset.ports.is_none());
    assert_eq!(
        subset.addresses.as_ref().unwrap()[0].hostname.as_deref(),
        Some("a")
    );
    assert_eq!(e.metadata.labels.unwrap()[HEADLESS_LABEL], "");
    // With a cluster IP and no ports: no addresses at all.
    let plain = service(json!({"ports": null}));
    assert!(
        written(sync(
            Some(&plain),
            &[pod("a", "10.1.0.2", true)],
            None,
            None
        ))
        .subsets
        .is_none()
    );
}

#[test]
fn over_a_thousand_addresses_are_truncated_not_ready_first_and_annotated() {
    let svc = service(json!({"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}));
    let pods: Vec<Pod> = (0..1100)
        .map(|i| {
            pod(
                &format!("p{i}"),
                &format!("10.1.{}.{}", i / 250, i % 250 + 1),
                i < 950,
            )
        })
        .collect();
    let e = written(sync(Some(&svc), &pods, None, None));
    let subset = &e.subsets.as_ref().unwrap()[0];
    assert_eq!(subset.addresses.as_ref().unwrap().len(), 950);
    assert_eq!(subset.not_ready_addresses.as_ref().unwrap().len(), 50);
    assert_eq!(
        e.metadata.annotations.as_ref().unwrap()[OVER_CAPACITY_ANNOTATION],
        TRUNCATED
    );
    // Back under the limit: the annotation goes.
    let e = stored(e);
    let next = written(sync(Some(&svc), &pods[..900], Some(&e), None));
    assert!(
        next.metadata
            .annotations
            .is_none_or(|a| !a.contains_key(OVER_CAPACITY_ANNOTATION))
    );

    // More than a thousand ready: only ready ones kept.
    let all_ready: Vec<Pod> = (0..1200)
        .map(|i| {
            pod(
                &format!("p{i}"),
                &format!("10.2.{}.{}", i / 250, i % 250 + 1),
                i != 0,
            )
        })
        .collect();
    let e = written(sync(Some(&svc), &all_ready, None, None));
    let (ready, not_ready) = count(e.subsets.as_ref().unwrap());
    assert_eq!((ready, not_ready), (1000, 0));
}

#[test]
fn a_deleted_services_endpoints_go_unless_they_hold_a_leader_record() {
    let svc = service(json!({}));
    let e = stored(written(sync(
        Some(&svc),
        &[pod("a", "10.1.0.2", true)],
        None,
        None,
    )));
    assert_eq!(sync(None, &[] as &[Pod], Some(&e), None), Decision::Delete);
    assert_eq!(sync(None, &[] as &[Pod], None, None), Decision::Nothing);
    let mut leader = e.clone();
    leader
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(LEADER_ANNOTATION.into(), "{}".into());
    assert_eq!(
        sync(None, &[] as &[Pod], Some(&leader), None),
        Decision::Nothing
    );
}

#[test]
fn selectorless_and_external_name_services_are_not_this_controllers() {
    let manual = service(json!({"selector": null}));
    assert_eq!(
        sync(Some(&manual), &[] as &[Pod], None, None),
        Decision::Nothing
    );
    let external = service(json!({"type": "ExternalName", "externalName": "db.example"}));
    assert_eq!(
        sync(Some(&external), &[] as &[Pod], None, None),
        Decision::Nothing
    );
}

#[test]
fn the_services_first_family_is_used() {
    let svc = service(json!({"ipFamilies": ["IPv6", "IPv4"]}));
    let mut p = pod("a", "10.1.0.2", true);
    p.status.as_mut().unwrap().pod_ips = Some(vec![
        serde_json::from_value(json!({"ip": "10.1.0.2"})).unwrap(),
        serde_json::from_value(json!({"ip": "fd00:0::2"})).unwrap(),
    ]);
    let e = written(sync(Some(&svc), &[p], None, None));
    assert_eq!(
        e.subsets.unwrap()[0].addresses.as_ref().unwrap()[0].ip,
        "fd00::2"
    );
}

#[test]
fn the_trigger_time_is_written_and_cleared() {
    let svc = service(json!({}));
    let pods = [pod("a", "10.1.0.2", true)];
    let first = trigger_time(&svc, &pods, None);
    assert_eq!(first, Some("2026-01-01T00:00:00Z".parse().unwrap()));
    let e = stored(written(sync(Some(&svc), &pods, None, first)));
    assert_eq!(
        e.metadata.annotations.as_ref().unwrap()[TRIGGER_TIME_ANNOTATION],
        "2026-01-01T00:00:00Z"
    );
    // The Pod turned ready a minute later than that.
    assert_eq!(
        trigger_time(&svc, &pods, Some(&e)),
        Some("2026-01-01T00:01:00Z".parse().unwrap())
    );
}

#[test]
fn repacking_takes_an_address_not_ready_anywhere_as_not_ready() {
    let a = |ready: bool| {
        let address = EndpointAddress {
            ip: "10.0.0.1".into(),
            ..EndpointAddress::default()
        };
        let port = EndpointPort {
            port: 80,
            ..EndpointPort::default()
        };
        EndpointSubset {
            addresses: ready.then(|| vec![address.clone()]),
            not_ready_addresses: (!ready).then(|| vec![address]),
            ports: Some(vec![port]),
        }
    };
    let packed = repack(&[a(true), a(false)]);
    assert_eq!(packed.len(), 1);
    assert!(packed[0].addresses.is_none());
    assert_eq!(packed[0].not_ready_addresses.as_ref().unwrap().len(), 1);
}
