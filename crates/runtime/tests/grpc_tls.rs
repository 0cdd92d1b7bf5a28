//! The gRPC server with mutual TLS from certificate files: a client with a certificate from
//! the configured CA is served; a client without one is refused.

use std::path::Path;

use clap::Parser;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use switchyard_runtime::{GrpcServer, Runtime, RuntimeArgs};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    runtime: RuntimeArgs,
}

struct Pki {
    ca: String,
    server: (String, String),
    client: (String, String),
}

fn pki() -> Pki {
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("key")).expect("ca");
    let leaf = |san: &str| {
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec![san.to_owned()])
            .expect("params")
            .signed_by(&key, &ca)
            .expect("sign");
        (cert.pem(), key.serialize_pem())
    };
    Pki {
        server: leaf("localhost"),
        client: leaf("worker"),
        ca: ca.pem(),
    }
}

fn write(dir: &Path, name: &str, pem: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, pem).expect("write pem");
    path.display().to_string()
}

#[tokio::test]
async fn mutual_tls_serves_clients_with_a_certificate_and_refuses_the_rest() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pki = pki();
    let args = Args::try_parse_from([
        "test",
        "--admin-addr=127.0.0.1:0",
        "--grpc-addr=127.0.0.1:0",
        &format!(
            "--grpc-tls-cert={}",
            write(dir.path(), "tls.crt", &pki.server.0)
        ),
        &format!(
            "--grpc-tls-key={}",
            write(dir.path(), "tls.key", &pki.server.1)
        ),
        &format!(
            "--grpc-tls-client-ca={}",
            write(dir.path(), "ca.crt", &pki.ca)
        ),
    ])
    .expect("arguments parse");
    let rt = Runtime::start("switchyard-test", args.runtime)
        .await
        .expect("runtime starts");
    let addr = rt.serve_grpc(GrpcServer::new()).await.expect("gRPC serves");
    let shutdown = rt.shutdown_handle();
    let running = tokio::spawn(rt.run());

    let endpoint = |tls: ClientTlsConfig| {
        Endpoint::from_shared(format!("https://{addr}"))
            .expect("endpoint")
            .tls_config(tls.domain_name("localhost"))
            .expect("client tls")
    };
    let ca = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&pki.ca));

    let with_cert = endpoint(
        ca.clone()
            .identity(Identity::from_pem(&pki.client.0, &pki.client.1)),
    )
    .connect()
    .await
    .expect("a client with a certificate connects");
    let status = HealthClient::new(with_cert)
        .check(HealthCheckRequest::default())
        .await
        .expect("health check over mTLS")
        .into_inner()
        .status();
    assert_eq!(status, ServingStatus::Serving);

    let refused = match endpoint(ca).connect().await {
        Err(_) => true,
        Ok(channel) => HealthClient::new(channel)
            .check(HealthCheckRequest::default())
            .await
            .is_err(),
    };
    assert!(refused, "a client without a certificate is refused");

    shutdown.trigger();
    running.await.expect("run task").expect("drains cleanly");
}

#[tokio::test]
async fn a_missing_certificate_file_is_named_in_the_error() {
    let args = Args::try_parse_from([
        "test",
        "--admin-addr=127.0.0.1:0",
        "--grpc-addr=127.0.0.1:0",
        "--grpc-tls-cert=/nonexistent/tls.crt",
        "--grpc-tls-key=/nonexistent/tls.key",
    ])
    .expect("arguments parse");
    let rt = Runtime::start("switchyard-test", args.runtime)
        .await
        .expect("runtime starts");
    let error = rt
        .serve_grpc(GrpcServer::new())
        .await
        .expect_err("no certificate, no server");
    assert_eq!(
        error.to_string(),
        "failed to read TLS certificate from /nonexistent/tls.crt: No such file or directory (os error 2)"
    );
}

#[test]
fn a_key_without_a_certificate_is_refused_at_parse_time() {
    let error = Args::try_parse_from(["test", "--grpc-tls-key=/tmp/tls.key"])
        .expect_err("key alone is incomplete");
    assert!(error.to_string().contains("--grpc-tls-cert"), "{error}");
}
