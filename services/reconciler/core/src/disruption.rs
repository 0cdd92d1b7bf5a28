//! The disruption controller's decisions, as kube-controller-manager's
//! `pkg/controller/disruption` makes them: a PodDisruptionBudget's status, which the
//! apiserver's eviction API reads before it lets a Pod go.
//!
//! ```text
//!  pods the selector matches ─► expected: minAvailable as a number: the Pods' count;
//!                               otherwise the scale of each Pod's controller, summed
//!                               (a ReplicaSet of a Deployment counts the Deployment's)
//!                            ─► desired healthy: minAvailable, or expected - maxUnavailable
//!                               (percentages rounded up)
//!  disruptedPods (written by evictions) ─► kept until 2 min past, then dropped
//!  ready Pods, not being deleted, not just disrupted ─► currentHealthy
//!  ─► disruptionsAllowed = currentHealthy - desiredHealthy (≥ 0; 0 with no expected Pods)
//!     and the DisruptionAllowed condition
//!  a Pod's DisruptionTarget condition True for 2 min without the Pod going (an eviction
//!     whose delete failed), not the kubelet's, not on a finished Pod ─► set back to False
//! ```

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::{
        core::v1::{Pod, PodCondition},
        policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus},
    },
    apimachinery::pkg::{
        apis::meta::v1::{Condition, OwnerReference, Time},
        util::intstr::IntOrString,
    },
    jiff::{SignedDuration, Timestamp},
};

use crate::{
    deployment::scaled_value,
    replicaset::{controller_of, is_ready},
    selector::{Selector, SelectorError},
};

/// How long an evicted Pod counts as disrupted before the controller expects it gone
/// (`DeletionTimeout`).
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);
/// The condition the status carries.
pub const DISRUPTION_ALLOWED: &str = "DisruptionAllowed";
pub const SUFFICIENT_PODS: &str = "SufficientPods";
pub const INSUFFICIENT_PODS: &str = "InsufficientPods";
pub const SYNC_FAILED: &str = "SyncFailed";
/// The condition evictions, preemption and the taint manager set on a Pod they are about
/// to delete (`v1.DisruptionTarget`).
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
/// How long a Pod may carry [`DISRUPTION_TARGET`] without being deleted before the
/// condition is set back to False (`stalePodDisruptionTimeout`).
pub const STALE_DISRUPTION_TIMEOUT: Duration = Duration::from_secs(120);
/// The kubelet's reason for [`DISRUPTION_TARGET`]: never stale, as the Pod may take any
/// time to terminate (`v1.PodReasonTerminationByKubelet`).
pub const TERMINATION_BY_KUBELET: &str = "TerminationByKubelet";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error("spec.{0}")]
    Selector(#[from] SelectorError),
    #[error("{0}")]
    Scale(String),
}

/// The budget's selector (`policy/v1`: an empty one selects every Pod of the namespace).
pub fn selector(pdb: &PodDisruptionBudget) -> Result<Selector, BudgetError> {
    let selector = pdb
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .unwrap_or_default();
    Ok(Selector::new(&selector)?)
}

/// Whether the expected count needs the scale of the Pods' controllers: `maxUnavailable`,
/// or `minAvailable` as a percentage.
pub fn needs_scale(pdb: &PodDisruptionBudget) -> bool {
    let spec = pdb.spec.as_ref();
    spec.and_then(|s| s.max_unavailable.as_ref()).is_some()
        || matches!(
            spec.and_then(|s| s.min_available.as_ref()),
            Some(IntOrString::String(_))
        )
}

/// The expected Pods and how many must stay healthy (`getExpectedPodCount`), from `scales`:
/// each controller UID's replicas. Pods without a controller are returned by name
/// (`UnmanagedPods`); a controller missing from `scales` fails, as kube-controller-manager's
/// "found no controllers for pod".
pub fn expected(
    pdb: &PodDisruptionBudget,
    pods: &[&Pod],
    scales: &BTreeMap<String, i32>,
) -> Result<(i32, i32, Vec<String>), BudgetError> {
    let spec = pdb.spec.clone().unwrap_or_default();
    let scaled = |value: &IntOrString, total: i32, field: &'static str| {
        scaled_value(value, total, true, field).map_err(|e| BudgetError::Scale(e.to_string()))
    };
    if let Some(max) = &spec.max_unavailable {
        let (expected, unmanaged) = expected_scale(pods, scales)?;
        let max = scaled(max, expected, "maxUnavailable")?;
        return Ok((expected, (expected - max).max(0), unmanaged));
    }
    match &spec.min_available {
        Some(IntOrString::Int(min)) => Ok((
            i32::try_from(pods.len()).unwrap_or(i32::MAX),
            *min,
            Vec::new(),
        )),
        Some(min @ IntOrString::String(_)) => {
            let (expected, unmanaged) = expected_scale(pods, scales)?;
            Ok((expected, scaled(min, expected, "minAvailable")?, unmanaged))
        }
        None => Ok((0, 0, Vec::new())),
    }
}

/// The controller references of `pods`, one per controller, in order: whose scale
/// [`expected`] needs.
pub fn controllers<'p>(pods: &[&'p Pod]) -> Vec<&'p OwnerReference> {
    let mut seen: Vec<&OwnerReference> = Vec::new();
    for pod in pods {
        if let Some(r) = controller_of(pod)
            && !seen.iter().any(|s| s.uid == r.uid)
        {
            seen.push(r);
        }
    }
    seen
}

fn expected_scale(
    pods: &[&Pod],
    scales: &BTreeMap<String, i32>,
) -> Result<(i32, Vec<String>), BudgetError> {
    let mut counted: BTreeMap<&str, i32> = BTreeMap::new();
    let mut unmanaged = Vec::new();
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let Some(controller) = controller_of(pod) else {
            unmanaged.push(name);
            continue;
        };
        let Some(scale) = scales.get(&controller.uid) else {
            return Err(BudgetError::Scale(format!(
                "found no controllers for pod {name:?}"
            )));
        };
        counted.insert(controller.uid.as_str(), *scale);
    }
    Ok((counted.values().sum(), unmanaged))
}

/// The evicted Pods still counted as disrupted, the earliest time one of them expires
/// (when to look again), and those past [`DELETION_TIMEOUT`] yet not deleted (an Event
/// each) (`buildDisruptedPodMap`).
pub fn disrupted(
    pdb: &PodDisruptionBudget,
    pods: &[&Pod],
    now: Timestamp,
) -> (BTreeMap<String, Time>, Option<Timestamp>, Vec<String>) {
    let mut kept = BTreeMap::new();
    let mut recheck: Option<Timestamp> = None;
    let mut overdue = Vec::new();
    let Some(recorded) = pdb.status.as_ref().and_then(|s| s.disrupted_pods.as_ref()) else {
        return (kept, recheck, overdue);
    };
    let timeout = SignedDuration::try_from(DELETION_TIMEOUT).unwrap_or_default();
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = pod.metadata.name.clone().unwrap_or_default();
        let Some(at) = recorded.get(&name) else {
            continue;
        };
        let expires = at.0 + timeout;
        if expires < now {
            overdue.push(name);
        } else {
            recheck = Some(recheck.map_or(expires, |r| r.min(expires)));
            kept.insert(name, at.clone());
        }
    }
    (kept, recheck, overdue)
}

/// Whether the Pod carries a [`DISRUPTION_TARGET`] condition that goes stale, and in how
/// long (zero: stale now) (`nonTerminatingPodHasStaleDisruptionCondition`): True, set by
/// anyone but the kubelet, on a Pod neither being deleted nor finished.
pub fn stale_disruption_in(pod: &Pod, now: Timestamp) -> Option<Duration> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let condition = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == DISRUPTION_TARGET)?;
    if condition.status != "True" || condition.reason.as_deref() == Some(TERMINATION_BY_KUBELET) {
        return None;
    }
    let since = condition.last_transition_time.as_ref().map_or(now, |t| t.0);
    let timeout = SignedDuration::try_from(STALE_DISRUPTION_TIMEOUT).unwrap_or_default();
    let left = (since + timeout).duration_since(now);
    Some(Duration::try_from(left).unwrap_or_default())
}

/// The Pod's conditions with [`DISRUPTION_TARGET`] set back to False, as
/// `UpdatePodCondition` writes it: the condition replaced by one with no reason or message,
/// its transition time `now`, and the Pod's generation as observed.
pub fn without_disruption(pod: &Pod, now: Timestamp) -> Vec<PodCondition> {
    let mut conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    for condition in &mut conditions {
        if condition.type_ == DISRUPTION_TARGET {
            *condition = PodCondition {
                type_: DISRUPTION_TARGET.to_owned(),
                status: "False".to_owned(),
                last_transition_time: Some(Time(now)),
                observed_generation: pod.metadata.generation,
                ..PodCondition::default()
            };
        }
    }
    conditions
}

/// Ready Pods not being deleted and not disrupted within [`DELETION_TIMEOUT`]
/// (`countHealthyPods`).
pub fn current_healthy(pods: &[&Pod], disrupted: &BTreeMap<String, Time>, now: Timestamp) -> i32 {
    let timeout = SignedDuration::try_from(DELETION_TIMEOUT).unwrap_or_default();
    let healthy = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            disrupted
                .get(p.metadata.name.as_deref().unwrap_or_default())
                .is_none_or(|at| at.0 + timeout <= now)
        })
        .filter(|p| is_ready(p))
        .count();
    i32::try_from(healthy).unwrap_or(i32::MAX)
}

/// The status to write (`updatePdbStatus`), the condition set as `meta.SetStatusCondition`
/// would (its transition time kept while its status holds).
pub fn status(
    pdb: &PodDisruptionBudget,
    current_healthy: i32,
    desired_healthy: i32,
    expected_pods: i32,
    disrupted_pods: BTreeMap<String, Time>,
    now: Timestamp,
) -> PodDisruptionBudgetStatus {
    let mut allowed = current_healthy - desired_healthy;
    if expected_pods <= 0 || allowed <= 0 {
        allowed = 0;
    }
    let observed = pdb.metadata.generation;
    let (status, reason) = if allowed > 0 {
        ("True", SUFFICIENT_PODS)
    } else {
        ("False", INSUFFICIENT_PODS)
    };
    PodDisruptionBudgetStatus {
        current_healthy,
        desired_healthy,
        expected_pods,
        disruptions_allowed: allowed,
        disrupted_pods: (!disrupted_pods.is_empty()).then_some(disrupted_pods),
        observed_generation: observed,
        conditions: Some(with_condition(pdb, status, reason, "", observed, now)),
    }
}

/// The status after a failed sync (`failSafe`): no disruption allowed, and why.
pub fn fail_safe(
    pdb: &PodDisruptionBudget,
    message: &str,
    now: Timestamp,
) -> PodDisruptionBudgetStatus {
    let mut status = pdb.status.clone().unwrap_or_default();
    status.disruptions_allowed = 0;
    let observed = status.observed_generation;
    status.conditions = Some(with_condition(
        pdb,
        "False",
        SYNC_FAILED,
        message,
        observed,
        now,
    ));
    status
}

fn with_condition(
    pdb: &PodDisruptionBudget,
    status: &str,
    reason: &str,
    message: &str,
    observed: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let mut conditions = pdb
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    match conditions
        .iter_mut()
        .find(|c| c.type_ == DISRUPTION_ALLOWED)
    {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = Time(now);
            }
            c.status = status.into();
            c.reason = reason.into();
            c.message = message.into();
            c.observed_generation = observed;
        }
        None => conditions.push(Condition {
            type_: DISRUPTION_ALLOWED.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: observed,
            last_transition_time: Time(now),
        }),
    }
    conditions
}

/// Whether `new` must be written: a count, the disrupted Pods, the observed generation or
/// the condition differs (`updatePdbStatus`'s check and `ConditionsAreUpToDate`).
pub fn status_changed(pdb: &PodDisruptionBudget, new: &PodDisruptionBudgetStatus) -> bool {
    let Some(old) = pdb.status.as_ref() else {
        return true;
    };
    let condition = |s: &PodDisruptionBudgetStatus| {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == DISRUPTION_ALLOWED)
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    old.current_healthy != new.current_healthy
        || old.desired_healthy != new.desired_healthy
        || old.expected_pods != new.expected_pods
        || old.disruptions_allowed != new.disruptions_allowed
        || old.disrupted_pods.clone().unwrap_or_default()
            != new.disrupted_pods.clone().unwrap_or_default()
        || old.observed_generation != pdb.metadata.generation
        || condition(old) != condition(new)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    fn budget(spec: serde_json::Value, status: serde_json::Value) -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": {"name": "b", "namespace": "ns", "generation": 2},
            "spec": spec,
            "status": status,
        }))
        .unwrap()
    }

    fn pod(name: &str, controller: Option<&str>, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "namespace": "ns",
                "labels": {"app": "web"},
                "ownerReferences": controller.map(|uid| vec![json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": uid, "controller": true,
                })]),
            },
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }))
        .unwrap()
    }

    #[test]
    fn max_unavailable_counts_the_controllers_scale_rounded_up() {
        let pdb = budget(json!({"maxUnavailable": "34%"}), json!(null));
        let pods = [pod("a", Some("rs1"), true), pod("b", Some("rs1"), true)];
        let refs: Vec<&Pod> = pods.iter().collect();
        assert!(needs_scale(&pdb));
        assert_eq!(controllers(&refs).len(), 1);
        let scales = BTreeMap::from([("rs1".to_owned(), 3)]);
        // 34% of 3 rounds up to 2: desired 1.
        assert_eq!(expected(&pdb, &refs, &scales), Ok((3, 1, vec![])));
        assert_eq!(
            expected(&pdb, &refs, &BTreeMap::new()),
            Err(BudgetError::Scale(
                r#"found no controllers for pod "a""#.into()
            ))
        );
    }

    #[test]
    fn min_available_as_a_number_counts_the_pods_and_a_percentage_the_scale() {
        let pods = [pod("a", None, true), pod("b", Some("rs1"), false)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let number = budget(json!({"minAvailable": 1}), json!(null));
        assert!(!needs_scale(&number));
        assert_eq!(
            expected(&number, &refs, &BTreeMap::new()),
            Ok((2, 1, vec![]))
        );
        let percent = budget(json!({"minAvailable": "50%"}), json!(null));
        let scales = BTreeMap::from([("rs1".to_owned(), 4)]);
        assert_eq!(
            expected(&percent, &refs, &scales),
            Ok((4, 2, vec!["a".to_owned()]))
        );
    }

    #[test]
    fn the_status_allows_what_is_healthy_beyond_desired_and_says_so() {
        let pdb = budget(json!({"minAvailable": 1}), json!(null));
        let pods = [
            pod("a", None, true),
            pod("b", None, true),
            pod("c", None, false),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        let (disrupted, recheck, overdue) = disrupted(&pdb, &refs, now());
        assert!(disrupted.is_empty() && recheck.is_none() && overdue.is_empty());
        let healthy = current_healthy(&refs, &disrupted, now());
        assert_eq!(healthy, 2);
        let status = status(&pdb, healthy, 1, 3, disrupted, now());
        assert_eq!(status.disruptions_allowed, 1);
        assert_eq!(status.observed_generation, Some(2));
        let condition = &status.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("True", SUFFICIENT_PODS)
        );
        assert!(status_changed(&pdb, &status));
        let mut written = pdb.clone();
        written.status = Some(status.clone());
        assert!(!status_changed(&written, &status));
        // No expected Pods: nothing allowed.
        let none = super::status(&pdb, 2, 0, 0, BTreeMap::new(), now());
        assert_eq!(none.disruptions_allowed, 0);
        let failed = fail_safe(&written, "boom", now());
        assert_eq!(failed.disruptions_allowed, 0);
        assert_eq!(failed.conditions.as_ref().unwrap()[0].reason, SYNC_FAILED);
    }

    #[test]
    fn an_evicted_pod_is_not_healthy_until_its_deletion_is_overdue() {
        let evicted_at = now() - SignedDuration::from_secs(30);
        let pdb = budget(
            json!({"minAvailable": 1}),
            json!({"disruptedPods": {"a": Time(evicted_at), "gone": Time(evicted_at)},
                   "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0, "disruptionsAllowed": 0}),
        );
        let pods = [pod("a", None, true), pod("b", None, true)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let (kept, recheck, overdue) = disrupted(&pdb, &refs, now());
        assert_eq!(kept.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(recheck, Some(evicted_at + SignedDuration::from_secs(120)));
        assert!(overdue.is_empty());
        assert_eq!(current_healthy(&refs, &kept, now()), 1);
        let later = now() + SignedDuration::from_secs(100);
        let (kept, _, overdue) = disrupted(&pdb, &refs, later);
        assert!(kept.is_empty());
        assert_eq!(overdue, ["a"]);
        assert_eq!(current_healthy(&refs, &kept, later), 2);
    }

    fn disrupted_pod(reason: &str, since_seconds: i64, phase: &str, deleting: bool) -> Pod {
        let since = now() - SignedDuration::from_secs(since_seconds);
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "generation": 3,
                         "deletionTimestamp": deleting.then(|| now().to_string())},
            "status": {"phase": phase, "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": DISRUPTION_TARGET, "status": "True", "reason": reason,
                 "message": "Eviction API: evicting", "lastTransitionTime": since.to_string()},
            ]},
        }))
        .unwrap()
    }

    #[test]
    fn a_disruption_target_left_on_a_pod_goes_stale_after_two_minutes() {
        let evicted = "EvictionByEvictionAPI";
        assert_eq!(
            stale_disruption_in(&disrupted_pod(evicted, 30, "Running", false), now()),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            stale_disruption_in(&disrupted_pod(evicted, 300, "Running", false), now()),
            Some(Duration::ZERO)
        );
        // The kubelet's, on a finished Pod, on one being deleted, or none: never stale.
        for pod in [
            disrupted_pod(TERMINATION_BY_KUBELET, 300, "Running", false),
            disrupted_pod(evicted, 300, "Failed", false),
            disrupted_pod(evicted, 300, "Running", true),
            pod("plain", None, true),
        ] {
            assert_eq!(stale_disruption_in(&pod, now()), None);
        }

        let reset = without_disruption(&disrupted_pod(evicted, 300, "Running", false), now());
        assert_eq!(reset[0].type_, "Ready");
        assert_eq!(
            reset[1],
            PodCondition {
                type_: DISRUPTION_TARGET.to_owned(),
                status: "False".to_owned(),
                last_transition_time: Some(Time(now())),
                observed_generation: Some(3),
                ..PodCondition::default()
            }
        );
    }
}
