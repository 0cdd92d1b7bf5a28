//! Zero trust between the services, with every service a real process on loopback: each RPC
//! family refuses a caller with no certificate, one from another CA, an expired one, and the
//! right CA with the wrong identity, and nothing changes; then every certificate (and the CA
//! itself) is rotated while Deployments roll out, and no change is lost.

#![allow(clippy::unwrap_used)]

use std::{
    path::Path,
    sync::OnceLock,
    time::{Duration, Instant, SystemTime},
};

use switchyard_certs::{DEFAULT_NAMESPACE, DEFAULT_TRUST_DOMAIN, Leaf};
use switchyard_k8s::{
    Api, Deployment, PostParams,
    kube::api::{ListParams, Patch, PatchParams},
};
use switchyard_proto::{
    common::v1::{GroupVersionKind, WorkKey},
    elector::v1::{DrainMemberRequest, GetShardMapRequest, elector_client::ElectorClient},
    queue::v1::{
        Credit, DescribeKeyRequest, EnqueueItem, EnqueueManyRequest, EnqueueRequest,
        ListFailingRequest, StatsRequest, WorkRequest, WorkerHello, queue_client::QueueClient,
        work_request, work_response,
    },
    watcher::v1::{
        GetRequest, RegisterRequest, cache_client::CacheClient, watches_client::WatchesClient,
    },
};
use switchyard_runtime::Role;
use switchyard_testenv::{
    ControlPlane, Etcd, Pki, ServiceProcess, TestNamespace, manifests, tls::Files,
};
use switchyard_tests::service_binary;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const WATCHER_CONFIG: &str = include_str!("../deploy/kustomize/base/watcher-config.yaml");

/// Someone calling a service.
#[derive(Clone, Debug)]
enum Caller {
    /// TLS that trusts the CA, but no client certificate.
    NoCertificate,
    /// A certificate the server must refuse in the handshake.
    BadCertificate(&'static str, Files),
    /// A valid certificate of an identity the method does not allow.
    Identity(&'static str, Files),
}

impl Caller {
    async fn channel(&self, addr: impl std::fmt::Display) -> Result<Channel, String> {
        let ca = std::fs::read(Pki::shared().ca_path()).unwrap();
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        if let Self::BadCertificate(_, files) | Self::Identity(_, files) = self {
            tls = tls.identity(Identity::from_pem(
                std::fs::read(&files.cert).unwrap(),
                std::fs::read(&files.key).unwrap(),
            ));
        }
        Endpoint::from_shared(format!("https://{addr}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| format!("{e:?}"))
    }

    /// That `result` of calling `method` is the refusal this caller must get.
    fn assert_refused<T: std::fmt::Debug>(&self, method: &str, result: Result<T, String>) {
        match (self, &result) {
            (Self::NoCertificate, Err(e)) => assert!(
                e.contains("Unauthenticated") && e.contains(method),
                "{method} without a certificate: {e}"
            ),
            (Self::Identity(who, _), Err(e)) => assert!(
                e.contains("PermissionDenied") && e.contains(who) && e.contains(method),
                "{method} as {who}: {e}"
            ),
            // Refused in the handshake: the call never reaches the service. (With TLS 1.3
            // the client learns it at its first read, so the error is a transport one.)
            (Self::BadCertificate(what, _), Err(e)) => assert!(
                !e.contains("PermissionDenied") && !e.contains("Unauthenticated"),
                "{method} with {what}: refused in the handshake, not by the table: {e}"
            ),
            (_, Ok(answer)) => panic!("{method} as {self:?} was served: {answer:?}"),
        }
    }
}

/// Every kind of caller that must be refused, when the method wants `role`.
fn intruders(role: Role) -> Vec<Caller> {
    let shared = Pki::shared();
    // Written under the shared PKI's directory, which is removed when the test process exits.
    static FOREIGN: OnceLock<Pki> = OnceLock::new();
    let foreign = FOREIGN
        .get_or_init(|| Pki::create(&shared.dir().join("foreign-ca"), "foreign CA").unwrap());
    let now = SystemTime::now();
    let expired = shared
        .ca()
        .issue(&Leaf {
            not_before: now - Duration::from_secs(7200),
            not_after: now - Duration::from_secs(3600),
            ..Leaf::service(
                DEFAULT_TRUST_DOMAIN,
                DEFAULT_NAMESPACE,
                role.service_account(),
            )
        })
        .unwrap();
    let expired = shared
        .write(&format!("expired-{}", role.service_account()), &expired)
        .unwrap();
    let default = shared.issue_as("intruder-default", "default").unwrap();
    let other_namespace = shared
        .write(
            &format!("other-namespace-{}", role.service_account()),
            &shared
                .ca()
                .issue(&Leaf::service(
                    DEFAULT_TRUST_DOMAIN,
                    "elsewhere",
                    role.service_account(),
                ))
                .unwrap(),
        )
        .unwrap();
    vec![
        Caller::NoCertificate,
        Caller::BadCertificate("a certificate from another CA", foreign.files(role)),
        Caller::BadCertificate("an expired certificate", expired),
        Caller::Identity("sa/default", default),
        Caller::Identity("ns/elsewhere", other_namespace),
    ]
}

/// The wrong roles for a method that only `allowed` may call.
fn wrong_roles(allowed: &[Role]) -> Vec<Caller> {
    Role::ALL
        .into_iter()
        .filter(|role| !allowed.contains(role))
        .map(|role| {
            Caller::Identity(
                Box::leak(format!("sa/{}", role.service_account()).into_boxed_str()),
                Pki::shared().files(role),
            )
        })
        .collect()
}

fn status(e: tonic::Status) -> String {
    format!("{:?}: {}", e.code(), e.message())
}

async fn metric(process: &ServiceProcess, prefix: &str) -> f64 {
    let (_, text) = process.admin_get("/metrics").await.unwrap();
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn depth(queue: &ServiceProcess) -> (u64, u64) {
    let channel = Pki::shared()
        .channel(Role::Observer, Role::Queue, queue.grpc_addr())
        .await
        .unwrap();
    let stats = QueueClient::new(channel)
        .stats(StatsRequest::default())
        .await
        .unwrap()
        .into_inner();
    stats
        .shards
        .iter()
        .fold((0, 0), |(d, f), s| (d + s.depth, f + s.in_flight))
}

fn key(name: &str) -> EnqueueRequest {
    key_of("apps/v1/ReplicaSet", name)
}

/// A controller the queue was not started with: the first key that names it makes it known.
const RUNTIME_CONTROLLER: &str = "example.com/v1/Registered";

fn key_of(controller: &str, name: &str) -> EnqueueRequest {
    EnqueueRequest {
        batch_id: 1,
        shard: 0,
        items: vec![EnqueueItem {
            key: Some(WorkKey {
                controller: controller.into(),
                namespace: "default".into(),
                name: name.into(),
            }),
            ..EnqueueItem::default()
        }],
    }
}

/// Opens a Work stream and waits for a lease; the error when the stream is refused.
async fn lease(channel: Channel) -> Result<work_response::Response, String> {
    let requests = tokio_stream::iter([
        WorkRequest {
            request: Some(work_request::Request::Hello(WorkerHello {
                worker_id: "test".into(),
                controllers: Vec::new(),
            })),
        },
        WorkRequest {
            request: Some(work_request::Request::Credit(Credit { items: 1 })),
        },
    ])
    .chain(tokio_stream::pending());
    let mut stream = QueueClient::new(channel)
        .work(requests)
        .await
        .map_err(status)?
        .into_inner();
    match tokio::time::timeout(Duration::from_secs(5), stream.message()).await {
        Ok(Ok(Some(message))) => Ok(message.response.unwrap()),
        Ok(Ok(None)) => Err("stream closed".into()),
        Ok(Err(e)) => Err(status(e)),
        Err(_) => Err("no lease within 5s".into()),
    }
}

use tokio_stream::StreamExt as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_family_refuses_callers_without_the_right_identity_and_changes_nothing() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "zero-trust")
        .await
        .unwrap();
    let etcd = Etcd::start().await.unwrap();
    let elector = ServiceProcess::start(
        &service_binary("switchyard-elector"),
        &["--shard-count=1"],
        &[("SWITCHYARD_ETCD_ENDPOINTS", etcd.endpoint())],
    )
    .await
    .unwrap();
    let queue = ServiceProcess::start(
        &service_binary("switchyard-queue"),
        &["--shard-count=1"],
        &[],
    )
    .await
    .unwrap();
    // Queue.Enqueue: watchers and reconcilers only; refused adds leave the queue empty.
    let before = depth(&queue).await;
    let mut callers = intruders(Role::Watcher);
    callers.extend(wrong_roles(&[Role::Watcher, Role::Reconciler]));
    for caller in &callers {
        let result = match caller.channel(queue.grpc_addr()).await {
            Ok(channel) => {
                let mut client = QueueClient::new(channel);
                // Neither a known controller's key nor a new name's gets in.
                let _ = client.enqueue(key_of(RUNTIME_CONTROLLER, "intruded")).await;
                client
                    .enqueue(key("intruded"))
                    .await
                    .map(|r| r.into_inner())
                    .map_err(status)
            }
            Err(e) => Err(e),
        };
        caller.assert_refused("/switchyard.queue.v1.Queue/Enqueue", result);
        // The same keys in one EnqueueMany call.
        let result = match caller.channel(queue.grpc_addr()).await {
            Ok(channel) => QueueClient::new(channel)
                .enqueue_many(EnqueueManyRequest {
                    batches: vec![key_of(RUNTIME_CONTROLLER, "intruded"), key("intruded")],
                })
                .await
                .map(|r| r.into_inner())
                .map_err(status),
            Err(e) => Err(e),
        };
        caller.assert_refused("/switchyard.queue.v1.Queue/EnqueueMany", result);
    }
    assert_eq!(
        depth(&queue).await,
        before,
        "refused adds changed the queue"
    );
    let observer = QueueClient::new(
        Pki::shared()
            .channel(Role::Observer, Role::Queue, queue.grpc_addr())
            .await
            .unwrap(),
    );
    let unknown = observer
        .clone()
        .stats(StatsRequest {
            controller: RUNTIME_CONTROLLER.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        unknown.message(),
        format!("controller: unknown controller \"{RUNTIME_CONTROLLER}\""),
        "a refused caller made a controller name known"
    );
    // A reconciler may enqueue (a user's mapping function's keys), a new controller's too.
    let added = QueueClient::new(
        Pki::shared()
            .channel(Role::Reconciler, Role::Queue, queue.grpc_addr())
            .await
            .unwrap(),
    )
    .enqueue(key_of(RUNTIME_CONTROLLER, "mapped"))
    .await
    .unwrap()
    .into_inner();
    assert_eq!(added.added, 1);
    let known = observer
        .clone()
        .stats(StatsRequest {
            controller: RUNTIME_CONTROLLER.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(known.shards.iter().map(|s| s.depth).sum::<u64>(), 1);

    // Queue.Work: reconcilers only; a refused stream takes no lease.
    let watcher_channel = Pki::shared()
        .channel(Role::Watcher, Role::Queue, queue.grpc_addr())
        .await
        .unwrap();
    QueueClient::new(watcher_channel)
        .enqueue(key("queued"))
        .await
        .unwrap();
    let mut callers = intruders(Role::Reconciler);
    callers.extend(wrong_roles(&[Role::Reconciler]));
    for caller in &callers {
        let result = match caller.channel(queue.grpc_addr()).await {
            Ok(channel) => lease(channel).await,
            Err(e) => Err(e),
        };
        caller.assert_refused("/switchyard.queue.v1.Queue/Work", result);
    }
    let (queued, in_flight) = depth(&queue).await;
    assert_eq!(in_flight, 0, "a refused stream holds a lease");
    assert!(queued >= 1, "the key waits for a reconciler");
    let reconciler = Pki::shared()
        .channel(Role::Reconciler, Role::Queue, queue.grpc_addr())
        .await
        .unwrap();
    match lease(reconciler).await.unwrap() {
        work_response::Response::Item(item) => assert_eq!(item.attempt, 1),
        other => panic!("expected a lease, got {other:?}"),
    }

    let config = plane.dir().join(format!("watcher-{}.yaml", ns.name()));
    std::fs::write(
        &config,
        format!(
            "{}namespaces:\n  include: [{}]\n",
            WATCHER_CONFIG.replace("shardCount: 256", "shardCount: 1"),
            ns.name()
        ),
    )
    .unwrap();
    let mut watcher = ServiceProcess::start(
        &service_binary("switchyard-watcher"),
        &[
            &format!("--kubeconfig={}", plane.kubeconfig().display()),
            &format!("--config={}", config.display()),
            &format!("--queue-addr={}", queue.grpc_addr()),
        ],
        &[],
    )
    .await
    .unwrap();
    watcher.wait_ready().await.unwrap();
    // The Deployment controller's watches, registered as a reconciler registers them.
    let (_shutdown, drain) = switchyard_runtime::drain_channel();
    let _watching = switchyard_sdk::registration::Registration::new(
        &Pki::shared().dialer(Role::Reconciler),
        &watcher.grpc_addr().to_string(),
        "zero-trust",
        &[(
            switchyard_reconciler::deployment::NAME.to_owned(),
            switchyard_reconciler::deployment::watches(),
        )],
    )
    .unwrap()
    .register(&drain)
    .await
    .unwrap();
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    api.create(
        &PostParams::default(),
        &manifests::deployment("web", 0, serde_json::json!({})),
    )
    .await
    .unwrap();

    // Watcher Cache.Get: reconcilers only (a reader of every cached object bypasses RBAC).
    let get = GetRequest {
        gvk: Some(GroupVersionKind {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
        }),
        namespace: ns.name().to_owned(),
        name: "web".into(),
        freshness: None,
    };
    let mut callers = intruders(Role::Reconciler);
    callers.extend(wrong_roles(&[Role::Reconciler]));
    for caller in &callers {
        let result = match caller.channel(watcher.grpc_addr()).await {
            Ok(channel) => CacheClient::new(channel)
                .get(get.clone())
                .await
                .map(|r| r.into_inner().found)
                .map_err(status),
            Err(e) => Err(e),
        };
        caller.assert_refused("/switchyard.watcher.v1.Cache/Get", result);
    }
    let reader = Pki::shared()
        .channel(Role::Reconciler, Role::Watcher, watcher.grpc_addr())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !CacheClient::new(reader.clone())
        .get(get.clone())
        .await
        .unwrap()
        .into_inner()
        .found
    {
        assert!(Instant::now() < deadline, "the reconciler reads the cache");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Watcher Watches.Register: reconcilers only (refused before the request is read, so an
    // empty registration shows the refusal, not a validation error).
    let mut callers = intruders(Role::Reconciler);
    callers.extend(wrong_roles(&[Role::Reconciler]));
    for caller in &callers {
        let result = match caller.channel(watcher.grpc_addr()).await {
            Ok(channel) => WatchesClient::new(channel)
                .register(RegisterRequest::default())
                .await
                .map(|_| ())
                .map_err(status),
            Err(e) => Err(e),
        };
        caller.assert_refused("/switchyard.watcher.v1.Watches/Register", result);
    }

    // Elector.GetShardMap and Queue.Stats: every Switchyard identity, the observer too;
    // nobody else.
    for caller in intruders(Role::Observer) {
        let result = match caller.channel(elector.grpc_addr()).await {
            Ok(channel) => ElectorClient::new(channel)
                .get_shard_map(GetShardMapRequest {})
                .await
                .map(|r| r.into_inner().shard_count)
                .map_err(status),
            Err(e) => Err(e),
        };
        caller.assert_refused("/switchyard.elector.v1.Elector/GetShardMap", result);
        let result = match caller.channel(queue.grpc_addr()).await {
            Ok(channel) => QueueClient::new(channel)
                .stats(StatsRequest::default())
                .await
                .map(|r| r.into_inner().shards.len())
                .map_err(status),
            Err(e) => Err(e),
        };
        caller.assert_refused("/switchyard.queue.v1.Queue/Stats", result);
    }
    for role in Role::ALL {
        let channel = Pki::shared()
            .channel(role, Role::Elector, elector.grpc_addr())
            .await
            .unwrap();
        ElectorClient::new(channel)
            .get_shard_map(GetShardMapRequest {})
            .await
            .unwrap_or_else(|e| panic!("{role} reads the shard map: {e}"));
    }

    // Queue.DescribeKey and Elector.DrainMember: operators only (a key's name and its last
    // error, and moving shards, are more than an observer's reads).
    let mut callers = intruders(Role::Operator);
    callers.extend(wrong_roles(&[Role::Operator]));
    let described = || DescribeKeyRequest {
        key: key("queued").items[0].key.clone(),
    };
    for caller in &callers {
        let result = match caller.channel(queue.grpc_addr()).await {
            Ok(channel) => QueueClient::new(channel)
                .describe_key(described())
                .await
                .map(|r| r.into_inner())
                .map_err(status),
            Err(e) => Err(e),
        };
        caller.assert_refused("/switchyard.queue.v1.Queue/DescribeKey", result);
        let result = match caller.channel(elector.grpc_addr()).await {
            Ok(channel) => ElectorClient::new(channel)
                .drain_member(DrainMemberRequest {
                    member_id: "nobody".into(),
                    undo: false,
                })
                .await
                .map(|r| r.into_inner())
                .map_err(status),
            Err(e) => Err(e),
        };
        caller.assert_refused("/switchyard.elector.v1.Elector/DrainMember", result);
    }
    let operator = Pki::shared()
        .channel(Role::Operator, Role::Queue, queue.grpc_addr())
        .await
        .unwrap();
    let answer = QueueClient::new(operator)
        .describe_key(described())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.key, described().key, "the operator is served");

    // Queue.ListFailing: operators, and the elector's console on their behalf.
    let mut callers = intruders(Role::Operator);
    callers.extend(wrong_roles(&[Role::Operator, Role::Elector]));
    for caller in &callers {
        let result = match caller.channel(queue.grpc_addr()).await {
            Ok(channel) => QueueClient::new(channel)
                .list_failing(ListFailingRequest::default())
                .await
                .map(|r| r.into_inner())
                .map_err(status),
            Err(e) => Err(e),
        };
        caller.assert_refused("/switchyard.queue.v1.Queue/ListFailing", result);
    }
    for role in [Role::Operator, Role::Elector] {
        let channel = Pki::shared()
            .channel(role, Role::Queue, queue.grpc_addr())
            .await
            .unwrap();
        QueueClient::new(channel)
            .list_failing(ListFailingRequest::default())
            .await
            .unwrap_or_else(|e| panic!("{role} lists the failing keys: {e}"));
    }

    // The elector's console, plain HTTP on its gRPC port: any identity of the installation
    // reads it; without one, a plain-text 401 a browser shows.
    let console_url = format!("https://{}/console/", elector.grpc_addr());
    let console = |channel: Channel| {
        let url = console_url.clone();
        async move {
            use tonic::codegen::{Service, http};
            let mut channel = channel;
            let request = http::Request::get(url)
                .body(tonic::body::Body::empty())
                .unwrap();
            std::future::poll_fn(|cx| channel.poll_ready(cx))
                .await
                .unwrap();
            let response = channel.call(request).await.unwrap();
            let kind = response
                .headers()
                .get(http::header::CONTENT_TYPE)
                .map(|v| v.to_str().unwrap_or_default().to_owned())
                .unwrap_or_default();
            (response.status().as_u16(), kind)
        }
    };
    let anonymous = Caller::NoCertificate
        .channel(elector.grpc_addr())
        .await
        .unwrap();
    assert_eq!(
        console(anonymous).await,
        (401, "text/plain; charset=utf-8".to_owned())
    );
    let observer = Pki::shared()
        .channel(Role::Observer, Role::Elector, elector.grpc_addr())
        .await
        .unwrap();
    assert_eq!(
        console(observer).await,
        (200, "text/html; charset=utf-8".to_owned())
    );
    let operator = Pki::shared()
        .channel(Role::Operator, Role::Elector, elector.grpc_addr())
        .await
        .unwrap();
    // Past the table, the elector itself answers: no such member, nothing written.
    let unknown = ElectorClient::new(operator)
        .drain_member(DrainMemberRequest {
            member_id: "nobody".into(),
            undo: false,
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");

    // Health stays open to probes that hold no identity.
    let channel = Caller::NoCertificate
        .channel(queue.grpc_addr())
        .await
        .unwrap();
    tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .unwrap();

    // Every refusal is counted: by the table, or in the handshake.
    for (process, method) in [
        (&queue, "/switchyard.queue.v1.Queue/Enqueue"),
        (&queue, "/switchyard.queue.v1.Queue/Work"),
        (&watcher, "/switchyard.watcher.v1.Cache/Get"),
        (&watcher, "/switchyard.watcher.v1.Watches/Register"),
        (&elector, "/switchyard.elector.v1.Elector/GetShardMap"),
        (&queue, "/switchyard.queue.v1.Queue/DescribeKey"),
        (&queue, "/switchyard.queue.v1.Queue/ListFailing"),
        (&elector, "/switchyard.elector.v1.Elector/DrainMember"),
    ] {
        for reason in ["unauthenticated", "forbidden"] {
            let count = metric(
                process,
                &format!("switchyard_grpc_denied_total{{method=\"{method}\",reason=\"{reason}\"}}"),
            )
            .await;
            assert!(count >= 1.0, "{method} {reason}: counted {count}");
        }
    }
    for process in [&queue, &watcher, &elector] {
        let count = metric(process, "switchyard_grpc_tls_handshake_failures_total").await;
        assert!(count >= 2.0, "handshake refusals counted: {count}");
    }
    // Logged once per caller and minute, not once per call.
    let log = queue.log();
    let lines = log
        .lines()
        .filter(|l| l.contains("grpc call refused") && l.contains("sa/default"))
        .count();
    assert_eq!(
        lines, 1,
        "one line for the repeated refusals of sa/default:\n{log}"
    );

    for process in [watcher, queue, elector] {
        let (status, log) = process.terminate().await.unwrap();
        assert!(status.success(), "{log}");
    }
}

/// Writes `contents` to `path` atomically (a rename), as a Secret volume's update is.
fn replace(path: &Path, contents: &[u8]) {
    let staging = path.with_extension("new");
    std::fs::write(&staging, contents).unwrap();
    std::fs::rename(&staging, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_certificate_and_the_ca_rotate_while_deployments_roll_out() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "rotation")
        .await
        .unwrap();
    let etcd = Etcd::start().await.unwrap();
    // The services' certificates come from a CA of this test's own, rotated below; etcd
    // keeps the shared CA, and its serving certificate and the elector's and the queue's
    // etcd client certificates (files of this test's own, each role's CN for etcd's RBAC)
    // are replaced by new ones of that CA.
    let old = Pki::temporary("switchyard rotation CA 1").unwrap();
    let new = Pki::temporary("switchyard rotation CA 2").unwrap();
    let etcd_client_name = |role: Role| format!("rotation-etcd-{}", role.service_account());
    let etcd_flags = |role: Role| {
        let files = Pki::shared()
            .issue_as(&etcd_client_name(role), role.service_account())
            .unwrap();
        vec![
            format!("--etcd-tls-cert={}", files.cert.display()),
            format!("--etcd-tls-key={}", files.key.display()),
            format!("--etcd-tls-ca={}", files.ca.display()),
        ]
    };
    let flags = |role: Role, extra: &[String]| -> Vec<String> {
        let mut flags = old.flags(role);
        flags.push("--tls-reload-interval=200ms".into());
        flags.extend(extra.iter().cloned());
        flags
    };
    let start = |role: Role,
                 program: &'static str,
                 args: Vec<String>,
                 envs: Vec<(&'static str, String)>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut process = ServiceProcess::start(&service_binary(program), &args, &envs)
            .await
            .unwrap_or_else(|e| panic!("{role} starts: {e}"));
        process.wait_ready().await.unwrap();
        process
    };
    let etcd_env = vec![("SWITCHYARD_ETCD_ENDPOINTS", etcd.endpoint().to_owned())];
    let elector = start(
        Role::Elector,
        "switchyard-elector",
        flags(
            Role::Elector,
            &[
                &["--shard-count=4".to_owned()][..],
                &etcd_flags(Role::Elector),
            ]
            .concat(),
        ),
        etcd_env.clone(),
    )
    .await;
    let elector_addr = format!("--elector-addr={}", elector.grpc_addr());
    let queue = start(
        Role::Queue,
        "switchyard-queue",
        flags(
            Role::Queue,
            &[
                &[
                    "--shard-count=4".to_owned(),
                    elector_addr.clone(),
                    "--member-id=q0".into(),
                ][..],
                &etcd_flags(Role::Queue),
            ]
            .concat(),
        ),
        etcd_env.clone(),
    )
    .await;
    let config = plane.dir().join(format!("watcher-{}.yaml", ns.name()));
    std::fs::write(
        &config,
        format!(
            "{}namespaces:\n  include: [{}]\n",
            WATCHER_CONFIG.replace("shardCount: 256", "shardCount: 4"),
            ns.name()
        ),
    )
    .unwrap();
    let kubeconfig = format!("--kubeconfig={}", plane.kubeconfig().display());
    let watcher = start(
        Role::Watcher,
        "switchyard-watcher",
        flags(
            Role::Watcher,
            &[
                kubeconfig.clone(),
                format!("--config={}", config.display()),
                elector_addr.clone(),
            ],
        ),
        Vec::new(),
    )
    .await;
    let reconciler = start(
        Role::Reconciler,
        "switchyard-reconciler",
        flags(
            Role::Reconciler,
            &[
                kubeconfig,
                elector_addr,
                "--shard-count=4".into(),
                format!("--watcher-addr={}", watcher.grpc_addr()),
            ],
        ),
        Vec::new(),
    )
    .await;
    let services = [
        (Role::Elector, &elector),
        (Role::Queue, &queue),
        (Role::Watcher, &watcher),
        (Role::Reconciler, &reconciler),
    ];

    // Deployments are created throughout the rotation, one every 100 ms.
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    let creating = {
        let api = api.clone();
        tokio::spawn(async move {
            let mut names = Vec::new();
            for i in 0..40 {
                let name = format!("d{i:02}");
                api.create(
                    &PostParams::default(),
                    &manifests::deployment(&name, 2, serde_json::json!({})),
                )
                .await
                .unwrap();
                names.push(name);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            names
        })
    };

    // 1. Every service trusts both CAs. 2. Every certificate is replaced by one of the new
    // CA. 3. The old CA is dropped.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let bundle = [
        std::fs::read(old.ca_path()).unwrap(),
        std::fs::read(new.ca_path()).unwrap(),
    ]
    .concat();
    for (role, _) in services {
        replace(&old.files(role).ca, &bundle);
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let rotated_at = SystemTime::now();
    for (role, _) in services {
        let (target, source) = (old.files(role), new.files(role));
        // Key first: until the certificate follows, the pair does not match and the
        // reload waits for the next look (counted as an error, nothing changes).
        replace(&target.key, &std::fs::read(&source.key).unwrap());
        replace(&target.cert, &std::fs::read(&source.cert).unwrap());
    }
    // etcd's serving certificate (etcd reads it at every handshake) and the etcd client
    // certificates (read at every connection) are replaced too.
    let etcd_served = Pki::shared()
        .issue_as(
            switchyard_testenv::tls::ETCD_ACCOUNT,
            switchyard_testenv::tls::ETCD_ACCOUNT,
        )
        .unwrap();
    for role in [Role::Elector, Role::Queue] {
        Pki::shared()
            .issue_as(&etcd_client_name(role), role.service_account())
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // A new etcd connection with the rotated files is served the new certificate and
    // authorized by its CN, as the queue's and the elector's next reconnects will be.
    let mut rotated = etcd
        .connection_as(&etcd_client_name(Role::Queue))
        .connect()
        .await
        .unwrap();
    rotated
        .get(
            switchyard_shards::store::SHARDS_PREFIX,
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .expect("the queue's rotated etcd certificate reads the shard map");
    let unwrapped = |pem: Vec<u8>| -> Vec<u8> {
        pem.into_iter()
            .filter(|b| !b.is_ascii_whitespace())
            .collect()
    };
    assert_eq!(
        unwrapped(etcd_serving_certificate(etcd.endpoint()).await),
        unwrapped(std::fs::read(&etcd_served.cert).unwrap()),
        "etcd serves its rotated certificate to new connections"
    );
    // New connections present the new certificates: a client that trusts only the new CA
    // (and holds the new CA's observer certificate) is served by every service.
    for (role, process) in services {
        let channel = new
            .channel(Role::Observer, role, process.grpc_addr())
            .await
            .unwrap_or_else(|e| panic!("the {role} presents the new CA's certificate: {e}"));
        tonic_health::pb::health_client::HealthClient::new(channel)
            .check(tonic_health::pb::HealthCheckRequest::default())
            .await
            .unwrap();
    }
    for (role, _) in services {
        replace(&old.files(role).ca, &std::fs::read(new.ca_path()).unwrap());
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    for (role, process) in services {
        let ok = metric(
            process,
            "switchyard_tls_reloads_total{certificate=\"service\",result=\"ok\"}",
        )
        .await;
        assert!(
            ok >= 3.0,
            "the {role} reloaded the bundle, its certificate and the CA: {ok}"
        );
        // A certificate of the dropped CA is refused now (the client itself trusts the new
        // CA, so only the server can be refusing).
        let stale = old.files(Role::Observer);
        let dialer = switchyard_runtime::Dialer::from_args(&switchyard_runtime::TlsArgs::files(
            &stale.cert,
            &stale.key,
            &new.ca_path(),
        ))
        .unwrap();
        let endpoint = dialer
            .endpoint(&process.grpc_addr().to_string(), role)
            .unwrap();
        let refused = match dialer.connect(&endpoint, role).await {
            Ok(channel) => tonic_health::pb::health_client::HealthClient::new(channel)
                .check(tonic_health::pb::HealthCheckRequest::default())
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        assert!(refused.is_err(), "the {role} still trusts the dropped CA");
    }

    // No change was lost: every Deployment, created before, during and after the rotation,
    // becomes Available, and a scale made after it is carried out too.
    let names = creating.await.unwrap();
    let scale = serde_json::json!({"spec": {"replicas": 3}});
    api.patch("d00", &PatchParams::default(), &Patch::Merge(&scale))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let listed = api.list(&ListParams::default()).await.unwrap();
        let available = listed
            .items
            .iter()
            .filter(|d| {
                let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                d.status.as_ref().is_some_and(|s| {
                    s.available_replicas == Some(want) && s.updated_replicas == Some(want)
                })
            })
            .count();
        if available == names.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{available} of {} Deployments available after the rotation",
            names.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Streams went on or came back within a second: every Work stream the reconciler saw
    // fail during or after the rotation was open again within STREAM_GAP, and the watcher's
    // enqueues never failed for longer than that (each failure is logged, retried, and the
    // keys kept).
    let reconciler_log = reconciler.log();
    let opened = logged_at(&reconciler_log, "work stream open");
    assert!(
        !opened.is_empty(),
        "the reconciler logs its Work streams: {reconciler_log}"
    );
    for failed in logged_at(&reconciler_log, "work stream failed") {
        if failed < rotated_at {
            continue;
        }
        let back = opened
            .iter()
            .find(|open| **open >= failed)
            .map(|open| open.duration_since(failed).unwrap());
        assert!(
            back.is_some_and(|gap| gap <= STREAM_GAP),
            "a Work stream that failed during the rotation was open again after {back:?}: \
             {reconciler_log}"
        );
    }
    let watcher_log = watcher.log();
    let failures = logged_at(&watcher_log, "enqueue failed; keys kept for retry");
    let longest = failure_spans(&failures, STREAM_GAP).into_iter().max();
    assert!(
        longest.is_none_or(|span| span <= STREAM_GAP),
        "enqueues failed for {longest:?} in a row: {watcher_log}"
    );
    for process in [reconciler, watcher, queue, elector] {
        let (status, log) = process.terminate().await.unwrap();
        assert!(status.success(), "{log}");
    }
}

/// How long a stream may be down while certificates rotate (issue #14: "streams go on or
/// reconnect within a second").
const STREAM_GAP: Duration = Duration::from_secs(1);

/// When each line of `log` (the services' plain format: an RFC 3339 timestamp first) that
/// holds `message` was written.
fn logged_at(log: &str, message: &str) -> Vec<SystemTime> {
    log.lines()
        .filter(|line| line.contains(message))
        .filter_map(|line| humantime::parse_rfc3339(line.split_whitespace().next()?).ok())
        .collect()
}

/// The lengths of the runs of `failures` (sorted times) whose consecutive failures are less
/// than `apart` from each other: how long a failing path stayed failing.
fn failure_spans(failures: &[SystemTime], apart: Duration) -> Vec<Duration> {
    let mut spans = Vec::new();
    let mut run: Option<(SystemTime, SystemTime)> = None;
    for at in failures {
        run = match run {
            Some((first, last)) if at.duration_since(last).unwrap_or_default() < apart => {
                Some((first, *at))
            }
            Some((first, last)) => {
                spans.push(last.duration_since(first).unwrap_or_default());
                Some((*at, *at))
            }
            None => Some((*at, *at)),
        };
    }
    spans.extend(run.map(|(first, last)| last.duration_since(first).unwrap_or_default()));
    spans
}

/// The certificate (PEM file contents are compared as DER) etcd serves a new connection at
/// `endpoint`, presenting the shared PKI's queue certificate.
async fn etcd_serving_certificate(endpoint: &str) -> Vec<u8> {
    let files = Pki::shared().files(Role::Queue);
    let identity = [
        std::fs::read(&files.cert).unwrap(),
        std::fs::read(&files.key).unwrap(),
    ]
    .concat();
    let http = reqwest::Client::builder()
        .tls_info(true)
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&files.ca).unwrap()).unwrap(),
        )
        .identity(reqwest::Identity::from_pem(&identity).unwrap())
        .build()
        .unwrap();
    let response = http
        .get(format!("{endpoint}/health"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    let der = response
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|info| info.peer_certificate())
        .expect("etcd's certificate")
        .to_vec();
    pem_of(&der)
}

/// `der` as the PEM `switchyard-certs` writes.
fn pem_of(der: &[u8]) -> Vec<u8> {
    use base64::Engine;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    )
    .into_bytes()
}

#[test]
fn failure_runs_are_measured_from_first_to_last() {
    let t = |ms: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
    assert_eq!(
        failure_spans(&[t(0), t(300), t(600), t(5000), t(5100)], STREAM_GAP),
        [Duration::from_millis(600), Duration::from_millis(100)]
    );
    assert!(failure_spans(&[], STREAM_GAP).is_empty());
    let log = "2026-01-02T03:04:05.250000Z  WARN x: work stream failed error=e\nnoise\n";
    assert_eq!(
        logged_at(log, "work stream failed"),
        [humantime::parse_rfc3339("2026-01-02T03:04:05.250Z").unwrap()]
    );
}
