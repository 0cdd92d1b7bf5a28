use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::{ControllerRevision, StatefulSet},
        core::v1::{PersistentVolumeClaim, Pod, PodTemplateSpec},
    },
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::{SignedDuration, Timestamp},
};
use serde_json::json;

use super::*;

const UID: &str = "set-uid";

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

fn stateful_set(extra: serde_json::Value) -> StatefulSet {
    let mut value = json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": UID, "generation": 3},
        "spec": {
            "replicas": 3,
            "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "img:1"}]},
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            }],
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
        },
    });
    merge(&mut value, extra);
    serde_json::from_value(value).unwrap()
}

fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    match (into, from) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

fn template() -> PodTemplateSpec {
    stateful_set(json!({})).spec.unwrap().template
}

fn revisions<'r>(template: &'r PodTemplateSpec) -> Revisions<'r> {
    Revisions {
        current: "web-old",
        current_template: template,
        update: "web-new",
        update_template: template,
        collision_count: 0,
    }
}

/// A Pod of the set at `revision`, Running and Ready since a minute ago unless `phase` says
/// otherwise ("Pending": not ready).
fn pod(ordinal: i32, revision: &str, phase: &str) -> Pod {
    let spec = stateful_set(json!({}));
    let spec = Spec::new(&spec).unwrap();
    let mut pod = new_pod(&spec, &template(), ordinal, revision);
    pod.metadata.uid = Some(format!("pod-{ordinal}"));
    let ready = phase == "Running";
    pod.status = Some(
        serde_json::from_value(json!({
            "phase": phase,
            "conditions": [{
                "type": "Ready",
                "status": if ready { "True" } else { "False" },
                "lastTransitionTime": "2027-01-15T07:59:00Z",
            }],
        }))
        .unwrap(),
    );
    pod
}

fn claims_of(spec: &Spec<'_>, ordinals: &[i32]) -> BTreeMap<String, PersistentVolumeClaim> {
    ordinals
        .iter()
        .flat_map(|o| claims_for(spec, *o))
        .map(|c| (c.metadata.name.clone().unwrap(), c))
        .collect()
}

fn names(steps: &[Step<'_>]) -> Vec<String> {
    steps
        .iter()
        .map(|s| {
            let (what, pod) = match s {
                Step::Replace(p) => ("replace", *p),
                Step::Create(p) => ("create", &**p),
                Step::CreateClaims(p) => ("claims", *p),
                Step::Update(p) => ("update", *p),
                Step::ClaimOwners(p) => ("owners", *p),
                Step::Condemn(p) => ("condemn", *p),
                Step::Roll(p) => ("roll", *p),
            };
            format!("{what} {}", pod.metadata.name.as_deref().unwrap())
        })
        .collect()
}

fn all_steps(plan: &Plan<'_>) -> Vec<String> {
    plan.phases.iter().flat_map(|p| names(p)).collect()
}

#[test]
fn ordinals_come_from_the_name_as_kube_controller_manager_reads_it() {
    assert_eq!(parent_and_ordinal("web-0"), ("web", Some(0)));
    assert_eq!(parent_and_ordinal("my-web-12"), ("my-web", Some(12)));
    assert_eq!(parent_and_ordinal("web"), ("", None));
    assert_eq!(parent_and_ordinal("web-x1"), ("", None));
    assert_eq!(parent_and_ordinal("web-99999999999"), ("web", None));
}

#[test]
fn a_new_pod_has_its_identity_storage_and_revision() {
    let set = stateful_set(json!({"spec": {"template": {"spec": {"volumes": [
        {"name": "data", "emptyDir": {}}, {"name": "cache", "emptyDir": {}},
    ]}}}}));
    let spec = Spec::new(&set).unwrap();
    let pod = new_pod(&spec, &set.spec.as_ref().unwrap().template, 2, "web-abc");
    let value = serde_json::to_value(&pod).unwrap();
    assert_eq!(value["metadata"]["name"], "web-2");
    assert_eq!(value["metadata"]["generateName"], "web-");
    assert_eq!(
        value["metadata"]["labels"],
        json!({"app": "web", POD_NAME_LABEL: "web-2", POD_INDEX_LABEL: "2", REVISION_LABEL: "web-abc"})
    );
    assert_eq!(
        value["metadata"]["ownerReferences"][0]["kind"],
        "StatefulSet"
    );
    assert_eq!(value["spec"]["hostname"], "web-2");
    assert_eq!(value["spec"]["subdomain"], "web");
    // The claim's volume replaces the template's of the same name, first.
    assert_eq!(
        value["spec"]["volumes"],
        json!([
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-2"}},
            {"name": "cache", "emptyDir": {}},
        ])
    );
    assert!(identity_matches(&spec, &pod) && storage_matches(&spec, &pod));
    let claims = claims_for(&spec, 2);
    assert_eq!(claims[0].metadata.name.as_deref(), Some("data-web-2"));
    assert_eq!(
        claims[0].metadata.labels,
        Some(BTreeMap::from([("app".into(), "web".into())]))
    );
}

#[test]
fn ordered_ready_makes_one_pod_at_a_time_and_waits_for_it() {
    let set = stateful_set(json!({}));
    let spec = Spec::new(&set).unwrap();
    let template = template();
    let revs = revisions(&template);
    let none = BTreeMap::new();
    let plan = plan(&spec, &revs, &[], &none, now());
    assert_eq!(all_steps(&plan), ["create web-0"]);
    assert_eq!(plan.status.replicas, 0);

    let web0 = pod(0, "web-new", "Pending");
    let claims = claims_of(&spec, &[0]);
    let plan = super::plan(&spec, &revs, &[&web0], &claims, now());
    assert_eq!(all_steps(&plan), Vec::<String>::new(), "waits for web-0");

    let web0 = pod(0, "web-new", "Running");
    let plan = super::plan(&spec, &revs, &[&web0], &claims, now());
    assert_eq!(all_steps(&plan), ["create web-1"]);
    assert_eq!(plan.status.replicas, 1);
    assert_eq!(plan.status.ready_replicas, Some(1));
    assert_eq!(plan.status.updated_replicas, Some(1));
    assert_eq!(plan.status.current_replicas, Some(0));
    assert_eq!(plan.status.observed_generation, Some(3));
}

#[test]
fn parallel_makes_every_missing_pod_at_once() {
    let set = stateful_set(json!({"spec": {"podManagementPolicy": "Parallel"}}));
    let spec = Spec::new(&set).unwrap();
    let template = template();
    let revs = revisions(&template);
    let web1 = pod(1, "web-new", "Pending");
    let claims = claims_of(&spec, &[1]);
    let plan = plan(&spec, &revs, &[&web1], &claims, now());
    assert_eq!(all_steps(&plan), ["create web-0", "create web-2"]);
}

#[test]
fn a_failed_replica_is_replaced_and_a_pending_one_gets_its_claims() {
    let set = stateful_set(json!({}));
    let spec = Spec::new(&set).unwrap();
    let template = template();
    let revs = revisions(&template);
    let web0 = pod(0, "web-new", "Failed");
    let plan = plan(&spec, &revs, &[&web0], &claims_of(&spec, &[0]), now());
    assert_eq!(all_steps(&plan), ["replace web-0"]);

    let web0 = pod(0, "web-new", "Pending");
    let plan = super::plan(&spec, &revs, &[&web0], &BTreeMap::new(), now());
    assert_eq!(all_steps(&plan), ["claims web-0"]);

    let mut deleting = claims_of(&spec, &[0]);
    deleting
        .get_mut("data-web-0")
        .unwrap()
        .metadata
        .deletion_timestamp = Some(Time(now()));
    assert_eq!(
        missing_claims(&spec, 0, &deleting),
        Err("pvc data-web-0 is being deleted".to_owned())
    );
}

#[test]
fn scaling_down_removes_the_highest_ordinal_first_once_the_rest_are_healthy() {
    let set = stateful_set(json!({"spec": {"replicas": 1}}));
    let spec = Spec::new(&set).unwrap();
    let template = template();
    let revs = revisions(&template);
    let pods = [
        pod(0, "web-new", "Running"),
        pod(1, "web-new", "Running"),
        pod(2, "web-new", "Running"),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    let claims = claims_of(&spec, &[0, 1, 2]);
    let plan = plan(&spec, &revs, &refs, &claims, now());
    assert_eq!(all_steps(&plan), ["condemn web-2"]);

    // web-2 not ready but the first unhealthy Pod: it goes.
    let pods = [
        pod(0, "web-new", "Running"),
        pod(1, "web-new", "Running"),
        pod(2, "web-new", "Pending"),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    let plan = super::plan(&spec, &revs, &refs, &claims, now());
    assert_eq!(all_steps(&plan), ["condemn web-2"]);

    // web-1 and web-2 not ready: OrderedReady waits, as web-2 is not the first unhealthy Pod.
    let pods = [
        pod(0, "web-new", "Running"),
        pod(1, "web-new", "Pending"),
        pod(2, "web-new", "Pending"),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    let plan = super::plan(&spec, &revs, &refs, &claims, now());
    assert_eq!(all_steps(&plan), Vec::<String>::new());
}

#[test]
fn claim_owners_follow_the_retention_policy() {
    let set = stateful_set(json!({"spec": {
        "replicas": 1,
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Delete"},
    }}));
    let spec = Spec::new(&set).unwrap();
    let web0 = pod(0, "web-new", "Running");
    let web1 = pod(1, "web-new", "Running");
    let claims = claims_of(&spec, &[0, 1]);
    // A replica's claim: owned by the set; a condemned Pod's: by the Pod.
    let fixed = claims_out_of_policy(&spec, &web0, &claims);
    let owner = &fixed[0].metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("StatefulSet", UID)
    );
    let fixed = claims_out_of_policy(&spec, &web1, &claims);
    let owner = &fixed[0].metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Pod", "pod-1"));
    assert!(claim_owners_up_to_date(&spec, &fixed[0], &web1));

    let template = template();
    let revs = revisions(&template);
    let plan = plan(&spec, &revs, &[&web0, &web1], &claims, now());
    assert_eq!(
        all_steps(&plan),
        ["update web-0", "owners web-1", "condemn web-1"]
    );

    // Another controller owns the claim: the policy leaves it alone.
    let mut foreign = claims;
    foreign
        .get_mut("data-web-0")
        .unwrap()
        .metadata
        .owner_references = Some(vec![OwnerReference {
        api_version: "example.io/v1".into(),
        kind: "Keeper".into(),
        name: "k".into(),
        uid: "k-uid".into(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    assert!(has_unexpected_controller(
        &spec,
        &foreign["data-web-0"],
        &web0
    ));
    assert!(claims_out_of_policy(&spec, &web0, &foreign).is_empty());

    // A claim still owned by a deleted Pod of the name: the Pod waits for the collector.
    let mut stale = BTreeMap::new();
    let mut claim = claims_for(&spec, 0).remove(0);
    claim.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: "web-0".into(),
        uid: "gone".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    stale.insert("data-web-0".to_owned(), claim);
    let plan = super::plan(&spec, &revs, &[], &stale, now());
    assert_eq!(all_steps(&plan), Vec::<String>::new());
}

#[test]
fn a_rolling_update_goes_down_from_the_highest_ordinal_to_the_partition() {
    let set = stateful_set(json!({"status": {"replicas": 3, "currentReplicas": 3}}));
    let spec = Spec::new(&set).unwrap();
    let template = template();
    let revs = revisions(&template);
    let pods = [
        pod(0, "web-old", "Running"),
        pod(1, "web-old", "Running"),
        pod(2, "web-old", "Running"),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    let claims = claims_of(&spec, &[0, 1, 2]);
    let plan = plan(&spec, &revs, &refs, &claims, now());
    assert_eq!(all_steps(&plan), ["roll web-2"]);
    assert_eq!(plan.status.current_replicas, Some(2));

    // web-2 updated but not ready yet: wait.
    let pods = [
        pod(0, "web-old", "Running"),
        pod(1, "web-old", "Running"),
        pod(2, "web-new", "Pending"),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    assert_eq!(
        all_steps(&super::plan(&spec, &revs, &refs, &claims, now())),
        Vec::<String>::new()
    );

    // A partition of 2 keeps web-0 and web-1 at the old revision.
    let partitioned =
        stateful_set(json!({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 2}}}}));
    let spec = Spec::new(&partitioned).unwrap();
    let pods = [
        pod(0, "web-old", "Running"),
        pod(1, "web-old", "Running"),
        pod(2, "web-new", "Running"),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    let plan = super::plan(&spec, &revs, &refs, &claims, now());
    assert_eq!(all_steps(&plan), Vec::<String>::new());
    assert_eq!(plan.status.updated_replicas, Some(1));

    // maxUnavailable 2: two at once.
    let wide =
        stateful_set(json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": 2}}}}));
    let spec = Spec::new(&wide).unwrap();
    let pods = [
        pod(0, "web-old", "Running"),
        pod(1, "web-old", "Running"),
        pod(2, "web-old", "Running"),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    let plan = super::plan(&spec, &revs, &refs, &claims, now());
    assert_eq!(all_steps(&plan), ["roll web-2", "roll web-1"]);

    // OnDelete: nothing is rolled.
    let on_delete = stateful_set(
        json!({"spec": {"updateStrategy": {"type": "OnDelete", "rollingUpdate": null}}}),
    );
    let spec = Spec::new(&on_delete).unwrap();
    assert!(all_steps(&super::plan(&spec, &revs, &refs, &claims, now())).is_empty());
}

#[test]
fn a_finished_update_makes_the_update_revision_current() {
    let set = stateful_set(json!({}));
    let spec = Spec::new(&set).unwrap();
    let template = template();
    let revs = revisions(&template);
    let pods = [
        pod(0, "web-new", "Running"),
        pod(1, "web-new", "Running"),
        pod(2, "web-new", "Running"),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    let plan = plan(&spec, &revs, &refs, &claims_of(&spec, &[0, 1, 2]), now());
    let status = completed(&spec, plan.status);
    assert_eq!(status.current_revision.as_deref(), Some("web-new"));
    assert_eq!(status.current_replicas, Some(3));
    assert!(status_changed(&set, &status));
}

#[test]
fn min_ready_seconds_holds_availability_and_asks_for_a_recheck() {
    let set = stateful_set(json!({"spec": {"minReadySeconds": 120, "replicas": 1}}));
    let spec = Spec::new(&set).unwrap();
    let template = template();
    let revs = revisions(&template);
    let web0 = pod(0, "web-new", "Running");
    let claims = claims_of(&spec, &[0]);
    let plan = plan(&spec, &revs, &[&web0], &claims, now());
    assert_eq!(plan.status.available_replicas, Some(0));
    assert_eq!(
        recheck_after(&spec, &[&web0], &plan.status, now()),
        Some(std::time::Duration::from_millis(60_001))
    );
    let later = now() + SignedDuration::from_secs(61);
    let plan = super::plan(&spec, &revs, &[&web0], &claims, later);
    assert_eq!(plan.status.available_replicas, Some(1));
}

#[test]
fn pods_are_claimed_by_selector_and_name() {
    let set = stateful_set(json!({}));
    let spec = Spec::new(&set).unwrap();
    let mut orphan = pod(3, "web-new", "Running");
    orphan.metadata.owner_references = None;
    let mut stranger = orphan.clone();
    stranger.metadata.name = Some("other-0".into());
    let mut unlabelled = pod(1, "web-new", "Running");
    unlabelled.metadata.labels = None;
    let owned = pod(0, "web-new", "Running");
    let pods = [orphan, stranger, unlabelled, owned];
    let claim = claim(&spec, &pods);
    let name = |ps: &[&Pod]| {
        ps.iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(name(&claim.owned), ["web-0"]);
    assert_eq!(name(&claim.adopt), ["web-3"]);
    assert_eq!(name(&claim.release), ["web-1"]);
}

#[test]
fn the_revision_data_replaces_the_template_and_restores_it() {
    let set = stateful_set(json!({}));
    let spec = Spec::new(&set).unwrap();
    let data = revision_data(&set);
    assert_eq!(
        String::from_utf8(history::go_json(&data)).unwrap(),
        r#"{"spec":{"template":{"$patch":"replace","metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"image":"img:1","name":"c","resources":{}}]}}}}"#
    );
    let revision: ControllerRevision = new_revision(&spec, &data, 1, 0);
    let name = revision.metadata.name.clone().unwrap();
    assert!(name.starts_with("web-"), "{name}");
    assert_eq!(
        revision.metadata.labels.as_ref().unwrap()[history::HASH_LABEL],
        name.trim_start_matches("web-")
    );
    assert_ne!(new_revision(&spec, &data, 1, 1).metadata.name, Some(name));
    let template = revision_template(&revision).unwrap();
    assert_eq!(
        template.metadata,
        set.spec.as_ref().unwrap().template.metadata
    );
    let (owned, orphans) = own_revisions(&spec, std::slice::from_ref(&revision));
    assert_eq!((owned.len(), orphans.len()), (1, 0));
    let mut orphan = revision.clone();
    orphan.metadata.owner_references = None;
    let mut elsewhere = revision.clone();
    elsewhere.metadata.namespace = Some("other".into());
    let others = [orphan, elsewhere];
    let (owned, orphans) = own_revisions(&spec, &others);
    assert_eq!((owned.len(), orphans.len()), (0, 1));
}
