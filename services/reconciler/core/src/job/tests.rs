use serde_json::{Value, json};

use super::*;

const UID: &str = "job-uid-1";

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn job(spec: Value, status: Value) -> Job {
    let mut full = json!({
        "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": UID}},
        "template": {
            "metadata": {"labels": {"batch.kubernetes.io/controller-uid": UID, "app": "x"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}
        }
    });
    for (k, v) in spec.as_object().unwrap() {
        full[k] = v.clone();
    }
    serde_json::from_value(json!({
        "metadata": {"name": "work", "namespace": "ns", "uid": UID},
        "spec": full,
        "status": status,
    }))
    .unwrap()
}

/// A Pod of the Job: `phase`, the tracking finalizer, optionally an index.
fn pod(name: &str, phase: &str, index: Option<u32>) -> Pod {
    let mut annotations = serde_json::Map::new();
    if let Some(ix) = index {
        annotations.insert(COMPLETION_INDEX.into(), json!(ix.to_string()));
    }
    serde_json::from_value(json!({
        "metadata": {
            "name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "labels": {"batch.kubernetes.io/controller-uid": UID},
            "annotations": annotations,
            "finalizers": [TRACKING_FINALIZER],
            "creationTimestamp": "2027-01-15T08:00:00Z",
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "work", "uid": UID, "controller": true}]
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": phase}
    }))
    .unwrap()
}

fn exited(mut p: Pod, code: i32, finished: i64) -> Pod {
    let status = p.status.get_or_insert_with(Default::default);
    status.container_statuses = Some(vec![
        serde_json::from_value(json!({
            "name": "c", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "finishedAt": Time(at(finished))}}
        }))
        .unwrap(),
    ]);
    p
}

fn without_finalizer(mut p: Pod) -> Pod {
    p.metadata.finalizers = None;
    p
}

fn run<'a>(spec: &'a Spec<'a>, pods: &'a [Pod], now: Timestamp) -> (Manage<'a>, Sync<'a>) {
    let mut sync = Sync::new(spec, pods.iter().collect(), now);
    let manage = sync.manage(now);
    (manage, sync)
}

fn condition_of<'s>(status: &'s JobStatus, type_: &str) -> Option<&'s JobCondition> {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
}

#[test]
fn intervals_parse_print_and_merge_as_kube_controller_manager() {
    let i = Intervals::parse("1,3-5,7", 10);
    assert_eq!(i.to_string(), "1,3-5,7");
    assert_eq!(i.total(), 5);
    assert!(i.has(4) && !i.has(2) && i.has(7) && !i.has(8));
    // Two adjacent indexes print as a pair, three as a range; adjacent inputs merge.
    assert_eq!(Intervals::default().with([2, 3]).to_string(), "2,3");
    assert_eq!(i.with([2, 6]).to_string(), "1-7");
    // Past completions: an interval starting there ends the parse, one ending there is cut.
    assert_eq!(Intervals::parse("0-3,8-12,20", 10).to_string(), "0-3,8,9");
    assert_eq!(Intervals::parse("x,2,4-y,6", 10).to_string(), "2,6");
    assert_eq!(i.first_missing(3, 10), vec![0, 2, 6]);
    assert_eq!(i.first_missing(10, 10), vec![0, 2, 6, 8, 9]);
    let rule = Intervals::parse("0-4", 10);
    assert!(!i.covers(&rule, None), "1, 3 and 4 of 0-4");
    assert!(i.covers(&rule, Some(3)));
    assert!(Intervals::parse("0-5", 10).covers(&rule, None));
}

#[test]
fn generated_names_with_an_index_are_cut_to_fit() {
    assert_eq!(generate_name_with_index("work", 3), "work-3-");
    let long = "a".repeat(70);
    let name = generate_name_with_index(&long, 12);
    assert_eq!(name.len(), 58);
    assert!(name.ends_with("a-12-"));
}

#[test]
fn success_policy_rules_match_in_order() {
    let policy: k8s_openapi::api::batch::v1::SuccessPolicy = serde_json::from_value(json!({
        "rules": [{"succeededIndexes": "0,2-3"}, {"succeededCount": 2}]
    }))
    .unwrap();
    let succeeded = Intervals::parse("0,2", 5);
    assert_eq!(
        match_success(Some(&policy), 5, &succeeded).as_deref(),
        Some("Matched rules at index 1")
    );
    let succeeded = Intervals::parse("0,2-3", 5);
    assert_eq!(
        match_success(Some(&policy), 5, &succeeded).as_deref(),
        Some("Matched rules at index 0")
    );
    assert_eq!(match_success(Some(&policy), 5, &Intervals::default()), None);
}

#[test]
fn pod_failure_policy_first_matching_rule_decides() {
    let policy: k8s_openapi::api::batch::v1::PodFailurePolicy = serde_json::from_value(json!({
        "rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            {"action": "FailJob", "onExitCodes": {"containerName": "c", "operator": "In", "values": [42]}},
            {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [0, 42]}}
        ]
    }))
    .unwrap();
    let failed = exited(pod("p", "Failed", None), 42, 10);
    let m = match_failure(Some(&policy), &failed);
    assert_eq!(m.action, Some(FailureAction::FailJob));
    assert_eq!(
        m.message.as_deref(),
        Some("Container c for pod ns/p failed with exit code 42 matching FailJob rule at index 1")
    );
    let other = exited(pod("q", "Failed", None), 3, 10);
    assert_eq!(
        match_failure(Some(&policy), &other).action,
        Some(FailureAction::Count)
    );
    let mut disrupted = exited(pod("r", "Failed", None), 42, 10);
    disrupted.status.as_mut().unwrap().conditions = Some(vec![
        serde_json::from_value(json!({"type": "DisruptionTarget", "status": "True"})).unwrap(),
    ]);
    let m = match_failure(Some(&policy), &disrupted);
    assert_eq!((m.action, m.counts), (Some(FailureAction::Ignore), false));
    assert_eq!(match_failure(None, &other), FailureMatch::UNMATCHED);
}

#[test]
fn failure_backoff_doubles_from_ten_seconds_since_the_last_success() {
    let f1 = exited(pod("f1", "Failed", None), 1, 100);
    let f2 = exited(pod("f2", "Failed", None), 1, 200);
    let s = exited(pod("s", "Succeeded", None), 0, 150);
    let record = Record::of([&s], [&f1, &f2]);
    assert_eq!(record.failures, 1);
    assert_eq!(record.remaining(at(203)), Duration::from_secs(7));
    let record = Record::of([], [&f1, &f2]);
    assert_eq!(record.failures, 2);
    assert_eq!(record.remaining(at(205)), Duration::from_secs(15));
    assert_eq!(record.remaining(at(300)), Duration::ZERO);
    let many: Vec<Pod> = (0..12)
        .map(|i| exited(pod(&format!("m{i}"), "Failed", None), 1, 100))
        .collect();
    assert_eq!(
        Record::of([], many.iter()).remaining(at(100)),
        MAX_POD_FAILURE_BACKOFF
    );
}

#[test]
fn a_new_job_creates_parallelism_pods_and_sets_its_start_time() {
    let j = job(json!({"parallelism": 3, "completions": 5}), json!({}));
    let spec = Spec::new(&j).unwrap();
    let (manage, mut sync) = run(&spec, &[], at(0));
    assert_eq!(manage, Manage::Create(vec![None; 3]));
    sync.managed(
        &manage,
        Managed {
            created: 3,
            ..Managed::default()
        },
        at(0),
    );
    let track = sync.track(at(0));
    assert!(track.flush, "active and startTime changed");
    assert_eq!(track.status.active, Some(3));
    assert_eq!(track.status.start_time, Some(Time(at(0))));
    let new = pod_from_template(&spec, None, None);
    assert_eq!(new.metadata.generate_name.as_deref(), Some("work-"));
    assert_eq!(
        new.metadata.finalizers,
        Some(vec![TRACKING_FINALIZER.to_owned()])
    );
    assert_eq!(new.metadata.owner_references.unwrap()[0].kind, "Job");
}

#[test]
fn finished_pods_are_counted_once_through_uncounted_terminated_pods() {
    let j = job(
        json!({"parallelism": 2, "completions": 2}),
        json!({"startTime": Time(at(0))}),
    );
    let spec = Spec::new(&j).unwrap();
    let pods = [
        exited(pod("a", "Succeeded", None), 0, 10),
        pod("b", "Running", None),
    ];
    let (manage, mut sync) = run(&spec, &pods, at(20));
    assert_eq!(
        manage,
        Manage::None,
        "one succeeded, one running: none missing"
    );
    sync.managed(&manage, Managed::default(), at(20));
    let track = sync.track(at(20));
    assert!(track.flush);
    let uncounted = track.status.uncounted_terminated_pods.clone().unwrap();
    assert_eq!(uncounted.succeeded, Some(vec!["uid-a".to_owned()]));
    assert_eq!(track.remove_finalizers.len(), 1);
    // The first write returned this status; the finalizer of `a` then went.
    let written = track.status.clone();
    let finish = track.finish(written, &["uid-a".to_owned()].into(), false, at(20));
    let status = finish.status.expect("uncounted moved to the counter");
    assert_eq!(status.succeeded, Some(1));
    assert_eq!(
        status.uncounted_terminated_pods.as_ref().unwrap().succeeded,
        None
    );
    assert!(!finish.finished);

    // The next reconcile sees `a` without its finalizer: not counted again.
    let mut j2 = j.clone();
    j2.status = Some(status);
    let spec = Spec::new(&j2).unwrap();
    let pods = [
        without_finalizer(exited(pod("a", "Succeeded", None), 0, 10)),
        exited(pod("b", "Succeeded", None), 0, 30),
    ];
    let (manage, mut sync) = run(&spec, &pods, at(40));
    assert_eq!(manage, Manage::None);
    sync.managed(&manage, Managed::default(), at(40));
    let track = sync.track(at(40));
    let written = track.status.clone();
    let finish = track.finish(written, &["uid-b".to_owned()].into(), false, at(40));
    assert!(finish.finished);
    let status = finish.status.unwrap();
    assert_eq!(status.succeeded, Some(2));
    assert_eq!(
        condition_of(&status, SUCCESS_CRITERIA_MET)
            .unwrap()
            .reason
            .as_deref(),
        Some(reason::COMPLETIONS_REACHED)
    );
    assert_eq!(condition_of(&status, COMPLETE).unwrap().status, "True");
    assert_eq!(status.completion_time, Some(Time(at(40))));
    assert!(finish.events.iter().any(|e| e.reason == "Completed"));
}

#[test]
fn a_reconcile_cut_short_after_the_first_write_counts_nothing_twice() {
    // The UID is already uncounted and the Pod still has its finalizer: the previous
    // reconcile wrote the status but did not remove the finalizer.
    let j = job(
        json!({"completions": 1}),
        json!({"startTime": Time(at(0)), "uncountedTerminatedPods": {"succeeded": ["uid-a"]}}),
    );
    let spec = Spec::new(&j).unwrap();
    let pods = [exited(pod("a", "Succeeded", None), 0, 10)];
    let (manage, mut sync) = run(&spec, &pods, at(20));
    assert_eq!(manage, Manage::None);
    sync.managed(&manage, Managed::default(), at(20));
    let track = sync.track(at(20));
    let uncounted = track.status.uncounted_terminated_pods.clone().unwrap();
    assert_eq!(
        uncounted.succeeded,
        Some(vec!["uid-a".to_owned()]),
        "not added twice"
    );
    let written = track.status.clone();
    let finish = track.finish(written, &["uid-a".to_owned()].into(), false, at(20));
    assert_eq!(finish.status.unwrap().succeeded, Some(1));
}

#[test]
fn past_the_backoff_limit_the_job_fails_once_its_pods_are_gone() {
    let j = job(
        json!({"backoffLimit": 1, "completions": 3}),
        json!({"startTime": Time(at(0)), "failed": 1}),
    );
    let spec = Spec::new(&j).unwrap();
    let pods = [
        exited(pod("f", "Failed", None), 1, 10),
        pod("r", "Running", None),
    ];
    let (manage, mut sync) = run(&spec, &pods, at(20));
    let Manage::Delete {
        pods: delete,
        remove_finalizer,
    } = &manage
    else {
        panic!("{manage:?}");
    };
    assert_eq!((delete.len(), *remove_finalizer), (1, false));
    sync.managed(
        &manage,
        Managed {
            deleted: 1,
            ..Managed::default()
        },
        at(20),
    );
    let track = sync.track(at(20));
    let target = condition_of(&track.status, FAILURE_TARGET).unwrap();
    assert_eq!(
        target.reason.as_deref(),
        Some(reason::BACKOFF_LIMIT_EXCEEDED)
    );
    let written = track.status.clone();
    // Both finalizers go: the failed Pod's and the deleted active Pod's (counted as failed).
    let removed: BTreeSet<String> = ["uid-f".to_owned(), "uid-r".to_owned()].into();
    assert_eq!(track.remove_finalizers.len(), 2);
    let finish = track.finish(written, &removed, false, at(20));
    assert!(!finish.finished, "the deleted Pod is still terminating");

    // Next time, the Pod is gone: the kept FailureTarget becomes Failed.
    let mut j2 = j.clone();
    j2.status = finish.status;
    let spec = Spec::new(&j2).unwrap();
    let (manage, mut sync) = run(&spec, &[], at(30));
    assert_eq!(
        manage,
        Manage::Delete {
            pods: vec![],
            remove_finalizer: false
        }
    );
    sync.managed(&manage, Managed::default(), at(30));
    let track = sync.track(at(30));
    let written = track.status.clone();
    let finish = track.finish(written, &BTreeSet::new(), false, at(30));
    assert!(finish.finished);
    let status = finish.status.unwrap();
    assert_eq!(status.failed, Some(3));
    assert_eq!(
        condition_of(&status, FAILED).unwrap().reason.as_deref(),
        Some(reason::BACKOFF_LIMIT_EXCEEDED)
    );
    assert_eq!(status.completion_time, None);
    assert!(
        finish
            .events
            .iter()
            .any(|e| e.warning && e.reason == reason::BACKOFF_LIMIT_EXCEEDED)
    );
}

#[test]
fn a_failed_pod_is_replaced_after_its_backoff() {
    let j = job(json!({"completions": 1}), json!({"startTime": Time(at(0))}));
    let spec = Spec::new(&j).unwrap();
    let pods = [exited(pod("f", "Failed", None), 1, 100)];
    let (manage, sync) = run(&spec, &pods, at(104));
    assert_eq!(manage, Manage::Wait(Duration::from_secs(6)));
    assert_eq!(sync.requeue_after, Some(Duration::from_secs(6)));
    let (manage, _) = run(&spec, &pods, at(111));
    assert_eq!(manage, Manage::Create(vec![None]));
}

#[test]
fn an_indexed_job_creates_its_pending_indexes_and_deletes_duplicates() {
    let j = job(
        json!({"completionMode": "Indexed", "completions": 5, "parallelism": 3}),
        json!({"startTime": Time(at(0)), "completedIndexes": "0", "succeeded": 1}),
    );
    let spec = Spec::new(&j).unwrap();
    let pods = [pod("p2", "Running", Some(2))];
    let (manage, _) = run(&spec, &pods, at(10));
    assert_eq!(manage, Manage::Create(vec![Some(1), Some(3)]));

    let new = pod_from_template(&spec, Some(3), None);
    assert_eq!(new.metadata.generate_name.as_deref(), Some("work-3-"));
    assert_eq!(new.metadata.labels.as_ref().unwrap()[COMPLETION_INDEX], "3");
    assert_eq!(
        new.metadata.annotations.as_ref().unwrap()[COMPLETION_INDEX],
        "3"
    );
    let pod_spec = new.spec.unwrap();
    assert_eq!(pod_spec.hostname.as_deref(), Some("work-3"));
    let env = pod_spec.containers[0].env.as_ref().unwrap();
    assert_eq!(env[0].name, COMPLETION_INDEX_ENV);

    let pods = [
        pod("a", "Running", Some(2)),
        pod("b", "Running", Some(2)),
        pod("c", "Running", Some(9)),
        pod("d", "Running", Some(1)),
    ];
    let (manage, _) = run(&spec, &pods, at(10));
    let Manage::Delete {
        pods: delete,
        remove_finalizer: true,
    } = manage
    else {
        panic!("{manage:?}");
    };
    let mut names: Vec<&str> = delete
        .iter()
        .map(|p| p.metadata.name.as_deref().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["a", "c"],
        "one of index 2's two, and index 9 past completions"
    );
}

#[test]
fn succeeded_indexes_are_written_as_completed_indexes() {
    let j = job(
        json!({"completionMode": "Indexed", "completions": 3, "parallelism": 3}),
        json!({"startTime": Time(at(0)), "completedIndexes": "0", "succeeded": 1}),
    );
    let spec = Spec::new(&j).unwrap();
    let pods = [
        without_finalizer(exited(pod("p0", "Succeeded", Some(0)), 0, 5)),
        exited(pod("p1", "Succeeded", Some(1)), 0, 6),
        exited(pod("p2", "Succeeded", Some(2)), 0, 7),
    ];
    let (manage, mut sync) = run(&spec, &pods, at(10));
    sync.managed(&manage, Managed::default(), at(10));
    let track = sync.track(at(10));
    assert_eq!(track.status.completed_indexes.as_deref(), Some("0-2"));
    assert_eq!(track.status.succeeded, Some(3));
    let written = track.status.clone();
    let finish = track.finish(
        written,
        &["uid-p1".to_owned(), "uid-p2".to_owned()].into(),
        false,
        at(10),
    );
    assert!(finish.finished);
}

#[test]
fn a_success_policy_completes_an_indexed_job_early() {
    let j = job(
        json!({"completionMode": "Indexed", "completions": 4, "parallelism": 4,
               "successPolicy": {"rules": [{"succeededIndexes": "0"}]}}),
        json!({"startTime": Time(at(0))}),
    );
    let spec = Spec::new(&j).unwrap();
    let pods = [
        exited(pod("p0", "Succeeded", Some(0)), 0, 5),
        pod("p1", "Running", Some(1)),
    ];
    let (manage, mut sync) = run(&spec, &pods, at(10));
    let Manage::Delete {
        pods: delete,
        remove_finalizer: false,
    } = &manage
    else {
        panic!("{manage:?}");
    };
    assert_eq!(delete.len(), 1, "the rest of the active Pods go");
    sync.managed(
        &manage,
        Managed {
            deleted: 1,
            ..Managed::default()
        },
        at(10),
    );
    let track = sync.track(at(10));
    let met = condition_of(&track.status, SUCCESS_CRITERIA_MET).unwrap();
    assert_eq!(met.reason.as_deref(), Some(reason::SUCCESS_POLICY));
    assert_eq!(met.message.as_deref(), Some("Matched rules at index 0"));
}

#[test]
fn backoff_limit_per_index_fails_the_index_and_carries_its_failure_count() {
    let j = job(
        json!({"completionMode": "Indexed", "completions": 2, "parallelism": 2, "backoffLimitPerIndex": 1}),
        json!({"startTime": Time(at(0))}),
    );
    let spec = Spec::new(&j).unwrap();
    let first = exited(pod("p0", "Failed", Some(0)), 1, 100);
    let pods = [first.clone(), pod("p1", "Running", Some(1))];
    // The index's failed Pod keeps its finalizer until its replacement exists.
    let (manage, sync) = run(&spec, &pods, at(111));
    assert_eq!(manage, Manage::Create(vec![Some(0)]));
    let replacement = pod_from_template(&spec, Some(0), sync.replaced(Some(0)));
    assert_eq!(
        replacement.metadata.annotations.as_ref().unwrap()[INDEX_FAILURE_COUNT],
        "1"
    );

    let mut second = exited(pod("p0b", "Failed", Some(0)), 1, 200);
    second
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(INDEX_FAILURE_COUNT.into(), "1".into());
    let pods = [
        without_finalizer(first),
        second,
        pod("p1", "Running", Some(1)),
    ];
    let (manage, mut sync) = run(&spec, &pods, at(210));
    assert_eq!(manage, Manage::None, "index 0 failed: not replaced");
    sync.managed(&manage, Managed::default(), at(210));
    let track = sync.track(at(210));
    assert_eq!(track.status.failed_indexes.as_deref(), Some("0"));
}

#[test]
fn a_fail_job_rule_fails_the_job_with_its_message() {
    let j = job(
        json!({"completions": 2, "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}]}}),
        json!({"startTime": Time(at(0))}),
    );
    let spec = Spec::new(&j).unwrap();
    let pods = [exited(pod("f", "Failed", None), 3, 5)];
    let (manage, mut sync) = run(&spec, &pods, at(10));
    sync.managed(&manage, Managed::default(), at(10));
    let track = sync.track(at(10));
    let target = condition_of(&track.status, FAILURE_TARGET).unwrap();
    assert_eq!(target.reason.as_deref(), Some(reason::POD_FAILURE_POLICY));
    assert!(
        target
            .message
            .as_deref()
            .unwrap()
            .contains("exit code 3 matching FailJob rule at index 0")
    );
    let written = track.status.clone();
    let finish = track.finish(written, &["uid-f".to_owned()].into(), false, at(10));
    assert!(finish.finished);
    assert_eq!(
        condition_of(&finish.status.unwrap(), FAILED)
            .unwrap()
            .reason
            .as_deref(),
        Some(reason::POD_FAILURE_POLICY)
    );
}

#[test]
fn an_ignored_failure_does_not_count_against_the_backoff_limit() {
    let j = job(
        json!({"completions": 1, "backoffLimit": 0, "podFailurePolicy": {"rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}}),
        json!({"startTime": Time(at(0))}),
    );
    let spec = Spec::new(&j).unwrap();
    let mut disrupted = exited(pod("f", "Failed", None), 137, 5);
    disrupted.status.as_mut().unwrap().conditions = Some(vec![
        serde_json::from_value(json!({"type": "DisruptionTarget", "status": "True"})).unwrap(),
    ]);
    let pods = [disrupted];
    let (_, mut sync) = run(&spec, &pods, at(100));
    sync.managed(&Manage::None, Managed::default(), at(100));
    let track = sync.track(at(100));
    assert!(condition_of(&track.status, FAILURE_TARGET).is_none());
    assert_eq!(
        track
            .status
            .uncounted_terminated_pods
            .as_ref()
            .unwrap()
            .failed,
        None
    );
    assert_eq!(
        track.remove_finalizers.len(),
        1,
        "its finalizer goes all the same"
    );
}

#[test]
fn suspending_deletes_the_active_pods_and_resuming_resets_the_start_time() {
    let j = job(
        json!({"suspend": true, "completions": 2}),
        json!({"startTime": Time(at(0)), "active": 1}),
    );
    let spec = Spec::new(&j).unwrap();
    let pods = [pod("r", "Running", None)];
    let (manage, mut sync) = run(&spec, &pods, at(10));
    assert!(matches!(&manage, Manage::Delete { pods, remove_finalizer: true } if pods.len() == 1));
    sync.managed(
        &manage,
        Managed {
            deleted: 1,
            ..Managed::default()
        },
        at(10),
    );
    assert_eq!(
        sync.events,
        vec![Event::normal("Suspended", "Job suspended")]
    );
    let track = sync.track(at(10));
    assert_eq!(
        condition_of(&track.status, SUSPENDED).unwrap().status,
        "True"
    );
    assert_eq!(track.status.active, Some(0));

    let mut resumed = j.clone();
    resumed.spec.as_mut().unwrap().suspend = Some(false);
    resumed.status = Some(track.status);
    let spec = Spec::new(&resumed).unwrap();
    let (manage, mut sync) = run(&spec, &[], at(50));
    assert_eq!(manage, Manage::Create(vec![None]));
    sync.managed(
        &manage,
        Managed {
            created: 1,
            ..Managed::default()
        },
        at(50),
    );
    let track = sync.track(at(50));
    let cond = condition_of(&track.status, SUSPENDED).unwrap();
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_deref()),
        ("False", Some("JobResumed"))
    );
    assert_eq!(track.status.start_time, Some(Time(at(50))));
}

#[test]
fn an_active_deadline_fails_the_job_and_requeues_before() {
    let j = job(
        json!({"activeDeadlineSeconds": 30, "completions": 1}),
        json!({"startTime": Time(at(0))}),
    );
    let spec = Spec::new(&j).unwrap();
    let pods = [pod("r", "Running", None)];
    let (_, sync) = run(&spec, &pods, at(10));
    assert_eq!(sync.requeue_after, Some(Duration::from_secs(20)));
    let (manage, mut sync) = run(&spec, &pods, at(30));
    assert!(matches!(
        manage,
        Manage::Delete {
            remove_finalizer: false,
            ..
        }
    ));
    sync.managed(
        &manage,
        Managed {
            deleted: 1,
            ..Managed::default()
        },
        at(30),
    );
    let track = sync.track(at(30));
    assert_eq!(
        condition_of(&track.status, FAILURE_TARGET)
            .unwrap()
            .reason
            .as_deref(),
        Some(reason::DEADLINE_EXCEEDED)
    );
}

#[test]
fn pod_replacement_policy_failed_waits_for_terminating_pods() {
    let j = job(
        json!({"completions": 2, "parallelism": 2, "podReplacementPolicy": "Failed"}),
        json!({"startTime": Time(at(0))}),
    );
    let spec = Spec::new(&j).unwrap();
    let mut terminating = pod("t", "Running", None);
    terminating.metadata.deletion_timestamp = Some(Time(at(5)));
    let pods = [terminating.clone(), pod("r", "Running", None)];
    let (manage, _) = run(&spec, &pods, at(10));
    assert_eq!(
        manage,
        Manage::None,
        "the terminating Pod is not replaced yet"
    );
    let j = job(
        json!({"completions": 2, "parallelism": 2}),
        json!({"startTime": Time(at(0))}),
    );
    let spec = Spec::new(&j).unwrap();
    let pods = [terminating, pod("r", "Running", None)];
    let (manage, sync) = run(&spec, &pods, at(10));
    assert_eq!(
        sync.failed, 1,
        "TerminatingOrFailed: a deleted Pod counts as failed"
    );
    // Finished when deleted (no container finished, no Ready=False): 5 s ago.
    assert_eq!(
        manage,
        Manage::Wait(Duration::from_secs(5)),
        "and its replacement backs off"
    );
}

#[test]
fn uncounted_pods_are_bounded_per_reconcile() {
    let j = job(
        json!({"completions": 1000, "parallelism": 1}),
        json!({"startTime": Time(at(0))}),
    );
    let spec = Spec::new(&j).unwrap();
    let pods: Vec<Pod> = (0..600)
        .map(|i| exited(pod(&format!("p{i:03}"), "Succeeded", None), 0, 5))
        .collect();
    let (manage, mut sync) = run(&spec, &pods, at(10));
    sync.managed(&manage, Managed::default(), at(10));
    let track = sync.track(at(10));
    let uncounted = track.status.uncounted_terminated_pods.as_ref().unwrap();
    assert_eq!(uncounted.succeeded.as_ref().unwrap().len(), MAX_UNCOUNTED);
    assert_eq!(track.remove_finalizers.len(), MAX_UNCOUNTED);
}

#[test]
fn jobs_managed_elsewhere_and_bad_specs_are_told_apart() {
    let j = job(json!({"managedBy": "example.com/other"}), json!({}));
    assert_eq!(managed_by_other(&j), Some("example.com/other"));
    let j = job(json!({"managedBy": CONTROLLER_NAME}), json!({}));
    assert_eq!(managed_by_other(&j), None);
    let j = job(json!({"completionMode": "Sometimes"}), json!({}));
    assert_eq!(
        Spec::new(&j).unwrap_err(),
        SpecError::UnknownCompletionMode("Sometimes".into())
    );
}

#[test]
fn claim_adopts_matching_orphans_and_releases_what_stopped_matching() {
    let j = job(json!({}), json!({}));
    let spec = Spec::new(&j).unwrap();
    let mut orphan = pod("o", "Succeeded", None);
    orphan.metadata.owner_references = None;
    let mut unmatched = pod("u", "Running", None);
    unmatched.metadata.labels = None;
    let pods = [pod("mine", "Failed", None), orphan, unmatched];
    let claim = claim(&spec, &pods);
    assert_eq!(claim.pods.len(), 1, "finished Pods are claimed too");
    assert_eq!(claim.adopt[0].metadata.name.as_deref(), Some("o"));
    assert_eq!(claim.release[0].metadata.name.as_deref(), Some("u"));
}
