//! A controller's whole test environment in one value, envtest's `Environment`: started by
//! one call, torn down when dropped.

use std::{collections::BTreeMap, time::Duration};

use switchyard_k8s::Client;
use switchyard_sdk::{Registry, Watch};
use switchyard_testenv::{ControlPlane, InProcess, TestNamespace};

use crate::{SHARDS, queue, reconciler, watcher};

/// How long the watcher may take to list its kinds.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// What [`Env::start_with`] adds to what the controllers declare.
#[derive(Clone, Debug, Default)]
pub struct EnvOptions {
    /// Kinds the reconciler's identity may read besides those its controllers watch
    /// (`(apiVersion, kind)`, granted in full): what a reconcile reads from the cache
    /// without watching it.
    pub grants: Vec<(String, String)>,
    /// Flags given to the reconciler (`--webhook-addr=...`, `--concurrency=...`).
    pub reconciler_flags: Vec<String>,
}

/// A namespace of its own on the shared control plane, and a queue, a watcher and a
/// reconciler running the test's controllers in the test's process, over mutual TLS:
/// envtest's `Environment` for a controller on the SDK.
///
/// The watcher's configuration grants the reconciler's identity every kind the controllers'
/// watches name (in full, or metadata only where the watch asks for no more) and keeps to the
/// namespace. [`Env::start`] returns once the watcher has listed them all, so a test creates
/// objects at once. Dropped, it triggers every service's shutdown and deletes the
/// namespace; [`Env::stop`] waits for the services to stop.
pub struct Env {
    plane: &'static ControlPlane,
    client: Client,
    namespace: TestNamespace,
    /// Stopped in this order: the reconciler, the watcher, the queue.
    services: Vec<InProcess>,
}

impl Env {
    /// Starts everything `controllers` need, in a namespace named after `name`.
    ///
    /// # Panics
    ///
    /// If the control plane or a service does not start: a test cannot go on without them.
    pub async fn start(name: &str, controllers: Registry) -> Self {
        Self::start_with(name, controllers, EnvOptions::default()).await
    }

    /// [`Env::start`] with more grants or reconciler flags.
    ///
    /// # Panics
    ///
    /// If the control plane or a service does not start.
    pub async fn start_with(name: &str, controllers: Registry, options: EnvOptions) -> Self {
        let plane = ControlPlane::shared().expect("the control plane starts");
        let client = plane.client().await.expect("a client of the apiserver");
        let namespace = TestNamespace::create(plane, &client, name)
            .await
            .expect("the test's namespace");
        let config = watcher_config(&controllers, &options.grants, namespace.name());
        let queue = queue(&[], &[]).await;
        let watcher = watcher(plane, &config, queue.grpc()).await;
        watcher.wait_ready(READY_WITHIN).await;
        let flags: Vec<&str> = options
            .reconciler_flags
            .iter()
            .map(String::as_str)
            .collect();
        let reconciler = reconciler(plane, controllers, queue.grpc(), watcher.grpc(), &flags).await;
        Self {
            plane,
            client,
            namespace,
            services: vec![reconciler, watcher, queue],
        }
    }

    /// The control plane.
    pub fn plane(&self) -> &'static ControlPlane {
        self.plane
    }

    /// A client of the apiserver, as an administrator.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The test's namespace.
    pub fn namespace(&self) -> &str {
        self.namespace.name()
    }

    /// The reconciler running the controllers (its admin port: `/metrics`, `/readyz`).
    pub fn reconciler(&self) -> &InProcess {
        &self.services[0]
    }

    /// Stops the reconciler, the watcher and the queue, in that order, each waited for.
    pub async fn stop(mut self) {
        for service in std::mem::take(&mut self.services) {
            service.stop().await;
        }
    }
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env")
            .field("namespace", &self.namespace.name())
            .field("services", &self.services)
            .finish_non_exhaustive()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // Drop cannot wait: each service stops in the background; the namespace deletes
        // itself as it is dropped after this.
        for service in &self.services {
            service.trigger_shutdown();
        }
    }
}

/// The watcher's configuration for `controllers`: the registrations of the reconciler's
/// identity, granting every kind a watch names and each of `grants`, in `namespace`.
pub(crate) fn watcher_config(
    controllers: &Registry,
    grants: &[(String, String)],
    namespace: &str,
) -> String {
    // A kind any watch needs whole is granted whole.
    let mut kinds: BTreeMap<(String, String), bool> = BTreeMap::new();
    let mut grant = |api_version: String, kind: String, full: bool| {
        *kinds.entry((api_version, kind)).or_default() |= full;
    };
    for (_, watches) in controllers.watches() {
        for watch in watches.all() {
            let Watch {
                gvk,
                options,
                through,
                ..
            } = watch;
            grant(gvk.api_version(), gvk.kind.clone(), !options.metadata_only);
            if let Some(through) = through {
                grant(through.api_version(), through.kind.clone(), false);
            }
        }
    }
    for (api_version, kind) in grants {
        grant(api_version.clone(), kind.clone(), true);
    }
    let mut config = format!(
        "shardCount: {SHARDS}\nnamespaces:\n  include: [{namespace}]\nregistrations:\n  - serviceAccount: switchyard-reconciler\n    kinds:\n"
    );
    for ((api_version, kind), full) in kinds {
        let objects = if full { "full" } else { "metadata" };
        config.push_str(&format!(
            "      - {{apiVersion: {api_version}, kind: {kind}, objects: {objects}}}\n"
        ));
    }
    config
}

#[cfg(test)]
mod tests {
    use switchyard_k8s::k8s_openapi::api::{
        apps::v1::{Deployment, ReplicaSet},
        core::v1::{ConfigMap, Pod},
    };
    use switchyard_sdk::{Action, Builder, Options};

    use super::*;

    #[test]
    fn the_watcher_grants_every_kind_the_controllers_watch() {
        let mut registry = Registry::default();
        registry
            .register(
                Builder::for_::<Deployment>()
                    .owns_through::<Pod, ReplicaSet>(Options::default().metadata_only())
                    .reconcile(|_, _| async { Ok(Action::Done) }),
            )
            .register(
                Builder::for_::<ConfigMap>()
                    .owns_with::<Pod>(Options::default().metadata_only())
                    .reconcile(|_, _| async { Ok(Action::Done) }),
            );
        let config = watcher_config(&registry, &[("v1".into(), "Secret".into())], "team");
        assert_eq!(
            config,
            "shardCount: 16\nnamespaces:\n  include: [team]\nregistrations:\n  - serviceAccount: switchyard-reconciler\n    kinds:\n\
             \x20     - {apiVersion: apps/v1, kind: Deployment, objects: full}\n\
             \x20     - {apiVersion: apps/v1, kind: ReplicaSet, objects: metadata}\n\
             \x20     - {apiVersion: v1, kind: ConfigMap, objects: full}\n\
             \x20     - {apiVersion: v1, kind: Pod, objects: metadata}\n\
             \x20     - {apiVersion: v1, kind: Secret, objects: full}\n"
        );
    }
}
