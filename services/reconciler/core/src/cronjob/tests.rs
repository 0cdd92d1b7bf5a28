use serde_json::{Value, json};

use super::*;

fn utc(text: &str) -> Timestamp {
    text.parse().unwrap()
}

fn parse(spec: &str) -> Schedule {
    Schedule::parse(spec, TimeZone::UTC).unwrap()
}

fn next(spec: &str, after: &str) -> String {
    parse(spec).next(utc(after)).unwrap().to_string()
}

fn cronjob(spec: Value, status: Value) -> CronJob {
    let mut full = json!({
        "schedule": "*/5 * * * *",
        "jobTemplate": {
            "metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}
        }
    });
    for (k, v) in spec.as_object().unwrap() {
        full[k] = v.clone();
    }
    serde_json::from_value(json!({
        "metadata": {"name": "nightly", "namespace": "ns", "uid": "cj-uid",
                     "creationTimestamp": "2027-01-15T08:00:00Z"},
        "spec": full,
        "status": status,
    }))
    .unwrap()
}

fn job(name: &str, condition: Option<&str>, started: Option<&str>, completed: Option<&str>) -> Job {
    let conditions: Vec<Value> = condition
        .into_iter()
        .map(|c| json!({"type": c, "status": "True"}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "status": {"conditions": conditions, "startTime": started, "completionTime": completed},
    }))
    .unwrap()
}

#[test]
fn fields_ranges_steps_and_names_parse_as_robfig_cron() {
    assert_eq!(
        next("*/15 * * * *", "2027-01-15T08:07:00Z"),
        "2027-01-15T08:15:00Z"
    );
    assert_eq!(
        next("0 9-17/4 * * MON-FRI", "2027-01-15T10:00:00Z"),
        "2027-01-15T13:00:00Z"
    );
    // 2027-01-15 is a Friday: the next weekday 09:00 is Monday the 18th.
    assert_eq!(
        next("0 9 * * mon-fri", "2027-01-15T09:00:00Z"),
        "2027-01-18T09:00:00Z"
    );
    assert_eq!(
        next("30 2 1 jan,jul ?", "2027-01-15T00:00:00Z"),
        "2027-07-01T02:30:00Z"
    );
    // "N/step" is "N-max/step".
    assert_eq!(
        next("5/20 * * * *", "2027-01-15T08:26:00Z"),
        "2027-01-15T08:45:00Z"
    );
    // Strictly after: a time on the schedule is not its own next.
    assert_eq!(
        next("0 * * * *", "2027-01-15T08:00:00Z"),
        "2027-01-15T09:00:00Z"
    );
    assert_eq!(
        next("0 * * * *", "2027-01-15T07:59:59.9Z"),
        "2027-01-15T08:00:00Z"
    );
}

#[test]
fn day_of_month_and_day_of_week_are_either_unless_one_is_a_star() {
    // The 13th, or any Friday.
    assert_eq!(
        next("0 0 13 * 5", "2027-01-15T01:00:00Z"),
        "2027-01-22T00:00:00Z"
    );
    assert_eq!(
        next("0 0 13 * 5", "2027-01-23T00:00:00Z"),
        "2027-01-29T00:00:00Z"
    );
    // A star in day of week: the 13th only.
    assert_eq!(
        next("0 0 13 * *", "2027-01-15T01:00:00Z"),
        "2027-02-13T00:00:00Z"
    );
    // "*/2" is no star: the odd days, or Sundays.
    assert_eq!(
        next("0 0 */2 * 0", "2027-01-15T01:00:00Z"),
        "2027-01-17T00:00:00Z"
    );
}

#[test]
fn descriptors_and_every_parse() {
    assert_eq!(
        next("@hourly", "2027-01-15T08:07:00Z"),
        "2027-01-15T09:00:00Z"
    );
    assert_eq!(
        next("@daily", "2027-01-15T08:07:00Z"),
        "2027-01-16T00:00:00Z"
    );
    assert_eq!(
        next("@weekly", "2027-01-15T08:07:00Z"),
        "2027-01-17T00:00:00Z"
    );
    assert_eq!(
        next("@monthly", "2027-01-15T08:07:00Z"),
        "2027-02-01T00:00:00Z"
    );
    assert_eq!(
        next("@yearly", "2027-01-15T08:07:00Z"),
        "2028-01-01T00:00:00Z"
    );
    assert_eq!(
        next("@every 1h30m", "2027-01-15T08:07:10.5Z"),
        "2027-01-15T09:37:10Z"
    );
    assert_eq!(
        parse("@every 100ms")
            .next(utc("2027-01-15T08:00:00Z"))
            .unwrap()
            .to_string(),
        "2027-01-15T08:00:01Z"
    );
}

#[test]
fn bad_schedules_are_named_as_robfig_cron_names_them() {
    let err = |spec: &str| {
        Schedule::parse(spec, TimeZone::UTC)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(err(""), "empty spec string");
    assert_eq!(
        err("* * * *"),
        "expected exactly 5 fields, found 4: * * * *"
    );
    assert_eq!(
        err("61 * * * *"),
        "end of range (61) above maximum (59): 61"
    );
    assert_eq!(
        err("* * 0 * *"),
        "beginning of range (0) below minimum (1): 0"
    );
    assert_eq!(
        err("5-2 * * * *"),
        "beginning of range (5) beyond end of range (2): 5-2"
    );
    assert_eq!(
        err("*/0 * * * *"),
        "step of range should be a positive number: */0"
    );
    assert_eq!(err("x * * * *"), "failed to parse int from x");
    assert_eq!(err("@fortnightly"), "unrecognized descriptor: @fortnightly");
    assert!(err("TZ=Mars/Olympus 0 * * * *").starts_with("provided bad location Mars/Olympus"));
    // The 30th of February never comes.
    assert_eq!(parse("0 0 30 2 *").next(utc("2027-01-15T00:00:00Z")), None);
}

#[test]
fn time_zones_move_the_wall_clock_and_dst_gaps_run_after_the_gap() {
    let ny = TimeZone::get("America/New_York").unwrap();
    let nine = Schedule::parse("0 9 * * *", ny.clone()).unwrap();
    assert_eq!(
        nine.next(utc("2027-01-15T12:00:00Z")).unwrap().to_string(),
        "2027-01-15T14:00:00Z"
    );
    let prefixed = parse("CRON_TZ=America/New_York 0 9 * * *");
    assert_eq!(
        prefixed
            .next(utc("2027-01-15T12:00:00Z"))
            .unwrap()
            .to_string(),
        "2027-01-15T14:00:00Z"
    );
    // 2027-03-14 02:30 does not exist in New York: it runs as the clock moved, at 03:30 EDT.
    let gap = Schedule::parse("30 2 * * *", ny).unwrap();
    assert_eq!(
        gap.next(utc("2027-03-14T05:00:00Z")).unwrap().to_string(),
        "2027-03-14T07:30:00Z"
    );
}

#[test]
fn the_most_recent_unmet_time_counts_what_was_missed() {
    let schedule = parse("*/5 * * * *");
    let cj = cronjob(
        json!({}),
        json!({"lastScheduleTime": "2027-01-15T09:00:00Z"}),
    );
    let (_, recent, missed) =
        most_recent(&cj, utc("2027-01-15T09:03:00Z"), &schedule, true).unwrap();
    assert_eq!((recent, missed), (None, Missed::None));
    let (_, recent, missed) =
        most_recent(&cj, utc("2027-01-15T09:07:00Z"), &schedule, true).unwrap();
    assert_eq!(
        (recent, missed),
        (Some(utc("2027-01-15T09:05:00Z")), Missed::None)
    );
    let (_, recent, missed) =
        most_recent(&cj, utc("2027-01-15T09:31:00Z"), &schedule, true).unwrap();
    assert_eq!(
        (recent, missed),
        (Some(utc("2027-01-15T09:30:00Z")), Missed::Few)
    );
    let (_, recent, missed) =
        most_recent(&cj, utc("2027-01-16T09:31:00Z"), &schedule, true).unwrap();
    assert_eq!(
        (recent, missed),
        (Some(utc("2027-01-16T09:30:00Z")), Missed::Many)
    );
    // A starting deadline bounds how far back it looks.
    let cj = cronjob(
        json!({"startingDeadlineSeconds": 120}),
        json!({"lastScheduleTime": "2027-01-15T09:00:00Z"}),
    );
    let (_, recent, missed) =
        most_recent(&cj, utc("2027-01-16T09:31:00Z"), &schedule, true).unwrap();
    assert_eq!(
        (recent, missed),
        (Some(utc("2027-01-16T09:30:00Z")), Missed::None)
    );
    assert_eq!(
        next_after(&cj, utc("2027-01-16T09:31:00Z"), &schedule),
        Duration::from_secs(240) + NEXT_SCHEDULE_DELTA
    );
}

#[test]
fn a_due_schedule_starts_a_job_named_for_its_minute() {
    let cj = cronjob(
        json!({}),
        json!({"lastScheduleTime": "2027-01-15T09:00:00Z"}),
    );
    let mut events = Vec::new();
    let start = start(&cj, utc("2027-01-15T09:05:02Z"), &mut events);
    let Start::Now {
        scheduled,
        replace,
        then,
    } = start
    else {
        panic!("{start:?}");
    };
    assert_eq!(scheduled, utc("2027-01-15T09:05:00Z"));
    assert!(replace.is_empty() && events.is_empty());
    assert_eq!(then, Duration::from_secs(298) + NEXT_SCHEDULE_DELTA);
    let new = job_from_template(&cj, scheduled, &TimeZone::UTC);
    assert_eq!(new.metadata.name.as_deref(), Some("nightly-30000065"));
    let annotations = new.metadata.annotations.unwrap();
    assert_eq!(annotations[SCHEDULED_TIMESTAMP], "2027-01-15T09:05:00Z");
    assert_eq!(annotations["note"], "x");
    assert_eq!(new.metadata.labels.unwrap()["team"], "a");
    assert_eq!(new.metadata.owner_references.unwrap()[0].kind, "CronJob");
    let tokyo = TimeZone::get("Asia/Tokyo").unwrap();
    let new = job_from_template(&cj, scheduled, &tokyo);
    assert_eq!(
        new.metadata.annotations.unwrap()[SCHEDULED_TIMESTAMP],
        "2027-01-15T18:05:00+09:00"
    );
}

#[test]
fn forbid_waits_replace_replaces_and_a_late_start_is_missed() {
    let active = json!([{"kind": "Job", "name": "nightly-1", "namespace": "ns", "uid": "u1"}]);
    let status = json!({"lastScheduleTime": "2027-01-15T09:00:00Z", "active": active});
    let now = utc("2027-01-15T09:05:02Z");
    let mut events = Vec::new();
    let forbid = cronjob(json!({"concurrencyPolicy": "Forbid"}), status.clone());
    assert!(matches!(start(&forbid, now, &mut events), Start::Later(_)));
    assert_eq!(events[0].reason, "JobAlreadyActive");
    let replace = cronjob(json!({"concurrencyPolicy": "Replace"}), status.clone());
    let Start::Now { replace, .. } = start(&replace, now, &mut Vec::new()) else {
        panic!("replace starts");
    };
    assert_eq!(replace[0].name.as_deref(), Some("nightly-1"));
    // 09:05 is more than 1 s ago: not made up, and the next is waited for.
    let late = cronjob(json!({"startingDeadlineSeconds": 1}), status);
    let mut events = Vec::new();
    assert_eq!(
        start(&late, now, &mut events),
        Start::Later(Duration::from_secs(298) + NEXT_SCHEDULE_DELTA)
    );
    assert!(events.is_empty());
}

#[test]
fn suspended_deleted_and_broken_cronjobs_start_nothing() {
    let now = utc("2027-01-15T09:05:02Z");
    let status = json!({"lastScheduleTime": "2027-01-15T09:00:00Z"});
    assert_eq!(
        start(
            &cronjob(json!({"suspend": true}), status.clone()),
            now,
            &mut Vec::new()
        ),
        Start::Never
    );
    let mut events = Vec::new();
    let bad_zone = cronjob(json!({"timeZone": "Mars/Olympus"}), status.clone());
    assert_eq!(start(&bad_zone, now, &mut events), Start::Never);
    assert_eq!(events[0].reason, "UnknownTimeZone");
    let mut events = Vec::new();
    let bad = cronjob(json!({"schedule": "99 * * * *"}), status.clone());
    assert_eq!(start(&bad, now, &mut events), Start::Never);
    assert_eq!(events[0].reason, "UnparseableSchedule");
    // Already started for this time: wait for the next.
    let done = cronjob(
        json!({}),
        json!({"lastScheduleTime": "2027-01-15T09:05:00Z"}),
    );
    assert!(matches!(
        start(&done, now, &mut Vec::new()),
        Start::Later(_)
    ));
}

#[test]
fn finished_jobs_leave_the_active_list_and_the_history_keeps_its_limits() {
    let mut cj = cronjob(
        json!({"successfulJobsHistoryLimit": 1, "failedJobsHistoryLimit": 1}),
        json!({"active": [
            {"kind": "Job", "name": "a", "namespace": "ns", "uid": "uid-a"},
            {"kind": "Job", "name": "gone", "namespace": "ns", "uid": "uid-gone"}
        ]}),
    );
    let a = job(
        "a",
        Some("Complete"),
        Some("2027-01-15T09:00:00Z"),
        Some("2027-01-15T09:01:00Z"),
    );
    let b = job(
        "b",
        Some("Complete"),
        Some("2027-01-15T08:00:00Z"),
        Some("2027-01-15T08:01:00Z"),
    );
    let c = job("c", Some("Failed"), Some("2027-01-15T07:00:00Z"), None);
    let stray = job("stray", None, None, None);
    let jobs = [&a, &b, &c, &stray];
    let mut events = Vec::new();
    let (changed, unexpected, unaccounted) = account(&mut cj, &jobs, &mut events);
    assert!(changed);
    assert_eq!(
        events[0].message,
        "Saw completed job: a, condition: Complete"
    );
    assert_eq!(unexpected[0].metadata.name.as_deref(), Some("stray"));
    assert_eq!(unaccounted[0].name.as_deref(), Some("gone"));
    let status = cj.status.as_ref().unwrap();
    assert_eq!(
        status.last_successful_time,
        Some(Time(utc("2027-01-15T09:01:00Z")))
    );
    let history: Vec<&str> = past_history(&cj, &jobs)
        .iter()
        .map(|j| j.metadata.name.as_deref().unwrap())
        .collect();
    assert_eq!(
        history,
        ["b"],
        "the older success goes; one failure is within its limit"
    );
}
