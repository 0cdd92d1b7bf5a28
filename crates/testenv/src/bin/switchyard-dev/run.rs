//! `switchyard-dev run` (`make run`): Switchyard against a cluster, with a sample workload.
//!
//! ```text
//!  cluster: KUBECONFIG, or a local control plane (etcd, apiserver, scheduler, kwok)
//!  etcd for the elector
//!  --crd: CustomResourceDefinitions installed first
//!  elector ─► queue × 2 (members) ─► watcher ─► reconciler × 2 [─► --reconciler: your own]
//!  apply deploy/samples/workload.yaml ─► follow its Deployments until all are Available
//!  Ctrl-C (or --exit-when-ready once Available) ─► stop every service, then the rest
//! ```

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::Context;
use switchyard_k8s::{
    Api, Client, Deployment, Namespace,
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    kube::{
        api::{ListParams, Patch, PatchParams},
        runtime::wait::{await_condition, conditions},
    },
};
use switchyard_testenv::{ControlPlane, ControlPlaneOptions, Etcd, ServiceProcess};
use tokio::signal::unix::{Signal, SignalKind, signal};

/// The built-in controllers' watches: the configuration the kustomize base installs.
const WATCHER_CONFIG: &str =
    include_str!("../../../../../deploy/kustomize/base/watcher-config.yaml");
/// The sample workload: a Namespace and a few Deployments.
const WORKLOAD: &str = include_str!("../../../../../deploy/samples/workload.yaml");
const WORKLOAD_NAMESPACE: &str = "switchyard-demo";
/// How long `--exit-when-ready` waits for the workload.
const WORKLOAD_TIMEOUT: Duration = Duration::from_secs(180);
const FIELD_MANAGER: &str = "switchyard-dev";
/// How long an installed CustomResourceDefinition may take to be established.
const CRD_TIMEOUT: Duration = Duration::from_secs(30);

/// In start order, with how many replicas: the watcher follows the elector's shard map and
/// sends to the queues; the reconcilers lease from the queues and read the watcher.
const SERVICES: [(&str, usize); 4] = [
    ("switchyard-elector", 1),
    ("switchyard-queue", 2),
    ("switchyard-watcher", 1),
    ("switchyard-reconciler", 2),
];

/// Where the services run against.
enum Cluster {
    Local(Box<ControlPlane>),
    /// `KUBECONFIG`'s cluster: the person's own.
    External(PathBuf),
}

impl Cluster {
    async fn start() -> anyhow::Result<Self> {
        if let Some(path) = std::env::var_os("KUBECONFIG").filter(|p| !p.is_empty()) {
            let path = std::env::split_paths(&path)
                .next()
                .context("KUBECONFIG names no file")?;
            anyhow::ensure!(
                path.exists(),
                "KUBECONFIG names {}, which does not exist",
                path.display()
            );
            println!("cluster: KUBECONFIG={}", path.display());
            return Ok(Self::External(path));
        }
        let plane = ControlPlane::start(ControlPlaneOptions::default())
            .await
            .context("starting the control plane")?;
        println!("control plane ready: {}", plane.server());
        println!("kubeconfig: {}", plane.kubeconfig().display());
        Ok(Self::Local(Box::new(plane)))
    }

    fn kubeconfig(&self) -> &Path {
        match self {
            Self::Local(plane) => plane.kubeconfig(),
            Self::External(path) => path,
        }
    }

    async fn client(&self) -> anyhow::Result<Client> {
        Ok(match self {
            Self::Local(plane) => plane.client().await?,
            Self::External(_) => Client::try_default().await?,
        })
    }

    /// A directory for the files the services read.
    fn scratch(&self) -> anyhow::Result<PathBuf> {
        Ok(match self {
            Self::Local(plane) => plane.dir().to_owned(),
            Self::External(_) => tempfile::Builder::new()
                .prefix("switchyard-run-")
                .tempdir()?
                .keep(),
        })
    }

    fn stop(self) {
        if let Self::Local(plane) = self {
            plane.stop();
        }
    }
}

struct Signals {
    sigterm: Signal,
    sigint: Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            sigterm: signal(SignalKind::terminate())?,
            sigint: signal(SignalKind::interrupt())?,
        })
    }

    async fn received(&mut self) {
        tokio::select! {
            _ = self.sigterm.recv() => {}
            _ = self.sigint.recv() => {}
        }
    }
}

/// A user's own reconciler binary, run beside the built-in ones.
pub struct Own {
    pub binary: PathBuf,
    /// Controllers it runs that the queues know from the start (optional: a queue learns a
    /// name when it is first used).
    pub controllers: Vec<String>,
    /// Kinds (apiVersion/Kind) it may register in full besides the CRDs' own.
    pub grants: Vec<String>,
}

/// The built-in controllers: what the queues serve by default.
fn builtin_controllers() -> Vec<String> {
    switchyard_work::builtin::ALL
        .iter()
        .map(|name| (*name).to_owned())
        .collect()
}

/// Installs the CustomResourceDefinitions in `paths` and waits until each is established;
/// the kinds they serve, as (apiVersion, Kind).
async fn install_crds(client: &Client, paths: &[PathBuf]) -> anyhow::Result<Vec<(String, String)>> {
    let mut kinds = Vec::new();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for path in paths {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--crd: reading {}", path.display()))?;
        let crd: CustomResourceDefinition = serde_norway::from_str(&text).with_context(|| {
            format!(
                "--crd: {} is not a CustomResourceDefinition",
                path.display()
            )
        })?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        for version in crd.spec.versions.iter().filter(|v| v.served) {
            kinds.push((
                format!("{}/{}", crd.spec.group, version.name),
                crd.spec.names.kind.clone(),
            ));
        }
        crds.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .with_context(|| format!("installing CustomResourceDefinition {name}"))?;
        let established = await_condition(crds.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(CRD_TIMEOUT, established)
            .await
            .with_context(|| {
                format!("CustomResourceDefinition {name} not established in {CRD_TIMEOUT:?}")
            })??;
        println!("installed CustomResourceDefinition {name}");
    }
    Ok(kinds)
}

/// The built-in watcher configuration, its grant to the reconciler's identity widened by
/// `kinds` (apiVersion, Kind) in full: what a reconciler of one's own registers.
fn watcher_config(kinds: &[(String, String)]) -> anyhow::Result<String> {
    if kinds.is_empty() {
        return Ok(WATCHER_CONFIG.to_owned());
    }
    let mut config: serde_json::Value = serde_norway::from_str(WATCHER_CONFIG)?;
    let grant = config["registrations"]
        .as_array_mut()
        .and_then(|grants| {
            grants
                .iter_mut()
                .find(|g| g["serviceAccount"] == "switchyard-reconciler")
        })
        .and_then(|grant| grant["kinds"].as_array_mut())
        .context("the built-in watcher configuration grants switchyard-reconciler no kinds")?;
    for (api_version, kind) in kinds {
        let listed = grant
            .iter()
            .any(|g| g["apiVersion"] == api_version.as_str() && g["kind"] == kind.as_str());
        if !listed {
            grant.push(
                serde_json::json!({"apiVersion": api_version, "kind": kind, "objects": "full"}),
            );
        }
    }
    Ok(serde_norway::to_string(&config)?)
}

/// `--grant` values (apiVersion/Kind, the apiVersion with or without a group) as
/// (apiVersion, Kind).
fn parse_grants(grants: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    grants
        .iter()
        .map(|grant| {
            let (api_version, kind) = grant
                .rsplit_once('/')
                .filter(|(v, k)| !v.is_empty() && !k.is_empty())
                .with_context(|| {
                    format!("--grant {grant:?}: expected apiVersion/Kind, for example v1/ConfigMap")
                })?;
            Ok((api_version.to_owned(), kind.to_owned()))
        })
        .collect()
}

pub async fn run(
    services_dir: Option<PathBuf>,
    exit_when_ready: bool,
    own: Option<Own>,
    crds: &[PathBuf],
) -> anyhow::Result<()> {
    let services_dir = match services_dir {
        Some(dir) => dir,
        None => std::env::current_exe()?
            .parent()
            .context("the binary has no directory")?
            .to_owned(),
    };
    let mut signals = Signals::new()?;
    let cluster = Cluster::start().await?;
    // The elector's own etcd, apart from the apiserver's, as in a real installation.
    let etcd = Etcd::start()
        .await
        .context("starting etcd for the elector")?;
    println!("elector etcd: {}", etcd.endpoint());
    let pki = switchyard_testenv::Pki::shared();
    println!(
        "certificates: {} (the observer's, for grpcurl: {}/switchyard-observer/tls.{{crt,key}})",
        pki.dir().display(),
        pki.dir().display()
    );

    let mut running = Vec::new();
    let started = async {
        let mut grants = install_crds(&cluster.client().await?, crds).await?;
        if let Some(own) = &own {
            grants.extend(parse_grants(&own.grants)?);
        }
        start_services(
            &services_dir,
            &cluster,
            &etcd,
            own.as_ref(),
            &watcher_config(&grants)?,
            &mut running,
        )
        .await?;
        publish(&cluster, &running).await
    }
    .await;
    let outcome = match started {
        Ok(()) => follow_workload(&cluster, &mut signals, exit_when_ready).await,
        Err(error) => Err(error),
    };
    // Ctrl-C while the workload was still coming up stops the run as well.
    if matches!(outcome, Ok(Followed::Available)) && !exit_when_ready {
        println!("everything is running; Ctrl-C stops it");
        signals.received().await;
    }
    let mut clean = true;
    while let Some((service, process)) = running.pop() {
        let (status, log) = process.terminate().await?;
        println!("{service:<26} stopped ({status})");
        if !status.success() {
            clean = false;
            eprintln!("{log}");
        }
    }
    drop(etcd);
    cluster.stop();
    outcome?;
    anyhow::ensure!(clean, "a service did not stop cleanly");
    Ok(())
}

async fn start_services(
    services_dir: &Path,
    cluster: &Cluster,
    etcd: &Etcd,
    own: Option<&Own>,
    config: &str,
    running: &mut Vec<(String, ServiceProcess)>,
) -> anyhow::Result<()> {
    let kubeconfig = cluster.kubeconfig().display().to_string();
    let mut served = builtin_controllers();
    if let Some(own) = own {
        served.extend(own.controllers.iter().cloned());
    }
    let served = served.join(",");
    let own_service = own.map(|own| (own.binary.display().to_string(), 1));
    let own_name = own
        .and_then(|own| own.binary.file_name())
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_owned();
    let services = SERVICES
        .iter()
        .cloned()
        .chain(own_service.iter().map(|(b, n)| (b.as_str(), *n)));
    let watcher_config = cluster.scratch()?.join("watcher.yaml");
    std::fs::write(&watcher_config, config)?;
    let watcher_config = watcher_config.display().to_string();
    let mut elector_addr = String::new();
    let mut watcher_addr = String::new();
    for (service, replicas) in services {
        // A user's binary is named by its path; the services are found in services_dir.
        let program = services_dir.join(service);
        anyhow::ensure!(
            program.exists(),
            "{} is missing; build it with `cargo build --bins`",
            program.display()
        );
        let service = program
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(service)
            .to_owned();
        let service = service.as_str();
        for replica in 0..replicas {
            let name = if replicas == 1 {
                service.to_owned()
            } else {
                format!("{service}-{replica}")
            };
            let mut env = vec![
                ("KUBECONFIG", kubeconfig.as_str()),
                ("SWITCHYARD_ETCD_ENDPOINTS", etcd.endpoint()),
                ("SWITCHYARD_WATCHER_CONFIG", watcher_config.as_str()),
                ("SWITCHYARD_ELECTOR_ADDR", elector_addr.as_str()),
                ("SWITCHYARD_WATCHER_ADDR", watcher_addr.as_str()),
                // The queue's member id and the reconciler's worker id.
                ("HOSTNAME", name.as_str()),
            ];
            if service == "switchyard-queue" {
                env.push(("SWITCHYARD_CONTROLLERS", served.as_str()));
            }
            // A user's reconciler is a reconciler: it gets that identity's certificate (the
            // services get theirs by their binary's name).
            let own_tls: Vec<String> = if own_service.is_some() && service == own_name {
                switchyard_testenv::Pki::shared().flags(switchyard_runtime::Role::Reconciler)
            } else {
                Vec::new()
            };
            let args: Vec<&str> = own_tls.iter().map(String::as_str).collect();
            let mut process = ServiceProcess::start(&program, &args, &env)
                .await
                .with_context(|| format!("starting {name}"))?;
            process
                .wait_ready()
                .await
                .with_context(|| format!("{name} did not become ready:\n{}", process.log()))?;
            println!(
                "{name:<26} ready   admin http://{}  grpc {}",
                process.admin_addr(),
                process.grpc_addr()
            );
            match service {
                "switchyard-elector" => elector_addr = process.grpc_addr().to_string(),
                "switchyard-watcher" => watcher_addr = process.grpc_addr().to_string(),
                _ => {}
            }
            running.push((name, process));
        }
    }
    Ok(())
}

/// The namespace the services are published in, as an installation's.
const NAMESPACE: &str = "switchyard";

/// On the local control plane, makes the services findable as an installation's are
/// (ExternalName Services, the observer's and operator's Secrets), so that
/// `kubectl switchyard` needs only the kubeconfig. Never on `KUBECONFIG`'s cluster, whose
/// `switchyard` namespace may hold a real installation.
async fn publish(cluster: &Cluster, running: &[(String, ServiceProcess)]) -> anyhow::Result<()> {
    let Cluster::Local(plane) = cluster else {
        return Ok(());
    };
    let client = plane.client().await?;
    let processes: Vec<(&str, &ServiceProcess)> = running
        .iter()
        .map(|(name, process)| (service_of(name), process))
        .collect();
    switchyard_testenv::publish::publish_services(&client, NAMESPACE, &processes)
        .await
        .context("publishing the services")?;
    switchyard_testenv::publish::publish_identities(
        &client,
        NAMESPACE,
        switchyard_testenv::Pki::shared(),
    )
    .await
    .context("publishing the observer's and operator's identities")?;
    println!(
        "published in namespace {NAMESPACE}: kubectl switchyard status --kubeconfig {}",
        plane.kubeconfig().display()
    );
    Ok(())
}

/// The service a process name is of: `switchyard-queue-1` → `switchyard-queue`.
fn service_of(name: &str) -> &str {
    match name.rsplit_once('-') {
        Some((service, replica)) if replica.bytes().all(|b| b.is_ascii_digit()) => service,
        _ => name,
    }
}

/// How following the workload ended.
enum Followed {
    Available,
    /// A signal came first: the run stops, without an error.
    Signaled,
}

/// Applies the sample workload and prints its progress until every Deployment is Available
/// or a signal comes.
async fn follow_workload(
    cluster: &Cluster,
    signals: &mut Signals,
    exit_when_ready: bool,
) -> anyhow::Result<Followed> {
    let client = cluster.client().await?;
    let deployments = apply_workload(&client).await?;
    println!(
        "applied the sample workload: {} Deployments in namespace {WORKLOAD_NAMESPACE}",
        deployments.len()
    );
    let api: Api<Deployment> = Api::namespaced(client, WORKLOAD_NAMESPACE);
    let start = Instant::now();
    let mut last = String::new();
    loop {
        let listed = api
            .list(&ListParams::default())
            .await
            .context("listing the sample Deployments")?;
        let progress: BTreeMap<String, Progress> = listed
            .items
            .iter()
            .filter(|d| deployments.contains(&d.metadata.name.clone().unwrap_or_default()))
            .map(|d| (d.metadata.name.clone().unwrap_or_default(), Progress::of(d)))
            .collect();
        let line = progress
            .iter()
            .map(|(name, p)| format!("{name} {p}"))
            .collect::<Vec<_>>()
            .join("  |  ");
        if line != last {
            println!("[{:>6.1}s] {line}", start.elapsed().as_secs_f64());
            last = line;
        }
        if progress.len() == deployments.len() && progress.values().all(|p| p.available) {
            println!(
                "the sample workload is Available after {:.1}s",
                start.elapsed().as_secs_f64()
            );
            return Ok(Followed::Available);
        }
        anyhow::ensure!(
            !exit_when_ready || start.elapsed() < WORKLOAD_TIMEOUT,
            "the sample workload was not Available within {WORKLOAD_TIMEOUT:?}: {last}"
        );
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = signals.received() => {
                println!("stopping before the workload is Available");
                return Ok(Followed::Signaled);
            }
        }
    }
}

/// Applies `deploy/samples/workload.yaml` server-side; returns the Deployments' names.
async fn apply_workload(client: &Client) -> anyhow::Result<Vec<String>> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut names = Vec::new();
    for document in WORKLOAD.split("\n---\n") {
        let value: serde_json::Value =
            serde_norway::from_str(document).context("parsing the sample workload")?;
        match value["kind"].as_str() {
            Some("Namespace") => {
                let namespace: Namespace = serde_json::from_value(value)?;
                let name = namespace.metadata.name.clone().unwrap_or_default();
                Api::<Namespace>::all(client.clone())
                    .patch(&name, &params, &Patch::Apply(&namespace))
                    .await
                    .with_context(|| format!("applying Namespace {name}"))?;
            }
            Some("Deployment") => {
                let deployment: Deployment = serde_json::from_value(value)?;
                let name = deployment.metadata.name.clone().unwrap_or_default();
                Api::<Deployment>::namespaced(client.clone(), WORKLOAD_NAMESPACE)
                    .patch(&name, &params, &Patch::Apply(&deployment))
                    .await
                    .with_context(|| format!("applying Deployment {name}"))?;
                names.push(name);
            }
            other => anyhow::bail!("the sample workload has an unexpected kind {other:?}"),
        }
    }
    Ok(names)
}

/// What `kubectl rollout status` looks at, in one line per Deployment.
struct Progress {
    replicas: i32,
    ready: i32,
    updated: i32,
    available: bool,
}

impl Progress {
    fn of(deployment: &Deployment) -> Self {
        let wanted = deployment
            .spec
            .as_ref()
            .and_then(|s| s.replicas)
            .unwrap_or(1);
        let status = deployment.status.clone().unwrap_or_default();
        let observed = status.observed_generation >= deployment.metadata.generation;
        let condition = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Available" && c.status == "True");
        let updated = status.updated_replicas.unwrap_or(0);
        let available_replicas = status.available_replicas.unwrap_or(0);
        Self {
            replicas: wanted,
            ready: status.ready_replicas.unwrap_or(0),
            updated,
            available: observed
                && condition
                && updated == wanted
                && available_replicas == wanted
                && status.replicas.unwrap_or(0) == wanted,
        }
    }
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{} ready, {} updated{}",
            self.ready,
            self.replicas,
            self.updated,
            if self.available { ", Available" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_process_name_gives_its_service() {
        assert_eq!(super::service_of("switchyard-queue-1"), "switchyard-queue");
        assert_eq!(
            super::service_of("switchyard-elector"),
            "switchyard-elector"
        );
        assert_eq!(
            super::service_of("switchyard-example-greeting"),
            "switchyard-example-greeting"
        );
    }
}
