//! The queue's external metrics API over HTTPS, as the aggregation layer and the HPA call it:
//! discovery, the backlog per controller following what is enqueued and leased, label
//! selectors, and a clear 400 for a malformed selector; with several replicas, each answers for
//! the whole queue.

#![allow(clippy::unwrap_used)]

use std::{collections::HashMap, path::Path, time::Duration};

use clap::Parser;
use serde_json::Value;
use switchyard_proto::queue::v1::StatsRequest;
use switchyard_proto::{
    common::v1::WorkKey,
    queue::v1::{
        Credit, EnqueueItem, EnqueueRequest, WorkRequest, WorkerHello, queue_client::QueueClient,
        work_request::Request as Msg, work_response::Response as Reply,
    },
};
use switchyard_queue_core::shard::shard_of;
use switchyard_runtime::Role;
use switchyard_testenv::{Etcd, Pki, ServiceProcess};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const RS: &str = "apps/v1/ReplicaSet";
const DEPLOY: &str = "apps/v1/Deployment";
const SHARDS: u32 = 4;
const METRIC: &str = "switchyard_queue_backlog";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    async fn get(&self, path: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let content_type = response.headers()[reqwest::header::CONTENT_TYPE].clone();
        assert_eq!(content_type, "application/json", "{path}");
        (status, response.json().await.unwrap())
    }

    /// Metric values by controller label, for `selector`.
    async fn backlog(&self, selector: &str) -> Vec<(String, String)> {
        let path = format!(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/switchyard/{METRIC}?labelSelector={}",
            form_urlencoded::byte_serialize(selector.as_bytes()).collect::<String>()
        );
        let (status, body) = self.get(&path).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert_eq!(body["kind"], "ExternalMetricValueList");
        assert_eq!(body["apiVersion"], "external.metrics.k8s.io/v1beta1");
        let mut items: Vec<(String, String)> = body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| {
                assert_eq!(item["metricName"], METRIC);
                assert!(item["timestamp"].as_str().unwrap().ends_with('Z'));
                (
                    item["metricLabels"]["controller"]
                        .as_str()
                        .unwrap()
                        .to_owned(),
                    item["value"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        items.sort();
        items
    }
}

/// `n` keys of `controller` in batches by shard.
fn batches(controller: &str, n: usize) -> Vec<EnqueueRequest> {
    let mut by_shard: Vec<Vec<EnqueueItem>> = vec![Vec::new(); SHARDS as usize];
    for i in 0..n {
        let name = format!("obj-{i}");
        by_shard[shard_of(controller, "default", &name, SHARDS) as usize].push(EnqueueItem {
            key: Some(WorkKey {
                controller: controller.into(),
                namespace: "default".into(),
                name,
            }),
            ..Default::default()
        });
    }
    by_shard
        .into_iter()
        .enumerate()
        .filter(|(_, items)| !items.is_empty())
        .map(|(shard, items)| EnqueueRequest {
            batch_id: shard as u64,
            shard: shard as u32,
            items,
        })
        .collect()
}

async fn enqueue(client: &mut QueueClient<tonic::transport::Channel>, controller: &str, n: usize) {
    for batch in batches(controller, n) {
        client.enqueue(batch).await.unwrap();
    }
}

/// A client of the queue at `address`, as `role`, over mutual TLS.
async fn queue_client(
    role: Role,
    address: impl std::fmt::Display,
) -> QueueClient<tonic::transport::Channel> {
    QueueClient::new(
        Pki::shared()
            .channel(role, Role::Queue, address)
            .await
            .unwrap(),
    )
}

fn https_api(port: u16) -> Api {
    Api {
        base: format!("https://127.0.0.1:{port}"),
        // The server's certificate is self-signed (no --external-metrics-tls-cert), as with
        // an APIService that sets insecureSkipTLSVerify.
        http: reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .build()
            .unwrap(),
    }
}

#[tokio::test]
async fn serves_discovery_and_backlog_per_controller_and_refuses_bad_selectors() {
    let port = free_port();
    let flags = [
        format!("--external-metrics-addr=127.0.0.1:{port}"),
        "--external-metrics-insecure-any-client".into(),
    ]
    .into_iter()
    .chain(Pki::shared().flags(Role::Queue));
    let (rt, grpc) = switchyard_queue::Args::start_local(SHARDS, &[RS, DEPLOY], flags)
        .await
        .unwrap();
    let shutdown = rt.shutdown_handle();
    let running = tokio::spawn(rt.run());
    let api = https_api(port);

    // Discovery, as the aggregation layer's availability check and the HPA read it.
    let (status, resources) = api.get("/apis/external.metrics.k8s.io/v1beta1").await;
    assert_eq!(status, 200);
    assert_eq!(resources["kind"], "APIResourceList");
    assert_eq!(resources["groupVersion"], "external.metrics.k8s.io/v1beta1");
    assert_eq!(resources["resources"][0]["name"], METRIC);
    assert_eq!(resources["resources"][0]["namespaced"], true);
    assert_eq!(
        resources["resources"][0]["verbs"],
        serde_json::json!(["get"])
    );
    let (status, group) = api.get("/apis/external.metrics.k8s.io").await;
    assert_eq!(
        (status, &group["preferredVersion"]["version"]),
        (200, &"v1beta1".into())
    );

    let rs = "apps.v1.ReplicaSet".to_owned();
    let deploy = "apps.v1.Deployment".to_owned();
    assert_eq!(
        api.backlog("").await,
        [(deploy.clone(), "0".into()), (rs.clone(), "0".into())]
    );

    // A reconciler: it enqueues (as controllers that enqueue do) and leases.
    let mut client = queue_client(Role::Reconciler, grpc).await;
    enqueue(&mut client, RS, 30).await;
    enqueue(&mut client, DEPLOY, 7).await;
    assert_eq!(
        api.backlog("").await,
        [(deploy.clone(), "7".into()), (rs.clone(), "30".into())]
    );
    assert_eq!(
        api.backlog("controller=apps.v1.ReplicaSet").await,
        [(rs.clone(), "30".into())]
    );
    assert_eq!(
        api.backlog("controller notin (apps.v1.ReplicaSet)").await,
        [(deploy.clone(), "7".into())]
    );
    assert_eq!(api.backlog("controller=apps.v1.Pod").await, []);

    // Leased keys are work not done: they stay in the backlog until their outcome.
    let (tx, rx) = mpsc::channel(16);
    tx.send(WorkRequest {
        request: Some(Msg::Hello(WorkerHello {
            worker_id: "w".into(),
            controllers: vec![RS.into()],
        })),
    })
    .await
    .unwrap();
    let mut stream = client
        .work(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(WorkRequest {
        request: Some(Msg::Credit(Credit { items: 10 })),
    })
    .await
    .unwrap();
    for _ in 0..10 {
        let message = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(matches!(message.response, Some(Reply::Item(_))));
    }
    assert_eq!(
        api.backlog("controller=apps.v1.ReplicaSet").await,
        [(rs.clone(), "30".into())]
    );

    // Malformed selectors: 400 with a Status naming the selector and what is wrong.
    for (selector, reason) in [
        ("controller in (a", "unclosed '('"),
        ("controller=not a value", "not allowed"),
        ("controller=a,,x=y", "empty requirement"),
    ] {
        let path = format!(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/switchyard/{METRIC}?labelSelector={}",
            form_urlencoded::byte_serialize(selector.as_bytes()).collect::<String>()
        );
        let (status, body) = api.get(&path).await;
        assert_eq!(status, 400, "{selector}: {body}");
        assert_eq!(body["kind"], "Status");
        assert_eq!(body["reason"], "BadRequest");
        assert_eq!(body["code"], 400);
        let message = body["message"].as_str().unwrap();
        assert!(
            message.starts_with("labelSelector") && message.contains(reason),
            "{selector}: {message}"
        );
    }

    // An unknown metric is a 404 that names the metric served.
    let (status, body) = api
        .get("/apis/external.metrics.k8s.io/v1beta1/namespaces/switchyard/cpu")
        .await;
    assert_eq!(status, 404);
    assert!(body["message"].as_str().unwrap().contains(METRIC));

    drop(tx);
    drop(stream);
    shutdown.trigger();
    running.await.unwrap().unwrap();
}

/// Shards each replica serves, once every shard is served by exactly one.
async fn assignment(clients: &mut [QueueClient<tonic::transport::Channel>]) -> Vec<Vec<u32>> {
    for _ in 0..300 {
        let mut served = Vec::new();
        for client in clients.iter_mut() {
            let stats = client.stats(StatsRequest::default()).await.unwrap();
            let mut shards: Vec<u32> = stats.into_inner().shards.iter().map(|s| s.shard).collect();
            shards.sort_unstable();
            shards.dedup();
            served.push(shards);
        }
        let total: usize = served.iter().map(Vec::len).sum();
        let mut all: Vec<u32> = served.concat();
        all.sort_unstable();
        all.dedup();
        if total == SHARDS as usize
            && all.len() == SHARDS as usize
            && served.iter().all(|s| !s.is_empty())
        {
            return served;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the elector did not assign every shard to exactly one of the replicas in 30 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_answers_with_the_backlog_of_the_whole_queue() {
    let etcd = Etcd::start().await.unwrap();
    let elector = format!("127.0.0.1:{}", free_port());
    let elector_task = tokio::spawn(
        switchyard_elector::Args::try_parse_from(
            [
                "switchyard-elector".to_owned(),
                "--admin-addr=127.0.0.1:0".into(),
                format!("--grpc-addr={elector}"),
                format!("--etcd-endpoints={}", etcd.endpoint()),
                format!("--shard-count={SHARDS}"),
                "--elector-id=e0".into(),
            ]
            .into_iter()
            .chain(Pki::shared().flags(Role::Elector)),
        )
        .unwrap()
        .run(),
    );

    let mut replicas = Vec::new();
    let mut clients = Vec::new();
    for i in 0..3 {
        let port = free_port();
        let mut replica = ServiceProcess::start(
            Path::new(env!("CARGO_BIN_EXE_switchyard-queue")),
            &[
                &format!("--member-id=q{i}"),
                &format!("--shard-count={SHARDS}"),
                &format!("--controllers={RS},{DEPLOY}"),
                &format!("--external-metrics-addr=127.0.0.1:{port}"),
                "--external-metrics-insecure-any-client",
            ],
            &[
                ("SWITCHYARD_ETCD_ENDPOINTS", etcd.endpoint()),
                ("SWITCHYARD_ELECTOR_ADDR", &elector),
            ],
        )
        .await
        .unwrap();
        replica.wait_ready().await.unwrap();
        // A watcher: it enqueues, and reads each replica's Stats.
        clients.push(queue_client(Role::Watcher, replica.grpc_addr()).await);
        replicas.push((replica, port));
    }
    let served = assignment(&mut clients).await;
    let owner: HashMap<u32, usize> = served
        .iter()
        .enumerate()
        .flat_map(|(i, shards)| shards.iter().map(move |s| (*s, i)))
        .collect();
    const KEYS: usize = 90;
    for batch in batches(RS, KEYS) {
        clients[owner[&batch.shard]].enqueue(batch).await.unwrap();
    }

    // Each replica holds only part of the backlog, yet answers with all of it.
    for (i, (replica, port)) in replicas.iter().enumerate() {
        let local: u64 = clients[i]
            .stats(StatsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .shards
            .iter()
            .map(|s| s.depth)
            .sum();
        assert!(local < KEYS as u64, "replica {i} holds {local} of {KEYS}");
        assert_eq!(
            https_api(*port).backlog("").await,
            [
                ("apps.v1.Deployment".to_owned(), "0".to_owned()),
                ("apps.v1.ReplicaSet".to_owned(), KEYS.to_string())
            ],
            "replica {i}:\n{}",
            replica.log()
        );
    }

    // A member that does not answer makes the metric unavailable, never partial. (A killed
    // member would not do: the elector finds its port closed and removes it at once.)
    let (stopped, _) = replicas.remove(2);
    stopped.pause();
    let (status, body) = https_api(replicas[0].1)
        .get(&format!(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/switchyard/{METRIC}"
        ))
        .await;
    stopped.resume();
    let _ = stopped.kill();
    assert!(
        status == 503 && body["message"].as_str().unwrap().contains("q2"),
        "{status} {body}"
    );
    elector_task.abort();
}

/// A CA and a client certificate it issued for each of `names` (common names), as PEM: the
/// CA, then each certificate and its key.
fn ca_and_clients(name: &str, names: &[&str]) -> (String, Vec<(String, String)>) {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair,
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name
        .push(DnType::CommonName, format!("{name}-ca"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let clients = names
        .iter()
        .map(|cn| {
            let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
            client.distinguished_name.push(DnType::CommonName, *cn);
            client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let key = KeyPair::generate().unwrap();
            let cert = client.signed_by(&key, &ca).unwrap();
            (cert.pem(), key.serialize_pem())
        })
        .collect();
    (ca.pem(), clients)
}

#[tokio::test]
async fn only_the_front_proxy_s_certificate_may_call() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, clients) = ca_and_clients("front-proxy", &["front-proxy-client", "some-pod"]);
    let [(cert, key), (pod_cert, pod_key)] = clients.try_into().unwrap();
    let (_, strangers) = ca_and_clients("stranger", &["front-proxy-client"]);
    let [(other_cert, other_key)] = strangers.try_into().unwrap();
    let ca_path = dir.path().join("front-proxy-ca.crt");
    std::fs::write(&ca_path, ca).unwrap();
    let port = free_port();
    let flags = [
        format!("--external-metrics-addr=127.0.0.1:{port}"),
        format!("--external-metrics-client-ca={}", ca_path.display()),
        "--external-metrics-allowed-names=front-proxy-client".into(),
    ]
    .into_iter()
    .chain(Pki::shared().flags(Role::Queue));
    let (rt, _) = switchyard_queue::Args::start_local(SHARDS, &[], flags)
        .await
        .unwrap();
    let shutdown = rt.shutdown_handle();
    let running = tokio::spawn(rt.run());

    let client = |identity: Option<(&str, &str)>| {
        let mut builder = reqwest::Client::builder().danger_accept_invalid_certs(true);
        if let Some((cert, key)) = identity {
            builder = builder
                .identity(reqwest::Identity::from_pem(format!("{cert}{key}").as_bytes()).unwrap());
        }
        builder.build().unwrap()
    };
    let url = format!("https://127.0.0.1:{port}/apis/external.metrics.k8s.io/v1beta1");
    let call = |http: reqwest::Client| {
        let url = url.clone();
        async move {
            http.get(url)
                .timeout(Duration::from_secs(5))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    };
    assert_eq!(call(client(Some((&cert, &key)))).await.unwrap(), 200);
    assert!(
        call(client(None)).await.is_err(),
        "no client certificate: refused in the handshake"
    );
    assert!(
        call(client(Some((&other_cert, &other_key)))).await.is_err(),
        "a certificate from another CA: refused in the handshake"
    );
    assert!(
        call(client(Some((&pod_cert, &pod_key)))).await.is_err(),
        "a certificate of the front-proxy CA with a name not allowed: refused"
    );

    shutdown.trigger();
    running.await.unwrap().unwrap();
}

#[tokio::test]
async fn the_api_is_not_served_to_any_client_unless_asked() {
    let flags = [format!("--external-metrics-addr=127.0.0.1:{}", free_port())]
        .into_iter()
        .chain(Pki::shared().flags(Role::Queue));
    let started = switchyard_queue::Args::start_local(SHARDS, &[], flags).await;
    let Err(error) = started else {
        panic!("served to any client")
    };
    assert!(
        error
            .to_string()
            .contains("--external-metrics-client-ca: required with --external-metrics-addr"),
        "{error}"
    );
}

/// The certificate a new connection to `url` is served (DER), with a client that trusts the
/// test CA only; and the client, whose pooled connection keeps that certificate.
async fn served_certificate(url: &str, http: &reqwest::Client) -> Vec<u8> {
    let response = http
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    response
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|info| info.peer_certificate())
        .expect("the TLS session's peer certificate")
        .to_vec()
}

fn trusting_the_test_ca() -> reqwest::Client {
    let ca = std::fs::read(Pki::shared().ca_path()).unwrap();
    reqwest::Client::builder()
        .tls_info(true)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap()
}

fn der_of(path: &Path) -> Vec<u8> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    CertificateDer::from_pem_file(path).unwrap().to_vec()
}

/// The API's certificate is reloaded when its files change, as the gRPC certificates are: new
/// connections get the new one without a restart, a connection made before keeps serving.
#[tokio::test]
async fn a_rotated_certificate_serves_new_connections_without_a_restart() {
    const NAME: &str = "external-metrics-rotation";
    let pki = Pki::shared();
    let before = pki.issue_as(NAME, "switchyard-queue").unwrap();
    let first = der_of(&before.cert);
    let port = free_port();
    let flags = [
        format!("--external-metrics-addr=127.0.0.1:{port}"),
        format!("--external-metrics-tls-cert={}", before.cert.display()),
        format!("--external-metrics-tls-key={}", before.key.display()),
        "--external-metrics-insecure-any-client".into(),
        "--tls-reload-interval=100ms".into(),
    ]
    .into_iter()
    .chain(pki.flags(Role::Queue));
    let (rt, _) = switchyard_queue::Args::start_local(SHARDS, &[], flags)
        .await
        .unwrap();
    let admin = rt.admin_addr();
    let shutdown = rt.shutdown_handle();
    let running = tokio::spawn(rt.run());
    // The API serves once the queue's start has bound it.
    let url = format!("https://localhost:{port}/apis/external.metrics.k8s.io/v1beta1");
    let established = trusting_the_test_ca();
    assert_eq!(served_certificate(&url, &established).await, first);

    let after = pki.issue_as(NAME, "switchyard-queue").unwrap();
    let second = der_of(&after.cert);
    assert_ne!(first, second);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if served_certificate(&url, &trusting_the_test_ca()).await == second {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a new connection got the rotated certificate within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        served_certificate(&url, &established).await,
        first,
        "the connection made before the rotation goes on with its certificate"
    );
    let metrics = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            "switchyard_tls_reloads_total{certificate=\"external-metrics\",result=\"ok\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "switchyard_tls_certificate_expiry_timestamp_seconds{certificate=\"external-metrics\"}"
        ),
        "{metrics}"
    );

    shutdown.trigger();
    running.await.unwrap().unwrap();
}
