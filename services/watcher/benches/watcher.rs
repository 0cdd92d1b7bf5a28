//! `make bench-watcher`: the watcher against a real control plane.
//!
//! - `watcher.enqueue_latency_p50` / `_p99` (ms): from sending a write to the apiserver until
//!   the queue enqueued the key it causes (the lease's `queued_at`), at a steady 1,000
//!   changes/s over 1,000 ConfigMaps. A ConfigMap is written again only once its last write's
//!   lease came, so no two writes of a key coalesce and each lease is matched to the exact
//!   write behind it (the write carries a unique `seq`). What cannot be matched is counted
//!   apart, never dropped: `watcher.matched`, `unmatched_never_leased`,
//!   `unmatched_queued_before_sent`, `unmatched_leases`, `skipped_no_free_key`.
//!   `watcher.write_latency_p50` / `_p99` (ms): from sending the same writes to their
//!   response, the apiserver's part; `watcher.own_latency_p50` / `_p99` (ms): from the
//!   watcher receiving the write's event (the time it stamps on the key, which the lease
//!   carries as `observed_at`) until the queue enqueued the key, the watcher's and the
//!   queue's own part, signed and not clamped (`own_latency_negative` counts samples below
//!   zero, `own_unstamped` matched leases without the stamp);
//!   `watcher.own_vs_watch_p50` / `_p99` (ms): the same part seen from outside, from the
//!   write's event (by name and `seq`) reaching an independent watch in this process until
//!   its key was enqueued (`own_vs_watch_negative`: where that watch heard last;
//!   `own_unseen_by_observer`: writes it never heard of); `watcher.observer_spread_p50` /
//!   `_p99` (ms): how far apart two independent watches heard of the same write, the error
//!   the outside view carries; `watcher.wakeup_delay_p50` / `_p99` (ms): how late a thread
//!   of this process that sleeps 1 ms wakes while the writes run, the wait for a CPU any
//!   hand-off between threads can meet;
//!   `watcher.apiserver_patch_over_25ms` (%): the share of those writes the apiserver itself
//!   (its request duration histogram) took more than 25 ms to handle. The queue and the
//!   watcher run in this process, each on a Tokio runtime of its own as in a process of its
//!   own, apart from the benchmark's writer and watches (`SWITCHYARD_BENCH_SHARED_RUNTIME=1`:
//!   on the benchmark's runtime, with them);
//! - `watcher.bytes_per_pod_full` / `_meta` (bytes): heap the watcher's cache holds per cached
//!   kwok Pod (Running and Ready, managedFields stripped), whole object and metadata only;
//!   beside each, kube-rs storing the same Pods in the same run, also without managedFields:
//!   `watcher.reflector_bytes_per_pod_full` (a `watcher` of typed `Pod`s feeding a
//!   `reflector`; called `reflector_bytes_per_pod` before issue 18) and
//!   `watcher.reflector_bytes_per_pod_meta` (a metadata-only watcher, as `metadata_watcher`
//!   was, feeding a reflector of `PartialObjectMeta<Pod>`). Heap is the bytes a store frees when it is dropped, counted
//!   by the allocator's usable size (`malloc_usable_size`: what glibc really holds); each
//!   figure's `_requested` twin counts the sizes asked for, as the figures did before. Each
//!   side stores the Pods once per round, which side goes first alternating
//!   (`SWITCHYARD_BENCH_ROUNDS`, 2 by default); each figure is the median of its rounds;
//! - `watcher.field_predicate_us_per_pod` (µs): what a `fieldChanged` predicate adds to each
//!   event of its kind, over the same Pods: the object's JSON parsed and one value
//!   (`/status/phase`) hashed; beside it `watcher.summary_us_per_pod` (µs), what every event
//!   costs already (the summary and the JSON the cache keeps). Medians of the rounds; no
//!   peer figure (controller-runtime runs its predicates on objects already decoded);
//! - `watcher.list_50k` (s): from starting a watcher until its initial list of 50,000 Pods is
//!   cached (readiness).
//!
//! `SWITCHYARD_BENCH_RUNS=latency,memory,list_50k` (any of the three) runs only those parts;
//! `SWITCHYARD_BENCH_RATE=<changes/s>` runs the latency part at another rate than 1,000.

#![allow(unsafe_code, clippy::unwrap_used)]

use std::{
    alloc::{GlobalAlloc, Layout, System},
    collections::{BTreeMap, HashMap},
    io::Write,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use clap::Parser;
use futures::StreamExt;
use switchyard_k8s::{
    Api, Client, Pod, PostParams,
    k8s_openapi::api::core::v1::ConfigMap,
    kube::{
        api::{DynamicObject, ListParams, PartialObjectMeta, Patch, PatchParams},
        runtime::{
            WatchStreamExt, reflector, watcher as kube_watcher, watcher::watcher as kube_watch,
        },
    },
};
use switchyard_proto::queue::v1::{
    Credit, Done, Outcome, WorkRequest, WorkerHello, outcome, queue_client::QueueClient,
    work_request::Request as Msg, work_response::Response as Reply,
};
use switchyard_runtime::Role;
use switchyard_testenv::{ControlPlane, ControlPlaneOptions, InProcess, Pki, TestNamespace};
use switchyard_watcher::informer::summarize;
use switchyard_watcher_core::Store;
use tokio_stream::wrappers::ReceiverStream;

/// Forwards to the system allocator (glibc's malloc) and counts the live heap twice: as the
/// allocator holds it (`malloc_usable_size`: the whole block, size-class rounding included)
/// and as the program asked for it (`Layout::size`). The first is the memory a cache costs;
/// the second is what earlier runs of this benchmark reported.
struct Counting;

static USABLE: AtomicUsize = AtomicUsize::new(0);
static REQUESTED: AtomicUsize = AtomicUsize::new(0);

/// The usable size of a block the system allocator handed out.
///
/// # Safety
///
/// `ptr` must be a live block from `System` (glibc's `malloc` family).
unsafe fn usable(ptr: *mut u8) -> usize {
    // SAFETY: the caller's contract; glibc reads the size from the block's header.
    unsafe { libc::malloc_usable_size(ptr.cast()) }
}

// SAFETY: forwards to the system allocator and only counts the bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            // SAFETY: `ptr` was just allocated by `System`.
            USABLE.fetch_add(unsafe { usable(ptr) }, Ordering::Relaxed);
            REQUESTED.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` is live until the `dealloc` below.
        USABLE.fetch_sub(unsafe { usable(ptr) }, Ordering::Relaxed);
        REQUESTED.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` is live until the `realloc` below.
        let old = unsafe { usable(ptr) };
        // SAFETY: same contract as the caller's.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            // SAFETY: `new` was just allocated by `System` (on failure `ptr` stays as it was).
            USABLE.fetch_add(unsafe { usable(new) }, Ordering::Relaxed);
            USABLE.fetch_sub(old, Ordering::Relaxed);
            REQUESTED.fetch_add(new_size, Ordering::Relaxed);
            REQUESTED.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Heap bytes, counted both ways (see [`Counting`]).
#[derive(Clone, Copy, Debug)]
struct Heap {
    usable: usize,
    requested: usize,
}

/// Bytes freed by dropping `value`: what it held.
fn held<T>(value: T) -> Heap {
    let (usable, requested) = (
        USABLE.load(Ordering::SeqCst),
        REQUESTED.load(Ordering::SeqCst),
    );
    drop(value);
    Heap {
        usable: usable.saturating_sub(USABLE.load(Ordering::SeqCst)),
        requested: requested.saturating_sub(REQUESTED.load(Ordering::SeqCst)),
    }
}

const CONTROLLER: &str = "bench/v1/ConfigMap";
const SHARDS: u32 = 256;
/// Changes per second of the latency run; `SWITCHYARD_BENCH_RATE` sets another (to find the
/// rate this machine's apiserver keeps up with).
const RATE: u64 = 1_000;
const RATE_SECONDS: u64 = 15;
const OBJECTS: usize = 1_000;
const MEMORY_PODS: usize = 2_000;
const LIST_PODS: usize = 50_000;
const CREATE_CONCURRENCY: usize = 48;

fn figure(name: &str, value: f64, unit: &str) {
    println!("bench watcher.{name} {value:.3} {unit}");
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run());
}

async fn run() {
    let plane = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .unwrap();
    let client = plane.client().await.unwrap();
    if switchyard_testenv::bench_selected("latency") {
        latency(&plane, &client).await;
    }
    if switchyard_testenv::bench_selected("memory") {
        memory(&plane, &client).await;
    }
    if switchyard_testenv::bench_selected("list_50k") {
        list_50k(&plane, &client).await;
    }
    plane.stop();
}

async fn queue() -> InProcess {
    let flags = ["--log-level=warn".to_owned()]
        .into_iter()
        .chain(Pki::shared().flags(Role::Queue));
    let (rt, grpc) = switchyard_queue::Args::start_local(SHARDS, &[CONTROLLER], flags)
        .await
        .unwrap();
    InProcess::spawn(rt, Some(grpc))
}

async fn watcher(kubeconfig: PathBuf, config: String, queue: String) -> InProcess {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(config.as_bytes()).unwrap();
    let path = file.into_temp_path().keep().unwrap();
    let (rt, grpc) = switchyard_watcher::Args::try_parse_from(
        [
            "switchyard-watcher".to_owned(),
            "--admin-addr=127.0.0.1:0".into(),
            "--grpc-addr=127.0.0.1:0".into(),
            "--log-level=warn".into(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--config={}", path.display()),
            format!("--queue-addr={queue}"),
        ]
        .into_iter()
        .chain(Pki::shared().flags(Role::Watcher)),
    )
    .unwrap()
    .start()
    .await
    .unwrap();
    InProcess::spawn(rt, Some(grpc))
}

/// Polls `/readyz` every 10 ms (finer than [`InProcess::wait_ready`], for `list_50k`).
async fn until_ready(service: &InProcess) {
    while !service.is_ready().await {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn latency(plane: &ControlPlane, client: &Client) {
    let ns = TestNamespace::create(plane, client, "bench-latency")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    futures::stream::iter(0..OBJECTS)
        .map(|i| {
            let maps = maps.clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("cm-{i}")}, "data": {"seq": "0"}
                }))
                .unwrap();
                maps.create(&PostParams::default(), &cm).await.unwrap();
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;

    // The queue and the watcher each run on a Tokio runtime of their own, as each runs in a
    // process of its own when deployed: their tasks do not wait behind this process's writer
    // and independent watches. `SWITCHYARD_BENCH_SHARED_RUNTIME=1` runs them on this
    // process's runtime instead, as before the seventh session of 2026-11-27.
    let shared = std::env::var("SWITCHYARD_BENCH_SHARED_RUNTIME").is_ok_and(|v| v == "1");
    eprintln!(
        "latency: queue and watcher on {}",
        if shared {
            "the benchmark's runtime"
        } else {
            "a runtime each"
        }
    );
    let (queue, queue_runtime) = Own::start(shared, "queue", queue()).await;
    let config = format!(
        "shardCount: {SHARDS}\nnamespaces: {{include: [{ns}]}}\ncontrollers:\n  - name: {CONTROLLER}\n    for: {{apiVersion: v1, kind: ConfigMap}}\n"
    );
    let (watcher, watcher_runtime) = Own::start(
        shared,
        "watcher",
        watcher(
            plane.kubeconfig().to_owned(),
            config,
            queue.grpc().to_string(),
        ),
    )
    .await;
    until_ready(&watcher).await;

    // The one write of each ConfigMap not yet matched to a lease: (its seq, when it was sent).
    // A ConfigMap is written again only after its write's lease came, so no two writes of
    // one key coalesce in the queue and every lease is matched to the exact write behind it.
    let sent: Arc<Mutex<HashMap<String, (u64, SystemTime)>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::default();
    let tally: Arc<Mutex<Tally>> = Arc::default();
    // The bench's worker leases as a reconciler does.
    let mut work = QueueClient::new(
        Pki::shared()
            .channel(Role::Reconciler, Role::Queue, queue.grpc())
            .await
            .unwrap(),
    );
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    let msg = |m| WorkRequest { request: Some(m) };
    tx.send(msg(Msg::Hello(WorkerHello {
        worker_id: "bench".into(),
        controllers: vec![],
    })))
    .await
    .unwrap();
    tx.send(msg(Msg::Credit(Credit { items: 5_000 })))
        .await
        .unwrap();
    let mut inbound = work
        .work(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let measuring = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // An independent watch on the same ConfigMaps, in this process: when each write's event
    // (its name and seq) arrives from the apiserver. Enqueue time minus this is the
    // watcher's and queue's share.
    let (observer, seen) = observe(maps.clone());
    // A second independent watch, to measure how far apart the apiserver delivers one event
    // to two watches: the spread any measurement against a separate watch carries.
    let (second_observer, second_seen) = observe(maps.clone());
    // Each matched write, when its key was enqueued, and when the watcher received its event
    // (the lease's `observed_at`).
    let enqueued: Arc<Mutex<Vec<Enqueued>>> = Arc::default();
    let worker = tokio::spawn({
        let (sent, latencies, measuring) = (sent.clone(), latencies.clone(), measuring.clone());
        let (enqueued, tally) = (enqueued.clone(), tally.clone());
        async move {
            while let Ok(Some(message)) = inbound.message().await {
                let Some(Reply::Item(item)) = message.response else {
                    continue;
                };
                let queued_at: SystemTime = item.queued_at.unwrap().try_into().unwrap();
                let observed_at: Option<SystemTime> =
                    item.observed_at.map(|at| at.try_into().unwrap());
                let name = item.key.as_ref().unwrap().name.clone();
                if measuring.load(Ordering::Relaxed) {
                    let write = sent.lock().unwrap().remove(&name);
                    match write {
                        // A lease no write of the measurement caused.
                        None => tally.lock().unwrap().unmatched_leases += 1,
                        Some((seq, at)) => match queued_at.duration_since(at) {
                            // Queued before its write was sent: something else caused it.
                            Err(_) => tally.lock().unwrap().queued_before_sent += 1,
                            Ok(took) => {
                                latencies.lock().unwrap().push(took.as_secs_f64() * 1e3);
                                // Resolved once the run is over: the independent watch
                                // may hear of the write after its lease came.
                                enqueued.lock().unwrap().push(Enqueued {
                                    name: name.clone(),
                                    seq,
                                    queued_at,
                                    observed_at,
                                });
                            }
                        },
                    }
                }
                if !continue_lease(&tx, &item).await {
                    return;
                }
            }
        }
    });
    // Let the initial list's keys drain before measuring.
    tokio::time::sleep(Duration::from_secs(2)).await;
    measuring.store(true, Ordering::Relaxed);
    let probe = wakeup_probe(measuring.clone());

    let rate: u64 = std::env::var("SWITCHYARD_BENCH_RATE")
        .ok()
        .and_then(|r| r.parse().ok())
        .filter(|r| *r > 0)
        .unwrap_or(RATE);
    let total = rate * RATE_SECONDS;
    let mut ticks = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(256));
    // Send to response of each write: the apiserver's share of the latency.
    let writes: Arc<Mutex<Vec<f64>>> = Arc::default();
    let start = Instant::now();
    let mut next = 0usize;
    for seq in 0..total {
        ticks.tick().await;
        // The next ConfigMap whose last write was matched; none free skips this tick.
        let name = {
            let mut sent = sent.lock().unwrap();
            let free = (0..OBJECTS)
                .map(|i| format!("cm-{}", (next + i) % OBJECTS))
                .position(|name| !sent.contains_key(&name));
            match free {
                Some(i) => {
                    let name = format!("cm-{}", (next + i) % OBJECTS);
                    next = (next + i + 1) % OBJECTS;
                    sent.insert(name.clone(), (seq, SystemTime::now()));
                    name
                }
                None => {
                    tally.lock().unwrap().skipped += 1;
                    continue;
                }
            }
        };
        let permit = in_flight.clone().acquire_owned().await.unwrap();
        let (maps, writes) = (maps.clone(), writes.clone());
        tokio::spawn(async move {
            let at = Instant::now();
            let patch = Patch::Merge(serde_json::json!({"data": {"seq": seq.to_string()}}));
            maps.patch(&name, &PatchParams::default(), &patch)
                .await
                .unwrap();
            writes
                .lock()
                .unwrap()
                .push(at.elapsed().as_secs_f64() * 1e3);
            drop(permit);
        });
    }
    let achieved = total as f64 / start.elapsed().as_secs_f64();
    measuring.store(false, Ordering::Relaxed);
    let mut wakeups = probe.join().unwrap();
    wakeups.sort_by(f64::total_cmp);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut all = latencies.lock().unwrap().clone();
    all.sort_by(f64::total_cmp);
    eprintln!(
        "latency: {} of {total} changes measured at {achieved:.0} changes/s",
        all.len()
    );
    // Every sample not in the percentiles is counted here, by why.
    let mut tally = *tally.lock().unwrap();
    let never_leased = sent.lock().unwrap().len();
    figure("matched", all.len() as f64, "writes");
    figure("unmatched_never_leased", never_leased as f64, "writes");
    figure(
        "unmatched_queued_before_sent",
        tally.queued_before_sent as f64,
        "writes",
    );
    figure("unmatched_leases", tally.unmatched_leases as f64, "leases");
    figure("skipped_no_free_key", tally.skipped as f64, "ticks");
    figure("enqueue_latency_p50", percentile(&all, 0.50), "ms");
    figure("enqueue_latency_p99", percentile(&all, 0.99), "ms");
    let mut writes = writes.lock().unwrap().clone();
    writes.sort_by(f64::total_cmp);
    figure("write_latency_p50", percentile(&writes, 0.50), "ms");
    figure("write_latency_p99", percentile(&writes, 0.99), "ms");
    let enqueued = std::mem::take(&mut *enqueued.lock().unwrap());
    // The watcher's and the queue's own share: from the watcher receiving a write's event to
    // the queue enqueueing its key. Signed, as it is; a lease without the watcher's stamp is
    // counted apart.
    let mut own = Vec::new();
    for write in enqueued.iter() {
        match write.observed_at {
            Some(observed) => own.push(signed_ms(write.queued_at, observed)),
            None => tally.unstamped += 1,
        }
    }
    figure("own_unstamped", tally.unstamped as f64, "writes");
    signed_figures("own_latency", own);
    // The same share seen from outside: from an independent watch in this process hearing of
    // the write to its key being enqueued. Signed: where that watch heard last, the sample is
    // negative and stays in. It carries how far apart the apiserver delivers one event to two
    // watches, which two independent watches measure (`observer_spread`).
    let (seen, second_seen) = (
        std::mem::take(&mut *seen.lock().unwrap()),
        std::mem::take(&mut *second_seen.lock().unwrap()),
    );
    let mut outside = Vec::new();
    let mut spread = Vec::new();
    for write in enqueued.iter() {
        let key = (write.name.clone(), write.seq);
        match seen.get(&key) {
            Some(heard) => outside.push(signed_ms(write.queued_at, *heard)),
            None => tally.unseen += 1,
        }
        if let (Some(a), Some(b)) = (seen.get(&key), second_seen.get(&key)) {
            spread.push(signed_ms(*a, *b).abs());
        }
    }
    spread.sort_by(f64::total_cmp);
    figure("own_unseen_by_observer", tally.unseen as f64, "writes");
    signed_figures("own_vs_watch", outside);
    figure("observer_spread_p50", percentile(&spread, 0.50), "ms");
    figure("observer_spread_p99", percentile(&spread, 0.99), "ms");
    // How long a thread of this process that wakes waits for a CPU while the writes run: the
    // delay every hand-off between the watcher's and the queue's threads can meet.
    figure("wakeup_delay_p50", percentile(&wakeups, 0.50), "ms");
    figure("wakeup_delay_p99", percentile(&wakeups, 0.99), "ms");
    // The apiserver's own account of the same writes (its request duration histogram): the
    // share it took longer than 25 ms to handle, past which no event can be enqueued sooner.
    let histogram = apiserver_patch_histogram(plane);
    if let (Some(under), Some(all)) = (histogram.get("0.025"), histogram.get("+Inf")) {
        figure(
            "apiserver_patch_over_25ms",
            100.0 * (all - under) / all,
            "%",
        );
    }
    observer.abort();
    second_observer.abort();
    worker.abort();
    watcher.stop().await;
    queue.stop().await;
    Own::stop(watcher_runtime);
    Own::stop(queue_runtime);
}

/// A service's own Tokio runtime, as a process of its own has.
struct Own;

impl Own {
    /// Starts a service with `start`, on a runtime of its own named `name` unless `shared`
    /// (then on the caller's). The runtime is returned to be stopped with [`Own::stop`].
    async fn start(
        shared: bool,
        name: &str,
        start: impl std::future::Future<Output = InProcess> + Send + 'static,
    ) -> (InProcess, Option<tokio::runtime::Runtime>) {
        if shared {
            return (start.await, None);
        }
        // Worker threads as many as the CPUs, Tokio's default, as in the service's process.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .thread_name(name)
            .enable_all()
            .build()
            .unwrap();
        // Started from a task of that runtime, so that everything the service spawns runs
        // there.
        let service = runtime.spawn(start).await.unwrap();
        (service, Some(runtime))
    }

    /// Stops a runtime from [`Own::start`] once its service has stopped.
    fn stop(runtime: Option<tokio::runtime::Runtime>) {
        if let Some(runtime) = runtime {
            // A runtime cannot be dropped, and so waited for, from a task of another.
            runtime.shutdown_background();
        }
    }
}

/// When an independent watch heard of each write, by ConfigMap name and `seq`.
type Heard = Arc<Mutex<HashMap<(String, u64), SystemTime>>>;

/// When each write's event (its ConfigMap's name and `seq`) reached an independent watch of
/// `maps`, in this process.
fn observe(maps: Api<ConfigMap>) -> (tokio::task::JoinHandle<()>, Heard) {
    let seen: Heard = Arc::default();
    let task = tokio::spawn({
        let seen = seen.clone();
        async move {
            let mut events = std::pin::pin!(kube_watch(maps, kube_watcher::Config::default()));
            while let Some(event) = events.next().await {
                if let Ok(kube_watcher::Event::Apply(cm)) = event {
                    let seq = cm
                        .data
                        .as_ref()
                        .and_then(|d| d.get("seq"))
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    let name = cm.metadata.name.unwrap_or_default();
                    seen.lock().unwrap().insert((name, seq), SystemTime::now());
                }
            }
        }
    });
    (task, seen)
}

/// A thread that sleeps 1 ms at a time while `running`, and returns by how much each sleep
/// overran, in ms: how long a thread of this process that wakes waits for a CPU (the timer's
/// own slack, tens of microseconds, included).
fn wakeup_probe(running: Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<Vec<f64>> {
    std::thread::spawn(move || {
        let mut late = Vec::new();
        while running.load(Ordering::Relaxed) {
            let asked = Duration::from_millis(1);
            let at = Instant::now();
            std::thread::sleep(asked);
            // A sleep never ends early, so nothing is clamped here.
            late.push(at.elapsed().saturating_sub(asked).as_secs_f64() * 1e3);
        }
        late
    })
}

/// A write matched to the lease of its key.
struct Enqueued {
    name: String,
    seq: u64,
    /// When the queue enqueued the key (the lease's `queued_at`).
    queued_at: SystemTime,
    /// When the watcher received the write's event (the lease's `observed_at`).
    observed_at: Option<SystemTime>,
}

/// What the latency run could not match, by why.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    /// Leases of a key with no write waiting for one.
    unmatched_leases: u64,
    /// Leases queued before the waiting write was sent (something else caused them).
    queued_before_sent: u64,
    /// Matched writes whose event the independent watch never reported.
    unseen: u64,
    /// Matched writes whose lease carried no `observed_at` from the watcher.
    unstamped: u64,
    /// Send ticks with every ConfigMap's write still waiting for its lease.
    skipped: u64,
}

/// `<name>_negative` (how many samples are below zero, all of them kept), `<name>_p50` and
/// `<name>_p99` of signed samples in ms.
fn signed_figures(name: &str, mut samples: Vec<f64>) {
    samples.sort_by(f64::total_cmp);
    let negative = samples.iter().filter(|ms| **ms < 0.0).count();
    figure(&format!("{name}_negative"), negative as f64, "samples");
    figure(&format!("{name}_p50"), percentile(&samples, 0.50), "ms");
    figure(&format!("{name}_p99"), percentile(&samples, 0.99), "ms");
}

/// `a - b` in milliseconds, negative when `a` is earlier.
fn signed_ms(a: SystemTime, b: SystemTime) -> f64 {
    match a.duration_since(b) {
        Ok(d) => d.as_secs_f64() * 1e3,
        Err(e) => -e.duration().as_secs_f64() * 1e3,
    }
}

/// Reports the lease done and asks for one more item; false once the stream is gone.
async fn continue_lease(
    tx: &tokio::sync::mpsc::Sender<WorkRequest>,
    item: &switchyard_proto::queue::v1::LeasedItem,
) -> bool {
    let msg = |m| WorkRequest { request: Some(m) };
    let done = Outcome {
        shard: item.shard,
        epoch: item.epoch,
        lease_id: item.lease_id.clone(),
        result: Some(outcome::Result::Done(Done {})),
        duration: None,
        observed: Default::default(),
        namespace_observed: Default::default(),
    };
    tx.send(msg(Msg::Outcome(done))).await.is_ok()
        && tx.send(msg(Msg::Credit(Credit { items: 1 }))).await.is_ok()
}

/// Cumulative counts by upper bound (`le`) of the apiserver's `apiserver_request_duration_seconds`
/// for PATCH of ConfigMaps, read from its `/metrics`.
fn apiserver_patch_histogram(plane: &ControlPlane) -> HashMap<String, f64> {
    let out = plane
        .kubectl()
        .args(["get", "--raw", "/metrics"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("apiserver_request_duration_seconds_bucket{"))
        .filter(|l| l.contains("verb=\"PATCH\"") && l.contains("resource=\"configmaps\""))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let count = l.rsplit(' ').next()?.parse().ok()?;
            Some((le.to_owned(), count))
        })
        .collect()
}

/// Creates `count` Pods bound to `node` in `namespace`, named `<node>-<i>` (kwok makes Pods
/// on its Nodes Running and Ready).
async fn create_pods(client: &Client, namespace: &str, count: usize, node: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    futures::stream::iter(0..count)
        .map(|i| {
            let pods = pods.clone();
            async move {
                let pod: Pod = serde_json::from_value(serde_json::json!({
                    "metadata": {
                        "name": format!("{node}-{i}"),
                        "labels": {"app": "bench", "pod-template-hash": "5d4f8c7b9"},
                        "ownerReferences": [{
                            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "bench-5d4f8c7b9",
                            "uid": "6a1f1a4e-6f5b-4d62-9d3c-1c2b3a4d5e6f", "controller": true,
                            "blockOwnerDeletion": true
                        }]
                    },
                    "spec": {
                        "nodeName": node,
                        "containers": [{
                            "name": "app", "image": "registry.example/app:1.2.3",
                            "ports": [{"containerPort": 8080}],
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}
                        }]
                    }
                }))
                .unwrap();
                pods.create(&PostParams::default(), &pod).await.unwrap();
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
}

async fn memory(plane: &ControlPlane, client: &Client) {
    let ns = TestNamespace::create(plane, client, "bench-memory")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    // kwok makes Pods on its Nodes Running and Ready: typical status, conditions and IPs.
    let share = MEMORY_PODS / plane.nodes().len();
    for node in plane.nodes() {
        create_pods(client, &ns, share, node).await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let count = plane.nodes().len() * share;
    loop {
        let listed = pods.list(&ListParams::default()).await.unwrap();
        let ready = listed
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if ready == count {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Each side stores the Pods once per round, the side that goes first alternating; each
    // figure is the median of its rounds.
    let sides = [("switchyard", Side::Switchyard), ("kube_rs", Side::KubeRs)];
    let mut figures: BTreeMap<&str, Vec<Heap>> = BTreeMap::new();
    for (_, side) in switchyard_testenv::alternating(&sides, switchyard_testenv::bench_rounds()) {
        for (name, heap) in side.store(client, &ns, count).await {
            figures.entry(name).or_default().push(heap);
        }
    }

    // What a fieldChanged predicate costs the watcher per event of its kind: the object's
    // JSON parsed and the named value hashed, beside what every event costs already (the
    // summary and the JSON the cache keeps).
    let listed: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &switchyard_k8s::kube::api::ApiResource::erase::<Pod>(&()),
    );
    let objects = listed.list(&ListParams::default()).await.unwrap().items;
    let pointers: Vec<Arc<str>> = vec![Arc::from("/status/phase")];
    let (mut summarizing, mut hashing) = (Vec::new(), Vec::new());
    for _ in 0..switchyard_testenv::bench_rounds() {
        let copies = objects.clone();
        let start = Instant::now();
        let summarized: Vec<_> = copies.into_iter().map(summarize).collect();
        summarizing.push(start.elapsed().as_secs_f64() * 1e6 / objects.len() as f64);
        let start = Instant::now();
        for (summary, json) in summarized {
            let object: serde_json::Value = serde_json::from_slice(&json).unwrap();
            std::hint::black_box(summary.with_fields(&pointers, &object));
        }
        hashing.push(start.elapsed().as_secs_f64() * 1e6 / objects.len() as f64);
    }
    eprintln!("memory: µs per Pod: summary {summarizing:?}, field predicate {hashing:?}");
    figure(
        "summary_us_per_pod",
        switchyard_testenv::median(summarizing).expect("a round"),
        "us",
    );
    figure(
        "field_predicate_us_per_pod",
        switchyard_testenv::median(hashing).expect("a round"),
        "us",
    );

    eprintln!("memory: {count} Running kwok Pods");
    for (name, heaps) in figures {
        eprintln!("memory: {name} per round: {heaps:?}");
        let per_pod = |bytes: fn(&Heap) -> usize| {
            let runs = heaps
                .iter()
                .map(|h| bytes(h) as f64 / count as f64)
                .collect();
            switchyard_testenv::median(runs).expect("a round")
        };
        figure(name, per_pod(|h| h.usable), "bytes");
        figure(
            &format!("{name}_requested"),
            per_pod(|h| h.requested),
            "bytes",
        );
    }
}

/// Who stores the Pods in the memory comparison.
#[derive(Clone, Copy)]
enum Side {
    /// The watcher's cache.
    Switchyard,
    /// kube-rs as its users run it: a watcher feeding a reflector.
    KubeRs,
}

impl Side {
    /// What this side's store holds for the namespace's `count` Pods, whole and metadata
    /// only, by figure name.
    async fn store(self, client: &Client, ns: &str, count: usize) -> [(&'static str, Heap); 2] {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let meta: Api<PartialObjectMeta<Pod>> = Api::namespaced(client.clone(), ns);
        match self {
            Self::Switchyard => {
                let full: Api<DynamicObject> = Api::namespaced_with(
                    client.clone(),
                    ns,
                    &switchyard_k8s::kube::api::ApiResource::erase::<Pod>(&()),
                );
                let objects = full.list(&ListParams::default()).await.unwrap().items;
                let mut store = Store::default();
                for object in objects {
                    let (summary, json) = summarize(object);
                    store.apply(summary, json);
                }
                let full_bytes = held(store);
                let objects = meta
                    .list_metadata(&ListParams::default())
                    .await
                    .unwrap()
                    .items;
                let mut store = Store::default();
                for object in objects {
                    let (summary, json) = summarize(object);
                    store.apply(summary, json);
                }
                [
                    ("bytes_per_pod_full", full_bytes),
                    ("bytes_per_pod_meta", held(store)),
                ]
            }
            // `managedFields` stripped on the way in, as the watcher's cache strips them.
            Self::KubeRs => [
                (
                    "reflector_bytes_per_pod_full",
                    reflector_held(
                        kube_watch(pods, kube_watcher::Config::default())
                            .modify(|pod| pod.metadata.managed_fields = None),
                        count,
                    )
                    .await,
                ),
                (
                    "reflector_bytes_per_pod_meta",
                    // What kube-rs's `metadata_watcher` was; kube 5 deprecates it for a
                    // `watcher` of an `Api<PartialObjectMeta<_>>`, which makes the same
                    // metadata-only requests.
                    reflector_held(
                        kube_watch(meta, kube_watcher::Config::default())
                            .modify(|meta| meta.metadata.managed_fields = None),
                        count,
                    )
                    .await,
                ),
            ],
        }
    }
}

/// What a kube-rs reflector's store holds once `events` (a kube-rs watcher) has given it its
/// initial list of `count` objects. The watch is dropped first, so only the store is counted.
async fn reflector_held<K>(
    events: impl futures::Stream<Item = kube_watcher::Result<kube_watcher::Event<K>>>,
    count: usize,
) -> Heap
where
    K: reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    let (reader, writer) = reflector::store::<K>();
    let mut feed = Box::pin(reflector::reflector(writer, events.default_backoff()));
    tokio::select! {
        ready = reader.wait_until_ready() => ready.unwrap(),
        () = async { while feed.next().await.is_some() {} } => panic!("the watch ended"),
    }
    drop(feed);
    assert_eq!(reader.len(), count);
    let heap = held(reader);
    // Zero would mean something still holds the store (the watch was not dropped).
    assert!(heap.requested > 0, "the reflector's store was not freed");
    heap
}

async fn list_50k(plane: &ControlPlane, client: &Client) {
    let ns = TestNamespace::create(plane, client, "bench-list")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let start = Instant::now();
    // Bound to a Node no kwok manages, so 50,000 status updates do not load the machine.
    create_pods(client, &ns, LIST_PODS, "unmanaged-node").await;
    eprintln!(
        "list: created {LIST_PODS} Pods in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let queue = queue().await;
    let config = format!(
        "shardCount: {SHARDS}\nnamespaces: {{include: [{ns}]}}\nresources:\n  - {{apiVersion: v1, kind: Pod}}\n"
    );
    let start = Instant::now();
    let watcher = watcher(
        plane.kubeconfig().to_owned(),
        config,
        queue.grpc().to_string(),
    )
    .await;
    until_ready(&watcher).await;
    figure("list_50k", start.elapsed().as_secs_f64(), "s");
    watcher.stop().await;
    queue.stop().await;
}
