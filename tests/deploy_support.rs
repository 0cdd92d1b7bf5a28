//! Helpers of the deploy tests: build an overlay with the harness's kustomize, point its
//! external metrics APIService at an in-process queue on loopback, apply with server-side
//! apply, and run the queue whose metrics the HPA reads. cert-manager's CRDs are installed
//! from the harness's cache, and the test plays cert-manager's CA injector: the queue serves
//! a certificate of the test CA ([`TestPki`]) and the APIService's caBundle gets that CA.

#![allow(dead_code, clippy::unwrap_used)]

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use switchyard_certs::identities;
use switchyard_runtime::{Role, ShutdownHandle};
use switchyard_testenv::{ControlPlane, Pki};

/// The field manager of every apply in these tests.
pub const FIELD_MANAGER: &str = "switchyard-deploy-test";
/// The namespace every overlay installs into.
pub const NAMESPACE: &str = "switchyard";
pub const OVERLAYS: [&str; 4] = ["dev", "ha", "with-etcd", "otel"];
/// The overlays with components/external-metrics (the HPA reads the backlog through it).
pub const OVERLAYS_WITH_EXTERNAL_METRICS: [&str; 1] = ["ha"];
/// How long the aggregation layer gets to report the external metrics APIService available.
pub const APISERVICE_TIMEOUT: Duration = Duration::from_secs(60);
/// The field manager that plays cert-manager's CA injector.
pub const CA_INJECTOR: &str = "cert-manager-cainjector";
/// The APIService the queue serves.
pub const APISERVICE: &str = "v1beta1.external.metrics.k8s.io";
/// cert-manager's CRDs, as `kubectl get -f` names them.
pub const CERT_MANAGER_CRDS: [&str; 6] = [
    "certificaterequests.cert-manager.io",
    "certificates.cert-manager.io",
    "challenges.acme.cert-manager.io",
    "clusterissuers.cert-manager.io",
    "issuers.cert-manager.io",
    "orders.acme.cert-manager.io",
];

pub fn overlay_dir(overlay: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kustomize/overlays")
        .join(overlay)
        .canonicalize()
        .unwrap()
}

/// A component of deploy/kustomize/components.
pub fn component_dir(component: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kustomize/components")
        .join(component)
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
    build_wrapped(plane, &overlay_dir(overlay), &[], metrics_port, extra).await
}

/// [`build_for_loopback`] of the kustomization in `resource` with `components` (directories)
/// added, as a user's own overlay adds them.
pub async fn build_wrapped(
    plane: &ControlPlane,
    resource: &Path,
    components: &[&Path],
    metrics_port: u16,
    extra: &str,
) -> String {
    static WRAPPERS: AtomicUsize = AtomicUsize::new(0);
    let dir = plane.dir().join(format!(
        "kustomize-{}-{metrics_port}-{}",
        resource.file_name().unwrap().to_string_lossy(),
        WRAPPERS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let components: String = components
        .iter()
        .map(|c| format!("  - {}\n", relative_to(&dir, c).display()))
        .collect();
    let kustomization = format!(
        r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {overlay_dir}
components:
{components}patches:
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
        overlay_dir = relative_to(&dir, resource).display(),
    );
    std::fs::write(dir.join("kustomization.yaml"), kustomization).unwrap();
    kustomize_build(plane, &dir).await
}

/// `to` as a path relative to the directory `from` (both absolute): kustomize refuses
/// absolute paths of other kustomizations.
pub fn relative_to(from: &Path, to: &Path) -> PathBuf {
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
    server_side_apply(plane, what, manifests, &[]).await
}

/// [`apply_cleanly`] as a dry run (`--dry-run=server`): the apiserver takes every object,
/// with no warning, and keeps none.
pub async fn dry_run_cleanly(plane: &ControlPlane, what: &str, manifests: &str) -> String {
    server_side_apply(plane, what, manifests, &["--dry-run=server"]).await
}

async fn server_side_apply(
    plane: &ControlPlane,
    what: &str,
    manifests: &str,
    more: &[&str],
) -> String {
    let field_manager = format!("--field-manager={FIELD_MANAGER}");
    let mut args = vec![
        "apply",
        "--server-side",
        // Unknown or malformed fields are errors, for built-in kinds and CRDs alike.
        "--validate=strict",
        &field_manager,
    ];
    args.extend(more);
    args.extend(["-f", "-"]);
    let out = kubectl(plane, &args, Some(manifests)).await;
    assert!(
        out.success && out.stderr.trim().is_empty(),
        "{what}: server-side apply must succeed with no warning\nstdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    out.stdout
}

/// Creates the installation's namespace (applied, so one already there is kept).
pub async fn create_namespace(plane: &ControlPlane) {
    let namespace = kubectl(
        plane,
        &[
            "create",
            "namespace",
            NAMESPACE,
            "--dry-run=client",
            "-o",
            "yaml",
        ],
        None,
    )
    .await;
    apply_cleanly(plane, "the switchyard namespace", &namespace.stdout).await;
}

/// Installs cert-manager's CRDs (from the harness's cache) once per test process, and waits
/// until the apiserver serves them.
pub async fn install_cert_manager_crds(plane: &ControlPlane) {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    INSTALLED
        .get_or_init(|| async {
            let crds = std::fs::read_to_string(plane.binaries().cert_manager_crds()).unwrap();
            apply_cleanly(plane, "cert-manager CRDs", &crds).await;
            let crds: Vec<String> = CERT_MANAGER_CRDS
                .iter()
                .map(|crd| format!("crd/{crd}"))
                .collect();
            let mut args = vec!["wait", "--for=condition=Established", "--timeout=60s"];
            args.extend(crds.iter().map(String::as_str));
            let out = kubectl(plane, &args, None).await;
            assert!(out.success, "cert-manager CRDs established: {}", out.stderr);
        })
        .await;
}

/// The Prometheus Operator's CRDs, as `kubectl get -f` names them: the kinds
/// components/monitoring uses.
pub const PROMETHEUS_OPERATOR_CRDS: [&str; 2] = [
    "servicemonitors.monitoring.coreos.com",
    "prometheusrules.monitoring.coreos.com",
];

/// Installs the Prometheus Operator's ServiceMonitor and PrometheusRule CRDs (from the
/// harness's cache) once per test process, and waits until the apiserver serves them.
pub async fn install_prometheus_operator_crds(plane: &ControlPlane) {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    INSTALLED
        .get_or_init(|| async {
            let crds =
                std::fs::read_to_string(plane.binaries().prometheus_operator_crds()).unwrap();
            apply_cleanly(plane, "Prometheus Operator CRDs", &crds).await;
            let crds: Vec<String> = PROMETHEUS_OPERATOR_CRDS
                .iter()
                .map(|crd| format!("crd/{crd}"))
                .collect();
            let mut args = vec!["wait", "--for=condition=Established", "--timeout=60s"];
            args.extend(crds.iter().map(String::as_str));
            let out = kubectl(plane, &args, None).await;
            assert!(
                out.success,
                "Prometheus Operator CRDs established: {}",
                out.stderr
            );
        })
        .await;
}

/// The queue's certificate as the manifests give it (crates/certs' identity, with the
/// `switchyard-queue-metrics` names), signed by the test process's CA (testenv's
/// [`Pki::shared`], which also signs every client the tests dial as); the CA's files are
/// written again under the control plane's directory for `switchyard-certs --ca-cert/--ca-key`.
#[derive(Debug)]
pub struct TestPki {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub ca_pem: String,
    /// The queue's certificate: tls.crt, tls.key, ca.crt.
    pub queue: PathBuf,
}

impl TestPki {
    pub fn shared(plane: &ControlPlane) -> &'static Self {
        static PKI: OnceLock<TestPki> = OnceLock::new();
        PKI.get_or_init(|| {
            let pki = Pki::shared();
            let dir = plane.dir().join("switchyard-ca");
            pki.ca().write(&dir).unwrap();
            let leaf = identities::QUEUE.leaf(
                switchyard_certs::DEFAULT_TRUST_DOMAIN,
                NAMESPACE,
                Duration::from_secs(24 * 3600),
            );
            let issued = pki.ca().issue(&leaf).unwrap();
            let files = pki.write("deploy-test-queue", &issued).unwrap();
            Self {
                ca_cert: dir.join("ca.crt"),
                ca_key: dir.join("ca.key"),
                ca_pem: pki.ca().cert_pem().to_owned(),
                queue: files.cert.parent().unwrap().to_owned(),
            }
        })
    }
}

/// A gRPC client of the in-process queue, dialled with mutual TLS as `role`.
pub async fn queue_client(
    queue: &Queue,
    role: Role,
) -> switchyard_proto::queue::v1::queue_client::QueueClient<tonic::transport::Channel> {
    let channel = Pki::shared()
        .channel(role, Role::Queue, queue.grpc)
        .await
        .unwrap();
    switchyard_proto::queue::v1::queue_client::QueueClient::new(channel)
}

/// Sets the APIService's caBundle to `ca_pem` as cert-manager's CA injector does for the
/// annotation `cert-manager.io/inject-ca-from`: under its own field manager, so a user's
/// re-apply of the overlay leaves it alone.
pub async fn inject_ca_bundle(plane: &ControlPlane, ca_pem: &str) {
    use base64::Engine;
    let patch = serde_json::json!({
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": APISERVICE},
        "spec": {"caBundle": base64::engine::general_purpose::STANDARD.encode(ca_pem)},
    });
    let out = kubectl(
        plane,
        &[
            "apply",
            "--server-side",
            &format!("--field-manager={CA_INJECTOR}"),
            "-f",
            "-",
        ],
        Some(&patch.to_string()),
    )
    .await;
    assert!(out.success, "caBundle injected: {}", out.stderr);
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

/// Deletes the external metrics APIService: a test that registered it for its own queue does
/// so when that queue stops, so that no later apply meets an aggregated API nobody serves
/// (kubectl would warn about its discovery).
pub async fn unregister_external_metrics(plane: &ControlPlane) {
    let out = kubectl(
        plane,
        &["delete", "apiservice", APISERVICE, "--ignore-not-found"],
        None,
    )
    .await;
    assert!(out.success, "APIService deleted: {}", out.stderr);
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
    /// metrics API (in these tests, the apiserver's front-proxy CA). The queue's certificate
    /// (`tls` holds tls.crt, tls.key and ca.crt) serves gRPC with mutual TLS and the external
    /// metrics API, as the manifests mount and pass it.
    pub async fn start(shard_count: u32, client_ca: &Path, tls: &Path) -> Self {
        let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let (rt, grpc) = switchyard_queue::Args::start_local(
            shard_count,
            &[],
            [
                format!("--external-metrics-addr=127.0.0.1:{metrics_port}"),
                format!("--external-metrics-client-ca={}", client_ca.display()),
                // The name of the harness's front-proxy client certificate, as kubeadm's.
                "--external-metrics-allowed-names=front-proxy-client".into(),
                format!("--tls-cert={}", tls.join("tls.crt").display()),
                format!("--tls-key={}", tls.join("tls.key").display()),
                format!("--tls-ca={}", tls.join("ca.crt").display()),
                format!(
                    "--external-metrics-tls-cert={}",
                    tls.join("tls.crt").display()
                ),
                format!(
                    "--external-metrics-tls-key={}",
                    tls.join("tls.key").display()
                ),
                "--drain-grace=1s".into(),
            ],
        )
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

    pub async fn stop(self) {
        self.shutdown.trigger();
        self.running.await.unwrap().unwrap();
    }
}
