//! kube-controller-manager on request, with only the controllers a test names: the peer
//! Switchyard is compared with.

use std::{path::Path, time::Duration};

use super::{
    ControlPlane, SERVICE_CIDR, START_TIMEOUT,
    components::{http_ok, insecure_http},
};
use crate::{
    Error, Result,
    ports::free_port,
    process::{ManagedProcess, start_on_free_ports, wait_healthy},
};

/// A kube-controller-manager running the chosen controllers; stopped on drop.
#[derive(Debug)]
pub struct ControllerManager {
    process: ManagedProcess,
    /// The secure port, serving `/healthz` and `/metrics`.
    port: u16,
}

impl ControllerManager {
    pub fn log(&self) -> &Path {
        self.process.log()
    }

    /// The process id, for resident-set readings.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Its Prometheus metrics (the work queues' among them). Read without credentials, so
    /// it must have been started with `/metrics` in `--authorization-always-allow-paths`.
    pub async fn metrics(&self) -> Result<String> {
        let url = format!("https://127.0.0.1:{}/metrics", self.port);
        let response = insecure_http()?
            .get(&url)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| Error::Setup(format!("GET {url}: {e}")))?;
        response
            .text()
            .await
            .map_err(|e| Error::Setup(format!("GET {url}: {e}")))
    }
}

impl ControlPlane {
    /// Starts kube-controller-manager with only `controllers` enabled (for example
    /// `["replicaset", "horizontalpodautoscaling"]`); `extra_args` are appended as given.
    pub async fn start_controller_manager(
        &self,
        controllers: &[&str],
        extra_args: &[&str],
    ) -> Result<ControllerManager> {
        self.start_controller_manager_from("kube-controller-manager", &[], controllers, extra_args)
            .await
    }

    /// [`ControlPlane::start_controller_manager`] with `kube-controller-manager-slowed`
    /// (`scripts/testenv.sh kcm-slowed`): every Deployment and ReplicaSet sync first waits
    /// `latency`, as a Switchyard reconcile does under `--simulated-latency`.
    pub async fn start_controller_manager_slowed(
        &self,
        latency: Duration,
        controllers: &[&str],
        extra_args: &[&str],
    ) -> Result<ControllerManager> {
        let program = "kube-controller-manager-slowed";
        if !self.binaries.path(program).exists() {
            return Err(Error::Build(format!(
                "{program} is missing from {}; run `scripts/testenv.sh kcm-slowed`",
                self.binaries.dir().display()
            )));
        }
        let latency = format!("{}ms", latency.as_millis());
        self.start_controller_manager_from(
            program,
            &[("SWITCHYARD_SIMULATED_LATENCY", &latency)],
            controllers,
            extra_args,
        )
        .await
    }

    async fn start_controller_manager_from(
        &self,
        program: &str,
        envs: &[(&str, &str)],
        controllers: &[&str],
        extra_args: &[&str],
    ) -> Result<ControllerManager> {
        let (process, port) = start_on_free_ports("kube-controller-manager", || async {
            let port = free_port()?;
            let mut args = vec![
                format!("--kubeconfig={}", self.kubeconfig.display()),
                format!("--authentication-kubeconfig={}", self.kubeconfig.display()),
                format!("--authorization-kubeconfig={}", self.kubeconfig.display()),
                "--leader-elect=false".to_owned(),
                "--bind-address=127.0.0.1".to_owned(),
                format!("--secure-port={port}"),
                format!("--controllers={}", controllers.join(",")),
                format!(
                    "--service-account-private-key-file={}",
                    self.pki.service_account_key.display()
                ),
                format!("--root-ca-file={}", self.pki.ca_cert.display()),
                "--use-service-account-credentials=true".to_owned(),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            ];
            args.extend(extra_args.iter().map(|a| (*a).to_owned()));
            let mut process = ManagedProcess::spawn(
                "kube-controller-manager",
                &self.binaries.path(program),
                &args,
                envs,
                &self.dir.join("kube-controller-manager.log"),
            )?;
            let http = insecure_http()?;
            let url = format!("https://127.0.0.1:{port}/healthz");
            wait_healthy(&mut process, START_TIMEOUT, || http_ok(&http, &url)).await?;
            Ok((process, port))
        })
        .await?;
        Ok(ControllerManager { process, port })
    }
}
