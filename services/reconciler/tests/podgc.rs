//! The pod garbage collector against the real control plane, beside kube-controller-
//! manager's `pod-garbage-collector-controller` (each on a control plane of its own, at the
//! same time, both with `--terminated-pod-gc-threshold` 7): the same Pods end in the same
//! states.
//!
//! - `t-0` … `t-4` succeeded, then `evicted` failed with reason `Evicted`: above the
//!   threshold, the evicted one goes first, then the oldest (`t-0`);
//! - `orphan`, bound to a Node that is then deleted: marked `Failed` with a
//!   `DisruptionTarget` condition (`DeletionByPodGC`) and deleted, no sooner than the 40 s
//!   quarantine after the Node went;
//! - `out-of-service`, being deleted on a Node that is not Ready and carries the
//!   `node.kubernetes.io/out-of-service` taint: marked `Failed` and deleted;
//! - `unscheduled`, being deleted and bound to no Node: marked `Failed` and deleted;
//! - `not-ready`, being deleted on a Node that is not Ready but not out of service, and
//!   `idle`, running nowhere in particular: left alone.
//!
//! The Pods being deleted keep a finalizer of the test's, so that what the collector wrote
//! before its deletion can be read. The Nodes are not kwok's: nothing makes them Ready.
//! A binary of its own: a collector acts on every Pod of its cluster.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use serde_json::json;
use switchyard_k8s::{
    Api, Client, DeleteParams, Pod, PostParams,
    k8s_openapi::api::core::v1::Node,
    kube::api::{ListParams, Patch, PatchParams},
};
use switchyard_testenv::{ControlPlane, ControlPlaneOptions, TestNamespace};

const THRESHOLD: u32 = 7;
/// A sweep every 20 s, a 40 s quarantine, and a sweep to find it over.
const COLLECTED_WITHIN: Duration = Duration::from_secs(120);
const HOLD: &str = "test.switchyard.io/hold";

/// What became of one Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Gone,
    Present {
        phase: String,
        deleting: bool,
        /// The reason of a true `DisruptionTarget` condition.
        disruption: Option<String>,
    },
}

fn present(phase: &str, deleting: bool, disruption: Option<&str>) -> Outcome {
    Outcome::Present {
        phase: phase.into(),
        deleting,
        disruption: disruption.map(Into::into),
    }
}

fn outcome(pod: Option<&Pod>) -> Outcome {
    let Some(pod) = pod else {
        return Outcome::Gone;
    };
    let status = pod.status.clone().unwrap_or_default();
    Outcome::Present {
        phase: status.phase.unwrap_or_default(),
        deleting: pod.metadata.deletion_timestamp.is_some(),
        disruption: status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
            .and_then(|c| c.reason.clone()),
    }
}

fn expected() -> BTreeMap<String, Outcome> {
    let mut expected = BTreeMap::new();
    for name in ["evicted", "t-0"] {
        expected.insert(name.to_owned(), Outcome::Gone);
    }
    for i in 1..5 {
        expected.insert(format!("t-{i}"), present("Succeeded", false, None));
    }
    expected.insert(
        "orphan".into(),
        present("Failed", true, Some("DeletionByPodGC")),
    );
    expected.insert("out-of-service".into(), present("Failed", true, None));
    expected.insert("unscheduled".into(), present("Failed", true, None));
    expected.insert("not-ready".into(), present("Pending", true, None));
    expected.insert("idle".into(), present("Pending", false, None));
    expected
}

async fn node(client: &Client, name: &str, taint: Option<&str>) {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"podgc-test": "true"}},
        "spec": {"taints": taint.map(|key| vec![json!({"key": key, "effect": "NoExecute"})])},
    }))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

/// A Pod bound to `node` (none: one the scheduler cannot place), held by the test's
/// finalizer when `hold`.
async fn pod(api: &Api<Pod>, name: &str, node: Option<&str>, hold: bool) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "finalizers": if hold { vec![HOLD] } else { vec![] }},
        "spec": {
            "nodeName": node,
            "nodeSelector": {"podgc-test": "nowhere"},
            "containers": [{"name": "c", "image": "registry.example/c:1"}],
        },
    }))
    .unwrap();
    api.create(&PostParams::default(), &pod).await.unwrap();
}

async fn finish(api: &Api<Pod>, name: &str, phase: &str, reason: Option<&str>) {
    let status = json!({"status": {"phase": phase, "reason": reason}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

async fn observe(api: &Api<Pod>, names: &[String]) -> BTreeMap<String, Outcome> {
    let pods = api.list(&ListParams::default()).await.unwrap();
    names
        .iter()
        .map(|name| {
            let pod = pods
                .items
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(name));
            (name.clone(), outcome(pod))
        })
        .collect()
}

/// Sets every scenario up on `side`'s namespace and Nodes, waits until the Pods are as
/// expected (or the time is up), cleans up, and returns what it saw and whether the orphan
/// outlived its Node by the quarantine.
async fn run(
    plane: &ControlPlane,
    client: &Client,
    side: &str,
) -> (BTreeMap<String, Outcome>, bool) {
    let namespace = TestNamespace::create(plane, client, &format!("podgc-{side}"))
        .await
        .unwrap();
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace.name());
    let nodes: Api<Node> = Api::all(client.clone());
    let (gone, oos, not_ready) = (
        format!("{side}-gone"),
        format!("{side}-oos"),
        format!("{side}-not-ready"),
    );
    node(client, &gone, None).await;
    node(client, &oos, Some("node.kubernetes.io/out-of-service")).await;
    node(client, &not_ready, None).await;

    // Terminated Pods, oldest first, the evicted one last: 6 of them, 9 terminated Pods
    // with the 3 the other scenarios fail, over a threshold of 7.
    for i in 0..5 {
        let name = format!("t-{i}");
        pod(&api, &name, None, false).await;
        finish(&api, &name, "Succeeded", None).await;
    }
    pod(&api, "evicted", None, false).await;
    finish(&api, "evicted", "Failed", Some("Evicted")).await;
    // Pods created within one second are ordered by name: the scenarios' come later.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    pod(&api, "idle", None, false).await;
    pod(&api, "unscheduled", None, true).await;
    pod(&api, "out-of-service", Some(&oos), true).await;
    pod(&api, "not-ready", Some(&not_ready), true).await;
    pod(&api, "orphan", Some(&gone), true).await;
    for name in ["unscheduled", "out-of-service", "not-ready"] {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    nodes.delete(&gone, &DeleteParams::default()).await.unwrap();
    let node_deleted = Instant::now();

    let expected = expected();
    let names: Vec<String> = expected.keys().cloned().collect();
    let started = Instant::now();
    let mut orphan_lived = None;
    let seen = loop {
        let seen = observe(&api, &names).await;
        if orphan_lived.is_none() && seen["orphan"] != present("Pending", false, None) {
            orphan_lived = Some(node_deleted.elapsed());
        }
        if seen == expected || started.elapsed() > COLLECTED_WITHIN {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("{side}: orphan collected {orphan_lived:?} after its node was deleted");

    // Nothing is left to a later test on this plane: every Pod and Node goes.
    for pod in api.list(&ListParams::default()).await.unwrap() {
        let name = pod.metadata.name.clone().unwrap();
        let release = json!({"metadata": {"finalizers": null}});
        let _ = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&release))
            .await;
        let _ = api
            .delete(&name, &DeleteParams::default().grace_period(0))
            .await;
    }
    for name in [&oos, &not_ready] {
        nodes.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let deadline = Instant::now() + COLLECTED_WITHIN;
    while !api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "{side}: pods left after the test"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The quarantine is 40 s; the Pod's deletion is seen within half a second of it.
    let quarantined = orphan_lived.is_some_and(|d| d >= Duration::from_secs(39));
    (seen, quarantined)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_collected_as_under_kube_controller_manager() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    // Switchyard's side on a control plane of its own, so that both run at once: each
    // collector acts on every Pod of its cluster.
    let own = ControlPlane::start(ControlPlaneOptions {
        nodes: 1,
        dir: None,
    })
    .await
    .expect("a second control plane");
    let own_client = own.client().await.unwrap();

    let threshold = format!("--terminated-pod-gc-threshold={THRESHOLD}");
    let under_kcm = async {
        let kcm = plane
            .start_controller_manager(&["pod-garbage-collector-controller"], &[&threshold])
            .await
            .expect("kube-controller-manager starts");
        let seen = run(plane, &client, "kcm").await;
        drop(kcm);
        seen
    };
    let tuning = switchyard_reconciler::Tuning {
        terminated_pod_gc_threshold: THRESHOLD,
        ..switchyard_reconciler::Tuning::default()
    };
    let under_switchyard = async {
        let switchyard =
            support::Builtins::start_tuned(&own, &[switchyard_reconciler::podgc::NAME], &tuning)
                .await;
        let seen = run(&own, &own_client, "sy").await;
        let deleted = switchyard.requests("delete", &["200"]).await;
        switchyard.stop().await;
        (seen, deleted)
    };
    let (under_kcm, (under_switchyard, deleted)) = tokio::join!(under_kcm, under_switchyard);
    own.stop();

    eprintln!("kube-controller-manager: {under_kcm:#?}");
    eprintln!("switchyard: {under_switchyard:#?}");
    assert_eq!(under_kcm, (expected(), true));
    assert_eq!(under_switchyard, under_kcm);
    assert!(deleted >= 5.0, "the reconciler deleted {deleted} pods");
}
