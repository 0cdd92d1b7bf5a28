//! CronJobs due while a queue replica is killed: between runs a CronJob is a delayed key in
//! the queue, and the replica that holds it dies 2 s before the minute it is due. Two queue
//! replicas share 16 shards through the elector; the watcher resyncs the shards the dead one
//! held to the other, which keys their CronJobs again.
//!
//! - 12 CronJobs `* * * * *` under `Allow`, `startingDeadlineSeconds: 30`: each starts its
//!   Job for that minute, within the deadline (no `MissSchedule`), once;
//! - 12 under `Forbid`, each with a Job of its own still active (in its status): none starts
//!   another.
//!
//! No Job controller runs: a Job stays as created, and an active one stays active.

#![allow(clippy::unwrap_used)]

use std::{collections::BTreeMap, time::Duration};

use serde_json::json;
use switchyard_k8s::{
    Api, PostParams,
    k8s_openapi::{
        api::batch::v1::{CronJob, Job},
        jiff::Timestamp,
    },
    kube::api::{ListParams, Patch, PatchParams},
};
use switchyard_testenv::{ControlPlane, Etcd, ServiceProcess, TestNamespace};
use switchyard_tests::{fleet::Spec, service_binary};

const SHARDS: u32 = 16;
const EACH: usize = 12;
const DEADLINE: i64 = 30;
const SCHEDULED: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";

fn cronjob(name: &str, policy: &str) -> CronJob {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "schedule": "* * * * *",
            "concurrencyPolicy": policy,
            "startingDeadlineSeconds": DEADLINE,
            "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "registry.example/c:1"}],
            }}}},
        },
    }))
    .unwrap()
}

/// A Job the CronJob `owner` controls, and that its status lists as active.
async fn active_job(cronjobs: &Api<CronJob>, jobs: &Api<Job>, owner: &CronJob) {
    let name = format!("{}-running", owner.metadata.name.as_deref().unwrap());
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": name, "ownerReferences": [{
            "apiVersion": "batch/v1", "kind": "CronJob", "controller": true,
            "name": owner.metadata.name, "uid": owner.metadata.uid,
        }]},
        "spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "registry.example/c:1"}],
        }}},
    }))
    .unwrap();
    let job = jobs.create(&PostParams::default(), &job).await.unwrap();
    let status = json!({"status": {"active": [{
        "apiVersion": "batch/v1", "kind": "Job", "namespace": job.metadata.namespace,
        "name": job.metadata.name, "uid": job.metadata.uid,
    }]}});
    cronjobs
        .patch_status(
            owner.metadata.name.as_deref().unwrap(),
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .unwrap();
}

fn second_of_minute() -> i64 {
    Timestamp::now().as_second().rem_euclid(60)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cronjob_misses_its_minute_or_runs_twice_when_a_queue_replica_dies() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "cron-failover")
        .await
        .unwrap();
    let etcd = Etcd::start().await.unwrap();
    let config = plane.dir().join(format!("watcher-{}.yaml", ns.name()));
    switchyard_tests::write_watcher_config(&config, SHARDS, &[ns.name()]);
    let etcd_env = vec![(
        "SWITCHYARD_ETCD_ENDPOINTS".to_owned(),
        etcd.endpoint().to_owned(),
    )];
    let shards = format!("--shard-count={SHARDS}");
    let mut elector = Spec::new(
        "elector",
        service_binary("switchyard-elector"),
        vec![shards.clone()],
    );
    elector.envs = etcd_env.clone();
    let elector = elector.start().await;
    let elector_addr = format!("--elector-addr={}", elector.grpc_addr());
    let mut queues: Vec<ServiceProcess> = Vec::new();
    for i in 0..2 {
        let mut queue = Spec::new(
            format!("queue-{i}"),
            service_binary("switchyard-queue"),
            vec![
                format!("--member-id=q{i}"),
                shards.clone(),
                elector_addr.clone(),
            ],
        );
        queue.envs = etcd_env.clone();
        queues.push(queue.start().await);
    }
    let kubeconfig = format!("--kubeconfig={}", plane.kubeconfig().display());
    let watcher = Spec::new(
        "watcher",
        service_binary("switchyard-watcher"),
        vec![
            kubeconfig.clone(),
            format!("--config={}", config.display()),
            elector_addr.clone(),
        ],
    )
    .start()
    .await;
    let reconciler = Spec::new(
        "reconciler",
        service_binary("switchyard-reconciler"),
        vec![
            kubeconfig,
            elector_addr,
            shards,
            format!("--watcher-addr={}", watcher.grpc_addr()),
            "--controllers=batch/v1/CronJob".to_owned(),
        ],
    )
    .start()
    .await;

    // Everything in place well before the minute the replica dies at.
    if second_of_minute() > 40 {
        tokio::time::sleep(Duration::from_secs((61 - second_of_minute()) as u64)).await;
    }
    let cronjobs: Api<CronJob> = Api::namespaced(client.clone(), ns.name());
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns.name());
    for i in 0..EACH {
        cronjobs
            .create(
                &PostParams::default(),
                &cronjob(&format!("allow-{i:02}"), "Allow"),
            )
            .await
            .unwrap();
        let forbid = cronjobs
            .create(
                &PostParams::default(),
                &cronjob(&format!("forbid-{i:02}"), "Forbid"),
            )
            .await
            .unwrap();
        active_job(&cronjobs, &jobs, &forbid).await;
    }
    let now = Timestamp::now().as_second();
    let minute = now - now.rem_euclid(60) + 60;
    println!(
        "{} CronJobs in place, {} s before the minute",
        2 * EACH,
        minute - now
    );

    tokio::time::sleep(Duration::from_secs((minute - now - 2) as u64)).await;
    let killed = queues.remove(1);
    let killed_log = killed.kill();
    println!("queue-1 killed 2 s before the minute");

    // Every Allow CronJob's Job for the minute, or the deadline passed.
    let mut started: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    loop {
        started.clear();
        for job in jobs.list(&ListParams::default()).await.unwrap() {
            let Some(owner) = job
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
            else {
                continue;
            };
            let Some(due) = job
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(SCHEDULED))
                .and_then(|t| t.parse::<Timestamp>().ok())
            else {
                continue;
            };
            let created = job.metadata.creation_timestamp.as_ref().unwrap().0;
            started
                .entry(owner.name.clone())
                .or_default()
                .push((due.as_second(), created.as_second() - due.as_second()));
        }
        let allowed = started.keys().filter(|k| k.starts_with("allow")).count();
        if allowed == EACH || Timestamp::now().as_second() > minute + DEADLINE + 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Late starts of the Forbid ones would come with the Allow ones; give them a moment.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let late: Vec<String> = started
        .iter()
        .filter(|(_, runs)| runs.iter().any(|(_, lag)| *lag > DEADLINE))
        .map(|(name, runs)| format!("{name}: {runs:?}"))
        .collect();
    println!("started (scheduled second, seconds late): {started:?}");

    let unclean: Vec<String> = {
        let mut unclean = Vec::new();
        for (name, process) in [("reconciler", reconciler), ("watcher", watcher)]
            .into_iter()
            .chain(queues.into_iter().map(|q| ("queue-0", q)))
            .chain([("elector", elector)])
        {
            let (status, log) = process.terminate().await.unwrap();
            if !status.success() {
                unclean.push(format!("{name}: {status}\n{log}"));
            }
        }
        unclean
    };
    let missing: Vec<String> = (0..EACH)
        .map(|i| format!("allow-{i:02}"))
        .filter(|name| {
            started
                .get(name)
                .is_none_or(|runs| runs.len() != 1 || runs[0].0 != minute)
        })
        .collect();
    if !missing.is_empty() {
        println!("the killed queue's log:\n{killed_log}");
    }
    assert!(
        missing.is_empty(),
        "Allow CronJobs without exactly one Job for the minute: {missing:?}"
    );
    assert!(late.is_empty(), "started past the deadline: {late:?}");
    let forbidden: Vec<&String> = started.keys().filter(|k| k.starts_with("forbid")).collect();
    assert!(
        forbidden.is_empty(),
        "Forbid CronJobs started a second Job: {forbidden:?}"
    );
    assert!(unclean.is_empty(), "{}", unclean.join("\n"));
}
