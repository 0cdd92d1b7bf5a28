//! The pod garbage collector's decisions (kube-controller-manager's `pod-garbage-collector`,
//! `pkg/controller/podgc`): which Pods a sweep force-deletes, in which order, and with
//! which status written first.
//!
//! A sweep looks at every Pod and Node, in kube-controller-manager's order:
//!
//! 1. **terminated** Pods (phase neither `Pending`, `Running` nor `Unknown`) above the
//!    threshold (`--terminated-pod-gc-threshold`, 12,500; 0 turns this off): the evicted
//!    first, then the oldest, then by name;
//! 2. **terminating** Pods on a Node that is not Ready and carries the
//!    `node.kubernetes.io/out-of-service` taint;
//! 3. **orphaned** Pods, bound to a Node that no longer exists: a Node missing from the
//!    cache is held in quarantine for 40 s and then read from the apiserver; only one the
//!    apiserver does not have either is deleted, its Pods marked with a `DisruptionTarget`
//!    condition (`DeletionByPodGC`);
//! 4. **unscheduled terminating** Pods: being deleted, bound to no Node.
//!
//! Each Pod chosen is marked `Failed` first (unless it already finished) and then deleted
//! with a grace period of 0.

use std::{
    borrow::Borrow,
    cmp::Ordering,
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{Node, Pod},
    jiff::Timestamp,
};
use serde_json::{Value, json};

/// How often kube-controller-manager sweeps (`gcCheckPeriod`).
pub const SWEEP_PERIOD: Duration = Duration::from_secs(20);

/// How soon a Node's change has the sweep run: at once when the Node is gone (the cache no
/// longer has it), so that its Pods' quarantine starts with the deletion, as
/// kube-controller-manager's does; otherwise within a period, which only seeds the sweep:
/// a sweep due sooner stays due then, so Nodes relabelled by the hundred sweep no more often
/// than every [`SWEEP_PERIOD`], as kube-controller-manager's loop does.
pub fn sweep_after(node_cached: bool) -> Duration {
    if node_cached {
        SWEEP_PERIOD
    } else {
        Duration::ZERO
    }
}

/// How long a Node missing from the cache waits before it is read from the apiserver
/// (`quarantineTime`): a Pod may be seen bound to a Node the cache has not seen yet.
pub const QUARANTINE: Duration = Duration::from_secs(40);

/// kube-controller-manager's default `--terminated-pod-gc-threshold`.
pub const DEFAULT_TERMINATED_THRESHOLD: u32 = 12_500;

/// The taint that says a Node is out of service (its Pods may be deleted without it).
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// Why a Pod is deleted: kube-controller-manager's `reason` label of
/// `pod_gc_collector_force_delete_pods_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    Terminated,
    TerminatingOutOfService,
    Orphaned,
    TerminatingUnscheduled,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Terminated => "terminated",
            Self::TerminatingOutOfService => "out-of-service",
            Self::Orphaned => "orphaned",
            Self::TerminatingUnscheduled => "unscheduled",
        }
    }
}

/// One Pod to delete.
#[derive(Debug, Clone, PartialEq)]
pub struct Deletion {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub reason: Reason,
    /// The strategic merge patch of its status (`Failed`, and for an orphan the
    /// `DisruptionTarget` condition) to write before the deletion; `None` for a Pod that
    /// already finished.
    pub status_patch: Option<Value>,
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

/// `isPodTerminated`: a phase other than `Pending`, `Running` and `Unknown` (an empty
/// phase counts as terminated, as it does in kube-controller-manager).
pub fn is_terminated(pod: &Pod) -> bool {
    !matches!(phase(pod), "Pending" | "Running" | "Unknown")
}

fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn node_name(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

/// `eviction.PodIsEvicted`: failed with reason `Evicted`.
fn is_evicted(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some("Failed") && s.reason.as_deref() == Some("Evicted")
    })
}

/// `byEvictionAndCreationTimestamp`: evicted Pods first, then the oldest, then by name.
fn eviction_then_age(a: &Pod, b: &Pod) -> Ordering {
    is_evicted(b)
        .cmp(&is_evicted(a))
        .then_with(|| {
            let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            created(a).cmp(&created(b))
        })
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// `nodeutil.IsNodeReady`: the `Ready` condition is `True`.
fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn out_of_service(node: &Node) -> bool {
    !is_ready(node)
        && node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT))
}

/// The Nodes missing from the cache that Pods are bound to, each with when a sweep first
/// saw it missing: kube-controller-manager's delaying queue of Node names. It lives as long
/// as the process that sweeps (a key that moves to another replica starts its quarantines
/// again, as a new kube-controller-manager leader does).
#[derive(Debug, Default, Clone)]
pub struct Quarantine {
    since: BTreeMap<String, Timestamp>,
}

impl Quarantine {
    /// Records the Nodes `pods` are bound to that are not among `nodes`, and returns those
    /// whose quarantine is over: to be read from the apiserver, and taken out of
    /// quarantine (a sweep that still misses one puts it back for another 40 s).
    pub fn due(
        &mut self,
        pods: &[impl Borrow<Pod>],
        nodes: &[impl Borrow<Node>],
        now: Timestamp,
    ) -> Vec<String> {
        let existing: BTreeSet<&str> = nodes
            .iter()
            .filter_map(|n| n.borrow().metadata.name.as_deref())
            .collect();
        let missing: BTreeSet<&str> = pods
            .iter()
            .map(|p| node_name(p.borrow()))
            .filter(|n| !n.is_empty() && !existing.contains(n))
            .collect();
        // A Node that came back, or that no Pod is bound to any more, needs no check.
        self.since.retain(|n, _| missing.contains(n.as_str()));
        for name in &missing {
            self.since.entry((*name).to_owned()).or_insert(now);
        }
        let due: Vec<String> = self
            .since
            .iter()
            .filter(|(_, since)| now.duration_since(**since).unsigned_abs() >= QUARANTINE)
            .map(|(name, _)| name.clone())
            .collect();
        for name in &due {
            self.since.remove(name);
        }
        due
    }

    /// How many Nodes are in quarantine.
    pub fn len(&self) -> usize {
        self.since.len()
    }

    pub fn is_empty(&self) -> bool {
        self.since.is_empty()
    }
}

/// What one sweep deletes, in order: terminated Pods over `threshold`, terminating Pods on
/// out-of-service Nodes, Pods on `deleted_nodes` (Nodes the apiserver confirmed gone after
/// their quarantine), unscheduled terminating Pods. A Pod is listed once, for the first
/// reason that holds.
pub fn sweep(
    pods: &[impl Borrow<Pod>],
    nodes: &[impl Borrow<Node>],
    threshold: u32,
    deleted_nodes: &BTreeSet<String>,
    now: Timestamp,
) -> Vec<Deletion> {
    let pods: Vec<&Pod> = pods.iter().map(Borrow::borrow).collect();
    let nodes: Vec<&Node> = nodes.iter().map(Borrow::borrow).collect();
    let mut chosen: Vec<(&Pod, Reason)> = Vec::new();
    if threshold > 0 {
        let mut terminated: Vec<&Pod> = pods.iter().copied().filter(|p| is_terminated(p)).collect();
        let excess = terminated.len().saturating_sub(threshold as usize);
        if excess > 0 {
            terminated.sort_by(|a, b| eviction_then_age(a, b));
            chosen.extend(
                terminated
                    .into_iter()
                    .take(excess)
                    .map(|p| (p, Reason::Terminated)),
            );
        }
    }
    let by_name: BTreeMap<&str, &Node> = nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, *n)))
        .collect();
    let mut out_of_service: Vec<&Pod> = pods
        .iter()
        .copied()
        .filter(|p| is_terminating(p))
        .filter(|p| by_name.get(node_name(p)).is_some_and(|n| out_of_service(n)))
        .collect();
    out_of_service.sort_by(|a, b| eviction_then_age(a, b));
    chosen.extend(
        out_of_service
            .into_iter()
            .map(|p| (p, Reason::TerminatingOutOfService)),
    );
    chosen.extend(
        pods.iter()
            .copied()
            .filter(|p| deleted_nodes.contains(node_name(p)))
            .map(|p| (p, Reason::Orphaned)),
    );
    chosen.extend(
        pods.iter()
            .copied()
            .filter(|p| is_terminating(p) && node_name(p).is_empty())
            .map(|p| (p, Reason::TerminatingUnscheduled)),
    );

    let mut seen = BTreeSet::new();
    chosen
        .into_iter()
        .filter(|(pod, _)| seen.insert(pod.metadata.uid.clone()))
        .map(|(pod, reason)| Deletion {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            reason,
            status_patch: failed_status(pod, reason == Reason::Orphaned, now),
        })
        .collect()
}

/// `markFailedAndDeletePodWithCondition`'s status write: `Failed`, the Pod's generation
/// observed, and for an orphan the `DisruptionTarget` condition; guarded by the Pod's UID.
/// `None` for a Pod that already succeeded or failed.
fn failed_status(pod: &Pod, orphaned: bool, now: Timestamp) -> Option<Value> {
    if matches!(phase(pod), "Succeeded" | "Failed") {
        return None;
    }
    let generation = pod.metadata.generation.unwrap_or_default();
    let mut status = json!({"phase": "Failed", "observedGeneration": generation});
    if orphaned {
        status["conditions"] = json!([{
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "DeletionByPodGC",
            "message": "PodGC: node no longer exists",
            "observedGeneration": generation,
            "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        }]);
    }
    Some(json!({"metadata": {"uid": pod.metadata.uid}, "status": status}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn pod(name: &str, phase: &str, node: &str, created: i64) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                         "generation": 1,
                         "creationTimestamp": at(created).to_string()},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn terminating(mut pod: Pod) -> Pod {
        pod.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(0)));
        pod
    }

    fn node(name: &str, ready: bool, taint: Option<&str>) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"taints": taint.map(|t| vec![json!({"key": t, "effect": "NoExecute"})])},
            "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]},
        }))
        .unwrap()
    }

    fn names(deletions: &[Deletion]) -> Vec<(&str, Reason)> {
        deletions
            .iter()
            .map(|d| (d.name.as_str(), d.reason))
            .collect()
    }

    #[test]
    fn a_node_gone_sweeps_at_once_and_a_change_to_one_cached_within_a_period() {
        assert_eq!(sweep_after(false), Duration::ZERO);
        assert_eq!(sweep_after(true), SWEEP_PERIOD);
    }

    #[test]
    fn terminated_pods_above_the_threshold_go_evicted_first_then_oldest() {
        let mut evicted = pod("evicted", "Failed", "n", 50);
        evicted.status.as_mut().unwrap().reason = Some("Evicted".into());
        let pods = vec![
            pod("new", "Succeeded", "n", 30),
            pod("old", "Failed", "n", 10),
            pod("b-same", "Succeeded", "n", 20),
            pod("a-same", "Succeeded", "n", 20),
            evicted,
            pod("running", "Running", "n", 0),
            pod("pending", "Pending", "n", 0),
            pod("unknown", "Unknown", "n", 0),
        ];
        let nodes = [node("n", true, None)];
        let none = BTreeSet::new();
        let deleted = sweep(&pods, &nodes, 2, &none, at(100));
        assert_eq!(
            names(&deleted),
            [
                ("evicted", Reason::Terminated),
                ("old", Reason::Terminated),
                ("a-same", Reason::Terminated),
            ]
        );
        // Finished Pods are deleted as they are: no status write.
        assert!(deleted.iter().all(|d| d.status_patch.is_none()));
        assert!(sweep(&pods, &nodes, 5, &none, at(100)).is_empty());
        assert!(
            sweep(&pods, &nodes, 0, &none, at(100)).is_empty(),
            "0 turns it off"
        );
    }

    #[test]
    fn an_empty_phase_counts_as_terminated_and_is_marked_failed() {
        let pods = [pod("no-phase", "", "n", 0)];
        let deleted = sweep(&pods, &[node("n", true, None)], 1, &BTreeSet::new(), at(0));
        assert!(deleted.is_empty());
        let mut two = pods.to_vec();
        two.push(pod("done", "Succeeded", "n", 5));
        let deleted = sweep(&two, &[node("n", true, None)], 1, &BTreeSet::new(), at(0));
        assert_eq!(names(&deleted), [("no-phase", Reason::Terminated)]);
        assert_eq!(
            deleted[0].status_patch.as_ref().unwrap()["status"]["phase"],
            "Failed"
        );
    }

    #[test]
    fn terminating_pods_on_an_out_of_service_node_that_is_not_ready() {
        let pods = vec![
            terminating(pod("on-oos", "Running", "oos", 0)),
            pod("alive-on-oos", "Running", "oos", 0),
            terminating(pod("on-ready-oos", "Running", "ready-oos", 0)),
            terminating(pod("on-not-ready", "Running", "not-ready", 0)),
            terminating(pod("on-missing", "Running", "missing", 0)),
        ];
        let nodes = [
            node("oos", false, Some(OUT_OF_SERVICE_TAINT)),
            node("ready-oos", true, Some(OUT_OF_SERVICE_TAINT)),
            node("not-ready", false, Some("node.kubernetes.io/unreachable")),
        ];
        let deleted = sweep(&pods, &nodes, 0, &BTreeSet::new(), at(0));
        assert_eq!(
            names(&deleted),
            [("on-oos", Reason::TerminatingOutOfService)]
        );
        let patch = deleted[0].status_patch.as_ref().unwrap();
        assert_eq!(patch["status"]["phase"], "Failed");
        assert_eq!(patch["metadata"]["uid"], "uid-on-oos");
        assert!(patch["status"].get("conditions").is_none());
    }

    #[test]
    fn orphans_of_a_confirmed_deleted_node_get_the_disruption_condition() {
        let pods = vec![
            pod("orphan", "Running", "gone", 0),
            pod("finished-orphan", "Succeeded", "gone", 0),
            pod("kept", "Running", "n", 0),
        ];
        let deleted: BTreeSet<String> = ["gone".to_owned()].into();
        let out = sweep(&pods, &[node("n", true, None)], 0, &deleted, at(7));
        assert_eq!(
            names(&out),
            [
                ("orphan", Reason::Orphaned),
                ("finished-orphan", Reason::Orphaned)
            ]
        );
        let status = &out[0].status_patch.as_ref().unwrap()["status"];
        assert_eq!(status["conditions"][0]["type"], "DisruptionTarget");
        assert_eq!(status["conditions"][0]["reason"], "DeletionByPodGC");
        assert_eq!(
            status["conditions"][0]["message"],
            "PodGC: node no longer exists"
        );
        assert_eq!(status["observedGeneration"], 1);
        assert!(out[1].status_patch.is_none());
    }

    #[test]
    fn unscheduled_terminating_pods_go_and_a_pod_is_listed_once() {
        let pods = vec![
            terminating(pod("unscheduled", "Pending", "", 0)),
            pod("waiting", "Pending", "", 0),
            terminating(pod("both", "", "", 0)),
            pod("done", "Succeeded", "n", 5),
        ];
        let out = sweep(&pods, &[] as &[Node], 1, &BTreeSet::new(), at(0));
        assert_eq!(
            names(&out),
            [
                ("both", Reason::Terminated),
                ("unscheduled", Reason::TerminatingUnscheduled),
            ]
        );
    }

    #[test]
    fn a_missing_node_is_read_again_only_after_its_quarantine() {
        let pods = vec![
            pod("p", "Running", "gone", 0),
            pod("q", "Running", "late", 0),
        ];
        let nodes = [node("late", true, None)];
        let mut quarantine = Quarantine::default();
        assert!(quarantine.due(&pods, &[] as &[Node], at(0)).is_empty());
        assert_eq!(quarantine.len(), 2);
        // The late Node arrived in the cache: it needs no check.
        assert!(quarantine.due(&pods, &nodes, at(20)).is_empty());
        assert_eq!(quarantine.len(), 1);
        assert_eq!(quarantine.due(&pods, &nodes, at(40)), ["gone"]);
        assert!(quarantine.is_empty(), "taken out once due");
        // Still missing at the next sweep: another quarantine.
        assert!(quarantine.due(&pods, &nodes, at(60)).is_empty());
        assert!(quarantine.due(&pods, &nodes, at(99)).is_empty());
        assert_eq!(quarantine.due(&pods, &nodes, at(100)), ["gone"]);
        // No Pod is bound to it any more: forgotten.
        quarantine.due(&pods, &nodes, at(101));
        assert!(quarantine.due(&pods[1..], &nodes, at(102)).is_empty());
        assert!(quarantine.is_empty());
    }
}
