//! Switchyard reconciler: stateless workers that lease keys from the queue, reconcile them
//! with the controllers registered by name, and report each outcome.
//!
//! ```text
//!  queue ─ Work stream ─► worker ([`worker`]) ─► Controller::reconcile ([`sdk`])
//!                                                   ├─ reads:  watcher Cache API ([`cache`])
//!                                                   └─ writes: apiserver, behind a QPS/burst limit ([`ratelimit`])
//! ```
//!
//! Built-in controllers: ReplicaSet ([`replicaset`]), Deployment ([`deployment`]), the garbage
//! collector ([`gc`]), Namespace ([`namespace`]) and the service account controller
//! ([`serviceaccount`]).

pub mod builtin;
pub mod cache;
pub mod claim;
pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
pub mod endpointslice;
pub mod finalizer;
pub mod gc;
pub mod job;
pub mod metrics;
pub mod mirroring;
pub mod namespace;
pub mod podgc;
pub mod ratelimit;
pub mod registration;
pub mod replicaset;
pub mod replicationcontroller;
pub mod sdk;
pub mod serviceaccount;
pub mod statefulset;
pub mod ttlafterfinished;
pub mod worker;

use std::{collections::BTreeMap, sync::Arc, time::Duration};
pub use switchyard_shards::Route;

use switchyard_k8s::{KubeArgs, await_apiserver, kube};
use switchyard_queue_client::{Enqueuer, NoMetrics};
use switchyard_runtime::{
    GrpcServer, InstanceScope, Runtime, RuntimeArgs,
    apiserver::{ApiserverLayer, ApiserverMetrics},
    instance_id,
};
use tracing::info;

pub use crate::builtin::{Builtin, Permission, RECORD_EVENTS, Tuning};
use crate::{
    cache::{CacheClient, CacheError},
    ratelimit::RateLimitLayer,
    registration::{Registration, RegistrationError},
    sdk::{Context, Events, Registry},
    worker::{Settings, Worker},
};

pub const SERVICE: &str = "switchyard-reconciler";
/// Reconciles at once: the credits one Work message may grant (the queue's limit).
const MAX_CONCURRENCY: u32 = switchyard_queue_client::MAX_CREDIT;
/// The longest batch period the watcher accepts for a rule.
const MAX_BATCH_PERIOD: std::time::Duration = std::time::Duration::from_secs(60);
/// Keys that mapping functions returned and no queue has taken yet, at most: a reconcile
/// that maps more waits for room. Far more than a burst of mappings returns; the watcher
/// holds a million, for every kind it watches.
const MAX_MAPPED_KEYS: usize = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Runtime(#[from] switchyard_runtime::Error),
    #[error(transparent)]
    Kube(#[from] switchyard_k8s::KubeError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error(transparent)]
    Registration(#[from] RegistrationError),
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
    /// Make each built-in controller's apiserver requests as its own service account in
    /// this namespace (impersonated: `switchyard-deployment-controller`, ...), as
    /// kube-controller-manager's --use-service-account-credentials does; unset, every request
    /// is the reconciler's own. Controllers of the SDK always use the reconciler's identity
    #[arg(long, env = "SWITCHYARD_CONTROLLER_SERVICE_ACCOUNTS")]
    pub controller_service_accounts: Option<String>,
    /// Terminated Pods the pod garbage collector keeps before it deletes the oldest (as
    /// kube-controller-manager's flag); 0 keeps them all
    #[arg(long, env = "SWITCHYARD_TERMINATED_POD_GC_THRESHOLD", default_value_t = switchyard_reconciler_core::podgc::DEFAULT_TERMINATED_THRESHOLD)]
    pub terminated_pod_gc_threshold: u32,
    /// Endpoints in one EndpointSlice at most, 1 to 1000 (as kube-controller-manager's
    /// flag)
    #[arg(long, env = "SWITCHYARD_MAX_ENDPOINTS_PER_SLICE", default_value_t = switchyard_reconciler_core::endpointslice::DEFAULT_MAX_ENDPOINTS_PER_SLICE)]
    pub max_endpoints_per_slice: usize,
    /// How long a Pod's change waits before its Services' EndpointSlices are written, so
    /// that changes in that time are written together (as kube-controller-manager's flag);
    /// at most 60s
    #[arg(
        long,
        env = "SWITCHYARD_ENDPOINTSLICE_UPDATES_BATCH_PERIOD",
        default_value = "0s"
    )]
    pub endpointslice_updates_batch_period: humantime::Duration,
    /// The same for the Endpoints controller (as kube-controller-manager's flag); at most
    /// 60s
    #[arg(
        long,
        env = "SWITCHYARD_ENDPOINT_UPDATES_BATCH_PERIOD",
        default_value = "0s"
    )]
    pub endpoint_updates_batch_period: humantime::Duration,
    /// Addresses of one Endpoints subset mirrored into EndpointSlices at most, 1 to 1000 (as
    /// kube-controller-manager's flag)
    #[arg(long, env = "SWITCHYARD_MIRRORING_MAX_ENDPOINTS_PER_SUBSET", default_value_t = switchyard_reconciler_core::mirroring::DEFAULT_MAX_ENDPOINTS_PER_SUBSET)]
    pub mirroring_max_endpoints_per_subset: usize,
}

/// The reconciler's flags, checked, and the controllers they select.
#[derive(Clone, Debug)]
pub struct Config {
    pub route: Route,
    pub shard_count: u32,
    pub watcher_addr: String,
    /// The controllers to run: those `--controllers` names (all given, by default), each
    /// slowed by `--simulated-latency`.
    pub registry: Registry,
    pub concurrency: u32,
    pub reconcile_timeout: Duration,
    pub kube_api_qps: f64,
    pub kube_api_burst: u32,
    /// `--worker-id`, else the host name and process id.
    pub worker_id: String,
    /// `--controller-service-accounts`: the namespace of the built-in controllers' service
    /// accounts, when they act as their own.
    pub controller_service_accounts: Option<String>,
}

impl ReconcilerArgs {
    /// What these flags tune in the built-in controllers.
    pub fn tuning(&self) -> Tuning {
        Tuning {
            terminated_pod_gc_threshold: self.terminated_pod_gc_threshold,
            max_endpoints_per_slice: self.max_endpoints_per_slice,
            endpoint_updates_batch_period: *self.endpointslice_updates_batch_period,
            endpoints_batch_period: *self.endpoint_updates_batch_period,
            mirroring_max_endpoints_per_subset: self.mirroring_max_endpoints_per_subset,
        }
    }

    /// The checked configuration with the controllers of `registry` that `--controllers`
    /// selects, or an error naming the bad flag.
    pub fn config(&self, mut registry: Registry) -> Result<Config> {
        let Self {
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
            controller_service_accounts,
            terminated_pod_gc_threshold: _,
            max_endpoints_per_slice,
            endpointslice_updates_batch_period,
            endpoint_updates_batch_period,
            mirroring_max_endpoints_per_subset,
        } = self;
        let limit = switchyard_reconciler_core::endpointslice::MAX_ENDPOINTS_PER_SLICE_LIMIT;
        for (flag, value) in [
            ("--max-endpoints-per-slice", max_endpoints_per_slice),
            (
                "--mirroring-max-endpoints-per-subset",
                mirroring_max_endpoints_per_subset,
            ),
        ] {
            if !(1..=limit).contains(value) {
                return Err(Error::Args(format!(
                    "{flag}: {value} is not between 1 and {limit}"
                )));
            }
        }
        for (flag, period) in [
            (
                "--endpointslice-updates-batch-period",
                endpointslice_updates_batch_period,
            ),
            (
                "--endpoint-updates-batch-period",
                endpoint_updates_batch_period,
            ),
        ] {
            if **period > MAX_BATCH_PERIOD {
                return Err(Error::Args(format!(
                    "{flag}: {period} is longer than {}",
                    humantime::format_duration(MAX_BATCH_PERIOD)
                )));
            }
        }
        if let Some(namespace) = controller_service_accounts {
            check_namespace(namespace).map_err(|problem| {
                Error::Args(format!(
                    "--controller-service-accounts: {namespace:?} is not a namespace name: {problem}"
                ))
            })?;
        }
        let route = Route::from_flags(queue_addr.as_deref(), elector_addr.as_deref())
            .map_err(|e| Error::Args(e.to_string()))?;
        if *shard_count == 0 {
            return Err(Error::Args("--shard-count: must be at least 1".into()));
        }
        if !(1..=MAX_CONCURRENCY).contains(concurrency) {
            return Err(Error::Args(format!(
                "--concurrency: {concurrency} is out of range 1 to {MAX_CONCURRENCY}"
            )));
        }
        if !(kube_api_qps.is_finite() && *kube_api_qps > 0.0) {
            return Err(Error::Args(
                "--kube-api-qps: must be a positive number".into(),
            ));
        }
        if *kube_api_burst == 0 {
            return Err(Error::Args("--kube-api-burst: must be at least 1".into()));
        }
        if !controllers.is_empty() {
            registry.retain(controllers).map_err(|unknown| {
                Error::Args(format!(
                    "--controllers: unknown controller {unknown:?} (known: {})",
                    registry.names().join(", ")
                ))
            })?;
        }
        if registry.names().is_empty() {
            return Err(Error::Args(
                "--controllers: no controllers to run (the registry is empty)".into(),
            ));
        }
        let simulated_latency: Duration = (*simulated_latency).into();
        if !simulated_latency.is_zero() {
            registry.add_latency(simulated_latency);
        }
        Ok(Config {
            route,
            shard_count: *shard_count,
            watcher_addr: watcher_addr.clone(),
            registry,
            concurrency: *concurrency,
            reconcile_timeout: (*reconcile_timeout).into(),
            kube_api_qps: *kube_api_qps,
            kube_api_burst: *kube_api_burst,
            worker_id: instance_id(worker_id.clone(), "reconciler", InstanceScope::Process),
            controller_service_accounts: controller_service_accounts.clone(),
        })
    }
}

/// Why `name` is not a namespace name (an RFC 1123 label), if it is not.
fn check_namespace(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() || name.len() > 63 {
        return Err("it must have 1 to 63 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err("it may hold only lowercase letters, digits and '-'");
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err("it must start and end with a letter or digit");
    }
    Ok(())
}

/// The controllers built into the reconciler, each declared in its adapter module, in the
/// order of `switchyard_work::builtin::ALL`.
pub const BUILTINS: &[Builtin] = &[
    replicaset::BUILTIN,
    deployment::BUILTIN,
    gc::BUILTIN,
    namespace::BUILTIN,
    serviceaccount::BUILTIN,
    job::BUILTIN,
    ttlafterfinished::BUILTIN,
    cronjob::BUILTIN,
    podgc::BUILTIN,
    replicationcontroller::BUILTIN,
    statefulset::BUILTIN,
    disruption::BUILTIN,
    daemonset::BUILTIN,
    endpointslice::BUILTIN,
    endpoints::BUILTIN,
    mirroring::BUILTIN,
];

/// The user a built-in controller's requests impersonate, with service accounts in
/// `namespace`; `None` for a controller that is not built in.
pub fn controller_user(controller: &str, namespace: &str) -> Option<String> {
    BUILTINS
        .iter()
        .find(|builtin| builtin.name == controller)
        .map(|builtin| {
            format!(
                "system:serviceaccount:{namespace}:{}",
                builtin.service_account
            )
        })
}

/// The names of the controllers built into the reconciler: what a queue serving this
/// reconciler's defaults must serve (the queue's own default `--controllers`, from the same
/// list, `switchyard_work::builtin`).
pub const BUILTIN: &[&str] = switchyard_work::builtin::ALL;

/// The controllers built into the reconciler, tuned as by default.
pub fn builtin_controllers() -> Registry {
    builtin_controllers_with(&Tuning::default())
}

/// The controllers built into the reconciler, tuned by `settings`.
pub fn builtin_controllers_with(tuning: &Tuning) -> Registry {
    let mut registry = Registry::default();
    for builtin in BUILTINS {
        (builtin.register)(&mut registry, tuning);
    }
    registry
}

impl Args {
    pub async fn run(self) -> Result<()> {
        let tuning = self.reconciler.tuning();
        let rt = self.start(builtin_controllers_with(&tuning)).await?;
        rt.run().await?;
        Ok(())
    }

    /// Starts the service with `registry`'s controllers and returns its runtime (not yet
    /// running). A user's own reconciler binary registers its controllers and calls this.
    pub async fn start(self, registry: Registry) -> Result<Runtime> {
        let Self {
            runtime,
            kube: kube_args,
            reconciler,
        } = self;
        let Config {
            route,
            shard_count,
            watcher_addr,
            registry,
            concurrency,
            reconcile_timeout,
            kube_api_qps,
            kube_api_burst,
            worker_id,
            controller_service_accounts,
        } = reconciler.config(registry)?;
        let drain_timeout: Duration = runtime.drain_timeout.into();

        let rt = Runtime::start(SERVICE, runtime).await?;
        let config = kube_args.config().await?;
        // Outermost: the client's buffer task calls it in the span of the reconcile that made
        // the request; latency starts once the rate limit has let the request through.
        let apiserver = ApiserverLayer::new(ApiserverMetrics::register(rt.metrics()), true);
        // Each controller gets a client, and so a QPS/burst limit, of its own, as each of
        // kube-controller-manager's controllers does: one busy controller does not hold
        // back the others.
        let rate_limits = metrics::RateLimitMetrics::register(rt.metrics());
        // With --controller-service-accounts, a built-in controller's client (and its Events'
        // client) impersonates the controller's own service account.
        let limited_client = |name: &str, controller: &str| -> Result<kube::Client> {
            let limit = RateLimitLayer::new(kube_api_qps, kube_api_burst, rate_limits.client(name));
            let mut config = config.clone();
            if let Some(user) = controller_service_accounts
                .as_deref()
                .and_then(|namespace| controller_user(controller, namespace))
            {
                config.auth_info.impersonate = Some(user);
            }
            Ok(kube::client::ClientBuilder::try_from(config)
                .map_err(switchyard_k8s::KubeError::from)?
                .with_layer(&limit)
                .with_layer(&apiserver)
                .build())
        };
        let client = limited_client("default", "")?;
        let gate = rt.readiness().gate("apiserver");
        rt.spawn("apiserver-check", {
            let client = client.clone();
            move |drain| await_apiserver(client, gate, drain)
        });
        let cache = CacheClient::new(&rt.dialer(), &watcher_addr)?
            .with_metrics(metrics::CacheMetrics::register(rt.metrics()));
        // Watches declared in code are registered, and their informers listed, before any
        // key is leased (controller-runtime's cache sync); a refused registration (a kind the
        // apiserver does not serve) fails the start, naming it.
        let declared = registry.watches();
        if !declared.is_empty() {
            let registration =
                Registration::new(&rt.dialer(), &watcher_addr, &worker_id, &declared)?;
            let held = registration.register(&rt.drain()).await?;
            rt.spawn_essential("watch-registration", move |drain| {
                registration.hold(held, drain)
            });
        }
        // The keys mapping functions return go to the queue replica owning their shard,
        // found as the watcher finds it.
        let view = match &route {
            Route::Queue(queue) => {
                let single = switchyard_shards::ShardView::single(queue, shard_count);
                let (source, view) = tokio::sync::watch::channel(Some(Arc::new(single)));
                // The map never changes; its source lives as long as the service (a closed
                // map reads as shutdown).
                rt.spawn("static-shard-map", move |drain| async move {
                    drain.signaled().await;
                    drop(source);
                });
                view
            }
            Route::Elector(elector) => {
                let (view, follow) = switchyard_shards::follow_elector(
                    rt.dialer(),
                    elector.clone(),
                    shard_count,
                    rt.drain(),
                );
                rt.spawn_essential("shard-map", |_| follow);
                view
            }
        };
        let enqueuer = Arc::new(Enqueuer::new(
            MAX_MAPPED_KEYS,
            shard_count,
            NoMetrics,
            rt.dialer(),
        ));
        rt.spawn_restarting("enqueuer", {
            let enqueuer = enqueuer.clone();
            let view = view.clone();
            move |drain| enqueuer.clone().run(view.clone(), drain)
        });
        let ctx = Context::new(client, cache.clone(), &worker_id).enqueueing_to(enqueuer.clone());
        let mut contexts = BTreeMap::new();
        for name in registry.names() {
            // Events are written in the background through a client and limit of their own:
            // a burst of them (one per Pod created) never holds back the controller's writes
            // to the objects it reconciles.
            let ctx = Context::of(
                limited_client(&name, &name)?,
                cache.clone(),
                Events::new(
                    limited_client(&format!("{name}/events"), &name)?,
                    &worker_id,
                ),
            )
            .enqueueing_to(enqueuer.clone())
            .managed_as(&name);
            contexts.insert(name, ctx);
        }
        let settings = Settings {
            worker_id,
            concurrency,
            reconcile_timeout,
            drain_timeout,
            dialer: rt.dialer(),
        };
        info!(
            controllers = ?registry.names(),
            ?route,
            watcher = %watcher_addr,
            concurrency,
            controller_service_accounts = controller_service_accounts.as_deref().unwrap_or("none: the reconciler's own identity"),
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
                let queue: std::sync::Arc<str> = queue.into();
                rt.spawn_restarting("worker", move |drain| {
                    worker.clone().serve(queue.clone(), drain)
                });
            }
            Route::Elector(_) => {
                rt.spawn_restarting("worker", move |drain| {
                    worker.clone().follow(view.clone(), drain)
                });
            }
        }
        rt.serve_grpc(GrpcServer::new()).await?;
        Ok(rt)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// The TLS flags every service requires; these tests only parse them (no file is read).
    const TLS: [&str; 3] = ["--tls-cert=tls.crt", "--tls-key=tls.key", "--tls-ca=ca.crt"];

    fn args(flags: &[&str]) -> ReconcilerArgs {
        let required = ["switchyard-reconciler", "--watcher-addr=127.0.0.1:1"];
        Args::try_parse_from(required.iter().chain(&TLS).chain(flags))
            .unwrap()
            .reconciler
    }

    fn config_error(flags: &[&str], registry: Registry) -> String {
        match args(flags).config(registry) {
            Err(Error::Args(message)) => message,
            other => panic!("{flags:?}: expected a flag error, got {other:?}"),
        }
    }

    #[test]
    fn the_built_in_table_follows_the_one_list_of_names() {
        let names: Vec<&str> = BUILTINS.iter().map(|b| b.name).collect();
        assert_eq!(names, BUILTIN);
        let mut registered = builtin_controllers().names();
        registered.sort_unstable();
        let mut names = names;
        names.sort_unstable();
        assert_eq!(registered, names);
    }

    #[test]
    fn every_built_in_controller_has_a_service_account_of_its_own() {
        let mut accounts: Vec<&str> = BUILTINS.iter().map(|b| b.service_account).collect();
        accounts.sort_unstable();
        accounts.dedup();
        assert_eq!(accounts.len(), BUILTIN.len());
        for name in BUILTIN {
            let user = controller_user(name, "switchyard").unwrap();
            assert!(
                user.starts_with("system:serviceaccount:switchyard:switchyard-"),
                "{user}"
            );
        }
        assert_eq!(
            controller_user("example.com/v1/Greeting", "switchyard"),
            None
        );
    }

    #[test]
    fn bad_flags_are_named() {
        let queue = "--queue-addr=127.0.0.1:2";
        for (flags, named) in [
            (&[][..], "--queue-addr or --elector-addr"),
            (&[queue, "--shard-count=0"], "--shard-count"),
            (&[queue, "--concurrency=0"], "--concurrency"),
            (&[queue, "--concurrency=10001"], "--concurrency"),
            (&[queue, "--kube-api-qps=0"], "--kube-api-qps"),
            (&[queue, "--kube-api-qps=NaN"], "--kube-api-qps"),
            (&[queue, "--kube-api-burst=0"], "--kube-api-burst"),
            (&[queue, "--controllers=apps/v1/Nothing"], "--controllers"),
            (
                &[queue, "--controller-service-accounts=Switchyard"],
                "--controller-service-accounts",
            ),
            (
                &[queue, "--controller-service-accounts="],
                "--controller-service-accounts",
            ),
        ] {
            let message = config_error(flags, builtin_controllers());
            assert!(message.starts_with(named), "{flags:?}: {message}");
        }
        let message = config_error(&[queue], Registry::default());
        assert!(message.starts_with("--controllers"), "{message}");
    }

    #[test]
    fn good_flags_select_the_controllers() {
        let config = args(&[
            "--elector-addr=127.0.0.1:2",
            "--controllers=apps/v1/ReplicaSet",
            "--worker-id=w1",
            "--concurrency=10000",
        ])
        .config(builtin_controllers())
        .unwrap();
        assert_eq!(config.route, Route::Elector("127.0.0.1:2".into()));
        assert_eq!(config.registry.names(), ["apps/v1/ReplicaSet"]);
        assert_eq!(
            (config.worker_id.as_str(), config.concurrency),
            ("w1", 10_000)
        );
        let all = args(&["--queue-addr=127.0.0.1:2"])
            .config(builtin_controllers())
            .unwrap();
        assert_eq!(all.registry.names(), builtin_controllers().names());
    }
}
