use k8s_openapi::{
    api::{apps::v1::DaemonSet, core::v1::Pod},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::{SignedDuration, Timestamp},
};
use serde_json::json;

use super::*;

const UID: &str = "ds-uid";

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

fn daemon_set(extra: Value) -> DaemonSet {
    let mut value = json!({
        "metadata": {"name": "agent", "namespace": "ns", "uid": UID, "generation": 2},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "c", "image": "img:1"}]},
            },
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
        },
    });
    merge(&mut value, extra);
    serde_json::from_value(value).unwrap()
}

fn node(name: &str, labels: Value, taints: Value) -> placement::Node {
    placement::Node::from_json(&json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
    }))
}

fn nodes(count: usize) -> Vec<placement::Node> {
    (0..count)
        .map(|i| node(&format!("n{i}"), json!({}), json!([])))
        .collect()
}

/// A Pod of the DaemonSet on `node`, at `hash`, created `age` seconds ago, Running and Ready
/// since then when `ready`.
fn pod(spec: &Spec<'_>, node: &str, hash: &str, age: i64, ready: bool) -> Pod {
    let mut pod = new_pod(spec, node, hash);
    let created = now() - SignedDuration::from_secs(age);
    pod.metadata.name = Some(format!("agent-{node}-{hash}-{age}"));
    pod.metadata.creation_timestamp = Some(Time(created));
    pod.spec.as_mut().unwrap().node_name = Some(node.to_owned());
    pod.status = Some(
        serde_json::from_value(json!({
            "phase": "Running",
            "conditions": [{
                "type": "Ready",
                "status": if ready { "True" } else { "False" },
                "lastTransitionTime": Time(created),
            }],
        }))
        .unwrap(),
    );
    pod
}

fn with_phase(mut pod: Pod, phase: &str) -> Pod {
    pod.status.as_mut().unwrap().phase = Some(phase.to_owned());
    pod
}

fn index(pods: &[Pod]) -> BTreeMap<String, Vec<&Pod>> {
    let owned: Vec<&Pod> = pods.iter().collect();
    by_node(&owned, false)
}

#[test]
fn an_empty_selector_selects_all_and_is_refused() {
    let ds = daemon_set(json!({"spec": {"selector": {"matchLabels": null}}}));
    assert_eq!(Spec::new(&ds).unwrap_err(), SpecError::SelectingAll);
}

#[test]
fn a_new_pod_is_pinned_to_its_node_and_tolerates_node_conditions() {
    let ds = daemon_set(json!({
        "metadata": {"annotations": {TEMPLATE_GENERATION_ANNOTATION: "4"}},
        "spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
            ]}
        }}}}}
    }));
    let spec = Spec::new(&ds).unwrap();
    let pod = new_pod(&spec, "n7", "h1");
    assert_eq!(pod.metadata.generate_name.as_deref(), Some("agent-"));
    let labels = pod.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[HASH_LABEL], "h1");
    assert_eq!(labels[TEMPLATE_GENERATION_LABEL], "4");
    assert_eq!(target_node(&pod), Some("n7"));
    let terms = &pod
        .spec
        .as_ref()
        .unwrap()
        .affinity
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()
        .node_selector_terms;
    // The user's terms give way to the Node's name: the controller chose the Node already.
    assert_eq!(terms.len(), 1);
    assert!(terms[0].match_expressions.is_none());
    let tolerations = pod.spec.as_ref().unwrap().tolerations.as_ref().unwrap();
    assert_eq!(tolerations.len(), 6);
    assert!(spec.is_updated(&pod, "h1"));
    assert!(
        spec.is_updated(&pod, "other"),
        "the template generation still counts"
    );
}

#[test]
fn manage_creates_on_fitting_nodes_and_deletes_where_pods_must_not_stay() {
    let ds =
        daemon_set(json!({"spec": {"template": {"spec": {"nodeSelector": {"role": "agent"}}}}}));
    let spec = Spec::new(&ds).unwrap();
    let all = vec![
        node("fits", json!({"role": "agent"}), json!([])),
        node("other", json!({}), json!([])),
        node(
            "evicting",
            json!({"role": "agent"}),
            json!([{"key": "k", "effect": "NoExecute"}]),
        ),
        node(
            "cordoned",
            json!({"role": "agent"}),
            json!([{"key": "k", "effect": "NoSchedule"}]),
        ),
        node("has-one", json!({"role": "agent"}), json!([])),
    ];
    let pods = vec![
        pod(&spec, "other", "h", 60, true),
        pod(&spec, "evicting", "h", 60, true),
        pod(&spec, "cordoned", "h", 60, true),
        pod(&spec, "has-one", "h", 60, true),
        pod(&spec, "has-one", "h", 30, true),
    ];
    let writes = manage(
        &spec,
        &all,
        &index(&pods),
        "h",
        &mut FailedPodBackoff::default(),
        now(),
    );
    assert_eq!(writes.create_on, ["fits"]);
    // Off its Node, under a NoExecute taint, and the younger of two; a NoSchedule taint
    // lets a Pod stay.
    let mut deleted = writes.delete.clone();
    deleted.sort();
    assert_eq!(
        deleted,
        [
            "agent-evicting-h-60",
            "agent-has-one-h-30",
            "agent-other-h-60"
        ]
    );
}

#[test]
fn an_unscheduled_pod_for_a_node_that_is_gone_is_deleted() {
    let ds = daemon_set(json!({}));
    let spec = Spec::new(&ds).unwrap();
    let mut orphan = pod(&spec, "gone", "h", 60, false);
    orphan.spec.as_mut().unwrap().node_name = None;
    let scheduled = pod(&spec, "gone-too", "h", 60, true);
    let pods = vec![orphan, scheduled];
    let writes = manage(
        &spec,
        &nodes(0),
        &index(&pods),
        "h",
        &mut FailedPodBackoff::default(),
        now(),
    );
    assert_eq!(writes.delete, ["agent-gone-h-60"]);
}

#[test]
fn failed_pods_are_deleted_with_a_backoff_per_node_and_succeeded_ones_at_once() {
    let ds = daemon_set(json!({}));
    let spec = Spec::new(&ds).unwrap();
    let pods = vec![
        with_phase(pod(&spec, "n0", "h", 60, false), "Failed"),
        with_phase(pod(&spec, "n1", "h", 60, false), "Succeeded"),
    ];
    let mut backoff = FailedPodBackoff::default();
    let writes = manage(&spec, &nodes(2), &index(&pods), "h", &mut backoff, now());
    let mut deleted = writes.delete.clone();
    deleted.sort();
    assert_eq!(deleted, ["agent-n0-h-60", "agent-n1-h-60"]);
    assert_eq!(
        writes
            .events
            .iter()
            .map(|e| (e.warning, e.reason))
            .collect::<Vec<_>>(),
        [(true, FAILED_DAEMON_POD), (false, SUCCEEDED_DAEMON_POD)]
    );
    // The replacement failed at once: its deletion waits the Node's delay, then twice that.
    let later = now() + SignedDuration::from_millis(500);
    let writes = manage(
        &spec,
        &nodes(1),
        &index(&pods[..1]),
        "h",
        &mut backoff,
        later,
    );
    assert!(writes.delete.is_empty());
    assert_eq!(writes.recheck_after, Some(Duration::from_millis(500)));
    let after = now() + SignedDuration::from_secs(1);
    let writes = manage(
        &spec,
        &nodes(1),
        &index(&pods[..1]),
        "h",
        &mut backoff,
        after,
    );
    assert_eq!(writes.delete, ["agent-n0-h-60"]);
    let soon = after + SignedDuration::from_millis(1500);
    assert_eq!(
        backoff.waiting(&FailedPodBackoff::key(&spec, "n0"), soon),
        Some(Duration::from_millis(500))
    );
}

#[test]
fn a_rolling_update_replaces_at_most_max_unavailable_at_a_time() {
    let ds = daemon_set(
        json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": "50%"}}}}),
    );
    let spec = Spec::new(&ds).unwrap();
    // Five Nodes (50% rounds up to 3): one already new and ready, one old and not ready,
    // three old and ready.
    let pods = vec![
        pod(&spec, "n0", "new", 60, true),
        pod(&spec, "n1", "old", 60, false),
        pod(&spec, "n2", "old", 60, true),
        pod(&spec, "n3", "old", 60, true),
        pod(&spec, "n4", "old", 60, true),
    ];
    let writes = rolling_update(&spec, &nodes(5), &index(&pods), "new", now()).unwrap();
    assert!(writes.create_on.is_empty());
    // The unready old one at once, and two more while the unavailable stay within 3.
    assert_eq!(
        writes.delete,
        ["agent-n1-old-60", "agent-n2-old-60", "agent-n3-old-60"]
    );
    // A Node without its Pod counts as unavailable.
    let writes = rolling_update(&spec, &nodes(6), &index(&pods), "new", now()).unwrap();
    assert_eq!(writes.delete, ["agent-n1-old-60", "agent-n2-old-60"]);
}

#[test]
fn a_surge_rolling_update_makes_new_pods_first_and_removes_old_ones_once_available() {
    let ds = daemon_set(json!({"spec": {
        "minReadySeconds": 30,
        "updateStrategy": {"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    }}));
    let spec = Spec::new(&ds).unwrap();
    let pods = vec![
        pod(&spec, "n0", "old", 600, true),
        pod(&spec, "n0", "new", 60, true),
        pod(&spec, "n1", "old", 600, true),
        pod(&spec, "n1", "new", 10, true),
        pod(&spec, "n2", "old", 600, true),
        pod(&spec, "n3", "old", 600, false),
    ];
    let writes = rolling_update(&spec, &nodes(4), &index(&pods), "new", now()).unwrap();
    // n0's new Pod is available (ready 60 s > 30 s): its old one goes. n1's is not yet: it
    // takes the one surge slot, so n2 waits. n3's old Pod is unavailable: replaced anyway.
    assert_eq!(writes.delete, ["agent-n0-old-600"]);
    assert_eq!(writes.create_on, ["n3"]);
    // The manage round keeps both Pods of n1 and deletes n0's old one too.
    let managed = manage(
        &spec,
        &nodes(4),
        &index(&pods),
        "new",
        &mut FailedPodBackoff::default(),
        now(),
    );
    assert_eq!(managed.delete, ["agent-n0-old-600"]);
    assert!(managed.create_on.is_empty());
    // n1's new Pod turns available after 30 s of readiness.
    assert_eq!(
        recheck_after(&spec, &index(&pods), now()),
        Some(Duration::from_millis(20_001))
    );
}

#[test]
fn without_surge_or_unavailability_one_pod_at_a_time_is_replaced() {
    let ds = daemon_set(
        json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": "0%"}}}}),
    );
    let spec = Spec::new(&ds).unwrap();
    let pods = vec![
        pod(&spec, "n0", "old", 60, true),
        pod(&spec, "n1", "old", 60, true),
    ];
    let writes = rolling_update(&spec, &nodes(2), &index(&pods), "new", now()).unwrap();
    assert_eq!(writes.delete, ["agent-n0-old-60"]);
}

#[test]
fn on_delete_changes_no_pod() {
    let ds = daemon_set(
        json!({"spec": {"updateStrategy": {"type": "OnDelete", "rollingUpdate": null}}}),
    );
    let spec = Spec::new(&ds).unwrap();
    assert_eq!(spec.strategy, Strategy::OnDelete);
    assert!(!spec.allows_surge());
}

#[test]
fn status_counts_the_oldest_pod_of_each_node() {
    let ds = daemon_set(json!({"spec": {"minReadySeconds": 120}}));
    let spec = Spec::new(&ds).unwrap();
    let all = vec![
        node("n0", json!({}), json!([])),
        node("n1", json!({}), json!([])),
        node("n2", json!({}), json!([])),
        node(
            "evicting",
            json!({}),
            json!([{"key": "k", "effect": "NoExecute"}]),
        ),
    ];
    let pods = vec![
        pod(&spec, "n0", "new", 600, true),
        pod(&spec, "n1", "old", 60, true),
        pod(&spec, "evicting", "new", 60, true),
    ];
    let status = status(&spec, &all, &index(&pods), "new", true, now());
    assert_eq!(status.desired_number_scheduled, 3);
    assert_eq!(status.current_number_scheduled, 2);
    assert_eq!(status.number_misscheduled, 1);
    assert_eq!(status.number_ready, 2);
    assert_eq!(status.number_available, Some(1));
    assert_eq!(status.number_unavailable, Some(2));
    assert_eq!(status.updated_number_scheduled, Some(1));
    assert_eq!(status.observed_generation, Some(2));
    assert!(status_changed(&ds, &status));
    let mut written = ds.clone();
    written.status = Some(status.clone());
    assert!(!status_changed(&written, &status));
}

#[test]
fn revisions_are_named_by_template_hash_and_old_ones_kept_while_pods_use_them() {
    let ds = daemon_set(json!({"spec": {"revisionHistoryLimit": 1}}));
    let spec = Spec::new(&ds).unwrap();
    let data = revision_data(&spec);
    let current = new_revision(&spec, &data, 4);
    let hash = template_hash(&spec);
    assert_eq!(
        current.metadata.name.as_deref(),
        Some(format!("agent-{hash}").as_str())
    );
    assert_eq!(revision_hash(&current), hash);
    let old_ds = daemon_set(
        json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "img:0"}]}}}}),
    );
    let old_spec = Spec::new(&old_ds).unwrap();
    let old = |n: i64| {
        let mut r = new_revision(&old_spec, &revision_data(&old_spec), n);
        r.metadata.name = Some(format!("old-{n}"));
        r.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(HASH_LABEL.into(), format!("h{n}"));
        r
    };
    let revisions = vec![old(1), old(2), old(3), current.clone()];
    let (now_, before) = split_revisions(&revisions, &data);
    assert_eq!(now_.len(), 1);
    assert_eq!(before.len(), 3);
    // Two past the limit: the oldest two, but a Pod still runs revision 1, so 2 and 3.
    let pods = [pod(&spec, "n0", "h1", 60, true)];
    let owned: Vec<&Pod> = pods.iter().collect();
    let doomed = to_clean_up(&spec, &before, &owned);
    let names: Vec<_> = doomed
        .iter()
        .map(|r| r.metadata.name.as_deref().unwrap())
        .collect();
    assert_eq!(names, ["old-2", "old-3"]);
    // Of two revisions holding the template, the higher one is kept.
    let mut twin = current.clone();
    twin.revision = 7;
    assert_eq!(keep_of(&[&current, &twin]).map(|r| r.revision), Some(7));
}

#[test]
fn pods_are_claimed_by_selector() {
    let ds = daemon_set(json!({}));
    let spec = Spec::new(&ds).unwrap();
    let mine = pod(&spec, "n0", "h", 60, true);
    let mut orphan = pod(&spec, "n1", "h", 60, true);
    orphan.metadata.owner_references = None;
    let mut relabelled = pod(&spec, "n2", "h", 60, true);
    relabelled.metadata.labels = Some(BTreeMap::from([("app".into(), "other".into())]));
    let mut deleting_orphan = orphan.clone();
    deleting_orphan.metadata.deletion_timestamp = Some(Time(now()));
    let pods = vec![mine, orphan, relabelled, deleting_orphan];
    let claim = claim(&spec, &pods);
    assert_eq!(claim.owned.len(), 1);
    assert_eq!(claim.adopt.len(), 1);
    assert_eq!(claim.release.len(), 1);
}
