#![allow(clippy::unwrap_used)]

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};
use serde_json::json;

use super::*;

fn ratios(zones: &[(&str, f64)]) -> BTreeMap<String, f64> {
    zones.iter().map(|(z, r)| ((*z).to_owned(), *r)).collect()
}

/// An endpoint in `zone` (none for ""), ready or not, hinted for `hint` if given.
fn endpoint(ip: &str, zone: &str, ready: bool, hint: Option<&str>) -> Endpoint {
    Endpoint {
        addresses: vec![ip.to_owned()],
        zone: (!zone.is_empty()).then(|| zone.to_owned()),
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            ..EndpointConditions::default()
        }),
        hints: hint.map(|h| zone_hint(h.to_owned())),
        ..Endpoint::default()
    }
}

fn slice(name: &str, endpoints: Vec<Endpoint>) -> EndpointSlice {
    EndpointSlice {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        address_type: "IPv4".to_owned(),
        endpoints,
        ports: None,
    }
}

/// The zone each endpoint of the slices is hinted for, by address.
fn hints(slices: &[EndpointSlice]) -> BTreeMap<String, Option<String>> {
    slices
        .iter()
        .flat_map(|s| &s.endpoints)
        .map(|e| {
            let zone = e
                .hints
                .as_ref()
                .and_then(|h| h.for_zones.as_ref())
                .map(|z| {
                    z.iter()
                        .map(|z| z.name.clone())
                        .collect::<Vec<_>>()
                        .join(",")
                });
            (e.addresses[0].clone(), zone)
        })
        .collect()
}

/// A slice of `n` ready endpoints in `zone`, without hints.
fn ready_in(zone: &str, n: usize) -> EndpointSlice {
    slice(
        "s1",
        (1..=n)
            .map(|i| endpoint(&format!("10.0.0.{i}"), zone, true, None))
            .collect(),
    )
}

/// How many endpoints of the slices are hinted for each zone (every one is hinted).
fn hinted_per_zone(slices: &[EndpointSlice]) -> BTreeMap<String, usize> {
    let mut per_zone = BTreeMap::new();
    for zone in hints(slices).into_values() {
        *per_zone.entry(zone.expect("hinted")).or_default() += 1;
    }
    per_zone
}

struct Run {
    create: Vec<EndpointSlice>,
    update: Vec<EndpointSlice>,
    unchanged: Vec<EndpointSlice>,
    allotted: Allotted,
}

fn run(
    ratios: Option<&BTreeMap<String, f64>>,
    mut create: Vec<EndpointSlice>,
    mut update: Vec<EndpointSlice>,
    mut unchanged: Vec<EndpointSlice>,
    populated: bool,
) -> Run {
    let allotted = add_hints(
        ratios,
        Slices {
            create: &mut create,
            update: &mut update,
            unchanged: &mut unchanged,
        },
        "IPv4",
        populated,
    );
    Run {
        create,
        update,
        unchanged,
        allotted,
    }
}

fn node(name: &str, zone: Option<&str>, cpu: &str, ready: bool, labels: serde_json::Value) -> Node {
    let mut all = labels;
    if let Some(zone) = zone {
        all[ZONE_LABEL] = json!(zone);
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": all},
        "status": {
            "allocatable": {"cpu": cpu},
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        },
    }))
    .unwrap()
}

#[test]
fn quantities_read_in_thousandths_rounded_up() {
    for (quantity, millis) in [
        ("32", Some(32_000)),
        ("250m", Some(250)),
        ("1.5", Some(1_500)),
        ("0.0001", Some(1)),
        ("1k", Some(1_000_000)),
        ("1Ki", Some(1_024_000)),
        ("1e3", Some(1_000_000)),
        ("+2", Some(2_000)),
        ("", None),
        ("x", None),
        ("-1", None),
        ("1q", None),
    ] {
        assert_eq!(milli_value(quantity), millis, "{quantity:?}");
    }
}

#[test]
fn zones_get_their_share_of_the_ready_nodes_cpu() {
    let none = json!({});
    let nodes = [
        node("a1", Some("zone-a"), "4", true, none.clone()),
        node("b1", Some("zone-b"), "8", true, none.clone()),
        node("b2", Some("zone-b"), "4000m", true, none.clone()),
        // Not counted: not ready, or a control-plane Node (even without a zone).
        node("c1", Some("zone-c"), "64", false, none.clone()),
        node(
            "cp",
            None,
            "64",
            true,
            json!({"node-role.kubernetes.io/control-plane": ""}),
        ),
    ];
    assert_eq!(
        zone_ratios(&nodes),
        Some(ratios(&[("zone-a", 0.25), ("zone-b", 0.75)]))
    );
    // A ready Node without a zone, or without CPU, and nothing can be allotted.
    let mut without_zone = nodes.to_vec();
    without_zone.push(node("x", None, "4", true, none.clone()));
    assert_eq!(zone_ratios(&without_zone), None);
    let mut without_cpu = nodes.to_vec();
    without_cpu.push(node("y", Some("zone-a"), "0", true, none.clone()));
    assert_eq!(zone_ratios(&without_cpu), None);
    // One zone is not enough.
    assert_eq!(zone_ratios(&nodes[..1]), None);
}

#[test]
fn each_ready_endpoint_is_hinted_for_its_zone_and_enabling_is_told_once() {
    let shares = ratios(&[("zone-a", 0.5), ("zone-b", 0.5)]);
    let create = vec![slice(
        "s1",
        vec![
            endpoint("10.0.0.1", "zone-a", true, None),
            endpoint("10.0.0.2", "zone-a", true, None),
            endpoint("10.0.0.3", "zone-b", true, None),
            endpoint("10.0.0.4", "zone-b", true, None),
            endpoint("10.0.0.5", "zone-b", false, None),
        ],
    )];
    let first = run(Some(&shares), create.clone(), vec![], vec![], false);
    assert_eq!(
        hints(&first.create),
        [
            ("10.0.0.1", Some("zone-a")),
            ("10.0.0.2", Some("zone-a")),
            ("10.0.0.3", Some("zone-b")),
            ("10.0.0.4", Some("zone-b")),
            ("10.0.0.5", None),
        ]
        .into_iter()
        .map(|(a, z)| (a.to_owned(), z.map(str::to_owned)))
        .collect()
    );
    assert_eq!(
        first.allotted,
        Allotted {
            populated: true,
            events: vec![Event::normal(
                ENABLED,
                "Topology Aware Hints has been enabled, addressType: IPv4"
            )],
        }
    );
    let again = run(Some(&shares), create, vec![], vec![], true);
    assert!(again.allotted.populated && again.allotted.events.is_empty());
}

#[test]
fn a_zone_over_its_share_gives_endpoints_to_one_under_it() {
    // Four endpoints in zone-a, none in zone-b, equal CPU: two are hinted for zone-b.
    let shares = ratios(&[("zone-a", 0.5), ("zone-b", 0.5)]);
    let update = vec![ready_in("zone-a", 4)];
    let out = run(Some(&shares), vec![], update, vec![], false);
    let by_zone = hinted_per_zone(&out.update);
    assert_eq!(
        by_zone,
        [("zone-a".to_owned(), 2), ("zone-b".to_owned(), 2)].into()
    );
    // Three zones, CPU 30/40/30, ten endpoints all in zone-b: shares of 3, 4, 3.
    let shares = ratios(&[("zone-a", 0.3), ("zone-b", 0.4), ("zone-c", 0.3)]);
    let update = vec![ready_in("zone-b", 10)];
    let out = run(Some(&shares), vec![], update, vec![], false);
    let by_zone = hinted_per_zone(&out.update);
    assert_eq!(
        by_zone,
        [
            ("zone-a".to_owned(), 3),
            ("zone-b".to_owned(), 4),
            ("zone-c".to_owned(), 3)
        ]
        .into()
    );
}

#[test]
fn unchanged_slices_keep_hints_that_fit_and_lose_those_that_do_not() {
    let shares = ratios(&[("zone-a", 0.5), ("zone-b", 0.5)]);
    let fits = slice(
        "fits",
        vec![
            endpoint("10.0.0.1", "zone-a", true, Some("zone-a")),
            endpoint("10.0.0.2", "zone-b", true, Some("zone-b")),
        ],
    );
    let unhinted = slice("unhinted", vec![endpoint("10.0.0.3", "zone-a", true, None)]);
    let gone_zone = slice(
        "gone-zone",
        vec![endpoint("10.0.0.4", "zone-b", true, Some("zone-x"))],
    );
    let out = run(
        Some(&shares),
        vec![],
        vec![],
        vec![fits.clone(), unhinted, gone_zone],
        true,
    );
    assert_eq!(out.unchanged, vec![fits]);
    let rewritten: Vec<_> = out
        .update
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(rewritten, ["unhinted", "gone-zone"]);
    assert_eq!(hints(&out.update)["10.0.0.3"].as_deref(), Some("zone-a"));
    assert_eq!(hints(&out.update)["10.0.0.4"].as_deref(), Some("zone-b"));
}

#[test]
fn hints_are_removed_with_a_warning_when_they_cannot_be_allotted() {
    let hinted = slice(
        "hinted",
        vec![endpoint("10.0.0.1", "zone-a", true, Some("zone-a"))],
    );
    let warning = |message: &str| Event::warning(DISABLED, format!("{message}, addressType: IPv4"));
    let two = ratios(&[("zone-a", 0.5), ("zone-b", 0.5)]);
    for (ratios, endpoints, message) in [
        // What the Nodes say is not enough.
        (
            None,
            vec![endpoint("10.0.0.2", "zone-a", true, None)],
            INSUFFICIENT_NODE_INFO.to_owned(),
        ),
        // Fewer ready endpoints than zones.
        (
            Some(&two),
            vec![endpoint("10.0.0.2", "zone-a", false, None)],
            format!("{INSUFFICIENT_ENDPOINTS} (1 endpoints, 2 zones)"),
        ),
        // A ready endpoint without a zone.
        (
            Some(&two),
            vec![endpoint("10.0.0.2", "", true, None)],
            NO_ZONE_SPECIFIED.to_owned(),
        ),
    ] {
        let out = run(
            ratios,
            vec![slice("new", endpoints)],
            vec![],
            vec![hinted.clone()],
            true,
        );
        assert_eq!(
            out.allotted,
            Allotted {
                populated: false,
                events: vec![warning(&message)],
            }
        );
        assert!(out.unchanged.is_empty());
        assert!(
            hints(&out.create)
                .values()
                .chain(hints(&out.update).values())
                .all(Option::is_none),
            "{message}"
        );
        assert_eq!(
            out.update.len(),
            1,
            "the hinted slice rewritten without hints"
        );
    }
    // Each zone's minimum (its share over 1.2, rounded up) more than there are endpoints.
    let lopsided = ratios(&[("zone-a", 0.1), ("zone-b", 0.9)]);
    let out = run(
        Some(&lopsided),
        vec![slice(
            "new",
            vec![
                endpoint("10.0.0.1", "zone-a", true, None),
                endpoint("10.0.0.2", "zone-b", true, None),
            ],
        )],
        vec![],
        vec![],
        false,
    );
    assert_eq!(
        out.allotted.events,
        vec![warning(&format!(
            "{MIN_ALLOCATION_EXCEEDS} (2 endpoints, 2 zones)"
        ))]
    );
}

#[test]
fn the_annotation_turns_hints_on_the_deprecated_one_first() {
    let service = |annotations: serde_json::Value| -> Service {
        serde_json::from_value(json!({"metadata": {"name": "s", "annotations": annotations}}))
            .unwrap()
    };
    assert!(auto(&service(json!({TOPOLOGY_MODE_ANNOTATION: "Auto"}))));
    assert!(auto(&service(json!({DEPRECATED_ANNOTATION: "auto"}))));
    assert!(!auto(&service(
        json!({TOPOLOGY_MODE_ANNOTATION: "Disabled"})
    )));
    assert!(!auto(&service(
        json!({DEPRECATED_ANNOTATION: "disabled", TOPOLOGY_MODE_ANNOTATION: "Auto"})
    )));
    assert!(!auto(&service(json!({}))));
}
