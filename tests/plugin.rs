//! `kubectl switchyard` against a running topology on the real control plane: etcd, an
//! elector, two queue replicas, a watcher and a reconciler as processes, all on mutual TLS.
//!
//! - `status` shows the shard count, every shard held once, the backlog of a controller that
//!   no reconciler serves (seven keys the test enqueues), the reconciler's Work stream, and
//!   every service's readiness and version from its admin port;
//! - `top` (bounded by `--iterations`) shows that backlog and the reconciles' work p99;
//! - `why` finds a ReplicaSet whose Pods the apiserver refuses (a quota of no Pods): its key
//!   backs off with retries and its last error is the apiserver's refusal; the observer
//!   identity is refused `why`;
//! - `drain` moves every shard off one replica and waits; `--undo` gives it shards again;
//! - an address where nothing listens is named in the error, with the reason;
//! - through a kubeconfig and `--context`, `status` lists the installation's workloads;
//! - with nothing but a kubeconfig, the services are found through the ExternalName Services
//!   `make run` publishes for local processes, and the identity comes from its Secret (the
//!   observer's for `status`, the operator's for `why`); a missing Secret is named.
//!
//! Needs the plugin and the services built (`cargo build --bins`).

#![allow(clippy::unwrap_used)]

use std::{
    process::Output,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use switchyard_k8s::{
    Api, PostParams, ReplicaSet,
    kube::api::{Patch, PatchParams},
};
use switchyard_proto::{
    common::v1::WorkKey,
    elector::v1::{GetShardMapRequest, elector_client::ElectorClient},
    queue::v1::{EnqueueItem, EnqueueRequest, queue_client::QueueClient},
};
use switchyard_runtime::Role;
use switchyard_testenv::{ControlPlane, Pki, TestNamespace, manifests};
use switchyard_tests::{
    CONVERGE_TIMEOUT, service_binary,
    topology::{self, Shape, Topology},
};
use switchyard_work::shard::shard_of;

const SHARDS: u32 = 16;
/// A controller the queue serves and no reconciler runs: its keys stay queued.
const IDLE: &str = "example.com/v1/Idle";
const IDLE_KEYS: u64 = 7;
/// The built-in controllers and the idle one.
fn controllers() -> String {
    format!("{},{IDLE}", switchyard_work::builtin::LIST)
}
/// The whole test, however it goes; its processes are killed when it ends.
const TEST_TIMEOUT: Duration = Duration::from_secs(300);
/// How long one plugin run may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// A home without a `~/.kube/config`.
const NO_HOME: &str = "/nonexistent/switchyard-plugin-test-home";

struct Plugin {
    elector: String,
    admins: Vec<String>,
}

impl Plugin {
    /// Runs `kubectl-switchyard` as `role` with the topology's addresses and `args`.
    async fn run(&self, role: Role, args: &[&str]) -> Output {
        let mut command = tokio::process::Command::new(service_binary("kubectl-switchyard"));
        command
            .args(Pki::shared().flags(role))
            .arg(format!("--elector-addr={}", self.elector))
            .arg(format!("--admin-addr={}", self.admins.join(",")))
            .args(args)
            .env_remove("SWITCHYARD_QUEUE_ADDR")
            // No kubeconfig of the machine's: KUBECONFIG, then ~/.kube/config, are read.
            .env_remove("KUBECONFIG")
            .env("HOME", NO_HOME)
            .kill_on_drop(true);
        tokio::time::timeout(RUN_TIMEOUT, command.output())
            .await
            .unwrap_or_else(|_| panic!("kubectl switchyard {args:?} ended within {RUN_TIMEOUT:?}"))
            .unwrap()
    }

    /// Starts `kubectl switchyard console` as `role` on a free loopback port: the process and
    /// the URL it prints.
    async fn console(&self, role: Role) -> (tokio::process::Child, String) {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(service_binary("kubectl-switchyard"))
            .args(Pki::shared().flags(role))
            .arg(format!("--elector-addr={}", self.elector))
            .args(["console", "--listen=127.0.0.1:0"])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = tokio::time::timeout(RUN_TIMEOUT, lines.next_line())
            .await
            .expect("the console says where it listens")
            .unwrap()
            .expect("a line");
        // "console: http://127.0.0.1:<port>/console/ (the elector at …, as …); …"
        let url = line.split_whitespace().nth(1).unwrap().to_owned();
        assert!(url.starts_with("http://127.0.0.1:"), "{line}");
        (child, url)
    }

    /// Runs it and parses its JSON output; panics with stderr when it fails.
    async fn json(&self, role: Role, args: &[&str]) -> Value {
        let output = self.run(role, args).await;
        assert!(
            output.status.success(),
            "kubectl switchyard {args:?}: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "{args:?} printed JSON: {e}\n{}",
                String::from_utf8_lossy(&output.stdout)
            )
        })
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_shows_status_top_why_and_drains_a_running_topology() {
    tokio::time::timeout(TEST_TIMEOUT, plugin_against_a_topology())
        .await
        .unwrap_or_else(|_| panic!("the test did not end within {TEST_TIMEOUT:?}"));
}

async fn plugin_against_a_topology() {
    let start = Instant::now();
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let refused = topology::refusing_pods(plane, &client, "plugin-refused").await;
    let topology = Topology::start(
        plane,
        Shape {
            shards: SHARDS,
            queues: 2,
            reconcilers: 1,
            namespaces: vec![refused.name().to_owned()],
            elector_args: vec![
                "--console-interval=500ms".into(),
                "--console-trace-url=http://jaeger.invalid/trace/{trace_id}".into(),
            ],
            queue_args: vec![
                format!("--controllers={}", controllers()),
                "--drain-grace=2s".into(),
                // A member lease lost under load suspends its shards, and their idle keys
                // leave the backlog the test counts: nothing here is about failover.
                "--member-ttl=10s".into(),
            ],
        },
    )
    .await;
    let elector_grpc = topology.of("switchyard-elector")[0].grpc_addr().to_string();
    println!("{:>5.1}s topology ready", start.elapsed().as_secs_f64());

    let plugin = Plugin {
        elector: elector_grpc.clone(),
        admins: topology
            .running
            .iter()
            .map(|(_, p)| p.admin_addr().to_string())
            .collect(),
    };

    // The failing object, and the idle backlog (each key sent to its shard's owner, as the
    // watcher sends keys).
    Api::<ReplicaSet>::namespaced(client.clone(), refused.name())
        .create(&PostParams::default(), &manifests::replica_set("web", 1))
        .await
        .unwrap();
    let mut map_client = ElectorClient::new(
        Pki::shared()
            .channel(Role::Observer, Role::Elector, &elector_grpc)
            .await
            .unwrap(),
    );
    let map = map_client
        .get_shard_map(GetShardMapRequest {})
        .await
        .unwrap()
        .into_inner();
    for i in 0..IDLE_KEYS {
        let name = format!("idle-{i}");
        let shard = shard_of(IDLE, "plugin", &name, SHARDS);
        let owner = &map.shards[shard as usize].address;
        let mut queue = QueueClient::new(
            Pki::shared()
                .channel(Role::Watcher, Role::Queue, owner)
                .await
                .unwrap(),
        );
        queue
            .enqueue(EnqueueRequest {
                batch_id: i,
                shard,
                items: vec![EnqueueItem {
                    key: Some(WorkKey {
                        controller: IDLE.into(),
                        namespace: "plugin".into(),
                        name,
                    }),
                    ..Default::default()
                }],
            })
            .await
            .unwrap();
    }

    // status: the shard map, the backlog, the reconciler, every service.
    let status = plugin.json(Role::Observer, &["status", "-o", "json"]).await;
    assert_eq!(status["elector"]["shard_count"], SHARDS, "{status:#}");
    assert!(
        !status["elector"]["leader"].as_str().unwrap().is_empty(),
        "an elector leads: {status:#}"
    );
    assert_eq!(status["unassigned_shards"], 0, "{status:#}");
    let replicas = status["queue_replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 2, "{status:#}");
    let held: usize = replicas
        .iter()
        .map(|r| r["shards"].as_array().unwrap().len())
        .sum();
    assert_eq!(held, SHARDS as usize, "every shard held once: {status:#}");
    for replica in replicas {
        assert_eq!(replica["reachable"], true, "{replica:#}");
        for shard in replica["shards"].as_array().unwrap() {
            assert!(shard["epoch"].as_u64().unwrap() > 0, "{shard}");
        }
    }
    let idle = status["backlog"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["controller"] == IDLE)
        .unwrap_or_else(|| panic!("{IDLE} in the backlog: {status:#}"));
    assert_eq!(idle["depth"], IDLE_KEYS, "{idle:#}");
    assert_eq!(idle["in_flight"], 0, "{idle:#}");
    assert!(
        status["reconcilers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["worker_id"] == "r0" && w["credits"].as_u64().unwrap() > 0),
        "the reconciler's Work streams with their credits: {status:#}"
    );
    let services = status["services"].as_array().unwrap();
    for (service, count) in [
        ("switchyard-elector", 1),
        ("switchyard-queue", 2),
        ("switchyard-watcher", 1),
        ("switchyard-reconciler", 1),
    ] {
        let s = services
            .iter()
            .find(|s| s["service"] == service)
            .unwrap_or_else(|| panic!("{service} in {status:#}"));
        assert_eq!(
            (s["replicas"].clone(), s["ready"].clone()),
            (json!(count), json!(count))
        );
        assert_eq!(s["versions"], json!([env!("CARGO_PKG_VERSION")]), "{s}");
    }
    assert!(
        status["problems"].as_array().unwrap().is_empty(),
        "{status:#}"
    );
    // The table says the same for people (not a terminal: no colour codes).
    let table = plugin.run(Role::Observer, &["status"]).await;
    let table = text(&table.stdout);
    assert!(
        table.contains("QUEUE REPLICA") && table.contains(IDLE),
        "{table}"
    );
    assert!(
        !table.contains('\x1b'),
        "no colour off a terminal: {table:?}"
    );
    println!("{:>5.1}s status checked", start.elapsed().as_secs_f64());

    // why: the refused ReplicaSet's key backs off with the apiserver's refusal as its error.
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    let why = loop {
        let why = plugin
            .json(
                Role::Operator,
                &["why", "replicaset/web", "-n", refused.name(), "-o", "json"],
            )
            .await;
        if why["last_outcome"]["result"] == "failed" && why["retries"].as_u64() >= Some(1) {
            break why;
        }
        assert!(
            Instant::now() < deadline,
            "the refused ReplicaSet's reconcile failed within {CONVERGE_TIMEOUT:?}: {why:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let error = why["last_outcome"]["error"].as_str().unwrap();
    assert!(
        error.contains("forbidden") || error.contains("quota"),
        "the apiserver's refusal: {why:#}"
    );
    assert_eq!(why["controller"], "apps/v1/ReplicaSet");
    assert_eq!(
        why["shard"].as_u64().unwrap(),
        u64::from(shard_of(
            "apps/v1/ReplicaSet",
            refused.name(),
            "web",
            SHARDS
        ))
    );
    assert!(
        ["q0", "q1"].contains(&why["queue_replica"].as_str().unwrap()),
        "{why:#}"
    );
    assert_eq!(why["last_outcome"]["worker"], "r0", "{why:#}");
    assert!(
        ["delayed", "leased", "queued"].contains(&why["state"].as_str().unwrap()),
        "{why:#}"
    );
    let table = text(
        &plugin
            .run(Role::Operator, &["why", "rs/web", "-n", refused.name()])
            .await
            .stdout,
    );
    // Each retry's error names another refused Pod: the apiserver's words are the same.
    assert!(
        table.contains("last error") && table.contains("is forbidden"),
        "{table}"
    );
    // Keys and errors are for operators: the observer is refused, and told why.
    let denied = plugin
        .run(
            Role::Observer,
            &["why", "replicaset/web", "-n", refused.name()],
        )
        .await;
    assert!(!denied.status.success());
    let stderr = text(&denied.stderr);
    assert!(
        stderr.contains("refused DescribeKey: PermissionDenied")
            && stderr.contains("switchyard-operator"),
        "{stderr}"
    );
    // An object no controller reconciles is named as such.
    let unknown = plugin.run(Role::Operator, &["why", "pod/x"]).await;
    assert!(
        text(&unknown.stderr).contains("no controller of the queue reconciles \"pod\""),
        "{}",
        text(&unknown.stderr)
    );
    println!("{:>5.1}s why checked", start.elapsed().as_secs_f64());

    identities_from_secrets(plane, &client, &topology, refused.name()).await;
    println!(
        "{:>5.1}s identities from Secrets checked",
        start.elapsed().as_secs_f64()
    );

    console_in_a_browser(&plugin, refused.name()).await;
    println!("{:>5.1}s console checked", start.elapsed().as_secs_f64());

    // A shard that moved would have started empty, its idle keys gone with it (by design):
    // Topology::start waited for the map to settle, so none moved.
    let epochs = |map: &switchyard_proto::elector::v1::ShardMap| {
        map.shards.iter().map(|s| s.epoch).collect::<Vec<_>>()
    };
    let now = map_client
        .get_shard_map(GetShardMapRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(epochs(&now), epochs(&map), "a shard moved during the test");

    // top, bounded: the idle backlog, and the reconciles' work p99.
    let top = plugin
        .run(
            Role::Observer,
            &["top", "--iterations=2", "--interval=500ms", "-o", "json"],
        )
        .await;
    assert!(top.status.success(), "{}", text(&top.stderr));
    let frames: Vec<Value> = text(&top.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(frames.len(), 2, "{frames:#?}");
    for frame in &frames {
        assert_eq!(frame["replicas"], 2, "{frame:#}");
        let row = |name: &str| {
            frame["controllers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["controller"] == name)
                .cloned()
                .unwrap_or_else(|| panic!("{name} in {frame:#}"))
        };
        assert_eq!(row(IDLE)["depth"], IDLE_KEYS as f64, "{frame:#}");
        assert!(
            row("apps/v1/ReplicaSet")["work_p99_seconds"]
                .as_f64()
                .is_some(),
            "{frame:#}"
        );
    }
    println!("{:>5.1}s top checked", start.elapsed().as_secs_f64());

    // drain: every shard leaves q0, then --undo gives it shards again.
    let before = map_client
        .get_shard_map(GetShardMapRequest {})
        .await
        .unwrap()
        .into_inner();
    let q0_before = before.shards.iter().filter(|s| s.member_id == "q0").count();
    assert!(q0_before > 0, "q0 holds shards before the drain");
    let refused_drain = plugin.run(Role::Observer, &["drain", "q0"]).await;
    assert!(
        !refused_drain.status.success()
            && text(&refused_drain.stderr).contains("refused DrainMember: PermissionDenied"),
        "{}",
        text(&refused_drain.stderr)
    );
    let drained = plugin
        .json(
            Role::Operator,
            &["drain", "q0", "--timeout=60s", "-o", "json"],
        )
        .await;
    assert_eq!(drained["shards_before"], q0_before as u64, "{drained:#}");
    assert_eq!(drained["moved_to"], json!({"q1": q0_before}), "{drained:#}");
    let after = map_client
        .get_shard_map(GetShardMapRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        after
            .shards
            .iter()
            .all(|s| s.member_id == "q1" && s.state == 1),
        "every shard active on q1: {after:?}"
    );
    let status = plugin.json(Role::Observer, &["status", "-o", "json"]).await;
    let q0 = status["queue_replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["member_id"] == "q0")
        .unwrap()
        .clone();
    assert_eq!(
        (q0["draining"].clone(), q0["serving"].clone()),
        (json!(true), json!(0))
    );
    // The last replica not draining cannot be drained: its shards would have nowhere to go.
    let last = plugin.run(Role::Operator, &["drain", "q1"]).await;
    assert!(
        text(&last.stderr).contains("no other member could take its shards"),
        "{}",
        text(&last.stderr)
    );
    plugin
        .json(Role::Operator, &["drain", "q0", "--undo", "-o", "json"])
        .await;
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let map = map_client
            .get_shard_map(GetShardMapRequest {})
            .await
            .unwrap()
            .into_inner();
        let q0 = map
            .shards
            .iter()
            .filter(|s| s.member_id == "q0" && s.state == 1)
            .count();
        if q0 > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "q0 got shards again after --undo"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("{:>5.1}s drain checked", start.elapsed().as_secs_f64());

    // Nothing listens here: the error names the address and the reason.
    let nowhere = {
        // A port that was free a moment ago: bound, then closed.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let mut command = tokio::process::Command::new(service_binary("kubectl-switchyard"));
    let output = command
        .args(Pki::shared().flags(Role::Observer))
        .arg(format!("--elector-addr={nowhere}"))
        .args(["status", "--call-timeout=3s"])
        .env_remove("KUBECONFIG")
        .env("HOME", NO_HOME)
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains(&format!("the elector at {nowhere} is unreachable"))
            && stderr.to_lowercase().contains("connection refused"),
        "{stderr}"
    );
    // The rest answers: the status is printed, the unreachable admin port named among its
    // problems, and the exit code says something is wrong.
    let degraded = Plugin {
        elector: elector_grpc.clone(),
        admins: vec![
            topology.running[0].1.admin_addr().to_string(),
            nowhere.clone(),
        ],
    };
    let output = degraded
        .run(Role::Observer, &["status", "-o", "json"])
        .await;
    assert!(!output.status.success());
    let status: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(status["elector"]["shard_count"], SHARDS, "{status:#}");
    let problem = status["problems"][0].as_str().unwrap_or_default();
    assert!(
        problem.contains(&format!("the admin port at {nowhere} is unreachable")),
        "{status:#}"
    );
    assert!(
        text(&output.stderr).contains("1 problem(s)"),
        "{}",
        text(&output.stderr)
    );
    drop(topology);
}

/// `status` through a kubeconfig, as kubectl users reach a cluster: `--context` picks the
/// context (the current one points where nothing listens), and the installation's
/// Deployments and StatefulSets show their replicas, readiness and image version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reads_the_installation_through_the_kubeconfig_context() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "plugin-install")
        .await
        .unwrap();
    let workload = |kind: &str, name: &str| -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": kind,
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": name}},
            "spec": {
                "replicas": 2,
                "serviceName": name,
                "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                "template": {
                    "metadata": {"labels": {"app.kubernetes.io/name": name}},
                    "spec": {"containers": [{
                        "name": "main",
                        "image": format!("registry.example/{name}:0.1.0"),
                    }]},
                },
            },
        })
    };
    let deployments = Api::<switchyard_k8s::Deployment>::namespaced(client.clone(), ns.name());
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(workload("Deployment", "switchyard-watcher")).unwrap(),
        )
        .await
        .unwrap();
    // What the controllers would write: one of two ready.
    deployments
        .patch_status(
            "switchyard-watcher",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2}}),
            ),
        )
        .await
        .unwrap();
    let sets = Api::<switchyard_k8s::k8s_openapi::api::apps::v1::StatefulSet>::namespaced(
        client.clone(),
        ns.name(),
    );
    sets.create(
        &PostParams::default(),
        &serde_json::from_value(workload("StatefulSet", "switchyard-queue")).unwrap(),
    )
    .await
    .unwrap();
    sets.patch_status(
        "switchyard-queue",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2}})),
    )
    .await
    .unwrap();

    // A kubeconfig whose current context is elsewhere; the test's context beside it.
    let original: serde_norway::Value =
        serde_norway::from_str(&std::fs::read_to_string(plane.kubeconfig()).unwrap()).unwrap();
    let context = original["current-context"].as_str().unwrap().to_owned();
    let nowhere = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let mut edited = original.clone();
    let mut elsewhere_cluster = original["clusters"][0].clone();
    elsewhere_cluster["name"] = "elsewhere".into();
    elsewhere_cluster["cluster"]["server"] = format!("https://{nowhere}").into();
    edited["clusters"]
        .as_sequence_mut()
        .unwrap()
        .push(elsewhere_cluster);
    let mut elsewhere_context = original["contexts"][0].clone();
    elsewhere_context["name"] = "elsewhere".into();
    elsewhere_context["context"]["cluster"] = "elsewhere".into();
    edited["contexts"]
        .as_sequence_mut()
        .unwrap()
        .push(elsewhere_context);
    edited["current-context"] = "elsewhere".into();
    let kubeconfig = plane.dir().join(format!("kubeconfig-{}", ns.name()));
    std::fs::write(&kubeconfig, serde_norway::to_string(&edited).unwrap()).unwrap();

    let status = |context: Option<String>| {
        let mut command = tokio::process::Command::new(service_binary("kubectl-switchyard"));
        command
            .args(Pki::shared().flags(Role::Observer))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--switchyard-namespace={}", ns.name()))
            .args(["status", "-o", "json", "--call-timeout=3s"])
            .env_remove("SWITCHYARD_ELECTOR_ADDR")
            .env_remove("SWITCHYARD_QUEUE_ADDR")
            .env_remove("SWITCHYARD_ADMIN_ADDR");
        if let Some(context) = context {
            command.arg(format!("--context={context}"));
        }
        async move { command.output().await.unwrap() }
    };
    let output = status(Some(context)).await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    let parsed: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        parsed["workloads"],
        json!([
            {"kind": "StatefulSet", "name": "switchyard-queue", "replicas": 2, "ready": 2, "updated": 2, "version": "0.1.0"},
            {"kind": "Deployment", "name": "switchyard-watcher", "replicas": 2, "ready": 1, "updated": 2, "version": "0.1.0"},
        ]),
        "{parsed:#}"
    );
    // The current context's apiserver is where nothing listens: named, with the reason.
    let output = status(None).await;
    assert!(!output.status.success());
    let parsed: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&output.stderr)));
    let problem = parsed["problems"][0].as_str().unwrap_or_default();
    assert!(
        problem.contains(&format!("the apiserver at https://{nowhere}"))
            && problem.contains("is unreachable"),
        "{parsed:#}"
    );
}

/// With nothing but a kubeconfig, the plugin finds the services published in the
/// installation's namespace (`switchyard_testenv::publish`, as `make run` publishes its local
/// processes: ExternalName Services) and reads the identity its verb needs from its Secret:
/// the observer's for `status`, the operator's for `why`. A missing Secret is named.
async fn identities_from_secrets(
    plane: &ControlPlane,
    client: &switchyard_k8s::Client,
    topology: &Topology,
    refused: &str,
) {
    let installed = TestNamespace::create(plane, client, "plugin-identity")
        .await
        .unwrap();
    let processes: Vec<(&str, &switchyard_testenv::ServiceProcess)> = topology
        .running
        .iter()
        .map(|(service, process)| (*service, process))
        .collect();
    switchyard_testenv::publish::publish_services(client, installed.name(), &processes)
        .await
        .unwrap();
    let run = |args: &[&str]| {
        let mut command = tokio::process::Command::new(service_binary("kubectl-switchyard"));
        command
            .arg(format!("--kubeconfig={}", plane.kubeconfig().display()))
            .arg(format!("--switchyard-namespace={}", installed.name()))
            .args(args)
            .env_remove("SWITCHYARD_TLS_CERT")
            .env_remove("SWITCHYARD_TLS_KEY")
            .env_remove("SWITCHYARD_TLS_CA")
            .env_remove("SWITCHYARD_ELECTOR_ADDR")
            .env_remove("SWITCHYARD_QUEUE_ADDR")
            .env_remove("SWITCHYARD_ADMIN_ADDR")
            .env("HOME", NO_HOME)
            .kill_on_drop(true);
        async move {
            tokio::time::timeout(RUN_TIMEOUT, command.output())
                .await
                .expect("kubectl switchyard ends")
                .unwrap()
        }
    };

    let missing = run(&["status", "-o", "json"]).await;
    assert!(!missing.status.success());
    assert!(
        text(&missing.stderr).contains(&format!(
            "no identity: Secret {}/switchyard-observer-tls does not exist",
            installed.name()
        )),
        "{}",
        text(&missing.stderr)
    );
    switchyard_testenv::publish::publish_identities(client, installed.name(), Pki::shared())
        .await
        .unwrap();
    let status = run(&["status", "-o", "json"]).await;
    let parsed: Value = serde_json::from_slice(&status.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&status.stderr)));
    assert!(
        status.status.success(),
        "{parsed:#}\n{}",
        text(&status.stderr)
    );
    assert_eq!(parsed["elector"]["shard_count"], SHARDS, "{parsed:#}");
    // Every process's admin port, found through its Service: each names its service.
    let services = parsed["services"].as_array().unwrap();
    let instances: usize = services
        .iter()
        .map(|s| s["instances"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(instances, topology.running.len(), "{parsed:#}");

    // why needs the operator: its Secret is read, not the observer's.
    let why = ["why", "replicaset/web", "-n", refused, "-o", "json"];
    let found = run(&why).await;
    assert!(found.status.success(), "{}", text(&found.stderr));
    let parsed: Value = serde_json::from_slice(&found.stdout).unwrap();
    assert_eq!(parsed["controller"], "apps/v1/ReplicaSet", "{parsed:#}");
    Api::<switchyard_k8s::k8s_openapi::api::core::v1::Secret>::namespaced(
        client.clone(),
        installed.name(),
    )
    .delete("switchyard-operator-tls", &Default::default())
    .await
    .unwrap();
    let missing = run(&why).await;
    assert!(
        text(&missing.stderr).contains("switchyard-operator-tls does not exist"),
        "{}",
        text(&missing.stderr)
    );
}

/// What the console page shows, read from the browser's DOM.
const READ_PAGE: &str = r#"
const all = (sel) => [...document.querySelectorAll(sel)];
const idle = document.querySelector('#backlog tr[data-controller="example.com/v1/Idle"] .depth');
return {
  shards: document.querySelector('#shard-count')?.textContent ?? null,
  cells: all('#shards .shard').length,
  unassigned: all('#shards .shard.unassigned').length,
  owners: [...new Set(all('#shards .shard').map((e) => e.dataset.owner))].sort(),
  idle: idle ? idle.textContent : null,
  reconcilers: all('#reconcilers tr[data-worker]').map((e) => e.dataset.worker),
  failing: all('#failing tr').slice(1).map((e) =>
    e.querySelector('.key').textContent + ' | ' + e.querySelector('.last-error').textContent),
};
"#;

/// `kubectl switchyard console` in headless Chromium: the shard count and owners, the idle
/// controller's backlog, the reconciler and the refused ReplicaSet's failing key with its
/// error; an observer's page withholds failing keys; a non-loopback address is refused.
async fn console_in_a_browser(plugin: &Plugin, namespace: &str) {
    let (_console, url) = plugin.console(Role::Operator).await;
    let browser = switchyard_tests::browser::Browser::start().await.unwrap();
    browser.open(&url).await;
    let failing_key = format!("apps/v1/ReplicaSet {namespace}/web");
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    let seen = loop {
        let seen = browser.eval(READ_PAGE).await;
        let shown = seen["shards"] == json!(SHARDS.to_string())
            && seen["cells"] == SHARDS
            && seen["unassigned"] == 0
            && seen["owners"] == json!(["q0", "q1"])
            && seen["idle"] == json!(IDLE_KEYS.to_string())
            && seen["reconcilers"]
                .as_array()
                .is_some_and(|r| r.contains(&json!("r0")))
            && seen["failing"].as_array().is_some_and(|f| {
                f.iter().any(|row| {
                    let row = row.as_str().unwrap_or_default();
                    row.starts_with(&failing_key) && row.contains("is forbidden")
                })
            });
        if shown {
            break seen;
        }
        assert!(
            Instant::now() < deadline,
            "the console showed within {CONVERGE_TIMEOUT:?}: {seen:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!("console as the operator: {seen}");
    let screenshot = std::env::var_os("SWITCHYARD_CONSOLE_SCREENSHOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("switchyard-console.png"));
    browser.screenshot(&screenshot).await;
    println!("console screenshot: {}", screenshot.display());
    browser.close().await;

    // The observer sees the same page without failing keys, and the console is read-only.
    let (_observer, url) = plugin.console(Role::Observer).await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let page = http.get(&url).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let page = page.text().await.unwrap();
    assert!(
        page.contains(r#"id="failing-denied""#) && !page.contains(&failing_key),
        "{page}"
    );
    assert!(
        page.contains(r#"<span id="shard-count">16</span>"#),
        "{page}"
    );
    let post = http.post(&url).send().await.unwrap();
    assert_eq!(post.status(), 405);
    // A page whose DNS name was rebound to loopback is refused, as kubectl proxy refuses it.
    let rebound = http
        .get(&url)
        .header("host", "rebound.example:80")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 403);
    let refusal = rebound.text().await.unwrap();
    assert!(
        refusal.contains("host \"rebound.example:80\" is not accepted"),
        "{refusal}"
    );

    // Only on loopback: the console is served with the caller's identity.
    let exposed = plugin
        .run(Role::Operator, &["console", "--listen=0.0.0.0:0"])
        .await;
    assert!(!exposed.status.success());
    assert!(
        text(&exposed.stderr).contains("--listen: 0.0.0.0:0 is not a loopback address"),
        "{}",
        text(&exposed.stderr)
    );
}
