//! The delay before a failed Pod is replaced (`backoff_utils.go`): 10 s after the first
//! failure, doubling with each failure since the last success, at most 10 minutes.
//!
//! kube-controller-manager keeps the failures since the last success in memory, per Job. A
//! Switchyard reconcile may run on any replica, so the count is taken from the Job's Pods
//! instead: its failed Pods that finished after its last succeeded one. Finished Pods stay
//! until the Job goes (or the pod garbage collector's threshold is reached), so a
//! reconciler restart or a shard move keeps the backoff where kube-controller-manager's
//! restart resets it; a Pod deleted while running counts as failed while it is seen and is
//! forgotten once gone.

use std::time::Duration;

use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};

use super::indexes::index_absolute_failure_count;

/// The delay after the first failure (`DefaultJobPodFailureBackOff`).
pub const POD_FAILURE_BACKOFF: Duration = Duration::from_secs(10);
/// The longest delay (`MaxJobPodFailureBackOff`).
pub const MAX_POD_FAILURE_BACKOFF: Duration = Duration::from_secs(600);

/// When the Pod finished (`getFinishedTime`): its containers' last `finishedAt` (sidecars
/// included) when every one has terminated; else when it stopped being ready; else its
/// deletion time less the grace period; else its creation.
pub fn finished_at(pod: &Pod) -> Timestamp {
    from_containers(pod)
        .or_else(|| from_ready_false(pod))
        .or_else(|| from_deletion(pod))
        .or_else(|| pod.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

fn from_containers(pod: &Pod) -> Option<Timestamp> {
    let status = pod.status.as_ref()?;
    let sidecars: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| c.name.as_str())
        .collect();
    let statuses = status.container_statuses.iter().flatten().chain(
        status
            .init_container_statuses
            .iter()
            .flatten()
            .filter(|c| sidecars.contains(&c.name.as_str())),
    );
    let mut latest: Option<Timestamp> = None;
    for container in statuses {
        // One container not yet terminated (or without a finish time): no time from them.
        let finished = container
            .state
            .as_ref()?
            .terminated
            .as_ref()?
            .finished_at
            .as_ref()?
            .0;
        latest = Some(latest.map_or(finished, |l| l.max(finished)));
    }
    latest
}

fn from_ready_false(pod: &Pod) -> Option<Timestamp> {
    let condition = pod
        .status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")?;
    (condition.status == "False")
        .then(|| condition.last_transition_time.as_ref().map(|t| t.0))
        .flatten()
}

fn from_deletion(pod: &Pod) -> Option<Timestamp> {
    let deleted = pod.metadata.deletion_timestamp.as_ref()?.0;
    let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
    deleted
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(grace))
        .ok()
}

/// Failures since the last success and when the last of them finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Record {
    pub failures: u32,
    pub last_failure: Option<Timestamp>,
}

impl Record {
    /// From the Job's succeeded and failed Pods.
    pub fn of<'p>(
        succeeded: impl IntoIterator<Item = &'p Pod>,
        failed: impl IntoIterator<Item = &'p Pod>,
    ) -> Self {
        let last_success = succeeded.into_iter().map(finished_at).max();
        let mut record = Self::default();
        for pod in failed {
            let at = finished_at(pod);
            if last_success.is_some_and(|s| at <= s) {
                continue;
            }
            record.failures += 1;
            record.last_failure = Some(record.last_failure.map_or(at, |l| l.max(at)));
        }
        record
    }

    /// How long until the next Pod may be created.
    pub fn remaining(&self, now: Timestamp) -> Duration {
        remaining(self.failures, self.last_failure, now)
    }
}

/// For an index of a Job with `backoffLimitPerIndex`, whose last failed Pod is `last`.
pub fn remaining_for_index(last: Option<&Pod>, now: Timestamp) -> Duration {
    let Some(pod) = last else {
        return Duration::ZERO;
    };
    remaining(
        index_absolute_failure_count(pod).saturating_add(1),
        Some(finished_at(pod)),
        now,
    )
}

/// `getRemainingTimeForFailuresCount`.
fn remaining(failures: u32, last_failure: Option<Timestamp>, now: Timestamp) -> Duration {
    let Some(last) = last_failure.filter(|_| failures > 0) else {
        return Duration::ZERO;
    };
    let mut backoff = POD_FAILURE_BACKOFF;
    for _ in 1..failures {
        backoff = backoff.saturating_mul(2);
        if backoff >= MAX_POD_FAILURE_BACKOFF {
            backoff = MAX_POD_FAILURE_BACKOFF;
            break;
        }
    }
    let elapsed = now.duration_since(last);
    let elapsed = Duration::try_from(elapsed).unwrap_or(Duration::ZERO);
    backoff.saturating_sub(elapsed)
}
