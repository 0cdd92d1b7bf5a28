//! The caches of every watched resource, shared by the informers (writers) and the Cache,
//! Resync and Watches gRPC services (readers).
//!
//! What is watched changes while the watcher runs (registrations come and go), so the
//! caches and the rules that map their objects to keys are one snapshot, [`Watching`],
//! replaced as a whole on every change. A cache whose kind stays watched in the same mode
//! is carried into the next snapshot, so it is not listed again; its index may change, so
//! an informer looks its cache up in the current snapshot for every event.
//!
//! ```text
//!  Caches ── current: Watching { config, resources[i] ─► Arc<ResourceCache>, mapper }
//!               │ replaced by the informers' set (informers.rs) on every change
//!               └─► Cache API (find by kind), resync (keys), informers (index, mapper)
//! ```

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard},
};

use switchyard_watcher_core::{
    Config, ControllerRef, EventKind, Gvk, Mapper, Owners, ResourceConfig, Store, Summary, WorkKey,
    config::Namespaces, mapping::owner_selector,
};
use tokio::sync::watch;

use crate::{graph::GraphCache, peers::Peers};

/// One resource's cache.
#[derive(Debug)]
pub struct ResourceCache {
    pub resource: ResourceConfig,
    store: RwLock<Store>,
    /// The highest resourceVersion any stream of the resource reached outside a list: with
    /// one stream, what "at least resourceVersion R" reads wait for.
    resource_version: watch::Sender<u64>,
    /// The resource's watch streams, once its informer opened them.
    streams: OnceLock<Streams>,
    /// True once every stream of the resource finished its initial list.
    synced: watch::Sender<bool>,
    /// Why the apiserver refused the initial list (a kind the watcher may not list), while
    /// it does: registrations waiting for this cache fail with it rather than wait.
    refused: watch::Sender<Option<Arc<str>>>,
    /// Each object's `spec.selector` as last parsed, by namespace and name, with the
    /// resourceVersion it was parsed at: a kind that `mapBySelector` maps to is read for
    /// its selectors on every change of the selected kind, and is parsed again only when it
    /// changed.
    selectors: Mutex<Selectors>,
}

/// A selector as parsed from an object at a resourceVersion.
type Parsed = (u64, Option<Arc<switchyard_selector::Selector>>);
/// Parsed selectors by namespace and name.
type Selectors = HashMap<(Arc<str>, Arc<str>), Parsed>;

impl ResourceCache {
    pub fn new(resource: ResourceConfig) -> Self {
        Self {
            resource,
            store: RwLock::new(Store::default()),
            resource_version: watch::channel(0).0,
            streams: OnceLock::new(),
            synced: watch::channel(false).0,
            refused: watch::channel(None).0,
            selectors: Mutex::default(),
        }
    }

    /// The names of the objects in `namespace` whose `spec.selector` matches `labels`, each
    /// selector parsed again only when its object changed.
    pub fn selecting(&self, namespace: &str, labels: &Summary) -> Vec<String> {
        let store = self.read();
        let everything = switchyard_selector::Selector::default();
        let mut parsed = self
            .selectors
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut names = Vec::new();
        for (summary, json) in store.list_summarized(Some(namespace), None, &everything) {
            let key = (summary.namespace.clone(), summary.name.clone());
            let selector = match parsed.get(&key) {
                Some((rv, selector)) if *rv == summary.resource_version => selector.clone(),
                _ => {
                    let selector = serde_json::from_slice::<serde_json::Value>(json)
                        .ok()
                        .and_then(|owner| owner_selector(&owner))
                        .map(Arc::new);
                    parsed.insert(key, (summary.resource_version, selector.clone()));
                    selector
                }
            };
            if selector.is_some_and(|s| s.matches(labels)) {
                names.push(summary.name.to_string());
            }
        }
        // Selectors of objects gone from the cache are forgotten once they are as many as
        // the objects cached.
        if parsed.len() > 2 * store.len() + 64 {
            parsed.retain(|(namespace, name), _| store.summary(namespace, name).is_some());
        }
        names
    }

    pub fn read(&self) -> RwLockReadGuard<'_, Store> {
        self.store.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, Store> {
        self.store.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the streams the informer opened: `None` for one stream of every namespace,
    /// a namespace for each stream of one. Once: a cache keeps its informer.
    pub fn open_streams(&self, scopes: &[Option<String>]) {
        let streams = match scopes {
            [None] => Streams::One,
            scopes => Streams::PerNamespace(
                scopes
                    .iter()
                    .flatten()
                    .map(|namespace| (Arc::from(namespace.as_str()), watch::channel(0).0))
                    .collect(),
            ),
        };
        let _ = self.streams.set(streams);
    }

    /// Publishes that the stream of `scope` (a namespace, or `None` for every namespace)
    /// has every change up to `rv`, to readers waiting for one.
    pub fn publish_resource_version(&self, scope: Option<&str>, rv: u64) {
        raise(&self.resource_version, rv);
        if let (Some(namespace), Some(Streams::PerNamespace(streams))) = (scope, self.streams.get())
            && let Some(stream) = streams.get(namespace)
        {
            raise(stream, rv);
        }
    }

    /// The versions a read of `namespace` (empty: every namespace) waits on.
    pub fn fence(&self, namespace: &str) -> Fence {
        match self.streams.get() {
            None | Some(Streams::One) => Fence::Kind(self.resource_version.subscribe()),
            Some(Streams::PerNamespace(_)) if namespace.is_empty() => Fence::EveryNamespace,
            Some(Streams::PerNamespace(streams)) => match streams.get(namespace) {
                Some(stream) => Fence::Namespace(stream.subscribe()),
                None => Fence::NotWatched,
            },
        }
    }

    /// Marks the initial list done; false when it already was (a restarted informer).
    pub fn mark_synced(&self) -> bool {
        self.refused.send_replace(None);
        !self.synced.send_replace(true)
    }

    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    pub fn synced(&self) -> watch::Receiver<bool> {
        self.synced.subscribe()
    }

    /// Records why the apiserver refuses the initial list, until it is done.
    pub fn refuse(&self, reason: String) {
        if !self.is_synced() {
            self.refused.send_replace(Some(reason.into()));
        }
    }

    pub fn refusals(&self) -> watch::Receiver<Option<Arc<str>>> {
        self.refused.subscribe()
    }

    pub fn gvk(&self) -> &Gvk {
        &self.resource.gvk
    }
}

/// How a resource is watched.
#[derive(Debug)]
enum Streams {
    /// One stream carries every namespace (or the resource is cluster-scoped).
    One,
    /// One stream per included namespace, each with the resourceVersion it reached.
    PerNamespace(HashMap<Arc<str>, watch::Sender<u64>>),
}

/// What a read waits on for the versions it asks for.
#[derive(Debug)]
pub enum Fence {
    /// The resource's one stream: every change of the kind, in every namespace.
    Kind(watch::Receiver<u64>),
    /// The stream of the namespace read, one of several.
    Namespace(watch::Receiver<u64>),
    /// A read of every namespace, carried by several streams.
    EveryNamespace,
    /// A namespace no stream carries: nothing of it is cached, nothing to wait for.
    NotWatched,
}

fn raise(version: &watch::Sender<u64>, rv: u64) {
    version.send_if_modified(|current| {
        let newer = rv > *current;
        if newer {
            *current = rv;
        }
        newer
    });
}

/// What is watched now: every resource's cache, at its index in the configuration that the
/// configuration file and the registrations make together, and the rules of that
/// configuration.
#[derive(Debug)]
pub struct Watching {
    pub config: Config,
    pub resources: Vec<Arc<ResourceCache>>,
    pub mapper: Mapper,
}

impl Watching {
    /// `config`'s resources, each in the cache `cache_of` gives.
    pub fn new(
        config: Config,
        mut cache_of: impl FnMut(&ResourceConfig) -> Arc<ResourceCache>,
    ) -> Self {
        let resources = config.resources.iter().map(&mut cache_of).collect();
        Self {
            mapper: Mapper::new(&config),
            resources,
            config,
        }
    }

    pub fn find(&self, gvk: &Gvk) -> Option<&Arc<ResourceCache>> {
        self.resources.iter().find(|r| r.gvk() == gvk)
    }

    /// The index of this very cache (not another of the same kind), if it is current.
    pub fn index_of(&self, cache: &Arc<ResourceCache>) -> Option<usize> {
        self.resources.iter().position(|r| Arc::ptr_eq(r, cache))
    }

    pub fn watched(&self) -> String {
        let kinds: Vec<String> = self.resources.iter().map(|r| r.gvk().to_string()).collect();
        match kinds.is_empty() {
            true => "nothing".to_owned(),
            false => kinds.join(", "),
        }
    }

    /// The keys `mapper` (made from this snapshot's configuration, or part of it) gives
    /// every object cached in the resources `resource` accepts whose key falls in
    /// `shards` (every shard when `None`), as a resync maps them.
    pub fn keys(
        &self,
        mapper: &Mapper,
        resource: impl Fn(usize) -> bool,
        shards: Option<&HashSet<u32>>,
        shard_count: u32,
    ) -> Vec<WorkKey> {
        let mut keys = Vec::new();
        let mut scratch: Vec<WorkKey> = Vec::new();
        for (index, cache) in self.resources.iter().enumerate() {
            if !mapper.maps(index) || !resource(index) {
                continue;
            }
            // Copied out, so that `owns ... through` rules can read another cache meanwhile.
            let summaries: Vec<_> = cache.read().summaries().cloned().collect();
            for summary in &summaries {
                mapper.keys(index, EventKind::Sync, None, summary, self, &mut scratch);
                keys.extend(
                    scratch
                        .drain(..)
                        .filter(|k| shards.is_none_or(|s| s.contains(&k.shard(shard_count)))),
                );
            }
        }
        keys
    }
}

/// The watched resources' caches, now, and what stays the same while they change.
#[derive(Debug)]
pub struct Caches {
    current: watch::Sender<Arc<Watching>>,
    pub namespaces: Namespaces,
    pub shard_count: u32,
    /// The garbage collector's graph, when configured.
    pub graph: Option<Arc<GraphCache>>,
    /// Which controllers another controller manager also runs, read from the changes the
    /// informers take in; every key sent passes it ([`Peers::hold_back`]).
    pub peers: Peers,
}

impl Caches {
    /// Caches of nothing yet: the informers' set publishes what is watched.
    pub fn new(config: &Config, peers: Peers) -> Self {
        let empty = Config {
            resources: Vec::new(),
            rules: Vec::new(),
            ..config.clone()
        };
        Self {
            current: watch::channel(Arc::new(Watching {
                mapper: Mapper::new(&empty),
                resources: Vec::new(),
                config: empty,
            }))
            .0,
            namespaces: config.namespaces.clone(),
            shard_count: config.shard_count,
            graph: config
                .collector
                .clone()
                .map(|c| Arc::new(GraphCache::new(c, config.namespaces.clone()))),
            peers,
        }
    }

    /// What is watched now.
    pub fn current(&self) -> Arc<Watching> {
        self.current.borrow().clone()
    }

    /// Follows what is watched.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Watching>> {
        self.current.subscribe()
    }

    /// Replaces what is watched.
    pub fn publish(&self, watching: Watching) {
        self.current.send_replace(Arc::new(watching));
    }

    pub fn find(&self, gvk: &Gvk) -> Option<Arc<ResourceCache>> {
        self.current().find(gvk).cloned()
    }

    pub fn watched(&self) -> String {
        self.current().watched()
    }

    /// The keys of every cached object whose key falls in `shards` (every shard when
    /// `None`), as a resync maps them.
    pub fn keys(&self, shards: Option<&HashSet<u32>>) -> Vec<WorkKey> {
        let now = self.current();
        let mut keys = now.keys(&now.mapper, |_| true, shards, self.shard_count);
        if let Some(graph) = &self.graph {
            keys.extend(
                graph.keys(|k| shards.is_none_or(|s| s.contains(&k.shard(self.shard_count)))),
            );
        }
        keys.sort_unstable();
        keys.dedup();
        keys
    }
}

/// `owns ... through` rules look the object between up in its cache; `owns` rules look up the
/// owners that may adopt an orphan in theirs.
impl Owners for Watching {
    fn controller(&self, resource: usize, namespace: &str, name: &str) -> Option<ControllerRef> {
        let cache = self.resources.get(resource)?;
        let store = cache.read();
        store
            .summary(namespace, name)?
            .controller
            .as_deref()
            .cloned()
    }

    /// Reads every cached object of `resource` in the namespace: orphans ask (rare: a Pod is
    /// made with its controller reference), and every change of a kind a `mapBySelector`
    /// rule maps, whose selecting kind has few objects per namespace (PodDisruptionBudgets).
    fn selecting(&self, resource: usize, namespace: &str, orphan: &Summary) -> Vec<String> {
        self.resources
            .get(resource)
            .map(|cache| cache.selecting(namespace, orphan))
            .unwrap_or_default()
    }

    /// Reads every cached object of `resource`: at a Node's creation, deletion or new labels
    /// or taints, for a kind with few objects (DaemonSets).
    fn each_object(&self, resource: usize, each: &mut dyn FnMut(&[u8])) {
        let Some(cache) = self.resources.get(resource) else {
            return;
        };
        let store = cache.read();
        let everything = switchyard_selector::Selector::default();
        for json in store.list(None, None, &everything) {
            each(json);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn service(cache: &ResourceCache, name: &str, rv: &str, selector: serde_json::Value) {
        let json = serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv},
            "spec": {"selector": selector},
        });
        let summary = Summary::new("ns", name, rv, None, [], [], None);
        cache
            .write()
            .apply(summary, serde_json::to_vec(&json).unwrap());
    }

    fn pod(app: &str) -> Summary {
        Summary::new("ns", "p", "1", None, [("app", app)], [], None)
    }

    #[test]
    fn selecting_reads_each_selector_again_only_when_its_object_changed() {
        let cache = ResourceCache::new(ResourceConfig {
            gvk: Gvk::parse("v1", "Service").unwrap(),
            metadata_only: false,
        });
        service(&cache, "web", "10", serde_json::json!({"app": "web"}));
        service(&cache, "all", "11", serde_json::json!({}));
        service(&cache, "none", "12", serde_json::Value::Null);
        assert_eq!(cache.selecting("ns", &pod("web")), ["web"]);
        assert_eq!(cache.selecting("ns", &pod("db")), Vec::<String>::new());
        assert_eq!(cache.selecting("other", &pod("web")), Vec::<String>::new());
        // The selector changes with its object.
        service(&cache, "web", "13", serde_json::json!({"app": "db"}));
        assert_eq!(cache.selecting("ns", &pod("web")), Vec::<String>::new());
        assert_eq!(cache.selecting("ns", &pod("db")), ["web"]);
        // Gone from the cache: forgotten once enough are.
        cache.write().delete("ns", "web", 14);
        assert_eq!(cache.selecting("ns", &pod("db")), Vec::<String>::new());
        for i in 0..100 {
            let name = format!("s{i}");
            service(
                &cache,
                &name,
                &(20 + i).to_string(),
                serde_json::json!({"n": name}),
            );
            cache.write().delete("ns", &name, 200 + i);
            cache.selecting("ns", &pod("db"));
        }
        let remembered = cache.selectors.lock().unwrap().len();
        assert!(remembered <= 2 * cache.read().len() + 65, "{remembered}");
    }
}
