use std::{
    path::{Path, PathBuf},
    sync::{Mutex, OnceLock, PoisonError},
    time::Duration,
};

use switchyard_k8s::{
    Api, Client, Config, Node, PostParams, await_condition,
    k8s_openapi::api::core::v1::ServiceAccount, kube,
};
use tracing::info;

mod components;
mod controller_manager;
mod faults;

pub use controller_manager::ControllerManager;
pub use faults::ApiServer;

pub(crate) use components::http_ok;
use components::{APISERVER, start_apiserver, start_kwok, start_scheduler};

use crate::{
    Binaries, Error, Etcd, Result, kubeconfig,
    pki::Pki,
    process::{ManagedProcess, register_at_exit},
};

/// How long each component gets to become healthy. Generous: on 2 busy cores a cold
/// kube-apiserver takes 10-20 s to serve /readyz.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(120);
/// The annotation kwok selects the Nodes it plays the kubelet for.
const KWOK_NODE_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");
/// Service and pod address ranges; both fake, never dialed. The apiserver is dual-stack
/// (IPv4 first, so a Service is IPv4 unless it asks for more); a Node's `podCIDRs` give
/// its Pods addresses of both families when a test wants them.
const SERVICE_CIDR: &str = "10.0.0.0/24";
const SERVICE_CIDR_IPV6: &str = "fd00:10:96::/112";
const POD_CIDR: &str = "10.244.0.0/16";

#[derive(Clone, Debug)]
pub struct ControlPlaneOptions {
    /// Number of fake kwok Nodes.
    pub nodes: usize,
    /// Directory for certificates, data and logs; a fresh temporary one when `None`.
    pub dir: Option<PathBuf>,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        Self {
            nodes: 3,
            dir: None,
        }
    }
}

/// etcd, kube-apiserver, kube-scheduler and kwok with fake Nodes, on loopback.
#[derive(Debug)]
pub struct ControlPlane {
    binaries: Binaries,
    dir: PathBuf,
    temp: Mutex<Option<tempfile::TempDir>>,
    pki: Pki,
    server: String,
    etcd_url: String,
    kubeconfig: PathBuf,
    nodes: Vec<String>,
    /// In start order; stopped in reverse.
    processes: Mutex<Vec<ManagedProcess>>,
}

impl ControlPlane {
    /// The control plane shared by every test of this test binary, started on first use and
    /// stopped when the process exits. Give each test its own namespace ([`crate::TestNamespace`]).
    pub fn shared() -> Result<&'static ControlPlane> {
        static SHARED: OnceLock<std::result::Result<ControlPlane, String>> = OnceLock::new();
        extern "C" fn stop_shared() {
            if let Some(Ok(plane)) = SHARED.get() {
                plane.stop();
            }
        }
        let shared = SHARED.get_or_init(|| {
            // Tests call this from inside their own runtimes, so start on a fresh thread.
            let started = std::thread::spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                runtime
                    .block_on(ControlPlane::start(ControlPlaneOptions::default()))
                    .map_err(|e| e.to_string())
            })
            .join()
            .unwrap_or_else(|_| Err("control plane start panicked".to_owned()));
            if started.is_ok() {
                register_at_exit(stop_shared);
            }
            started
        });
        shared.as_ref().map_err(|e| Error::Setup(e.clone()))
    }

    /// Starts a new control plane and waits until every component is healthy and every
    /// Node is Ready.
    pub async fn start(options: ControlPlaneOptions) -> Result<Self> {
        let ControlPlaneOptions { nodes, dir } = options;
        let binaries = Binaries::locate()?;
        let (dir, temp) = match dir {
            Some(dir) => {
                std::fs::create_dir_all(&dir)?;
                (dir, None)
            }
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("switchyard-testenv-")
                    .tempdir()?;
                (temp.path().to_owned(), Some(temp))
            }
        };
        match Self::start_in(binaries, dir, nodes).await {
            Ok(plane) => {
                *plane.temp.lock().unwrap_or_else(PoisonError::into_inner) = temp;
                Ok(plane)
            }
            Err(error) => {
                // Keep the logs the error points at.
                let _ = temp.map(tempfile::TempDir::keep);
                Err(error)
            }
        }
    }

    async fn start_in(binaries: Binaries, dir: PathBuf, nodes: usize) -> Result<Self> {
        let pki = Pki::generate(&dir)?;
        let mut processes = Vec::new();

        let (etcd, etcd_url) = Etcd::start_in(&binaries, &dir).await?.into_parts();
        processes.push(etcd);
        let (apiserver, server) =
            start_apiserver(&binaries, &dir, &pki, &etcd_url, APISERVER, None).await?;
        processes.push(apiserver);
        let kubeconfig = dir.join("kubeconfig");
        kubeconfig::write(&kubeconfig, &server, &pki)?;

        let plane = Self {
            binaries,
            dir,
            temp: Mutex::new(None),
            pki,
            server,
            etcd_url,
            kubeconfig,
            nodes: (0..nodes).map(|i| format!("kwok-node-{i}")).collect(),
            processes: Mutex::new(processes),
        };
        let client = plane.client().await?;
        // Without kube-controller-manager nothing creates the `default` ServiceAccount that
        // ServiceAccount admission requires before a Pod can be created.
        create_default_service_account(&client, "default").await?;

        let scheduler = start_scheduler(&plane).await?;
        plane.push(scheduler);
        let kwok = start_kwok(&plane).await?;
        plane.push(kwok);
        plane.create_nodes(&client).await?;
        info!(server = %plane.server, kubeconfig = %plane.kubeconfig.display(), "control plane ready");
        Ok(plane)
    }

    /// The apiserver URL, `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// An admin kubeconfig (client certificate in group system:masters).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The aggregation layer's front-proxy CA (the apiserver's `--requestheader-client-ca-file`):
    /// an extension API server accepts the proxy's client certificate against it.
    pub fn front_proxy_ca(&self) -> &Path {
        &self.pki.front_proxy_ca_cert
    }

    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// Names of the fake Nodes kwok keeps Ready.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// A new admin client. Create one per test: a client is bound to the runtime it was
    /// created on.
    pub async fn client(&self) -> Result<Client> {
        client_from(&self.kubeconfig).await
    }

    /// The CPU time its processes (etcd, kube-apiserver, kube-scheduler, kwok) have used so
    /// far, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        self.cpu_seconds_by_process().iter().map(|(_, s)| s).sum()
    }

    /// The CPU time each of its processes has used so far, in seconds, by process name, in
    /// the order they started.
    pub fn cpu_seconds_by_process(&self) -> Vec<(String, f64)> {
        self.processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter_map(|p| Some((p.name().to_owned(), crate::cpu_seconds(p.pid())?)))
            .collect()
    }

    /// The etcd client URL under the apiserver.
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// A `kubectl` command already pointed at this control plane.
    pub fn kubectl(&self) -> std::process::Command {
        let mut command = std::process::Command::new(self.binaries.path("kubectl"));
        command.arg("--kubeconfig").arg(&self.kubeconfig);
        command
    }

    /// Stops every process (newest first) and removes a temporary directory. Idempotent.
    pub fn stop(&self) {
        let mut processes = std::mem::take(
            &mut *self
                .processes
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        while let Some(mut process) = processes.pop() {
            process.stop(Duration::from_secs(10));
        }
        drop(
            self.temp
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
    }

    fn push(&self, process: ManagedProcess) {
        self.processes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(process);
    }

    async fn create_nodes(&self, client: &Client) -> Result<()> {
        let api: Api<Node> = Api::all(client.clone());
        for name in &self.nodes {
            let node: Node = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {
                        KWOK_NODE_ANNOTATION.0: KWOK_NODE_ANNOTATION.1,
                        "node.alpha.kubernetes.io/ttl": "0",
                    },
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                    },
                },
                "status": {
                    "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "250"},
                    "capacity": {"cpu": "32", "memory": "256Gi", "pods": "250"},
                },
            }))
            .map_err(|e| Error::Setup(format!("invalid node manifest: {e}")))?;
            api.create(&PostParams::default(), &node).await?;
        }
        for name in &self.nodes {
            tokio::time::timeout(
                START_TIMEOUT,
                await_condition(api.clone(), name, node_ready),
            )
            .await
            .map_err(|_| {
                Error::Setup(format!(
                    "node {name} was not Ready after {} s; see {}",
                    START_TIMEOUT.as_secs(),
                    self.dir.join("kwok.log").display()
                ))
            })?
            .map_err(|e| Error::Setup(format!("watching node {name}: {e}")))?;
        }
        Ok(())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

fn node_ready(node: Option<&Node>) -> bool {
    node.and_then(|n| n.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn client_from(kubeconfig: &Path) -> Result<Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)
        .map_err(|e| Error::Setup(format!("failed to read the harness kubeconfig: {e}")))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| Error::Setup(format!("invalid harness kubeconfig: {e}")))?;
    Ok(Client::try_from(config)?)
}

pub(crate) async fn create_default_service_account(client: &Client, namespace: &str) -> Result<()> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let sa = ServiceAccount {
        metadata: switchyard_k8s::ObjectMeta {
            name: Some("default".to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &sa).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
