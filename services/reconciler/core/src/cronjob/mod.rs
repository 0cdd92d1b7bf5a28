//! The CronJob controller's decisions, as kube-controller-manager's `pkg/controller/cronjob`
//! (`ControllerV2`) makes them.
//!
//! ```text
//!  its Jobs (controlled by it) ─► history: delete the oldest finished past the limits
//!                              ─► active list: finished ones out (SawCompletedJob), unknown
//!                                 ones reported (UnexpectedJob), missing ones out (MissingJob);
//!                                 lastSuccessfulTime
//!  being deleted │ bad time zone │ suspended │ bad schedule ─► nothing more
//!  the most recent unmet schedule time (from lastScheduleTime or creation, no earlier than
//!  startingDeadlineSeconds ago; over 100 missed: TooManyMissedTimes)
//!     none ─► requeue for the next │ too late ─► MissSchedule │ already started ─► requeue
//!     Forbid with active Jobs ─► JobAlreadyActive │ Replace ─► delete the active Jobs
//!     ─► create `<cronjob>-<minutes since the epoch>`, add it to active, lastScheduleTime
//!  requeue until the next schedule time (+100 ms)
//! ```
//!
//! The requeue is a delayed key in the queue: a CronJob costs nothing between its runs, and
//! a reconciler restart loses no schedule.

mod schedule;

use std::time::Duration;

use jiff::tz::TimeZone;
use k8s_openapi::{
    api::{
        batch::v1::{CronJob, Job},
        core::v1::ObjectReference,
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time},
    jiff::Timestamp,
};

pub use self::schedule::{Schedule, ScheduleError};
pub use crate::event::Event;

/// The annotation on a Job with the time it was scheduled for, RFC 3339 in the CronJob's
/// time zone.
pub const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
/// Added to every requeue for the next schedule time (`nextScheduleDelta`), so that the
/// reconcile runs just after it, not just before.
pub const NEXT_SCHEDULE_DELTA: Duration = Duration::from_millis(100);
/// More missed start times than this: a `TooManyMissedTimes` warning.
pub const MANY_MISSED: i64 = 100;

/// `Complete` or `Failed`, if the Job has finished.
pub fn finished(job: &Job) -> Option<&'static str> {
    job.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find_map(|c| match (c.type_.as_str(), c.status.as_str()) {
            ("Complete", "True") => Some("Complete"),
            ("Failed", "True") => Some("Failed"),
            _ => None,
        })
}

/// The CronJob's time zone (`spec.timeZone`; UTC when unset: kube-controller-manager uses
/// its process's local zone, UTC in its images). An unknown one is an error: no Job starts.
pub fn time_zone(cj: &CronJob) -> Result<TimeZone, String> {
    match cj.spec.as_ref().and_then(|s| s.time_zone.as_deref()) {
        None | Some("") | Some("UTC") => Ok(TimeZone::UTC),
        Some(name) => TimeZone::get(name).map_err(|e| e.to_string()),
    }
}

fn schedule_text(cj: &CronJob) -> &str {
    cj.spec.as_ref().map_or("", |s| s.schedule.as_str())
}

/// The schedule in the CronJob's time zone (`formatSchedule` and the parse); a `TZ=` in the
/// schedule itself is honoured, with kube-controller-manager's `UnsupportedSchedule` warning.
pub fn schedule_of(
    cj: &CronJob,
    tz: TimeZone,
    events: &mut Vec<Event>,
) -> Result<Schedule, ScheduleError> {
    let text = schedule_text(cj);
    if text.contains("TZ") {
        events.push(Event::warning(
            "UnsupportedSchedule",
            format!(
                "CRON_TZ or TZ used in schedule {text:?} is not officially supported, see https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/ for more details"
            ),
        ));
    }
    Schedule::parse(text, tz)
}

/// How many start times were missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    None,
    Few,
    Many,
}

/// The most recent start time at or before `now` not yet started, from the last schedule
/// time (or the CronJob's creation), and no earlier than `startingDeadlineSeconds` ago when
/// `with_deadline` (`mostRecentScheduleTime`). Also the time searched from, and how many
/// start times were missed.
pub fn most_recent(
    cj: &CronJob,
    now: Timestamp,
    schedule: &Schedule,
    with_deadline: bool,
) -> Result<(Timestamp, Option<Timestamp>, Missed), String> {
    let status = cj.status.as_ref();
    let mut earliest = status
        .and_then(|s| s.last_schedule_time.as_ref())
        .or(cj.metadata.creation_timestamp.as_ref())
        .map_or(Timestamp::UNIX_EPOCH, |t| t.0);
    if with_deadline
        && let Some(seconds) = cj.spec.as_ref().and_then(|s| s.starting_deadline_seconds)
    {
        let deadline = now
            .checked_sub(jiff::SignedDuration::from_secs(seconds))
            .unwrap_or(Timestamp::MIN);
        earliest = earliest.max(deadline);
    }
    let Some(t1) = schedule.next(earliest) else {
        return Ok((earliest, None, Missed::None));
    };
    if now < t1 {
        return Ok((earliest, None, Missed::None));
    }
    let Some(t2) = schedule.next(t1) else {
        return Ok((earliest, Some(t1), Missed::None));
    };
    if now < t2 {
        return Ok((earliest, Some(t1), Missed::None));
    }
    let between = (t2.as_millisecond() - t1.as_millisecond() + 500) / 1000;
    if between < 1 {
        return Err("time difference between two schedules is less than 1 second".into());
    }
    let elapsed = (now.as_millisecond() - t1.as_millisecond()) / 1000;
    let missed = elapsed / between + 1;
    // Start from shortly before the last one and walk forward to it: a schedule's gaps are
    // not all equal (months, DST), so one estimate is not enough.
    let from = t1
        .checked_add(jiff::SignedDuration::from_secs((missed - 2) * between))
        .unwrap_or(t1);
    let mut most_recent = None;
    let mut t = schedule.next(from);
    while let Some(at) = t.filter(|at| *at <= now) {
        most_recent = Some(at);
        t = schedule.next(at);
    }
    let missed = if missed > MANY_MISSED {
        Missed::Many
    } else {
        Missed::Few
    };
    Ok((earliest, most_recent, missed))
}

/// How long until the reconcile after the next start time (`nextScheduleTimeDuration`).
pub fn next_after(cj: &CronJob, now: Timestamp, schedule: &Schedule) -> Duration {
    let from = match most_recent(cj, now, schedule, false) {
        Err(_) => now,
        Ok((_, Some(recent), _)) => recent,
        Ok((earliest, None, Missed::None)) => earliest,
        Ok((_, None, _)) => now,
    };
    let next = schedule.next(from).unwrap_or(now);
    Duration::try_from(next.duration_since(now)).unwrap_or(Duration::ZERO) + NEXT_SCHEDULE_DELTA
}

/// `<cronjob>-<scheduled time in minutes since the epoch>` (`getJobName`).
pub fn job_name(cronjob: &str, scheduled: Timestamp) -> String {
    format!("{cronjob}-{}", scheduled.as_second().div_euclid(60))
}

/// The CronJob's controller reference.
pub fn controller_ref(cj: &CronJob) -> OwnerReference {
    OwnerReference {
        api_version: "batch/v1".into(),
        kind: "CronJob".into(),
        name: cj.metadata.name.clone().unwrap_or_default(),
        uid: cj.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The Job for `scheduled` (`getJobFromTemplate2`): the template's labels, annotations and
/// spec, the scheduled-timestamp annotation, the name, the controller reference.
pub fn job_from_template(cj: &CronJob, scheduled: Timestamp, tz: &TimeZone) -> Job {
    let template = cj
        .spec
        .as_ref()
        .map(|s| s.job_template.clone())
        .unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let mut annotations = meta.annotations.unwrap_or_default();
    annotations.insert(
        SCHEDULED_TIMESTAMP.into(),
        scheduled
            .to_zoned(tz.clone())
            .strftime("%Y-%m-%dT%H:%M:%S%:z")
            .to_string()
            .replace("+00:00", "Z"),
    );
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(
                cj.metadata.name.as_deref().unwrap_or_default(),
                scheduled,
            )),
            namespace: cj.metadata.namespace.clone(),
            labels: meta.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![controller_ref(cj)]),
            ..ObjectMeta::default()
        },
        spec: template.spec,
        status: None,
    }
}

/// A reference to a Job for `status.active` (`ref.GetReference`).
pub fn reference(job: &Job) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        name: job.metadata.name.clone(),
        namespace: job.metadata.namespace.clone(),
        uid: job.metadata.uid.clone(),
        resource_version: job.metadata.resource_version.clone(),
        field_path: None,
    }
}

/// The finished Jobs past the history limits, oldest start first (`cleanupFinishedJobs`):
/// `successfulJobsHistoryLimit` of the `Complete`, `failedJobsHistoryLimit` of the `Failed`.
pub fn past_history<'j>(cj: &CronJob, jobs: &[&'j Job]) -> Vec<&'j Job> {
    let Some(spec) = cj.spec.as_ref() else {
        return Vec::new();
    };
    let mut remove = Vec::new();
    for (kind, limit) in [
        ("Complete", spec.successful_jobs_history_limit),
        ("Failed", spec.failed_jobs_history_limit),
    ] {
        let Some(limit) = limit else { continue };
        let mut of_kind: Vec<&Job> = jobs
            .iter()
            .copied()
            .filter(|j| finished(j) == Some(kind))
            .collect();
        let surplus = of_kind
            .len()
            .saturating_sub(usize::try_from(limit).unwrap_or(0));
        if surplus == 0 {
            continue;
        }
        of_kind.sort_by(|a, b| by_start_time(a, b));
        remove.extend(of_kind.into_iter().take(surplus));
    }
    remove
}

/// Started before not started, earlier first, then by name (`byJobStartTime`).
fn by_start_time(a: &Job, b: &Job) -> std::cmp::Ordering {
    let start = |j: &Job| {
        j.status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0)
    };
    match (start(a), start(b)) {
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (Some(_), None) => std::cmp::Ordering::Less,
        (x, y) if x == y => a.metadata.name.cmp(&b.metadata.name),
        (x, y) => x.cmp(&y),
    }
}

/// Takes finished Jobs out of the active list and keeps `lastSuccessfulTime` (the first half
/// of `syncCronJob`). Whether the status changed; the unfinished Jobs the active list lacks
/// (to check against a fresh read of the CronJob before reporting `UnexpectedJob`); and the
/// active references with no Job among `jobs` (to look up: `MissingJob` if gone).
pub fn account(
    cj: &mut CronJob,
    jobs: &[&Job],
    events: &mut Vec<Event>,
) -> (bool, Vec<Job>, Vec<ObjectReference>) {
    let status = cj.status.get_or_insert_with(Default::default);
    let mut changed = false;
    let mut unexpected = Vec::new();
    let in_active = |status: &k8s_openapi::api::batch::v1::CronJobStatus, uid: &str| {
        status
            .active
            .iter()
            .flatten()
            .any(|r| r.uid.as_deref() == Some(uid))
    };
    for job in jobs {
        let uid = job.metadata.uid.as_deref().unwrap_or_default();
        let found = in_active(status, uid);
        match finished(job) {
            None if !found => unexpected.push((*job).clone()),
            None => {}
            Some(condition) => {
                if found {
                    if let Some(active) = status.active.as_mut() {
                        active.retain(|r| r.uid.as_deref() != Some(uid));
                    }
                    events.push(Event::normal(
                        "SawCompletedJob",
                        format!(
                            "Saw completed job: {}, condition: {condition}",
                            job.metadata.name.as_deref().unwrap_or_default()
                        ),
                    ));
                    changed = true;
                }
                if condition == "Complete"
                    && let Some(completed) =
                        job.status.as_ref().and_then(|s| s.completion_time.as_ref())
                    && status
                        .last_successful_time
                        .as_ref()
                        .is_none_or(|last| completed.0 > last.0)
                {
                    status.last_successful_time = Some(completed.clone());
                    changed = true;
                }
            }
        }
    }
    let own: Vec<&str> = jobs
        .iter()
        .filter_map(|j| j.metadata.uid.as_deref())
        .collect();
    let unaccounted = status
        .active
        .iter()
        .flatten()
        .filter(|r| !own.contains(&r.uid.as_deref().unwrap_or_default()))
        .cloned()
        .collect();
    (changed, unexpected, unaccounted)
}

/// Takes the Job out of the active list (`deleteFromActiveList`).
pub fn forget_active(cj: &mut CronJob, uid: Option<&str>) {
    if let Some(active) = cj.status.as_mut().and_then(|s| s.active.as_mut()) {
        active.retain(|r| r.uid.as_deref() != uid);
    }
}

/// What to do about the schedule (the second half of `syncCronJob`).
#[derive(Debug, PartialEq)]
pub enum Start {
    /// Nothing now, and no requeue (being deleted, suspended, a bad time zone or schedule).
    Never,
    /// Nothing now: reconcile again after this long.
    Later(Duration),
    /// Start the Job for this time; before, delete the active Jobs (`Replace`). Then
    /// reconcile again after the duration.
    Now {
        scheduled: Timestamp,
        replace: Vec<ObjectReference>,
        then: Duration,
    },
}

/// Whether a Job is due now, with kube-controller-manager's Events.
pub fn start(cj: &CronJob, now: Timestamp, events: &mut Vec<Event>) -> Start {
    if cj.metadata.deletion_timestamp.is_some() {
        return Start::Never;
    }
    let tz = match time_zone(cj) {
        Ok(tz) => tz,
        Err(e) => {
            let name = cj
                .spec
                .as_ref()
                .and_then(|s| s.time_zone.clone())
                .unwrap_or_default();
            events.push(Event::warning(
                "UnknownTimeZone",
                format!("invalid timeZone: {name:?}: {e}"),
            ));
            return Start::Never;
        }
    };
    let spec = cj.spec.clone().unwrap_or_default();
    if spec.suspend == Some(true) {
        return Start::Never;
    }
    let schedule = match schedule_of(cj, tz, events) {
        Ok(schedule) => schedule,
        Err(e) => {
            events.push(Event::warning(
                "UnparseableSchedule",
                format!("unparseable schedule: {:?} : {e}", spec.schedule),
            ));
            return Start::Never;
        }
    };
    let (scheduled, missed) = match most_recent(cj, now, &schedule, true) {
        Ok((_, scheduled, missed)) => (scheduled, missed),
        Err(e) => {
            events.push(Event::warning(
                "InvalidSchedule",
                format!("invalid schedule: {} : {e}", spec.schedule),
            ));
            return Start::Never;
        }
    };
    let later = || Start::Later(next_after(cj, now, &schedule));
    let Some(scheduled) = scheduled.filter(|s| *s <= now) else {
        return later();
    };
    if missed == Missed::Many {
        events.push(Event::warning(
            "TooManyMissedTimes",
            "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew",
        ));
    }
    if let Some(seconds) = spec.starting_deadline_seconds
        && scheduled
            .checked_add(jiff::SignedDuration::from_secs(seconds))
            .is_ok_and(|deadline| deadline < now)
    {
        events.push(Event::warning(
            "MissSchedule",
            format!(
                "Missed scheduled time to start a job: {}",
                scheduled.strftime("%a, %d %b %Y %H:%M:%S %z")
            ),
        ));
        return later();
    }
    let status = cj.status.clone().unwrap_or_default();
    let active = status.active.unwrap_or_default();
    let name = job_name(cj.metadata.name.as_deref().unwrap_or_default(), scheduled);
    if active
        .iter()
        .any(|r| r.name.as_deref() == Some(name.as_str()))
        || status
            .last_schedule_time
            .as_ref()
            .is_some_and(|t| t.0 == scheduled)
    {
        return later();
    }
    match spec.concurrency_policy.as_deref() {
        Some("Forbid") if !active.is_empty() => {
            events.push(Event::normal(
                "JobAlreadyActive",
                "Not starting job because prior execution is running and concurrency policy is Forbid",
            ));
            later()
        }
        Some("Replace") => {
            let mut after = cj.clone();
            record_start(&mut after, None, scheduled);
            Start::Now {
                scheduled,
                replace: active,
                then: next_after(&after, now, &schedule),
            }
        }
        _ => {
            let mut after = cj.clone();
            record_start(&mut after, None, scheduled);
            Start::Now {
                scheduled,
                replace: Vec::new(),
                then: next_after(&after, now, &schedule),
            }
        }
    }
}

/// Adds the started Job to the active list and sets `lastScheduleTime`.
pub fn record_start(cj: &mut CronJob, job: Option<&Job>, scheduled: Timestamp) {
    let status = cj.status.get_or_insert_with(Default::default);
    if let Some(job) = job {
        status
            .active
            .get_or_insert_with(Vec::new)
            .push(reference(job));
    }
    status.last_schedule_time = Some(Time(scheduled));
}

#[cfg(test)]
mod tests;
