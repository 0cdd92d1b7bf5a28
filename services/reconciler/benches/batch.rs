//! `make bench-batch`: the Job and CronJob controllers under kube-controller-manager and
//! under Switchyard, each run on a fresh control plane (etcd, kube-apiserver,
//! kube-scheduler, kwok with 25 Nodes). Both sides run the same nine controllers (the
//! benchmarks' shared set, `support::Controllers`), with the same client limits per
//! controller.
//!
//! - `batch.jobs_1k_kcm`, `batch.jobs_1k_sy1`, `batch.jobs_1k_sy4` (s): 1,000 Jobs
//!   (`SWITCHYARD_BENCH_JOBS`) of 10 completions, parallelism 5, whose Pods succeed 1 s after
//!   they start (the test cluster's Pod outcomes, `exit 0`): from the first create until
//!   every Job is `Complete`; under kube-controller-manager (its 5 Job workers, the default)
//!   and Switchyard with 1 and 4 reconcilers (10 reconciles at a time each);
//!   `batch.jobs_1k_<side>_writes_per_job` (requests): the controllers' object writes until
//!   then (Pods created, patched and deleted, Job status), as the apiserver counts them
//!   (2xx), per Job; `batch.jobs_1k_<side>_event_writes_per_job`, their Events';
//! - `batch.jobs_slow50_sy1`, `batch.jobs_slow50_sy4` (s): 500 such Jobs
//!   (`SWITCHYARD_BENCH_SLOW_JOBS`) with every reconcile waiting 50 ms first and one
//!   reconcile at a time per replica, so that replicas and not the control plane bound it;
//!   `batch.jobs_sy4_vs_sy1_slow50` is the speed-up of 4 over 1, `batch.jobs_sy1_vs_kcm` the
//!   time against kube-controller-manager;
//! - `batch.cron_1k_lag_p99_kcm`, `batch.cron_1k_lag_p99_sy1` (ms): 1,000 CronJobs
//!   (`SWITCHYARD_BENCH_CRONJOBS`) of schedule `* * * * *`, created before a minute
//!   begins: the 99th percentile, over every CronJob, of the time from that minute to this
//!   process's watch seeing its Job (the watch's delay is the same on both sides);
//!   `_p50` and `_max` beside it. A CronJob whose Job is not seen within 120 s fails the
//!   run. The Jobs are created suspended, so no Pod runs meanwhile.
//!
//! Each subject runs once per round, the order reversed every other round
//! (`SWITCHYARD_BENCH_ROUNDS`, 2 by default); each figure is the median.
//! `SWITCHYARD_BENCH_RUNS=jobs_1k_sy1,cron_1k_lag_p99_kcm` runs only the named subjects.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use switchyard_k8s::{
    Api,
    k8s_openapi::{
        api::batch::v1::{CronJob, Job},
        jiff::Timestamp,
    },
    kube::api::ListParams,
    watcher,
};

use switchyard_reconciler_core::cronjob::SCHEDULED_TIMESTAMP;

use crate::support::{
    Controllers, Request, Under, apiserver_requests, between, create_all, env_count,
    plane_with_namespace, print_ratios, requests_by_name,
};

const NODES: usize = 25;
const NAMESPACE: &str = "bench";
const COMPLETE_TIMEOUT: Duration = Duration::from_secs(1800);
/// How long after the minute every CronJob's Job must be seen.
const CRON_TIMEOUT: Duration = Duration::from_secs(120);
/// How long after the Jobs complete the Events are counted (both write them behind).
const EVENTS_SETTLE: Duration = Duration::from_secs(15);

fn job(name: &str) -> Job {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "completions": 10,
            "parallelism": 5,
            "backoffLimit": 6,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "work", "image": "registry.example/work:1",
                                "command": ["sh", "-c", "exit 0"]}],
            }},
        },
    }))
    .unwrap()
}

fn cronjob(name: &str) -> CronJob {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "schedule": "* * * * *",
            "jobTemplate": {"spec": {
                "suspend": true,
                "template": {"spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "work", "image": "registry.example/work:1"}],
                }},
            }},
        },
    }))
    .unwrap()
}

fn complete(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Complete" && c.status == "True")
        })
}

/// A write of the Job controller's: Pods created, patched (owner references, the tracking
/// finalizer) and deleted, the Job's status and Events; not the benchmark's creates, the
/// scheduler's bindings or kwok's Pod status.
fn job_controller_write(r: &Request) -> bool {
    matches!(r.verb.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
        && r.code.starts_with('2')
        && matches!(
            (r.resource.as_str(), r.subresource.as_str()),
            ("pods" | "events", "") | ("jobs", "status")
        )
}

/// Seconds from the first create until every Job is Complete.
async fn jobs(name: &str, under: Under, count: usize) -> f64 {
    let (plane, client) = plane_with_namespace(NODES, NAMESPACE).await;
    let controllers = Controllers::start(&plane, under).await;
    let api: Api<Job> = Api::namespaced(client.clone(), NAMESPACE);
    let before = apiserver_requests(&client).await;
    let start = Instant::now();
    create_all(&api, count, |i| job(&format!("j{i:04}"))).await;
    loop {
        let list = api.list(&ListParams::default()).await.unwrap();
        let done = list.items.iter().filter(|j| complete(j)).count();
        if done == count {
            break;
        }
        assert!(
            start.elapsed() < COMPLETE_TIMEOUT,
            "{under:?}: {done} of {count} Jobs Complete after {COMPLETE_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let took = start.elapsed().as_secs_f64();
    eprintln!("{name}: {count} Jobs Complete after {took:.1} s");
    let writes = requests_by_name(
        &between(&before, &apiserver_requests(&client).await),
        job_controller_write,
    );
    eprintln!("{name}: writes until complete: {writes:?}");
    let objects: f64 = writes
        .iter()
        .filter(|(k, _)| !k.starts_with("events"))
        .map(|(_, v)| v)
        .sum();
    let per_job = |n: f64| n / count as f64;
    println!(
        "bench batch.{name}_writes_per_job {:.1} requests",
        per_job(objects)
    );
    tokio::time::sleep(EVENTS_SETTLE).await;
    let events: f64 = requests_by_name(
        &between(&before, &apiserver_requests(&client).await),
        job_controller_write,
    )
    .iter()
    .filter(|(k, _)| k.starts_with("events"))
    .map(|(_, v)| v)
    .sum();
    println!(
        "bench batch.{name}_event_writes_per_job {:.1} requests",
        per_job(events)
    );
    controllers.stop().await;
    plane.stop();
    took
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The p99 in milliseconds, over every CronJob, from the minute its Job was due to this
/// process's watch seeing the Job.
async fn cron_lag(name: &str, under: Under, count: usize) -> f64 {
    let (plane, client) = plane_with_namespace(NODES, NAMESPACE).await;
    let controllers = Controllers::start(&plane, under).await;
    // Created within the first 20 s of a minute, so every CronJob is in place before the next.
    let second = Timestamp::now().as_second().rem_euclid(60);
    if second > 20 {
        tokio::time::sleep(Duration::from_secs((61 - second) as u64)).await;
    }
    let api: Api<CronJob> = Api::namespaced(client.clone(), NAMESPACE);
    let jobs: Api<Job> = Api::namespaced(client.clone(), NAMESPACE);
    let seen: Arc<Mutex<BTreeMap<String, f64>>> = Arc::default();
    let watch = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut events = watcher(jobs, watcher::Config::default()).boxed();
            while let Ok(Some(event)) = events.try_next().await {
                let (watcher::Event::Apply(job) | watcher::Event::InitApply(job)) = event else {
                    continue;
                };
                let Some(due) = job
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(SCHEDULED_TIMESTAMP))
                    .and_then(|t| t.parse::<Timestamp>().ok())
                else {
                    continue;
                };
                let now = Timestamp::try_from(SystemTime::now()).unwrap();
                let lag = now.duration_since(due).as_secs_f64() * 1000.0;
                let owner = job.metadata.owner_references.iter().flatten().next();
                if let Some(owner) = owner {
                    seen.lock()
                        .unwrap()
                        .entry(owner.name.clone())
                        .or_insert(lag);
                }
            }
        })
    };
    create_all(&api, count, |i| cronjob(&format!("c{i:04}"))).await;
    let created = Timestamp::now();
    let minute = created.as_second() - created.as_second().rem_euclid(60) + 60;
    eprintln!(
        "{name}: {count} CronJobs created {} s before the minute",
        minute - created.as_second()
    );
    let deadline = Instant::now()
        + Duration::from_secs((minute - created.as_second()).max(0) as u64)
        + CRON_TIMEOUT;
    loop {
        let n = seen.lock().unwrap().len();
        if n == count {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{under:?}: {n} of {count} CronJobs' Jobs seen within {CRON_TIMEOUT:?} of the minute"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    watch.abort();
    let mut lags: Vec<f64> = seen.lock().unwrap().values().copied().collect();
    lags.sort_by(f64::total_cmp);
    let (p50, p99, max) = (
        percentile(&lags, 50.0),
        percentile(&lags, 99.0),
        lags[lags.len() - 1],
    );
    let side = name.trim_start_matches("cron_1k_lag_p99_");
    println!("bench batch.cron_1k_lag_p50_{side} {p50:.0} ms");
    println!("bench batch.cron_1k_lag_max_{side} {max:.0} ms");
    controllers.stop().await;
    plane.stop();
    p99
}

const JOB_RUNS: [(&str, Under); 5] = [
    ("jobs_1k_kcm", Under::KCM),
    ("jobs_1k_sy1", Under::switchyard(1, 0)),
    ("jobs_1k_sy4", Under::switchyard(4, 0)),
    ("jobs_slow50_sy1", Under::switchyard(1, 50)),
    ("jobs_slow50_sy4", Under::switchyard(4, 50)),
];

const CRON_RUNS: [(&str, Under); 2] = [
    ("cron_1k_lag_p99_kcm", Under::KCM),
    ("cron_1k_lag_p99_sy1", Under::switchyard(1, 0)),
];

const RATIOS: [(&str, &str, &str); 3] = [
    ("jobs_sy1_vs_kcm", "jobs_1k_sy1", "jobs_1k_kcm"),
    ("jobs_sy4_vs_kcm", "jobs_1k_sy4", "jobs_1k_kcm"),
    (
        "jobs_sy4_vs_sy1_slow50",
        "jobs_slow50_sy1",
        "jobs_slow50_sy4",
    ),
];

async fn run() {
    let (full, slow, cron) = (
        env_count("SWITCHYARD_BENCH_JOBS", 1000),
        env_count("SWITCHYARD_BENCH_SLOW_JOBS", 500),
        env_count("SWITCHYARD_BENCH_CRONJOBS", 1000),
    );
    eprintln!("{full} Jobs, {slow} slowed Jobs, {cron} CronJobs per run");
    let took = switchyard_testenv::compare("batch", &JOB_RUNS, "s", |name, under| {
        let n = if name.starts_with("jobs_slow50") {
            slow
        } else {
            full
        };
        jobs(name, under, n)
    })
    .await;
    for (name, seconds) in &took {
        println!("bench batch.{name} {seconds:.1} s");
    }
    print_ratios("batch", &took, &RATIOS);
    let lag = switchyard_testenv::compare("batch", &CRON_RUNS, "ms", |name, under| {
        cron_lag(name, under, cron)
    })
    .await;
    for (name, ms) in &lag {
        println!("bench batch.{name} {ms:.0} ms");
    }
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run());
}
