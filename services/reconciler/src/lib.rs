//! Switchyard reconciler: stateless workers that lease keys from the queue, reconcile them
//! with the controllers registered by name, and report each outcome.
//!
//! ```text
//!  queue ─ Work stream ─► worker ([`worker`]) ─► Controller::reconcile ([`sdk`])
//!                                                   ├─ reads:  watcher Cache API ([`cache`])
//!                                                   └─ writes: apiserver, behind a QPS/burst limit ([`ratelimit`])
//! ```
//!
//! Built-in controllers: ReplicaSet ([`replicaset`]) and Deployment ([`deployment`]).

pub mod cache;
pub mod deployment;
pub mod finalizer;
pub mod metrics;
pub mod ratelimit;
pub mod replicaset;
pub mod sdk;
pub mod worker;

use std::{collections::BTreeMap, time::Duration};

use switchyard_k8s::kube;
use switchyard_runtime::{
    GrpcServer, KubeArgs, Runtime, RuntimeArgs,
    apiserver::{ApiserverLayer, ApiserverMetrics},
    await_apiserver,
};
use tracing::info;

use crate::{
    cache::{CacheClient, CacheError},
    ratelimit::RateLimitLayer,
    sdk::{Context, Registry},
    worker::{Settings, Worker},
};

/// Where the worker finds the queue.
#[derive(Debug)]
enum Route {
    Queue(String),
    Elector(String),
}

pub const SERVICE: &str = "switchyard-reconciler";
/// Reconciles at once: the credits one Work message may grant (the queue's limit).
const MAX_CONCURRENCY: u32 = switchyard_queue_client::MAX_CREDIT;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Runtime(#[from] switchyard_runtime::Error),
    #[error(transparent)]
    Kube(#[from] switchyard_runtime::KubeError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("invalid flags: {0}")]
    Args(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, clap::Parser)]
#[command(name = SERVICE, version, about)]
pub struct Args {
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub reconciler: ReconcilerArgs,
}

#[derive(Clone, Debug, clap::Args)]
pub struct ReconcilerArgs {
    /// gRPC address (host:port) of the one queue replica to lease keys from, when no elector
    /// assigns shards
    #[arg(long, env = "SWITCHYARD_QUEUE_ADDR", conflicts_with = "elector_addr")]
    pub queue_addr: Option<String>,
    /// gRPC address (host:port) of an elector: lease keys from every queue replica of its
    /// shard map, following it as replicas come and go
    #[arg(long, env = "SWITCHYARD_ELECTOR_ADDR")]
    pub elector_addr: Option<String>,
    /// Number of virtual shards; must match the elector's and the queue's --shard-count
    #[arg(long, env = "SWITCHYARD_SHARD_COUNT", default_value_t = 256)]
    pub shard_count: u32,
    /// gRPC address (host:port) of the watcher whose Cache API the controllers read
    #[arg(long, env = "SWITCHYARD_WATCHER_ADDR")]
    pub watcher_addr: String,
    /// The controllers this worker runs (names the keys carry); all built-in ones by default
    #[arg(long, env = "SWITCHYARD_CONTROLLERS", value_delimiter = ',')]
    pub controllers: Vec<String>,
    /// Reconciles run at once (credits granted to the queue), 1 to 10000
    #[arg(long, env = "SWITCHYARD_CONCURRENCY", default_value_t = 10)]
    pub concurrency: u32,
    /// A reconcile that takes longer is abandoned and reported failed (retried with backoff)
    #[arg(long, env = "SWITCHYARD_RECONCILE_TIMEOUT", default_value = "60s")]
    pub reconcile_timeout: humantime::Duration,
    /// Apiserver requests per second, for each controller (each has a client of its own)
    #[arg(long, env = "SWITCHYARD_KUBE_API_QPS", default_value_t = 50.0)]
    pub kube_api_qps: f64,
    /// Apiserver requests allowed at once above the QPS, for each controller
    #[arg(long, env = "SWITCHYARD_KUBE_API_BURST", default_value_t = 100)]
    pub kube_api_burst: u32,
    /// This worker's identity in the queue's logs; default: the host name and process id
    #[arg(long, env = "SWITCHYARD_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Added to every reconcile, as if each called a slow external system (for benchmarks)
    #[arg(long, env = "SWITCHYARD_SIMULATED_LATENCY", default_value = "0s")]
    pub simulated_latency: humantime::Duration,
}

/// The controllers built into the reconciler.
pub fn builtin_controllers() -> Registry {
    let mut registry = Registry::default();
    registry.register(replicaset::ReplicaSetController);
    registry.register(deployment::DeploymentController);
    registry
}

impl Args {
    pub async fn run(self) -> Result<()> {
        let rt = self.start(builtin_controllers()).await?;
        rt.run().await?;
        Ok(())
    }

    /// Starts the service with `registry`'s controllers and returns its runtime (not yet
    /// running). A user's own reconciler binary registers its controllers and calls this.
    pub async fn start(self, mut registry: Registry) -> Result<Runtime> {
        let Self {
            runtime,
            kube: kube_args,
            reconciler,
        } = self;
        let ReconcilerArgs {
            queue_addr,
            elector_addr,
            shard_count,
            watcher_addr,
            controllers,
            concurrency,
            reconcile_timeout,
            kube_api_qps,
            kube_api_burst,
            worker_id,
            simulated_latency,
        } = reconciler;
        let route = match (queue_addr, elector_addr) {
            (Some(queue), _) => Route::Queue(queue),
            (None, Some(elector)) => Route::Elector(elector),
            (None, None) => {
                return Err(Error::Args(
                    "set --queue-addr (one queue serves every shard) or --elector-addr".into(),
                ));
            }
        };
        if shard_count == 0 {
            return Err(Error::Args("--shard-count: must be at least 1".into()));
        }
        if !(1..=MAX_CONCURRENCY).contains(&concurrency) {
            return Err(Error::Args(format!(
                "--concurrency: {concurrency} is out of range 1 to {MAX_CONCURRENCY}"
            )));
        }
        if !(kube_api_qps.is_finite() && kube_api_qps > 0.0) || kube_api_burst == 0 {
            return Err(Error::Args(
                "--kube-api-qps must be positive and --kube-api-burst at least 1".into(),
            ));
        }
        if !controllers.is_empty() {
            registry.retain(&controllers).map_err(|unknown| {
                Error::Args(format!(
                    "--controllers: unknown controller {unknown:?} (known: {})",
                    registry.names().join(", ")
                ))
            })?;
        }
        if registry.names().is_empty() {
            return Err(Error::Args("no controllers to run".into()));
        }
        let simulated_latency: Duration = simulated_latency.into();
        if !simulated_latency.is_zero() {
            registry.add_latency(simulated_latency);
        }
        let drain_timeout: Duration = runtime.drain_timeout.into();
        let worker_id = worker_id.unwrap_or_else(|| {
            let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "reconciler".into());
            format!("{host}-{}", std::process::id())
        });

        let rt = Runtime::start(SERVICE, runtime).await?;
        let config = kube_args.config().await?;
        // Outermost: the client's buffer task calls it in the span of the reconcile that made
        // the request; latency starts once the rate limit has let the request through.
        let apiserver = ApiserverLayer::new(ApiserverMetrics::register(rt.metrics()), true);
        // Each controller gets a client, and so a QPS/burst limit, of its own, as each of
        // kube-controller-manager's controllers does: one busy controller does not hold
        // back the others.
        let limited_client = || -> Result<kube::Client> {
            Ok(kube::client::ClientBuilder::try_from(config.clone())
                .map_err(switchyard_runtime::KubeError::from)?
                .with_layer(&RateLimitLayer::new(kube_api_qps, kube_api_burst))
                .with_layer(&apiserver)
                .build())
        };
        let client = limited_client()?;
        let gate = rt.readiness().gate("apiserver");
        rt.spawn("apiserver-check", {
            let client = client.clone();
            move |drain| await_apiserver(client, gate, drain)
        });
        let cache = CacheClient::new(&watcher_addr)?;
        let ctx = Context::new(client, cache.clone(), &worker_id);
        let mut contexts = BTreeMap::new();
        for name in registry.names() {
            contexts.insert(
                name,
                Context::new(limited_client()?, cache.clone(), &worker_id),
            );
        }
        let settings = Settings {
            worker_id,
            concurrency,
            reconcile_timeout: reconcile_timeout.into(),
            drain_timeout,
        };
        info!(
            controllers = ?registry.names(),
            ?route,
            watcher = %watcher_addr,
            concurrency,
            "configured"
        );
        let worker = Worker::new(
            registry,
            ctx,
            settings,
            rt.readiness().gate("queue"),
            metrics::ReconcilerMetrics::register(rt.metrics()),
        )
        .per_controller(contexts);
        match route {
            Route::Queue(queue) => {
                rt.spawn("worker", move |drain| worker.serve(queue.into(), drain));
            }
            Route::Elector(elector) => {
                let (view, follow) =
                    switchyard_directory::follow_elector(elector, shard_count, rt.drain());
                rt.spawn("shard-map", |_| follow);
                rt.spawn("worker", move |drain| worker.follow(view, drain));
            }
        }
        rt.serve_grpc(GrpcServer::new()).await?;
        Ok(rt)
    }
}
