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

use crate::{
    Binaries, Error, Etcd, Result, kubeconfig,
    pki::Pki,
    ports::free_port,
    process::{ManagedProcess, register_at_exit, start_on_free_ports, wait_healthy},
};

/// How long each component gets to become healthy. Generous: on 2 busy cores a cold
/// kube-apiserver takes 10-20 s to serve /readyz.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(120);
/// The annotation kwok selects the Nodes it plays the kubelet for.
const KWOK_NODE_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");
/// Service and pod address ranges; both fake, never dialed.
const SERVICE_CIDR: &str = "10.0.0.0/24";
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

/// A second kube-apiserver on the control plane's etcd; stopped on drop.
#[derive(Debug)]
pub struct ApiServer {
    process: ManagedProcess,
    server: String,
    kubeconfig: PathBuf,
}

impl ApiServer {
    /// Its URL, `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// An admin client of this apiserver (bound to the runtime it is created on).
    pub async fn client(&self) -> Result<Client> {
        client_from(&self.kubeconfig).await
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.process.stop(Duration::from_secs(10));
    }
}

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

    /// Stops kube-apiserver (SIGTERM, then SIGKILL after 10 s); everything else keeps
    /// running. [`Self::restart_apiserver`] brings it back on the same address.
    pub fn stop_apiserver(&self) {
        let process = {
            let mut processes = self
                .processes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let index = processes.iter().position(|p| p.name() == APISERVER);
            index.map(|i| processes.remove(i))
        };
        if let Some(mut process) = process {
            process.stop(Duration::from_secs(10));
        }
    }

    /// Starts kube-apiserver again on the address it had, and waits until it is ready.
    pub async fn restart_apiserver(&self) -> Result<()> {
        let port = self
            .server
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .ok_or_else(|| Error::Setup(format!("no port in {}", self.server)))?;
        let (process, _) = start_apiserver(
            &self.binaries,
            &self.dir,
            &self.pki,
            &self.etcd_url,
            APISERVER,
            Some(port),
        )
        .await?;
        self.push(process);
        Ok(())
    }

    /// Starts a second kube-apiserver on the same etcd (writes through it reach the first
    /// one's watchers, through etcd).
    pub async fn start_second_apiserver(&self) -> Result<ApiServer> {
        let name = "kube-apiserver-2";
        let (process, server) = start_apiserver(
            &self.binaries,
            &self.dir,
            &self.pki,
            &self.etcd_url,
            name,
            None,
        )
        .await?;
        let kubeconfig = self.dir.join(format!("{name}.kubeconfig"));
        kubeconfig::write(&kubeconfig, &server, &self.pki)?;
        Ok(ApiServer {
            process,
            server,
            kubeconfig,
        })
    }

    /// Compacts etcd's history up to its current revision, so that a watch resuming from
    /// an older resourceVersion gets 410 Gone. Returns the revision.
    pub fn compact_etcd(&self) -> Result<u64> {
        let etcdctl = |args: &[&str]| -> Result<Vec<u8>> {
            let output = std::process::Command::new(self.binaries.path("etcdctl"))
                .arg(format!("--endpoints={}", self.etcd_url))
                .args(args)
                .output()?;
            if !output.status.success() {
                return Err(Error::Setup(format!(
                    "etcdctl {args:?} failed: {}",
                    String::from_utf8_lossy(&output.stderr)
                )));
            }
            Ok(output.stdout)
        };
        let status: serde_json::Value =
            serde_json::from_slice(&etcdctl(&["endpoint", "status", "--write-out=json"])?)
                .map_err(|e| Error::Setup(format!("unreadable etcdctl status: {e}")))?;
        let revision = status[0]["Status"]["header"]["revision"]
            .as_u64()
            .ok_or_else(|| Error::Setup(format!("no revision in etcdctl status: {status}")))?;
        etcdctl(&["compaction", &revision.to_string()])?;
        Ok(revision)
    }

    /// A `kubectl` command already pointed at this control plane.
    pub fn kubectl(&self) -> std::process::Command {
        let mut command = std::process::Command::new(self.binaries.path("kubectl"));
        command.arg("--kubeconfig").arg(&self.kubeconfig);
        command
    }

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

/// The name (and log file) of the control plane's kube-apiserver.
const APISERVER: &str = "kube-apiserver";

/// Starts a kube-apiserver named `name` on `port` (a free one when `None`).
async fn start_apiserver(
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
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
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
const SCHEDULER_CLIENT_QPS: u32 = 1000;

async fn start_scheduler(plane: &ControlPlane) -> Result<ManagedProcess> {
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

async fn start_kwok(plane: &ControlPlane) -> Result<ManagedProcess> {
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
fn insecure_http() -> Result<reqwest::Client> {
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
