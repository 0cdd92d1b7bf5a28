//! The caches of every watched resource, shared by the informers (writers) and the Cache and
//! Resync gRPC services (readers).

use std::{
    collections::HashSet,
    sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard},
};

use switchyard_watcher_core::{
    Config, ControllerRef, EventKind, Gvk, Mapper, Owners, ResourceConfig, Store, WorkKey,
    config::Namespaces,
};
use tokio::sync::watch;

use crate::graph::GraphCache;

/// One resource's cache.
#[derive(Debug)]
pub struct ResourceCache {
    pub index: usize,
    pub resource: ResourceConfig,
    store: RwLock<Store>,
    /// The store's resourceVersion, for "at least resourceVersion R" reads.
    resource_version: watch::Sender<u64>,
    /// True once every stream of the resource finished its initial list.
    synced: watch::Sender<bool>,
}

impl ResourceCache {
    pub fn read(&self) -> RwLockReadGuard<'_, Store> {
        self.store.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, Store> {
        self.store.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Publishes the store's resourceVersion to readers waiting for one.
    pub fn publish_resource_version(&self, rv: u64) {
        self.resource_version.send_if_modified(|current| {
            let newer = rv > *current;
            if newer {
                *current = rv;
            }
            newer
        });
    }

    pub fn resource_versions(&self) -> watch::Receiver<u64> {
        self.resource_version.subscribe()
    }

    /// Marks the initial list done; false when it already was (a restarted informer).
    pub fn mark_synced(&self) -> bool {
        !self.synced.send_replace(true)
    }

    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    pub fn gvk(&self) -> &Gvk {
        &self.resource.gvk
    }
}

/// Every resource's cache, with the rules that turn their objects into keys.
#[derive(Debug)]
pub struct Caches {
    pub resources: Vec<Arc<ResourceCache>>,
    pub mapper: Mapper,
    pub namespaces: Namespaces,
    pub shard_count: u32,
    /// The garbage collector's graph, when configured.
    pub graph: Option<Arc<GraphCache>>,
}

impl Caches {
    pub fn new(config: &Config) -> Self {
        let resources = config
            .resources
            .iter()
            .enumerate()
            .map(|(index, resource)| {
                Arc::new(ResourceCache {
                    index,
                    resource: resource.clone(),
                    store: RwLock::new(Store::default()),
                    resource_version: watch::channel(0).0,
                    synced: watch::channel(false).0,
                })
            })
            .collect();
        Self {
            resources,
            mapper: Mapper::new(config),
            namespaces: config.namespaces.clone(),
            shard_count: config.shard_count,
            graph: config
                .collector
                .clone()
                .map(|c| Arc::new(GraphCache::new(c, config.namespaces.clone()))),
        }
    }

    pub fn find(&self, gvk: &Gvk) -> Option<&Arc<ResourceCache>> {
        self.resources.iter().find(|r| r.gvk() == gvk)
    }

    pub fn watched(&self) -> String {
        let kinds: Vec<String> = self.resources.iter().map(|r| r.gvk().to_string()).collect();
        kinds.join(", ")
    }

    /// The keys of every cached object whose key falls in `shards` (every shard when
    /// `None`), as a resync maps them.
    pub fn keys(&self, shards: Option<&HashSet<u32>>) -> Vec<WorkKey> {
        let mut keys = Vec::new();
        let mut scratch = Vec::new();
        for cache in &self.resources {
            if !self.mapper.maps(cache.index) {
                continue;
            }
            // Copied out, so that `owns ... through` rules can read another cache meanwhile.
            let summaries: Vec<_> = cache.read().summaries().cloned().collect();
            for summary in &summaries {
                self.mapper.keys(
                    cache.index,
                    EventKind::Sync,
                    None,
                    summary,
                    self,
                    &mut scratch,
                );
                keys.extend(
                    scratch
                        .drain(..)
                        .filter(|k| shards.is_none_or(|s| s.contains(&k.shard(self.shard_count)))),
                );
            }
        }
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

/// `owns ... through` rules look the object between up in its cache.
impl Owners for Caches {
    fn controller(&self, resource: usize, namespace: &str, name: &str) -> Option<ControllerRef> {
        let cache = self.resources.get(resource)?;
        let store = cache.read();
        store
            .summary(namespace, name)?
            .controller
            .as_deref()
            .cloned()
    }
}
