use k8s_openapi::{
    api::core::v1::{ContainerStatus, PodCondition, PodSpec, PodStatus},
    jiff::ToSpan,
};
use serde_json::json;
use std::collections::BTreeMap;

use super::*;

const UID: &str = "rs-uid-1";

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn mk_rs(replicas: i32, min_ready_seconds: i32) -> ReplicaSet {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": UID, "generation": 4},
        "spec": {
            "replicas": replicas,
            "minReadySeconds": min_ready_seconds,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web", "tier": "front"}, "annotations": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "registry.example/web:1"}]}
            }
        }
    }))
    .unwrap()
}

/// A Pod of namespace `ns` with labels, optionally controlled by `owner_uid`.
struct PodBuilder(Pod);

fn mk_pod(name: &str, labels: &[(&str, &str)]) -> PodBuilder {
    PodBuilder(Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            creation_timestamp: Some(Time(at(0))),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec::default()),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            ..PodStatus::default()
        }),
    })
}

impl PodBuilder {
    fn owned_by(mut self, uid: &str) -> Self {
        self.0.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: "web".into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        self
    }
    fn created(mut self, seconds: i64) -> Self {
        self.0.metadata.creation_timestamp = Some(Time(at(seconds)));
        self
    }
    fn node(mut self, node: &str) -> Self {
        self.0.spec.as_mut().unwrap().node_name = Some(node.into());
        self
    }
    fn phase(mut self, phase: &str) -> Self {
        self.0.status.as_mut().unwrap().phase = Some(phase.into());
        self
    }
    fn ready_since(mut self, seconds: i64) -> Self {
        self.0.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            last_transition_time: Some(Time(at(seconds))),
            ..PodCondition::default()
        }]);
        self
    }
    fn restarts(mut self, count: i32) -> Self {
        self.0.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
            name: "c".into(),
            restart_count: count,
            ..ContainerStatus::default()
        }]);
        self
    }
    fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.into());
        self
    }
    fn deletion_cost(mut self, cost: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_DELETION_COST.into(), cost.into());
        self
    }
    fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = Some(Time(at(1)));
        self
    }
    fn build(self) -> Pod {
        self.0
    }
}

fn names(pods: &[&Pod]) -> Vec<String> {
    pods.iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect()
}

#[test]
fn claim_keeps_adopts_releases_and_ignores() {
    let rs = mk_rs(3, 0);
    let spec = Spec::new(&rs).unwrap();
    let pods = vec![
        mk_pod("owned", &[("app", "web")]).owned_by(UID).build(),
        mk_pod("orphan", &[("app", "web")]).build(),
        mk_pod("stopped-matching", &[("app", "db")])
            .owned_by(UID)
            .build(),
        mk_pod("others", &[("app", "web")])
            .owned_by("other")
            .build(),
        mk_pod("unrelated", &[("app", "db")]).build(),
        mk_pod("terminating", &[("app", "web")])
            .owned_by(UID)
            .deleting()
            .build(),
        mk_pod("finished", &[("app", "web")])
            .owned_by(UID)
            .phase("Succeeded")
            .build(),
        mk_pod("orphan-finished", &[("app", "web")])
            .phase("Failed")
            .build(),
        mk_pod("orphan-deleting", &[("app", "web")])
            .deleting()
            .build(),
    ];
    let claim = claim(&spec, &pods);
    assert_eq!(names(&claim.owned), ["owned"]);
    assert_eq!(names(&claim.adopt), ["orphan"]);
    assert_eq!(names(&claim.release), ["stopped-matching"]);
    assert_eq!(names(&claim.terminating), ["terminating"]);
}

#[test]
fn a_replicaset_being_deleted_neither_adopts_nor_releases_nor_scales() {
    let mut rs = mk_rs(3, 0);
    rs.metadata.deletion_timestamp = Some(Time(at(5)));
    let spec = Spec::new(&rs).unwrap();
    let pods = vec![
        mk_pod("orphan", &[("app", "web")]).build(),
        mk_pod("stopped-matching", &[("app", "db")])
            .owned_by(UID)
            .build(),
    ];
    let claim = claim(&spec, &pods);
    assert!(claim.adopt.is_empty() && claim.release.is_empty());
    assert_eq!(diff(&spec, 0), Diff::None);
}

#[test]
fn diff_creates_and_deletes_the_difference_up_to_the_burst() {
    let rs = mk_rs(10, 0);
    let spec = Spec::new(&rs).unwrap();
    assert_eq!(diff(&spec, 0), Diff::Create(10));
    assert_eq!(diff(&spec, 7), Diff::Create(3));
    assert_eq!(diff(&spec, 10), Diff::None);
    assert_eq!(diff(&spec, 15), Diff::Delete(5));
    let rs = mk_rs(2000, 0);
    let spec = Spec::new(&rs).unwrap();
    assert_eq!(diff(&spec, 0), Diff::Create(BURST_REPLICAS));
}

#[test]
fn invalid_specs_name_the_field() {
    let mut rs = mk_rs(1, 0);
    rs.spec.as_mut().unwrap().selector = Default::default();
    assert_eq!(Spec::new(&rs).unwrap_err(), SpecError::EmptySelector);
    let mut rs = mk_rs(-1, 0);
    assert_eq!(
        Spec::new(&rs).unwrap_err().to_string(),
        "spec.replicas: negative (-1)"
    );
    rs.metadata.uid = None;
    assert_eq!(Spec::new(&rs).unwrap_err(), SpecError::NoUid);
}

#[test]
fn slow_start_doubles_from_four() {
    assert_eq!(slow_start_batches(0), Vec::<usize>::new());
    assert_eq!(slow_start_batches(1), [1]);
    assert_eq!(slow_start_batches(4), [4]);
    assert_eq!(slow_start_batches(10), [4, 6]);
    assert_eq!(slow_start_batches(15), [4, 8, 3]);
    assert_eq!(slow_start_batches(500).iter().sum::<usize>(), 500);
    assert_eq!(slow_start_batches(500).len(), 7);
}

#[test]
fn deletion_prefers_unscheduled_pending_not_ready_then_newer() {
    let pods = [
        mk_pod("old-ready", &[]).node("n1").ready_since(10).build(),
        mk_pod("new-ready", &[])
            .node("n2")
            .created(50)
            .ready_since(10)
            .build(),
        mk_pod("recently-ready", &[])
            .node("n3")
            .ready_since(40)
            .build(),
        mk_pod("not-ready", &[]).node("n4").build(),
        mk_pod("pending", &[]).node("n5").phase("Pending").build(),
        mk_pod("unscheduled", &[]).phase("Pending").build(),
        mk_pod("restarting", &[])
            .node("n6")
            .ready_since(10)
            .restarts(3)
            .build(),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    // Ages 50 s and 100 s, ready for 60 s and 90 s: different log2 buckets.
    let now = at(100);
    assert_eq!(
        names(&pods_to_delete(&refs, &refs, 6, now)),
        [
            "unscheduled",
            "pending",
            "not-ready",
            "recently-ready",
            "restarting",
            "new-ready",
        ]
    );
    assert_eq!(
        names(&pods_to_delete(&refs, &refs, 2, now)),
        ["unscheduled", "pending"]
    );
}

#[test]
fn deletion_prefers_pods_on_nodes_crowded_with_related_pods() {
    let pods = [
        mk_pod("alone", &[])
            .node("n1")
            .ready_since(10)
            .created(9)
            .build(),
        mk_pod("crowded-a", &[]).node("n2").ready_since(10).build(),
        mk_pod("crowded-b", &[]).node("n2").ready_since(10).build(),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    let now = at(100);
    assert_eq!(names(&pods_to_delete(&refs, &refs, 1, now)), ["crowded-a"]);

    // Pods of a sibling ReplicaSet (same Deployment) on n1 make n1 the crowded Node;
    // a terminating one does not count.
    let sibling = [
        mk_pod("other-1", &[]).node("n1").ready_since(10).build(),
        mk_pod("other-2", &[]).node("n1").ready_since(10).build(),
        mk_pod("other-3", &[]).node("n2").deleting().build(),
        mk_pod("other-4", &[]).node("n2").deleting().build(),
    ];
    let related: Vec<&Pod> = pods.iter().chain(&sibling).collect();
    assert_eq!(names(&pods_to_delete(&refs, &related, 1, now)), ["alone"]);

    // A ReplicaSet without a controller has no related Pods: no Node counts as crowded, and
    // the newer Pod goes first (30 s old against 100 s: another log2 bucket).
    let older_crowded = [
        mk_pod("alone", &[])
            .node("n1")
            .ready_since(10)
            .created(70)
            .build(),
        mk_pod("crowded-a", &[]).node("n2").ready_since(10).build(),
        mk_pod("crowded-b", &[]).node("n2").ready_since(10).build(),
    ];
    let refs: Vec<&Pod> = older_crowded.iter().collect();
    assert_eq!(names(&pods_to_delete(&refs, &[], 1, now)), ["alone"]);
    assert_eq!(names(&pods_to_delete(&refs, &refs, 1, now)), ["crowded-a"]);
}

#[test]
fn deletion_cost_comes_after_readiness_and_before_crowding() {
    let pods = [
        mk_pod("cheap-not-ready", &[])
            .node("n1")
            .deletion_cost("-100")
            .build(),
        mk_pod("expensive", &[])
            .node("n2")
            .ready_since(10)
            .deletion_cost("1000")
            .build(),
        mk_pod("cheap", &[])
            .node("n3")
            .ready_since(10)
            .deletion_cost("-5")
            .build(),
        mk_pod("unset", &[]).node("n2").ready_since(10).build(),
        mk_pod("garbage", &[])
            .node("n2")
            .ready_since(90)
            .deletion_cost("lots")
            .build(),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    // Not ready first whatever its cost; then by cost (an unparsable cost is 0); the two at
    // 0 on crowded n2 by how recently they became ready.
    assert_eq!(
        names(&pods_to_delete(&refs, &refs, 4, at(100))),
        ["cheap-not-ready", "cheap", "garbage", "unset"]
    );
    assert_eq!(deletion_cost(&pods[4]), 0);
    assert_eq!(deletion_cost(&pods[2]), -5);
}

#[test]
fn ready_times_and_ages_in_one_log2_bucket_are_ordered_by_uid() {
    // Ready for 10 s and 11 s: both floor(log2(ns)) = 33, so the UID decides, not the time.
    let pods = [
        mk_pod("ready-later", &[])
            .node("n1")
            .ready_since(90)
            .uid("b")
            .build(),
        mk_pod("ready-earlier", &[])
            .node("n2")
            .ready_since(89)
            .uid("a")
            .build(),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    assert_eq!(
        names(&pods_to_delete(&refs, &[], 1, at(100))),
        ["ready-earlier"]
    );
    // Ready for 10 s and 100 s: different buckets, the more recent goes first.
    let pods = [
        mk_pod("recent", &[])
            .node("n1")
            .ready_since(90)
            .uid("b")
            .build(),
        mk_pod("long", &[])
            .node("n2")
            .ready_since(0)
            .uid("a")
            .build(),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    assert_eq!(names(&pods_to_delete(&refs, &[], 1, at(100))), ["recent"]);
    // Not ready, created 20 s and 21 s ago (bucket 34 both): by UID as well.
    let pods = [
        mk_pod("younger", &[])
            .node("n1")
            .created(80)
            .uid("z")
            .build(),
        mk_pod("older", &[]).node("n2").created(79).uid("y").build(),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    assert_eq!(names(&pods_to_delete(&refs, &[], 1, at(100))), ["older"]);
    // Deleting every Pod needs no order.
    assert_eq!(pods_to_delete(&refs, &[], 2, at(100)).len(), 2);
}

#[test]
fn new_pods_follow_the_template_with_a_controller_reference() {
    let rs = mk_rs(1, 0);
    let spec = Spec::new(&rs).unwrap();
    let pod = pod_from_template(&spec);
    assert_eq!(pod.metadata.generate_name.as_deref(), Some("web-"));
    assert_eq!(pod.metadata.namespace.as_deref(), Some("ns"));
    assert_eq!(pod.metadata.labels.as_ref().unwrap()["tier"], "front");
    assert_eq!(pod.metadata.annotations.as_ref().unwrap()["a"], "b");
    let owner = controller_of(&pod).unwrap();
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.uid.as_str(),
            owner.block_owner_deletion
        ),
        ("ReplicaSet", UID, Some(true))
    );
    assert_eq!(
        pod.spec.unwrap().containers[0].image.as_deref(),
        Some("registry.example/web:1")
    );
}

#[test]
fn status_counts_labeled_ready_and_available_pods() {
    let rs = mk_rs(4, 30);
    let spec = Spec::new(&rs).unwrap();
    let full = [("app", "web"), ("tier", "front")];
    let pods = vec![
        mk_pod("available", &full)
            .owned_by(UID)
            .ready_since(0)
            .build(),
        mk_pod("ready-not-yet-available", &full)
            .owned_by(UID)
            .ready_since(90)
            .build(),
        mk_pod("not-ready", &full).owned_by(UID).build(),
        // Matches the selector but lacks a template label.
        mk_pod("partly-labeled", &[("app", "web")])
            .owned_by(UID)
            .ready_since(0)
            .build(),
        mk_pod("terminating", &full)
            .owned_by(UID)
            .deleting()
            .build(),
    ];
    let claim = claim(&spec, &pods);
    let now = at(100);
    let status = status(&spec, &claim, None, now);
    assert_eq!(status.replicas, 4);
    assert_eq!(status.fully_labeled_replicas, Some(3));
    assert_eq!(status.ready_replicas, Some(3));
    assert_eq!(status.available_replicas, Some(2));
    assert_eq!(status.terminating_replicas, Some(1));
    assert_eq!(status.observed_generation, Some(4));
    assert_eq!(status.conditions, None);
    assert!(status_changed(&rs, &status));
    // Ready at 90 with minReadySeconds 30: available just after 120.
    let wait = recheck_after(&spec, &claim, now).unwrap();
    assert!(wait > Duration::from_secs(20) && wait <= Duration::from_millis(20_001));
    assert!(is_available(claim.owned[1], 30, now + 21.seconds()));

    let mut written = rs.clone();
    written.status = Some(status.clone());
    assert!(!status_changed(&written, &status));
}

#[test]
fn a_failed_round_sets_replica_failure_and_keeps_its_transition_time() {
    let rs = mk_rs(1, 0);
    let spec = Spec::new(&rs).unwrap();
    let failure = ManageFailure {
        reason: "FailedCreate",
        message: "pods \"web-\" is forbidden: exceeded quota".into(),
    };
    let first = status(&spec, &Claim::default(), Some(&failure), at(10));
    let condition = &first.conditions.as_ref().unwrap()[0];
    assert_eq!(
        (condition.type_.as_str(), condition.reason.as_deref()),
        (REPLICA_FAILURE, Some("FailedCreate"))
    );
    let mut rs = rs.clone();
    rs.status = Some(first.clone());
    let spec = Spec::new(&rs).unwrap();
    let again = status(&spec, &Claim::default(), Some(&failure), at(20));
    assert!(!status_changed(&rs, &again));
    let recovered = status(&spec, &Claim::default(), None, at(30));
    assert_eq!(recovered.conditions, None);
}

#[test]
fn terminating_replicas_unset_is_rewritten_as_a_count() {
    let rs = mk_rs(2, 0);
    let pods = [
        mk_pod("a", &[("app", "web")]).owned_by(UID).build(),
        mk_pod("b", &[("app", "web")])
            .owned_by(UID)
            .deleting()
            .build(),
    ];
    let spec = Spec::new(&rs).unwrap();
    let claim = claim(&spec, &pods);
    let status = status(&spec, &claim, None, at(0));
    assert_eq!(status.terminating_replicas, Some(1));
    let mut written = rs.clone();
    written.status = Some(status.clone());
    assert!(!status_changed(&written, &status));
    // A status without the field (written by a controller that does not fill it, or by
    // hand) is rewritten, even when no Pod is terminating.
    let mut none = status.clone();
    none.terminating_replicas = Some(0);
    written.status.as_mut().unwrap().terminating_replicas = None;
    assert!(status_changed(&written, &none));
}

#[test]
fn a_replication_controller_is_decided_as_its_replica_set_form() {
    use k8s_openapi::api::core::v1::{
        ReplicationController, ReplicationControllerCondition, ReplicationControllerSpec,
        ReplicationControllerStatus,
    };
    let rs = mk_rs(3, 5);
    let spec = rs.spec.clone().unwrap();
    let rc = ReplicationController {
        metadata: rs.metadata.clone(),
        spec: Some(ReplicationControllerSpec {
            replicas: Some(3),
            min_ready_seconds: Some(5),
            selector: spec.selector.match_labels.clone(),
            template: spec.template.clone(),
        }),
        status: Some(ReplicationControllerStatus {
            replicas: 2,
            ready_replicas: Some(1),
            conditions: Some(vec![ReplicationControllerCondition {
                type_: REPLICA_FAILURE.into(),
                status: "True".into(),
                reason: Some("FailedCreate".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    };
    let form = replication_controller_as_replica_set(&rc);
    assert_eq!(form.metadata, rc.metadata);
    assert_eq!(
        form.spec.as_ref().unwrap().selector.match_labels,
        spec.selector.match_labels
    );
    assert_eq!(form.status.as_ref().unwrap().replicas, 2);

    let spec = Spec::of(&form, Owner::ReplicationController).unwrap();
    assert_eq!(spec.replicas, 3);
    let reference = controller_ref(&spec);
    assert_eq!(
        (reference.api_version.as_str(), reference.kind.as_str()),
        ("v1", "ReplicationController")
    );
    assert_eq!(
        pod_from_template(&spec).metadata.owner_references.unwrap()[0].kind,
        "ReplicationController"
    );
    // No terminatingReplicas in a ReplicationController's status; the rest converts back.
    let computed = status(&spec, &Claim::default(), None, at(0));
    assert_eq!(computed.terminating_replicas, None);
    assert_eq!(
        status(&Spec::new(&form).unwrap(), &Claim::default(), None, at(0)).terminating_replicas,
        Some(0)
    );
    let back = replication_controller_status(form.status.clone().unwrap());
    assert_eq!(back, rc.status.unwrap());
}
