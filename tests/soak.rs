//! Soak: Deployments are rolled out, scaled, deleted and created without pause while a chaos
//! loop injects every fault Switchyard claims to survive, one at a time, and measures how
//! long each takes to heal. Invariants are checked all along; figures are printed at the end
//! as `bench soak.<figure> <value> <unit>` lines.
//!
//! ```text
//!   workload ── rollouts, scales, deletes+creates ──► kube-apiserver ◄── Pod watch: surge and
//!                                                        │               unavailability samples
//!   chaos ─┬─ kill -9 + restart: a queue, a reconciler, the watcher, an elector
//!          ├─ SIGSTOP a queue for twice the member TTL, then SIGCONT
//!          ├─ cut queue-2 (in its own network namespace) from etcd, not from its workers
//!          └─ restart kube-apiserver; restart the elector's etcd
//!   at the end: every Deployment converged, no shard served twice (the queues' logs)
//! ```
//!
//! Every Switchyard service runs as its own process over mutual TLS, with a real etcd for
//! the elector and the queues, on this test binary's own control plane (it restarts the
//! apiserver). No kube-controller-manager runs: Switchyard's own garbage collector deletes the
//! ReplicaSets and Pods of deleted Deployments.
//!
//! queue-2 runs inside a network namespace joined to the root one by a veth pair
//! (`switchyard_testenv::NetNs`): it reaches the elector at the veth's root end and etcd at a
//! second root address, which a blackhole route inside the namespace cuts; the watcher and
//! the reconcilers reach it at the namespace's end. Needs root (CAP_NET_ADMIN) and `ip`.
//!
//! Invariants, checked all along and asserted at the end:
//! - every Deployment converges (status at its generation, all replicas updated and
//!   available, as many active Pods; every ReplicaSet at its generation and size, none left
//!   of a deleted Deployment): `soak.keys_lost` counts the objects that did not;
//! - no shard served by two replicas at once (`soak.double_served_ms`), from the serve
//!   intervals in the queues' logs; a frozen replica serves nothing while frozen, and what
//!   it logs in the moment after SIGCONT is counted apart (`soak.overlap_after_resume_us`);
//! - the ReplicaSets of a Deployment are never sized above replicas + maxSurge together
//!   (`soak.surge_violations`, from a ReplicaSet watch; after a scale-down, the old size
//!   counts until the Deployment settles). Active Pods above that bound
//!   (`soak.pod_surge_samples`) and ready Pods below replicas - maxUnavailable once a
//!   Deployment settled (`soak.unavailable_violations`), from a Pod watch, are printed, not
//!   asserted: kube-controller-manager shows transient Pod surges too (a scaled-down
//!   ReplicaSet's Pods go after the other's new ones are made). The three watches are
//!   separate streams, one of which may be behind another (relisting after an apiserver
//!   restart): a view of the ReplicaSets or the Pods older than the Deployment that
//!   settled is held to the bounds before it.
//!
//! `SWITCHYARD_SOAK_PEER=kube-controller-manager` runs the same workload with
//! kube-controller-manager's deployment, replicaset and garbage-collector controllers in
//! Switchyard's place (faults: apiserver and controller-manager restarts), printing the same
//! figures as `soak.kcm_*` and asserting only convergence.
//!
//! By default (`make test`) the chaos loop injects every fault once, in a random order, and
//! the whole test is bounded by 300 s. `SWITCHYARD_SOAK_SECONDS` runs rounds of faults
//! instead until that time is nearly up, start-up and final convergence included; `make soak`
//! runs it for 1,380. The seed of every random choice is printed and can be set with
//! `SWITCHYARD_SOAK_SEED`.

#![allow(clippy::unwrap_used)]

use std::{
    collections::{BTreeMap, HashMap},
    net::{SocketAddr, TcpListener},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use rand::{Rng, SeedableRng, rngs::StdRng, seq::IndexedRandom, seq::SliceRandom};
use serde_json::json;
use switchyard_k8s::{
    Api, DeleteParams, Deployment, ListParams, Pod, PostParams, ReplicaSet,
    kube::{
        Client,
        api::{Patch, PatchParams},
    },
};
use switchyard_testenv::{ControlPlane, Etcd, NetNs, TestNamespace, manifests};
use switchyard_tests::service_binary;

#[path = "soak/fleet.rs"]
mod fleet;
#[path = "soak/invariants.rs"]
mod invariants;
#[path = "soak/serving.rs"]
mod serving;

use fleet::{Fleet, Spec, served};
use invariants::{Invariants, watch_invariants};
use serving::{Overlaps, double_served};

const SHARDS: u32 = 16;
const MAX_SURGE: i32 = 1;
const MAX_UNAVAILABLE: i32 = 1;
/// Deployments alive at any time (each delete is followed by a create under a new name).
const LIVE: usize = 12;
/// The most replicas a Deployment is scaled to: 12 × 5 Pods keep kwok and the scheduler
/// well inside two cores.
const MAX_REPLICAS: i32 = 5;
const DEFAULT_SECONDS: u64 = 300;
/// The queues' member TTL (their default): a paused or partitioned replica must have
/// stopped serving by then.
const MEMBER_TTL: Duration = Duration::from_secs(2);
/// How long a queue stays frozen: twice the TTL, so its lease surely expires.
const PAUSE: Duration = Duration::from_secs(2 * MEMBER_TTL.as_secs());
/// How long queue-2 stays cut from etcd: three TTLs, so it rejoins as a new member.
const PARTITION: Duration = Duration::from_secs(3 * MEMBER_TTL.as_secs());
/// One workload change every so often: about 80 a minute keeps every controller busy.
const WORKLOAD_PERIOD: Duration = Duration::from_millis(750);
/// Kept at the end of the run for the final convergence and the teardown: after an
/// apiserver restart near the end, convergence took up to 45 s.
const RESERVE: Duration = Duration::from_secs(75);
/// Kept at the very end for stopping every process.
const TEARDOWN: Duration = Duration::from_secs(20);
/// A fault longer than this to heal fails the test: every recovery here takes seconds.
const RECOVERY_BOUND: Duration = Duration::from_secs(60);
/// Two apiserver restarts at least this far apart: list/watch clients (kube-runtime's
/// default backoff, 0.8 s doubling to 30 s) reset their backoff only after 120 s of health,
/// so restarts closer together are a flapping apiserver, another fault than a restart.
const APISERVER_SPACING: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Fault {
    QueueKill,
    QueuePause,
    QueuePartition,
    ReconcilerKill,
    WatcherKill,
    ElectorKill,
    ApiserverRestart,
    EtcdRestart,
    /// The peer's only process, kube-controller-manager, stopped and started again.
    ControllerManagerRestart,
}

/// The faults of the run with kube-controller-manager in Switchyard's place.
const PEER_FAULTS: [Fault; 2] = [Fault::ApiserverRestart, Fault::ControllerManagerRestart];
/// What kube-controller-manager runs when it is the peer.
const KCM_CONTROLLERS: &[&str] = &[
    "deployment-controller",
    "replicaset-controller",
    "garbage-collector-controller",
];

impl Fault {
    const ALL: [Fault; 8] = [
        Fault::QueueKill,
        Fault::QueuePause,
        Fault::QueuePartition,
        Fault::ReconcilerKill,
        Fault::WatcherKill,
        Fault::ElectorKill,
        Fault::ApiserverRestart,
        Fault::EtcdRestart,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::QueueKill => "queue_kill",
            Fault::QueuePause => "queue_pause",
            Fault::QueuePartition => "queue_partition",
            Fault::ReconcilerKill => "reconciler_kill",
            Fault::WatcherKill => "watcher_kill",
            Fault::ElectorKill => "elector_kill",
            Fault::ApiserverRestart => "apiserver_restart",
            Fault::EtcdRestart => "etcd_restart",
            Fault::ControllerManagerRestart => "kcm_restart",
        }
    }

    /// What its recovery time measures (printed once, beside the figures).
    fn until(self) -> &'static str {
        match self {
            Fault::QueueKill | Fault::QueuePause | Fault::QueuePartition => {
                "from the fault until the other queue replicas serve every shard once"
            }
            Fault::ReconcilerKill | Fault::WatcherKill => {
                "from the kill until the restarted process is ready (the watcher: lists done)"
            }
            Fault::ElectorKill => {
                "from the kill until the restarted elector is ready and an elector leads"
            }
            Fault::ApiserverRestart => {
                "from the apiserver being ready again until a canary scale is reconciled"
            }
            Fault::EtcdRestart => {
                "from the kill until etcd is back and every shard is served once again"
            }
            Fault::ControllerManagerRestart => {
                "from the stop until a canary scale is reconciled by the new process"
            }
        }
    }
}

/// Polls `done` every 100 ms until it holds; how long that took, or `None` after `bound`.
async fn until<F, Fut>(bound: Duration, mut done: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < bound {
        if done().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

// ---------------------------------------------------------------------------------------
// The workload.

fn deployment(name: &str, replicas: i32) -> Deployment {
    let strategy = json!({"strategy": {"type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": MAX_SURGE, "maxUnavailable": MAX_UNAVAILABLE}}});
    manifests::deployment(name, replicas, strategy)
}

/// One change a tick: roll out a new image, scale, or delete one Deployment and create
/// another. A write refused while the apiserver is away is counted and skipped.
async fn workload(
    api: Api<Deployment>,
    invariants: Arc<Mutex<Invariants>>,
    mut live: Vec<String>,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> (u64, u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut changes, mut refused) = (0u64, 0u64);
    let mut next = live.len();
    let mut version = 1;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(WORKLOAD_PERIOD).await;
        let name = live.choose(&mut rng).unwrap().clone();
        let result = match rng.random_range(0..10) {
            0..4 => {
                version += 1;
                invariants
                    .lock()
                    .unwrap()
                    .note(&name, &format!("image {version}"));
                let rollout = json!({"spec": {"template": {"spec": {"containers": [
                    {"name": "c", "image": format!("registry.example/app:{version}")}
                ]}}}});
                api.patch(&name, &PatchParams::default(), &Patch::Strategic(rollout))
                    .await
                    .map(drop)
            }
            4..8 => {
                let replicas = rng.random_range(1..=MAX_REPLICAS);
                invariants.lock().unwrap().scaling(&name, replicas);
                invariants
                    .lock()
                    .unwrap()
                    .note(&name, &format!("scale {replicas}"));
                let scale = json!({"spec": {"replicas": replicas}});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(scale))
                    .await
                    .map(drop)
            }
            _ => {
                invariants.lock().unwrap().forget(&name);
                let deleted = api.delete(&name, &DeleteParams::background()).await;
                live.retain(|n| *n != name);
                let created = format!("d{next:03}");
                next += 1;
                let replicas = rng.random_range(1..=MAX_REPLICAS);
                invariants.lock().unwrap().scaling(&created, replicas);
                invariants
                    .lock()
                    .unwrap()
                    .note(&created, &format!("create {replicas}"));
                live.push(created.clone());
                let create = api
                    .create(&PostParams::default(), &deployment(&created, replicas))
                    .await
                    .map(drop);
                deleted.map(drop).and(create)
            }
        };
        changes += 1;
        if result.is_err() {
            refused += 1;
        }
    }
    (changes, refused)
}

/// Objects (Deployments, ReplicaSets) not converged: a Deployment whose status does not
/// show all its replicas updated and available at its generation, or with a different
/// number of active Pods; a ReplicaSet not at its generation or size, or whose Deployment
/// is gone (the garbage collector's part).
async fn not_converged(client: &Client, namespace: &str) -> Vec<String> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let lp = ListParams::default();
    let (Ok(deployments), Ok(sets), Ok(pods)) = (
        deployments.list(&lp).await,
        sets.list(&lp).await,
        pods.list(&lp).await,
    ) else {
        return vec!["the apiserver did not answer".into()];
    };
    let mut active: HashMap<String, i32> = HashMap::new();
    for pod in &pods.items {
        if pod.metadata.deletion_timestamp.is_none()
            && let Some(app) = pod.metadata.labels.as_ref().and_then(|l| l.get("app"))
        {
            *active.entry(app.clone()).or_default() += 1;
        }
    }
    let mut behind = Vec::new();
    let mut uids = Vec::new();
    for d in &deployments.items {
        let name = d.metadata.name.clone().unwrap_or_default();
        uids.extend(d.metadata.uid.clone());
        let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let status = d.status.clone().unwrap_or_default();
        let done = status.observed_generation >= d.metadata.generation
            && status.updated_replicas == Some(want)
            && status.available_replicas == Some(want)
            && status.replicas == Some(want)
            && active.get(&name).copied().unwrap_or(0) == want;
        if !done {
            behind.push(format!("deployment {name}: want {want}, {status:?}"));
        }
    }
    for rs in &sets.items {
        let name = rs.metadata.name.clone().unwrap_or_default();
        let owned = rs
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| uids.contains(&o.uid));
        let want = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let status = rs.status.clone().unwrap_or_default();
        let done = owned
            && status.observed_generation >= rs.metadata.generation
            && status.replicas == want;
        if !done {
            behind.push(format!(
                "replicaset {name} (owned {owned}): want {want}, {status:?}"
            ));
        }
    }
    behind
}

/// Scales the canary to `replicas` (retrying while the apiserver comes back) and waits until
/// its status shows it done.
async fn canary(api: &Api<Deployment>, replicas: i32) -> bool {
    let scale = Patch::Merge(json!({"spec": {"replicas": replicas}}));
    let written = until(RECOVERY_BOUND, || async {
        api.patch("canary", &PatchParams::default(), &scale)
            .await
            .is_ok()
    })
    .await;
    if written.is_none() {
        return false;
    }
    until(RECOVERY_BOUND, || async {
        api.get("canary").await.is_ok_and(|d| {
            let status = d.status.unwrap_or_default();
            status.observed_generation >= d.metadata.generation
                && status.available_replicas == Some(replicas)
                && status.replicas == Some(replicas)
        })
    })
    .await
    .is_some()
}

fn median_max(values: &mut [Duration]) -> (Duration, Duration) {
    values.sort();
    (values[values.len() / 2], values[values.len() - 1])
}

/// Every Switchyard service as a process (queue-2 inside a network namespace), and the
/// etcd of the elector and the queues; returns once every shard is served.
async fn start_switchyard(plane: &ControlPlane, namespace: &str) -> (Fleet, Etcd) {
    let netns = NetNs::create().expect("a network namespace (needs root and iproute2)");
    netns.localhost_is_aside().unwrap();
    let etcd = Etcd::start_also_on(netns.aside().into()).await.unwrap();

    let config_path = plane.dir().join(format!("watcher-{namespace}.yaml"));
    switchyard_tests::write_watcher_config(&config_path, SHARDS, &[namespace]);
    let kubeconfig = format!("--kubeconfig={}", plane.kubeconfig().display());
    let shards = format!("--shard-count={SHARDS}");
    let etcd_env = |endpoint: String| vec![("SWITCHYARD_ETCD_ENDPOINTS".to_owned(), endpoint)];
    // Every client reaches elector-0 at the veth's root end, queue-2 included.
    let elector_grpc = SocketAddr::new(
        netns.outer().into(),
        TcpListener::bind((netns.outer(), 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port(),
    );
    let elector_addr = format!("--elector-addr={elector_grpc}");

    let mut specs = BTreeMap::new();
    for i in 0..2 {
        specs.insert(
            format!("elector-{i}"),
            Spec {
                envs: etcd_env(etcd.endpoint().to_owned()),
                grpc: (i == 0).then_some(elector_grpc),
                ..Spec::new(
                    format!("elector-{i}"),
                    service_binary("switchyard-elector"),
                    vec![shards.clone()],
                )
            },
        );
    }
    for i in 0..3 {
        let in_netns = i == 2;
        let endpoint = if in_netns {
            etcd.endpoint_at("localhost")
        } else {
            etcd.endpoint().to_owned()
        };
        specs.insert(
            format!("queue-{i}"),
            Spec {
                envs: etcd_env(endpoint),
                in_netns,
                ..Spec::new(
                    format!("queue-{i}"),
                    service_binary("switchyard-queue"),
                    vec![
                        format!("--member-id=q{i}"),
                        shards.clone(),
                        elector_addr.clone(),
                        "--log-format=json".into(),
                    ],
                )
            },
        );
    }
    let watcher_grpc = SocketAddr::from((
        [127, 0, 0, 1],
        TcpListener::bind(("127.0.0.1", 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port(),
    ));
    specs.insert(
        "watcher".into(),
        Spec {
            grpc: Some(watcher_grpc),
            ..Spec::new(
                "watcher",
                service_binary("switchyard-watcher"),
                vec![
                    kubeconfig.clone(),
                    format!("--config={}", config_path.display()),
                    elector_addr.clone(),
                ],
            )
        },
    );
    for i in 0..2 {
        specs.insert(
            format!("reconciler-{i}"),
            Spec::new(
                format!("reconciler-{i}"),
                service_binary("switchyard-reconciler"),
                vec![
                    kubeconfig.clone(),
                    elector_addr.clone(),
                    shards.clone(),
                    format!("--watcher-addr={watcher_grpc}"),
                    format!("--worker-id=r{i}"),
                ],
            ),
        );
    }
    let mut fleet = Fleet {
        specs,
        running: BTreeMap::new(),
        netns,
        serve_logs: Vec::new(),
        frozen: HashMap::new(),
        adds: HashMap::new(),
        adds_ended: 0.0,
    };
    for name in [
        "elector-0",
        "elector-1",
        "queue-0",
        "queue-1",
        "queue-2",
        "watcher",
        "reconciler-0",
        "reconciler-1",
    ] {
        fleet.start(name).await;
    }
    if until(RECOVERY_BOUND, || fleet.all_served(None))
        .await
        .is_none()
    {
        let mut seen = String::new();
        for name in fleet.names("queue") {
            let process = &fleet.running[&name];
            let log = process.log();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            seen += &format!("{name}: {:?}\n{}\n", served(process).await, tail.join("\n"));
        }
        panic!("the queues do not serve every shard:\n{seen}");
    }
    (fleet, etcd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_converge_and_invariants_hold_under_faults() {
    let seconds = std::env::var("SWITCHYARD_SOAK_SECONDS").ok().map(|s| {
        s.parse()
            .unwrap_or_else(|_| panic!("SWITCHYARD_SOAK_SECONDS={s:?} is not a number"))
    });
    let one_round = seconds.is_none();
    let total = Duration::from_secs(seconds.unwrap_or(DEFAULT_SECONDS));
    // The test ends by itself: whatever hangs, it fails when its time is up.
    tokio::time::timeout(total + TEARDOWN, soak(total, one_round))
        .await
        .expect("the soak finished within its time");
}

/// `one_round`: every fault once, then convergence; otherwise rounds until `total` is
/// nearly up.
async fn soak(total: Duration, one_round: bool) {
    let begin = Instant::now();
    let seed = std::env::var("SWITCHYARD_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random::<u64>());
    println!(
        "soak seed {seed} for {} s (set SWITCHYARD_SOAK_SEED to repeat)",
        total.as_secs()
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let at = move || format!("{:>7.2}s", begin.elapsed().as_secs_f64());

    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "soak").await.unwrap();
    let peer = std::env::var("SWITCHYARD_SOAK_PEER").is_ok_and(|p| p == "kube-controller-manager");
    let (mut fleet, mut etcd, mut kcm) = if peer {
        let kcm = plane
            .start_controller_manager(KCM_CONTROLLERS, &[])
            .await
            .expect("kube-controller-manager");
        (None, None, Some(kcm))
    } else {
        let (fleet, etcd) = start_switchyard(plane, ns.name()).await;
        (Some(fleet), Some(etcd), None)
    };
    println!("{} every service ready", at());

    let invariants = watch_invariants(client.clone(), ns.name(), begin);
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    let live: Vec<String> = (0..LIVE).map(|i| format!("d{i:03}")).collect();
    for name in live.iter().map(String::as_str).chain(["canary"]) {
        let replicas = if name == "canary" { 1 } else { 3 };
        invariants.lock().unwrap().scaling(name, replicas);
        api.create(&PostParams::default(), &deployment(name, replicas))
            .await
            .unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let workload = tokio::spawn(workload(
        api.clone(),
        invariants.clone(),
        live,
        stop.clone(),
        rng.random(),
    ));

    // The chaos loop: every fault once per round, in a random order, one at a time.
    let chaos_end = begin + total - RESERVE;
    let mut recoveries: BTreeMap<Fault, Vec<Duration>> = BTreeMap::new();
    let mut faults = 0u64;
    let mut canary_replicas = 1;
    let mut last_fault_end = Instant::now();
    let mut last_apiserver_restart: Option<Instant> = None;
    'rounds: loop {
        let mut round = if peer {
            PEER_FAULTS.to_vec()
        } else {
            Fault::ALL.to_vec()
        };
        round.shuffle(&mut rng);
        for fault in round {
            tokio::time::sleep(Duration::from_millis(rng.random_range(2000..5000))).await;
            // The slowest fault (an apiserver restart) takes about 20 s.
            if !one_round && Instant::now() + Duration::from_secs(30) > chaos_end {
                break 'rounds;
            }
            if fault == Fault::ApiserverRestart
                && last_apiserver_restart.is_some_and(|t| t.elapsed() < APISERVER_SPACING)
            {
                continue;
            }
            if let Some(fleet) = fleet.as_mut() {
                for name in fleet.names("queue") {
                    fleet.scrape_adds(&name).await;
                }
            }
            let recovery = match fault {
                Fault::ApiserverRestart => {
                    tokio::task::block_in_place(|| plane.stop_apiserver());
                    println!("{} stopped kube-apiserver", at());
                    plane.restart_apiserver().await.unwrap();
                    let back = Instant::now();
                    last_apiserver_restart = Some(back);
                    println!("{} kube-apiserver ready again", at());
                    canary_replicas = 3 - canary_replicas;
                    invariants
                        .lock()
                        .unwrap()
                        .scaling("canary", canary_replicas);
                    canary(&api, canary_replicas).await.then(|| back.elapsed())
                }
                Fault::ControllerManagerRestart => {
                    let stopped = Instant::now();
                    tokio::task::block_in_place(|| drop(kcm.take()));
                    kcm = Some(
                        plane
                            .start_controller_manager(KCM_CONTROLLERS, &[])
                            .await
                            .unwrap(),
                    );
                    println!("{} restarted kube-controller-manager", at());
                    canary_replicas = 3 - canary_replicas;
                    invariants
                        .lock()
                        .unwrap()
                        .scaling("canary", canary_replicas);
                    canary(&api, canary_replicas)
                        .await
                        .then(|| stopped.elapsed())
                }
                _ => {
                    let (fleet, etcd) = (fleet.as_mut().unwrap(), etcd.as_mut().unwrap());
                    switchyard_fault(fault, fleet, etcd, &mut rng, at).await
                }
            };
            faults += 1;
            last_fault_end = Instant::now();
            let Some(recovery) = recovery else {
                let canary = api.get("canary").await;
                let logs = fleet.as_ref().map(Fleet::warnings).unwrap_or_default();
                panic!(
                    "{} did not recover within {RECOVERY_BOUND:?} (seed {seed})\n\
                     canary: {canary:?}\n{logs}",
                    fault.name()
                )
            };
            println!("{} {} recovered in {recovery:?}", at(), fault.name());
            recoveries.entry(fault).or_default().push(recovery);
        }
        if one_round {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (changes, refused) = workload.await.unwrap();
    println!(
        "{} faults over; {changes} workload changes ({refused} refused)",
        at()
    );

    // Everything must converge before the time is up, with a little left for the teardown.
    let converge_by = begin + total - TEARDOWN;
    let mut behind;
    let converged = loop {
        behind = not_converged(&client, ns.name()).await;
        if behind.is_empty() {
            break Some(last_fault_end.elapsed());
        }
        if Instant::now() > converge_by {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!("{} converged: {converged:?}", at());
    // Let the Pod watch catch up before reading the invariants.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let figure = if peer { "soak.kcm_" } else { "soak." };
    let mut unclean = Vec::new();
    let mut overlaps = Overlaps::default();
    if let Some(mut fleet) = fleet {
        for name in fleet.names("queue") {
            fleet.scrape_adds(&name).await;
        }
        let keys_enqueued = fleet.adds_ended + fleet.adds.values().sum::<f64>();
        println!("bench {figure}keys_enqueued {keys_enqueued:.0} keys");
        // Workers first, so that the queues have nothing in flight to drain.
        for kind in ["reconciler", "watcher", "queue", "elector"] {
            for name in fleet.names(kind) {
                let process = fleet.running.remove(&name).unwrap();
                let (status, log) = process.terminate().await.unwrap();
                if !status.success() {
                    unclean.push(format!("{name}: {status}\n{log}"));
                }
                fleet.ended(&name, log, SystemTime::now());
            }
        }
        overlaps = double_served(&fleet.serve_logs);
        println!(
            "bench {figure}double_served_ms {} ms",
            overlaps.total.as_millis()
        );
        println!(
            "bench {figure}overlap_within_clock_margin_us {} us",
            overlaps.within_margin.as_micros()
        );
        println!(
            "bench {figure}overlap_after_resume_us {} us",
            overlaps.after_resume.as_micros()
        );
    }
    let invariants = invariants.lock().unwrap();
    for (fault, times) in &mut recoveries {
        let (median, max) = median_max(times);
        let name = fault.name();
        println!("# {figure}recovery_{name}: {}", fault.until());
        println!(
            "bench {figure}recovery_{name}_median_ms {} ms",
            median.as_millis()
        );
        println!(
            "bench {figure}recovery_{name}_max_ms {} ms",
            max.as_millis()
        );
        println!("bench {figure}recovery_{name}_runs {} runs", times.len());
    }
    println!("bench {figure}seconds {} s", begin.elapsed().as_secs());
    println!("bench {figure}faults {faults} faults");
    println!("bench {figure}workload_changes {changes} changes");
    println!("bench {figure}keys_lost {} keys", behind.len());
    println!("bench {figure}pod_samples {} samples", invariants.samples);
    println!(
        "bench {figure}surge_violations {} samples",
        invariants.surge_violations
    );
    println!(
        "bench {figure}pod_surge_samples {} samples",
        invariants.pod_surge_samples
    );
    println!(
        "bench {figure}unavailable_violations {} samples",
        invariants.unavailable_violations
    );
    if let Some(converged) = converged {
        println!(
            "bench {figure}converge_after_faults_s {:.1} s",
            converged.as_secs_f64()
        );
    }
    for violation in &invariants.first_violations {
        println!("# {violation}");
    }

    assert!(
        converged.is_some() && behind.is_empty(),
        "not converged (seed {seed}): {behind:#?}"
    );
    let kinds = if peer {
        PEER_FAULTS.len()
    } else {
        Fault::ALL.len()
    };
    assert!(
        !one_round || recoveries.len() == kinds,
        "a round injected {} of the {kinds} faults (seed {seed}): {:?}",
        recoveries.len(),
        recoveries.keys().map(|f| f.name()).collect::<Vec<_>>()
    );
    if peer {
        // kube-controller-manager's figures are for comparison, not under test.
        return;
    }
    assert_eq!(
        overlaps.total,
        Duration::ZERO,
        "a shard was served twice at once (seed {seed}): {:#?}",
        overlaps.first
    );
    assert_eq!(
        invariants.surge_violations, 0,
        "ReplicaSets sized above replicas + maxSurge (seed {seed}): {:#?}",
        invariants.first_violations
    );
    assert!(unclean.is_empty(), "{}", unclean.join("\n"));
}

/// Injects one of the faults of Switchyard's own processes; how long it took to heal.
async fn switchyard_fault(
    fault: Fault,
    fleet: &mut Fleet,
    etcd: &mut Etcd,
    rng: &mut StdRng,
    at: impl Fn() -> String,
) -> Option<Duration> {
    match fault {
        Fault::QueueKill | Fault::ReconcilerKill | Fault::WatcherKill => {
            let kind = match fault {
                Fault::QueueKill => "queue",
                Fault::ReconcilerKill => "reconciler",
                _ => "watcher",
            };
            let victim = fleet.names(kind).choose(rng).unwrap().clone();
            fleet.kill(&victim).await;
            let killed = Instant::now();
            println!("{} killed {victim}", at());
            let mut recovery = None;
            if fault == Fault::QueueKill {
                recovery = until(RECOVERY_BOUND, || fleet.all_served(None)).await;
            }
            fleet.start(&victim).await;
            recovery.or_else(|| Some(killed.elapsed()))
        }
        Fault::ElectorKill => {
            let victim = fleet.names("elector").choose(rng).unwrap().clone();
            fleet.kill(&victim).await;
            let killed = Instant::now();
            println!("{} killed {victim}", at());
            fleet.start(&victim).await;
            until(RECOVERY_BOUND, || fleet.an_elector_leads())
                .await
                .map(|_| killed.elapsed())
        }
        Fault::QueuePause => {
            let victim = fleet.names("queue").choose(rng).unwrap().clone();
            let paused_at = SystemTime::now();
            fleet.running[&victim].pause();
            let paused = Instant::now();
            println!("{} paused {victim}", at());
            let recovery = until(RECOVERY_BOUND, || fleet.all_served(Some(&victim))).await;
            tokio::time::sleep(PAUSE.saturating_sub(paused.elapsed())).await;
            fleet.running[&victim].resume();
            fleet
                .frozen
                .entry(victim.clone())
                .or_default()
                .push((paused_at, SystemTime::now()));
            println!("{} resumed {victim}", at());
            recovery
        }
        Fault::QueuePartition => {
            fleet.netns.cut().unwrap();
            let cut = Instant::now();
            println!("{} cut queue-2 from etcd", at());
            let recovery = until(RECOVERY_BOUND, || fleet.all_served(Some("queue-2"))).await;
            tokio::time::sleep(PARTITION.saturating_sub(cut.elapsed())).await;
            fleet.netns.heal().unwrap();
            println!("{} healed queue-2's partition", at());
            recovery
        }
        Fault::EtcdRestart => {
            let killed = Instant::now();
            tokio::task::block_in_place(|| etcd.kill());
            println!("{} killed the elector's etcd", at());
            etcd.restart().await.unwrap();
            println!("{} etcd back", at());
            until(RECOVERY_BOUND, || fleet.all_served(None))
                .await
                .map(|_| killed.elapsed())
        }
        Fault::ApiserverRestart | Fault::ControllerManagerRestart => {
            unreachable!("not a fault of Switchyard's processes")
        }
    }
}
