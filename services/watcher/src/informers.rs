//! The informers that run: one per watched kind, started, shared and stopped as the
//! configuration file and the registrations need them (client-go's shared informer
//! factory, with informers that also stop).
//!
//! ```text
//!  register(registration)
//!    ├─ check against the configuration file (core Watches)     FAILED_PRECONDITION
//!    ├─ discovery of each kind not listed yet                   NOT_FOUND (fail fast)
//!    ├─ commit, under the lock: Watches::register ─► apply ─► Registered (a guard)
//!    ├─ wait until every kind it needs is listed (a refused list fails it)
//!    └─ rekey: the controllers that gained rules, from the caches listed before
//!  Registered dropped (its stream ended) ─► Watches::unregister ─► apply
//!
//!  apply: the effective configuration ─► a new Watching snapshot; a cache whose kind stays
//!  in the same mode is carried over (not listed again); a new kind, or a kind whose mode
//!  changed, gets a new cache and informer; a kind no one needs has its informer stopped
//!  and its cache dropped
//! ```
//!
//! Registrations are rare (a reconciler's start) and every change is a few map operations,
//! so one lock serializes them; the end of a registration unregisters in `Drop`, which
//! cannot wait for a task.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use switchyard_k8s::{
    Client,
    kube::{self, api::GroupVersionKind, discovery},
};
use switchyard_queue_client::{Enqueuer, Priority};
use switchyard_runtime::{Drain, Spawner, TaskHandle};
use switchyard_watcher_core::{
    Config, Gvk, Mapper, Registration, RegistrationId, Watches, WatchesError,
};
use tracing::{info, warn};

use crate::{
    cache::{Caches, ResourceCache, Watching},
    informer::Informer,
    metrics::{ResourceLabels, WatcherMetrics},
};

#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error(transparent)]
    Watches(#[from] WatchesError),
    #[error("{field}: {gvk} is not served by the apiserver ({reason})")]
    UnknownKind {
        field: String,
        gvk: Gvk,
        reason: String,
    },
    #[error("{field}: discovery of {gvk} failed: {reason}")]
    Discovery {
        field: String,
        gvk: Gvk,
        reason: String,
    },
    #[error("{field}: {gvk} cannot be listed: {reason}")]
    Refused {
        field: String,
        gvk: Gvk,
        reason: String,
    },
    #[error("the watcher is shutting down")]
    ShuttingDown,
}

/// What every informer is given.
#[derive(Clone)]
pub struct InformerDeps {
    pub client: Client,
    pub enqueuer: Arc<Enqueuer>,
    pub metrics: WatcherMetrics,
    pub streaming_lists: bool,
}

impl std::fmt::Debug for InformerDeps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InformerDeps")
            .field("streaming_lists", &self.streaming_lists)
            .finish_non_exhaustive()
    }
}

struct Running {
    cache: Arc<ResourceCache>,
    _informer: TaskHandle,
}

struct State {
    watches: Watches,
    running: HashMap<Gvk, Running>,
}

pub struct Informers {
    caches: Arc<Caches>,
    deps: InformerDeps,
    spawner: Spawner,
    state: Mutex<State>,
}

impl std::fmt::Debug for Informers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Informers").finish_non_exhaustive()
    }
}

impl Informers {
    /// Starts the informers of the configuration file (`source` names it in errors).
    pub fn start(
        file: Config,
        source: String,
        caches: Arc<Caches>,
        deps: InformerDeps,
        spawner: Spawner,
    ) -> Arc<Self> {
        let informers = Arc::new(Self {
            caches,
            deps,
            spawner,
            state: Mutex::new(State {
                watches: Watches::new(file, source),
                running: HashMap::new(),
            }),
        });
        informers.apply(&mut informers.lock());
        informers
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `registration` once its kinds are listed; the registration lasts as long
    /// as the returned guard.
    pub async fn register(
        self: &Arc<Self>,
        registration: Registration,
        drain: &Drain,
    ) -> Result<Registered, RegisterError> {
        self.lock().watches.check(&registration)?;
        let kinds: Vec<(Gvk, String)> = registration
            .kinds()
            .map(|(gvk, field)| (gvk.clone(), field.to_owned()))
            .collect();
        let now = self.caches.current();
        for (gvk, field) in &kinds {
            if !now.find(gvk).is_some_and(|c| c.is_synced()) {
                self.discover(gvk, field).await?;
            }
        }
        let registrant = registration.registrant().to_owned();
        let controllers: Vec<String> = registration.controllers().map(str::to_owned).collect();
        let (registered, change, fresh) = {
            let mut state = self.lock();
            let (id, change) = state.watches.register(registration)?;
            let fresh = self.apply(&mut state);
            let registered = Registered {
                informers: self.clone(),
                id,
                registrant: registrant.clone(),
                controllers: controllers.clone(),
                kinds: kinds.iter().map(|(gvk, _)| gvk.clone()).collect(),
            };
            (registered, change, fresh)
        };
        info!(
            %registrant,
            ?controllers,
            added = ?change.added.iter().map(Gvk::to_string).collect::<Vec<_>>(),
            replaced = ?change.replaced.iter().map(Gvk::to_string).collect::<Vec<_>>(),
            "registering"
        );
        // From here on, an error or the caller going away drops `registered`: unregistered.
        wait_listed(&self.caches, &kinds, true, drain).await?;
        if !change.rekeyed.is_empty() {
            self.rekey(&change.rekeyed, &fresh).await;
        }
        for controller in &controllers {
            info!(%registrant, %controller, "registered");
        }
        Ok(registered)
    }

    /// Whether the apiserver serves `gvk`: asked once, not retried (a registration fails
    /// fast, unlike the configuration file's kinds, which may come with a CRD later).
    async fn discover(&self, gvk: &Gvk, field: &str) -> Result<(), RegisterError> {
        let wanted = GroupVersionKind::gvk(&gvk.group, &gvk.version, &gvk.kind);
        match discovery::pinned_kind(&self.deps.client, &wanted).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Discovery(_)) => Err(RegisterError::UnknownKind {
                field: field.to_owned(),
                gvk: gvk.clone(),
                reason: format!("{} has no kind {}", gvk.api_version(), gvk.kind),
            }),
            Err(kube::Error::Api(status)) if status.code == 404 => {
                Err(RegisterError::UnknownKind {
                    field: field.to_owned(),
                    gvk: gvk.clone(),
                    reason: format!("no group version {}", gvk.api_version()),
                })
            }
            Err(error) => Err(RegisterError::Discovery {
                field: field.to_owned(),
                gvk: gvk.clone(),
                reason: error.to_string(),
            }),
        }
    }

    /// Keys every object cached before this registration for the controllers that gained
    /// rules (a cache started for it keyed every object in its first list), at low
    /// priority: the first list of a registration keys every object, shared or not.
    async fn rekey(&self, controllers: &[String], fresh: &[Arc<ResourceCache>]) {
        let now = self.caches.current();
        let config = Config {
            rules: now
                .config
                .rules
                .iter()
                .filter(|r| controllers.contains(&r.controller))
                .cloned()
                .collect(),
            ..now.config.clone()
        };
        let mapper = Mapper::new(&config);
        let mut keys = now.keys(
            &mapper,
            |index| !fresh.iter().any(|f| Arc::ptr_eq(f, &now.resources[index])),
            None,
            self.caches.shard_count,
        );
        self.caches.peers.hold_back(&mut keys, |k| k);
        info!(
            ?controllers,
            keys = keys.len(),
            "keying cached objects for new rules"
        );
        self.deps
            .enqueuer
            .push(keys, Priority::Low, None, None)
            .await;
    }

    fn unregister(&self, id: RegistrationId, registrant: &str, controllers: &[String]) {
        let change = {
            let mut state = self.lock();
            let change = state.watches.unregister(id);
            self.apply(&mut state);
            change
        };
        for controller in controllers {
            info!(%registrant, %controller, "unregistered");
        }
        if !change.removed.is_empty() || !change.replaced.is_empty() {
            info!(
                %registrant,
                removed = ?change.removed.iter().map(Gvk::to_string).collect::<Vec<_>>(),
                replaced = ?change.replaced.iter().map(Gvk::to_string).collect::<Vec<_>>(),
                "watches changed"
            );
        }
    }

    /// Makes the running informers those of the effective configuration; returns the
    /// caches it started.
    fn apply(&self, state: &mut State) -> Vec<Arc<ResourceCache>> {
        let State { watches, running } = state;
        let metrics = &self.deps.metrics;
        let mut before = std::mem::take(running);
        let mut kept: HashMap<Gvk, Running> = HashMap::new();
        let mut fresh: Vec<Arc<ResourceCache>> = Vec::new();
        let watching = Watching::new(watches.effective().clone(), |resource| {
            match before.remove(&resource.gvk) {
                Some(old) if old.cache.resource.metadata_only == resource.metadata_only => {
                    let cache = old.cache.clone();
                    kept.insert(resource.gvk.clone(), old);
                    cache
                }
                replaced => {
                    // Stopped below, once the new snapshot no longer holds its cache.
                    if let Some(old) = replaced {
                        before.insert(resource.gvk.clone(), old);
                    }
                    let cache = Arc::new(ResourceCache::new(resource.clone()));
                    fresh.push(cache.clone());
                    cache
                }
            }
        });
        self.caches.publish(watching);
        for (gvk, stopped) in before {
            let labels = ResourceLabels {
                resource: gvk.to_string(),
            };
            metrics.informers.remove(&labels);
            metrics.cached_objects.remove(&labels);
            info!(resource = %gvk, metadata_only = stopped.cache.resource.metadata_only, "informer stopped");
            drop(stopped);
        }
        for cache in &fresh {
            let informer = Informer {
                client: self.deps.client.clone(),
                caches: self.caches.clone(),
                cache: cache.clone(),
                enqueuer: self.deps.enqueuer.clone(),
                metrics: metrics.clone(),
                streaming_lists: self.deps.streaming_lists,
            };
            // The cache outlives a restart of its informer: it relists into it, and objects
            // deleted meanwhile are found by the relist.
            let handle = self
                .spawner
                .spawn_restarting("informer", move |drain| informer.clone().run(drain));
            let gvk = cache.gvk().clone();
            metrics
                .informers
                .get_or_create(&ResourceLabels {
                    resource: gvk.to_string(),
                })
                .set(1);
            kept.insert(
                gvk,
                Running {
                    cache: cache.clone(),
                    _informer: handle,
                },
            );
        }
        *running = kept;
        metrics.registrations.set(watches.registrations() as i64);
        fresh
    }
}

/// One registration, for as long as it is held: dropping it unregisters.
#[derive(Debug)]
pub struct Registered {
    informers: Arc<Informers>,
    id: RegistrationId,
    registrant: String,
    controllers: Vec<String>,
    kinds: Vec<Gvk>,
}

impl Registered {
    /// Every kind the registration needs, listed and cached.
    pub fn kinds(&self) -> &[Gvk] {
        &self.kinds
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.informers
            .unregister(self.id, &self.registrant, &self.controllers);
    }
}

/// Waits until every kind of `kinds` (each with the field that names it) has finished its
/// initial list in the current snapshot, following the snapshot as it changes (a kind
/// whose informer is replaced is listed again). With `fail_on_refusal`, a list the
/// apiserver refuses ends the wait with that reason; otherwise it is waited out.
pub async fn wait_listed(
    caches: &Caches,
    kinds: &[(Gvk, String)],
    fail_on_refusal: bool,
    drain: &Drain,
) -> Result<(), RegisterError> {
    let mut snapshots = caches.subscribe();
    loop {
        let now = snapshots.borrow_and_update().clone();
        let pending = kinds.iter().find_map(|(gvk, field)| match now.find(gvk) {
            Some(cache) if cache.is_synced() => None,
            cache => Some((gvk, field, cache.cloned())),
        });
        let Some((gvk, field, cache)) = pending else {
            return Ok(());
        };
        let Some(cache) = cache else {
            // Not in this snapshot (yet): the next one has it.
            tokio::select! {
                changed = snapshots.changed() => if changed.is_err() {
                    return Err(RegisterError::ShuttingDown);
                },
                _ = drain.clone().signaled() => return Err(RegisterError::ShuttingDown),
            }
            continue;
        };
        let (mut synced, mut refused) = (cache.synced(), cache.refusals());
        if fail_on_refusal && let Some(reason) = refused.borrow_and_update().clone() {
            warn!(resource = %gvk, %reason, "a registration needs a kind the watcher cannot list");
            return Err(RegisterError::Refused {
                field: field.clone(),
                gvk: gvk.clone(),
                reason: reason.to_string(),
            });
        }
        // The cache holds both senders while `cache` is held: neither wait ends in an error.
        tokio::select! {
            _ = synced.wait_for(|s| *s) => {}
            _ = refused.changed(), if fail_on_refusal => {}
            changed = snapshots.changed() => if changed.is_err() {
                return Err(RegisterError::ShuttingDown);
            },
            _ = drain.clone().signaled() => return Err(RegisterError::ShuttingDown),
        }
    }
}
