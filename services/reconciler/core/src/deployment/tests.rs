use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::{
        apps::v1::{
            Deployment, DeploymentStatus, ReplicaSet, ReplicaSetCondition, ReplicaSetStatus,
        },
        core::v1::{Pod, PodTemplateSpec},
    },
    apimachinery::pkg::{
        apis::meta::v1::{LabelSelector, Time},
        util::intstr::IntOrString,
    },
    jiff::Timestamp,
};
use serde_json::json;

use super::*;

const UID: &str = "d-uid-1";

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn template(image: &str) -> serde_json::Value {
    json!({
        "metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": image}]}
    })
}

/// A Deployment `web` of generation 2 with a `RollingUpdate` of the given surge and
/// unavailability (or `Recreate` when `strategy` says so).
fn mk_deploy(replicas: i32, image: &str, strategy: serde_json::Value) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": UID, "generation": 2,
                     "annotations": {"team": "a", REVISION: "7"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": template(image),
            "strategy": strategy,
            "revisionHistoryLimit": 1,
            "progressDeadlineSeconds": 60
        }
    }))
    .unwrap()
}

fn rolling(surge: serde_json::Value, unavailable: serde_json::Value) -> serde_json::Value {
    json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}})
}

fn default_rolling() -> serde_json::Value {
    rolling(json!(3), json!(2))
}

/// A ReplicaSet of the Deployment for `image`, created at `created`, with `replicas` of which
/// `available` are available, at `revision`.
fn mk_rs(
    name: &str,
    image: &str,
    created: i64,
    replicas: i32,
    available: i32,
    revision: i64,
) -> ReplicaSet {
    let mut t = template(image);
    t["metadata"]["labels"][POD_TEMPLATE_HASH] = json!(name);
    serde_json::from_value(json!({
        "metadata": {
            "name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "generation": 1,
            "creationTimestamp": Time(at(created)),
            "labels": {"app": "web", POD_TEMPLATE_HASH: name},
            "annotations": {REVISION: revision.to_string()},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                 "uid": UID, "controller": true}]
        },
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web", POD_TEMPLATE_HASH: name}},
                 "template": t},
        "status": {"replicas": replicas, "readyReplicas": available,
                   "availableReplicas": available, "observedGeneration": 1}
    }))
    .unwrap()
}

fn annotate(mut rs: ReplicaSet, key: &str, value: i32) -> ReplicaSet {
    rs.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.into(), value.to_string());
    rs
}

fn sizes(list: &[(String, i32)]) -> Vec<(&str, i32)> {
    list.iter().map(|(n, s)| (n.as_str(), *s)).collect()
}

#[test]
fn surge_rounds_up_unavailable_down_and_both_zero_means_one_unavailable() {
    let pct = |s: &str| IntOrString::String(s.into());
    assert_eq!(resolve_fenceposts(None, None, 10).unwrap(), (3, 2));
    assert_eq!(
        resolve_fenceposts(Some(&pct("50%")), Some(&pct("50%")), 3).unwrap(),
        (2, 1)
    );
    assert_eq!(
        resolve_fenceposts(Some(&IntOrString::Int(0)), Some(&pct("10%")), 5).unwrap(),
        (0, 1),
        "10% of 5 rounds down to 0, and both zero gives one"
    );
    assert_eq!(
        resolve_fenceposts(Some(&IntOrString::Int(2)), Some(&IntOrString::Int(0)), 5).unwrap(),
        (2, 0)
    );
    let error = resolve_fenceposts(Some(&pct("lots")), None, 5).unwrap_err();
    assert_eq!(
        error.to_string(),
        "spec.strategy.rollingUpdate.maxSurge: \"lots\" is neither an integer nor a percentage"
    );
    let d = mk_deploy(4, "a", rolling(json!("25%"), json!("100%")));
    let spec = Spec::new(&d).unwrap();
    assert_eq!((spec.max_surge(), spec.max_unavailable()), (1, 4));
    let d = mk_deploy(4, "a", json!({"type": "Recreate"}));
    let spec = Spec::new(&d).unwrap();
    assert_eq!((spec.max_surge(), spec.max_unavailable()), (0, 0));
}

#[test]
fn invalid_specs_are_named_by_field() {
    let mut d = mk_deploy(1, "a", json!({"type": "Sideways"}));
    assert!(
        Spec::new(&d)
            .unwrap_err()
            .to_string()
            .starts_with("spec.strategy.type")
    );
    d.spec.as_mut().unwrap().strategy = None;
    d.spec.as_mut().unwrap().selector = LabelSelector::default();
    assert_eq!(Spec::new(&d).unwrap_err(), SpecError::EmptySelector);
}

#[test]
fn the_hash_is_stable_safe_and_changes_with_the_template_and_collisions() {
    let a: PodTemplateSpec = serde_json::from_value(template("a")).unwrap();
    let b: PodTemplateSpec = serde_json::from_value(template("b")).unwrap();
    let hash = pod_template_hash(&a, None);
    assert_eq!(hash, pod_template_hash(&a.clone(), None));
    assert_ne!(hash, pod_template_hash(&b, None));
    assert_ne!(hash, pod_template_hash(&a, Some(1)));
    assert_ne!(
        pod_template_hash(&a, Some(1)),
        pod_template_hash(&a, Some(2))
    );
    assert!(!hash.is_empty() && hash.len() <= 10);
    assert!(
        hash.chars()
            .all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c))
    );
}

#[test]
fn the_new_replica_set_is_found_by_template_ignoring_the_hash() {
    let d = mk_deploy(3, "b", default_rolling());
    let spec = Spec::new(&d).unwrap();
    let old = mk_rs("web-old", "a", 0, 3, 3, 1);
    let new = mk_rs("web-new", "b", 10, 1, 0, 2);
    let newer_twin = mk_rs("web-twin", "b", 20, 0, 0, 0);
    let owned = [&new, &old, &newer_twin];
    let (found, olds) = split(&spec, &owned);
    assert_eq!(
        found.map(name),
        Some("web-new"),
        "the oldest equal template"
    );
    assert_eq!(
        olds.iter().map(|rs| name(rs)).collect::<Vec<_>>(),
        ["web-old", "web-twin"]
    );
    let d = mk_deploy(3, "c", default_rolling());
    let spec = Spec::new(&d).unwrap();
    assert!(split(&spec, &owned).0.is_none());
}

#[test]
fn claim_keeps_adopts_releases_and_ignores_others() {
    let d = mk_deploy(3, "a", default_rolling());
    let spec = Spec::new(&d).unwrap();
    let owned = mk_rs("mine", "a", 0, 1, 1, 1);
    let mut orphan = mk_rs("orphan", "a", 0, 1, 1, 1);
    orphan.metadata.owner_references = None;
    let mut strayed = mk_rs("strayed", "a", 0, 1, 1, 1);
    strayed.metadata.labels = Some([("app".to_owned(), "other".to_owned())].into());
    let mut foreign = mk_rs("foreign", "a", 0, 1, 1, 1);
    foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "someone".into();
    let mut dying_orphan = orphan.clone();
    dying_orphan.metadata.name = Some("dying".into());
    dying_orphan.metadata.deletion_timestamp = Some(Time(at(0)));
    let all = [owned, orphan, strayed, foreign, dying_orphan];
    let claim = claim(&spec, &all);
    let names = |v: &[&ReplicaSet]| v.iter().map(|rs| name(rs).to_owned()).collect::<Vec<_>>();
    assert_eq!(names(&claim.owned), ["mine"]);
    assert_eq!(names(&claim.adopt), ["orphan"]);
    assert_eq!(names(&claim.release), ["strayed"]);
}

#[test]
fn the_new_replica_set_carries_the_hash_revision_and_surge_sized_replicas() {
    let d = mk_deploy(10, "b", default_rolling());
    let spec = Spec::new(&d).unwrap();
    let old = mk_rs("web-old", "a", 0, 10, 10, 4);
    let rs = new_replica_set(&spec, &[&old]);
    let hash = pod_template_hash(&spec.template, None);
    assert_eq!(
        rs.metadata.name.as_deref(),
        Some(format!("web-{hash}").as_str())
    );
    let labels = rs.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[POD_TEMPLATE_HASH], hash);
    let rs_spec = rs.spec.as_ref().unwrap();
    assert_eq!(
        rs_spec.selector.match_labels.as_ref().unwrap()[POD_TEMPLATE_HASH],
        hash
    );
    let template_labels = rs_spec
        .template
        .as_ref()
        .unwrap()
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .as_ref()
        .unwrap();
    assert_eq!(template_labels[POD_TEMPLATE_HASH], hash);
    assert_eq!(rs_spec.replicas, Some(3), "10 old + 3 surge");
    let annotations = rs.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations[REVISION], "5");
    assert_eq!(annotations[DESIRED_REPLICAS], "10");
    assert_eq!(annotations[MAX_REPLICAS], "13");
    assert_eq!(
        annotations["team"], "a",
        "the Deployment's annotations are copied"
    );
    assert_eq!(controller_of(&rs.metadata).unwrap().uid, UID);
    assert!(is_ours_with_template(&spec, &rs));
    // Without old ReplicaSets it starts at full size; Recreate always does.
    assert_eq!(replicas(&new_replica_set(&spec, &[])), 10);
    let d = mk_deploy(10, "b", json!({"type": "Recreate"}));
    assert_eq!(
        replicas(&new_replica_set(&Spec::new(&d).unwrap(), &[&old])),
        10
    );
}

#[test]
fn a_rollback_makes_the_old_replica_set_the_newest_revision() {
    let d = mk_deploy(3, "a", default_rolling());
    let spec = Spec::new(&d).unwrap();
    let first = mk_rs("web-a", "a", 0, 0, 0, 1);
    let second = mk_rs("web-b", "b", 10, 3, 3, 2);
    let owned = [&first, &second];
    let (new, old) = split(&spec, &owned);
    assert_eq!(new.map(name), Some("web-a"));
    let updated = refresh_new_replica_set(&spec, new.unwrap(), &old).unwrap();
    let annotations = updated.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations[REVISION], "3");
    assert_eq!(annotations[REVISION_HISTORY], "1");
    assert!(
        refresh_new_replica_set(&spec, &updated, &old).is_none(),
        "then up to date"
    );
}

#[test]
fn rolling_update_scales_new_up_within_surge_and_old_down_within_unavailability() {
    let d = mk_deploy(10, "b", default_rolling());
    let spec = Spec::new(&d).unwrap();
    let old = mk_rs("web-old", "a", 0, 10, 10, 1);
    let new = mk_rs("web-new", "b", 10, 3, 0, 2);
    assert_eq!(
        rolling_new_size(&spec, &new, &[&old, &new]),
        None,
        "13 = 10 + surge 3"
    );
    // 13 Pods, at least 8 available, 3 new ones not yet: 2 old ones may go.
    assert_eq!(
        sizes(&rolling_old_sizes(&spec, &new, &[&old])),
        [("web-old", 8)]
    );
    let old = mk_rs("web-old", "a", 0, 8, 8, 1);
    assert_eq!(rolling_new_size(&spec, &new, &[&old, &new]), Some(5));
    // New Pods available: old goes down to keep 8 available in all.
    let new = mk_rs("web-new", "b", 10, 5, 5, 2);
    assert_eq!(
        sizes(&rolling_old_sizes(&spec, &new, &[&old])),
        [("web-old", 3)]
    );
    // Unavailable old Pods go first, as far as the room allows: 11 Pods, 8 must stay
    // available, so 3 unavailable old ones go though only 5 are available.
    let sick = mk_rs("web-old", "a", 0, 8, 2, 1);
    let new = mk_rs("web-new", "b", 10, 3, 3, 2);
    assert_eq!(
        sizes(&rolling_old_sizes(&spec, &new, &[&sick])),
        [("web-old", 5)]
    );
    // An old ReplicaSet just scaled from 8 to 5 whose status still says 8 available: only
    // the 5 it keeps count. With 5 new available, 10 are, so 2 more may go (not all 5).
    let mut shrinking = mk_rs("web-old", "a", 0, 5, 8, 1);
    shrinking.status.as_mut().unwrap().replicas = 8;
    let new = mk_rs("web-new", "b", 10, 5, 5, 2);
    assert_eq!(
        sizes(&rolling_old_sizes(&spec, &new, &[&shrinking])),
        [("web-old", 3)]
    );
    // No room (the new Pods are not available yet): nothing goes.
    let new = mk_rs("web-new", "b", 10, 5, 0, 2);
    assert!(rolling_old_sizes(&spec, &new, &[&sick]).is_empty());
    // A bigger deployment shrinking: the new ReplicaSet is cut to replicas at once.
    let over = mk_rs("web-new", "b", 10, 12, 12, 2);
    assert_eq!(rolling_new_size(&spec, &over, &[&over]), Some(10));
}

#[test]
fn scaling_one_active_replica_set_gives_it_everything() {
    let d = mk_deploy(7, "a", default_rolling());
    let spec = Spec::new(&d).unwrap();
    let only = annotate(mk_rs("web-a", "a", 0, 3, 3, 1), DESIRED_REPLICAS, 3);
    let idle = mk_rs("web-b", "b", 10, 0, 0, 2);
    assert!(is_scaling_event(&spec, &[&only, &idle]));
    assert_eq!(sizes(&scale(&spec, Some(&only), &[&idle])), [("web-a", 7)]);
    let same = annotate(only.clone(), DESIRED_REPLICAS, 7);
    assert!(!is_scaling_event(&spec, &[&same, &idle]));
}

#[test]
fn scaling_mid_rollout_is_proportional_with_the_rest_to_the_biggest() {
    // 10 replicas (max 13) rolling out: 8 new, 5 old; scaled to 20 (max 23).
    let d = mk_deploy(20, "b", default_rolling());
    let spec = Spec::new(&d).unwrap();
    let old = annotate(mk_rs("web-old", "a", 0, 5, 5, 1), MAX_REPLICAS, 13);
    let new = annotate(mk_rs("web-new", "b", 10, 8, 0, 2), MAX_REPLICAS, 13);
    // 8 * 23 / 13 = 14.15 -> 14; 5 * 23 / 13 = 8.85 -> 9: 23 in all.
    assert_eq!(
        sizes(&scale(&spec, Some(&new), &[&old])),
        [("web-new", 14), ("web-old", 9)]
    );
    // Down to 5 (max 8): 8 * 8 / 13 = 4.9 -> 5, 5 * 8 / 13 = 3.1 -> 3; the extra one comes
    // off the biggest.
    let d = mk_deploy(5, "b", default_rolling());
    let spec = Spec::new(&d).unwrap();
    let scaled_sizes = scale(&spec, Some(&new), &[&old]);
    assert_eq!(sizes(&scaled_sizes), [("web-new", 5), ("web-old", 3)]);
    assert_eq!(scaled_sizes.iter().map(|(_, s)| s).sum::<i32>(), 8);
    // To zero: everything goes.
    let d = mk_deploy(0, "b", default_rolling());
    let spec = Spec::new(&d).unwrap();
    assert_eq!(
        sizes(&scale(&spec, Some(&new), &[&old])),
        [("web-new", 0), ("web-old", 0)]
    );
}

#[test]
fn a_share_never_goes_past_what_is_left_to_give() {
    // 10 replicas stuck at 7 old and 3 new (maxSurge 0, maxUnavailable 3), scaled to 15:
    // 7 * 15 / 10 = 10.5 -> 11 (+4) for the biggest first, then 3 * 15 / 10 = 4.5 -> 5 (+2)
    // capped at the 1 left (`GetProportion`); not +2 with the excess taken off the biggest.
    let d = mk_deploy(15, "b", rolling(json!(0), json!(3)));
    let spec = Spec::new(&d).unwrap();
    let old = annotate(mk_rs("web-old", "a", 0, 7, 7, 1), MAX_REPLICAS, 10);
    let new = annotate(mk_rs("web-new", "b", 10, 3, 0, 2), MAX_REPLICAS, 10);
    assert_eq!(
        sizes(&scale(&spec, Some(&new), &[&old])),
        [("web-old", 11), ("web-new", 4)]
    );
    // Down from 15 (11 old, 4 new) to 6: 11 * 6 / 15 = 4.4 -> 4 (-7), 4 * 6 / 15 = 1.6 -> 2
    // (-2): exactly the 9 to take.
    let d = mk_deploy(6, "b", rolling(json!(0), json!(3)));
    let spec = Spec::new(&d).unwrap();
    let old = annotate(mk_rs("web-old", "a", 0, 11, 11, 1), MAX_REPLICAS, 15);
    let new = annotate(mk_rs("web-new", "b", 10, 4, 0, 2), MAX_REPLICAS, 15);
    assert_eq!(
        sizes(&scale(&spec, Some(&new), &[&old])),
        [("web-old", 4), ("web-new", 2)]
    );
}

#[test]
fn scaled_writes_size_and_replicas_annotations_only_when_needed() {
    let d = mk_deploy(4, "a", default_rolling());
    let spec = Spec::new(&d).unwrap();
    let rs = mk_rs("web-a", "a", 0, 2, 2, 1);
    let up = scaled(&spec, &rs, 4).unwrap();
    assert_eq!(replicas(&up), 4);
    assert_eq!(int_annotation(&up, DESIRED_REPLICAS), Some(4));
    assert_eq!(int_annotation(&up, MAX_REPLICAS), Some(7));
    assert!(scaled(&spec, &up, 4).is_none());
}

#[test]
fn recreate_waits_for_every_old_pod() {
    let old = mk_rs("web-old", "a", 0, 0, 0, 1);
    assert!(!old_pods_running(&[&old], &[]));
    let mut still = old.clone();
    still.status.as_mut().unwrap().replicas = 1;
    assert!(old_pods_running(&[&still], &[]));
    let pod = |phase: &str| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "status": {"phase": phase}}))
            .unwrap()
    };
    assert!(old_pods_running(&[&old], &[pod("Running")]));
    assert!(old_pods_running(&[&old], &[pod("Unknown")]));
    assert!(!old_pods_running(
        &[&old],
        &[pod("Succeeded"), pod("Failed")]
    ));
}

#[test]
fn history_beyond_the_limit_is_deleted_oldest_revision_first() {
    let d = mk_deploy(3, "d", default_rolling());
    let spec = Spec::new(&d).unwrap();
    let r1 = mk_rs("web-1", "a", 30, 0, 0, 1);
    let r2 = mk_rs("web-2", "b", 20, 0, 0, 2);
    let r3 = mk_rs("web-3", "c", 10, 0, 0, 3);
    let doomed: Vec<&str> = to_clean_up(&spec, &[&r3, &r1, &r2])
        .into_iter()
        .map(name)
        .collect();
    assert_eq!(doomed, ["web-1", "web-2"], "limit 1 keeps revision 3");
    let busy = mk_rs("web-1", "a", 30, 1, 1, 1);
    let doomed: Vec<&str> = to_clean_up(&spec, &[&r3, &busy, &r2])
        .into_iter()
        .map(name)
        .collect();
    assert_eq!(doomed, ["web-2"], "one with replicas is kept");
    let mut lagging = r1.clone();
    lagging.metadata.generation = Some(2);
    let doomed: Vec<&str> = to_clean_up(&spec, &[&r3, &lagging, &r2])
        .into_iter()
        .map(name)
        .collect();
    assert_eq!(
        doomed,
        ["web-2"],
        "one its controller has not caught up with is kept"
    );
}

fn with_status(mut d: Deployment, status: serde_json::Value) -> Deployment {
    d.status = Some(serde_json::from_value(status).unwrap());
    d
}

#[test]
fn status_sums_the_replica_sets_and_says_available() {
    let d = mk_deploy(10, "b", default_rolling());
    let spec = Spec::new(&d).unwrap();
    let old = mk_rs("web-old", "a", 0, 6, 6, 1);
    let mut new = mk_rs("web-new", "b", 10, 6, 2, 2);
    new.status.as_mut().unwrap().ready_replicas = Some(3);
    let status = calculate_status(
        &spec,
        Some(&new),
        &[&old, &new],
        &DeploymentStatus::default(),
        at(0),
    );
    assert_eq!(
        (
            status.replicas,
            status.updated_replicas,
            status.ready_replicas,
            status.available_replicas,
            status.unavailable_replicas,
            status.observed_generation
        ),
        (Some(12), Some(6), Some(9), Some(8), Some(4), Some(2))
    );
    let available = get_condition(&status, AVAILABLE).unwrap();
    assert_eq!(
        (available.status.as_str(), available.reason.as_deref()),
        ("True", Some(MIN_AVAILABLE))
    );
    let old = mk_rs("web-old", "a", 0, 6, 5, 1);
    let status = calculate_status(&spec, Some(&new), &[&old, &new], &status, at(5));
    let unavailable = get_condition(&status, AVAILABLE).unwrap();
    assert_eq!(
        (unavailable.status.as_str(), unavailable.reason.as_deref()),
        ("False", Some(MIN_UNAVAILABLE))
    );
    assert_eq!(unavailable.last_transition_time, Some(Time(at(5))));
}

#[test]
fn terminating_replicas_sum_the_replica_sets_or_stay_unknown() {
    let d = mk_deploy(10, "b", default_rolling());
    let spec = Spec::new(&d).unwrap();
    let mut old = mk_rs("web-old", "a", 0, 6, 6, 1);
    let mut new = mk_rs("web-new", "b", 10, 6, 2, 2);
    // One ReplicaSet not reported yet: unknown, as kube-controller-manager leaves it.
    new.status.as_mut().unwrap().terminating_replicas = Some(1);
    let current = DeploymentStatus::default();
    let status = calculate_status(&spec, Some(&new), &[&old, &new], &current, at(0));
    assert_eq!(status.terminating_replicas, None);
    old.status.as_mut().unwrap().terminating_replicas = Some(3);
    let status = calculate_status(&spec, Some(&new), &[&old, &new], &current, at(0));
    assert_eq!(status.terminating_replicas, Some(4));
    // A change of it alone is a status to write; 0 is not the same as unknown.
    let mut before = status.clone();
    before.terminating_replicas = Some(0);
    assert!(status_changed(&before, &status));
    before.terminating_replicas = None;
    assert!(status_changed(&before, &status));
    assert!(!status_changed(&status, &status.clone()));
}

#[test]
fn progressing_tracks_progress_completion_and_the_deadline() {
    let d = mk_deploy(3, "b", default_rolling());
    let spec = Spec::new(&d).unwrap();
    let mut current = DeploymentStatus::default();
    note_new_replica_set(&mut current, &spec, "web-new", true, at(0));
    assert_eq!(
        get_condition(&current, PROGRESSING)
            .unwrap()
            .reason
            .as_deref(),
        Some(NEW_RS_CREATED)
    );

    // Progress: two new Pods available.
    let new = mk_rs("web-new", "b", 10, 3, 2, 2);
    let d = with_status(d.clone(), serde_json::to_value(&current).unwrap());
    let spec = Spec::new(&d).unwrap();
    let status = rollout_status(&spec, Some(&new), &[&new], &current, at(10));
    let cond = get_condition(&status, PROGRESSING).unwrap();
    assert_eq!(
        (cond.reason.as_deref(), cond.last_update_time.clone()),
        (Some(RS_UPDATED), Some(Time(at(10))))
    );
    assert_eq!(
        cond.last_transition_time,
        Some(Time(at(0))),
        "still True: transition kept"
    );
    assert_eq!(
        recheck_after(&spec, &status, at(10)),
        Some(Duration::from_secs(61))
    );

    // No progress past the deadline: timed out.
    let stuck = rollout_status(&spec, Some(&new), &[&new], &status, at(71));
    let cond = get_condition(&stuck, PROGRESSING).unwrap();
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_deref()),
        ("False", Some(TIMED_OUT))
    );
    assert_eq!(recheck_after(&spec, &stuck, at(71)), None);

    // Complete.
    let done = mk_rs("web-new", "b", 10, 3, 3, 2);
    let status = rollout_status(&spec, Some(&done), &[&done], &status, at(20));
    let cond = get_condition(&status, PROGRESSING).unwrap();
    assert_eq!(cond.reason.as_deref(), Some(NEW_RS_AVAILABLE));
    assert_eq!(
        cond.message.as_deref(),
        Some("ReplicaSet \"web-new\" has successfully progressed.")
    );
    assert_eq!(recheck_after(&spec, &status, at(20)), None);
    assert!(is_complete(&spec, &status));
}

#[test]
fn replica_failures_of_replica_sets_are_carried_over() {
    let d = mk_deploy(3, "b", default_rolling());
    let spec = Spec::new(&d).unwrap();
    let mut new = mk_rs("web-new", "b", 10, 3, 0, 2);
    new.status = Some(ReplicaSetStatus {
        conditions: Some(vec![ReplicaSetCondition {
            type_: REPLICA_FAILURE.into(),
            status: "True".into(),
            reason: Some("FailedCreate".into()),
            message: Some("quota".into()),
            last_transition_time: Some(Time(at(1))),
        }]),
        ..ReplicaSetStatus::default()
    });
    let status = rollout_status(
        &spec,
        Some(&new),
        &[&new],
        &DeploymentStatus::default(),
        at(2),
    );
    assert_eq!(
        get_condition(&status, REPLICA_FAILURE)
            .unwrap()
            .reason
            .as_deref(),
        Some("FailedCreate")
    );
    let healthy = mk_rs("web-new", "b", 10, 3, 0, 2);
    let status = rollout_status(&spec, Some(&healthy), &[&healthy], &status, at(3));
    assert!(get_condition(&status, REPLICA_FAILURE).is_none());
}

#[test]
fn pausing_and_resuming_show_in_progressing() {
    let mut d = mk_deploy(3, "b", default_rolling());
    d.spec.as_mut().unwrap().paused = Some(true);
    let spec = Spec::new(&d).unwrap();
    let paused = paused_status(&spec, at(0)).unwrap();
    assert_eq!(
        get_condition(&paused, PROGRESSING)
            .unwrap()
            .reason
            .as_deref(),
        Some(PAUSED)
    );
    let d = with_status(d, serde_json::to_value(&paused).unwrap());
    assert!(
        paused_status(&Spec::new(&d).unwrap(), at(1)).is_none(),
        "already says so"
    );
    let mut resumed = d.clone();
    resumed.spec.as_mut().unwrap().paused = Some(false);
    let status = paused_status(&Spec::new(&resumed).unwrap(), at(2)).unwrap();
    assert_eq!(
        get_condition(&status, PROGRESSING)
            .unwrap()
            .reason
            .as_deref(),
        Some(RESUMED)
    );
}
