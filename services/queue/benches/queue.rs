//! `make bench-queue`: the queue's figures, each printed as `bench queue.<figure> <value> <unit>`.
//!
//! - `core_ops`: the in-process core alone (add, lease, done), the ceiling of the service;
//! - `core_keys`, `core_keys_client_go`: the same run in keys per second (each key added,
//!   leased and done), beside client-go's own work queue (`workqueue.Typed`: Add, Get, Done)
//!   doing the same in the Go program `benches/workqueue-go`, which the benchmark builds from
//!   the Go module proxy into the target directory; `core_keys_vs_client_go` is the ratio;
//!   three rounds, the side that runs first alternating, each figure their median;
//! - `bytes_per_key`: heap bytes per queued key, 1,000,000 keys with 40-character names;
//!   heap here (and below) is what the allocator holds, each block's usable size
//!   (`malloc_usable_size`), not the size asked for, which earlier runs counted;
//! - `history_bytes_per_key`, `history_bytes_per_failed_key`: heap bytes per key whose latest
//!   outcome the replica remembers for `DescribeKey` (`--outcome-history`, 100,000 keys),
//!   once a key is done (with a trace id) and once it failed with a 120-byte error: the
//!   queue's retained bytes with the history minus without it, over the same work;
//! - `e2e_throughput`: enqueue -> lease -> done through one replica over loopback gRPC in
//!   plaintext (`--insecure-plaintext`), with batched enqueues and credit-based workers;
//! - `lease_latency_p50` / `lease_latency_p99`: enqueue to lease at a steady 10,000 keys/s,
//!   in plaintext;
//! - `e2e_throughput_mtls`, `lease_latency_p50_mtls`, `lease_latency_p99_mtls`: the same over
//!   mutual TLS, as every internal connection is by default; `*_mtls_cost` is its cost in
//!   percent of the plaintext figure.
//!
//! Plaintext and mutual TLS alternate, `ROUNDS` runs each in one process; each figure is the
//! median of its runs, and every run is printed on stderr.
//!
//! The queue reads the standard `OTEL_*` variables as the service does: with
//! `OTEL_EXPORTER_OTLP_ENDPOINT` set it exports traces. `SWITCHYARD_BENCH_TRACE_CONTEXT=1`
//! gives every enqueued key a sampled W3C trace context of its own, as a traced watcher sends
//! them, so the queue makes an enqueue and a lease span per key.

#![allow(clippy::unwrap_used)]

use std::{
    alloc::{GlobalAlloc, Layout, System},
    collections::HashMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use switchyard_proto::{
    common::v1::WorkKey as ProtoKey,
    queue::v1::{
        Credit, Done, EnqueueItem, EnqueueRequest, Outcome as ProtoOutcome, WorkRequest,
        WorkerHello, outcome, queue_client::QueueClient, work_request::Request as Msg,
        work_response::Response as Reply,
    },
};
use switchyard_queue_core::{Outcome, Priority, Queue, QueueConfig, WorkKey, shard::shard_of};
use switchyard_runtime::Role;
use switchyard_testenv::Pki;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Forwards to the system allocator (glibc's malloc) and counts the live heap as the allocator
/// holds it: each block's usable size (`malloc_usable_size`, size-class rounding included),
/// not the size asked for.
struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

/// The usable size of a block the system allocator handed out.
///
/// # Safety
///
/// `ptr` must be a live block from `System` (glibc's `malloc` family).
#[allow(unsafe_code)]
unsafe fn usable(ptr: *mut u8) -> usize {
    // SAFETY: the caller's contract; glibc reads the size from the block's header.
    unsafe { libc::malloc_usable_size(ptr.cast()) }
}

// SAFETY: forwards to the system allocator and only counts bytes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            // SAFETY: `ptr` was just allocated by `System`.
            ALLOCATED.fetch_add(unsafe { usable(ptr) }, Ordering::Relaxed);
        }
        ptr
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` is live until the `dealloc` below.
        ALLOCATED.fetch_sub(unsafe { usable(ptr) }, Ordering::Relaxed);
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
            ALLOCATED.fetch_add(unsafe { usable(new) }, Ordering::Relaxed);
            ALLOCATED.fetch_sub(old, Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const RS: &str = "apps/v1/ReplicaSet";
const SHARDS: u32 = 256;
const NAMESPACE: &str = "default";

fn name(i: usize) -> String {
    // 40 characters, like a generated Pod or ReplicaSet name.
    format!("{:0>40}", format!("web-7d4b9c8f5d-{i}"))
}

fn core_queue(capacity: usize) -> Queue {
    switchyard_queue::serving_queue(
        QueueConfig {
            shard_count: SHARDS,
            capacity,
            ..Default::default()
        },
        &[RS],
        true,
    )
}

/// `n` keys as a watcher holds them: the controller and namespace shared, each name's text
/// assembled in reused buffers and copied once into the key, so that building the keys
/// leaves no freed block per key in the heap for the measured loop's allocations to sort.
fn keys(n: usize) -> Vec<WorkKey> {
    use std::fmt::Write as _;
    let (controller, namespace): (Arc<str>, Arc<str>) = (RS.into(), NAMESPACE.into());
    let (mut short, mut padded) = (String::new(), String::new());
    (0..n)
        .map(|i| {
            short.clear();
            padded.clear();
            write!(short, "web-7d4b9c8f5d-{i}").unwrap();
            write!(padded, "{short:0>40}").unwrap();
            debug_assert_eq!(padded, name(i));
            WorkKey::new(controller.clone(), namespace.clone(), padded.as_str())
        })
        .collect()
}

/// Keys the core figures move through add, lease and done, in both queues.
const CORE_KEYS: usize = 1_000_000;

/// Rounds of the core comparison: each runs both queues, the side that goes first
/// alternating, so that neither always meets a warmer (or more loaded) machine.
const CORE_ROUNDS: usize = 3;

/// `core_ops` and `core_keys`, and `core_keys_client_go` from the Go program: one thread
/// drives each queue, all keys added first, then each leased (taken) and done in turn. Each
/// figure is the median of [`CORE_ROUNDS`] rounds (every run printed on stderr); the ratio is
/// the median of the rounds' own ratios.
fn bench_core() {
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut ratios = Vec::new();
    for round in 0..CORE_ROUNDS {
        let (core, client_go) = if round % 2 == 0 {
            let core = core_keys_per_second();
            (core, client_go_keys_per_second())
        } else {
            let client_go = client_go_keys_per_second();
            (core_keys_per_second(), client_go)
        };
        let first = if round % 2 == 0 { "core" } else { "client-go" };
        eprintln!(
            "core round {round} ({first} first): core {core:.0} keys/s, client-go {client_go:.0} keys/s"
        );
        ours.push(core);
        theirs.push(client_go);
        ratios.push(core / client_go);
    }
    let keys_per_second = median(ours);
    println!("bench queue.core_ops {:.0} ops/s", 3.0 * keys_per_second);
    println!("bench queue.core_keys {keys_per_second:.0} keys/s");
    println!(
        "bench queue.core_keys_client_go {:.0} keys/s",
        median(theirs)
    );
    println!("bench queue.core_keys_vs_client_go {:.2} x", median(ratios));
}

/// Keys per second through the core: add (each key validated first), lease, done.
fn core_keys_per_second() -> f64 {
    const N: usize = CORE_KEYS;
    let keys = keys(N);
    let mut queue = core_queue(N);
    let space = queue.key_space().clone();
    let now = Instant::now();
    let start = Instant::now();
    // Each add validates its key, as the gRPC edge does before the core sees it.
    for k in &keys {
        let k = space.validate(k).unwrap();
        queue
            .add(&k, Priority::Normal, Duration::ZERO, now)
            .unwrap();
    }
    let mut done = 0;
    while let Some(lease) = queue.lease(1, &[], now) {
        queue
            .complete(1, lease.shard(), lease.epoch, lease.id, Outcome::Done, now)
            .unwrap();
        done += 1;
    }
    assert_eq!(done, N);
    N as f64 / start.elapsed().as_secs_f64()
}

/// Where the Go program is built: beside the benchmark's profile directory in the target
/// directory (`target/release/workqueue-go`), so `cargo clean` removes it too; Go's own
/// build and module caches make a second build take about a second.
fn client_go_build_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // <target>/<profile>/deps/queue-<hash>
    let profile = exe.ancestors().nth(2).unwrap();
    profile.join("workqueue-go")
}

/// Keys per second through client-go's work queue: builds `benches/workqueue-go` (its
/// `go.mod` and `go.sum` pin client-go) with the local Go toolchain, as
/// `scripts/testenv.sh` builds the control plane, and runs it over [`CORE_KEYS`] keys.
fn client_go_keys_per_second() -> f64 {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/workqueue-go");
    let binary = client_go_build_dir().join("workqueue-bench");
    let built = Command::new("go")
        .args(["build", "-trimpath", "-buildvcs=false", "-o"])
        .arg(&binary)
        .arg(".")
        .current_dir(&source)
        // The checked-in go.sum pins every module: a build never rewrites go.mod.
        .env("GOFLAGS", "-mod=readonly")
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0")
        .status()
        .unwrap_or_else(|error| {
            panic!("queue.core_keys_client_go needs Go 1.25 or newer on PATH: {error}")
        });
    assert!(built.success(), "building {} failed", source.display());
    let output = Command::new(&binary)
        .arg(CORE_KEYS.to_string())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{} failed: {}",
        binary.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn bench_memory() {
    const N: usize = 1_000_000;
    let keys = keys(N);
    let mut queue = core_queue(N);
    let space = queue.key_space().clone();
    let now = Instant::now();
    let before = ALLOCATED.load(Ordering::Relaxed);
    for k in &keys {
        let k = space.validate(k).unwrap();
        queue
            .add(&k, Priority::Normal, Duration::ZERO, now)
            .unwrap();
    }
    let bytes = ALLOCATED.load(Ordering::Relaxed) - before;
    let key_len = NAMESPACE.len() + 1 + 40;
    println!("bench queue.bytes_per_key {} bytes", bytes / N);
    println!(
        "bench queue.bytes_per_key_overhead {} bytes",
        bytes / N - key_len
    );
    drop(queue);
}

/// Heap bytes a queue keeps after `n` keys were added, leased and answered with `outcome`
/// (and `error`), with an outcome history of `history` keys.
fn retained_after(
    keys: &[WorkKey],
    history: usize,
    outcome: Outcome,
    error: Option<&str>,
) -> usize {
    let n = keys.len();
    let before = ALLOCATED.load(Ordering::Relaxed);
    let mut queue = core_queue(n).with_outcome_history(history);
    let space = queue.key_space().clone();
    let now = Instant::now();
    let cause: switchyard_queue_core::Cause = Arc::from(vec![(
        "traceparent".to_owned(),
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
    )]);
    for k in keys {
        let k = space.validate(k).unwrap();
        queue
            .add_caused(
                &k,
                Priority::Normal,
                Duration::ZERO,
                switchyard_queue_core::Origin::traced(cause.clone()),
                now,
            )
            .unwrap();
        let lease = queue.lease(1, &[], now).unwrap();
        queue
            .complete_with_error(1, lease.shard(), lease.epoch, lease.id, outcome, error, now)
            .unwrap();
    }
    let retained = ALLOCATED.load(Ordering::Relaxed) - before;
    drop(queue);
    retained
}

fn bench_history_memory() {
    const N: usize = switchyard_queue_core::DEFAULT_OUTCOME_HISTORY;
    let keys = keys(N);
    let error = "x".repeat(120);
    for (figure, outcome, error) in [
        ("history_bytes_per_key", Outcome::Done, None),
        (
            "history_bytes_per_failed_key",
            Outcome::Failed,
            Some(error.as_str()),
        ),
    ] {
        let without = retained_after(&keys, 0, outcome, error);
        let with = retained_after(&keys, N, outcome, error);
        println!(
            "bench queue.{figure} {} bytes",
            with.saturating_sub(without) / N
        );
    }
}

/// How the benchmark's clients reach the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Link {
    Plaintext,
    Mtls,
}

impl Link {
    fn suffix(self) -> &'static str {
        match self {
            Link::Plaintext => "",
            Link::Mtls => "_mtls",
        }
    }
}

/// Runs of each link per figure, alternating.
const ROUNDS: usize = 3;

async fn server(link: Link) -> (SocketAddr, switchyard_runtime::ShutdownHandle) {
    let security = match link {
        Link::Plaintext => vec!["--insecure-plaintext".to_owned()],
        Link::Mtls => Pki::shared().flags(Role::Queue),
    };
    let flags = [
        "--log-level=warn".to_owned(),
        "--queue-capacity=2000000".into(),
    ]
    .into_iter()
    .chain(security);
    let (rt, addr) = switchyard_queue::Args::start_local(SHARDS, &[RS], flags)
        .await
        .unwrap();
    let shutdown = rt.shutdown_handle();
    tokio::spawn(rt.run());
    (addr, shutdown)
}

/// A client of the queue at `addr`: over mutual TLS as `role` (a watcher enqueues, a
/// reconciler works), or in plaintext.
async fn client(
    link: Link,
    role: Role,
    addr: SocketAddr,
) -> QueueClient<tonic::transport::Channel> {
    let dialer = match link {
        Link::Plaintext => switchyard_runtime::Dialer::plaintext(),
        Link::Mtls => Pki::shared().dialer(role),
    };
    let endpoint = dialer.endpoint(&addr.to_string(), Role::Queue).unwrap();
    QueueClient::new(dialer.connect(&endpoint, Role::Queue).await.unwrap())
}

/// Batches of keys that all hash to one shard, as a watcher routes them.
fn batches(range: std::ops::Range<usize>, batch: usize) -> Vec<EnqueueRequest> {
    let traced = std::env::var_os("SWITCHYARD_BENCH_TRACE_CONTEXT").is_some();
    let mut by_shard: HashMap<u32, Vec<EnqueueItem>> = HashMap::new();
    let mut out = Vec::new();
    for i in range {
        let name = name(i);
        let shard = shard_of(RS, NAMESPACE, &name, SHARDS);
        let items = by_shard.entry(shard).or_default();
        let trace_context = if traced {
            let id = i as u64 + 1;
            HashMap::from([(
                "traceparent".to_owned(),
                format!("00-{id:032x}-{id:016x}-01"),
            )])
        } else {
            HashMap::new()
        };
        items.push(EnqueueItem {
            key: Some(ProtoKey {
                controller: RS.into(),
                namespace: NAMESPACE.into(),
                name,
            }),
            trace_context,
            ..Default::default()
        });
        if items.len() == batch {
            out.push(EnqueueRequest {
                batch_id: out.len() as u64,
                shard,
                items: std::mem::take(items),
            });
        }
    }
    for (shard, items) in by_shard {
        if !items.is_empty() {
            out.push(EnqueueRequest {
                batch_id: out.len() as u64,
                shard,
                items,
            });
        }
    }
    out
}

/// A worker that answers Done to every item and grants credits back in chunks; calls
/// `on_item` with each item's key name. Returns when `total` items were answered.
async fn worker(
    link: Link,
    addr: SocketAddr,
    credits: u32,
    mut on_item: impl FnMut(&str) + Send + 'static,
    stop: Arc<AtomicUsize>,
    total: usize,
) {
    let mut client = client(link, Role::Reconciler, addr).await;
    let (tx, rx) = mpsc::channel(4096);
    tx.send(WorkRequest {
        request: Some(Msg::Hello(WorkerHello::default())),
    })
    .await
    .unwrap();
    tx.send(WorkRequest {
        request: Some(Msg::Credit(Credit { items: credits })),
    })
    .await
    .unwrap();
    let mut inbound = client
        .work(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut owed = 0;
    while stop.load(Ordering::Relaxed) < total {
        let Ok(Ok(Some(message))) =
            tokio::time::timeout(Duration::from_millis(200), inbound.message()).await
        else {
            continue;
        };
        if let Some(Reply::Item(item)) = message.response {
            on_item(&item.key.as_ref().unwrap().name);
            tx.send(WorkRequest {
                request: Some(Msg::Outcome(ProtoOutcome {
                    shard: item.shard,
                    epoch: item.epoch,
                    lease_id: item.lease_id,
                    result: Some(outcome::Result::Done(Done {})),
                    duration: None,
                    observed: Default::default(),
                    namespace_observed: Default::default(),
                })),
            })
            .await
            .unwrap();
            stop.fetch_add(1, Ordering::Relaxed);
            owed += 1;
            if owed >= credits / 4 {
                tx.send(WorkRequest {
                    request: Some(Msg::Credit(Credit { items: owed })),
                })
                .await
                .unwrap();
                owed = 0;
            }
        }
    }
}

/// Keys per second through one replica.
async fn e2e_run(link: Link) -> f64 {
    const N: usize = 400_000;
    const WORKERS: usize = 2;
    let (addr, shutdown) = server(link).await;
    let requests = batches(0..N, 1000);
    let done = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..WORKERS {
        tasks.push(tokio::spawn(worker(
            link,
            addr,
            2000,
            |_| {},
            done.clone(),
            N,
        )));
    }
    let mut producer = client(link, Role::Watcher, addr).await;
    let (tx, rx) = mpsc::channel(8);
    let acks = tokio::spawn(async move {
        let mut acks = producer
            .enqueue_stream(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        while acks.message().await.unwrap().is_some() {}
    });
    for request in requests {
        tx.send(request).await.unwrap();
    }
    drop(tx);
    acks.await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let rate = N as f64 / start.elapsed().as_secs_f64();
    shutdown.trigger();
    rate
}

fn median(mut runs: Vec<f64>) -> f64 {
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

/// Runs `run` for each link, alternating, and prints the median of each and the cost of
/// mutual TLS; `higher_is_better` says which way the cost points.
async fn side_by_side<F, Fut>(figures: &[(&str, &str, bool)], run: F)
where
    F: Fn(Link) -> Fut,
    Fut: std::future::Future<Output = Vec<f64>>,
{
    let mut runs: HashMap<(Link, usize), Vec<f64>> = HashMap::new();
    for round in 0..ROUNDS {
        for link in [Link::Plaintext, Link::Mtls] {
            let values = run(link).await;
            eprintln!("round {round} {link:?}: {values:?}");
            for (i, value) in values.into_iter().enumerate() {
                runs.entry((link, i)).or_default().push(value);
            }
        }
    }
    for (i, (name, unit, higher_is_better)) in figures.iter().enumerate() {
        let plain = median(runs[&(Link::Plaintext, i)].clone());
        let mtls = median(runs[&(Link::Mtls, i)].clone());
        for (link, value) in [(Link::Plaintext, plain), (Link::Mtls, mtls)] {
            println!("bench queue.{name}{} {value:.3} {unit}", link.suffix());
        }
        let cost = if *higher_is_better {
            (plain - mtls) / plain
        } else {
            (mtls - plain) / plain
        };
        println!("bench queue.{name}_mtls_cost {:.1} %", cost * 100.0);
    }
}

async fn bench_e2e() {
    side_by_side(&[("e2e_throughput", "keys/s", true)], |link| async move {
        vec![e2e_run(link).await]
    })
    .await;
}

async fn bench_latency() {
    side_by_side(
        &[
            ("lease_latency_p50", "ms", false),
            ("lease_latency_p99", "ms", false),
        ],
        latency_run,
    )
    .await;
}

/// Enqueue-to-lease latency at a steady rate: p50 and p99 in ms.
async fn latency_run(link: Link) -> Vec<f64> {
    const RATE: usize = 10_000;
    const SECONDS: usize = 5;
    const TICK: Duration = Duration::from_millis(1);
    let total = RATE * SECONDS;
    let (addr, shutdown) = server(link).await;
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let done = Arc::new(AtomicUsize::new(0));
    let on_item = {
        let sent = sent.clone();
        let latencies = latencies.clone();
        move |name: &str| {
            if let Some(at) = sent.lock().unwrap().remove(name) {
                latencies.lock().unwrap().push(at.elapsed());
            }
        }
    };
    let worker = tokio::spawn(worker(link, addr, 1000, on_item, done.clone(), total));
    // 10 keys each millisecond, each tick's keys from one shard (one batch).
    let per_tick = RATE / 1000;
    let requests = batches(10_000_000..10_000_000 + total, per_tick);
    let mut client = client(link, Role::Watcher, addr).await;
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for request in requests {
        ticker.tick().await;
        {
            let mut sent = sent.lock().unwrap();
            let now = Instant::now();
            for item in &request.items {
                sent.insert(item.key.as_ref().unwrap().name.clone(), now);
            }
        }
        client.enqueue(request).await.unwrap();
    }
    worker.await.unwrap();
    let mut latencies = std::mem::take(&mut *latencies.lock().unwrap());
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    shutdown.trigger();
    vec![at(0.50).as_secs_f64() * 1e3, at(0.99).as_secs_f64() * 1e3]
}

fn main() {
    // `cargo bench` passes --bench; a figure name filters.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    // The core figures come from one run of each queue, side by side.
    if ["core_ops", "core_keys", "core_keys_client_go"]
        .iter()
        .any(|figure| wanted(figure))
    {
        bench_core();
    }
    if wanted("bytes_per_key") {
        bench_memory();
    }
    if wanted("history_bytes_per_key") {
        bench_history_memory();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if wanted("e2e_throughput") {
        runtime.block_on(bench_e2e());
    }
    if wanted("lease_latency") {
        runtime.block_on(bench_latency());
    }
}
