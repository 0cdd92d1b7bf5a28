//! Switchyard watcher: client-go's shared informers as a service. It lists and watches the
//! resources its configuration file and the reconcilers' registrations name, once each,
//! caches them, turns every change into work keys and sends each key to the queue replica
//! that owns its shard.
//!
//! ```text
//!  Watches gRPC ([`watches`]) ─► informers' set ([`informers`]): started, shared, stopped
//!                                     │
//!  apiserver ─► informer per resource ([`informer`]) ─► cache ([`cache`]) ◄── Cache gRPC ([`grpc`])
//!                          │ keys
//!                          ▼
//!              Enqueuer (switchyard-queue-client) ─► EnqueueMany at the shards' owner
//!                          ▲
//!  elector WatchShardMap ──┴─ directory ([`directory`]): owners; a moved shard is resynced
//! ```

pub mod cache;
pub mod directory;
pub mod error;
pub mod graph;
pub mod grpc;
pub mod informer;
pub mod informers;
pub mod metrics;
pub mod peers;
pub mod sync_barrier;
pub mod watches;

use std::{net::SocketAddr, path::PathBuf, sync::Arc};
pub use switchyard_shards::Route;

use switchyard_k8s::{KubeArgs, await_apiserver};
use switchyard_queue_client::Enqueuer;
use switchyard_runtime::{
    Drain, GrpcServer, Runtime, RuntimeArgs,
    apiserver::{ApiserverLayer, ApiserverMetrics},
};
use switchyard_watcher_core::peer::OnPeer;
use tokio::sync::watch;
use tracing::info;

use crate::{
    cache::Caches,
    directory::ShardView,
    graph::GraphInformers,
    informers::{InformerDeps, Informers, wait_listed},
    metrics::WatcherMetrics,
    peers::Peers,
    sync_barrier::SyncBarrier,
    watches::WatchesService,
};

pub const SERVICE: &str = "switchyard-watcher";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Runtime(#[from] switchyard_runtime::Error),
    #[error(transparent)]
    Kube(#[from] switchyard_k8s::KubeError),
    #[error("failed to read the configuration file {path}: {source}")]
    ReadConfig {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid configuration file {path}: {source}")]
    Config {
        path: PathBuf,
        source: switchyard_watcher_core::ConfigError,
    },
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
    pub watcher: WatcherArgs,
}

#[derive(Clone, Debug, clap::Args)]
pub struct WatcherArgs {
    /// The watcher configuration (YAML): resources, controllers and their key mapping;
    /// reconcilers may register more controllers while the watcher runs
    #[arg(long, env = "SWITCHYARD_WATCHER_CONFIG")]
    pub config: PathBuf,
    /// gRPC address (host:port) of the one queue replica that serves every shard, when no
    /// elector assigns shards
    #[arg(long, env = "SWITCHYARD_QUEUE_ADDR", conflicts_with = "elector_addr")]
    pub queue_addr: Option<String>,
    /// gRPC address (host:port) of an elector: send each key to its shard's owner in the
    /// elector's shard map, and resync a shard that moves
    #[arg(long, env = "SWITCHYARD_ELECTOR_ADDR")]
    pub elector_addr: Option<String>,
    /// Keys waiting to be sent at most; when full, the watcher stops reading watch events
    /// until the queue takes keys
    #[arg(long, env = "SWITCHYARD_MAX_PENDING_KEYS", default_value_t = 1_000_000)]
    pub max_pending_keys: usize,
    /// Initial lists as watch streams (sendInitialEvents) instead of paged lists
    #[arg(long, env = "SWITCHYARD_STREAMING_LISTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub streaming_lists: bool,
    /// What to do when another controller manager (kube-controller-manager) writes the
    /// status of objects a controller here reconciles, so runs that controller too: `warn`
    /// (count and log it, go on) or `stand-down` (also stop sending that controller's keys
    /// until --peer-write-window after the peer's last such write)
    #[arg(long, env = "SWITCHYARD_ON_PEER_WRITES", default_value = "warn", value_parser = on_peer)]
    pub on_peer_writes: OnPeer,
    /// How long a peer's status write counts: a peer that stopped writing this long ago no
    /// longer does
    #[arg(long, env = "SWITCHYARD_PEER_WRITE_WINDOW", default_value = "5m")]
    pub peer_write_window: humantime::Duration,
}

fn on_peer(value: &str) -> std::result::Result<OnPeer, String> {
    match value {
        "warn" => Ok(OnPeer::Warn),
        "stand-down" => Ok(OnPeer::StandDown),
        other => Err(format!("{other:?}: expected warn or stand-down")),
    }
}

/// The watcher's flags, checked, and the configuration file they name, parsed.
#[derive(Clone, Debug)]
pub struct Config {
    /// The contents of `--config`: resources, controllers and their key mapping.
    pub file: switchyard_watcher_core::Config,
    /// Where `file` was read from, for errors that name it.
    pub path: PathBuf,
    pub route: Route,
    pub max_pending_keys: usize,
    pub streaming_lists: bool,
    pub on_peer_writes: OnPeer,
    pub peer_write_window: std::time::Duration,
}

/// The files of grants beside the configuration file, `*.registrations.yaml` in its
/// directory, by name: what a controller's installation adds (a kustomize component merging
/// a key into the watcher's ConfigMap, mounted as one directory).
fn grant_files(config: &std::path::Path) -> Result<Vec<(String, String)>> {
    let dir = match config.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => std::path::Path::new("."),
    };
    let read_error = |path: PathBuf| move |source| Error::ReadConfig { path, source };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_error(dir.to_owned()))? {
        let entry = entry.map_err(read_error(dir.to_owned()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // A ConfigMap's mount holds each key twice (the file and `..data/`): the files only.
        if name.ends_with(".registrations.yaml") && !name.starts_with('.') {
            let text = std::fs::read_to_string(entry.path()).map_err(read_error(entry.path()))?;
            files.push((name, text));
        }
    }
    files.sort();
    Ok(files)
}

impl WatcherArgs {
    /// The checked configuration, or an error naming the bad flag (or the configuration
    /// file and the bad field in it).
    pub fn config(&self) -> Result<Config> {
        let Self {
            config,
            queue_addr,
            elector_addr,
            max_pending_keys,
            streaming_lists,
            on_peer_writes,
            peer_write_window,
        } = self;
        if peer_write_window.is_zero() {
            return Err(Error::Args(
                "--peer-write-window: must be longer than 0s".into(),
            ));
        }
        let route = Route::from_flags(queue_addr.as_deref(), elector_addr.as_deref())
            .map_err(|e| Error::Args(e.to_string()))?;
        if *max_pending_keys == 0 {
            return Err(Error::Args("--max-pending-keys: must be at least 1".into()));
        }
        let text = std::fs::read_to_string(config).map_err(|source| Error::ReadConfig {
            path: config.clone(),
            source,
        })?;
        let grants = grant_files(config)?;
        let file = switchyard_watcher_core::Config::from_yaml_with_grants(&text, &grants).map_err(
            |source| Error::Config {
                path: config.clone(),
                source,
            },
        )?;
        Ok(Config {
            file,
            path: config.clone(),
            route,
            max_pending_keys: *max_pending_keys,
            streaming_lists: *streaming_lists,
            on_peer_writes: *on_peer_writes,
            peer_write_window: (*peer_write_window).into(),
        })
    }
}

impl Args {
    pub async fn run(self) -> Result<()> {
        let (rt, _) = self.start().await?;
        rt.run().await?;
        Ok(())
    }

    /// Starts the service and returns its runtime (not yet running) and gRPC address.
    pub async fn start(self) -> Result<(Runtime, SocketAddr)> {
        let Self {
            runtime,
            kube,
            watcher,
        } = self;
        let Config {
            file: config,
            path,
            route,
            max_pending_keys,
            streaming_lists,
            on_peer_writes,
            peer_write_window,
        } = watcher.config()?;
        let rt = Runtime::start(SERVICE, runtime).await?;
        // Counted, not traced: a watch is one long request, not a step of any change's trace.
        let apiserver = ApiserverLayer::new(ApiserverMetrics::register(rt.metrics()), false);
        let client = switchyard_k8s::kube::client::ClientBuilder::try_from(kube.config().await?)
            .map_err(switchyard_k8s::KubeError::from)?
            .with_layer(&apiserver)
            .build();
        let gate = rt.readiness().gate("apiserver");
        rt.spawn("apiserver-check", {
            let client = client.clone();
            move |drain| await_apiserver(client, gate, drain)
        });
        let metrics = WatcherMetrics::register(rt.metrics());
        let peers = Peers::new(on_peer_writes, peer_write_window, metrics.clone());
        let caches = Arc::new(Caches::new(&config, peers));
        let enqueuer = Arc::new(Enqueuer::new(
            max_pending_keys,
            config.shard_count,
            metrics.clone(),
            rt.dialer(),
        ));

        let view = match route {
            Route::Queue(queue) => {
                let single = ShardView::single(&queue, config.shard_count);
                let (source, view) = watch::channel(Some(Arc::new(single)));
                // The map never changes, but its source lives as long as the service:
                // readers treat a closed map as shutdown.
                rt.spawn("static-shard-map", move |drain| async move {
                    drain.signaled().await;
                    drop(source);
                });
                view
            }
            Route::Elector(elector) => {
                let gate = rt.readiness().gate("shard-map");
                let (view, follow) =
                    directory::follow_elector(rt.dialer(), elector, config.shard_count, rt.drain());
                rt.spawn_essential("shard-map", |_| follow);
                let mut first = view.clone();
                rt.spawn("shard-map-ready", move |drain| async move {
                    tokio::select! {
                        _ = first.wait_for(Option::is_some) => gate.ready(),
                        _ = drain.signaled() => {}
                    }
                });
                view
            }
        };
        rt.spawn_restarting("enqueuer", {
            let enqueuer = enqueuer.clone();
            let view = view.clone();
            move |drain| enqueuer.clone().run(view.clone(), drain)
        });
        rt.spawn_restarting("shard-resync", {
            let (caches, enqueuer, metrics) = (caches.clone(), enqueuer.clone(), metrics.clone());
            move |drain| {
                resync_moved_shards(
                    caches.clone(),
                    enqueuer.clone(),
                    metrics.clone(),
                    view.clone(),
                    drain,
                )
            }
        });
        if let Some(period) = config.resync_period {
            let (caches, enqueuer, metrics) = (caches.clone(), enqueuer.clone(), metrics.clone());
            rt.spawn_restarting("periodic-resync", move |drain| {
                let (caches, enqueuer, metrics) =
                    (caches.clone(), enqueuer.clone(), metrics.clone());
                async move {
                    let mut ticks =
                        tokio::time::interval_at(tokio::time::Instant::now() + period, period);
                    loop {
                        tokio::select! {
                            _ = ticks.tick() => {}
                            _ = drain.clone().signaled() => return,
                        }
                        grpc::resync(&caches, &enqueuer, &metrics, None, "periodic").await;
                    }
                }
            });
        }

        // Ready once the configuration file's kinds are listed (and the collector's graph):
        // registrations wait for their own kinds, not the process.
        let synced = SyncBarrier::new(
            1 + usize::from(caches.graph.is_some()),
            rt.readiness().gate("initial-lists"),
        );
        if let Some(graph) = &caches.graph {
            let informers = GraphInformers {
                client: client.clone(),
                cache: graph.clone(),
                enqueuer: enqueuer.clone(),
                metrics: metrics.clone(),
            };
            let synced = synced.clone();
            rt.spawn_restarting("collector-graph", move |drain| {
                informers.clone().run(synced.clone(), drain)
            });
        }
        let file_kinds: Vec<(switchyard_watcher_core::Gvk, String)> = config
            .resources
            .iter()
            .enumerate()
            .map(|(i, r)| (r.gvk.clone(), format!("resources[{i}]")))
            .collect();
        let informers = Informers::start(
            config.clone(),
            format!("the configuration file {}", path.display()),
            caches.clone(),
            InformerDeps {
                client: client.clone(),
                enqueuer: enqueuer.clone(),
                metrics: metrics.clone(),
                streaming_lists,
            },
            rt.spawner(),
        );
        rt.spawn("initial-lists", {
            let caches = caches.clone();
            move |drain| async move {
                if wait_listed(&caches, &file_kinds, false, &drain)
                    .await
                    .is_ok()
                {
                    synced.done();
                }
            }
        });
        info!(
            resources = %caches.watched(),
            controllers = ?config.controllers(),
            shard_count = config.shard_count,
            "configured"
        );

        let file = Arc::new(config);
        let addr = rt
            .serve_grpc(
                GrpcServer::new()
                    .add_service(
                        grpc::CacheService::new(caches.clone(), metrics.clone(), file.clone())
                            .into_server(),
                    )
                    .add_service(WatchesService::new(informers, file, rt.drain()).into_server())
                    .with_descriptor_set(switchyard_proto::FILE_DESCRIPTOR_SET),
            )
            .await?;
        Ok((rt, addr))
    }
}

/// When a shard gets a new active owner, that owner starts empty: re-send the shard's keys
/// from the cache so nothing is left unreconciled. The first map needs no resync (the
/// initial lists send every key).
async fn resync_moved_shards(
    caches: Arc<Caches>,
    enqueuer: Arc<Enqueuer>,
    metrics: WatcherMetrics,
    mut view: watch::Receiver<Option<Arc<ShardView>>>,
    drain: Drain,
) {
    let mut before: Option<Arc<ShardView>> = None;
    loop {
        let now = view.borrow_and_update().clone();
        if let (Some(before), Some(now)) = (&before, &now) {
            let moved = now.new_owners(before);
            if !moved.is_empty() {
                grpc::resync(&caches, &enqueuer, &metrics, Some(&moved), "shard_moved").await;
            }
        }
        if now.is_some() {
            before = now;
        }
        tokio::select! {
            changed = view.changed() => if changed.is_err() { return },
            _ = drain.clone().signaled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// The TLS flags every service requires; these tests only parse them (no file is read).
    const TLS: [&str; 3] = ["--tls-cert=tls.crt", "--tls-key=tls.key", "--tls-ca=ca.crt"];

    fn config(flags: &[&str]) -> Result<Config> {
        let args =
            Args::try_parse_from(["switchyard-watcher"].iter().chain(&TLS).chain(flags)).unwrap();
        args.watcher.config()
    }

    #[test]
    fn bad_flags_are_named() {
        for (flags, named) in [
            (
                &["--config=/nonexistent/watcher.yaml"][..],
                "--queue-addr or --elector-addr",
            ),
            (
                &[
                    "--config=/nonexistent/watcher.yaml",
                    "--queue-addr=127.0.0.1:1",
                    "--max-pending-keys=0",
                ],
                "--max-pending-keys",
            ),
        ] {
            match config(flags) {
                Err(Error::Args(message)) => {
                    assert!(message.starts_with(named), "{flags:?}: {message}");
                }
                other => panic!("{flags:?}: expected a flag error, got {other:?}"),
            }
        }
        match config(&[
            "--config=/nonexistent/watcher.yaml",
            "--elector-addr=127.0.0.1:1",
        ]) {
            Err(error @ Error::ReadConfig { .. }) => {
                assert!(
                    error.to_string().contains("/nonexistent/watcher.yaml"),
                    "{error}"
                );
            }
            other => panic!("expected a read error, got {other:?}"),
        }
    }

    #[test]
    fn good_flags_make_a_config() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("watcher.yaml");
        std::fs::write(
            &path,
            "shardCount: 8\ncontrollers: [{name: apps/v1/ReplicaSet, for: {apiVersion: apps/v1, kind: ReplicaSet}}]\n",
        )
        .unwrap();
        let config = config(&[
            &format!("--config={}", path.display()),
            "--elector-addr=127.0.0.1:1",
            "--streaming-lists=false",
        ])
        .unwrap();
        assert_eq!(config.route, Route::Elector("127.0.0.1:1".into()));
        assert_eq!(config.file.shard_count, 8);
        assert_eq!(config.max_pending_keys, 1_000_000);
        assert!(!config.streaming_lists);
    }
}
