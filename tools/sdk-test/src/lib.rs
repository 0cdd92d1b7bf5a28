//! What envtest gives controller-runtime users, for controllers on the Switchyard SDK: the
//! services a controller needs, started in the test's process against the harness's real
//! control plane (`switchyard_testenv::ControlPlane`: etcd, kube-apiserver, kube-scheduler
//! and kwok, built from their Go modules), over mutual TLS as when deployed.
//!
//! ```no_run
//! use switchyard_sdk::Registry;
//! use switchyard_sdk_test::{ControlPlane, queue, reconciler, watcher};
//!
//! # async fn example(controllers: Registry) {
//! let plane = ControlPlane::shared().expect("control plane");
//! // A queue serving every shard, learning the controllers' names as they come.
//! let queue = queue(&[], &[]).await;
//! // A watcher whose configuration grants the reconciler identity what it registers.
//! let config = "shardCount: 16\nregistrations:\n  - serviceAccount: switchyard-reconciler\n    \
//!               kinds:\n      - {apiVersion: v1, kind: ConfigMap, objects: full}\n";
//! let watcher = watcher(plane, config, queue.grpc()).await;
//! // Returns once the watcher has listed what the controllers' watches need.
//! let reconciler = reconciler(plane, controllers, queue.grpc(), watcher.grpc(), &[]).await;
//! // ... create objects with `plane.client()`, wait for what the controllers write ...
//! reconciler.stop().await;
//! watcher.stop().await;
//! queue.stop().await;
//! # }
//! ```
//!
//! Each service stops when its handle's `stop` is awaited (or, dropped, when the test ends).
//!
//! [`Env`] does all of it in one call, granting the watcher what the controllers watch, in a
//! namespace of the test's own, and tears it all down when dropped:
//!
//! ```no_run
//! # async fn example(controllers: switchyard_sdk::Registry) {
//! let env = switchyard_sdk_test::Env::start("greeting", controllers).await;
//! // ... create objects in env.namespace() with env.client() ...
//! env.stop().await; // or let it drop
//! # }
//! ```

#![deny(missing_docs)]

mod env;

pub use env::{Env, EnvOptions};

use std::{io::Write, net::SocketAddr, path::Path, time::Duration};

use clap::Parser;
use serde::de::DeserializeOwned;
use switchyard_k8s::{
    Api, Client, PostParams,
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    kube::{CustomResourceExt, Resource, api::ListParams},
};
use switchyard_runtime::Role;
use switchyard_sdk::Registry;
use switchyard_testenv::Pki;
pub use switchyard_testenv::{ControlPlane, InProcess, TestNamespace};

/// The shard count of the queue, the watcher and the reconciler these start.
pub const SHARDS: u32 = 16;

/// How long a test waits for what a controller should do at once.
pub const WITHIN: Duration = Duration::from_secs(30);

/// A queue serving every shard (static mode) for `controllers` (it learns other names as
/// they come), with `extra` flags.
///
/// # Panics
///
/// If it does not start: a test cannot go on without it.
pub async fn queue(controllers: &[&str], extra: &[&str]) -> InProcess {
    let flags = ["--drain-grace=1s".to_owned()]
        .into_iter()
        .chain(extra.iter().map(|a| (*a).to_owned()))
        .chain(Pki::shared().flags(Role::Queue));
    let (rt, grpc) = switchyard_queue::Args::start_local(SHARDS, controllers, flags)
        .await
        .expect("the queue starts");
    InProcess::spawn(rt, Some(grpc))
}

/// A watcher with `config` (its configuration file's YAML) against `plane`'s apiserver,
/// sending keys to `queue`.
pub async fn watcher(plane: &ControlPlane, config: &str, queue: SocketAddr) -> InProcess {
    watcher_routed(plane, config, &format!("--queue-addr={queue}")).await
}

/// A watcher routing keys by `route` (`--queue-addr=...` or `--elector-addr=...`).
pub async fn watcher_routed(plane: &ControlPlane, config: &str, route: &str) -> InProcess {
    watcher_on(plane, config, route, "127.0.0.1:0").await
}

/// A watcher routing keys by `route`, serving gRPC on `grpc` (`host:port`; port 0 for any).
pub async fn watcher_on(plane: &ControlPlane, config: &str, route: &str, grpc: &str) -> InProcess {
    watcher_reaching(plane.kubeconfig(), config, route, grpc).await
}

/// A watcher reaching the apiserver by `kubeconfig`, routing keys by `route`, serving gRPC on
/// `grpc`.
///
/// # Panics
///
/// If its configuration cannot be written or it does not start.
pub async fn watcher_reaching(
    kubeconfig: &Path,
    config: &str,
    route: &str,
    grpc: &str,
) -> InProcess {
    let mut file = tempfile::NamedTempFile::new().expect("a temporary file");
    file.write_all(config.as_bytes())
        .expect("the configuration written");
    let path = file
        .into_temp_path()
        .keep()
        .expect("the configuration kept");
    watcher_of_file(kubeconfig, &path, route, grpc).await
}

/// A watcher whose configuration is the file at `config` (and the `*.registrations.yaml`
/// beside it: docs/watcher.md), reaching the apiserver by `kubeconfig`, routing keys by
/// `route`, serving gRPC on `grpc`.
///
/// # Panics
///
/// If it does not start.
pub async fn watcher_of_file(
    kubeconfig: &Path,
    config: &Path,
    route: &str,
    grpc: &str,
) -> InProcess {
    let path = config;
    let mut args = vec![
        "switchyard-watcher".to_owned(),
        "--admin-addr=127.0.0.1:0".into(),
        format!("--grpc-addr={grpc}"),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--config={}", path.display()),
        route.to_owned(),
    ];
    args.extend(Pki::shared().flags(Role::Watcher));
    let (rt, grpc) = switchyard_watcher::Args::try_parse_from(args)
        .expect("the watcher's flags")
        .start()
        .await
        .expect("the watcher starts");
    InProcess::spawn(rt, Some(grpc))
}

/// A reconciler running `registry`'s controllers, leasing from `queue` and reading
/// `watcher`, with `extra` flags; returns once the watcher has listed what their watches need.
pub async fn reconciler(
    plane: &ControlPlane,
    registry: Registry,
    queue: SocketAddr,
    watcher: SocketAddr,
    extra: &[&str],
) -> InProcess {
    reconciler_routed(
        plane,
        registry,
        &format!("--queue-addr={queue}"),
        watcher,
        extra,
    )
    .await
}

/// A reconciler finding its queues by `route` (`--queue-addr=...` or `--elector-addr=...`).
///
/// # Panics
///
/// If it does not start.
pub async fn reconciler_routed(
    plane: &ControlPlane,
    registry: Registry,
    route: &str,
    watcher: SocketAddr,
    extra: &[&str],
) -> InProcess {
    let mut args = vec![
        "switchyard-reconciler".to_owned(),
        "--admin-addr=127.0.0.1:0".into(),
        "--grpc-addr=127.0.0.1:0".into(),
        format!("--kubeconfig={}", plane.kubeconfig().display()),
        route.to_owned(),
        format!("--watcher-addr={watcher}"),
    ];
    // The queue's shard count, for the keys the reconciler enqueues itself.
    if !extra.iter().any(|a| a.starts_with("--shard-count")) {
        args.push(format!("--shard-count={SHARDS}"));
    }
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    // The reconciler's certificate, unless `extra` gives an identity of its own.
    if !extra.iter().any(|a| a.starts_with("--tls-cert")) {
        args.extend(Pki::shared().flags(Role::Reconciler));
    }
    let rt = switchyard_sdk::Args::try_parse_from(args)
        .expect("the reconciler's flags")
        .start(registry)
        .await
        .expect("the reconciler starts");
    InProcess::spawn(rt, None)
}

/// Creates the CustomResourceDefinition of `K` (one already there is kept) and waits until
/// the apiserver serves `K`, for at most [`WITHIN`].
///
/// # Panics
///
/// If the apiserver refuses the definition, or does not serve the kind in time.
pub async fn install_crd<K>(client: &Client)
where
    K: CustomResourceExt + Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    match crds.create(&PostParams::default(), &K::crd()).await {
        Ok(_) => {}
        Err(switchyard_k8s::kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => panic!("creating the CRD of {}: {error}", K::kind(&())),
    }
    let served: Api<K> = Api::all(client.clone());
    let what = format!("the {} CRD is served", K::kind(&()));
    eventually(&what, || async {
        served.list(&ListParams::default().limit(1)).await.ok()
    })
    .await;
}

/// Polls `check` every 100 ms until it returns `Some`, for at most [`WITHIN`].
///
/// # Panics
///
/// If it has not by then, saying `what` was awaited.
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_within(what, WITHIN, check).await
}

/// [`eventually`] for at most `within`.
///
/// # Panics
///
/// If `check` has not returned `Some` by then, saying `what` was awaited.
pub async fn eventually_within<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
