//! The Job controller's decisions, as kube-controller-manager's `pkg/controller/job` makes
//! them (v1.35, every Job feature gate at its default).
//!
//! ```text
//!  pods (owned ∪ selected) ─► claim ─► adopt orphans (owner reference + tracking finalizer)
//!                                 └─► release owned Pods it no longer matches
//!  claimed Pods ─► Sync::new: counts (status + uncounted + newly finished), indexes,
//!                  the finished condition (FailureTarget / SuccessCriteriaMet kept;
//!                  podFailurePolicy FailJob; backoffLimit; activeDeadlineSeconds;
//!                  backoffLimitPerIndex / maxFailedIndexes; successPolicy)
//!  Sync::manage ─► finished: delete the active Pods
//!               │  suspended: delete the active Pods (tracking finalizer removed first)
//!               │  too many: delete the surplus (duplicated indexes first)
//!               │  too few: wait out the failure backoff, or create (slow start, indexes)
//!  Sync::managed ─► complete? suspended/resumed condition, startTime
//!  Sync::track ─► status with finished Pods' UIDs in uncountedTerminatedPods (write 1)
//!              ─► tracking finalizers to remove from finished Pods
//!  Track::finish ─► uncounted UIDs whose finalizer is gone moved to the counters; the
//!                   Complete / Failed condition once nothing is uncounted or terminating (write 2)
//! ```
//!
//! The two status writes and the finalizers between them are what make a finished Pod
//! counted exactly once: its UID is written to `uncountedTerminatedPods` before its
//! finalizer goes, and moved to `succeeded` / `failed` only once the finalizer is gone. A
//! reconcile cut short anywhere leaves a state the next one finishes, on any replica.
//! Both writes replace the status at the resourceVersion read, so a reconcile that read a
//! stale Job fails on the first write rather than counting twice.

mod backoff;
mod indexes;
mod policy;

use std::{
    cmp::Ordering,
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use k8s_openapi::{
    api::{
        batch::v1::{Job, JobCondition, JobSpec, JobStatus, UncountedTerminatedPods},
        core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodTemplateSpec},
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time},
    jiff::Timestamp,
};

pub use self::{
    backoff::{MAX_POD_FAILURE_BACKOFF, POD_FAILURE_BACKOFF, Record, finished_at},
    indexes::{
        COMPLETION_INDEX, INDEX_FAILURE_COUNT, INDEX_IGNORED_FAILURE_COUNT, Intervals,
        completion_index, generate_name_with_index,
    },
    policy::{FailureAction, FailureMatch, match_failure, match_success},
};
pub use crate::event::Event;
use crate::{
    replicaset::{controller_of, is_active, is_ready, is_terminating, ready_since},
    selector::{Selector, SelectorError},
};

/// The finalizer that keeps a Job's Pod until the Job has counted it.
pub const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";
/// `spec.managedBy` of Jobs this controller manages (unset means the same).
pub const CONTROLLER_NAME: &str = "kubernetes.io/job-controller";
/// The environment variable an Indexed Job's containers read their index from.
pub const COMPLETION_INDEX_ENV: &str = "JOB_COMPLETION_INDEX";
/// The most Pods created or deleted in one reconcile (`MaxPodCreateDeletePerSync`).
pub const MAX_PODS_PER_SYNC: usize = 500;
/// The most UIDs in `uncountedTerminatedPods` (`MaxUncountedPods`), keeping the status
/// around 20 KB.
pub const MAX_UNCOUNTED: usize = 500;
/// Creations start with one Pod and double (`SlowStartInitialBatchSize`).
pub const SLOW_START_INITIAL_BATCH: usize = 1;
/// The shortest delay of a requeue (`SyncJobBatchPeriod`).
pub const SYNC_PERIOD: Duration = Duration::from_secs(1);
/// `spec.backoffLimit` when unset, as the apiserver defaults it.
pub const DEFAULT_BACKOFF_LIMIT: u32 = 6;

/// Condition types.
pub const COMPLETE: &str = "Complete";
pub const FAILED: &str = "Failed";
pub const FAILURE_TARGET: &str = "FailureTarget";
pub const SUCCESS_CRITERIA_MET: &str = "SuccessCriteriaMet";
pub const SUSPENDED: &str = "Suspended";

/// Condition reasons (`batch.JobReason*`).
pub mod reason {
    pub const POD_FAILURE_POLICY: &str = "PodFailurePolicy";
    pub const BACKOFF_LIMIT_EXCEEDED: &str = "BackoffLimitExceeded";
    pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
    pub const MAX_FAILED_INDEXES_EXCEEDED: &str = "MaxFailedIndexesExceeded";
    pub const FAILED_INDEXES: &str = "FailedIndexes";
    pub const SUCCESS_POLICY: &str = "SuccessPolicy";
    pub const COMPLETIONS_REACHED: &str = "CompletionsReached";
}

/// A Job as the controller needs it.
#[derive(Debug, Clone)]
pub struct Spec<'a> {
    pub job: &'a Job,
    pub job_spec: &'a JobSpec,
    pub uid: &'a str,
    pub name: &'a str,
    pub selector: Selector,
    pub parallelism: u32,
    /// `None`: any Pod's success completes the Job (a work queue Job).
    pub completions: Option<u32>,
    pub indexed: bool,
    pub backoff_limit: u32,
    pub backoff_limit_per_index: Option<u32>,
    pub max_failed_indexes: Option<u32>,
    /// `podReplacementPolicy: Failed` (or a Pod failure policy): a terminating Pod is not
    /// replaced until it has failed, and does not count as failed before.
    pub only_replace_failed: bool,
    pub suspended: bool,
    pub deleting: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("metadata.uid: empty")]
    NoUid,
    #[error("spec: unset")]
    NoSpec,
    #[error("spec.selector: unset")]
    NoSelector,
    #[error("spec.{0}")]
    Selector(#[from] SelectorError),
    #[error("spec.completionMode: unknown ({0:?})")]
    UnknownCompletionMode(String),
    #[error("spec.completions: unset for an Indexed Job")]
    IndexedWithoutCompletions,
    #[error("spec.{field}: negative ({value})")]
    Negative { field: &'static str, value: i32 },
}

fn non_negative(field: &'static str, value: i32) -> Result<u32, SpecError> {
    u32::try_from(value).map_err(|_| SpecError::Negative { field, value })
}

impl<'a> Spec<'a> {
    pub fn new(job: &'a Job) -> Result<Self, SpecError> {
        let spec = job.spec.as_ref().ok_or(SpecError::NoSpec)?;
        let uid = job
            .metadata
            .uid
            .as_deref()
            .filter(|u| !u.is_empty())
            .ok_or(SpecError::NoUid)?;
        let indexed = match spec.completion_mode.as_deref() {
            None | Some("NonIndexed") => false,
            Some("Indexed") => true,
            Some(other) => return Err(SpecError::UnknownCompletionMode(other.to_owned())),
        };
        let completions = spec
            .completions
            .map(|c| non_negative("completions", c))
            .transpose()?;
        if indexed && completions.is_none() {
            return Err(SpecError::IndexedWithoutCompletions);
        }
        let optional =
            |field, value: Option<i32>| value.map(|v| non_negative(field, v)).transpose();
        Ok(Self {
            job,
            job_spec: spec,
            uid,
            name: job.metadata.name.as_deref().unwrap_or_default(),
            selector: Selector::new(spec.selector.as_ref().ok_or(SpecError::NoSelector)?)?,
            parallelism: non_negative("parallelism", spec.parallelism.unwrap_or(1))?,
            completions,
            indexed,
            backoff_limit: optional("backoffLimit", spec.backoff_limit)?
                .unwrap_or(DEFAULT_BACKOFF_LIMIT),
            backoff_limit_per_index: optional(
                "backoffLimitPerIndex",
                spec.backoff_limit_per_index,
            )?
            .filter(|_| indexed),
            max_failed_indexes: optional("maxFailedIndexes", spec.max_failed_indexes)?,
            only_replace_failed: spec.pod_replacement_policy.as_deref() == Some("Failed")
                || spec.pod_failure_policy.is_some(),
            suspended: spec.suspend == Some(true),
            deleting: job.metadata.deletion_timestamp.is_some(),
        })
    }

    /// The Pod's failure, as the policy judges it.
    pub fn failure(&self, pod: &Pod) -> FailureMatch {
        match_failure(self.job_spec.pod_failure_policy.as_ref(), pod)
    }

    /// Whether the Pod counts as failed (`isPodFailed`): `Failed`, or being deleted before
    /// it succeeded unless only failed Pods are replaced.
    pub fn pod_failed(&self, pod: &Pod) -> bool {
        let phase = phase(pod);
        phase == Some("Failed")
            || (!self.only_replace_failed
                && pod.metadata.deletion_timestamp.is_some()
                && phase != Some("Succeeded"))
    }

    /// A valid index of this Job, if the Pod carries one.
    fn index_of(&self, pod: &Pod) -> Option<u32> {
        completion_index(pod).filter(|ix| self.completions.is_some_and(|c| *ix < c))
    }

    /// Whether the Pod's index has failed (`isIndexFailed`).
    fn index_failed(&self, pod: &Pod) -> bool {
        let Some(limit) = self.backoff_limit_per_index else {
            return false;
        };
        if !self.pod_failed(pod) {
            return false;
        }
        let failure = self.failure(pod);
        if failure.action == Some(FailureAction::FailIndex) {
            return true;
        }
        failure.counts && indexes::index_failure_count(pod) >= limit
    }
}

/// `spec.managedBy` when another controller manages the Job: this one leaves it alone.
pub fn managed_by_other(job: &Job) -> Option<&str> {
    job.spec
        .as_ref()?
        .managed_by
        .as_deref()
        .filter(|m| *m != CONTROLLER_NAME)
}

fn condition<'j>(job: &'j Job, type_: &str) -> Option<&'j JobCondition> {
    job.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
}

fn condition_true(job: &Job, type_: &str) -> bool {
    condition(job, type_).is_some_and(|c| c.status == "True")
}

/// Whether the Job has finished: `Complete` or `Failed` is true.
pub fn is_finished(job: &Job) -> bool {
    condition_true(job, COMPLETE) || condition_true(job, FAILED)
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

pub fn has_tracking_finalizer(pod: &Pod) -> bool {
    pod.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == TRACKING_FINALIZER)
}

fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

/// A condition as kube-controller-manager makes one (`newCondition`).
pub fn new_condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> JobCondition {
    JobCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()).filter(|r: &String| !r.is_empty()),
        message: Some(message.into()).filter(|m: &String| !m.is_empty()),
        last_probe_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// Sets the condition's status, reason and message (a new transition time when one
/// changed); a `False` condition absent stays absent. Whether anything changed
/// (`ensureJobConditionStatus`).
fn ensure_condition(
    conditions: &mut Vec<JobCondition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> bool {
    let wanted = new_condition(type_, status, reason, message, now);
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if c.status != wanted.status || c.reason != wanted.reason || c.message != wanted.message {
            *c = wanted;
            return true;
        }
        return false;
    }
    if status != "False" {
        conditions.push(wanted);
        return true;
    }
    false
}

/// Which Pods the Job keeps, adopts and releases (`PodControllerRefManager.ClaimPods` with
/// the tracking finalizer): finished Pods are claimed too, since the Job counts them.
#[derive(Debug, Default, PartialEq)]
pub struct Claim<'p> {
    /// Controlled by the Job and matching its selector, in any phase.
    pub pods: Vec<&'p Pod>,
    /// Orphans the selector matches: to get a controller reference and the finalizer.
    pub adopt: Vec<&'p Pod>,
    /// Controlled but no longer matching: reference and finalizer to be removed.
    pub release: Vec<&'p Pod>,
}

pub fn claim<'p>(spec: &Spec<'_>, pods: &'p [Pod]) -> Claim<'p> {
    let mut claim = Claim::default();
    let namespace = spec.job.metadata.namespace.as_deref();
    for pod in pods
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == namespace)
    {
        let matches = spec.selector.matches(pod.metadata.labels.as_ref());
        match controller_of(pod) {
            Some(owner) if owner.uid == spec.uid => {
                if matches {
                    claim.pods.push(pod);
                } else if !spec.deleting {
                    claim.release.push(pod);
                }
            }
            Some(_) => {}
            None => {
                if matches && !spec.deleting && pod.metadata.deletion_timestamp.is_none() {
                    claim.adopt.push(pod);
                }
            }
        }
    }
    claim
}

/// The controller reference every Pod of the Job carries.
pub fn controller_ref(spec: &Spec<'_>) -> OwnerReference {
    OwnerReference {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        name: spec.name.to_owned(),
        uid: spec.uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// What to do with the Job's Pods this reconcile.
#[derive(Debug, PartialEq)]
pub enum Manage<'p> {
    /// Nothing.
    None,
    /// Delete these Pods; with `remove_finalizer`, remove the tracking finalizer first (a
    /// suspended Job's or a surplus Pod: never counted as finished).
    Delete {
        pods: Vec<&'p Pod>,
        remove_finalizer: bool,
    },
    /// Create Pods (`None` for a NonIndexed Job, else the index), in slow-start batches
    /// ([`slow_start_batches`]).
    Create(Vec<Option<u32>>),
    /// Too few Pods, but failed ones are backing off: look again after this.
    Wait(Duration),
}

/// What the Pod writes of [`Sync::manage`] achieved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Managed {
    /// Pods deleted (or already gone).
    pub deleted: u32,
    /// Of those, how many were ready.
    pub deleted_ready: u32,
    /// Pods created.
    pub created: u32,
}

/// One reconcile of a Job, from its claimed Pods (`syncJob`).
#[derive(Debug)]
pub struct Sync<'a> {
    pub spec: &'a Spec<'a>,
    /// The status being built: starts as the Job's.
    pub status: JobStatus,
    pods: Vec<&'a Pod>,
    active: Vec<&'a Pod>,
    active_count: u32,
    ready: u32,
    terminating: u32,
    uncounted_succeeded: BTreeSet<String>,
    uncounted_failed: BTreeSet<String>,
    succeeded: u32,
    failed: u32,
    prev_succeeded_indexes: Intervals,
    succeeded_indexes: Intervals,
    failed_indexes: Option<Intervals>,
    record: Record,
    delayed_per_index: BTreeMap<u32, &'a Pod>,
    /// The condition the Job is finishing with, once decided.
    finished: Option<JobCondition>,
    /// Whether a write of the status is due whatever the Pods' tracking needs.
    changed: bool,
    /// When to look again (active deadline, failure backoff).
    pub requeue_after: Option<Duration>,
    pub events: Vec<Event>,
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn int32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

impl<'a> Sync<'a> {
    /// Counts the Job's Pods and decides whether it is finishing; `pods` are the claimed
    /// ones ([`Claim::pods`]), adopted ones given the finalizer.
    pub fn new(spec: &'a Spec<'a>, pods: Vec<&'a Pod>, now: Timestamp) -> Self {
        let mut status = spec.job.status.clone().unwrap_or_default();
        let uncounted = status
            .uncounted_terminated_pods
            .get_or_insert_with(Default::default);
        let uncounted_succeeded: BTreeSet<String> =
            uncounted.succeeded.iter().flatten().cloned().collect();
        let uncounted_failed: BTreeSet<String> =
            uncounted.failed.iter().flatten().cloned().collect();
        let active: Vec<&Pod> = pods.iter().copied().filter(|p| is_active(p)).collect();
        let mut sync = Self {
            spec,
            active_count: count(active.len()),
            ready: count(active.iter().filter(|p| is_ready(p)).count()),
            terminating: count(pods.iter().filter(|p| is_terminating(p)).count()),
            active,
            uncounted_succeeded,
            uncounted_failed,
            succeeded: 0,
            failed: 0,
            prev_succeeded_indexes: Intervals::default(),
            succeeded_indexes: Intervals::default(),
            failed_indexes: None,
            record: Record::default(),
            delayed_per_index: BTreeMap::new(),
            finished: None,
            changed: false,
            requeue_after: None,
            events: Vec::new(),
            pods,
            status,
        };
        sync.count(now);
        sync
    }

    /// A Pod the tracking still has to count: it has the finalizer, is not yet among the
    /// uncounted UIDs and (Indexed) has a valid index (`getValidPodsWithFilter`).
    fn countable(&self, pod: &Pod, uncounted: &BTreeSet<String>) -> bool {
        has_tracking_finalizer(pod)
            && !uncounted.contains(uid(pod))
            && (!self.spec.indexed || self.spec.index_of(pod).is_some())
    }

    fn count(&mut self, now: Timestamp) {
        let spec = self.spec;
        let new_succeeded: Vec<&Pod> = self
            .pods
            .iter()
            .copied()
            .filter(|p| {
                self.countable(p, &self.uncounted_succeeded) && phase(p) == Some("Succeeded")
            })
            .collect();
        let new_failed: Vec<&Pod> = self
            .pods
            .iter()
            .copied()
            .filter(|p| self.countable(p, &self.uncounted_failed) && spec.pod_failed(p))
            .collect();
        let status = &self.status;
        self.succeeded = non_negative_status(status.succeeded)
            + count(new_succeeded.len())
            + count(self.uncounted_succeeded.len());
        self.failed = non_negative_status(status.failed)
            + count(new_failed.iter().filter(|p| spec.failure(p).counts).count())
            + count(self.uncounted_failed.len());
        if self.status.start_time.is_none() && !spec.suspended {
            self.status.start_time = Some(Time(now));
        }
        // Every finished Pod still seen, not only this reconcile's: see `backoff`.
        self.record = Record::of(
            self.pods
                .iter()
                .copied()
                .filter(|p| phase(p) == Some("Succeeded")),
            self.pods.iter().copied().filter(|p| spec.pod_failed(p)),
        );
        self.decide_finished(now);
    }

    /// The finished condition, evaluated in kube-controller-manager's order: a pre-existing
    /// SuccessCriteriaMet or FailureTarget, then failures, then success by policy.
    fn decide_finished(&mut self, now: Timestamp) {
        let spec = self.spec;
        let job = spec.job;
        if condition_true(job, SUCCESS_CRITERIA_MET) {
            self.finished = condition(job, SUCCESS_CRITERIA_MET).cloned();
        } else if let Some(target) = condition(job, FAILURE_TARGET).filter(|c| c.status == "True") {
            self.finished = Some(failed_for_target(target, now));
        } else if let Some(message) = self.fail_job_message() {
            self.finished = Some(new_condition(
                FAILURE_TARGET,
                "True",
                reason::POD_FAILURE_POLICY,
                &message,
                now,
            ));
        }
        if self.finished.is_none() {
            if self.failed > spec.backoff_limit || self.past_backoff_limit_on_failure() {
                self.finished = Some(failure_target(
                    reason::BACKOFF_LIMIT_EXCEEDED,
                    "Job has reached the specified backoff limit",
                    now,
                ));
            } else if let Some(left) = self.deadline_left(now) {
                if left.is_zero() {
                    self.finished = Some(failure_target(
                        reason::DEADLINE_EXCEEDED,
                        "Job was active longer than specified deadline",
                        now,
                    ));
                } else {
                    self.requeue(left);
                }
            }
        }
        if spec.indexed {
            let completions = spec.completions.unwrap_or(0);
            self.prev_succeeded_indexes = Intervals::parse(
                self.status.completed_indexes.as_deref().unwrap_or_default(),
                completions,
            );
            self.succeeded_indexes = self.prev_succeeded_indexes.with(
                self.pods
                    .iter()
                    .filter(|p| phase(p) == Some("Succeeded") && has_tracking_finalizer(p))
                    .filter_map(|p| spec.index_of(p)),
            );
            self.succeeded = self.succeeded_indexes.total();
            if spec.backoff_limit_per_index.is_some() {
                let previous = Intervals::parse(
                    self.status.failed_indexes.as_deref().unwrap_or_default(),
                    completions,
                );
                let failed = previous.with(
                    self.pods
                        .iter()
                        .filter(|p| has_tracking_finalizer(p) && spec.index_failed(p))
                        .filter_map(|p| spec.index_of(p)),
                );
                if self.finished.is_none() {
                    if spec
                        .max_failed_indexes
                        .is_some_and(|max| failed.total() > max)
                    {
                        self.finished = Some(failure_target(
                            reason::MAX_FAILED_INDEXES_EXCEEDED,
                            "Job has exceeded the specified maximal number of failed indexes",
                            now,
                        ));
                    } else if failed.total() > 0
                        && failed.total() + self.succeeded_indexes.total() >= completions
                    {
                        self.finished = Some(failure_target(
                            reason::FAILED_INDEXES,
                            "Job has failed indexes",
                            now,
                        ));
                    }
                }
                self.failed_indexes = Some(failed);
                self.delayed_per_index = self.delayed_deletion_per_index();
            }
            if self.finished.is_none()
                && let Some(message) = match_success(
                    spec.job_spec.success_policy.as_ref(),
                    completions,
                    &self.succeeded_indexes,
                )
            {
                self.finished = Some(new_condition(
                    SUCCESS_CRITERIA_MET,
                    "True",
                    reason::SUCCESS_POLICY,
                    &message,
                    now,
                ));
            }
        }
    }

    /// The message of the first failed Pod a `FailJob` rule matches (`getFailJobMessage`).
    fn fail_job_message(&self) -> Option<String> {
        self.spec.job_spec.pod_failure_policy.as_ref()?;
        self.pods
            .iter()
            .filter(|p| self.spec.pod_failed(p))
            .find_map(|p| self.spec.failure(p).message)
    }

    /// With `restartPolicy: OnFailure`, whether the running and pending Pods' container
    /// restarts reached the backoff limit (`pastBackoffLimitOnFailure`).
    fn past_backoff_limit_on_failure(&self) -> bool {
        let restart_policy = self
            .spec
            .job_spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.as_deref());
        if restart_policy != Some("OnFailure") {
            return false;
        }
        let restarts: i64 = self
            .pods
            .iter()
            .filter(|p| matches!(phase(p), Some("Running" | "Pending")))
            .filter_map(|p| p.status.as_ref())
            .flat_map(|s| {
                s.init_container_statuses
                    .iter()
                    .flatten()
                    .chain(s.container_statuses.iter().flatten())
            })
            .map(|c| i64::from(c.restart_count))
            .sum();
        match self.spec.backoff_limit {
            0 => restarts > 0,
            limit => restarts >= i64::from(limit),
        }
    }

    /// Time left before `activeDeadlineSeconds` passes, if the Job has a deadline running.
    fn deadline_left(&self, now: Timestamp) -> Option<Duration> {
        let seconds = self.spec.job_spec.active_deadline_seconds?;
        if self.spec.suspended {
            return None;
        }
        let start = self.status.start_time.as_ref()?.0;
        let deadline = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
        let ran = Duration::try_from(now.duration_since(start)).unwrap_or(Duration::ZERO);
        Some(deadline.saturating_sub(ran))
    }

    fn requeue(&mut self, after: Duration) {
        let after = after.max(SYNC_PERIOD);
        self.requeue_after = Some(self.requeue_after.map_or(after, |r| r.min(after)));
    }

    /// Per index, the last failed Pod whose replacement is not created yet: its finalizer
    /// stays until then, so that the replacement can carry the index's failure count
    /// (`getPodsWithDelayedDeletionPerIndex`).
    fn delayed_deletion_per_index(&self) -> BTreeMap<u32, &'a Pod> {
        let spec = self.spec;
        let active: BTreeSet<u32> = self
            .active
            .iter()
            .filter_map(|p| completion_index(p))
            .collect();
        let mut delayed: BTreeMap<u32, &'a Pod> = BTreeMap::new();
        for pod in self.pods.iter().copied() {
            if !self.countable(pod, &BTreeSet::new()) || !spec.pod_failed(pod) {
                continue;
            }
            let Some(ix) = spec.index_of(pod) else {
                continue;
            };
            if self.succeeded_indexes.has(ix)
                || self.failed_indexes.as_ref().is_some_and(|f| f.has(ix))
                || active.contains(&ix)
            {
                continue;
            }
            match delayed.get(&ix) {
                Some(last)
                    if !(indexes::index_absolute_failure_count(last)
                        <= indexes::index_absolute_failure_count(pod)
                        && finished_at(pod) >= finished_at(last)) => {}
                _ => {
                    delayed.insert(ix, pod);
                }
            }
        }
        delayed
    }

    /// What to do with the Pods (the finished branch of `syncJob`, else `manageJob`).
    pub fn manage(&mut self, now: Timestamp) -> Manage<'a> {
        let spec = self.spec;
        if self.finished.is_some() {
            return Manage::Delete {
                pods: self.active.clone(),
                remove_finalizer: false,
            };
        }
        if spec.deleting {
            return Manage::None;
        }
        let active = self.active_count;
        if spec.suspended {
            return Manage::Delete {
                pods: self.for_removal(self.active.len()),
                remove_finalizer: true,
            };
        }
        let want = match spec.completions {
            None if self.succeeded > 0 => active,
            None => spec.parallelism,
            Some(completions) => completions
                .saturating_sub(self.succeeded)
                .min(spec.parallelism),
        };
        let surplus = active.saturating_sub(want) as usize;
        let mut remove = self.for_removal(surplus);
        remove.truncate(MAX_PODS_PER_SYNC);
        if !remove.is_empty() {
            return Manage::Delete {
                pods: remove,
                remove_finalizer: true,
            };
        }
        let terminating = if spec.only_replace_failed {
            self.terminating
        } else {
            0
        };
        let missing = want.saturating_sub(terminating).saturating_sub(active) as usize;
        if missing == 0 {
            return Manage::None;
        }
        if spec.backoff_limit_per_index.is_none() {
            let left = self.record.remaining(now);
            if !left.is_zero() {
                self.requeue(left);
                return Manage::Wait(left.max(SYNC_PERIOD));
            }
        }
        let missing = missing.min(MAX_PODS_PER_SYNC);
        if !spec.indexed {
            return Manage::Create(vec![None; missing]);
        }
        let mut indexes = self.first_pending_indexes(missing);
        if spec.backoff_limit_per_index.is_some() {
            let mut soonest: Option<Duration> = None;
            indexes.retain(|ix| {
                let left =
                    backoff::remaining_for_index(self.delayed_per_index.get(ix).copied(), now);
                if !left.is_zero() {
                    soonest = Some(soonest.map_or(left, |s| s.min(left)));
                }
                left.is_zero()
            });
            if indexes.is_empty()
                && let Some(left) = soonest
            {
                self.requeue(left);
                return Manage::Wait(left.max(SYNC_PERIOD));
            }
        }
        if indexes.is_empty() {
            return Manage::None;
        }
        Manage::Create(indexes.into_iter().map(Some).collect())
    }

    /// The first `count` indexes with neither a success, an active Pod, a failed index nor
    /// (only replacing failed Pods) a terminating Pod (`firstPendingIndexes`).
    fn first_pending_indexes(&self, count: usize) -> Vec<u32> {
        let mut busy = self
            .succeeded_indexes
            .with(self.active.iter().filter_map(|p| completion_index(p)));
        if self.spec.only_replace_failed {
            busy = busy.with(
                self.pods
                    .iter()
                    .filter(|p| is_terminating(p))
                    .filter_map(|p| completion_index(p)),
            );
        }
        if let Some(failed) = &self.failed_indexes {
            busy = busy.merge(failed);
        }
        busy.first_missing(count, self.spec.completions.unwrap_or(0))
    }

    /// At least `at_least` active Pods to delete: an Indexed Job's Pods with an invalid or
    /// duplicated index first, then in `controller.ActivePods` order
    /// (`activePodsForRemoval`).
    fn for_removal(&self, at_least: usize) -> Vec<&'a Pod> {
        let mut remove = Vec::new();
        let mut left = Vec::new();
        if self.spec.indexed {
            let completions = self.spec.completions.unwrap_or(0);
            let mut by_index: BTreeMap<Option<u32>, Vec<&'a Pod>> = BTreeMap::new();
            for pod in &self.active {
                by_index.entry(completion_index(pod)).or_default().push(pod);
            }
            for (ix, mut pods) in by_index {
                match ix {
                    Some(ix) if ix < completions => {
                        pods.sort_by(|a, b| removal_order(a, b));
                        let keep = pods.pop();
                        remove.extend(pods);
                        left.extend(keep);
                    }
                    _ => remove.extend(pods),
                }
            }
        } else {
            left = self.active.clone();
        }
        if remove.len() < at_least {
            left.sort_by(|a, b| removal_order(a, b));
            let more = at_least - remove.len();
            remove.extend(left.into_iter().take(more));
        }
        remove
    }

    /// After the writes of [`Sync::manage`]: the counts, whether the Job is complete, and
    /// the Suspended condition.
    pub fn managed(&mut self, manage: &Manage<'_>, done: Managed, now: Timestamp) {
        let spec = self.spec;
        let old = spec.job.status.clone().unwrap_or_default();
        let finishing = self.finished.is_some();
        match manage {
            Manage::Delete { pods, .. } => {
                self.active_count = self.active_count.saturating_sub(done.deleted);
                self.terminating += done.deleted;
                self.ready = self.ready.saturating_sub(done.deleted_ready);
                // Not finished while an active Pod may remain.
                if self.finished.is_some() && done.deleted != count(pods.len()) {
                    self.finished = None;
                }
            }
            Manage::Create(_) => self.active_count += done.created,
            Manage::None | Manage::Wait(_) => {}
        }
        let manage_ran = !finishing && !spec.deleting;
        if !finishing {
            let complete = match spec.completions {
                None => self.succeeded > 0 && self.active_count == 0,
                Some(c) => self.succeeded >= c && self.active_count == 0,
            };
            if complete {
                self.finished = Some(new_condition(
                    SUCCESS_CRITERIA_MET,
                    "True",
                    reason::COMPLETIONS_REACHED,
                    "Reached expected number of succeeded pods",
                    now,
                ));
            } else if manage_ran {
                let conditions = self.status.conditions.get_or_insert_with(Vec::new);
                if spec.suspended {
                    if ensure_condition(
                        conditions,
                        SUSPENDED,
                        "True",
                        "JobSuspended",
                        "Job suspended",
                        now,
                    ) {
                        self.changed = true;
                        self.events
                            .push(Event::normal("Suspended", "Job suspended"));
                    }
                } else if ensure_condition(
                    conditions,
                    SUSPENDED,
                    "False",
                    "JobResumed",
                    "Job resumed",
                    now,
                ) {
                    self.changed = true;
                    self.events.push(Event::normal("Resumed", "Job resumed"));
                    // activeDeadlineSeconds counts the time the Job runs without a pause.
                    self.status.start_time = Some(Time(now));
                }
            }
        }
        self.changed |= int32(self.active_count) != old.active.unwrap_or(0)
            || Some(int32(self.ready)) != old.ready
            || Some(int32(self.terminating)) != old.terminating;
        self.status.active = Some(int32(self.active_count));
        self.status.ready = Some(int32(self.ready));
        self.status.terminating = Some(int32(self.terminating));
    }

    /// Whether the tracking finalizer of a finished (or failed) Pod can go now
    /// (`canRemoveFinalizer`).
    fn can_remove_finalizer(&self, pod: &Pod, failed: bool) -> bool {
        if self.spec.deleting || self.finished.is_some() || phase(pod) == Some("Succeeded") {
            return true;
        }
        if !failed {
            return false;
        }
        // The index's last failed Pod waits for its replacement.
        completion_index(pod)
            .and_then(|ix| self.delayed_per_index.get(&ix))
            .is_none_or(|p| uid(p) != uid(pod))
    }

    /// The first status write and the finalizers to remove (`trackJobStatusAndRemoveFinalizers`
    /// up to the flush).
    pub fn track(mut self, now: Timestamp) -> Track<'a> {
        let spec = self.spec;
        let with_finalizer: BTreeSet<String> = self
            .pods
            .iter()
            .filter(|p| has_tracking_finalizer(p))
            .map(|p| uid(p).to_owned())
            .collect();
        let mut flush = self.changed;
        flush |= clean_uncounted(&mut self.status, &with_finalizer);
        let mut remove = Vec::new();
        let mut new_succeeded_indexes = Vec::new();
        let mut reached_max = false;
        let failing = self
            .finished
            .as_ref()
            .is_some_and(|c| c.type_ != SUCCESS_CRITERIA_MET);
        let mut policy_actions: BTreeMap<&'static str, u32> = BTreeMap::new();
        for pod in self.pods.iter().copied() {
            if !has_tracking_finalizer(pod) {
                continue;
            }
            let failed = spec.pod_failed(pod);
            if !self.can_remove_finalizer(pod, failed) {
                continue;
            }
            remove.push(pod);
            let id = uid(pod).to_owned();
            let uncounted = self
                .status
                .uncounted_terminated_pods
                .get_or_insert_with(Default::default);
            if phase(pod) == Some("Succeeded") && !self.uncounted_failed.contains(&id) {
                if spec.indexed {
                    if let Some(ix) = spec.index_of(pod)
                        && !self.prev_succeeded_indexes.has(ix)
                    {
                        new_succeeded_indexes.push(ix);
                        flush = true;
                    }
                } else if !self.uncounted_succeeded.contains(&id) {
                    flush = true;
                    uncounted.succeeded.get_or_insert_with(Vec::new).push(id);
                }
            } else if (failed || failing)
                && !self.uncounted_failed.contains(&id)
                && (!spec.indexed || spec.index_of(pod).is_some())
            {
                let failure = spec.failure(pod);
                if let Some(action) = failure.action {
                    *policy_actions.entry(action.as_str()).or_default() += 1;
                }
                if failure.counts {
                    flush = true;
                    uncounted.failed.get_or_insert_with(Vec::new).push(id);
                }
            }
            let uncounted = self.status.uncounted_terminated_pods.as_ref();
            let pending = new_succeeded_indexes.len()
                + uncounted
                    .and_then(|u| u.succeeded.as_ref())
                    .map_or(0, Vec::len)
                + uncounted
                    .and_then(|u| u.failed.as_ref())
                    .map_or(0, Vec::len);
            if pending >= MAX_UNCOUNTED {
                reached_max = true;
                break;
            }
        }
        if spec.indexed {
            self.succeeded_indexes = self.succeeded_indexes.with(new_succeeded_indexes);
            let completed = self.succeeded_indexes.to_string();
            if self.status.completed_indexes.as_deref().unwrap_or_default() != completed {
                flush = true;
            }
            self.status.succeeded = Some(int32(self.succeeded_indexes.total()));
            self.status.completed_indexes = Some(completed);
            let failed = self.failed_indexes.as_ref().map(ToString::to_string);
            if self.status.failed_indexes != failed {
                self.status.failed_indexes = failed;
                flush = true;
            }
        }
        let conditions = self.status.conditions.get_or_insert_with(Vec::new);
        if let Some(target) = self.finished.take_if(|c| c.type_ == FAILURE_TARGET) {
            conditions.push(target.clone());
            flush = true;
            self.finished = Some(failed_for_target(&target, now));
        }
        if let Some(met) = self.finished.take_if(|c| c.type_ == SUCCESS_CRITERIA_MET) {
            if !conditions
                .iter()
                .any(|c| c.type_ == SUCCESS_CRITERIA_MET && c.status == "True")
            {
                conditions.push(met.clone());
                flush = true;
            }
            self.finished = Some(new_condition(
                COMPLETE,
                "True",
                met.reason.as_deref().unwrap_or_default(),
                met.message.as_deref().unwrap_or_default(),
                now,
            ));
        }
        let remaining: BTreeSet<String> = with_finalizer;
        Track {
            finished: self.finished,
            terminating: self.terminating,
            status: self.status,
            flush,
            remove_finalizers: remove,
            with_finalizer: remaining,
            reached_max,
            completions: spec.completions,
            requeue_after: self.requeue_after,
            events: self.events,
            policy_actions,
        }
    }
}

fn non_negative_status(value: Option<i32>) -> u32 {
    value.and_then(|v| u32::try_from(v).ok()).unwrap_or(0)
}

/// `newFailureCondition`: `FailureTarget` first (kube-controller-manager delays the
/// terminal condition until the Pods are gone).
fn failure_target(reason: &str, message: &str, now: Timestamp) -> JobCondition {
    new_condition(FAILURE_TARGET, "True", reason, message, now)
}

fn failed_for_target(target: &JobCondition, now: Timestamp) -> JobCondition {
    new_condition(
        FAILED,
        "True",
        target.reason.as_deref().unwrap_or_default(),
        target.message.as_deref().unwrap_or_default(),
        now,
    )
}

/// Moves the uncounted UIDs whose Pod no longer has the finalizer (or is gone) to the
/// counters (`cleanUncountedPodsWithoutFinalizers`). Whether anything moved.
fn clean_uncounted(status: &mut JobStatus, with_finalizer: &BTreeSet<String>) -> bool {
    let uncounted: &mut UncountedTerminatedPods = status
        .uncounted_terminated_pods
        .get_or_insert_with(Default::default);
    let mut moved = (0, 0);
    if let Some(succeeded) = uncounted.succeeded.as_mut() {
        let before = succeeded.len();
        succeeded.retain(|u| with_finalizer.contains(u));
        moved.0 = before - succeeded.len();
    }
    if let Some(failed) = uncounted.failed.as_mut() {
        let before = failed.len();
        failed.retain(|u| with_finalizer.contains(u));
        moved.1 = before - failed.len();
    }
    if uncounted.succeeded.as_ref().is_some_and(Vec::is_empty) {
        uncounted.succeeded = None;
    }
    if uncounted.failed.as_ref().is_some_and(Vec::is_empty) {
        uncounted.failed = None;
    }
    status.succeeded = Some(status.succeeded.unwrap_or(0) + int32(count(moved.0)));
    status.failed = Some(status.failed.unwrap_or(0) + int32(count(moved.1)));
    moved != (0, 0)
}

/// The status after the tracking: written first when [`Track::flush`], then the finalizers
/// removed, then [`Track::finish`].
#[derive(Debug)]
pub struct Track<'a> {
    pub status: JobStatus,
    /// Whether `status` must be written before the finalizers go.
    pub flush: bool,
    /// Finished Pods whose tracking finalizer is to be removed.
    pub remove_finalizers: Vec<&'a Pod>,
    with_finalizer: BTreeSet<String>,
    finished: Option<JobCondition>,
    terminating: u32,
    reached_max: bool,
    completions: Option<u32>,
    pub requeue_after: Option<Duration>,
    pub events: Vec<Event>,
    /// Failed Pods per Pod failure policy action, for the metric.
    pub policy_actions: BTreeMap<&'static str, u32>,
}

impl Track<'_> {
    /// After the first write (`status` as the apiserver returned it, if written) and the
    /// finalizer removals (`removed`: UIDs whose finalizer is gone): the status to write, if
    /// any, and whether the Job finished with it.
    ///
    /// When a removal failed (`removal_failed`), the Job does not finish in this reconcile:
    /// the status still moves what was counted, and the reconcile fails.
    pub fn finish(
        mut self,
        status: JobStatus,
        removed: &BTreeSet<String>,
        removal_failed: bool,
        now: Timestamp,
    ) -> Finish {
        self.status = status;
        self.with_finalizer.retain(|u| !removed.contains(u));
        let mut write = clean_uncounted(&mut self.status, &self.with_finalizer);
        let mut finished = false;
        if !self.reached_max
            && !removal_failed
            && let Some(condition) = &self.finished
        {
            let uncounted = self.status.uncounted_terminated_pods.as_ref();
            let pending = uncounted
                .and_then(|u| u.succeeded.as_ref())
                .map_or(0, Vec::len)
                + uncounted
                    .and_then(|u| u.failed.as_ref())
                    .map_or(0, Vec::len);
            if pending == 0 && self.terminating == 0 {
                let conditions = self.status.conditions.get_or_insert_with(Vec::new);
                ensure_condition(
                    conditions,
                    &condition.type_,
                    &condition.status,
                    condition.reason.as_deref().unwrap_or_default(),
                    condition.message.as_deref().unwrap_or_default(),
                    now,
                );
                if condition.type_ == COMPLETE {
                    self.status.completion_time = condition.last_transition_time.clone();
                    if self
                        .completions
                        .is_some_and(|c| non_negative_status(self.status.succeeded) > c)
                    {
                        self.events.push(Event::warning(
                            "TooManySucceededPods",
                            "Too many succeeded pods running after completion count reached",
                        ));
                    }
                    self.events
                        .push(Event::normal("Completed", "Job completed"));
                } else {
                    self.events.push(Event::warning(
                        condition.reason.as_deref().unwrap_or_default(),
                        condition.message.as_deref().unwrap_or_default(),
                    ));
                }
                finished = true;
                write = true;
            }
        }
        Finish {
            status: write.then_some(self.status),
            finished,
            events: self.events,
            requeue_after: self.requeue_after,
        }
    }
}

/// The last status write of a reconcile.
#[derive(Debug)]
pub struct Finish {
    /// The status to write, if it changed.
    pub status: Option<JobStatus>,
    /// Whether this write finishes the Job (Complete or Failed).
    pub finished: bool,
    pub events: Vec<Event>,
    pub requeue_after: Option<Duration>,
}

/// Batch sizes for creating `count` Pods: 1, 2, 4, … The caller stops after the first batch
/// with a failure.
pub fn slow_start_batches(count: usize) -> Vec<usize> {
    let mut batches = Vec::new();
    let (mut left, mut size) = (count, SLOW_START_INITIAL_BATCH);
    while left > 0 {
        let batch = size.min(left);
        batches.push(batch);
        left -= batch;
        size *= 2;
    }
    batches
}

/// `controller.ActivePods`' order, first to delete first: unscheduled, then Pending before
/// Unknown before Running, not ready before ready, ready more recently, more restarts,
/// created more recently.
fn removal_order(a: &Pod, b: &Pod) -> Ordering {
    let scheduled = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty())
    };
    let phase_rank = |p: &Pod| match phase(p) {
        Some("Pending") => 0,
        Some("Unknown") => 1,
        Some("Running") => 2,
        _ => 0,
    };
    let restarts = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map_or(0, |cs| {
                cs.iter().map(|c| c.restart_count).max().unwrap_or(0)
            })
    };
    let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    // An unknown time first, else the later time first.
    let later_first = |x: Option<Timestamp>, y: Option<Timestamp>| match (x, y) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(x), Some(y)) => y.cmp(&x),
    };
    scheduled(a)
        .cmp(&scheduled(b))
        .then(phase_rank(a).cmp(&phase_rank(b)))
        .then(is_ready(a).cmp(&is_ready(b)))
        .then_with(|| {
            if is_ready(a) && is_ready(b) {
                later_first(ready_since(a).flatten(), ready_since(b).flatten())
            } else {
                Ordering::Equal
            }
        })
        .then(restarts(b).cmp(&restarts(a)))
        .then_with(|| later_first(created(a), created(b)))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// A new Pod of the Job (`GetPodFromTemplate` and `manageJob`'s additions): the template with
/// the tracking finalizer and the controller reference, `generateName` `<job>-`; for an
/// index, its annotation and label, `hostname` `<job>-<index>`, `generateName`
/// `<job>-<index>-` and the `JOB_COMPLETION_INDEX` variable in every container; with
/// `backoffLimitPerIndex`, the index's failure counts carried over from `replaced`, the
/// index's last failed Pod.
pub fn pod_from_template(spec: &Spec<'_>, index: Option<u32>, replaced: Option<&Pod>) -> Pod {
    let mut template: PodTemplateSpec = spec.job_spec.template.clone();
    let mut meta = template.metadata.take().unwrap_or_default();
    let mut pod_spec = template.spec.take().unwrap_or_default();
    let finalizers = meta.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == TRACKING_FINALIZER) {
        finalizers.push(TRACKING_FINALIZER.into());
    }
    let mut generate_name = format!("{}-", spec.name);
    if spec.indexed {
        for container in pod_spec
            .init_containers
            .iter_mut()
            .flatten()
            .chain(pod_spec.containers.iter_mut())
        {
            let env = container.env.get_or_insert_with(Vec::new);
            if !env.iter().any(|e| e.name == COMPLETION_INDEX_ENV) {
                env.push(EnvVar {
                    name: COMPLETION_INDEX_ENV.into(),
                    value: None,
                    value_from: Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            api_version: None,
                            field_path: format!("metadata.labels['{COMPLETION_INDEX}']"),
                        }),
                        ..EnvVarSource::default()
                    }),
                });
            }
        }
    }
    if let Some(ix) = index {
        meta.annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(COMPLETION_INDEX.into(), ix.to_string());
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .insert(COMPLETION_INDEX.into(), ix.to_string());
        pod_spec.hostname = Some(format!("{}-{ix}", spec.name));
        generate_name = generate_name_with_index(spec.name, ix);
        if spec.backoff_limit_per_index.is_some() {
            let (failures, ignored) = match replaced {
                Some(pod) => {
                    let (mut failures, mut ignored) = (
                        indexes::index_failure_count(pod),
                        indexes::index_absolute_failure_count(pod)
                            - indexes::index_failure_count(pod),
                    );
                    if spec.failure(pod).counts {
                        failures += 1;
                    } else {
                        ignored += 1;
                    }
                    (failures, ignored)
                }
                None => (0, 0),
            };
            let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
            annotations.insert(INDEX_FAILURE_COUNT.into(), failures.to_string());
            if ignored > 0 {
                annotations.insert(INDEX_IGNORED_FAILURE_COUNT.into(), ignored.to_string());
            }
        }
    }
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(generate_name),
            namespace: spec.job.metadata.namespace.clone(),
            labels: meta.labels,
            annotations: meta.annotations,
            finalizers: meta.finalizers,
            owner_references: Some(vec![controller_ref(spec)]),
            ..ObjectMeta::default()
        },
        spec: Some(pod_spec),
        status: None,
    }
}

impl Sync<'_> {
    /// The index's last failed Pod, whose failure counts a replacement carries.
    pub fn replaced(&self, index: Option<u32>) -> Option<&Pod> {
        self.delayed_per_index.get(&index?).copied()
    }
}

#[cfg(test)]
mod tests;
