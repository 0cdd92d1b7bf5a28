//! The EndpointSlice, Endpoints and EndpointSlice mirroring controllers against the real
//! control plane, beside kube-controller-manager's `endpointslice-controller`,
//! `endpoints-controller` and `endpointslice-mirroring-controller` (each on a namespace of
//! its own, one after the other): the same script ends in the same slices and Endpoints
//! under both, compared canonically (slices as their address type, ports, labels
//! and owner; endpoints as a set, by the Pod behind each, with their conditions, Node, zone,
//! hostname and hints; Endpoints as their ports and addresses by Pod, ready or not, with
//! their labels; kwok gives the Pods their IPs, never dialed).
//!
//! - `web`: a named target port, six Pods on a Node in `zone-a` and one that never gets an
//!   IP (left out);
//! - `metrics`: a port name no container has: a slice with the endpoints and no ports;
//! - `nothing`: a selector that matches no Pod: one empty placeholder slice;
//! - `db`: headless, its Pods name it as their subdomain: hostnames set;
//! - `close`: `trafficDistribution: PreferClose`: ready endpoints hinted for their zone;
//! - `auto`: `service.kubernetes.io/topology-mode: Auto` over `web`'s Pods, all in `zone-a`,
//!   with the Nodes' CPU 60/40 between `zone-a` and `zone-b`: some endpoints hinted for
//!   `zone-b` (which ones is chance under kube-controller-manager: compared as counts per
//!   zone), and the Event saying hints are on;
//! - `big`: 1,010 Pods: eleven slices or more, none over 100; its Endpoints truncated to
//!   1,000 addresses and annotated so;
//! - `ext`: no selector, its Endpoints written by hand: mirrored into a slice;
//! - `dual`: `RequireDualStack`, two Pods on a Node whose `podCIDRs` give them an IPv4 and
//!   an IPv6 address: an IPv4 and an IPv6 slice; `v6`: IPv6 only over the same Pods: an IPv6
//!   slice (the test apiserver serves both families);
//! - then a `web` Pod turns unready (and an address of `ext`), another is deleted, and `web`
//!   and `ext`'s Endpoints get labels of their own;
//! - then another manager marks a ready `web` Pod not ready in its slice, and a ready
//!   address of `ext` in its mirrored slice: both are listed ready again (the controllers
//!   are keyed by others' writes to their slices, not by their own).
//!
//! Under Switchyard alone, `ext`'s mirrored slice is then relabelled as another manager's:
//! it is mirrored into a new slice. kube-controller-manager's mirroring controller, keyed
//! the same, stops there: its tracker still holds the relabelled slice, so every sync of
//! `ext` finds its cache stale, until it restarts.
//!
//! The handover: kube-controller-manager's slices and Endpoints, read by Switchyard when it
//! starts, are left as they are (no write), and throughout every `web` endpoint stays
//! listed.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use serde_json::json;
use switchyard_k8s::{
    Api, Client, ListParams, Pod, PostParams,
    k8s_openapi::api::{
        core::v1::{Endpoints, Event, Node, Service},
        discovery::v1::EndpointSlice,
    },
    kube::api::{DeleteParams, Patch, PatchParams},
};
use switchyard_reconciler_core::{
    endpoints::OVER_CAPACITY_ANNOTATION,
    endpointslice::{MANAGED_BY_LABEL, SERVICE_NAME_LABEL, ZONE_LABEL, topology},
};
use switchyard_testenv::{ControlPlane, TestNamespace};

use support::WITHIN;

/// Held by each test for its whole run: the controllers one starts act on every namespace.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The Node of the script's Pods, in a zone.
const NODE: &str = "endpointslice-zone-a";
/// The Node of `dual`'s Pods: they get an address of each family.
const DUAL_NODE: &str = "endpointslice-dual";
/// Pods of `big`.
const BIG: usize = 1010;

/// One endpoint as compared: its slice's address type, the Pod's name, how many addresses,
/// ready, serving, terminating, Node, zone, hostname, zone hints.
type CanonicalEndpoint = (
    String,
    String,
    usize,
    Option<bool>,
    Option<bool>,
    Option<bool>,
    Option<String>,
    Option<String>,
    Option<String>,
    Vec<String>,
);

/// One slice as compared, without its endpoints: address type, ports (name, port,
/// protocol), labels, and its owner (kind, name, controller, blockOwnerDeletion).
type SliceShape = (
    String,
    BTreeSet<(Option<String>, Option<i32>, Option<String>)>,
    BTreeMap<String, String>,
    Vec<(String, String, Option<bool>, Option<bool>)>,
);

/// A Service's slices, canonically, and its Endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Slices {
    shapes: BTreeSet<SliceShape>,
    endpoints: BTreeSet<CanonicalEndpoint>,
    /// The number of slices, and the most endpoints in one.
    count: usize,
    fullest: usize,
    legacy: Option<Legacy>,
    /// Ready endpoints hinted for each zone.
    hinted: BTreeMap<String, usize>,
}

/// A Service's `v1/Endpoints`: its labels, each subset's ports (name, port) with the Pods
/// behind its addresses (ready or not) when the Service has fewer than 1,000, otherwise how
/// many of each; whether it says it was truncated.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Legacy {
    labels: BTreeMap<String, String>,
    subsets: BTreeSet<(Ports, BTreeSet<(String, bool)>)>,
    counts: (usize, usize),
    truncated: bool,
}

/// A subset's ports: name and number.
type Ports = BTreeSet<(Option<String>, i32)>;

type Snapshot = BTreeMap<String, Slices>;

async fn snapshot(client: &Client, namespace: &str) -> Snapshot {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let listed = api
        .list(&ListParams::default().labels(MANAGED_BY_LABEL))
        .await
        .unwrap()
        .items;
    let mut out: Snapshot = BTreeMap::new();
    for slice in listed {
        let labels = slice.metadata.labels.clone().unwrap_or_default();
        // Mirrored slices apart from the Service's own.
        let service = match labels[MANAGED_BY_LABEL].as_str() {
            "endpointslice-controller.k8s.io" => labels[SERVICE_NAME_LABEL].clone(),
            other => format!("{other}: {}", labels[SERVICE_NAME_LABEL]),
        };
        let shape: SliceShape = (
            slice.address_type.clone(),
            slice
                .ports
                .iter()
                .flatten()
                .map(|p| (p.name.clone(), p.port, p.protocol.clone()))
                .collect(),
            labels,
            slice
                .metadata
                .owner_references
                .iter()
                .flatten()
                .map(|o| {
                    (
                        o.kind.clone(),
                        o.name.clone(),
                        o.controller,
                        o.block_owner_deletion,
                    )
                })
                .collect(),
        );
        let by_counts = service == "auto";
        let entry = out.entry(service).or_insert_with(empty);
        entry.shapes.insert(shape);
        entry.count += 1;
        entry.fullest = entry.fullest.max(slice.endpoints.len());
        for e in &slice.endpoints {
            let c = e.conditions.clone().unwrap_or_default();
            let hints: Vec<String> = e
                .hints
                .as_ref()
                .and_then(|h| h.for_zones.clone())
                .unwrap_or_default()
                .into_iter()
                .map(|z| z.name)
                .collect();
            if c.ready == Some(true) {
                for zone in &hints {
                    *entry.hinted.entry(zone.clone()).or_default() += 1;
                }
            }
            // Which of `auto`'s endpoints a zone gives away is chance under
            // kube-controller-manager: its hints are compared as counts.
            let hints = if by_counts { Vec::new() } else { hints };
            entry.endpoints.insert((
                slice.address_type.clone(),
                e.target_ref
                    .as_ref()
                    .and_then(|t| t.name.clone())
                    .unwrap_or_else(|| e.addresses.join(",")),
                e.addresses.len(),
                c.ready,
                c.serving,
                c.terminating,
                e.node_name.clone(),
                e.zone.clone(),
                e.hostname.clone(),
                hints,
            ));
        }
    }
    let legacy = Api::<Endpoints>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    for endpoints in legacy {
        let subsets = endpoints.subsets.clone().unwrap_or_default();
        let addresses = |s: &switchyard_k8s::k8s_openapi::api::core::v1::EndpointSubset| {
            let ready = s.addresses.iter().flatten().map(|a| (a, true));
            let not_ready = s.not_ready_addresses.iter().flatten().map(|a| (a, false));
            ready
                .chain(not_ready)
                .map(|(a, r)| {
                    let pod = a.target_ref.as_ref().and_then(|t| t.name.clone());
                    (pod.unwrap_or_else(|| a.ip.clone()), r)
                })
                .collect::<BTreeSet<_>>()
        };
        let counts = subsets.iter().fold((0, 0), |(r, n), s| {
            (
                r + s.addresses.as_ref().map_or(0, Vec::len),
                n + s.not_ready_addresses.as_ref().map_or(0, Vec::len),
            )
        });
        let listed = counts.0 + counts.1 < 1000;
        let entry = out
            .entry(endpoints.metadata.name.clone().unwrap())
            .or_insert_with(empty);
        entry.legacy = Some(Legacy {
            labels: endpoints.metadata.labels.clone().unwrap_or_default(),
            subsets: subsets
                .iter()
                .map(|s| {
                    (
                        s.ports
                            .iter()
                            .flatten()
                            .map(|p| (p.name.clone(), p.port))
                            .collect(),
                        if listed {
                            addresses(s)
                        } else {
                            BTreeSet::new()
                        },
                    )
                })
                .collect(),
            counts,
            truncated: endpoints
                .metadata
                .annotations
                .is_some_and(|a| a.contains_key(OVER_CAPACITY_ANNOTATION)),
        });
    }
    out
}

fn empty() -> Slices {
    Slices {
        shapes: BTreeSet::new(),
        endpoints: BTreeSet::new(),
        count: 0,
        fullest: 0,
        legacy: None,
        hinted: BTreeMap::new(),
    }
}

/// The Pods listed in the Service's Endpoints, ready or not.
fn legacy_of(snapshot: &Snapshot, service: &str) -> BTreeSet<(String, bool)> {
    snapshot
        .get(service)
        .and_then(|s| s.legacy.as_ref())
        .map(|l| l.subsets.iter().flat_map(|(_, a)| a.clone()).collect())
        .unwrap_or_default()
}

/// The snapshot once `done` holds of it and two reads a second apart agree.
async fn settled(
    client: &Client,
    namespace: &str,
    what: &str,
    done: impl Fn(&Snapshot) -> bool,
) -> Snapshot {
    let deadline = Instant::now() + WITHIN * 2;
    let mut last = None;
    loop {
        let now = snapshot(client, namespace).await;
        if done(&now) && last.as_ref() == Some(&now) {
            return now;
        }
        assert!(Instant::now() < deadline, "{what}: not settled: {now:#?}");
        last = Some(now);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn ready_of(snapshot: &Snapshot, service: &str) -> Vec<(String, Option<bool>)> {
    snapshot
        .get(service)
        .map(|s| s.endpoints.iter().map(|e| (e.1.clone(), e.3)).collect())
        .unwrap_or_default()
}

fn service(name: &str, spec: serde_json::Value) -> Service {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

fn pod(name: &str, app: &str, node: &str, extra: serde_json::Value) -> Pod {
    let mut spec = json!({
        "nodeName": node,
        "containers": [{"name": "c", "image": "registry.example/web:1",
                        "ports": [{"name": "http", "containerPort": 8080}]}],
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": spec,
    }))
    .unwrap()
}

/// Endpoints written by hand for the Service `ext`, with `labels`.
fn external(labels: serde_json::Value, ready: &[&str], not_ready: &[&str]) -> Endpoints {
    let addresses = |ips: &[&str]| ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>();
    serde_json::from_value(json!({
        "metadata": {"name": "ext", "labels": labels},
        "subsets": [{
            "addresses": addresses(ready),
            "notReadyAddresses": addresses(not_ready),
            "ports": [{"name": "http", "port": 8443}],
        }],
    }))
    .unwrap()
}

const MIRRORED: &str = "endpointslicemirroring-controller.k8s.io: ext";

/// What the script saw at each step.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    steps: Vec<Snapshot>,
    /// `auto` has the Event saying topology-aware hints are on.
    hints_on: bool,
}

async fn scenario(client: &Client, namespace: &str) -> Outcome {
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let http = json!([{"name": "http", "port": 80, "targetPort": "http"}]);
    for svc in [
        service("web", json!({"selector": {"app": "web"}, "ports": http})),
        service(
            "metrics",
            json!({"selector": {"app": "web"}, "ports": [{"name": "metrics", "port": 9090, "targetPort": "metrics"}]}),
        ),
        service(
            "nothing",
            json!({"selector": {"app": "nothing"}, "ports": http}),
        ),
        service(
            "db",
            json!({"selector": {"app": "db"}, "clusterIP": "None", "ports": http}),
        ),
        service(
            "close",
            json!({"selector": {"app": "web"}, "ports": http, "trafficDistribution": "PreferClose"}),
        ),
        service("big", json!({"selector": {"app": "big"}, "ports": http})),
        serde_json::from_value(json!({
            "metadata": {"name": "auto", "annotations": {"service.kubernetes.io/topology-mode": "Auto"}},
            "spec": {"selector": {"app": "web"}, "ports": http},
        }))
        .unwrap(),
        service(
            "dual",
            json!({"selector": {"app": "dual"}, "ports": http, "ipFamilyPolicy": "RequireDualStack"}),
        ),
        service(
            "v6",
            json!({"selector": {"app": "dual"}, "ports": http, "ipFamilies": ["IPv6"]}),
        ),
    ] {
        services.create(&PostParams::default(), &svc).await.unwrap();
    }
    // Without a selector: its Endpoints written by hand, mirrored into slices.
    services
        .create(
            &PostParams::default(),
            &service("ext", json!({"ports": [{"name": "http", "port": 80}]})),
        )
        .await
        .unwrap();
    let manual: Api<Endpoints> = Api::namespaced(client.clone(), namespace);
    manual
        .create(
            &PostParams::default(),
            &external(
                json!({"app": "ext"}),
                &["192.0.2.1", "192.0.2.2"],
                &["192.0.2.3"],
            ),
        )
        .await
        .unwrap();
    let mut made: Vec<Pod> = (0..6)
        .map(|i| pod(&format!("web-{i}"), "web", NODE, json!({})))
        .collect();
    // Scheduled nowhere kwok plays: never gets an IP.
    made.push(pod("web-nowhere", "web", "no-such-node", json!({})));
    made.extend((0..2).map(|i| {
        pod(
            &format!("db-{i}"),
            "db",
            NODE,
            json!({"hostname": format!("db-{i}"), "subdomain": "db"}),
        )
    }));
    made.extend((0..2).map(|i| pod(&format!("dual-{i}"), "dual", DUAL_NODE, json!({}))));
    made.extend((0..BIG).map(|i| pod(&format!("big-{i:04}"), "big", NODE, json!({}))));
    stream::iter(made)
        .for_each_concurrent(32, |p| {
            let pods = pods.clone();
            async move {
                pods.create(&PostParams::default(), &p).await.unwrap();
            }
        })
        .await;

    let all_ready = |s: &Snapshot, service: &str, n: usize| {
        let ready = ready_of(s, service);
        ready.len() == n && ready.iter().all(|(_, r)| *r == Some(true))
    };
    let legacy_ready = |s: &Snapshot, service: &str, n: usize| {
        let listed = legacy_of(s, service);
        listed.len() == n && listed.iter().all(|(_, r)| *r)
    };
    let first = settled(client, namespace, "created", |s| {
        all_ready(s, "web", 6)
            && all_ready(s, "metrics", 6)
            && all_ready(s, "close", 6)
            && all_ready(s, "auto", 6)
            && all_ready(s, "db", 2)
            && all_ready(s, "big", BIG)
            && all_ready(s, "dual", 4)
            && all_ready(s, "v6", 2)
            && s.contains_key("nothing")
            && legacy_ready(s, "web", 6)
            && legacy_ready(s, "db", 2)
            && s["big"]
                .legacy
                .as_ref()
                .is_some_and(|l| l.counts == (1000, 0))
    })
    .await;

    // web-1 turns unready; so does an address of ext.
    let mut ext = manual.get("ext").await.unwrap();
    let fresh = external(
        json!({"app": "ext"}),
        &["192.0.2.1"],
        &["192.0.2.2", "192.0.2.3"],
    );
    ext.subsets = fresh.subsets;
    manual
        .replace("ext", &PostParams::default(), &ext)
        .await
        .unwrap();
    pods.patch_status(
        "web-1",
        &PatchParams::default(),
        &Patch::Strategic(
            json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
        ),
    )
    .await
    .unwrap();
    let unready = settled(client, namespace, "web-1 unready", |s| {
        ready_of(s, "web").contains(&("web-1".to_owned(), Some(false)))
            && ready_of(s, "close").contains(&("web-1".to_owned(), Some(false)))
            && ready_of(s, "auto").contains(&("web-1".to_owned(), Some(false)))
            && legacy_of(s, "web").contains(&("web-1".to_owned(), false))
            && ready_of(s, MIRRORED).contains(&("192.0.2.2".to_owned(), Some(false)))
    })
    .await;

    // web-2 deleted; web gets a label of its own, and ext's Endpoints another.
    manual
        .patch(
            "ext",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "edge"}}})),
        )
        .await
        .unwrap();
    pods.delete("web-2", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "payments"}}})),
        )
        .await
        .unwrap();
    let later = settled(client, namespace, "web-2 gone, web labelled", |s| {
        ready_of(s, "web").len() == 5
            && ready_of(s, "close").len() == 5
            && ready_of(s, "auto").len() == 5
            && s["web"]
                .shapes
                .iter()
                .all(|shape| shape.2.contains_key("team"))
    })
    .await;

    // Another manager's hand: web-3 marked not ready in web's slice, and 192.0.2.1 in ext's
    // mirrored slice. Each controller writes its slice back.
    let by_hand = |service: &str, manager: &str, address: &str| {
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
        let selector = format!("{SERVICE_NAME_LABEL}={service},{MANAGED_BY_LABEL}={manager}");
        let address = address.to_owned();
        async move {
            let named = |e: &switchyard_k8s::k8s_openapi::api::discovery::v1::Endpoint| {
                e.target_ref.as_ref().and_then(|t| t.name.as_deref()) == Some(address.as_str())
                    || e.addresses.contains(&address)
            };
            let mut edited = slices
                .list(&ListParams::default().labels(&selector))
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|slice| slice.endpoints.iter().any(named))
                .unwrap();
            for endpoint in edited.endpoints.iter_mut().filter(|e| named(e)) {
                endpoint.conditions.get_or_insert_default().ready = Some(false);
            }
            let name = edited.metadata.name.clone().unwrap();
            let params = PostParams {
                field_manager: Some("by-hand".into()),
                ..PostParams::default()
            };
            slices.replace(&name, &params, &edited).await.unwrap();
        }
    };
    by_hand("web", "endpointslice-controller.k8s.io", "web-3").await;
    by_hand(
        "ext",
        "endpointslicemirroring-controller.k8s.io",
        "192.0.2.1",
    )
    .await;
    let restored = settled(client, namespace, "written back", |s| {
        ready_of(s, "web").contains(&("web-3".to_owned(), Some(true)))
            && ready_of(s, MIRRORED).contains(&("192.0.2.1".to_owned(), Some(true)))
    })
    .await;

    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + Duration::from_secs(10);
    let hints_on = loop {
        let on = events
            .list(&ListParams::default().fields("involvedObject.name=auto"))
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some(topology::ENABLED));
        if on || Instant::now() >= deadline {
            break on;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    Outcome {
        steps: vec![first, unready, later, restored],
        hints_on,
    }
}

/// The slices of `namespace` by name and resourceVersion.
async fn versions(client: &Client, namespace: &str) -> BTreeMap<String, String> {
    Api::<EndpointSlice>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| {
            (
                s.metadata.name.unwrap(),
                s.metadata.resource_version.unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_end_in_the_same_slices_and_endpoints_as_under_kube_controller_manager() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    // The control plane's own Nodes in zones, so that every ready Node has one (as
    // topology-aware hints need): the first in zone-a, the others in zone-b. With the two
    // below, zone-a has 60% of the CPU.
    let nodes: Api<Node> = Api::all(client.clone());
    for (i, node) in nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .enumerate()
    {
        let zone = if i == 0 { "zone-a" } else { "zone-b" };
        nodes
            .patch(
                node.metadata.name.as_deref().unwrap(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {ZONE_LABEL: zone}}})),
            )
            .await
            .unwrap();
    }
    support::kwok_node(
        &client,
        NODE,
        json!({"topology.kubernetes.io/zone": "zone-a"}),
        json!({}),
    )
    .await;
    support::kwok_node(
        &client,
        DUAL_NODE,
        json!({"topology.kubernetes.io/zone": "zone-a"}),
        json!({"podCIDR": "10.246.0.0/24", "podCIDRs": ["10.246.0.0/24", "fd00:10:246::/64"]}),
    )
    .await;

    let kcm = plane
        .start_controller_manager(
            &[
                "endpointslice-controller",
                "endpoints-controller",
                "endpointslice-mirroring-controller",
            ],
            &[],
        )
        .await
        .expect("kube-controller-manager starts");
    let under_kcm_ns = TestNamespace::create(plane, &client, "es-kcm")
        .await
        .unwrap();
    let under_kcm = scenario(&client, under_kcm_ns.name()).await;
    let before = versions(&client, under_kcm_ns.name()).await;
    drop(kcm);

    // The handover: Switchyard starts over kube-controller-manager's slices while a reader
    // watches web's endpoints.
    let web: Api<EndpointSlice> = Api::namespaced(client.clone(), under_kcm_ns.name());
    let reading = tokio::spawn(async move {
        let mut least = usize::MAX;
        let until = Instant::now() + Duration::from_secs(8);
        while Instant::now() < until {
            let listed: usize = web
                .list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}=web")))
                .await
                .unwrap()
                .items
                .iter()
                .map(|s| s.endpoints.len())
                .sum();
            least = least.min(listed);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        least
    });
    let names = [
        switchyard_reconciler::endpointslice::NAME,
        switchyard_reconciler::endpoints::NAME,
        switchyard_reconciler::mirroring::NAME,
    ];
    let switchyard = support::Builtins::start(plane, &names).await;
    assert_eq!(
        reading.await.unwrap(),
        5,
        "web's endpoints throughout the handover"
    );
    // Every Service of the namespace reconciled by then by both (and the cluster's own).
    for name in names {
        let reconciled =
            format!(r#"switchyard_reconcile_total{{controller="{name}",result="success"}}"#);
        let deadline = Instant::now() + WITHIN;
        while switchyard.reconciler.metric(&reconciled).await < 6.0 {
            assert!(
                Instant::now() < deadline,
                "{name}: the Services were not reconciled"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert_eq!(
        versions(&client, under_kcm_ns.name()).await,
        before,
        "kube-controller-manager's slices or Endpoints rewritten at the handover"
    );

    let under_switchyard_ns = TestNamespace::create(plane, &client, "es-sy")
        .await
        .unwrap();
    let under_switchyard = scenario(&client, under_switchyard_ns.name()).await;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), under_switchyard_ns.name());
    let mut taken = slices
        .list(&ListParams::default().labels(&format!(
            "{SERVICE_NAME_LABEL}=ext,{MANAGED_BY_LABEL}=endpointslicemirroring-controller.k8s.io"
        )))
        .await
        .unwrap()
        .items
        .remove(0);
    taken
        .metadata
        .labels
        .get_or_insert_default()
        .insert(MANAGED_BY_LABEL.into(), "someone-else".into());
    let name = taken.metadata.name.clone().unwrap();
    slices
        .replace(&name, &PostParams::default(), &taken)
        .await
        .unwrap();
    let remirrored = settled(
        &client,
        under_switchyard_ns.name(),
        "ext mirrored again",
        |s| s.contains_key("someone-else: ext") && s.contains_key(MIRRORED),
    )
    .await;
    assert_eq!(
        remirrored[MIRRORED].endpoints,
        under_switchyard.steps.last().unwrap()[MIRRORED].endpoints
    );
    // A Pod change no endpoint reads (an annotation) keys no Service, as under
    // kube-controller-manager (`podEndpointsChanged`).
    let reconciles = async |controller: &str| {
        switchyard
            .reconciler
            .metric(&format!(
                r#"switchyard_reconcile_time_seconds_count{{controller="{controller}"}}"#
            ))
            .await
    };
    let counted = [
        switchyard_reconciler::endpointslice::NAME,
        switchyard_reconciler::endpoints::NAME,
    ];
    let count = async || {
        let mut all = Vec::new();
        for controller in counted {
            all.push(reconciles(controller).await);
        }
        all
    };
    // Quiet first: the relabelled slice above keys `ext` a second later.
    let (mut before, mut quiet_since) = (count().await, Instant::now());
    let deadline = Instant::now() + WITHIN;
    while quiet_since.elapsed() < Duration::from_secs(3) {
        assert!(Instant::now() < deadline, "{counted:?} never quiet");
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = count().await;
        if now != before {
            (before, quiet_since) = (now, Instant::now());
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), under_switchyard_ns.name());
    for pod in pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
    {
        pods.patch(
            pod.metadata.name.as_deref().unwrap(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"note": "read by no endpoint"}}})),
        )
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        count().await,
        before,
        "reconciles of {counted:?} after web's Pods were annotated"
    );
    let created = switchyard.requests("create", &["201"]).await;
    switchyard.stop().await;

    for (who, outcome) in [
        ("kube-controller-manager", &under_kcm),
        ("switchyard", &under_switchyard),
    ] {
        for (service, slices) in outcome.steps.last().unwrap() {
            if service != "big" {
                eprintln!("{who}: {service}: {slices:?}");
            }
        }
    }
    for outcome in [&under_kcm, &under_switchyard] {
        let big = &outcome.steps[0]["big"];
        assert!(
            big.fullest <= 100 && big.count >= BIG.div_ceil(100),
            "{big:?}"
        );
        let nothing = &outcome.steps[0]["nothing"];
        assert_eq!((nothing.count, nothing.endpoints.len()), (1, 0));
        let families = |service: &str| -> BTreeSet<String> {
            outcome.steps[0][service]
                .shapes
                .iter()
                .map(|s| s.0.clone())
                .collect()
        };
        assert_eq!(families("dual"), ["IPv4".into(), "IPv6".into()].into());
        assert_eq!(families("v6"), ["IPv6".into()].into());
        let legacy = big.legacy.as_ref().unwrap();
        assert!(legacy.truncated && legacy.counts == (1000, 0), "{legacy:?}");
        // zone-a over its share gives endpoints to zone-b.
        let hinted: Vec<_> = outcome
            .steps
            .iter()
            .map(|s| s["auto"].hinted.clone())
            .collect();
        let zones = |a: usize, b: usize| {
            BTreeMap::from([("zone-a".to_owned(), a), ("zone-b".to_owned(), b)])
        };
        assert_eq!(hinted, [zones(4, 2), zones(3, 2), zones(2, 2), zones(2, 2)]);
        assert!(outcome.hints_on);
    }
    // How many slices `big` took depends on how its Pods came in over the syncs; the rest
    // is compared whole.
    let without_big_count = |o: &Outcome| -> Vec<Snapshot> {
        o.steps
            .iter()
            .map(|s| {
                let mut s = s.clone();
                let big = s.get_mut("big").unwrap();
                (big.count, big.fullest) = (0, 0);
                s
            })
            .collect()
    };
    assert_eq!(
        without_big_count(&under_switchyard),
        without_big_count(&under_kcm)
    );
    // The slices were this reconciler's: it was the only controller running.
    assert!(created >= 6.0, "the reconciler created {created} objects");
}
