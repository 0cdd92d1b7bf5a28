//! `make bench-e2e`: Deployments converged end to end, under kube-controller-manager and under
//! Switchyard, each run on a fresh control plane (etcd, kube-apiserver, kube-scheduler, kwok
//! with 10 Nodes).
//!
//! A run creates 500 Deployments of 4 replicas (2,000 Pods; `SWITCHYARD_BENCH_DEPLOYMENTS`
//! changes the count) and measures from the first create until every Deployment is Available
//! with all its replicas updated and available. Both sides run the same nine controllers:
//! Deployment, ReplicaSet, the garbage collector (with its graph of every deletable resource),
//! Namespace, ServiceAccount, Job, TTL-after-finished, CronJob and the pod garbage collector
//! (the last four idle here, but the Job controller watches every Pod on both sides, and the
//! pod garbage collector sweeps them every 20 s). Each
//! subject runs once per round, the order reversed every other round
//! (`SWITCHYARD_BENCH_ROUNDS`, 2 by default); each figure is the median. Every controller
//! process gets the same client limits (`--kube-api-qps=100
//! --kube-api-burst=200`), which apply per controller on both sides: kube-controller-manager
//! builds a clientset, and so a limiter, for each controller (also with
//! `--use-service-account-credentials=false`, which it runs with here), as a reconciler
//! builds a client for each of its controllers.
//!
//! - `e2e.kcm_converge` (s): kube-controller-manager with those nine controllers (5 workers
//!   each for Deployments and ReplicaSets, its defaults);
//! - `e2e.sy1_converge`, `e2e.sy2_converge`, `e2e.sy4_converge` (s): Switchyard with 1, 2 and
//!   4 reconciler processes (a queue and a watcher in this process), in plaintext
//!   (`--insecure-plaintext`) so that they compare with the figures measured before mutual TLS;
//! - `e2e.sy4_converge_shared_limits` (s): 4 reconcilers sharing one process's client limits
//!   (25 requests/s and a burst of 50 each per controller), so that together they may write
//!   no faster than one: what separates its writes from `sy4_converge`'s is the speed the
//!   extra limits allow, not the number of replicas;
//! - `e2e.sy1_converge_concurrency40` (s): 1 reconciler running 40 reconciles at a time, as
//!   many as `sy4_converge`'s four together: what separates its writes from `sy4_converge`'s
//!   is the number of replicas, not the reconciles in flight;
//! - `e2e.sy1_converge_mtls` (s): `sy1_converge` with mutual TLS between the services, the
//!   shipped default, run right after it; `e2e.sy1_mtls_vs_plaintext` is the ratio of the two;
//! - `e2e.sy1_converge_slow`, `e2e.sy4_converge_slow` (s): the same with every reconcile
//!   waiting 20 ms first, as if it called an external system (`--simulated-latency`), and one
//!   reconcile at a time per replica (`--concurrency=1`);
//! - `e2e.sy1_converge_slow50`, `e2e.sy4_converge_slow50` (s): the same at 50 ms, where one
//!   replica's time stays above the control plane's floor even divided by four;
//! - `e2e.sy1_vs_kcm`, `e2e.sy4_vs_sy1_slow` and `e2e.sy4_vs_sy1_slow50` (ratios): time against
//!   kube-controller-manager, and the speed-up of 4 reconcilers over 1 with slow reconciles.
//!
//! - `e2e.<run>_object_writes` (requests): the controllers' writes until convergence, as the
//!   apiserver counts them (`apiserver_request_total`, 2xx): Pods, ReplicaSets and their
//!   status, Deployment updates and status, not the benchmark's own creates, the scheduler's
//!   bindings or kwok's Pod status; `e2e.<run>_event_writes`, their Event writes once settled.
//!   The breakdown by resource and verb goes to stderr. `e2e.<run>_object_write_requests`
//!   (requests): the same writes whatever the apiserver answered, those it refused (409
//!   Conflict, other errors) included.
//! - `e2e.<run>_controllers_cpu` (s): CPU time used until convergence by the controller
//!   processes (kube-controller-manager, or the reconcilers) and by this process, which holds
//!   the benchmark's client in every run and Switchyard's queue and watcher in Switchyard's;
//!   `e2e.<run>_plane_cpu` (s): by the control plane (etcd, kube-apiserver, kube-scheduler,
//!   kwok). On this 2-core machine the two share 2 CPU-seconds per second.
//!   `e2e.<run>_bench_process_cpu` (s) is this process's part of the first.
//! - `e2e.<run>_conflicts` (requests): the controllers' writes the apiserver refused with 409
//!   Conflict until convergence (each is a reconcile that acted on an older object and runs
//!   again); `e2e.<run>_queue_adds` (keys): keys added to the Deployment and ReplicaSet
//!   controllers' work queues until convergence (`workqueue_adds_total`). client-go counts
//!   an add unless the key is already waiting, and each such add is one sync later, so for
//!   kube-controller-manager it is its number of syncs; Switchyard's queue also merges an add
//!   into a key being reconciled, so its count is lower than its reconciles.
//!   `e2e.<run>_reconciles` (Switchyard only): reconciles the reconcilers finished. The adds,
//!   retries and reconciles by controller and the apiserver's reads by resource go to stderr.
//! - On stderr too, what the status writes were: the statuses each ReplicaSet and Deployment
//!   went through as a watch saw them (how many, the commonest sequences, and the time from
//!   the first written to the last), and the time from a ReplicaSet's first Pod to its last
//!   to be seen created, bound to a Node and Ready. A status with intermediate ready counts (`4/1/1 > 4/3/3 > 4/4/4`) is one
//!   write per count.
//!
//! `SWITCHYARD_BENCH_RUNS=sy1_converge,kcm_converge` runs only the named measurements;
//! `SWITCHYARD_BENCH_WATCHER_CONFIG=<file>` runs the watcher with that configuration instead
//! of the shipped one (deploy/kustomize/base/watcher-config.yaml).

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use futures::StreamExt;
use switchyard_k8s::{
    Api, Deployment, Pod, ReplicaSet, k8s_openapi::api::core::v1::Event, kube::api::ListParams,
    watcher,
};
use switchyard_testenv::manifests;

use crate::support::{
    Controllers, Request, Under, apiserver_requests, between, controller_writes, cpu_of,
    create_all, plane_with_namespace, print_ratios, requests_by_name,
};

const REPLICAS: i32 = 4;
const NODES: usize = 10;
const NAMESPACE: &str = "bench";
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(900);
/// How long after convergence the Events are counted: both controllers write them in the
/// background, kube-controller-manager's a few seconds behind.
const EVENTS_SETTLE: Duration = Duration::from_secs(15);

fn deployments() -> usize {
    std::env::var("SWITCHYARD_BENCH_DEPLOYMENTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(500)
}

fn deployment(name: &str) -> Deployment {
    manifests::deployment(name, REPLICAS, serde_json::Value::Null)
}

fn available(deployment: &Deployment) -> bool {
    let Some(status) = &deployment.status else {
        return false;
    };
    status.observed_generation >= deployment.metadata.generation
        && status.updated_replicas == Some(REPLICAS)
        && status.available_replicas == Some(REPLICAS)
        && status.replicas == Some(REPLICAS)
}

/// The statuses each ReplicaSet and Deployment of the namespace went through, as a watch sees
/// them: what tells a write that carried a real intermediate count from one that repeated a
/// status. A status is `replicas/ready/available` (and `updated` for a Deployment) with its
/// observed generation.
#[derive(Default)]
struct Statuses {
    by_object: BTreeMap<String, Vec<(String, Instant)>>,
}

impl Statuses {
    fn record(&mut self, object: String, status: String) {
        let seen = self.by_object.entry(object).or_default();
        if seen.last().map(|(s, _)| s) != Some(&status) {
            seen.push((status, Instant::now()));
        }
    }

    /// On stderr: how many objects went through how many statuses, the commonest sequences,
    /// and the time from each object's second status (its first written) to its last.
    fn report(&self, under: &Under, kind: &str) {
        let mut counts = BTreeMap::<usize, usize>::new();
        let mut sequences = BTreeMap::<String, usize>::new();
        let mut spans = Vec::new();
        for seen in self.by_object.values() {
            *counts.entry(seen.len()).or_default() += 1;
            let sequence: Vec<_> = seen.iter().map(|(s, _)| s.as_str()).collect();
            *sequences.entry(sequence.join(" > ")).or_default() += 1;
            if let (Some((_, first)), Some((_, last))) = (seen.get(1), seen.last()) {
                spans.push(last.duration_since(*first).as_millis());
            }
        }
        let mut common: Vec<_> = sequences.into_iter().collect();
        common.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        eprintln!(
            "{under:?}: {kind} statuses per object: {counts:?}; first written to last, ms: {}",
            spread(spans)
        );
        for (sequence, n) in common.iter().take(8) {
            eprintln!("{under:?}:   {n:5} x {sequence}");
        }
    }
}

fn replica_set_status(rs: &ReplicaSet) -> Option<(String, String)> {
    let name = rs.metadata.name.clone()?;
    let status = rs.status.as_ref().map_or_else(String::new, |s| {
        format!(
            "g{} {}/{}/{}",
            s.observed_generation.unwrap_or(0),
            s.replicas,
            s.ready_replicas.unwrap_or(0),
            s.available_replicas.unwrap_or(0)
        )
    });
    Some((name, status))
}

/// How far a Pod got, in order ([`pod_readiness`]).
const POD_STAGES: [&str; 3] = ["created", "scheduled", "ready"];

/// A Pod, keyed `<owner> <name>` by its first owner, and how far it got: `created` (not
/// bound to a Node), `scheduled` (bound, not Ready) or `ready`.
fn pod_readiness(pod: &Pod) -> Option<(String, String)> {
    let owner = pod
        .metadata
        .owner_references
        .as_ref()?
        .first()?
        .name
        .clone();
    let stage = if switchyard_reconciler_core::replicaset::is_ready(pod) {
        "ready"
    } else if pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some()
    {
        "scheduled"
    } else {
        "created"
    };
    let name = pod.metadata.name.clone()?;
    Some((format!("{owner} {name}"), stage.to_owned()))
}

/// Per ReplicaSet, the time from its first Pod to its last to be seen created, bound to a
/// Node and Ready: where the Pods of one ReplicaSet drift apart on their way.
fn report_readiness(under: &Under, pods: &Statuses) {
    let rank = |s: &str| POD_STAGES.iter().position(|r| *r == s);
    for stage in POD_STAGES {
        let mut by_owner = BTreeMap::<&str, (Instant, Instant)>::new();
        for (key, seen) in &pods.by_object {
            let owner = key.split(' ').next().unwrap_or_default();
            // A stage skipped between two events (bound and Ready at once) counts as reached
            // with the next one seen.
            let reached = seen.iter().find(|(s, _)| rank(s) >= rank(stage));
            if let Some((_, at)) = reached {
                let span = by_owner.entry(owner).or_insert((*at, *at));
                span.0 = span.0.min(*at);
                span.1 = span.1.max(*at);
            }
        }
        let spans: Vec<_> = by_owner
            .values()
            .map(|(a, b)| b.duration_since(*a).as_millis())
            .collect();
        eprintln!(
            "{under:?}: a ReplicaSet's first Pod {stage} to its last, ms: {1} (of {0})",
            spans.len(),
            spread(spans)
        );
    }
}

/// `p10 .. p50 .. p90 .. max ..` of `spans`.
fn spread(mut spans: Vec<u128>) -> String {
    spans.sort_unstable();
    let at = |q: f64| {
        spans
            .get(((spans.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0)
    };
    format!(
        "p10 {} p50 {} p90 {} max {}",
        at(0.1),
        at(0.5),
        at(0.9),
        at(1.0)
    )
}

fn deployment_status(d: &Deployment) -> Option<(String, String)> {
    let name = d.metadata.name.clone()?;
    let status = d.status.as_ref().map_or_else(String::new, |s| {
        format!(
            "g{} {}/{}/{}/{}",
            s.observed_generation.unwrap_or(0),
            s.replicas.unwrap_or(0),
            s.updated_replicas.unwrap_or(0),
            s.ready_replicas.unwrap_or(0),
            s.available_replicas.unwrap_or(0)
        )
    });
    Some((name, status))
}

/// Watches `api` until aborted, recording every status `summary` gives.
fn record_statuses<K>(
    api: Api<K>,
    summary: fn(&K) -> Option<(String, String)>,
) -> (
    std::sync::Arc<std::sync::Mutex<Statuses>>,
    tokio::task::JoinHandle<()>,
)
where
    K: switchyard_k8s::kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    let statuses = std::sync::Arc::new(std::sync::Mutex::new(Statuses::default()));
    let into = statuses.clone();
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) = event
                && let Some((name, status)) = summary(&object)
            {
                into.lock().unwrap().record(name, status);
            }
        }
    });
    (statuses, task)
}

/// Seconds from the first create until every Deployment is Available.
async fn converge(name: &str, under: Under, count: usize) -> f64 {
    let (plane, client) = plane_with_namespace(NODES, NAMESPACE).await;
    let controllers = Controllers::start(&plane, under).await;
    let api: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);

    let (requests_before, work_before) =
        (apiserver_requests(&client).await, controllers.work().await);
    let (controllers_cpu, bench_cpu, plane_cpu) = (
        cpu_of(&controllers.pids()),
        cpu_of(&[]),
        plane.cpu_seconds(),
    );
    let (replica_sets, replica_set_watch) = record_statuses(
        Api::<ReplicaSet>::namespaced(client.clone(), NAMESPACE),
        replica_set_status,
    );
    let (deployments, deployment_watch) = record_statuses(api.clone(), deployment_status);
    let (pods, pod_watch) = record_statuses(
        Api::<Pod>::namespaced(client.clone(), NAMESPACE),
        pod_readiness,
    );
    let start = Instant::now();
    create_all(&api, count, |i| deployment(&format!("d{i:04}"))).await;
    let created = start.elapsed();
    loop {
        let done = api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|d| available(d))
            .count();
        if done == count {
            break;
        }
        assert!(
            start.elapsed() < CONVERGE_TIMEOUT,
            "{under:?}: {done} of {count} Deployments Available after {CONVERGE_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let took = start.elapsed().as_secs_f64();
    replica_set_watch.abort();
    deployment_watch.abort();
    replica_sets.lock().unwrap().report(&under, "ReplicaSet");
    deployments.lock().unwrap().report(&under, "Deployment");
    pod_watch.abort();
    report_readiness(&under, &pods.lock().unwrap());
    let controllers_cpu = cpu_of(&controllers.pids()) - controllers_cpu;
    let bench_cpu = cpu_of(&[]) - bench_cpu;
    let plane_cpu = plane.cpu_seconds() - plane_cpu;
    eprintln!("{under:?}: created in {created:?}, all Available after {took:.1} s");
    let run = name.trim_end_matches("_converge");
    println!("bench e2e.{run}_controllers_cpu {controllers_cpu:.1} s");
    println!("bench e2e.{run}_bench_process_cpu {bench_cpu:.1} s");
    println!("bench e2e.{run}_plane_cpu {plane_cpu:.1} s");
    // The writes that converged them, counted by the apiserver for both controllers alike.
    let requests = between(&requests_before, &apiserver_requests(&client).await);
    let work = between(&work_before, &controllers.work().await);
    let converged = controller_writes(&requests);
    let objects: f64 = converged
        .iter()
        .filter(|(k, _)| !k.starts_with("events"))
        .map(|(_, v)| v)
        .sum();
    eprintln!("{under:?}: apiserver writes until converged: {converged:?}");
    let conflicts = requests_by_name(&requests, |r| r.controller_write() && r.code == "409");
    eprintln!("{under:?}: writes refused with 409 Conflict: {conflicts:?}");
    println!(
        "bench e2e.{run}_conflicts {:.0} requests",
        conflicts.values().fold(0.0, |sum, n| sum + n)
    );
    // Everyone's reads (the controllers', the scheduler's, kwok's and this benchmark's own
    // polling), for comparing runs of one side.
    eprintln!(
        "{under:?}: apiserver reads until converged: {:?}",
        requests_by_name(&requests, Request::read)
    );
    eprintln!("{under:?}: work until converged: {work:?}");
    let adds: f64 = work
        .iter()
        .filter(|(k, _)| k.starts_with("workqueue_adds_total"))
        .map(|(_, v)| v)
        .sum();
    println!("bench e2e.{run}_queue_adds {adds:.0} keys");
    if matches!(under, Under::Switchyard { .. }) {
        let reconciles: f64 = work
            .iter()
            .filter(|(k, _)| k.starts_with("reconciles"))
            .map(|(_, v)| v)
            .sum();
        println!("bench e2e.{run}_reconciles {reconciles:.0} reconciles");
    }
    println!("bench e2e.{run}_object_writes {objects:.0} requests");
    // Every object write the controllers sent, whatever the apiserver answered: the accepted
    // ones above, those refused with 409 and any other refusal. A refused write is a request
    // the apiserver handles too, and `apiserver_request_total` counts it.
    let sent: f64 = requests_by_name(&requests, |r| {
        r.controller_write() && r.resource != "events"
    })
    .values()
    .sum();
    println!("bench e2e.{run}_object_write_requests {sent:.0} requests");
    // The controllers' Events, a write each (a repeat of one, a patch): what their apiserver
    // writes include besides the objects themselves. Read once the writers caught up.
    tokio::time::sleep(EVENTS_SETTLE).await;
    let settled = controller_writes(&between(
        &requests_before,
        &apiserver_requests(&client).await,
    ));
    let event_writes: f64 = settled
        .iter()
        .filter(|(k, _)| k.starts_with("events"))
        .map(|(_, v)| v)
        .sum();
    println!("bench e2e.{run}_event_writes {event_writes:.0} requests");
    let events: Api<Event> = Api::namespaced(client, NAMESPACE);
    let (mut objects, mut occurrences) = (0, 0);
    for event in events.list(&ListParams::default()).await.unwrap().items {
        if matches!(
            event.involved_object.kind.as_deref(),
            Some("Deployment" | "ReplicaSet")
        ) {
            objects += 1;
            occurrences += i64::from(event.count.unwrap_or(1).max(1));
        }
    }
    eprintln!(
        "{under:?}: {objects} controller Events ({occurrences} occurrences) for {count} Deployments"
    );
    controllers.stop().await;
    plane.stop();
    took
}

/// The measurements, by figure name, in the order they run.
const RUNS: [(&str, Under); 11] = [
    ("kcm_converge", Under::KCM),
    ("sy1_converge", Under::switchyard(1, 0)),
    ("sy1_converge_mtls", Under::switchyard_mtls(1)),
    ("sy2_converge", Under::switchyard(2, 0)),
    ("sy4_converge", Under::switchyard(4, 0)),
    (
        "sy1_converge_concurrency40",
        Under::switchyard_slow(1, 0, 40),
    ),
    (
        "sy4_converge_shared_limits",
        Under::switchyard_shared_limits(4),
    ),
    ("sy1_converge_slow", Under::switchyard(1, 20)),
    ("sy4_converge_slow", Under::switchyard(4, 20)),
    ("sy1_converge_slow50", Under::switchyard(1, 50)),
    ("sy4_converge_slow50", Under::switchyard(4, 50)),
];

/// The ratios printed when both of their runs ran: (figure, numerator, denominator).
const RATIOS: [(&str, &str, &str); 5] = [
    ("sy1_vs_kcm", "sy1_converge", "kcm_converge"),
    ("sy1_mtls_vs_kcm", "sy1_converge_mtls", "kcm_converge"),
    ("sy1_mtls_vs_plaintext", "sy1_converge_mtls", "sy1_converge"),
    ("sy4_vs_sy1_slow", "sy1_converge_slow", "sy4_converge_slow"),
    (
        "sy4_vs_sy1_slow50",
        "sy1_converge_slow50",
        "sy4_converge_slow50",
    ),
];

async fn run() {
    let count = deployments();
    eprintln!("{count} Deployments x {REPLICAS} replicas per run");
    // Every subject once per round, the order reversed every other round; each figure is
    // the median of its rounds, every run printed on stderr.
    let took = switchyard_testenv::compare("e2e", &RUNS, "s", |name, under| {
        converge(name, under, count)
    })
    .await;
    for (name, seconds) in &took {
        println!("bench e2e.{name} {seconds:.1} s");
    }
    print_ratios("e2e", &took, &RATIOS);
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run());
}
