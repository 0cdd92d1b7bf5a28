//! Every gRPC handler of the watcher (`Watches.Register`, `Cache.Get`, `Cache.List`,
//! `Cache.GetGraphNode`), driven with arbitrary messages by every identity of the
//! installation, against the harness's real control plane: nothing panics anywhere in the
//! process, no task restarts, and the watcher still keys and serves afterwards. Bounded (a
//! few hundred calls), so it runs in `make test`; a failure prints the seed that replays it
//! (`SWITCHYARD_FUZZ_SEED`).

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use proptest::{
    collection, option,
    prelude::*,
    strategy::ValueTree,
    test_runner::{RngSeed, TestRunner},
};
use switchyard_k8s::{Api, PostParams, k8s_openapi::api::core::v1::ConfigMap};
use switchyard_proto::{
    common::v1::GroupVersionKind as ProtoGvk,
    watcher::v1::{
        ControllerWatches, Freshness, GetGraphNodeRequest, GetRequest, ListRequest,
        RegisterRequest, Watch, cache_client::CacheClient, watches_client::WatchesClient,
    },
};
use switchyard_runtime::Role;
use switchyard_testenv::{
    ControlPlane, Pki, TestNamespace,
    fuzz::{self, Panics},
};
use tonic::transport::Channel;

use support::*;

const CM: &str = "v1/ConfigMap";
const CASES: u32 = 600;
/// How long a Register stream is read before it is dropped (its informers then stop).
const STREAM_READ: Duration = Duration::from_millis(100);
/// How long one case may take: a call that hangs fails the test rather than stalling it.
const CALL_LIMIT: Duration = Duration::from_secs(30);

/// Text as a caller may send it: empty, plausible, any Unicode, oversized, or a path.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just(String::new()),
        3 => "[a-z0-9.-]{1,20}",
        2 => ".{0,16}",
        1 => (254usize..70_000).prop_map(|n| "x".repeat(n)),
        1 => Just("../../secrets".to_owned()),
        1 => Just("a/b".to_owned()),
    ]
}

/// A kind as a caller may name one: the configured ones, Secrets, kinds the apiserver does
/// not serve, or any text.
fn gvk() -> impl Strategy<Value = Option<ProtoGvk>> {
    let named = |group: &str, version: &str, kind: &str| ProtoGvk {
        group: group.into(),
        version: version.into(),
        kind: kind.into(),
    };
    option::of(prop_oneof![
        3 => Just(named("", "v1", "ConfigMap")),
        2 => Just(named("", "v1", "Secret")),
        1 => Just(named("", "v1", "Pod")),
        1 => Just(named("apps", "v1", "ReplicaSet")),
        1 => Just(named("example.com", "v1", "Nope")),
        1 => Just(named("", "v1", "Nope")),
        2 => (text(), text(), text()).prop_map(|(g, v, k)| ProtoGvk {
            group: g,
            version: v,
            kind: k,
        }),
    ])
}

/// A resource version or a label selector as a caller may write one.
fn selector() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("app=web".to_owned()),
        Just("app in (a,b),!tier,env notin (x)".to_owned()),
        Just("app in (".to_owned()),
        (1usize..20_000).prop_map(|n| format!("k in ({})", "v,".repeat(n))),
        (1usize..3000).prop_map(|n| "(".repeat(n)),
        ".{0,40}",
    ]
}

fn duration() -> impl Strategy<Value = Option<prost_types::Duration>> {
    option::of(prop_oneof![
        Just((i64::MIN, i32::MIN)),
        Just((i64::MAX, i32::MAX)),
        Just((-1, 0)),
        Just((0, -1)),
        Just((0, 1_000)),
        (0i64..5, any::<i32>()),
        (any::<i64>(), any::<i32>()),
    ])
    .prop_map(|d| d.map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }))
}

fn freshness() -> impl Strategy<Value = Option<Freshness>> {
    let version = prop_oneof![
        Just(String::new()),
        Just("1".to_owned()),
        Just(u64::MAX.to_string()),
        Just("18446744073709551616".to_owned()),
        Just("-1".to_owned()),
        text(),
    ];
    option::of((version.clone(), duration(), version)).prop_map(|f| {
        f.map(
            |(min_resource_version, max_wait, kind_min_resource_version)| Freshness {
                min_resource_version,
                // Waits are capped by the watcher; keep the fuzz fast all the same.
                max_wait: max_wait.map(|d| prost_types::Duration {
                    seconds: d.seconds.min(0),
                    nanos: d.nanos,
                }),
                kind_min_resource_version,
            },
        )
    })
}

fn watch() -> impl Strategy<Value = Watch> {
    (
        gvk(),
        collection::vec(any::<i32>(), 0..3),
        any::<bool>(),
        gvk(),
        text(),
        duration(),
        any::<bool>(),
        text(),
        collection::vec(text(), 0..3),
        text(),
    )
        .prop_map(
            |(
                gvk,
                predicates,
                metadata_only,
                through,
                label,
                batch_period,
                status_only,
                selector,
                fields_changed,
                field_selector,
            )| {
                Watch {
                    gvk,
                    predicates,
                    metadata_only,
                    through,
                    label,
                    batch_period,
                    batch_status_updates_only: status_only,
                    label_selector: selector,
                    fields_changed,
                    field_selector,
                    not_written_by: Vec::new(),
                }
            },
        )
}

/// A watch of a kind the reconciler identity may have, with arbitrary options.
fn granted_watch() -> impl Strategy<Value = Watch> {
    let kind = prop_oneof![Just("ConfigMap"), Just("Secret"), Just("Pod"), Just("Nope")];
    (kind, watch()).prop_map(|(kind, watch)| Watch {
        gvk: Some(ProtoGvk {
            group: String::new(),
            version: "v1".into(),
            kind: kind.into(),
        }),
        ..watch
    })
}

/// A controller the reconciler identity may register: granted kinds, plausible options.
fn granted_controller() -> impl Strategy<Value = ControllerWatches> {
    let plain = || {
        (
            prop_oneof![Just("ConfigMap"), Just("Secret"), Just("Pod")],
            collection::vec(1..=3i32, 0..2),
            any::<bool>(),
        )
            .prop_map(|(kind, predicates, metadata_only)| Watch {
                gvk: Some(ProtoGvk {
                    group: String::new(),
                    version: "v1".into(),
                    kind: kind.into(),
                }),
                predicates,
                metadata_only,
                ..Watch::default()
            })
    };
    (
        prop_oneof![Just(CM.to_owned()), Just("example.com/v1/Fuzz".to_owned())],
        plain(),
        collection::vec(plain(), 0..2),
    )
        .prop_map(|(name, reconciles, owns)| ControllerWatches {
            name,
            reconciles: Some(reconciles),
            owns,
            by_label: Vec::new(),
            by_namespace: Vec::new(),
            by_selector: Vec::new(),
            by_placement: Vec::new(),
            by_name: Vec::new(),
            namespaces: vec![],
        })
}

fn controller() -> impl Strategy<Value = ControllerWatches> {
    let watch = || prop_oneof![granted_watch(), watch()];
    (
        prop_oneof![
            Just(CM.to_owned()),
            Just("example.com/v1/Fuzz".to_owned()),
            text()
        ],
        option::of(watch()),
        collection::vec(watch(), 0..3),
        collection::vec(watch(), 0..2),
        collection::vec(watch(), 0..2),
        collection::vec(watch(), 0..2),
        collection::vec(watch(), 0..2),
        collection::vec(watch(), 0..2),
    )
        .prop_map(
            |(
                name,
                reconciles,
                owns,
                by_label,
                by_namespace,
                by_selector,
                by_placement,
                by_name,
            )| {
                ControllerWatches {
                    name,
                    reconciles,
                    owns,
                    by_label,
                    by_namespace,
                    by_selector,
                    by_placement,
                    by_name,
                    namespaces: vec![],
                }
            },
        )
}

#[derive(Clone, Debug)]
enum Call {
    Register(String, Vec<ControllerWatches>),
    Get(GetRequest),
    List(ListRequest),
    GraphNode(String),
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        2 => (
            text(),
            prop_oneof![
                5 => collection::vec(controller(), 0..3),
                4 => collection::vec(granted_controller(), 1..3),
                1 => (100usize..300).prop_map(|n| vec![ControllerWatches::default(); n]),
            ]
        )
            .prop_map(|(registrant, controllers)| Call::Register(registrant, controllers)),
        3 => (gvk(), text(), text(), freshness()).prop_map(|(gvk, namespace, name, freshness)| {
            Call::Get(GetRequest {
                gvk,
                namespace,
                name,
                freshness,
            })
        }),
        3 => (gvk(), text(), selector(), text(), freshness(), any::<bool>()).prop_map(
            |(gvk, namespace, label_selector, controller_uid, freshness, either)| {
                Call::List(ListRequest {
                    gvk,
                    namespace,
                    label_selector,
                    controller_uid,
                    freshness,
                    either,
                })
            }
        ),
        1 => text().prop_map(Call::GraphNode),
    ]
}

struct Clients {
    watches: WatchesClient<Channel>,
    cache: CacheClient<Channel>,
}

/// What one call got: `ok` or its status code, for the tally the test prints.
fn outcome<T>(result: &Result<T, tonic::Status>) -> String {
    match result {
        Ok(_) => "ok".to_owned(),
        // An internal error is a bug of the watcher's: shown whole.
        Err(status) if status.code() == tonic::Code::Internal => {
            format!("Internal: {}", status.message())
        }
        Err(status) => format!("{:?}", status.code()),
    }
}

/// Makes `call`; returns its kind and what it got.
async fn make(clients: &mut Clients, call: Call) -> (&'static str, String) {
    // Refusals are expected; only the watcher's survival is asserted.
    match call {
        Call::Register(registrant, controllers) => {
            let request = RegisterRequest {
                registrant,
                controllers,
            };
            let result = clients.watches.register(request).await;
            let got = outcome(&result);
            if let Ok(response) = result {
                let mut stream = response.into_inner();
                let _ = tokio::time::timeout(STREAM_READ, stream.message()).await;
            }
            ("register", got)
        }
        Call::Get(request) => ("get", outcome(&clients.cache.get(request).await)),
        Call::List(request) => {
            let result = clients.cache.list(request).await;
            let got = outcome(&result);
            if let Ok(response) = result {
                let mut stream = response.into_inner();
                let _ = tokio::time::timeout(STREAM_READ, async {
                    while let Ok(Some(_)) = stream.message().await {}
                })
                .await;
            }
            ("list", got)
        }
        Call::GraphNode(uid) => (
            "graph node",
            outcome(
                &clients
                    .cache
                    .get_graph_node(GetGraphNodeRequest { uid })
                    .await,
            ),
        ),
    }
}

/// The calls, each with the index of the role that makes it. Drawn on a thread of their own:
/// proptest's unions of these strategies need more than a test thread's stack in a debug
/// build.
fn cases(seed: u64) -> Vec<(usize, Call)> {
    std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(move || {
            let mut runner = TestRunner::new(ProptestConfig {
                cases: CASES,
                rng_seed: RngSeed::Fixed(seed),
                ..ProptestConfig::default()
            });
            // Mostly the reconciler, the one role the watcher serves: the others are refused
            // by the table before any handler runs.
            let reconciler = Role::ALL.iter().position(|r| *r == Role::Reconciler);
            let who = prop_oneof![4 => Just(reconciler.unwrap()), 1 => 0..Role::ALL.len()];
            let strategy = (who, call());
            (0..CASES)
                .map(|_| strategy.new_tree(&mut runner).unwrap().current())
                .collect()
        })
        .unwrap()
        .join()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbitrary_calls_from_every_identity_leave_the_watcher_serving() {
    let panics = Panics::count();
    let seed = fuzz::seed();
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watcher-fuzz")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let queue = queue(&[CM], &[]).await;
    let mut worker = Worker::start(queue.grpc()).await;
    // ConfigMaps keyed by the file; Secrets, Pods and kinds nobody serves granted to the
    // reconciler identity, so that registrations reach the informers.
    let config = format!(
        "shardCount: {SHARDS}
namespaces: {{include: [{ns}]}}
controllers:
  - name: {CM}
    for: {{apiVersion: v1, kind: ConfigMap}}
registrations:
  - serviceAccount: switchyard-reconciler
    kinds:
      - {{apiVersion: v1, kind: Secret, objects: full}}
      - {{apiVersion: v1, kind: Pod}}
      - {{apiVersion: example.com/v1, kind: Nope, objects: full}}
      - {{apiVersion: v1, kind: Nope, objects: full}}
"
    );
    let watcher = watcher(plane, &config, &format!("--queue-addr={}", queue.grpc())).await;
    watcher.wait_ready(WITHIN).await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let config_map = |name: &str| -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"app": "web"}},
        }))
        .unwrap()
    };
    maps.create(&PostParams::default(), &config_map("before"))
        .await
        .unwrap();
    worker.expect(&key(CM, &ns, "before"), WITHIN).await;

    let mut clients = Vec::new();
    for role in Role::ALL {
        let channel = Pki::shared()
            .channel(role, Role::Watcher, watcher.grpc())
            .await
            .unwrap();
        clients.push(Clients {
            watches: WatchesClient::new(channel.clone()),
            cache: CacheClient::new(channel),
        });
    }
    let mut tally = std::collections::BTreeMap::<_, usize>::new();
    for (case, (who, call)) in cases(seed).into_iter().enumerate() {
        let shown = format!("{call:?}");
        let Ok(got) = tokio::time::timeout(CALL_LIMIT, make(&mut clients[who], call)).await else {
            panic!(
                "case {case} as {:?} hung (panics: {:?}): {shown:.2000}",
                Role::ALL[who],
                panics.so_far()
            );
        };
        if got.1.starts_with("Internal") {
            eprintln!("case {case} as {:?}: {shown:.300}", Role::ALL[who]);
        }
        *tally.entry(got).or_default() += 1;
    }
    eprintln!("calls made: {tally:?}");
    // An internal error here is a refusal the caller could not read (a status message
    // larger than a header may be), or a bug of the watcher's.
    let internal: Vec<_> = tally
        .keys()
        .filter(|(_, got)| got.starts_with("Internal"))
        .collect();
    assert!(internal.is_empty(), "{internal:?}");

    // Nothing panicked, the watcher is alive with no task restarted, and it still keys and
    // serves.
    let (count, first) = panics.so_far();
    assert_eq!(count, 0, "{first:?}");
    let (status, body) = watcher.admin_get("/livez").await;
    assert_eq!(status, 200, "{body}");
    let (_, metrics) = watcher.admin_get("/metrics").await;
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("switchyard_task_restarts_total{") && !l.ends_with(" 0")),
        "{metrics}"
    );
    maps.create(&PostParams::default(), &config_map("after"))
        .await
        .unwrap();
    worker.expect(&key(CM, &ns, "after"), WITHIN).await;
    let mut cache = cache_client(watcher.grpc()).await;
    let got = cache
        .get(GetRequest {
            gvk: Some(ProtoGvk {
                group: String::new(),
                version: "v1".into(),
                kind: "ConfigMap".into(),
            }),
            namespace: ns.clone(),
            name: "after".into(),
            freshness: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(got.found);
}
