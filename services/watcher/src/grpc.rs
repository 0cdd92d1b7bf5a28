//! The gRPC edge: the Cache API for reconcilers (and, in
//! [`crate::watches`], the watches reconcilers register). Requests are validated here
//! (errors name the field), answered from the caches, and converted back. [`ApiError`]
//! (`crate::error`) is the one place a [`Status`] is made.

use std::{
    collections::HashSet,
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::Stream;
use switchyard_proto::{
    MAX_CACHE_MESSAGE_BYTES,
    common::v1::GroupVersionKind,
    watcher::v1::{
        Freshness, GetGraphNodeRequest, GetGraphNodeResponse, GetRequest, GetResponse, GraphNode,
        ListRequest, ListResponse, OwnerReference, cache_server,
    },
};
use switchyard_queue_client::{Enqueuer, Priority};
use switchyard_runtime::authz::Caller;
use switchyard_selector::Selector;
use switchyard_watcher_core::{Config, Objects, graph::Node};
use tonic::{Request, Response, Status};
use tracing::info;

use crate::{
    cache::{Caches, Fence, ResourceCache},
    error::{ApiError, invalid},
    graph::GraphCache,
    metrics::{ResourceLabels, ResyncLabels, WatcherMetrics},
};

/// Bytes of objects per List response message: a quarter of gRPC's default 4 MiB limit, so
/// that a client with the default decodes any message made of objects that fit the
/// apiserver's own limit (etcd's 1.5 MiB request size); one larger object goes alone, up to
/// [`MAX_CACHE_MESSAGE_BYTES`].
const LIST_MESSAGE_BYTES: usize = 1024 * 1024;
/// How long a read waits for its minimum resourceVersion when the request does not say.
const DEFAULT_WAIT: Duration = Duration::from_secs(5);
/// The longest a read may wait for its minimum resourceVersion.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// Longer than any UID the apiserver hands out (36 characters), short enough to refuse junk.
const MAX_UID_LEN: usize = 128;

#[derive(Clone, Debug)]
pub struct CacheService {
    caches: Arc<Caches>,
    metrics: WatcherMetrics,
    /// Who may read which kinds: the file's, and each service account's grants.
    config: Arc<Config>,
}

impl CacheService {
    pub fn new(caches: Arc<Caches>, metrics: WatcherMetrics, config: Arc<Config>) -> Self {
        Self {
            caches,
            metrics,
            config,
        }
    }

    pub fn into_server(self) -> cache_server::CacheServer<Self> {
        cache_server::CacheServer::new(self).max_encoding_message_size(MAX_CACHE_MESSAGE_BYTES)
    }

    /// The cache of the kind asked for, and how much of its objects the caller may read.
    fn resource(
        &self,
        gvk: Option<&GroupVersionKind>,
        caller: Option<&Caller>,
    ) -> Result<(Arc<ResourceCache>, Objects), ApiError> {
        let gvk = gvk.ok_or_else(|| invalid("gvk", "required"))?;
        if gvk.version.is_empty() || gvk.kind.is_empty() {
            return Err(invalid("gvk", "version and kind are required"));
        }
        let wanted = crate::watches::checked_gvk("gvk", gvk.clone())?;
        // Without identities (plaintext, for development) nothing is checked.
        let objects = match caller {
            None => Objects::Full,
            Some(caller) => {
                let account = &caller.identity.service_account;
                self.config.access(account, &wanted).ok_or_else(|| {
                    ApiError::Denied(format!(
                        "gvk: {wanted} is neither in the watcher's configuration nor granted to \
                         service account {account:?} (registrations)"
                    ))
                })?
            }
        };
        match self.caches.find(&wanted) {
            Some(cache) => Ok((cache, objects)),
            // Granted to the caller and watched for none of its registrations now: after a
            // restart of this watcher, until the reconcilers have registered again. A retry
            // (or the other watcher replica) may answer.
            None if caller.is_some() => Err(ApiError::NotRegistered(wanted)),
            None => Err(ApiError::NotWatched {
                watched: self.caches.watched(),
                gvk: wanted,
            }),
        }
    }
}

/// Waits until `cache` has finished its initial list and reached the requested
/// resourceVersions for a read of `namespace` (empty: every namespace), within the request's
/// (capped) wait. A read that asks for a version its stream can order counts its wait in
/// `switchyard_cache_read_wait_seconds`, whether it got the version or gave up.
async fn fresh(
    cache: &ResourceCache,
    namespace: &str,
    freshness: Option<Freshness>,
    metrics: &WatcherMetrics,
) -> Result<(), ApiError> {
    if !cache.is_synced() {
        return Err(ApiError::NotSynced(cache.gvk().clone()));
    }
    let Some(Freshness {
        min_resource_version,
        max_wait,
        kind_min_resource_version,
    }) = freshness
    else {
        return Ok(());
    };
    let own = version("freshness.min_resource_version", &min_resource_version)?;
    let kind = version(
        "freshness.kind_min_resource_version",
        &kind_min_resource_version,
    )?;
    let wait = match max_wait {
        None => DEFAULT_WAIT,
        Some(d) => switchyard_proto::duration(d)
            .ok_or_else(|| invalid("freshness.max_wait", "must not be negative"))?,
    }
    .min(MAX_WAIT);
    // A stream of one namespace cannot order a version of the kind's other namespaces:
    // only the kind's one stream waits for `kind`.
    let (mut versions, wanted, stream) = match cache.fence(namespace) {
        Fence::Kind(versions) => (versions, own.max(kind), None),
        Fence::Namespace(versions) => (versions, own, Some(namespace.into())),
        Fence::EveryNamespace if own.is_some() => {
            return Err(ApiError::EveryNamespace(cache.gvk().clone()));
        }
        Fence::EveryNamespace | Fence::NotWatched => return Ok(()),
    };
    let Some(wanted) = wanted else {
        return Ok(());
    };
    let start = Instant::now();
    let reached = tokio::time::timeout(wait, versions.wait_for(|rv| *rv >= wanted))
        .await
        .is_ok_and(|r| r.is_ok());
    metrics
        .read_wait
        .get_or_create(&ResourceLabels {
            resource: cache.gvk().to_string(),
        })
        .observe(start.elapsed().as_secs_f64());
    match reached {
        true => Ok(()),
        false => Err(ApiError::NotFresh {
            gvk: cache.gvk().clone(),
            namespace: stream,
            at: *versions.borrow(),
            wanted,
            waited: wait,
        }),
    }
}

/// A resourceVersion a read asks for, `field` being where; `None` when empty.
fn version(field: &str, rv: &str) -> Result<Option<u64>, ApiError> {
    if rv.is_empty() {
        return Ok(None);
    }
    rv.parse().map(Some).map_err(|_| {
        invalid(
            field,
            format!("{rv:?} is not a resourceVersion this cache can compare (a decimal number)"),
        )
    })
}

/// `objects` in messages of at most `limit` bytes each, in order; an object larger than
/// `limit` alone in its message.
fn by_bytes(objects: Vec<Vec<u8>>, limit: usize) -> Vec<Vec<Vec<u8>>> {
    let mut chunks: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut size = 0;
    for object in objects {
        match chunks.last_mut() {
            Some(chunk) if size + object.len() <= limit => {
                size += object.len();
                chunk.push(object);
            }
            _ => {
                size = object.len();
                chunks.push(vec![object]);
            }
        }
    }
    chunks
}

/// An object as the caller may have it: whole, or (a caller granted metadata only, of a kind
/// another registration caches in full) its `apiVersion`, `kind` and `metadata` alone.
fn served(json: &[u8], objects: Objects, cache: &ResourceCache) -> Vec<u8> {
    if objects == Objects::Full || cache.resource.metadata_only {
        return json.to_vec();
    }
    let Ok(serde_json::Value::Object(mut object)) = serde_json::from_slice(json) else {
        return Vec::new();
    };
    object.retain(|field, _| matches!(field.as_str(), "apiVersion" | "kind" | "metadata"));
    serde_json::to_vec(&object).unwrap_or_default()
}

type ListStream = Pin<Box<dyn Stream<Item = Result<ListResponse, Status>> + Send>>;

#[tonic::async_trait]
impl cache_server::Cache for CacheService {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let caller = request.extensions().get::<Caller>().cloned();
        let GetRequest {
            gvk,
            namespace,
            name,
            freshness,
        } = request.into_inner();
        let (cache, objects) = self.resource(gvk.as_ref(), caller.as_ref())?;
        if name.is_empty() {
            return Err(invalid("name", "required").into());
        }
        fresh(&cache, &namespace, freshness, &self.metrics).await?;
        let store = cache.read();
        let object = store
            .get(&namespace, &name)
            .map(|json| served(json, objects, &cache));
        Ok(Response::new(GetResponse {
            found: object.is_some(),
            object_json: object.unwrap_or_default(),
            cache_resource_version: store.resource_version().to_string(),
        }))
    }

    type ListStream = ListStream;

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListStream>, Status> {
        let caller = request.extensions().get::<Caller>().cloned();
        let ListRequest {
            gvk,
            namespace,
            label_selector,
            controller_uid,
            freshness,
            either,
        } = request.into_inner();
        let (cache, objects) = self.resource(gvk.as_ref(), caller.as_ref())?;
        let selector = Selector::parse(&label_selector)
            .map_err(|e| invalid("label_selector", e.to_string()))?;
        fresh(&cache, &namespace, freshness, &self.metrics).await?;
        let (objects, rv) = {
            let store = cache.read();
            let namespace = (!namespace.is_empty()).then_some(namespace.as_str());
            let owner = (!controller_uid.is_empty()).then_some(controller_uid.as_str());
            let serve = |json: &[u8]| served(json, objects, &cache);
            let objects: Vec<Vec<u8>> = match (either, owner) {
                (true, Some(uid)) => store
                    .list_either(namespace, uid, &selector)
                    .map(serve)
                    .collect(),
                // Any owner, or the selector: every object.
                (true, None) => store
                    .list(namespace, None, &Selector::default())
                    .map(serve)
                    .collect(),
                (false, owner) => store.list(namespace, owner, &selector).map(serve).collect(),
            };
            (objects, store.resource_version().to_string())
        };
        let mut chunks: Vec<Result<ListResponse, Status>> = by_bytes(objects, LIST_MESSAGE_BYTES)
            .into_iter()
            .map(|chunk| {
                Ok(ListResponse {
                    objects_json: chunk,
                    cache_resource_version: rv.clone(),
                    either,
                })
            })
            .collect();
        if chunks.is_empty() {
            chunks.push(Ok(ListResponse {
                objects_json: Vec::new(),
                cache_resource_version: rv,
                either,
            }));
        }
        Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
    }

    async fn get_graph_node(
        &self,
        request: Request<GetGraphNodeRequest>,
    ) -> Result<Response<GetGraphNodeResponse>, Status> {
        let caller = request.extensions().get::<Caller>().cloned();
        let GetGraphNodeRequest { uid } = request.into_inner();
        if uid.is_empty() {
            return Err(invalid("uid", "required").into());
        }
        if uid.len() > MAX_UID_LEN {
            return Err(invalid(
                "uid",
                format!("{} characters, at most {MAX_UID_LEN}", uid.len()),
            )
            .into());
        }
        let cache = self.caches.graph.as_ref().ok_or(ApiError::NoGraph)?;
        // The graph names objects of every kind, Secrets too, with their owners: only the
        // accounts granted it read it (without identities, for development, anyone).
        if let Some(caller) = caller {
            let account = &caller.identity.service_account;
            if !self.config.grants.reads_graph(account) {
                return Err(ApiError::Denied(format!(
                    "the garbage collector's graph is not granted to service account \
                     {account:?} (graph: true in the watcher configuration's registrations)"
                ))
                .into());
            }
        }
        if !cache.is_synced() {
            return Err(ApiError::GraphNotSynced.into());
        }
        let graph = cache.read();
        let to_proto = |node: &Node| graph_node(cache, node);
        let node = graph.node(&uid);
        let owners = node
            .into_iter()
            .flat_map(|n| n.owners.iter())
            .filter_map(|o| graph.node(&o.uid))
            .filter_map(to_proto)
            .collect();
        let dependents = graph.dependents(&uid).filter_map(to_proto).collect();
        Ok(Response::new(GetGraphNodeResponse {
            node: node.and_then(to_proto),
            owners,
            dependents,
        }))
    }
}

/// A node as the Cache API gives it; `None` for a node of a resource no longer known.
fn graph_node(cache: &GraphCache, node: &Node) -> Option<GraphNode> {
    let served = cache.resource(node.resource)?;
    let resource = &served.resource;
    Some(GraphNode {
        gvk: Some(GroupVersionKind {
            group: resource.group.clone(),
            version: resource.version.clone(),
            kind: resource.kind.clone(),
        }),
        resource: resource.plural.clone(),
        namespaced: served.namespaced,
        namespace: node.namespace.to_string(),
        name: node.name.to_string(),
        uid: node.uid.to_string(),
        resource_version: node.resource_version.to_string(),
        owner_references: node
            .owners
            .iter()
            .map(|o| OwnerReference {
                api_version: o.api_version.to_string(),
                kind: o.kind.to_string(),
                name: o.name.to_string(),
                uid: o.uid.to_string(),
                controller: o.controller,
                block_owner_deletion: o.block_owner_deletion,
            })
            .collect(),
        deleting: node.deleting,
        foreground_deletion: node.foreground,
        orphan: node.orphan,
    })
}

/// Re-sends every cached key of `shards` at low priority; returns how many.
pub async fn resync(
    caches: &Caches,
    enqueuer: &Enqueuer,
    metrics: &WatcherMetrics,
    shards: Option<&HashSet<u32>>,
    reason: &'static str,
) -> usize {
    let mut keys = caches.keys(shards);
    caches.peers.hold_back(&mut keys, |k| k);
    let count = keys.len();
    metrics
        .resyncs
        .get_or_create(&ResyncLabels { reason })
        .inc();
    info!(
        reason,
        shards = shards.map(HashSet::len),
        keys = count,
        "resync"
    );
    enqueuer.push(keys, Priority::Low, None, None).await;
    count
}

#[cfg(test)]
mod tests {
    use super::by_bytes;

    #[test]
    fn lists_are_cut_by_bytes_and_a_large_object_goes_alone() {
        let objects =
            |sizes: &[usize]| -> Vec<Vec<u8>> { sizes.iter().map(|n| vec![0; *n]).collect() };
        let sizes = |chunks: Vec<Vec<Vec<u8>>>| -> Vec<Vec<usize>> {
            chunks
                .iter()
                .map(|c| c.iter().map(Vec::len).collect())
                .collect()
        };
        assert_eq!(
            sizes(by_bytes(objects(&[4, 4, 2, 5, 11, 1]), 10)),
            [vec![4, 4, 2], vec![5], vec![11], vec![1]]
        );
        assert!(by_bytes(Vec::new(), 10).is_empty());
    }
}
