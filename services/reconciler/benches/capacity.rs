//! `make bench-capacity`: the highest rate of Deployment changes the controllers keep up with
//! while meeting two service levels, measured the way timebertt's
//! kubernetes-controller-sharding measures a controller's capacity: a load generator changes
//! Deployment specs at a rising rate in fixed steps, and the figure is the highest rate whose
//! step met both
//! - **queue wait**: 99 % of the Deployment and ReplicaSet controllers' keys waited at most
//!   1 s in their work queue before a worker took them (`workqueue_queue_duration_seconds`,
//!   client-go's buckets on both sides, read from kube-controller-manager's `/metrics` and the
//!   queue's), and
//! - **time to ready**: 99 % of the step's changes were rolled out, from the change's PATCH
//!   until the Deployment's status shows that generation with every replica updated and
//!   available and no old one left, within 5 s (seen by a watch on the Deployments; a change
//!   not rolled out [`DRAIN`] after its step counts as too slow).
//!
//! Each subject runs on a fresh control plane (etcd, kube-apiserver, kube-scheduler, kwok with
//! 10 Nodes) with [`DEPLOYMENTS`] Deployments of [`REPLICAS`] replicas created and rolled
//! out first. A change sets an annotation on the Pod template, so every change is a rollout:
//! a new ReplicaSet's Pods created, the old ones deleted. Changes are sent open loop, at
//! their rate whatever the apiserver's latency, round robin over the Deployments. A step
//! lasts [`STEP`]; between steps everything is left to settle, the work queues empty. The
//! rate starts at 0.5 changes/s and rises by a quarter at each step, rounded to hundredths
//! (0.5, 0.63, 0.79, 0.99, 1.24, 1.55, 1.94, 2.42, 3.03, 3.79, 4.74, 5.93, 7.41, 9.26, ...);
//! the run stops at the first step that misses a service level.
//!
//! The slowed subjects compare at the same per-reconcile latency, where the reconcilers, not
//! this 2-core machine's control plane, bound the capacity. Every reconcile (every
//! kube-controller-manager sync) first waits [`SLOW_MS`], as if it called an external system:
//! - `capacity.kcm` (changes/s): kube-controller-manager's deployment, replicaset, garbage
//!   collector and namespace controllers, as in `make bench-e2e`, built as
//!   `kube-controller-manager-slowed` (`scripts/testenv.sh kcm-slowed`), which sleeps in every
//!   Deployment and ReplicaSet sync; its default 5 Deployment and 5 ReplicaSet workers;
//! - `capacity.sy1_concurrency10` (changes/s): Switchyard with one reconciler slowed by
//!   `--simulated-latency`, 10 reconciles at a time (its default, as many as
//!   kube-controller-manager's workers);
//! - `capacity.sy1`, `capacity.sy4` (changes/s): Switchyard with 1 and 4 reconciler processes,
//!   [`SLOW_CONCURRENCY`] reconciles at a time per replica: at most 25 reconciles/s per
//!   replica. A change is about 24-31 reconciles, so one replica keeps up with about 1
//!   change/s and four with about 4, below the 5-7 changes/s where this machine's control
//!   plane stops keeping up (the unslowed subjects' capacity). At 10 at a time four replicas
//!   would need about 8 and meet that ceiling first;
//!
//! and, unslowed, what the control plane itself allows:
//! - `capacity.kcm_unslowed` (changes/s): kube-controller-manager as built from its module;
//! - `capacity.sy1_unslowed` (changes/s): Switchyard with one reconciler, nothing added to a
//!   reconcile;
//! - `capacity.sy1_unslowed_concurrency20` (changes/s): as `sy1_unslowed`, with 20 reconciles
//!   at a time instead of the default 10: whether one reconciler is bound by its reconciles in
//!   flight;
//! - `capacity.sy1_concurrency10_vs_kcm`, `capacity.sy4_vs_sy1`,
//!   `capacity.sy1_unslowed_vs_kcm_unslowed` (ratios).
//!
//! Each step's figures go to stderr: the rate sent, changes rolled out, time-to-ready p50 and
//! p99, the share of keys within the 1 s queue wait, the reconcilers' reconcile times, where
//! they waited (their Cache API calls and apiserver writes, and the watcher's waits for a
//! read's resourceVersion), the apiserver's requests by verb and code (its own
//! `apiserver_request_total`: the controllers' writes, those refused, and reads), what the
//! client-side rate limits cost (kube-controller-manager's
//! `rest_client_rate_limiter_duration_seconds`; Switchyard's time each client held requests
//! for a token, and how many waited), and the CPU
//! cores each process used from the step's first change to the end of its drain (etcd,
//! kube-apiserver, kube-scheduler, kwok, the controllers, and the benchmark's own process,
//! which holds the load generator and, for Switchyard, the queue and the watcher).
//! Each subject runs once per round, the order reversed every other round
//! (`SWITCHYARD_BENCH_ROUNDS`, 2 by default); each figure is the median of its rounds.
//! `SWITCHYARD_BENCH_RUNS=kcm,sy1_concurrency10` runs only the named subjects: a subject takes
//! 5 to 15 minutes, so all seven over two rounds take about three hours.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::TryStreamExt;
use serde_json::json;
use switchyard_k8s::{
    Api, Client, Deployment,
    kube::api::{Patch, PatchParams},
    watcher,
};
use switchyard_testenv::{ControlPlane, manifests};

use crate::support::{
    Buckets, Controllers, Request, Under, apiserver_requests, between, controller_writes, cpu_of,
    create_all, plane_with_namespace, print_ratios, requests_by_name,
};

const DEPLOYMENTS: usize = 200;
const REPLICAS: i32 = 2;
const NODES: usize = 10;
const NAMESPACE: &str = "capacity";
/// How long each step sends changes.
const STEP: Duration = Duration::from_secs(30);
/// How long after its step a change may still roll out; later, it counts as too slow.
const DRAIN: Duration = Duration::from_secs(30);
/// The longest wait for everything to settle between steps.
const SETTLE: Duration = Duration::from_secs(120);
/// The longest wait for the first rollout of every Deployment to settle.
const FIRST_SETTLE: Duration = Duration::from_secs(600);
const FIRST_RATE: f64 = 0.5;
const RATE_FACTOR: f64 = 1.25;
const HIGHEST_RATE: f64 = 200.0;
const QUEUE_WAIT_SLO: f64 = 1.0;
const READY_SLO: Duration = Duration::from_secs(5);
/// Both service levels hold for 99 % of what they measure.
const QUANTILE: f64 = 0.99;
/// The slowed subjects' reconciles (kube-controller-manager's syncs) each wait this long
/// first; `sy1` and `sy4` run this many at a time per replica (25 reconciles/s per replica
/// at most).
const SLOW_MS: u64 = 200;
const SLOW_CONCURRENCY: usize = 5;

/// The subjects, by figure name, in the order they run in the first round (reversed in the
/// next, and so on).
const SUBJECTS: [(&str, Under); 7] = [
    (
        "kcm",
        Under::ControllerManager {
            latency_ms: SLOW_MS,
        },
    ),
    ("sy1_concurrency10", Under::switchyard_slow(1, SLOW_MS, 10)),
    ("sy1", Under::switchyard_slow(1, SLOW_MS, SLOW_CONCURRENCY)),
    ("sy4", Under::switchyard_slow(4, SLOW_MS, SLOW_CONCURRENCY)),
    ("kcm_unslowed", Under::KCM),
    ("sy1_unslowed", Under::switchyard(1, 0)),
    // What bounds one reconciler where the control plane slows down: its reconciles at once.
    (
        "sy1_unslowed_concurrency20",
        Under::switchyard_slow(1, 0, 20),
    ),
];

/// The ratios printed when both of their subjects ran: (figure, numerator, denominator).
const RATIOS: [(&str, &str, &str); 3] = [
    ("sy1_concurrency10_vs_kcm", "sy1_concurrency10", "kcm"),
    ("sy4_vs_sy1", "sy4", "sy1"),
    (
        "sy1_unslowed_vs_kcm_unslowed",
        "sy1_unslowed",
        "kcm_unslowed",
    ),
];

fn deployment(name: &str) -> Deployment {
    manifests::deployment(name, REPLICAS, serde_json::Value::Null)
}

/// The generation this Deployment's status shows rolled out completely, if any.
fn rolled_out(deployment: &Deployment) -> Option<i64> {
    let status = deployment.status.as_ref()?;
    let replicas = deployment.spec.as_ref()?.replicas.unwrap_or(1);
    let complete = status.updated_replicas == Some(replicas)
        && status.available_replicas == Some(replicas)
        && status.replicas == Some(replicas);
    complete.then_some(status.observed_generation?)
}

/// Changes sent and not yet rolled out, and how long the rolled-out ones took.
#[derive(Default)]
struct Changes {
    /// By Deployment: (generation, when its PATCH was answered), oldest first.
    pending: BTreeMap<String, Vec<(i64, Instant)>>,
    /// Every Deployment's latest rolled-out generation, as the watch saw it.
    rolled_out: BTreeMap<String, i64>,
    took: Vec<Duration>,
}

impl Changes {
    fn sent(&mut self, name: &str, generation: i64, at: Instant) {
        if self.rolled_out.get(name).is_some_and(|g| *g >= generation) {
            self.took.push(at.elapsed());
            return;
        }
        self.pending
            .entry(name.to_owned())
            .or_default()
            .push((generation, at));
    }

    fn seen(&mut self, deployment: &Deployment) {
        let Some(generation) = rolled_out(deployment) else {
            return;
        };
        let name = deployment.metadata.name.clone().unwrap_or_default();
        self.rolled_out.insert(name.clone(), generation);
        if let Some(pending) = self.pending.get_mut(&name) {
            let now = Instant::now();
            pending.retain(|(g, at)| {
                let done = *g <= generation;
                if done {
                    self.took.push(now - *at);
                }
                !done
            });
        }
    }

    fn unfinished(&self) -> usize {
        self.pending.values().map(Vec::len).sum()
    }
}

/// What one step measured.
struct Step {
    rate: f64,
    sent: usize,
    /// Times to ready, sorted; changes not rolled out by the end of the drain count as
    /// [`Duration::MAX`].
    took: Vec<Duration>,
    queue_wait: Buckets,
    /// The reconcile times (kube-controller-manager's sync times, in coarser buckets).
    reconciles: Buckets,
    /// Where Switchyard's reconciles waited ([`Controllers::waits`]).
    waits: BTreeMap<&'static str, Buckets>,
    /// The apiserver's requests over the step, by verb, resource and code (its own
    /// `apiserver_request_total`), the load generator's PATCHes included.
    requests: BTreeMap<Request, f64>,
    /// What the client-side rate limits cost over the step ([`Controllers::rate_limits`]).
    rate_limits: BTreeMap<String, f64>,
    /// CPU-seconds each process used from the step's first change to the end of its drain.
    cpu: BTreeMap<String, f64>,
    elapsed: Duration,
}

impl Step {
    fn quantile(&self, q: f64) -> Duration {
        if self.took.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((self.took.len() as f64) * q).ceil() as usize;
        self.took[rank.clamp(1, self.took.len()) - 1]
    }

    fn met(&self) -> bool {
        self.quantile(QUANTILE) <= READY_SLO
            && self.queue_wait.share_within(QUEUE_WAIT_SLO) >= QUANTILE
    }

    fn print(&self, subject: &str) {
        let shown = |d: Duration| {
            if d == Duration::MAX {
                "never".to_owned()
            } else {
                format!("{:.2} s", d.as_secs_f64())
            }
        };
        eprintln!(
            "{subject}: {:.2} changes/s: {} sent, {} rolled out in time; time to ready p50 {}, \
             p99 {}; {:.2} % of {} keys waited <= 1 s in the queue: {}",
            self.rate,
            self.sent,
            self.took.iter().filter(|d| **d <= READY_SLO).count(),
            shown(self.quantile(0.5)),
            shown(self.quantile(QUANTILE)),
            self.queue_wait.share_within(QUEUE_WAIT_SLO) * 100.0,
            self.queue_wait.count(),
            if self.met() { "met" } else { "missed" }
        );
        if self.reconciles.count() > 0.0 {
            eprintln!(
                "{subject}: {:.2} changes/s: {} reconciles, p50 <= {} s, p99 <= {} s (bucket \
                 bounds)",
                self.rate,
                self.reconciles.count(),
                self.reconciles.quantile_bound(0.5),
                self.reconciles.quantile_bound(0.99)
            );
        }
        let waits: Vec<String> = self
            .waits
            .iter()
            .filter(|(_, took)| took.count() > 0.0)
            .map(|(what, took)| {
                format!(
                    "{what} {} p50 <= {} s, p99 <= {} s",
                    took.count(),
                    took.quantile_bound(0.5),
                    took.quantile_bound(0.99)
                )
            })
            .collect();
        if !waits.is_empty() {
            eprintln!(
                "{subject}: {:.2} changes/s: {} (bucket bounds)",
                self.rate,
                waits.join("; ")
            );
        }
        // The load generator's PATCHes are `deployments/ PATCH`; the controllers' own writes
        // of a Deployment are PUTs on both sides.
        let mut writes = controller_writes(&self.requests);
        writes.remove("deployments/ PATCH");
        let refused = requests_by_name(&self.requests, |r| {
            r.controller_write() && !r.code.starts_with('2')
        });
        let reads: f64 = requests_by_name(&self.requests, Request::read)
            .values()
            .sum();
        eprintln!(
            "{subject}: {:.2} changes/s: apiserver: controllers' writes {} ({:.1} a change) \
             {writes:?}; refused {refused:?}; reads {reads}",
            self.rate,
            writes.values().sum::<f64>(),
            writes.values().sum::<f64>() / self.sent.max(1) as f64,
        );
        eprintln!(
            "{subject}: {:.2} changes/s: client rate limits: {:?}",
            self.rate, self.rate_limits
        );
        let seconds = self.elapsed.as_secs_f64();
        let cores: Vec<String> = self
            .cpu
            .iter()
            .map(|(who, used)| format!("{who} {:.2}", used / seconds))
            .collect();
        let total: f64 = self.cpu.values().sum();
        eprintln!(
            "{subject}: {:.2} changes/s: CPU cores over {seconds:.1} s: {}; all {:.2}",
            self.rate,
            cores.join(", "),
            total / seconds
        );
    }
}

/// The CPU-seconds each process has used so far: the control plane's, the controllers'
/// (kube-controller-manager or the reconcilers) and this one's (the load generator and its
/// watch, and Switchyard's queue and watcher).
fn cpu_used(plane: &ControlPlane, controllers: &Controllers) -> BTreeMap<String, f64> {
    let mut used: BTreeMap<String, f64> = plane.cpu_seconds_by_process().into_iter().collect();
    let this = cpu_of(&[]);
    let name = match controllers {
        Controllers::Kcm(_) => "kube-controller-manager",
        Controllers::Switchyard { .. } => "reconcilers",
    };
    used.insert(name.to_owned(), cpu_of(&controllers.pids()) - this);
    used.insert("this process".to_owned(), this);
    used
}

/// Waits until no change is pending, every Deployment is rolled out at its generation and
/// the controllers' work queues stayed empty for a second: a backlog left from before a step
/// would count against it.
async fn settle(
    api: &Api<Deployment>,
    controllers: &Controllers,
    changes: &Mutex<Changes>,
    within: Duration,
) -> bool {
    let start = Instant::now();
    let mut idle_since: Option<Instant> = None;
    while start.elapsed() < within {
        let pending = changes.lock().unwrap().unfinished();
        let rolled_out = pending == 0
            && api
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .iter()
                .all(|d| rolled_out(d) >= d.metadata.generation);
        if rolled_out && controllers.queue_depth().await == 0.0 {
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_secs(1) {
                return true;
            }
        } else {
            idle_since = None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// Sends changes at `rate` for [`STEP`], then waits up to [`DRAIN`] for them to roll out.
async fn step(
    plane: &ControlPlane,
    client: &Client,
    api: &Api<Deployment>,
    controllers: &Controllers,
    changes: &Arc<Mutex<Changes>>,
    rate: f64,
    next_change: &mut usize,
) -> Step {
    changes.lock().unwrap().took.clear();
    let queue_before = controllers.queue_wait().await;
    let reconciles_before = controllers.reconcile_time().await;
    let waits_before = controllers.waits().await;
    let requests_before = apiserver_requests(client).await;
    let rate_limits_before = controllers.rate_limits().await;
    let cpu_before = cpu_used(plane, controllers);
    let count = (rate * STEP.as_secs_f64()).round() as usize;
    let start = tokio::time::Instant::now();
    let mut sending = Vec::with_capacity(count);
    for i in 0..count {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
        let change = *next_change;
        *next_change += 1;
        let (api, changes) = (api.clone(), changes.clone());
        sending.push(tokio::spawn(async move {
            let name = format!("d{:03}", change % DEPLOYMENTS);
            let patch = json!({"spec": {"template": {"metadata": {"annotations": {
                "bench.switchyard.io/change": change.to_string()}}}}});
            let patched = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
            let generation = patched.metadata.generation.unwrap_or_default();
            changes
                .lock()
                .unwrap()
                .sent(&name, generation, Instant::now());
        }));
    }
    for sent in sending {
        sent.await.unwrap();
    }
    let drained = Instant::now();
    while changes.lock().unwrap().unfinished() > 0 && drained.elapsed() < DRAIN {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = start.elapsed();
    let cpu = between(&cpu_before, &cpu_used(plane, controllers));
    let requests = between(&requests_before, &apiserver_requests(client).await);
    let rate_limits = between(&rate_limits_before, &controllers.rate_limits().await);
    let queue_wait = controllers.queue_wait().await.since(&queue_before);
    let reconciles = controllers.reconcile_time().await.since(&reconciles_before);
    let waits = controllers
        .waits()
        .await
        .into_iter()
        .map(|(what, after)| {
            let since = waits_before.get(what).map(|before| after.since(before));
            (what, since.unwrap_or(after))
        })
        .collect();
    let mut changes = changes.lock().unwrap();
    let mut took = std::mem::take(&mut changes.took);
    took.extend(std::iter::repeat_n(Duration::MAX, changes.unfinished()));
    took.sort();
    Step {
        rate,
        sent: count,
        took,
        queue_wait,
        reconciles,
        waits,
        requests,
        rate_limits,
        cpu,
        elapsed,
    }
}

/// The highest rate whose step met both service levels, 0 if the first did not.
async fn capacity(subject: &str, under: Under) -> f64 {
    let (plane, client) = plane_with_namespace(NODES, NAMESPACE).await;
    let controllers = Controllers::start(&plane, under).await;
    let api: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let changes = Arc::new(Mutex::new(Changes::default()));
    let watch = tokio::spawn({
        let (api, changes) = (api.clone(), changes.clone());
        async move {
            let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
            while let Some(event) = events.try_next().await.unwrap() {
                if let watcher::Event::Apply(d) | watcher::Event::InitApply(d) = event {
                    changes.lock().unwrap().seen(&d);
                }
            }
        }
    });
    create_all(&api, DEPLOYMENTS, |i| deployment(&format!("d{i:03}"))).await;
    assert!(
        settle(&api, &controllers, &changes, FIRST_SETTLE).await,
        "{subject}: the {DEPLOYMENTS} Deployments did not roll out within {FIRST_SETTLE:?}"
    );

    let (mut rate, mut met, mut next_change) = (FIRST_RATE, 0.0, 0);
    while rate <= HIGHEST_RATE {
        let step = step(
            &plane,
            &client,
            &api,
            &controllers,
            &changes,
            rate,
            &mut next_change,
        )
        .await;
        step.print(subject);
        if !step.met() {
            break;
        }
        met = rate;
        if !settle(&api, &controllers, &changes, SETTLE).await {
            eprintln!("{subject}: not settled {SETTLE:?} after the step at {rate:.2} changes/s");
            break;
        }
        rate = (rate * RATE_FACTOR * 100.0).round() / 100.0;
    }
    watch.abort();
    eprintln!("{subject}: work: {:?}", controllers.work().await);
    let took = controllers.reconcile_time().await;
    if took.count() > 0.0 {
        eprintln!(
            "{subject}: {} reconciles, p50 <= {} s, p99 <= {} s (bucket bounds)",
            took.count(),
            took.quantile_bound(0.5),
            took.quantile_bound(0.99)
        );
    }
    controllers.stop().await;
    plane.stop();
    met
}

async fn run() {
    // Every subject once per round, the order reversed every other round; each figure is
    // the median of its rounds, every run printed on stderr.
    let measured = switchyard_testenv::compare("capacity", &SUBJECTS, "changes/s", capacity).await;
    for (name, rate) in &measured {
        println!("bench capacity.{name} {rate:.2} changes/s");
    }
    print_ratios("capacity", &measured, &RATIOS);
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run());
}
