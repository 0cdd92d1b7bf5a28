//! Helpers of the tests that run every service as its own process and kill some of them: a
//! service that can be started again, and a census of the Pods the controllers make.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt, stream};
use serde_json::json;
use switchyard_k8s::{
    Api, Deployment, ObjectMeta, Pod, PostParams,
    kube::{
        Client,
        api::{ListParams, Patch, PatchParams},
        runtime::watcher,
    },
};
use switchyard_testenv::{NetNs, ServiceProcess};

/// How to start one service again after it was killed.
#[derive(Debug)]
pub struct Spec {
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub envs: Vec<(String, String)>,
    /// Kept across restarts (a watcher's, which the reconcilers were given).
    pub grpc: Option<SocketAddr>,
    /// Started inside the network namespace given to [`Spec::start_in`].
    pub in_netns: bool,
}

impl Spec {
    /// A service started with `args` and no environment of its own.
    pub fn new(name: impl Into<String>, program: PathBuf, args: Vec<String>) -> Self {
        Self {
            name: name.into(),
            program,
            args,
            envs: Vec::new(),
            grpc: None,
            in_netns: false,
        }
    }

    /// Starts the service and waits until it is ready; panics with its log otherwise.
    pub async fn start(&self) -> ServiceProcess {
        self.start_in(None).await
    }

    /// [`Spec::start`], inside `netns` when the spec says so.
    pub async fn start_in(&self, netns: Option<&NetNs>) -> ServiceProcess {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let envs: Vec<(&str, &str)> = self
            .envs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let started = match netns {
            Some(netns) if self.in_netns => {
                ServiceProcess::start_in_netns(netns, &self.program, &args, &envs).await
            }
            _ => ServiceProcess::start_with_grpc(&self.program, self.grpc, &args, &envs).await,
        };
        let mut process = started.unwrap_or_else(|e| panic!("{} starts: {e}", self.name));
        process
            .wait_ready()
            .await
            .unwrap_or_else(|e| panic!("{} becomes ready: {e}\n{}", self.name, process.log()));
        process
    }
}

/// Creates `deployments`, `concurrency` at a time.
pub async fn create_all(api: &Api<Deployment>, deployments: Vec<Deployment>, concurrency: usize) {
    stream::iter(deployments)
        .for_each_concurrent(concurrency, |deployment| async move {
            api.create(&PostParams::default(), &deployment)
                .await
                .unwrap_or_else(|e| panic!("create {:?}: {e}", deployment.metadata.name));
        })
        .await;
}

/// Sets the image of the first container of each named Deployment (a rollout).
pub async fn set_image_all(
    api: &Api<Deployment>,
    names: &[String],
    image: &str,
    concurrency: usize,
) {
    let rollout = Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": image}
    ]}}}}));
    stream::iter(names)
        .for_each_concurrent(concurrency, |name| {
            let rollout = &rollout;
            async move {
                api.patch(name, &PatchParams::default(), rollout)
                    .await
                    .unwrap_or_else(|e| panic!("roll {name} out: {e}"));
            }
        })
        .await;
}

/// Waits until `expected` Deployments of `api` have rolled out to `image` at `replicas`
/// ([`rolled_out`]), checking every 500 ms; how many had when `within` ran out otherwise.
pub async fn await_rolled_out(
    api: &Api<Deployment>,
    image: &str,
    replicas: i32,
    expected: usize,
    within: Duration,
) -> Result<(), usize> {
    let deadline = Instant::now() + within;
    loop {
        let listed = api
            .list(&ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("list Deployments: {e}"));
        let done = listed
            .items
            .iter()
            .filter(|d| rolled_out(d, image, replicas))
            .count();
        if done == expected {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(done);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// True once `deployment` runs `replicas` available Pods of `image`, all updated, and its
/// status is of its latest generation.
pub fn rolled_out(deployment: &Deployment, image: &str, replicas: i32) -> bool {
    let current = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.as_deref());
    let Some(status) = &deployment.status else {
        return false;
    };
    current == Some(image)
        && status.observed_generation >= deployment.metadata.generation
        && status.updated_replicas == Some(replicas)
        && status.available_replicas == Some(replicas)
        && status.replicas == Some(replicas)
}

/// The name of the controller owner reference in `meta`, if it has one.
pub fn controller_name(meta: &ObjectMeta) -> Option<String> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.name.clone())
}

/// Not being deleted, and not Succeeded or Failed: a Pod its ReplicaSet counts.
pub fn is_active(pod: &Pod) -> bool {
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    pod.metadata.deletion_timestamp.is_none() && !finished
}

/// What a watch on a namespace's Pods saw: every Pod created, and the most active Pods any
/// one ReplicaSet had at once (counted at every event).
#[derive(Debug, Default)]
pub struct PodCensus {
    /// Pod uid -> its controller ReplicaSet's name, while active (not terminating).
    active: HashMap<String, String>,
    created: HashSet<String>,
    /// The largest count of active Pods of one ReplicaSet, and which.
    pub worst: (usize, String),
    /// The largest count of active Pods of one Deployment's ReplicaSets together (their
    /// names less the pod-template-hash suffix), and which.
    pub worst_deployment: (usize, String),
}

impl PodCensus {
    /// Pods created since the watch started (each uid once).
    pub fn created(&self) -> usize {
        self.created.len()
    }

    fn saw(&mut self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.created.insert(uid.clone());
        match controller_name(&pod.metadata) {
            Some(owner) if is_active(pod) => {
                self.active.insert(uid, owner.clone());
                let count = self.active.values().filter(|o| **o == owner).count();
                let deployment = owner.rsplit_once('-').map_or(owner.as_str(), |(d, _)| d);
                let together = self
                    .active
                    .values()
                    .filter(|o| o.rsplit_once('-').is_some_and(|(d, _)| d == deployment))
                    .count();
                if together > self.worst_deployment.0 {
                    self.worst_deployment = (together, deployment.to_owned());
                }
                if count > self.worst.0 {
                    self.worst = (count, owner);
                }
            }
            _ => {
                self.active.remove(&uid);
            }
        }
    }

    fn gone(&mut self, pod: &Pod) {
        self.active
            .remove(&pod.metadata.uid.clone().unwrap_or_default());
    }

    /// Watches the Pods of `namespace` in the background for as long as the test runs.
    pub fn watch(client: Client, namespace: &str) -> Arc<Mutex<Self>> {
        let census = Arc::new(Mutex::new(Self::default()));
        let pods: Api<Pod> = Api::namespaced(client, namespace);
        let seen = census.clone();
        tokio::spawn(async move {
            let mut events = watcher(pods, watcher::Config::default()).boxed();
            while let Ok(Some(event)) = events.try_next().await {
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                match event {
                    watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => seen.saw(&pod),
                    watcher::Event::Delete(pod) => seen.gone(&pod),
                    watcher::Event::Init | watcher::Event::InitDone => {}
                }
            }
        });
        census
    }
}
