//! The TTL-after-finished controller's decision (kube-controller-manager's
//! `ttl-after-finished-controller`, `pkg/controller/ttlafterfinished`): when a finished Job
//! with `ttlSecondsAfterFinished` is due for deletion.
//!
//! A Job finishes when its `Complete` or `Failed` condition turns true; it expires
//! `ttlSecondsAfterFinished` after that condition's transition. A Job being deleted, without a
//! TTL or not finished is none of this controller's business.

use std::time::Duration;

use k8s_openapi::{api::batch::v1::Job, jiff::Timestamp};

/// What to do about a Job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Not this controller's: being deleted, no TTL, or not finished.
    Never,
    /// Expired: delete it (after a fresh read says so too).
    Now,
    /// Expires after this long: look again then.
    After(Duration),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TtlError {
    /// kube-controller-manager's message: the finished condition has no transition time.
    #[error("unable to find the time when the Job {0} finished")]
    NoFinishTime(String),
}

fn finished_at(job: &Job) -> Option<Result<Timestamp, TtlError>> {
    let condition = job
        .status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")?;
    Some(
        condition
            .last_transition_time
            .as_ref()
            .map(|t| t.0)
            .ok_or_else(|| {
                TtlError::NoFinishTime(format!(
                    "{}/{}",
                    job.metadata.namespace.as_deref().unwrap_or_default(),
                    job.metadata.name.as_deref().unwrap_or_default()
                ))
            }),
    )
}

/// Whether and when the Job is due for deletion (`processTTL`). A Job that finished in the
/// future (clock skew) waits until its TTL has passed from then, as kube-controller-manager
/// defers it.
pub fn due(job: &Job, now: Timestamp) -> Result<Due, TtlError> {
    if job.metadata.deletion_timestamp.is_some() {
        return Ok(Due::Never);
    }
    let Some(ttl) = job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished) else {
        return Ok(Due::Never);
    };
    let Some(finished) = finished_at(job) else {
        return Ok(Due::Never);
    };
    let expires = finished?
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(i64::from(ttl)))
        .unwrap_or(Timestamp::MAX);
    let left = Duration::try_from(expires.duration_since(now)).unwrap_or(Duration::ZERO);
    Ok(if left.is_zero() {
        Due::Now
    } else {
        Due::After(left)
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn job(ttl: Option<i32>, condition: Option<(&str, &str, Option<i64>)>) -> Job {
        let conditions: Vec<_> = condition
            .into_iter()
            .map(|(type_, status, at_second)| {
                let mut c = json!({"type": type_, "status": status});
                if let Some(s) = at_second {
                    c["lastTransitionTime"] = json!(at(s));
                }
                c
            })
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "j", "namespace": "ns"},
            "spec": {"ttlSecondsAfterFinished": ttl, "template": {}},
            "status": {"conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn a_finished_job_expires_its_ttl_after_its_finish() {
        let done = job(Some(30), Some(("Complete", "True", Some(100))));
        assert_eq!(due(&done, at(110)), Ok(Due::After(Duration::from_secs(20))));
        assert_eq!(due(&done, at(130)), Ok(Due::Now));
        let failed = job(Some(0), Some(("Failed", "True", Some(100))));
        assert_eq!(due(&failed, at(100)), Ok(Due::Now));
    }

    #[test]
    fn unfinished_ttl_less_and_deleted_jobs_are_left_alone() {
        assert_eq!(due(&job(Some(5), None), at(0)), Ok(Due::Never));
        let suspended = job(Some(5), Some(("Complete", "False", Some(0))));
        assert_eq!(due(&suspended, at(100)), Ok(Due::Never));
        assert_eq!(
            due(&job(None, Some(("Complete", "True", Some(0)))), at(100)),
            Ok(Due::Never)
        );
        let mut deleted = job(Some(0), Some(("Complete", "True", Some(0))));
        deleted.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(1)));
        assert_eq!(due(&deleted, at(100)), Ok(Due::Never));
    }

    #[test]
    fn a_finish_without_a_time_is_an_error_and_a_future_one_waits() {
        assert_eq!(
            due(&job(Some(5), Some(("Complete", "True", None))), at(0)),
            Err(TtlError::NoFinishTime("ns/j".into()))
        );
        let skewed = job(Some(5), Some(("Complete", "True", Some(100))));
        assert_eq!(
            due(&skewed, at(90)),
            Ok(Due::After(Duration::from_secs(15)))
        );
    }
}
