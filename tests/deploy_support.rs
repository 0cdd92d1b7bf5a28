//! Helpers of the deploy tests: build an overlay with the harness's kustomize, point its
//! external metrics APIService at an in-process queue on loopback, apply with server-side
//! apply, and run the queue whose metrics the HPA reads.

#![allow(dead_code, clippy::unwrap_used)]

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use clap::Parser;
use switchyard_proto::queue::v1::queue_client::QueueClient;
use switchyard_runtime::{Role, ShutdownHandle};
use switchyard_testenv::{ControlPlane, Pki};

/// The field manager of every apply in these tests.
pub const FIELD_MANAGER: &str = "switchyard-deploy-test";
/// The namespace every overlay installs into.
pub const NAMESPACE: &str = "switchyard";
pub const OVERLAYS: [&str; 4] = ["dev", "ha", "with-etcd", "otel"];
/// How long the aggregation layer gets to report the external metrics APIService available.
pub const APISERVICE_TIMEOUT: Duration = Duration::from_secs(60);

pub fn overlay_dir(overlay: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kustomize/overlays")
        .join(overlay)
        .canonicalize()
        .unwrap()
}

pub fn base_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kustomize/base")
        .canonicalize()
        .unwrap()
}

/// `kustomize build dir`, with the harness's kustomize; panics with its stderr on failure.
pub async fn kustomize_build(plane: &ControlPlane, dir: &Path) -> String {
    let output = tokio::process::Command::new(plane.binaries().path("kustomize"))
        .arg("build")
        .arg(dir)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "kustomize build {}: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Builds `overlay` with the changes loopback needs, and only those: Endpoints may not hold
/// 127.0.0.1, so the aggregation layer reaches the queue through a Service of type
/// ExternalName (localhost) and the APIService's port. `extra` is appended to the wrapping
/// kustomization's `patches:` list.
pub async fn build_for_loopback(
    plane: &ControlPlane,
    overlay: &str,
    metrics_port: u16,
    extra: &str,
) -> String {
    let dir = plane
        .dir()
        .join(format!("kustomize-{overlay}-{metrics_port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let kustomization = format!(
        r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {overlay_dir}
patches:
  - target: {{kind: Service, name: switchyard-queue-metrics}}
    patch: |-
      - op: replace
        path: /spec
        value: {{type: ExternalName, externalName: localhost, ports: [{{name: https, port: 443}}]}}
  - target: {{kind: APIService, name: v1beta1.external.metrics.k8s.io}}
    patch: |-
      - op: replace
        path: /spec/service/port
        value: {metrics_port}
{extra}"#,
        overlay_dir = relative_to(&dir, &overlay_dir(overlay)).display(),
    );
    std::fs::write(dir.join("kustomization.yaml"), kustomization).unwrap();
    kustomize_build(plane, &dir).await
}

/// `to` as a path relative to the directory `from` (both absolute): kustomize refuses
/// absolute paths of other kustomizations.
fn relative_to(from: &Path, to: &Path) -> PathBuf {
    let from = from.canonicalize().unwrap();
    let mut path: PathBuf = from
        .components()
        .skip(1)
        .map(|_| std::path::Component::ParentDir)
        .collect();
    path.push(to.strip_prefix("/").unwrap());
    path
}

#[derive(Debug)]
pub struct Output {
    pub success: bool,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs kubectl with `args`, feeding `stdin`.
pub async fn kubectl(plane: &ControlPlane, args: &[&str], stdin: Option<&str>) -> Output {
    use tokio::io::AsyncWriteExt;
    let mut command = tokio::process::Command::from(plane.kubectl());
    command
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .await
        .unwrap();
    drop(input);
    let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("kubectl finishes within 2 minutes")
        .unwrap();
    Output {
        success: output.status.success(),
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `kubectl apply --server-side` of `manifests`; panics unless it succeeds with nothing on
/// stderr (kubectl prints the apiserver's warnings there).
pub async fn apply_cleanly(plane: &ControlPlane, what: &str, manifests: &str) -> String {
    let out = kubectl(
        plane,
        &[
            "apply",
            "--server-side",
            &format!("--field-manager={FIELD_MANAGER}"),
            "-f",
            "-",
        ],
        Some(manifests),
    )
    .await;
    assert!(
        out.success && out.stderr.trim().is_empty(),
        "{what}: server-side apply must succeed with no warning\nstdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    out.stdout
}

/// `kind/namespace/name=resourceVersion` of every object in `manifests`, sorted.
pub async fn resource_versions(plane: &ControlPlane, manifests: &str) -> Vec<String> {
    let out = kubectl(
        plane,
        &[
            "get",
            "-f",
            "-",
            "-o",
            r#"jsonpath={range .items[*]}{.kind}/{.metadata.namespace}/{.metadata.name}={.metadata.resourceVersion}{"\n"}{end}"#,
        ],
        Some(manifests),
    )
    .await;
    assert!(out.success, "kubectl get -f: {}", out.stderr);
    let mut lines: Vec<String> = out.stdout.lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

/// Waits until the external metrics APIService reports Available=True.
pub async fn await_apiservice_available(plane: &ControlPlane) {
    let deadline = Instant::now() + APISERVICE_TIMEOUT;
    loop {
        let out = kubectl(
            plane,
            &[
                "get",
                "apiservice",
                "v1beta1.external.metrics.k8s.io",
                "-o",
                r#"jsonpath={.status.conditions[?(@.type=="Available")].status} {.status.conditions[?(@.type=="Available")].message}"#,
            ],
            None,
        )
        .await;
        if out.stdout.starts_with("True") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "APIService v1beta1.external.metrics.k8s.io not Available within {APISERVICE_TIMEOUT:?}: {} {}",
            out.stdout,
            out.stderr
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A queue running in this process, serving gRPC and the external metrics API on loopback.
pub struct Queue {
    pub grpc: SocketAddr,
    pub metrics_port: u16,
    shutdown: ShutdownHandle,
    running: tokio::task::JoinHandle<Result<(), switchyard_runtime::Error>>,
}

impl Queue {
    /// With `client_ca`, only clients with a certificate from that CA may call the external
    /// metrics API (in these tests, the apiserver's front-proxy CA).
    pub async fn start(shard_count: u32, client_ca: &Path) -> Self {
        let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let (rt, grpc) = switchyard_queue::Args::try_parse_from(
            [
                "switchyard-queue".to_owned(),
                "--admin-addr=127.0.0.1:0".into(),
                "--grpc-addr=127.0.0.1:0".into(),
                format!("--shard-count={shard_count}"),
                format!("--external-metrics-addr=127.0.0.1:{metrics_port}"),
                format!("--external-metrics-client-ca={}", client_ca.display()),
                "--drain-grace=1s".into(),
            ]
            .into_iter()
            .chain(Pki::shared().flags(Role::Queue)),
        )
        .unwrap()
        .start()
        .await
        .unwrap();
        let shutdown = rt.shutdown_handle();
        Self {
            grpc,
            metrics_port,
            shutdown,
            running: tokio::spawn(rt.run()),
        }
    }

    /// A client of this queue's gRPC API, as a reconciler (it enqueues and leases), over
    /// mutual TLS.
    pub async fn client(&self) -> QueueClient<tonic::transport::Channel> {
        QueueClient::new(
            Pki::shared()
                .channel(Role::Reconciler, Role::Queue, self.grpc)
                .await
                .unwrap(),
        )
    }

    pub async fn stop(self) {
        self.shutdown.trigger();
        self.running.await.unwrap().unwrap();
    }
}
