//! The control plane's processes: kube-apiserver, kube-scheduler and kwok, each started on
//! free ports and waited for until healthy.

use std::{path::Path, time::Duration};

use super::{
    ControlPlane, KWOK_NODE_ANNOTATION, POD_CIDR, SERVICE_CIDR, SERVICE_CIDR_IPV6, START_TIMEOUT,
};
use crate::{
    Binaries, Error, Result,
    pki::Pki,
    ports::free_port,
    process::{ManagedProcess, start_on_free_ports, wait_healthy},
};

/// The name (and log file) of the control plane's kube-apiserver.
pub(super) const APISERVER: &str = "kube-apiserver";

/// Starts a kube-apiserver named `name` on `port` (a free one when `None`).
pub(super) async fn start_apiserver(
    binaries: &Binaries,
    dir: &Path,
    pki: &Pki,
    etcd_url: &str,
    name: &str,
    port: Option<u16>,
) -> Result<(ManagedProcess, String)> {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.ca_cert)?)
        .map_err(|e| Error::Setup(format!("invalid generated CA: {e}")))?;
    let http = reqwest::Client::builder()
        .add_root_certificate(ca)
        .build()
        .map_err(|e| Error::Setup(format!("failed to build an HTTP client: {e}")))?;
    start_on_free_ports(name, || async {
        let port = port.map_or_else(free_port, Ok)?;
        let server = format!("https://127.0.0.1:{port}");
        let p = |path: &Path| path.display().to_string();
        let args = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", p(&dir.join("apiserver-certs"))),
            format!("--tls-cert-file={}", p(&pki.serving_cert)),
            format!("--tls-private-key-file={}", p(&pki.serving_key)),
            format!("--client-ca-file={}", p(&pki.ca_cert)),
            "--authorization-mode=Node,RBAC".to_owned(),
            format!("--service-cluster-ip-range={SERVICE_CIDR},{SERVICE_CIDR_IPV6}"),
            // Endpoints may not hold loopback addresses, so the `kubernetes` Service endpoint
            // reconciler would fail on 127.0.0.1.
            "--endpoint-reconciler-type=none".to_owned(),
            "--allow-privileged=true".to_owned(),
            // This plugin taints every new Node not-ready and leaves the untainting to
            // kube-controller-manager's node-lifecycle controller, which does not run here.
            "--disable-admission-plugins=TaintNodesByCondition".to_owned(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            format!(
                "--service-account-key-file={}",
                p(&pki.service_account_public_key)
            ),
            format!(
                "--service-account-signing-key-file={}",
                p(&pki.service_account_key)
            ),
            // The aggregation layer (external metrics for the HPA).
            format!(
                "--requestheader-client-ca-file={}",
                p(&pki.front_proxy_ca_cert)
            ),
            "--requestheader-allowed-names=front-proxy-client".to_owned(),
            "--requestheader-username-headers=X-Remote-User".to_owned(),
            "--requestheader-group-headers=X-Remote-Group".to_owned(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_owned(),
            format!(
                "--proxy-client-cert-file={}",
                p(&pki.front_proxy_client_cert)
            ),
            format!("--proxy-client-key-file={}", p(&pki.front_proxy_client_key)),
        ];
        let mut process = ManagedProcess::spawn(
            name,
            &binaries.path("kube-apiserver"),
            &args,
            &[],
            &dir.join(format!("{name}.log")),
        )?;
        let url = format!("{server}/readyz");
        wait_healthy(&mut process, START_TIMEOUT, || http_ok(&http, &url)).await?;
        Ok((process, server))
    })
    .await
}

/// The scheduler's client limit. Its default (50 requests/s) would make Pod binding the
/// bottleneck of every large test and benchmark (2,000 Pods take 40 s to bind), hiding the
/// controllers under test; the fake Nodes need no protection from a faster scheduler.
pub(super) const SCHEDULER_CLIENT_QPS: u32 = 1000;

pub(super) async fn start_scheduler(plane: &ControlPlane) -> Result<ManagedProcess> {
    let http = insecure_http()?;
    let config = plane.dir.join("kube-scheduler.yaml");
    let body = format!(
        "apiVersion: kubescheduler.config.k8s.io/v1\n\
         kind: KubeSchedulerConfiguration\n\
         clientConnection:\n  kubeconfig: {kubeconfig}\n  qps: {SCHEDULER_CLIENT_QPS}\n  burst: {SCHEDULER_CLIENT_QPS}\n\
         leaderElection:\n  leaderElect: false\n",
        kubeconfig = plane.kubeconfig.display(),
    );
    std::fs::write(&config, body)
        .map_err(|e| Error::Setup(format!("failed to write {}: {e}", config.display())))?;
    start_on_free_ports("kube-scheduler", || async {
        let port = free_port()?;
        let kubeconfig = plane.kubeconfig.display();
        let args = vec![
            format!("--config={}", config.display()),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
        ];
        let mut process = ManagedProcess::spawn(
            "kube-scheduler",
            &plane.binaries.path("kube-scheduler"),
            &args,
            &[],
            &plane.dir.join("kube-scheduler.log"),
        )?;
        let url = format!("https://127.0.0.1:{port}/healthz");
        wait_healthy(&mut process, START_TIMEOUT, || http_ok(&http, &url)).await?;
        Ok(process)
    })
    .await
}

pub(super) async fn start_kwok(plane: &ControlPlane) -> Result<ManagedProcess> {
    let http = reqwest::Client::new();
    start_on_free_ports("kwok", || async {
        let port = free_port()?;
        let args = vec![
            format!("--kubeconfig={}", plane.kubeconfig.display()),
            format!("--config={}", plane.binaries.kwok_stages().display()),
            format!(
                "--manage-nodes-with-annotation-selector={}={}",
                KWOK_NODE_ANNOTATION.0, KWOK_NODE_ANNOTATION.1
            ),
            // Node and pod addresses are never dialed; keep the node on loopback anyway.
            "--node-ip=127.0.0.1".to_owned(),
            format!("--cidr={POD_CIDR}"),
            "--node-lease-duration-seconds=40".to_owned(),
            format!("--server-address=127.0.0.1:{port}"),
        ];
        let mut process = ManagedProcess::spawn(
            "kwok",
            &plane.binaries.path("kwok"),
            &args,
            &[],
            &plane.dir.join("kwok.log"),
        )?;
        let url = format!("http://127.0.0.1:{port}/healthz");
        wait_healthy(&mut process, START_TIMEOUT, || http_ok(&http, &url)).await?;
        Ok(process)
    })
    .await
}

/// For the health endpoints of kube-scheduler and kube-controller-manager, which serve a
/// self-signed certificate they generate at start; loopback only.
pub(super) fn insecure_http() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .map_err(|e| Error::Setup(format!("failed to build an HTTP client: {e}")))
}

pub(crate) async fn http_ok(http: &reqwest::Client, url: &str) -> bool {
    http.get(url)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}
