//! The StatefulSet controller against the real control plane, beside kube-controller-manager's
//! `statefulset-controller` (each on a namespace of its own, one after the other): the same
//! script ends the same under both, down to the order Pods come and go in, the names of the
//! ControllerRevisions (their hashes) and the Events.
//!
//! - five replicas, `OrderedReady`: Pods `db-0` to `db-4` made one after another, each with
//!   its claim `data-db-N` made first;
//! - a new image with `partition: 3`: only `db-4` and `db-3` move to the new revision; with
//!   partition 0 the others follow, highest ordinal first;
//! - the old image again (a rollback): the old revision is renumbered, no third one is made;
//! - scaled to one: `db-4` to `db-1` go, highest first, and with `whenScaled: Delete` their
//!   claims come to be owned by their Pods;
//! - `db-0` fails: deleted and made again under its name.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use switchyard_k8s::{
    Api, Client, ListParams, Pod, PostParams,
    k8s_openapi::api::{
        apps::v1::{ControllerRevision, StatefulSet},
        core::v1::{Event, PersistentVolumeClaim},
    },
    kube::api::{Patch, PatchParams, WatchEvent, WatchParams},
};
use switchyard_reconciler::{sdk::events::COMBINED, statefulset::NAME};
use switchyard_reconciler_core::statefulset::{REVISION_LABEL, pod_revision};
use switchyard_testenv::{ControlPlane, TestNamespace};

use support::WITHIN;

/// Held by each test for its whole run: the controllers one starts (kube-controller-manager's
/// or Switchyard's) act on every namespace, so the tests of this binary run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What one controller did to the script's StatefulSet.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    /// `+name` when a Pod was created, `-name` when one was deleted, in the order the
    /// apiserver's watch told them.
    pods: Vec<String>,
    /// (replicas, ready, current, updated, currentRevision is the first revision,
    /// updateRevision is the first revision) at each settled step.
    statuses: Vec<(i32, i32, i32, i32, bool, bool)>,
    /// The ControllerRevisions at the end: name and number.
    revisions: Vec<(String, i64)>,
    /// Each claim and the kinds that own it.
    claims: Vec<(String, Vec<String>)>,
    /// `db-0` came back under its name after it failed.
    replaced_failed: bool,
    /// The Events on the StatefulSet: reason and message.
    events: BTreeSet<(String, String)>,
}

/// The script's replicas.
const REPLICAS: i32 = 5;

fn stateful_set(node: &str) -> StatefulSet {
    with_replicas(node, 3)
}

fn with_replicas(node: &str, replicas: i32) -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {
            "replicas": replicas,
            "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {
                    // Placed by hand: the claims are never bound, so the scheduler would
                    // hold the Pods; kwok runs them on its Node all the same.
                    "nodeName": node,
                    "containers": [{"name": "db", "image": "registry.example/db:1"}],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }],
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Delete"},
        },
    }))
    .unwrap()
}

/// Records the Pods created and deleted in `namespace` from now on.
async fn record_pods(pods: Api<Pod>) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let version = pods
        .list_metadata(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = pods
        .watch(&WatchParams::default().timeout(290), &version)
        .await
        .unwrap()
        .boxed();
    let into = seen.clone();
    tokio::spawn(async move {
        while let Ok(Some(event)) = stream.try_next().await {
            let entry = match event {
                WatchEvent::Added(pod) => format!("+{}", pod.metadata.name.unwrap_or_default()),
                WatchEvent::Deleted(pod) => format!("-{}", pod.metadata.name.unwrap_or_default()),
                _ => continue,
            };
            into.lock().unwrap().push(entry);
        }
    });
    seen
}

/// Waits until the StatefulSet has `replicas` Pods, all Ready and `updated` of them at the
/// update revision, and its status says so; returns the status in `Outcome`'s form.
async fn settled(
    sets: &Api<StatefulSet>,
    pods: &Api<Pod>,
    replicas: i32,
    updated: i32,
    first_revision: &mut Option<String>,
) -> (i32, i32, i32, i32, bool, bool) {
    let deadline = Instant::now() + WITHIN;
    loop {
        let set = sets.get("db").await.unwrap();
        let status = set.status.clone().unwrap_or_default();
        let update = status.update_revision.clone().unwrap_or_default();
        let listed = pods
            .list(&ListParams::default().labels("app=db"))
            .await
            .unwrap()
            .items;
        let at_update = listed.iter().filter(|p| pod_revision(p) == update).count();
        let ready = listed
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| switchyard_reconciler_core::statefulset::is_running_and_ready(p))
            .count();
        let seen = (
            status.replicas,
            status.ready_replicas.unwrap_or(0),
            status.current_replicas.unwrap_or(0),
            status.updated_replicas.unwrap_or(0),
        );
        if seen == (replicas, replicas, seen.2, updated)
            && status.observed_generation == set.metadata.generation
            && listed.len() == usize::try_from(replicas).unwrap()
            && ready == listed.len()
            && at_update == usize::try_from(updated).unwrap()
            && (updated < replicas || status.current_revision.as_deref() == Some(&update))
        {
            let first = first_revision.get_or_insert_with(|| update.clone());
            return (
                seen.0,
                seen.1,
                seen.2,
                seen.3,
                status.current_revision.as_deref() == Some(first.as_str()),
                update == *first,
            );
        }
        assert!(
            Instant::now() < deadline,
            "not settled at {replicas} ({updated} updated) within {WITHIN:?}: status {seen:?}, \
             {} pods, {ready} ready, {at_update} at {update}",
            listed.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn patch(sets: &Api<StatefulSet>, patch: serde_json::Value) {
    sets.patch("db", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

fn image(tag: u32) -> serde_json::Value {
    json!({"spec": {"template": {"spec": {"containers": [{"name": "db", "image": format!("registry.example/db:{tag}")}]}}}})
}

/// The script, in `namespace`.
async fn scenario(client: &Client, namespace: &str, node: &str) -> Outcome {
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let recorded = record_pods(pods.clone()).await;
    sets.create(&PostParams::default(), &with_replicas(node, REPLICAS))
        .await
        .unwrap();
    let mut first = None;
    let mut statuses = vec![settled(&sets, &pods, REPLICAS, REPLICAS, &mut first).await];

    // A new image, only db-4 and db-3 first; then the rest.
    patch(
        &sets,
        json!({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 3}}}}),
    )
    .await;
    patch(&sets, image(2)).await;
    statuses.push(settled(&sets, &pods, REPLICAS, 2, &mut first).await);
    patch(
        &sets,
        json!({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}}),
    )
    .await;
    statuses.push(settled(&sets, &pods, REPLICAS, REPLICAS, &mut first).await);

    // Back to the first image: its revision again.
    patch(&sets, image(1)).await;
    statuses.push(settled(&sets, &pods, REPLICAS, REPLICAS, &mut first).await);

    // Scaled to one.
    patch(&sets, json!({"spec": {"replicas": 1}})).await;
    statuses.push(settled(&sets, &pods, 1, 1, &mut first).await);

    // db-0 fails: made again under its name.
    let before = pods.get("db-0").await.unwrap();
    pods.patch_status(
        "db-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Failed"}})),
    )
    .await
    .unwrap();
    let deadline = Instant::now() + WITHIN;
    let replaced_failed = loop {
        if let Ok(pod) = pods.get("db-0").await
            && pod.metadata.uid != before.metadata.uid
            && switchyard_reconciler_core::statefulset::is_running_and_ready(&pod)
        {
            break pod.metadata.labels.as_ref().unwrap()[REVISION_LABEL]
                == before.metadata.labels.as_ref().unwrap()[REVISION_LABEL];
        }
        if Instant::now() >= deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    statuses.push(settled(&sets, &pods, 1, 1, &mut first).await);

    let revisions_api: Api<ControllerRevision> = Api::namespaced(client.clone(), namespace);
    let mut revisions: Vec<(String, i64)> = revisions_api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|r| (r.metadata.name.unwrap(), r.revision))
        .collect();
    revisions.sort();
    // The claims' owners settle once the condemned Pods' claims are written.
    let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + Duration::from_secs(10);
    let claims = loop {
        let claims: Vec<(String, Vec<String>)> = claims_api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|c| {
                let kinds = c
                    .metadata
                    .owner_references
                    .unwrap_or_default()
                    .into_iter()
                    .map(|r| r.kind)
                    .collect();
                (c.metadata.name.unwrap(), kinds)
            })
            .collect();
        if claims.iter().filter(|(_, kinds)| !kinds.is_empty()).count() >= 4
            || Instant::now() >= deadline
        {
            break claims;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };

    // The Events on it, once they are written: the same list twice a second apart. Both
    // recorders let 25 through per object, then one every five minutes, so the script's last
    // steps record none. From the tenth distinct note of a reason on, both combine notes
    // ("(combined from similar events): ..."); client-go then forgets one note picked at
    // random, so which later notes come out combined is chance under kube-controller-manager.
    // The notes are compared without that prefix.
    let events_api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let mut events = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let listed: BTreeSet<(String, String)> = events_api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.involved_object.kind.as_deref() == Some("StatefulSet"))
            .filter_map(|e| {
                let message = e.message?;
                let note = message.strip_prefix(COMBINED).unwrap_or(&message);
                Some((e.reason?, note.to_owned()))
            })
            .collect();
        if !listed.is_empty() && listed == events {
            break;
        }
        events = listed;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let pods = recorded.lock().unwrap().clone();
    Outcome {
        pods,
        statuses,
        revisions,
        claims,
        replaced_failed,
        events,
    }
}

/// `pods` without a deletion and creation of a Pod right after the same two.
fn without_repeats(pods: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for entry in pods {
        out.push(entry.clone());
        let n = out.len();
        if n >= 4 && out[n - 4..n - 2] == out[n - 2..] && out[n - 2].starts_with('-') {
            out.truncate(n - 2);
        }
    }
    out
}

#[test]
fn repeats_are_taken_out() {
    let pods: Vec<String> = "+a -a +a -a +a -b +b"
        .split(' ')
        .map(String::from)
        .collect();
    assert_eq!(without_repeats(&pods), ["+a", "-a", "+a", "-b", "+b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateful_set_ends_as_under_kube_controller_manager() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let node = plane.nodes()[0].clone();

    let kcm = plane
        .start_controller_manager(&["statefulset-controller"], &[])
        .await
        .expect("kube-controller-manager starts");
    let under_kcm_ns = TestNamespace::create(plane, &client, "sts-kcm")
        .await
        .unwrap();
    let under_kcm = scenario(&client, under_kcm_ns.name(), &node).await;
    drop(kcm);

    let switchyard = support::Builtins::start(plane, &[NAME]).await;
    let under_switchyard_ns = TestNamespace::create(plane, &client, "sts-sy")
        .await
        .unwrap();
    let under_switchyard = scenario(&client, under_switchyard_ns.name(), &node).await;
    let created = switchyard.requests("create", &["201"]).await;
    switchyard.stop().await;

    eprintln!("kube-controller-manager: {under_kcm:#?}");
    eprintln!("switchyard: {under_switchyard:#?}");
    let order: Vec<String> = "+db-0 +db-1 +db-2 +db-3 +db-4 \
         -db-4 +db-4 -db-3 +db-3 -db-2 +db-2 -db-1 +db-1 -db-0 +db-0 \
         -db-4 +db-4 -db-3 +db-3 -db-2 +db-2 -db-1 +db-1 -db-0 +db-0 \
         -db-4 -db-3 -db-2 -db-1 -db-0 +db-0"
        .split_whitespace()
        .map(String::from)
        .collect();
    // kube-controller-manager keeps no expectations for StatefulSets: on a loaded machine
    // its informer can still show a Pod it has just deleted and made again, and it deletes
    // the new one too. Its order is compared with such repeats taken out; ours, whose reads
    // include its own writes, must not repeat.
    assert_eq!(without_repeats(&under_kcm.pods), order);
    assert_eq!(under_switchyard.pods, order);
    assert_eq!(
        under_kcm.statuses,
        vec![
            (5, 5, 5, 5, true, true),
            (5, 5, 3, 2, true, false),
            (5, 5, 5, 5, false, false),
            (5, 5, 5, 5, true, true),
            (1, 1, 1, 1, true, true),
            (1, 1, 1, 1, true, true),
        ]
    );
    assert!(under_kcm.replaced_failed);
    assert_eq!(
        Outcome {
            pods: order,
            ..under_switchyard
        },
        Outcome {
            pods: without_repeats(&under_kcm.pods),
            ..under_kcm
        }
    );
    // The Pods were this reconciler's: it is the only controller running.
    assert!(created >= 6.0, "the reconciler created {created} objects");
}
/// `kubectl rollout` on a StatefulSet of Switchyard's: `status` waits for each rollout,
/// `history` lists the revisions, `undo` copies the previous revision's template back and the
/// controller takes that revision again, renumbered, with no new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_rollout_status_history_and_undo_work_on_its_revisions() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let switchyard = support::Builtins::start(plane, &[NAME]).await;
    let ns = TestNamespace::create(plane, &client, "sts-rollout")
        .await
        .unwrap();
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns.name());
    let mut set = stateful_set(&plane.nodes()[0]);
    let spec = set.spec.as_mut().unwrap();
    spec.replicas = Some(2);
    spec.volume_claim_templates = None;
    sets.create(&PostParams::default(), &set).await.unwrap();
    support::kubectl_rollout_status(plane, ns.name(), "statefulset/db").await;

    patch(&sets, image(2)).await;
    support::kubectl_rollout_status(plane, ns.name(), "statefulset/db").await;
    let history = support::kubectl(
        plane,
        &["rollout", "history", "statefulset/db", "-n", ns.name()],
    )
    .await;
    let numbers = |history: &str| -> Vec<String> {
        history
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|w| w.parse::<u32>().is_ok())
            .map(String::from)
            .collect()
    };
    assert_eq!(numbers(&history), ["1", "2"], "{history}");

    let undo = support::kubectl(
        plane,
        &["rollout", "undo", "statefulset/db", "-n", ns.name()],
    )
    .await;
    assert!(undo.contains("rolled back"), "{undo}");
    support::kubectl_rollout_status(plane, ns.name(), "statefulset/db").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    for pod in pods.list(&ListParams::default()).await.unwrap().items {
        assert_eq!(
            pod.spec.unwrap().containers[0].image.as_deref(),
            Some("registry.example/db:1")
        );
    }
    let revisions: Api<ControllerRevision> = Api::namespaced(client.clone(), ns.name());
    let listed = revisions.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(listed.len(), 2, "no revision is made for a rollback");
    let history = support::kubectl(
        plane,
        &["rollout", "history", "statefulset/db", "-n", ns.name()],
    )
    .await;
    assert_eq!(numbers(&history), ["2", "3"], "{history}");
    let third = support::kubectl(
        plane,
        &[
            "rollout",
            "history",
            "statefulset/db",
            "-n",
            ns.name(),
            "--revision=3",
        ],
    )
    .await;
    assert!(third.contains("registry.example/db:1"), "{third}");
    switchyard.stop().await;
}

/// A Pod or a claim the apiserver refuses (a ResourceQuota of none of either): an Event says so on the StatefulSet, the key backs off, another
/// namespace's StatefulSet goes on, and once the quota is gone the Pods are made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_pods_and_claims_are_reported_and_retried_without_stalling_others() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let switchyard = support::Builtins::start(plane, &[NAME]).await;
    let refused = TestNamespace::create(plane, &client, "sts-refused")
        .await
        .unwrap();
    let fine = TestNamespace::create(plane, &client, "sts-fine")
        .await
        .unwrap();
    let quotas: Api<switchyard_k8s::k8s_openapi::api::core::v1::ResourceQuota> =
        Api::namespaced(client.clone(), refused.name());
    quotas
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "none"},
                "spec": {"hard": {"pods": "0", "persistentvolumeclaims": "0"}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    // Its status as the quota controller (not running here) would write it: admission
    // enforces what the status says.
    quotas
        .patch_status(
            "none",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "hard": {"pods": "0", "persistentvolumeclaims": "0"},
                "used": {"pods": "0", "persistentvolumeclaims": "0"},
            }})),
        )
        .await
        .unwrap();
    let node = plane.nodes()[0].clone();
    for ns in [refused.name(), fine.name()] {
        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
        sets.create(&PostParams::default(), &stateful_set(&node))
            .await
            .unwrap();
    }

    // The claim is refused first: its Event, and the Pod's.
    let events: Api<Event> = Api::namespaced(client.clone(), refused.name());
    let deadline = Instant::now() + WITHIN;
    let warnings = loop {
        let warnings: BTreeSet<String> = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .filter_map(|e| Some(format!("{} {}", e.reason?, e.message?)))
            .collect();
        if warnings.len() >= 2 || Instant::now() >= deadline {
            break warnings;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(
        warnings.len(),
        2,
        "{warnings:?}; pods {:?}",
        Api::<Pod>::namespaced(client.clone(), refused.name())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len()
    );
    let mut warnings = warnings.into_iter();
    let claim = warnings.next().unwrap_or_default();
    let pod = warnings.next().unwrap_or_default();
    assert!(
        claim.starts_with(
            "FailedCreate Create Claim data-db-0 for Pod db-0 in StatefulSet db failed error:"
        ) && claim.contains("forbidden"),
        "{claim}"
    );
    assert!(
        pod.starts_with("FailedCreate Create Pod db-0 in StatefulSet db failed error:"),
        "{pod}"
    );

    // The other namespace's StatefulSet is not held up.
    let fine_sets: Api<StatefulSet> = Api::namespaced(client.clone(), fine.name());
    let fine_pods: Api<Pod> = Api::namespaced(client.clone(), fine.name());
    let mut first = None;
    settled(&fine_sets, &fine_pods, 3, 3, &mut first).await;

    // The quota gone, the backoff's next try makes them.
    quotas.delete("none", &Default::default()).await.unwrap();
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), refused.name());
    let pods: Api<Pod> = Api::namespaced(client.clone(), refused.name());
    let mut first = None;
    settled(&sets, &pods, 3, 3, &mut first).await;
    switchyard.stop().await;
}
