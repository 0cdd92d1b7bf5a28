//! The reconciler service a controller binary runs: its flags ([`Args`]) and its start
//! ([`Args::start`]), the same for the built-in reconciler and a user's own binary.
//!
//! ```text
//!  flags ─► Config ─► Runtime (admin port, mTLS dialer, drain)
//!                       ├─ watches declared in code: registered with the watcher, listed
//!                       ├─ per controller: a client behind its own QPS/burst limit, Events
//!                       └─ worker: leases keys from the queue (one replica, or the elector's
//!                          shard map), reconciles, reports outcomes
//! ```

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use switchyard_k8s::{KubeArgs, await_apiserver, kube};
use switchyard_queue_client::{Enqueuer, NoMetrics};
use switchyard_runtime::{
    GrpcServer, InstanceScope, Runtime, RuntimeArgs, TlsArgs,
    apiserver::{ApiserverLayer, ApiserverMetrics},
    instance_id,
};
use switchyard_shards::Route;
use tracing::info;

use crate::{
    Context, Events, Registry,
    cache::{CacheClient, CacheError},
    metrics,
    ratelimit::RateLimitLayer,
    registration::{Registration, RegistrationError},
    worker::{Settings, Worker},
};

/// The service's name: the reporting controller of its Events, the default field manager,
/// the name in its logs and traces.
pub const SERVICE: &str = "switchyard-reconciler";
/// Reconciles at once: the credits one Work message may grant (the queue's limit).
const MAX_CONCURRENCY: u32 = switchyard_queue_client::MAX_CREDIT;
/// Keys that mapping functions returned and no queue has taken yet, at most: a reconcile
/// that maps more waits for room. Far more than a burst of mappings returns; the watcher
/// holds a million, for every kind it watches.
const MAX_MAPPED_KEYS: usize = 100_000;

/// Why the service could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The runtime (admin port, certificates, tasks) failed.
    #[error(transparent)]
    Runtime(#[from] switchyard_runtime::Error),
    /// The apiserver's configuration could not be read.
    #[error(transparent)]
    Kube(#[from] switchyard_k8s::KubeError),
    /// The watcher's address was not usable.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The watcher refused the watches the controllers declare.
    #[error(transparent)]
    Registration(#[from] RegistrationError),
    /// The webhooks' certificate could not be read.
    #[error("the webhooks' certificate: {0}")]
    WebhookCertificate(#[from] switchyard_runtime::TlsError),
    /// A flag was wrong; the message names it.
    #[error("invalid flags: {0}")]
    Args(String),
}

/// The reconciler's command line: the runtime's flags (admin port, TLS, tracing), the
/// apiserver's, and the reconciler's own.
#[derive(Debug, clap::Parser)]
#[command(
    name = SERVICE,
    version,
    about = "A Switchyard reconciler: leases keys from the queue and reconciles them with the controllers it was built with"
)]
pub struct Args {
    /// The runtime's flags: admin port, certificates, drain timeout, tracing.
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// How to reach the apiserver.
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Where to lease keys and read objects, and how many reconciles run at once.
    #[command(flatten)]
    pub reconciler: ReconcilerArgs,
}

/// The reconciler's own flags.
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
    /// The controllers this worker runs (names the keys carry); all registered ones by
    /// default
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
    /// Address of the HTTPS server of the admission and conversion webhooks the binary
    /// registers; unused by a binary that registers none
    #[arg(long, env = "SWITCHYARD_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: std::net::SocketAddr,
    /// PEM certificate chain the webhook server presents, reloaded when it changes; its names
    /// must be the ones the apiserver dials (the webhook Service's DNS names, or the URL's
    /// host). Default: the service's own --tls-cert, whose names are its Service's
    #[arg(
        long,
        env = "SWITCHYARD_WEBHOOK_TLS_CERT",
        requires = "webhook_tls_key"
    )]
    pub webhook_tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --webhook-tls-cert
    #[arg(
        long,
        env = "SWITCHYARD_WEBHOOK_TLS_KEY",
        requires = "webhook_tls_cert"
    )]
    pub webhook_tls_key: Option<std::path::PathBuf>,
}

/// The reconciler's flags, checked, and the controllers they select.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where keys are leased: one queue replica, or the elector's shard map.
    pub route: Route,
    /// `--shard-count`.
    pub shard_count: u32,
    /// `--watcher-addr`.
    pub watcher_addr: String,
    /// The controllers to run: those `--controllers` names (all given, by default), each
    /// slowed by `--simulated-latency`.
    pub registry: Registry,
    /// `--concurrency`.
    pub concurrency: u32,
    /// `--reconcile-timeout`.
    pub reconcile_timeout: Duration,
    /// `--kube-api-qps`.
    pub kube_api_qps: f64,
    /// `--kube-api-burst`.
    pub kube_api_burst: u32,
    /// `--worker-id`, else the host name and process id.
    pub worker_id: String,
    /// Where the webhooks are served, and the certificate and key they present: `None` when
    /// the registry has no webhook.
    pub webhooks: Option<WebhookServing>,
}

/// The webhook server's address and certificate files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookServing {
    /// `--webhook-addr`.
    pub addr: std::net::SocketAddr,
    /// `--webhook-tls-cert`, else `--tls-cert`.
    pub cert: std::path::PathBuf,
    /// `--webhook-tls-key`, else `--tls-key`.
    pub key: std::path::PathBuf,
}

impl ReconcilerArgs {
    /// The checked configuration with the controllers of `registry` that `--controllers`
    /// selects, or an error naming the bad flag; `tls` names the service's own certificate,
    /// which the webhooks present unless given theirs.
    pub fn config(&self, mut registry: Registry, tls: &TlsArgs) -> Result<Config, ServiceError> {
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
            webhook_addr,
            webhook_tls_cert,
            webhook_tls_key,
        } = self;
        let webhooks = if registry.webhooks.is_empty() {
            None
        } else {
            let (cert, key) = match (
                webhook_tls_cert,
                webhook_tls_key,
                &tls.tls_cert,
                &tls.tls_key,
            ) {
                (Some(cert), Some(key), _, _) | (None, None, Some(cert), Some(key)) => {
                    (cert.clone(), key.clone())
                }
                _ => {
                    return Err(ServiceError::Args(
                        "--webhook-tls-cert: the webhooks need a certificate, and the service has none of its own (--insecure-plaintext)".into(),
                    ));
                }
            };
            Some(WebhookServing {
                addr: *webhook_addr,
                cert,
                key,
            })
        };
        let route = Route::from_flags(queue_addr.as_deref(), elector_addr.as_deref())
            .map_err(|e| ServiceError::Args(e.to_string()))?;
        if *shard_count == 0 {
            return Err(ServiceError::Args(
                "--shard-count: must be at least 1".into(),
            ));
        }
        if !(1..=MAX_CONCURRENCY).contains(concurrency) {
            return Err(ServiceError::Args(format!(
                "--concurrency: {concurrency} is out of range 1 to {MAX_CONCURRENCY}"
            )));
        }
        if !(kube_api_qps.is_finite() && *kube_api_qps > 0.0) {
            return Err(ServiceError::Args(
                "--kube-api-qps: must be a positive number".into(),
            ));
        }
        if *kube_api_burst == 0 {
            return Err(ServiceError::Args(
                "--kube-api-burst: must be at least 1".into(),
            ));
        }
        if !controllers.is_empty() {
            registry.retain(controllers).map_err(|unknown| {
                ServiceError::Args(format!(
                    "--controllers: unknown controller {unknown:?} (known: {})",
                    registry.names().join(", ")
                ))
            })?;
        }
        if registry.names().is_empty() {
            return Err(ServiceError::Args(
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
            webhooks,
        })
    }
}

/// Reads the reconciler's flags from the command line (exiting with their usage when they
/// do not parse), starts the service with `registry`'s controllers and runs it until
/// shutdown (SIGTERM or SIGINT, then a drain): the whole `main` of a controller binary.
pub async fn run(registry: Registry) -> Result<(), ServiceError> {
    <Args as clap::Parser>::parse()
        .start(registry)
        .await?
        .run()
        .await?;
    Ok(())
}

impl Args {
    /// Starts the service with `registry`'s controllers and returns its runtime (not yet
    /// running: call [`Runtime::run`]). A controller binary registers its controllers and
    /// calls this.
    pub async fn start(self, registry: Registry) -> Result<Runtime, ServiceError> {
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
            webhooks,
        } = reconciler.config(registry, &runtime.tls)?;
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
        // A controller registered to act as a user of its own (the built-in controllers
        // under --controller-service-accounts) impersonates it, Events included.
        let limited_client = |name: &str, controller: &str| -> Result<kube::Client, ServiceError> {
            let limit = RateLimitLayer::new(kube_api_qps, kube_api_burst, rate_limits.client(name));
            let mut config = config.clone();
            if let Some(user) = registry.user(controller) {
                config.auth_info.impersonate = Some(user.to_owned());
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
            impersonating = ?registry.users(),
            "configured"
        );
        let webhook_routes = registry.webhooks.clone();
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
        if let Some(serving) = webhooks {
            serve_webhooks(&rt, serving, webhook_routes).await?;
        }
        rt.serve_grpc(GrpcServer::new()).await?;
        Ok(rt)
    }
}

/// Binds the webhook server and serves `webhooks` with the certificate `serving` names
/// (reloaded as the service's own is) until shutdown.
async fn serve_webhooks(
    rt: &Runtime,
    serving: WebhookServing,
    webhooks: crate::Webhooks,
) -> Result<(), ServiceError> {
    let key = rt.serving_key("webhook", &serving.cert, &serving.key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServiceError::Args(format!("--webhook-tls-cert: {e}")))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(key));
    // The server speaks HTTP/1.1, as the apiserver's webhook client does by default.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let listener = tokio::net::TcpListener::bind(serving.addr)
        .await
        .map_err(|e| ServiceError::Args(format!("--webhook-addr {}: {e}", serving.addr)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| ServiceError::Args(format!("--webhook-addr {}: {e}", serving.addr)))?;
    let listener = switchyard_runtime::tls::HttpsListener::new(
        addr,
        listener,
        switchyard_runtime::tls::Handshakes {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            failures: Default::default(),
            what: "webhook server",
            nodelay: true,
        },
    );
    let metrics = metrics::WebhookMetrics::register(rt.metrics());
    info!(%addr, paths = ?webhooks.paths(), "serving webhooks");
    rt.spawn("webhooks", move |drain| {
        crate::webhook::serve(webhooks, listener, metrics, drain)
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Action, Builder};

    /// The TLS flags every service requires; these tests only parse them (no file is read).
    const TLS: [&str; 3] = ["--tls-cert=tls.crt", "--tls-key=tls.key", "--tls-ca=ca.crt"];

    /// The flags, checked against `registry`.
    fn config(flags: &[&str], registry: Registry) -> Result<Config, ServiceError> {
        let required = ["switchyard-reconciler", "--watcher-addr=127.0.0.1:1"];
        let tls = if flags.contains(&"--insecure-plaintext") {
            &[][..]
        } else {
            &TLS[..]
        };
        let args = Args::try_parse_from(required.iter().chain(tls).chain(flags)).unwrap();
        args.reconciler.config(registry, &args.runtime.tls)
    }

    /// Two controllers of ConfigMaps that do nothing.
    fn registry() -> Registry {
        let mut registry = Registry::default();
        for name in ["example.com/v1/One", "example.com/v1/Two"] {
            registry.register(
                Builder::for_::<k8s_openapi::api::core::v1::ConfigMap>()
                    .named(name)
                    .reconcile(|_, _| async { Ok(Action::Done) }),
            );
        }
        registry
    }

    fn config_error(flags: &[&str], registry: Registry) -> String {
        match config(flags, registry) {
            Err(ServiceError::Args(message)) => message,
            other => panic!("{flags:?}: expected a flag error, got {other:?}"),
        }
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
        ] {
            let message = config_error(flags, registry());
            assert!(message.starts_with(named), "{flags:?}: {message}");
        }
        let message = config_error(&[queue], Registry::default());
        assert!(message.starts_with("--controllers"), "{message}");
    }

    #[test]
    fn good_flags_select_the_controllers() {
        let config = config(
            &[
                "--elector-addr=127.0.0.1:2",
                "--controllers=example.com/v1/Two",
                "--worker-id=w1",
                "--concurrency=10000",
            ],
            registry(),
        )
        .unwrap();
        assert_eq!(config.route, Route::Elector("127.0.0.1:2".into()));
        assert_eq!(config.registry.names(), ["example.com/v1/Two"]);
        assert_eq!(
            (config.worker_id.as_str(), config.concurrency),
            ("w1", 10_000)
        );
        let all = super_config(&["--queue-addr=127.0.0.1:2"], registry());
        assert_eq!(all.registry.names(), registry().names());
        assert_eq!(all.webhooks, None, "no webhook, no server");
    }

    fn super_config(flags: &[&str], registry: Registry) -> Config {
        config(flags, registry).unwrap()
    }

    #[test]
    fn webhooks_present_the_service_s_certificate_unless_given_theirs() {
        let with_webhooks = || {
            let mut registry = registry();
            registry.webhooks(crate::Webhooks::default().convert("/convert", |o, _| Ok(o)));
            registry
        };
        let queue = "--queue-addr=127.0.0.1:2";
        let own = super_config(&[queue], with_webhooks()).webhooks.unwrap();
        assert_eq!(
            (
                own.addr.to_string().as_str(),
                own.cert.to_str(),
                own.key.to_str()
            ),
            ("0.0.0.0:9443", Some("tls.crt"), Some("tls.key"))
        );
        let theirs = super_config(
            &[
                queue,
                "--webhook-addr=127.0.0.1:8443",
                "--webhook-tls-cert=hook.crt",
                "--webhook-tls-key=hook.key",
            ],
            with_webhooks(),
        )
        .webhooks
        .unwrap();
        assert_eq!(
            (
                theirs.addr.port(),
                theirs.cert.to_str(),
                theirs.key.to_str()
            ),
            (8443, Some("hook.crt"), Some("hook.key"))
        );
        let message = config_error(&[queue, "--insecure-plaintext"], with_webhooks());
        assert!(message.starts_with("--webhook-tls-cert"), "{message}");
    }
}
