//! Chaos: while 50 Deployments roll out, a reconciler, a queue replica and the watcher are
//! each killed with SIGKILL at a random moment and started again. Everything converges, and
//! a watch on the Pods checks at every event that no ReplicaSet ever has more active Pods
//! than `replicas + maxSurge`.
//!
//! Every Switchyard service runs as its own process (the binaries `cargo test --workspace`
//! builds beside this test), with a real etcd for the elector and the shared control plane.
//! The watcher watches only this test's namespace. The seed of the random moments is printed
//! and can be set with `SWITCHYARD_CHAOS_SEED`.

#![allow(clippy::unwrap_used)]

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use rand::{Rng, SeedableRng, rngs::StdRng, seq::SliceRandom};
use serde_json::json;
use switchyard_k8s::{Api, Deployment};
use switchyard_testenv::{ControlPlane, Etcd, ServiceProcess, TestNamespace, manifests};
use switchyard_tests::{
    fleet::{PodCensus, Spec, await_rolled_out, create_all, set_image_all},
    service_binary,
};

const DEPLOYMENTS: usize = 50;
const REPLICAS: i32 = 4;
const MAX_SURGE: i32 = 1;
const SHARDS: u32 = 16;
const CONVERGE: Duration = Duration::from_secs(150);

fn deployment(name: &str) -> Deployment {
    let strategy = json!({"strategy": {"type": "RollingUpdate",
                           "rollingUpdate": {"maxSurge": MAX_SURGE, "maxUnavailable": 1}}});
    manifests::deployment(name, REPLICAS, strategy)
}

/// Writes every process's log to a directory of its own and prints the lines that name the
/// Deployment of the ReplicaSet `owner` (its ReplicaSets' and Pods' names start with it), so
/// that a failure in CI shows what happened to it.
fn report(logs: &[(String, String)], owner: &str, seed: u64) {
    let dir = std::env::temp_dir().join(format!("switchyard-chaos-{seed}"));
    let deployment = owner.rsplit_once('-').map_or(owner, |(d, _)| d);
    let _ = std::fs::create_dir_all(&dir);
    for (name, log) in logs {
        let _ = std::fs::write(dir.join(format!("{name}.log")), log);
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(deployment)).collect();
        println!("--- {name}: {} lines naming {deployment}", lines.len());
        for line in lines.iter().take(200) {
            println!("{line}");
        }
    }
    println!("every log: {}", dir.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_converge_while_a_reconciler_a_queue_and_the_watcher_are_killed() {
    let seed = std::env::var("SWITCHYARD_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random::<u64>());
    println!("chaos seed {seed} (set SWITCHYARD_CHAOS_SEED to repeat)");
    let mut rng = StdRng::seed_from_u64(seed);

    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "chaos")
        .await
        .unwrap();
    let etcd = Etcd::start().await.unwrap();
    let config_path = plane.dir().join(format!("watcher-{}.yaml", ns.name()));
    switchyard_tests::write_watcher_config(&config_path, SHARDS, &[ns.name()]);
    let kubeconfig = format!("--kubeconfig={}", plane.kubeconfig().display());
    let etcd_env = vec![(
        "SWITCHYARD_ETCD_ENDPOINTS".to_owned(),
        etcd.endpoint().to_owned(),
    )];
    let shards = format!("--shard-count={SHARDS}");

    let elector = Spec {
        name: "elector".into(),
        program: service_binary("switchyard-elector"),
        args: vec![shards.clone()],
        envs: etcd_env.clone(),
        grpc: None,
        in_netns: false,
    }
    .start()
    .await;
    let elector_addr = format!("--elector-addr={}", elector.grpc_addr());
    let mut specs: BTreeMap<&str, Spec> = BTreeMap::new();
    for i in 0..2 {
        specs.insert(
            ["queue-0", "queue-1"][i],
            Spec {
                name: format!("queue-{i}"),
                program: service_binary("switchyard-queue"),
                args: vec![
                    format!("--member-id=q{i}"),
                    shards.clone(),
                    elector_addr.clone(),
                ],
                envs: etcd_env.clone(),
                grpc: None,
                in_netns: false,
            },
        );
    }
    let mut running: BTreeMap<&str, ServiceProcess> = BTreeMap::new();
    for (name, spec) in &specs {
        running.insert(name, spec.start().await);
    }
    let mut watcher_spec = Spec {
        name: "watcher".into(),
        program: service_binary("switchyard-watcher"),
        args: vec![
            kubeconfig.clone(),
            format!("--config={}", config_path.display()),
            elector_addr.clone(),
        ],
        envs: Vec::new(),
        grpc: None,
        in_netns: false,
    };
    let watcher = watcher_spec.start().await;
    watcher_spec.grpc = Some(watcher.grpc_addr());
    running.insert("watcher", watcher);
    specs.insert("watcher", watcher_spec);
    for i in 0..2 {
        let spec = Spec {
            name: format!("reconciler-{i}"),
            program: service_binary("switchyard-reconciler"),
            args: vec![
                kubeconfig.clone(),
                elector_addr.clone(),
                shards.clone(),
                format!("--watcher-addr={}", running["watcher"].grpc_addr()),
                format!("--worker-id=r{i}"),
                // What each ReplicaSet reconcile counted and created, for a failure's report.
                "--log-level=info,switchyard_reconciler::replicaset=debug".to_owned(),
            ],
            envs: Vec::new(),
            grpc: None,
            in_netns: false,
        };
        let name = ["reconciler-0", "reconciler-1"][i];
        running.insert(name, spec.start().await);
        specs.insert(name, spec);
    }

    let census = PodCensus::watch(client.clone(), ns.name());
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    let names: Vec<String> = (0..DEPLOYMENTS).map(|i| format!("d{i:02}")).collect();
    create_all(&api, names.iter().map(|n| deployment(n)).collect(), 8).await;
    // Roll every Deployment out to a new image once the first ReplicaSets are being made.
    tokio::time::sleep(Duration::from_millis(rng.random_range(500..1500))).await;
    set_image_all(&api, &names, "registry.example/app:2", 8).await;

    // One kill -9 of each, in a random order at random moments, each started again.
    let mut victims = ["reconciler-0", "queue-1", "watcher"];
    victims.shuffle(&mut rng);
    let start = Instant::now();
    // The logs of the processes killed, kept for a failure's report.
    let mut killed_logs: Vec<(String, String)> = Vec::new();
    for victim in victims {
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..2500))).await;
        let killed = running.remove(victim).unwrap();
        killed_logs.push((format!("{victim}-killed"), killed.kill()));
        println!("{:>6.2}s killed {victim}", start.elapsed().as_secs_f64());
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..1000))).await;
        running.insert(victim, specs[victim].start().await);
        println!(
            "{:>6.2}s {victim} ready again",
            start.elapsed().as_secs_f64()
        );
    }

    let image = "registry.example/app:2";
    if let Err(done) = await_rolled_out(&api, image, REPLICAS, DEPLOYMENTS, CONVERGE).await {
        panic!("{done} of {DEPLOYMENTS} Deployments rolled out within {CONVERGE:?} (seed {seed})");
    }
    println!(
        "{:>6.2}s every Deployment rolled out",
        start.elapsed().as_secs_f64()
    );
    // Let the watch catch up with the last events before reading the bound.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (worst, owner) = census.lock().unwrap().worst.clone();
    println!("most active Pods of one ReplicaSet at once: {worst} ({owner})");
    if worst > (REPLICAS + MAX_SURGE) as usize {
        let mut logs = killed_logs;
        logs.extend(
            running
                .iter()
                .map(|(name, p)| ((*name).to_owned(), p.log())),
        );
        logs.push(("elector".to_owned(), elector.log()));
        report(&logs, &owner, seed);
    }
    assert!(
        worst <= (REPLICAS + MAX_SURGE) as usize,
        "ReplicaSet {owner} had {worst} active Pods at once, above replicas + maxSurge (seed {seed})"
    );

    let mut unclean = Vec::new();
    for (name, process) in running.into_iter().rev() {
        let (status, log) = process.terminate().await.unwrap();
        if !status.success() {
            unclean.push(format!("{name}: {status}\n{log}"));
        }
    }
    let (status, log) = elector.terminate().await.unwrap();
    if !status.success() {
        unclean.push(format!("elector: {status}\n{log}"));
    }
    assert!(unclean.is_empty(), "{}", unclean.join("\n"));
}
