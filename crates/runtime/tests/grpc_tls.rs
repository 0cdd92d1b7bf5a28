//! The gRPC server over mutual TLS from `--tls-cert/--tls-key/--tls-ca`, with a PKI made by
//! `switchyard-certs`: health is open to any client that completes the handshake; reflection
//! needs a Switchyard identity (no certificate → `UNAUTHENTICATED`, an identity of another
//! trust domain → `PERMISSION_DENIED`, the observer → served); and a client whose
//! certificate another CA issued fails the handshake.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use clap::Parser;
use rustls::pki_types::pem::PemObject;
use switchyard_certs::{Authority, DEFAULT_NAMESPACE, DEFAULT_TRUST_DOMAIN, Leaf};
use switchyard_runtime::{Dialer, GrpcServer, Role, Runtime, RuntimeArgs, TlsArgs};
use tonic::{
    Code, Status,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tonic_reflection::pb::v1::{
    ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
    server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
};

#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    runtime: RuntimeArgs,
}

/// The three files of one identity, as a Secret mounts them.
struct Files {
    dir: PathBuf,
}

impl Files {
    fn flags(&self) -> Vec<String> {
        vec![
            format!("--tls-cert={}", self.dir.join("tls.crt").display()),
            format!("--tls-key={}", self.dir.join("tls.key").display()),
            format!("--tls-ca={}", self.dir.join("ca.crt").display()),
        ]
    }

    fn identity(&self) -> Identity {
        let read = |name| std::fs::read(self.dir.join(name)).expect("readable");
        Identity::from_pem(read("tls.crt"), read("tls.key"))
    }

    fn dialer(&self) -> Dialer {
        Dialer::from_args(&TlsArgs::files(
            &self.dir.join("tls.crt"),
            &self.dir.join("tls.key"),
            &self.dir.join("ca.crt"),
        ))
        .expect("the identity's files load")
    }
}

/// Issues `service_account`'s certificate in `trust_domain` from `issuer`, and writes it
/// under `dir/name` with `trusted` as the CA its holder trusts.
fn issue(
    dir: &Path,
    name: &str,
    issuer: &Authority,
    trusted: &Authority,
    trust_domain: &str,
    service_account: &str,
) -> Files {
    let leaf = Leaf::service(trust_domain, DEFAULT_NAMESPACE, service_account);
    let dir = dir.join(name);
    issuer
        .issue(&leaf)
        .expect("issued")
        .write(&dir, trusted.cert_pem())
        .expect("written");
    Files { dir }
}

/// A runtime serving only health and reflection, as a queue member with `server`'s files.
async fn serve(server: &Files) -> (Runtime, SocketAddr) {
    serve_with(server, &[]).await
}

/// [`serve`] with `extra` flags.
async fn serve_with(server: &Files, extra: &[String]) -> (Runtime, SocketAddr) {
    let args = Args::try_parse_from(
        [
            "test".to_owned(),
            "--admin-addr=127.0.0.1:0".into(),
            "--grpc-addr=127.0.0.1:0".into(),
        ]
        .into_iter()
        .chain(server.flags())
        .chain(extra.iter().cloned()),
    )
    .expect("arguments parse");
    let rt = Runtime::start("switchyard-test", args.runtime)
        .await
        .expect("runtime starts");
    let addr = rt.serve_grpc(GrpcServer::new()).await.expect("gRPC serves");
    (rt, addr)
}

/// A plain gRPC client of `addr` that trusts `ca` and presents `identity`, if any; unlike
/// a Switchyard [`Dialer`], it does not check the server's identity.
async fn connect(addr: SocketAddr, ca: &Authority, identity: Option<&Files>) -> Channel {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.cert_pem()))
        .domain_name("localhost");
    if let Some(files) = identity {
        tls = tls.identity(files.identity());
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .expect("endpoint")
        .tls_config(tls)
        .expect("client tls")
        .connect()
        .await
        .expect("the handshake completes")
}

async fn health(channel: Channel) -> Result<ServingStatus, Status> {
    Ok(HealthClient::new(channel)
        .check(HealthCheckRequest::default())
        .await?
        .into_inner()
        .status())
}

/// The services reflection lists, or the refusal.
async fn list_services(channel: Channel) -> Result<Vec<String>, Status> {
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter([request]))
        .await?
        .into_inner();
    match responses.message().await?.map(|r| r.message_response) {
        Some(Some(MessageResponse::ListServicesResponse(list))) => {
            Ok(list.service.into_iter().map(|s| s.name).collect())
        }
        other => panic!("unexpected reflection response {other:?}"),
    }
}

/// The sum of the samples of `/metrics` whose line starts with `prefix`.
async fn metric(admin: SocketAddr, prefix: &str) -> f64 {
    let text = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .expect("/metrics answers")
        .text()
        .await
        .expect("/metrics body");
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

const HANDSHAKE_FAILURES: &str = "switchyard_grpc_tls_handshake_failures_total";

#[tokio::test]
async fn health_is_open_reflection_needs_an_identity_and_another_cas_client_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = Authority::generate("switchyard test CA").expect("CA");
    let other_ca = Authority::generate("another CA").expect("CA");
    let td = DEFAULT_TRUST_DOMAIN;
    let server = issue(dir.path(), "queue", &ca, &ca, td, "switchyard-queue");
    let observer = issue(dir.path(), "observer", &ca, &ca, td, "switchyard-observer");
    // The right CA, an identity of another installation's trust domain.
    let stranger = issue(
        dir.path(),
        "stranger",
        &ca,
        &ca,
        "example.org",
        "switchyard-observer",
    );
    // Trusts the server's CA, but its own certificate is from another one.
    let foreign = issue(
        dir.path(),
        "foreign",
        &other_ca,
        &ca,
        td,
        "switchyard-observer",
    );
    let (rt, addr) = serve(&server).await;
    let admin = rt.admin_addr();
    let shutdown = rt.shutdown_handle();
    let running = tokio::spawn(rt.run());

    // No client certificate: what a kubelet probe or a load balancer presents.
    let anonymous = connect(addr, &ca, None).await;
    assert_eq!(
        health(anonymous.clone()).await.expect("health is open"),
        ServingStatus::Serving
    );
    let refused = list_services(anonymous)
        .await
        .expect_err("reflection needs an identity");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert_eq!(
        metric(admin, "switchyard_grpc_denied_total{").await,
        1.0,
        "the refusal is counted"
    );

    // The observer dials as Switchyard's own tools do, checking it reached a queue member.
    let dialer = observer.dialer();
    let as_observer = dialer
        .connect(
            &dialer
                .endpoint(&addr.to_string(), Role::Queue)
                .expect("endpoint"),
            Role::Queue,
        )
        .await
        .expect("the observer connects");
    let services = list_services(as_observer)
        .await
        .expect("reflection serves the observer");
    assert!(
        services.iter().any(|s| s == "grpc.health.v1.Health"),
        "{services:?}"
    );

    let as_stranger = connect(addr, &ca, Some(&stranger)).await;
    let denied = list_services(as_stranger)
        .await
        .expect_err("another trust domain holds no role here");
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(
        denied
            .message()
            .contains("spiffe://example.org/ns/switchyard/sa/switchyard-observer"),
        "the refusal names the identity: {denied:?}"
    );

    // A TCP probe (the elector's check that a member is gone): connected, closed, no byte.
    drop(
        tokio::net::TcpStream::connect(addr)
            .await
            .expect("the port accepts"),
    );
    // Accepted after the probe, so served after its handshake task had its answer.
    let _ = health(connect(addr, &ca, None).await).await;
    assert_eq!(
        metric(admin, HANDSHAKE_FAILURES).await,
        0.0,
        "a probe is not a failed handshake"
    );
    let as_foreign = foreign
        .dialer()
        .channel(&addr.to_string(), Role::Queue)
        .expect("channel");
    let failed = health(as_foreign)
        .await
        .expect_err("a certificate from another CA is refused, even for health");
    // The server's alert, as the client's TLS reports it.
    assert!(
        format!("{failed:?}").contains("UnknownCA"),
        "refused in the handshake: {failed:?}"
    );
    assert!(
        metric(admin, HANDSHAKE_FAILURES).await >= 1.0,
        "the server refused it in the handshake"
    );

    shutdown.trigger();
    running.await.expect("run task").expect("drains cleanly");
}

/// The serial of the certificate in `files`, as `--tls-denied-serials` takes it.
fn serial(files: &Files) -> String {
    let pem = std::fs::read(files.dir.join("tls.crt")).expect("readable");
    let der = rustls::pki_types::CertificateDer::from_pem_slice(&pem).expect("a certificate");
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).expect("parses");
    cert.raw_serial()
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A revoked certificate loses its open connections too: the server refuses a denied serial
/// at every handshake, and closes every connection after its maximum age, so a client that
/// connected before the serial was denied is cut off within the age and its grace. A client
/// refuses a server whose serial it denies.
#[tokio::test]
async fn a_denied_serial_is_refused_at_once_and_its_open_connections_end_within_their_age() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = Authority::generate("switchyard test CA").expect("CA");
    let td = DEFAULT_TRUST_DOMAIN;
    let server = issue(dir.path(), "queue", &ca, &ca, td, "switchyard-queue");
    let observer = issue(dir.path(), "observer", &ca, &ca, td, "switchyard-observer");
    let operator = issue(dir.path(), "operator", &ca, &ca, td, "switchyard-operator");
    let denied = dir.path().join("denied-serials");
    std::fs::write(&denied, "# nothing denied yet\n").expect("written");
    let (rt, addr) = serve_with(
        &server,
        &[
            format!("--tls-denied-serials={}", denied.display()),
            "--tls-reload-interval=100ms".into(),
            "--grpc-max-connection-age=1s".into(),
            "--grpc-max-connection-age-grace=1s".into(),
        ],
    )
    .await;
    let shutdown = rt.shutdown_handle();
    let running = tokio::spawn(rt.run());
    let dial = |files: &Files| {
        files
            .dialer()
            .channel(&addr.to_string(), Role::Queue)
            .expect("channel")
    };
    let open = dial(&observer);
    list_services(open.clone()).await.expect("served");

    std::fs::write(
        &denied,
        format!("{}  # the observer's, revoked\n", serial(&observer)),
    )
    .expect("written");
    let refused = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        loop {
            match list_services(dial(&observer)).await {
                Err(status) => return status,
                Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("a new connection is refused once the file is reread");
    assert!(
        format!("{refused:?}").contains("CertificateRevoked"),
        "refused in the handshake: {refused:?}"
    );
    list_services(dial(&operator))
        .await
        .expect("another identity is still served");
    // The connection made before: closed at its age, and its reconnection refused. A call
    // in flight when the server closes the connection fails as a transport error (a broken
    // pipe) before the channel reconnects: counted, and the calls go on until a refusal.
    let started = std::time::Instant::now();
    let mut cut_calls = Vec::new();
    let refused = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            match list_services(open.clone()).await {
                Err(status) if format!("{status:?}").contains("CertificateRevoked") => {
                    return status;
                }
                Err(status) => cut_calls.push(status),
                Ok(_) => {}
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        refused.is_ok(),
        "the open connection ends within its age and grace, and its reconnection is refused; \
         after {:?}, the calls failed only with {cut_calls:?}",
        started.elapsed()
    );

    // A client that denies the server's serial refuses it.
    let mut args = TlsArgs::files(
        &operator.dir.join("tls.crt"),
        &operator.dir.join("tls.key"),
        &operator.dir.join("ca.crt"),
    );
    let denies_server = dir.path().join("denies-server");
    std::fs::write(&denies_server, serial(&server)).expect("written");
    args.tls_denied_serials = Some(denies_server);
    let wary = Dialer::from_args(&args)
        .expect("loads")
        .channel(&addr.to_string(), Role::Queue)
        .expect("channel");
    let failed = list_services(wary)
        .await
        .expect_err("the server is refused");
    assert!(
        format!("{failed:?}").contains("Revoked"),
        "refused by the client: {failed:?}"
    );

    shutdown.trigger();
    running.await.expect("run task").expect("drains cleanly");
}

#[tokio::test]
async fn a_missing_certificate_file_is_named_in_the_error() {
    let args = Args::try_parse_from([
        "test",
        "--admin-addr=127.0.0.1:0",
        "--grpc-addr=127.0.0.1:0",
        "--tls-cert=/nonexistent/tls.crt",
        "--tls-key=/nonexistent/tls.key",
        "--tls-ca=/nonexistent/ca.crt",
    ])
    .expect("arguments parse");
    let error = Runtime::start("switchyard-test", args.runtime)
        .await
        .expect_err("no certificate, no runtime");
    assert_eq!(
        error.to_string(),
        "failed to read TLS certificate from /nonexistent/tls.crt: No such file or directory (os error 2)"
    );
}

#[test]
fn tls_is_required_unless_plaintext_is_asked_for() {
    let error = Args::try_parse_from(["test"]).expect_err("no TLS flags");
    assert!(error.to_string().contains("--tls-cert"), "{error}");
    let error = Args::try_parse_from(["test", "--tls-key=/tmp/tls.key"])
        .expect_err("a key alone is incomplete");
    assert!(error.to_string().contains("--tls-cert"), "{error}");
    let error = Args::try_parse_from(["test", "--tls-cert=/tmp/tls.crt", "--tls-key=/tmp/tls.key"])
        .expect_err("a certificate without the CA is incomplete");
    assert!(error.to_string().contains("--tls-ca"), "{error}");
    let error = Args::try_parse_from([
        "test",
        "--insecure-plaintext",
        "--tls-cert=/tmp/tls.crt",
        "--tls-key=/tmp/tls.key",
        "--tls-ca=/tmp/ca.crt",
    ])
    .expect_err("plaintext or TLS, not both");
    assert!(
        error.to_string().contains("--insecure-plaintext"),
        "{error}"
    );
    let plaintext = Args::try_parse_from(["test", "--insecure-plaintext"]).expect("parses");
    assert!(plaintext.runtime.tls.insecure_plaintext);
}

#[tokio::test]
async fn refusals_of_any_number_of_made_up_methods_keep_the_metric_s_series_fixed() {
    use tower_service::Service;

    let dir = tempfile::tempdir().expect("temp dir");
    let ca = Authority::generate("switchyard test CA").expect("CA");
    let server = issue(
        dir.path(),
        "queue",
        &ca,
        &ca,
        DEFAULT_TRUST_DOMAIN,
        "switchyard-queue",
    );
    let (rt, addr) = serve(&server).await;
    let admin = rt.admin_addr();
    let shutdown = rt.shutdown_handle();
    let running = tokio::spawn(rt.run());

    // Without a certificate, as anyone who reaches the port can: each call names a method no
    // service has.
    let mut anonymous = connect(addr, &ca, None).await;
    let mut call = async |path: String| {
        let request = http::Request::builder()
            .method("POST")
            .uri(format!("https://{addr}{path}"))
            .header("content-type", "application/grpc")
            .body(tonic::body::Body::empty())
            .expect("request");
        std::future::poll_fn(|cx| anonymous.poll_ready(cx))
            .await
            .expect("ready");
        let response = anonymous.call(request).await.expect("answered");
        let status = response
            .headers()
            .get("grpc-status")
            .map(|v| v.to_str().unwrap_or_default().to_owned());
        assert_eq!(status.as_deref(), Some("16"), "{path}: UNAUTHENTICATED");
    };
    let series = async || {
        let text = reqwest::get(format!("http://{admin}/metrics"))
            .await
            .expect("/metrics answers")
            .text()
            .await
            .expect("/metrics body");
        text.lines()
            .filter(|l| l.starts_with("switchyard_grpc_denied_total{"))
            .count()
    };
    call("/made.up.v1.Service/Method".to_owned()).await;
    let before = series().await;
    for i in 0..10_000 {
        call(format!("/made.up.v{i}.Service/Method{i}")).await;
    }
    assert_eq!(
        series().await,
        before,
        "one series for every unknown method"
    );
    assert_eq!(
        metric(admin, "switchyard_grpc_denied_total{method=\"unknown\"").await,
        10_001.0,
        "each refusal counted under method=\"unknown\""
    );

    shutdown.trigger();
    running.await.expect("run task").expect("drains cleanly");
}
