//! The garbage collector's graph, kept up to date: every resource discovery lists with
//! `list`, `watch` and `delete` (minus the configured ignore list), watched through the
//! metadata API, found again every rediscovery period and whenever a CRD or an APIService
//! changes, as kube-controller-manager's `GraphBuilder` monitors do.
//!
//! ```text
//!  discovery (aggregated, preferred versions) ─► one metadata informer per deletable resource
//!     ▲  every 30 s, and on CRD / APIService events          │ Node (owners, deletion state)
//!     └──────────────────────────────────────────────────────┤
//!                                                            ▼
//!                                Graph (core) ─► keys (collector, namespace, uid) ─► queue
//! ```
//!
//! A group version whose discovery fails keeps the informers it had (its resources are not
//! taken for gone), is logged and counted, and does not stop the others.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard},
    time::SystemTime,
};

use futures::StreamExt;
use switchyard_k8s::{
    Api, Client, ObjectMeta,
    discovery::{self, ServedResource},
    kube::{
        api::{DynamicObject, PartialObjectMeta},
        runtime::{WatchStreamExt, watcher},
    },
};
use switchyard_queue_client::{Enqueuer, Priority};
use switchyard_runtime::Drain;
use switchyard_watcher_core::{
    CollectorConfig, WorkKey,
    config::Namespaces,
    graph::{FOREGROUND_FINALIZER, Graph, Node, ORPHAN_FINALIZER, Owner, ResourceId},
};
use tokio::{
    sync::{Notify, watch},
    task::{AbortHandle, JoinSet},
};
use tracing::{info, warn};

use crate::{
    metrics::{GroupVersionLabels, WatcherMetrics},
    sync_barrier::SyncBarrier,
};

/// Resources whose changes may add or remove resources: a change rediscovers at once.
const DISCOVERY_SOURCES: [(&str, &str); 2] = [
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    ("apiregistration.k8s.io", "apiservices"),
];

/// The graph with what the Cache API needs to answer from it.
#[derive(Debug)]
pub struct GraphCache {
    pub config: CollectorConfig,
    pub controller: Arc<str>,
    namespaces: Namespaces,
    graph: RwLock<Graph>,
    /// Every resource ever watched, by the id its nodes carry. Ids are stable per group and
    /// resource, so that an informer restarted after its task failed relists into its own
    /// nodes.
    resources: RwLock<HashMap<ResourceId, ServedResource>>,
    ids: Mutex<HashMap<(String, String), ResourceId>>,
    synced: watch::Sender<bool>,
}

impl GraphCache {
    pub fn new(config: CollectorConfig, namespaces: Namespaces) -> Self {
        Self {
            controller: config.controller.as_str().into(),
            config,
            namespaces,
            graph: RwLock::default(),
            resources: RwLock::default(),
            ids: Mutex::default(),
            synced: watch::channel(false).0,
        }
    }

    pub fn read(&self) -> RwLockReadGuard<'_, Graph> {
        self.graph.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Graph> {
        self.graph.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The resource behind a node's id.
    pub fn resource(&self, id: ResourceId) -> Option<ServedResource> {
        self.resources
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .cloned()
    }

    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    fn id(&self, resource: &ServedResource) -> ResourceId {
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        let next = ids.len() as ResourceId;
        let id = *ids
            .entry((
                resource.resource.group.clone(),
                resource.resource.plural.clone(),
            ))
            .or_insert(next);
        self.resources
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, resource.clone());
        id
    }

    /// The keys of every node the collector has something to decide about, in the shards
    /// `keep` accepts (a resync).
    pub fn keys(&self, keep: impl FnMut(&WorkKey) -> bool) -> Vec<WorkKey> {
        self.read().resync_keys(&self.controller, keep)
    }
}

/// What the graph's tasks share.
#[derive(Clone)]
pub struct GraphInformers {
    pub client: Client,
    pub cache: Arc<GraphCache>,
    pub enqueuer: Arc<Enqueuer>,
    pub metrics: WatcherMetrics,
}

impl std::fmt::Debug for GraphInformers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphInformers")
            .field("controller", &self.cache.controller)
            .finish_non_exhaustive()
    }
}

struct Running {
    id: ResourceId,
    abort: AbortHandle,
}

impl GraphInformers {
    /// Discovers, starts and stops informers until the drain; opens `synced` once the first
    /// discovery's resources have all been listed.
    pub async fn run(self, synced: Arc<SyncBarrier>, drain: Drain) {
        let rediscover = Arc::new(Notify::new());
        let mut tasks = JoinSet::new();
        let mut running: HashMap<(String, String), Running> = HashMap::new();
        let mut first_round = true;
        loop {
            match discovery::preferred_resources(&self.client).await {
                Err(error) => warn!(%error, "discovery of deletable resources failed; retrying"),
                Ok(found) => {
                    for failure in &found.failures {
                        self.metrics
                            .discovery_failures
                            .get_or_create(&GroupVersionLabels {
                                group_version: failure.group_version.clone(),
                            })
                            .inc();
                        warn!(group_version = %failure.group_version, reason = %failure.reason, "discovery failed for this group version; its resources keep their informers");
                    }
                    let wanted: HashMap<(String, String), ServedResource> = found
                        .resources
                        .into_iter()
                        .filter(|r| {
                            ["list", "watch", "delete"].iter().all(|v| r.supports(v))
                                && !self
                                    .cache
                                    .config
                                    .ignores(&r.resource.group, &r.resource.plural)
                        })
                        .map(|r| ((r.resource.group.clone(), r.resource.plural.clone()), r))
                        .collect();
                    let failed = |group: &str, version_of: &ServedResource| {
                        found.failures.iter().any(|f| {
                            f.group_version == version_of.resource.api_version
                                || f.group_version.split_once('/').map(|(g, _)| g) == Some(group)
                        })
                    };
                    let gone: Vec<(String, String)> = running
                        .keys()
                        .filter(|k| !wanted.contains_key(*k))
                        .filter(|k| {
                            self.cache
                                .resource(running[*k].id)
                                .is_none_or(|r| !failed(&k.0, &r))
                        })
                        .cloned()
                        .collect();
                    for key in gone {
                        let Running { id, abort } = running.remove(&key).expect("listed above");
                        abort.abort();
                        self.drop_resource(id, &key).await;
                    }
                    let mut listed = Vec::new();
                    for (key, resource) in wanted {
                        if running.contains_key(&key) {
                            continue;
                        }
                        let id = self.cache.id(&resource);
                        let (done, was_listed) = tokio::sync::oneshot::channel();
                        listed.push(was_listed);
                        info!(resource = %resource.group_resource(), version = %resource.resource.version, "collector graph watching");
                        let abort = tasks.spawn(self.clone().watch(
                            id,
                            resource,
                            rediscover.clone(),
                            done,
                            drain.clone(),
                        ));
                        running.insert(key, Running { id, abort });
                    }
                    self.metrics.graph_resources.set(running.len() as i64);
                    if first_round {
                        first_round = false;
                        let (cache, synced) = (self.cache.clone(), synced.clone());
                        tasks.spawn(async move {
                            for wait in listed {
                                // A resource dropped before its first list is not waited for.
                                let _ = wait.await;
                            }
                            if !cache.synced.send_replace(true) {
                                info!(
                                    objects = cache.read().len(),
                                    "collector graph: initial lists done"
                                );
                                synced.done();
                            }
                        });
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.cache.config.rediscovery_period) => {}
                _ = rediscover.notified() => {}
                _ = drain.clone().signaled() => return,
            }
            // Reap finished informers (they end only on drain or when aborted).
            while tasks.try_join_next().is_some() {}
        }
    }

    /// Removes a resource's nodes (a CRD deleted) and keys what their removal affects.
    async fn drop_resource(&self, id: ResourceId, key: &(String, String)) {
        let mut keys = Vec::new();
        let removed = {
            let mut graph = self.cache.write();
            let removed = graph.drop_resource(id);
            for node in &removed {
                graph.keys_for(&self.cache.controller, Some(node), None, &mut keys);
            }
            removed.len()
        };
        info!(group = %key.0, resource = %key.1, removed, "collector graph: resource no longer served");
        self.after_change();
        self.enqueuer.push(keys, Priority::Normal, None, None).await;
    }

    async fn watch(
        self,
        id: ResourceId,
        resource: ServedResource,
        rediscover: Arc<Notify>,
        listed: tokio::sync::oneshot::Sender<()>,
        drain: Drain,
    ) {
        // `Api<PartialObjectMeta<_>>` lists and watches through the metadata API
        // (`as=PartialObjectMetadata`): only metadata crosses the wire.
        let api: Api<PartialObjectMeta<DynamicObject>> =
            Api::all_with(self.client.clone(), &resource.resource);
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let source = DISCOVERY_SOURCES.contains(&(
            resource.resource.group.as_str(),
            resource.resource.plural.as_str(),
        ));
        let mut listed = Some(listed);
        let mut keys = Vec::new();
        loop {
            let event = tokio::select! {
                event = events.next() => match event {
                    Some(event) => event,
                    None => return,
                },
                _ = drain.clone().signaled() => return,
            };
            let event = match event {
                Ok(event) => event,
                Err(error) => {
                    warn!(resource = %resource.group_resource(), %error, "collector graph: watch failed; retrying with backoff");
                    continue;
                }
            };
            #[cfg(feature = "fault-injection")]
            if let Some(namespace) = hold::namespace_of(&event) {
                tokio::select! {
                    () = hold::until_released(&resource.resource.group, &resource.resource.plural, namespace) => {}
                    _ = drain.clone().signaled() => return,
                }
            }
            // When the change reached this watcher, handed on with its keys.
            let received = SystemTime::now();
            let first_list = listed.is_some();
            let priority = {
                let mut graph = self.cache.write();
                match event {
                    watcher::Event::Init => {
                        graph.begin_relist(id);
                        continue;
                    }
                    watcher::Event::InitApply(object) => {
                        self.apply(&mut graph, id, object, &mut keys);
                        if first_list {
                            Priority::Low
                        } else {
                            Priority::Normal
                        }
                    }
                    watcher::Event::InitDone => {
                        for old in graph.finish_relist(id) {
                            graph.keys_for(&self.cache.controller, Some(&old), None, &mut keys);
                        }
                        if let Some(done) = listed.take() {
                            let _ = done.send(());
                        }
                        Priority::Normal
                    }
                    watcher::Event::Apply(object) => {
                        self.apply(&mut graph, id, object, &mut keys);
                        if source {
                            rediscover.notify_one();
                        }
                        Priority::Normal
                    }
                    watcher::Event::Delete(object) => {
                        if let Some(uid) = object.metadata.uid.as_deref()
                            && let Some(old) = graph.delete(uid)
                        {
                            graph.keys_for(&self.cache.controller, Some(&old), None, &mut keys);
                        }
                        if source {
                            rediscover.notify_one();
                        }
                        Priority::Normal
                    }
                }
            };
            self.after_change();
            let observed_at = (priority == Priority::Normal).then_some(received);
            self.enqueuer
                .push(keys.drain(..), priority, None, observed_at)
                .await;
        }
    }

    fn apply(
        &self,
        graph: &mut Graph,
        id: ResourceId,
        object: PartialObjectMeta<DynamicObject>,
        keys: &mut Vec<WorkKey>,
    ) {
        let meta = &object.metadata;
        let namespace = meta.namespace.as_deref().unwrap_or_default();
        if !self.cache.namespaces.admits(namespace) {
            return;
        }
        let Some(node) = node_of(id, graph.namespace(namespace), meta) else {
            return;
        };
        let uid = node.uid.clone();
        let old = graph.apply(node);
        let new = graph.node(&uid);
        graph.keys_for(&self.cache.controller, old.as_ref(), new, keys);
    }

    fn after_change(&self) {
        self.metrics
            .graph_objects
            .set(self.cache.read().len() as i64);
    }
}

/// The node of an object's metadata; `None` without a UID (never from the apiserver).
pub fn node_of(resource: ResourceId, namespace: Arc<str>, meta: &ObjectMeta) -> Option<Node> {
    let uid = meta.uid.as_deref().filter(|u| !u.is_empty())?;
    let finalizers = meta.finalizers.iter().flatten();
    let (mut foreground, mut orphan) = (false, false);
    for finalizer in finalizers {
        foreground |= finalizer == FOREGROUND_FINALIZER;
        orphan |= finalizer == ORPHAN_FINALIZER;
    }
    Some(Node {
        resource,
        namespace,
        name: meta.name.as_deref().unwrap_or_default().into(),
        uid: uid.into(),
        resource_version: meta
            .resource_version
            .as_deref()
            .and_then(|rv| rv.parse().ok())
            .unwrap_or(0),
        owners: meta
            .owner_references
            .iter()
            .flatten()
            .map(|o| Owner {
                api_version: o.api_version.as_str().into(),
                kind: o.kind.as_str().into(),
                name: o.name.as_str().into(),
                uid: o.uid.as_str().into(),
                controller: o.controller == Some(true),
                block_owner_deletion: o.block_owner_deletion == Some(true),
            })
            .collect(),
        deleting: meta.deletion_timestamp.is_some(),
        foreground,
        orphan,
    })
}

/// Test builds only (the `fault-injection` feature, never in a release binary): hold one
/// resource's graph events of one namespace back, as a watch stream that lags behind the
/// others would, so that a test can widen the window in which the graph is stale.
#[cfg(feature = "fault-injection")]
pub mod hold {
    use std::sync::{
        LazyLock,
        atomic::{AtomicU64, Ordering},
    };

    use switchyard_k8s::kube::{
        api::{DynamicObject, PartialObjectMeta},
        runtime::watcher,
    };
    use tokio::sync::watch;

    /// The holds in force: (id, group, resource, namespace).
    type Held = Vec<(u64, String, String, String)>;

    static HELD: LazyLock<watch::Sender<Held>> = LazyLock::new(|| watch::Sender::new(Vec::new()));
    static NEXT: AtomicU64 = AtomicU64::new(0);

    /// While this lives, every graph informer of this process stops at the first event of
    /// `group`/`resource` in `namespace` (and so holds back those that follow it).
    #[derive(Debug)]
    #[must_use = "the events flow again when the hold is dropped"]
    pub struct Hold(u64);

    /// Holds `group`/`resource` events of `namespace` back until the returned hold drops.
    pub fn events(group: &str, resource: &str, namespace: &str) -> Hold {
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        HELD.send_modify(|held| {
            held.push((id, group.into(), resource.into(), namespace.into()));
        });
        Hold(id)
    }

    impl Drop for Hold {
        fn drop(&mut self) {
            HELD.send_modify(|held| held.retain(|(id, ..)| *id != self.0));
        }
    }

    pub(super) fn namespace_of(
        event: &watcher::Event<PartialObjectMeta<DynamicObject>>,
    ) -> Option<&str> {
        match event {
            watcher::Event::Apply(object)
            | watcher::Event::Delete(object)
            | watcher::Event::InitApply(object) => object.metadata.namespace.as_deref(),
            watcher::Event::Init | watcher::Event::InitDone => None,
        }
    }

    pub(super) async fn until_released(group: &str, resource: &str, namespace: &str) {
        let mut held = HELD.subscribe();
        // The sender is static: it never closes.
        let _ = held
            .wait_for(|held| {
                !held
                    .iter()
                    .any(|(_, g, r, n)| g == group && r == resource && n == namespace)
            })
            .await;
    }
}
