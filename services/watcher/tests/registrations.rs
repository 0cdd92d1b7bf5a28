//! Watches registered over gRPC (`Watches.Register`) while the watcher runs: informers
//! started for a registration, shared with the configuration file and with other
//! registrations, and stopped when the last user goes. Against the harness's real control
//! plane, with a real queue.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use switchyard_k8s::{
    Api, PostParams,
    k8s_openapi::api::core::v1::{ConfigMap, Secret},
};
use switchyard_proto::{
    common::v1::GroupVersionKind as ProtoGvk,
    watcher::v1::{
        ControllerWatches, GetRequest, ListRequest, RegisterRequest, RegisterResponse, Watch,
        cache_client::CacheClient, watches_client::WatchesClient,
    },
};
use switchyard_runtime::Role;
use switchyard_testenv::{ControlPlane, TestNamespace};
use tonic::{Code, Status, Streaming, transport::Channel};

use support::*;

/// The controller the tests register: ConfigMaps, owning Secrets.
const CM: &str = "v1/ConfigMap";
const INFORMERS: &str = "switchyard_watcher_informers";
const REGISTRATIONS: &str = "switchyard_watcher_registrations";

fn gvk(group: &str, version: &str, kind: &str) -> Option<ProtoGvk> {
    Some(ProtoGvk {
        group: group.into(),
        version: version.into(),
        kind: kind.into(),
    })
}

fn watch(version: &str, kind: &str) -> Watch {
    Watch {
        gvk: gvk("", version, kind),
        ..Watch::default()
    }
}

/// For ConfigMaps, owns Secrets.
fn config_maps() -> ControllerWatches {
    ControllerWatches {
        name: CM.into(),
        reconciles: Some(watch("v1", "ConfigMap")),
        owns: vec![watch("v1", "Secret")],
        by_label: vec![],
        by_namespace: vec![],
        by_selector: vec![],
        by_placement: vec![],
        by_name: vec![],
        namespaces: vec![],
    }
}

fn request(registrant: &str, controllers: Vec<ControllerWatches>) -> RegisterRequest {
    RegisterRequest {
        registrant: registrant.into(),
        controllers,
    }
}

/// What these tests' registrations watch, granted in full to the reconciler identity they
/// register as.
const GRANTS: &str = "registrations:
  - serviceAccount: switchyard-reconciler
    kinds:
      - {apiVersion: v1, kind: ConfigMap, objects: full}
      - {apiVersion: v1, kind: Secret, objects: full}
      - {apiVersion: v1, kind: Pod, objects: full}
      # Kinds the apiserver does not serve: granted, so that serving is what refuses them.
      - {apiVersion: example.com/v1, kind: Nope, objects: full}
      - {apiVersion: v1, kind: Nope, objects: full}
";

/// A configuration file with no controllers: the watcher waits for registrations.
fn registrations_only(namespace: &str) -> String {
    format!("shardCount: {SHARDS}\nnamespaces: {{include: [{namespace}]}}\n{GRANTS}")
}

/// Registers and waits for the one response; the registration lasts while the stream does.
async fn register(
    client: &mut WatchesClient<Channel>,
    request: RegisterRequest,
) -> (Streaming<RegisterResponse>, Vec<String>) {
    let mut stream = client.register(request).await.unwrap().into_inner();
    let response = tokio::time::timeout(WITHIN, stream.message())
        .await
        .expect("the registration is answered once its kinds are listed")
        .unwrap()
        .expect("one response");
    let mut kinds: Vec<String> = response
        .synced
        .iter()
        .map(|g| format!("{}/{}/{}", g.group, g.version, g.kind))
        .collect();
    kinds.sort();
    (stream, kinds)
}

async fn refused(client: &mut WatchesClient<Channel>, request: RegisterRequest) -> Status {
    match client.register(request).await {
        Ok(_) => panic!("the registration was accepted"),
        Err(status) => status,
    }
}

/// The sum of every series of `family` on the watcher's `/metrics`.
async fn total(watcher: &InProcess, family: &str) -> f64 {
    let (_, text) = watcher.admin_get("/metrics").await;
    text.lines()
        .filter(|line| {
            line.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

fn informers_of(kind: &str) -> String {
    format!("{INFORMERS}{{resource=\"{kind}\"}}")
}

/// Waits until `check` holds; fails naming `what` after [`WITHIN`].
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < WITHIN, "not within {WITHIN:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"greeting": "hello"}
    }))
    .unwrap()
}

fn get(kind: &str, namespace: &str, name: &str) -> GetRequest {
    GetRequest {
        gvk: gvk("", "v1", kind),
        namespace: namespace.into(),
        name: name.into(),
        freshness: None,
    }
}

#[tokio::test]
async fn a_registration_starts_informers_that_key_and_serve_until_its_stream_ends() {
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watches-life")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let queue = queue(&[CM], &[]).await;
    let mut worker = Worker::start(queue.grpc()).await;
    let watcher = watcher(
        plane,
        &registrations_only(&ns),
        &format!("--queue-addr={}", queue.grpc()),
    )
    .await;
    watcher.wait_ready(WITHIN).await;
    assert_eq!(
        total(&watcher, INFORMERS).await,
        0.0,
        "nothing to watch yet"
    );
    let mut cache = cache_client(watcher.grpc()).await;
    let mut watches = watches_client(Role::Reconciler, watcher.grpc()).await;

    let (stream, kinds) =
        register(&mut watches, request("reconciler-0", vec![config_maps()])).await;
    assert_eq!(kinds, ["/v1/ConfigMap", "/v1/Secret"]);
    assert_eq!(watcher.metric(&informers_of("v1/ConfigMap")).await, 1.0);
    assert_eq!(watcher.metric(&informers_of("v1/Secret")).await, 1.0);
    assert_eq!(watcher.metric(REGISTRATIONS).await, 1.0);
    // Listed when answered: the Cache API serves the kind at once.
    let missing = cache
        .get(get("ConfigMap", &ns, "settings"))
        .await
        .unwrap()
        .into_inner();
    assert!(!missing.found);

    // A ConfigMap keys itself; a Secret it controls keys it.
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let settings = maps
        .create(&PostParams::default(), &config_map("settings"))
        .await
        .unwrap();
    let settings_key = key(CM, &ns, "settings");
    worker.expect(&settings_key, WITHIN).await;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "token", "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "settings",
            "uid": settings.metadata.uid.clone().unwrap(), "controller": true
        }]},
        "stringData": {"token": "t"}
    }))
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    worker.expect(&settings_key, WITHIN).await;
    let got = cache
        .get(get("Secret", &ns, "token"))
        .await
        .unwrap()
        .into_inner();
    assert!(got.found);

    // The stream ends: the informers stop, their caches go. A kind granted to the caller
    // answers UNAVAILABLE until a registration brings it back (a restarted watcher, before
    // the reconcilers register again), so that the read is retried or goes to another
    // replica.
    drop(stream);
    eventually("the informers stop when the stream ends", async || {
        total(&watcher, INFORMERS).await == 0.0 && watcher.metric(REGISTRATIONS).await == 0.0
    })
    .await;
    let status = cache
        .get(get("ConfigMap", &ns, "settings"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status
            .message()
            .contains("v1/ConfigMap is watched for no registration of this watcher now"),
        "{}",
        status.message()
    );
    assert_eq!(
        watcher
            .metric(r#"switchyard_cache_objects{resource="v1/ConfigMap"}"#)
            .await,
        0.0
    );

    // A watcher that stops ends every registration's stream (the reconciler registers
    // again with the next one), and does not wait for them to end first.
    let (mut stream, _) =
        register(&mut watches, request("reconciler-0", vec![config_maps()])).await;
    let stopping = tokio::spawn(watcher.stop());
    let end = tokio::time::timeout(WITHIN, stream.message())
        .await
        .expect("the stream ends when the watcher stops");
    assert!(matches!(end, Ok(None)), "{end:?}");
    let took = stopping.await.unwrap();
    assert!(
        took < Duration::from_secs(10),
        "the watcher took {took:?} to stop"
    );
    queue.stop().await;
}

#[tokio::test]
async fn a_hundred_registrations_leave_nothing_behind() {
    const CYCLES: usize = 100;
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watches-cycles")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let pods: Api<switchyard_k8s::Pod> = Api::namespaced(client.clone(), &ns);
    pods.create(&PostParams::default(), &pod("lone", &[], None))
        .await
        .unwrap();
    let queue = queue(&[CM], &[]).await;
    // Pods are the file's (cached only); every registration shares them.
    let config = format!(
        "shardCount: {SHARDS}\nnamespaces: {{include: [{ns}]}}\nresources: [{{apiVersion: v1, kind: Pod}}]\n{GRANTS}"
    );
    let watcher = watcher(plane, &config, &format!("--queue-addr={}", queue.grpc())).await;
    watcher.wait_ready(WITHIN).await;
    let informer_tasks = r#"switchyard_tasks{task="informer"}"#;
    let pods_listed = r#"switchyard_watch_events_total{resource="v1/Pod",event="listed"}"#;
    assert_eq!(total(&watcher, INFORMERS).await, 1.0);
    assert_eq!(watcher.metric(informer_tasks).await, 1.0);
    assert_eq!(watcher.metric(pods_listed).await, 1.0);

    let mut watches = watches_client(Role::Reconciler, watcher.grpc()).await;
    let controller = ControllerWatches {
        owns: vec![watch("v1", "Pod")],
        ..config_maps()
    };
    for cycle in 0..CYCLES {
        let (stream, kinds) = register(
            &mut watches,
            request(&format!("reconciler-{cycle}"), vec![controller.clone()]),
        )
        .await;
        assert_eq!(kinds, ["/v1/ConfigMap", "/v1/Pod"], "cycle {cycle}");
        drop(stream);
    }
    eventually(
        "every registration ends and its informers stop",
        async || {
            watcher.metric(REGISTRATIONS).await == 0.0
                && total(&watcher, INFORMERS).await == 1.0
                && watcher.metric(informer_tasks).await == 1.0
        },
    )
    .await;
    assert_eq!(watcher.metric(&informers_of("v1/Pod")).await, 1.0);
    assert_eq!(
        watcher.metric(pods_listed).await,
        1.0,
        "the shared Pod informer was listed again"
    );
    assert_eq!(
        watcher
            .metric(r#"switchyard_task_restarts_total{task="informer"}"#)
            .await,
        0.0,
        "a stopped informer counted as a restart"
    );
    assert_eq!(
        watcher
            .metric(r#"switchyard_cache_objects{resource="v1/ConfigMap"}"#)
            .await,
        0.0
    );

    watcher.stop().await;
    queue.stop().await;
}

#[tokio::test]
async fn two_registrants_of_one_controller_share_its_informers_and_keys() {
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watches-shared")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let queue = queue(&[CM], &[]).await;
    let mut worker = Worker::start(queue.grpc()).await;
    let watcher = watcher(
        plane,
        &registrations_only(&ns),
        &format!("--queue-addr={}", queue.grpc()),
    )
    .await;
    watcher.wait_ready(WITHIN).await;
    let mut watches = watches_client(Role::Reconciler, watcher.grpc()).await;
    let (first, _) = register(&mut watches, request("replica-a", vec![config_maps()])).await;
    let (second, _) = register(&mut watches, request("replica-b", vec![config_maps()])).await;
    assert_eq!(watcher.metric(REGISTRATIONS).await, 2.0);
    assert_eq!(watcher.metric(&informers_of("v1/ConfigMap")).await, 1.0);
    assert_eq!(
        total(&watcher, INFORMERS).await,
        2.0,
        "ConfigMaps and Secrets, once each"
    );
    let pending = "switchyard_watcher_pending_keys";
    let sent = "switchyard_watcher_keys_sent_total";
    eventually("the first lists' keys are sent", async || {
        watcher.metric(pending).await == 0.0
    })
    .await;
    let before = watcher.metric(sent).await;

    // One change, one key: the second registrant adds no rule.
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    maps.create(&PostParams::default(), &config_map("x"))
        .await
        .unwrap();
    let x = key(CM, &ns, "x");
    worker.expect(&x, WITHIN).await;
    let again = worker.leased_during(Duration::from_millis(700)).await;
    assert!(!again.contains(&x), "a change was leased twice: {again:?}");
    assert_eq!(
        watcher.metric(sent).await - before,
        1.0,
        "one key sent per change"
    );

    // The first registrant goes: the informer keeps running for the second.
    drop(first);
    eventually("the first registration ends", async || {
        watcher.metric(REGISTRATIONS).await == 1.0
    })
    .await;
    assert_eq!(watcher.metric(&informers_of("v1/ConfigMap")).await, 1.0);
    maps.create(&PostParams::default(), &config_map("y"))
        .await
        .unwrap();
    worker.expect(&key(CM, &ns, "y"), WITHIN).await;

    drop(second);
    eventually(
        "the informers stop with the last registration",
        async || total(&watcher, INFORMERS).await == 0.0,
    )
    .await;

    watcher.stop().await;
    queue.stop().await;
}

#[tokio::test]
async fn refused_registrations_name_the_problem_and_change_nothing() {
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watches-refused")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let queue = queue(&[CM], &[]).await;
    let config = format!(
        r#"
shardCount: {SHARDS}
namespaces: {{include: [{ns}]}}
controllers:
  - name: {CM}
    for: {{apiVersion: v1, kind: ConfigMap}}
    owns: [{{apiVersion: v1, kind: Secret}}]
{GRANTS}"#
    );
    let watcher = watcher(plane, &config, &format!("--queue-addr={}", queue.grpc())).await;
    watcher.wait_ready(WITHIN).await;
    assert_eq!(total(&watcher, INFORMERS).await, 2.0);
    let mut watches = watches_client(Role::Reconciler, watcher.grpc()).await;
    let unchanged = async || {
        assert_eq!(watcher.metric(REGISTRATIONS).await, 0.0);
        assert_eq!(total(&watcher, INFORMERS).await, 2.0);
    };

    // A kind the apiserver does not serve, in a group it does not serve or in one it does.
    let nope = ControllerWatches {
        name: "example.com/v1/Nope".into(),
        reconciles: Some(Watch {
            gvk: gvk("example.com", "v1", "Nope"),
            ..Watch::default()
        }),
        owns: vec![watch("v1", "Pod")],
        by_label: vec![],
        by_namespace: vec![],
        by_selector: vec![],
        by_placement: vec![],
        by_name: vec![],
        namespaces: vec![],
    };
    let status = refused(&mut watches, request("reconciler-0", vec![nope])).await;
    assert_eq!(status.code(), Code::NotFound);
    assert!(
        status
            .message()
            .starts_with("controllers[0].reconciles.gvk: example.com/v1/Nope is not served"),
        "{}",
        status.message()
    );
    let owns_nope = ControllerWatches {
        owns: vec![watch("v1", "Nope")],
        ..config_maps()
    };
    let renamed = ControllerWatches {
        name: "other".into(),
        ..owns_nope
    };
    let status = refused(&mut watches, request("reconciler-0", vec![renamed])).await;
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(
        status.message(),
        "controllers[0].owns[0].gvk: v1/Nope is not served by the apiserver (v1 has no kind Nope)"
    );
    unchanged().await;
    assert_eq!(watcher.metric(&informers_of("v1/Pod")).await, 0.0);

    // The file's controller with other watches: both sources named.
    let other = ControllerWatches {
        owns: vec![watch("v1", "Pod")],
        ..config_maps()
    };
    let status = refused(&mut watches, request("reconciler-1", vec![other])).await;
    assert_eq!(status.code(), Code::FailedPrecondition);
    let message = status.message();
    assert!(
        message.starts_with(
            "controllers[0]: \"v1/ConfigMap\" of registrant \"reconciler-1\" declares other watches than controllers[0] of the configuration file /"
        ) && message.ends_with("only in the file: owns v1/Secret; only in the registration: owns v1/Pod"),
        "{message}"
    );
    unchanged().await;

    // The file's controller with the file's watches: accepted, nothing new to run.
    let (same, kinds) = register(&mut watches, request("reconciler-2", vec![config_maps()])).await;
    assert_eq!(kinds, ["/v1/ConfigMap", "/v1/Secret"]);
    assert_eq!(watcher.metric(REGISTRATIONS).await, 1.0);
    assert_eq!(total(&watcher, INFORMERS).await, 2.0);
    drop(same);
    eventually("the registration ends", async || {
        watcher.metric(REGISTRATIONS).await == 0.0
    })
    .await;
    unchanged().await;

    // Malformed: the field is named.
    let status = refused(&mut watches, request("", vec![config_maps()])).await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "registrant: required");
    let mut bad = config_maps();
    bad.owns.push(watch("v1", "secret"));
    let status = refused(&mut watches, request("reconciler-3", vec![bad])).await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status
            .message()
            .starts_with("controllers[0].owns[1].gvk.kind: \"secret\" must be a CamelCase name"),
        "{}",
        status.message()
    );
    let mut bad = config_maps();
    bad.by_label.push(watch("v1", "Secret"));
    let status = refused(&mut watches, request("reconciler-3", vec![bad])).await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status
            .message()
            .starts_with("controllers[0].by_label[0].label: required"),
        "{}",
        status.message()
    );
    // Only reconcilers register.
    let mut queue_identity = watches_client(Role::Queue, watcher.grpc()).await;
    let status = refused(&mut queue_identity, request("queue", vec![config_maps()])).await;
    assert_eq!(status.code(), Code::PermissionDenied);
    unchanged().await;

    watcher.stop().await;
    queue.stop().await;
}

/// A kind the file caches metadata-only is shared as it is with a registration that asks
/// for metadata only (the registration's controller keys what is already cached), and
/// replaced by a whole-object informer while a registration needs whole objects.
#[tokio::test]
async fn a_kind_is_cached_whole_while_a_registration_needs_it_whole() {
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watches-mode")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    maps.create(&PostParams::default(), &config_map("settings"))
        .await
        .unwrap();
    let queue = queue(&[CM, "lean"], &[]).await;
    let mut worker = Worker::start(queue.grpc()).await;
    let config = format!(
        "shardCount: {SHARDS}\nnamespaces: {{include: [{ns}]}}\nresources: [{{apiVersion: v1, kind: ConfigMap, metadataOnly: true}}]\n{GRANTS}"
    );
    let watcher = watcher(plane, &config, &format!("--queue-addr={}", queue.grpc())).await;
    watcher.wait_ready(WITHIN).await;
    let mut cache = cache_client(watcher.grpc()).await;
    let has_data = async |cache: &mut switchyard_proto::watcher::v1::cache_client::CacheClient<
        Channel,
    >| {
        cache
            .get(get("ConfigMap", &ns, "settings"))
            .await
            .ok()
            .map(|got| {
                let got = got.into_inner();
                assert!(got.found);
                let object: serde_json::Value = serde_json::from_slice(&got.object_json).unwrap();
                object.get("data").is_some()
            })
    };
    assert_eq!(has_data(&mut cache).await, Some(false));
    let listed = r#"switchyard_watch_events_total{resource="v1/ConfigMap",event="listed"}"#;
    assert_eq!(watcher.metric(listed).await, 1.0);

    // Metadata only, like the file: the informer is shared, and the object it had already
    // cached is keyed for the new controller.
    let lean = ControllerWatches {
        name: "lean".into(),
        reconciles: Some(Watch {
            metadata_only: true,
            ..watch("v1", "ConfigMap")
        }),
        owns: vec![],
        by_label: vec![],
        by_namespace: vec![],
        by_selector: vec![],
        by_placement: vec![],
        by_name: vec![],
        namespaces: vec![],
    };
    let (lean_stream, _) = register(
        &mut watches_client(Role::Reconciler, watcher.grpc()).await,
        request("lean-0", vec![lean]),
    )
    .await;
    worker.expect(&key("lean", &ns, "settings"), WITHIN).await;
    assert_eq!(
        watcher.metric(listed).await,
        1.0,
        "a shared informer listed again"
    );

    // Whole objects: a new informer replaces it, and the cache serves whole objects.
    let mut watches = watches_client(Role::Reconciler, watcher.grpc()).await;
    let whole = ControllerWatches {
        owns: vec![],
        ..config_maps()
    };
    let (whole_stream, _) = register(&mut watches, request("whole-0", vec![whole])).await;
    assert_eq!(has_data(&mut cache).await, Some(true));
    assert_eq!(watcher.metric(listed).await, 2.0);
    assert_eq!(watcher.metric(&informers_of("v1/ConfigMap")).await, 1.0);
    worker.expect(&key(CM, &ns, "settings"), WITHIN).await;

    // The last whole-object user goes: metadata only again.
    drop(whole_stream);
    eventually("metadata-only again", async || {
        has_data(&mut cache).await == Some(false)
    })
    .await;
    assert_eq!(watcher.metric(&informers_of("v1/ConfigMap")).await, 1.0);
    drop(lean_stream);
    eventually("the registration ends", async || {
        watcher.metric(REGISTRATIONS).await == 0.0
    })
    .await;
    assert_eq!(
        total(&watcher, INFORMERS).await,
        1.0,
        "the file's informer stays"
    );

    watcher.stop().await;
    queue.stop().await;
}

#[tokio::test]
async fn a_registrant_watches_and_reads_only_what_its_service_account_is_granted() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watches-grants")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let queue = queue(&[CM], &[]).await;
    // ConfigMaps as metadata only; nothing else (Secrets above all).
    let config = format!(
        "shardCount: {SHARDS}\nnamespaces: {{include: [{ns}]}}\nregistrations:\n  - serviceAccount: switchyard-reconciler\n    kinds: [{{apiVersion: v1, kind: ConfigMap}}]\n"
    );
    let watcher = watcher(plane, &config, &format!("--queue-addr={}", queue.grpc())).await;
    watcher.wait_ready(WITHIN).await;
    let mut watches = watches_client(Role::Reconciler, watcher.grpc()).await;

    let secrets = ControllerWatches {
        name: "example.com/v1/SecretReader".into(),
        reconciles: Some(watch("v1", "Secret")),
        owns: vec![],
        by_label: vec![],
        by_namespace: vec![],
        by_selector: vec![],
        by_placement: vec![],
        by_name: vec![],
        namespaces: vec![],
    };
    let status = refused(&mut watches, request("reconciler-0", vec![secrets])).await;
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(
        status.message(),
        "controllers[0].reconciles.gvk: v1/Secret is not granted to service account \
         \"switchyard-reconciler\" (the watcher configuration's registrations)"
    );
    let whole = ControllerWatches {
        owns: vec![],
        ..config_maps()
    };
    let status = refused(&mut watches, request("reconciler-0", vec![whole.clone()])).await;
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(
        status.message().contains(
            "v1/ConfigMap is granted to service account \"switchyard-reconciler\" as metadata only"
        ),
        "{}",
        status.message()
    );
    assert_eq!(watcher.metric(REGISTRATIONS).await, 0.0);
    // As metadata only, it is accepted and served.
    let metadata = ControllerWatches {
        reconciles: Some(Watch {
            metadata_only: true,
            ..watch("v1", "ConfigMap")
        }),
        ..whole
    };
    let (_held, kinds) = register(&mut watches, request("reconciler-0", vec![metadata])).await;
    assert_eq!(kinds, ["/v1/ConfigMap"]);

    // The Cache API serves what the account may read, and refuses the rest by name.
    let mut cache = cache_client(watcher.grpc()).await;
    let found = cache.get(get("ConfigMap", &ns, "none")).await.unwrap();
    assert!(!found.into_inner().found);
    let status = cache.get(get("Secret", &ns, "any")).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(
        status
            .message()
            .starts_with("gvk: v1/Secret is neither in the watcher's configuration nor granted"),
        "{}",
        status.message()
    );
}

/// The object a Get found, parsed.
async fn found(cache: &mut CacheClient<Channel>, request: GetRequest) -> serde_json::Value {
    let response = cache.get(request).await.unwrap().into_inner();
    assert!(response.found, "found");
    serde_json::from_slice(&response.object_json).unwrap()
}

/// The refusal of a Get; fails showing the object if it was served.
async fn get_refused(cache: &mut CacheClient<Channel>, request: GetRequest) -> Status {
    match cache.get(request).await {
        Ok(served) => panic!(
            "served: {}",
            String::from_utf8_lossy(&served.into_inner().object_json)
        ),
        Err(status) => status,
    }
}

fn assert_denied(status: &Status, kind: &str, account: &str) {
    assert_eq!(
        status.code(),
        Code::PermissionDenied,
        "{}",
        status.message()
    );
    assert!(
        status.message().contains(kind) && status.message().contains(&format!("{account:?}")),
        "names {kind} and {account}: {}",
        status.message()
    );
}

#[tokio::test]
async fn a_kind_cached_for_one_service_account_is_not_served_to_another() {
    const VAULT: &str = "vault-switchyard-reconciler";
    const BUILT_IN: &str = "switchyard-reconciler";
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watches-scope")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let queue = queue(&[CM], &[]).await;
    // A controller of its own may have Secrets and ConfigMaps whole; the built-in identity
    // ConfigMaps' metadata only, and no Secret.
    let config = format!(
        "shardCount: {SHARDS}\nnamespaces: {{include: [{ns}]}}\nregistrations:
  - serviceAccount: {BUILT_IN}
    kinds: [{{apiVersion: v1, kind: ConfigMap}}]
  - serviceAccount: {VAULT}
    kinds:
      - {{apiVersion: v1, kind: Secret, objects: full}}
      - {{apiVersion: v1, kind: ConfigMap, objects: full}}
"
    );
    let watcher = watcher(plane, &config, &format!("--queue-addr={}", queue.grpc())).await;
    watcher.wait_ready(WITHIN).await;
    let vault = reconciler_as(VAULT, watcher.grpc()).await;
    let (_held, kinds) = register(
        &mut WatchesClient::new(vault.clone()),
        request("vault-0", vec![config_maps()]),
    )
    .await;
    assert_eq!(kinds, ["/v1/ConfigMap", "/v1/Secret"]);

    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    maps.create(&PostParams::default(), &config_map("settings"))
        .await
        .unwrap();
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "token"},
        "stringData": {"token": "hunter2"}
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    // The account granted them reads both whole.
    let mut granted = CacheClient::new(vault);
    eventually("the cache holds the Secret and the ConfigMap", async || {
        let secret = granted.get(get("Secret", &ns, "token")).await.unwrap();
        let map = granted
            .get(get("ConfigMap", &ns, "settings"))
            .await
            .unwrap();
        secret.into_inner().found && map.into_inner().found
    })
    .await;
    let whole = found(&mut granted, get("Secret", &ns, "token")).await;
    assert_eq!(whole["data"]["token"], "aHVudGVyMg==");
    let whole = found(&mut granted, get("ConfigMap", &ns, "settings")).await;
    assert_eq!(whole["data"]["greeting"], "hello");

    // The built-in identity: the Secrets the watcher now caches are refused, read or listed,
    // naming the kind and the account; so is registering them.
    let mut other = cache_client(watcher.grpc()).await;
    let status = get_refused(&mut other, get("Secret", &ns, "token")).await;
    assert_denied(&status, "v1/Secret", BUILT_IN);
    let list = ListRequest {
        gvk: gvk("", "v1", "Secret"),
        namespace: ns.clone(),
        ..ListRequest::default()
    };
    let status = match other.list(list).await {
        Ok(_) => panic!("the Secrets were listed"),
        Err(status) => status,
    };
    assert_denied(&status, "v1/Secret", BUILT_IN);
    let secrets = ControllerWatches {
        name: "example.com/v1/SecretReader".into(),
        reconciles: Some(Watch {
            metadata_only: true,
            ..watch("v1", "Secret")
        }),
        owns: vec![],
        by_label: vec![],
        by_namespace: vec![],
        by_selector: vec![],
        by_placement: vec![],
        by_name: vec![],
        namespaces: vec![],
    };
    let mut watches = watches_client(Role::Reconciler, watcher.grpc()).await;
    let status = refused(&mut watches, request("reconciler-0", vec![secrets])).await;
    assert_denied(&status, "v1/Secret", BUILT_IN);
    // ConfigMaps, cached whole for the other account, as metadata only.
    let trimmed = found(&mut other, get("ConfigMap", &ns, "settings")).await;
    assert_eq!(trimmed["metadata"]["name"], "settings");
    assert_eq!(trimmed.get("data"), None, "{trimmed}");

    watcher.stop().await;
    queue.stop().await;
}
