//! Typed reads from the watcher's Cache API (`switchyard.watcher.v1.Cache`).
//!
//! A reconcile reads what it needs here, never from the apiserver. After a write it passes the
//! write's resourceVersion as `min_resource_version`, so the read reflects the write: this
//! replaces client-go's expectations.
//!
//! Several watcher replicas may answer (one address behind a Service, or a list of them read
//! in turn). Their caches lag one another, so each reconcile reads at a floor: per kind, the
//! newest version of an object read so far (or written and read back), starting from its
//! lease's read floor (what earlier reconciles of its shard read) and raised by every answer.
//! A replica behind the floor waits until it catches up, or the read fails; it never answers
//! older than what the shard has seen. The floor goes back to the queue with the outcome.
//!
//! The floor is kept twice: over every namespace, and in the key's namespace. A watcher with
//! one stream per namespace (`namespaces.include`) compares a read with its namespace's
//! stream only, which a version reached in another namespace may never reach; a read of the
//! key's namespace asks for that namespace's floor (`min_resource_version`), and for the
//! floor over every namespace as well (`kind_min_resource_version`), which a watcher with one
//! stream of the kind waits for.
//!
//! A reconcile also starts at the newest version this process wrote, per kind, in its key's
//! namespace ([`CacheClient::wrote`] records it for every reconcile). The lease's floor does
//! not move with a shard that moves to another queue replica, and a reconcile stopped there
//! mid-write (its queue replica died) reports nothing: without this, the key's next
//! reconcile in this process, leased from the shard's new owner, could read a watcher behind
//! the Pods the stopped one created, and create them again.

use std::{
    borrow::Borrow,
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use serde::de::DeserializeOwned;
use switchyard_k8s::{
    k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    kube::{Resource, core::PartialObjectMeta},
};
use switchyard_proto::{
    MAX_CACHE_MESSAGE_BYTES,
    common::v1::GroupVersionKind,
    watcher::v1::{
        Freshness, GetGraphNodeRequest, GetGraphNodeResponse, GetRequest, ListRequest,
        cache_client::CacheClient as Grpc,
    },
};
use switchyard_queue_client::ReadFloor;
use switchyard_runtime::{Dialer, Role};
use tonic::transport::Channel;

use crate::metrics::CacheMetrics;

mod decoded;

pub use decoded::{KEPT_UNUSED, MAX_PER_KIND};

/// How long a read waits for the cache to reach a resourceVersion (the watcher caps it at
/// 30 s): long enough for a watch event to arrive under load, short enough that a stuck
/// watcher fails the reconcile well within its timeout.
pub const FRESHNESS_WAIT: Duration = Duration::from_secs(10);

/// For how long after its shard moved a key's reconciles may read a state that lacks the
/// previous owner's last writes: the new owner starts without a read floor, and a watcher
/// lagged 1.4 to 4.5 s under load in `tests/chaos.rs`. As long as a read waits for a lagging
/// watcher ([`FRESHNESS_WAIT`]).
pub const MOVED_SHARD_WINDOW: Duration = FRESHNESS_WAIT;

/// Whether a lease's shard moved within [`MOVED_SHARD_WINDOW`]; a lease that does not say
/// counts as moved.
pub fn moved_lately(shard_held_for: Option<Duration>) -> bool {
    shard_held_for.is_none_or(|held| held < MOVED_SHARD_WINDOW)
}

/// Why a read from the watcher's cache failed.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// `--watcher-addr` is not a `host:port` list.
    #[error("invalid watcher address {0:?} (expected host:port[,host:port...])")]
    Address(String),
    /// The watcher refused the call; `refusal` says how (unknown kind, unavailable, ...).
    #[error("cache {call} refused ({refusal:?}): {message}")]
    Call {
        /// The call: `get`, `list`, `get_metadata`, ...
        call: &'static str,
        /// How the watcher refused it.
        refusal: Refusal,
        /// The watcher's message.
        message: String,
    },
    /// The watcher returned an object that does not decode as the type asked for.
    #[error("cache returned an undecodable {kind}: {source}")]
    Decode {
        /// The kind asked for.
        kind: String,
        /// Why it does not decode.
        source: serde_json::Error,
    },
    /// A full read of a kind the cache holds as metadata only (a watch with
    /// `metadata_only()`).
    #[error(
        "the cache holds {kind} as metadata only (a watch with metadata_only()): read it with \
         get_metadata"
    )]
    MetadataOnly {
        /// The kind asked for.
        kind: String,
    },
}

/// Why the watcher did not answer a read, from its gRPC code (the watcher's `ApiError`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The request was malformed (a field named in the message).
    Invalid,
    /// The watcher does not watch that kind.
    NotWatched,
    /// The cache has not finished its initial list, or the watcher is unreachable.
    Unavailable,
    /// The cache did not reach the requested resourceVersion in time.
    NotFresh,
    /// Any other code.
    Other(tonic::Code),
}

impl CacheError {
    /// The one place a cache call's `Status` is read.
    fn call(call: &'static str) -> impl Fn(tonic::Status) -> Self {
        move |status| {
            let refusal = match status.code() {
                tonic::Code::InvalidArgument => Refusal::Invalid,
                tonic::Code::NotFound => Refusal::NotWatched,
                tonic::Code::Unavailable => Refusal::Unavailable,
                tonic::Code::DeadlineExceeded => Refusal::NotFresh,
                code => Refusal::Other(code),
            };
            Self::Call {
                call,
                refusal,
                message: status.message().to_owned(),
            }
        }
    }
}

/// A filter for [`CacheClient::list`].
#[derive(Debug, Clone, Default)]
pub struct ListFilter<'a> {
    /// Only objects whose labels this selector (`app=web,tier!=db`) matches; empty: all.
    pub label_selector: &'a str,
    /// Only objects with a controller owner reference to this UID; empty: any owner.
    pub controller_uid: &'a str,
    /// Read at least this resourceVersion of the kind (a write of this reconcile).
    pub min_resource_version: Option<&'a str>,
    /// The objects that `controller_uid` controls or `label_selector` matches, each once,
    /// instead of those that both hold for: a ReplicaSet's Pods and the orphans its selector
    /// could adopt, in one call.
    pub either: bool,
}

/// Reads from one or more watcher replicas, in turn; cheap to clone. A clone made by
/// [`CacheClient::reading_at`] reads at a floor of its own (one reconcile's).
#[derive(Debug, Clone)]
pub struct CacheClient {
    replicas: Arc<[Grpc<Channel>]>,
    next: Arc<AtomicUsize>,
    floor: Option<Arc<Mutex<Floor>>>,
    metrics: Option<CacheMetrics>,
    /// What this process wrote, shared by every clone.
    written: Arc<Mutex<Written>>,
    /// The key's shard moved lately: the floor may lack the previous owner's writes.
    shard_moved: bool,
    /// What [`CacheClient::list_shared`] decoded, shared by every clone.
    decoded: Arc<decoded::Decoded>,
}

/// Namespaces whose newest written versions a process keeps; past it, the namespace whose
/// newest write is the oldest is forgotten.
const WRITTEN_NAMESPACES: usize = 4096;

/// The newest version this process wrote, per namespace and kind.
#[derive(Debug, Default)]
struct Written(HashMap<String, BTreeMap<String, u64>>);

impl Written {
    fn record(&mut self, namespace: &str, kind: String, rv: u64) {
        if !self.0.contains_key(namespace) && self.0.len() >= WRITTEN_NAMESPACES {
            let oldest = self
                .0
                .iter()
                .min_by_key(|(_, kinds)| kinds.values().max().copied())
                .map(|(namespace, _)| namespace.clone());
            if let Some(oldest) = oldest {
                self.0.remove(&oldest);
            }
        }
        let at = self
            .0
            .entry(namespace.to_owned())
            .or_default()
            .entry(kind)
            .or_default();
        *at = (*at).max(rv);
    }
}

/// One reconcile's floor: its lease's, raised by what it reads and writes.
#[derive(Debug)]
struct Floor {
    versions: ReadFloor,
    /// The namespace of the reconciled key, which `versions.namespace` is of.
    namespace: String,
}

fn gvk<K: Resource<DynamicType = ()>>() -> GroupVersionKind {
    GroupVersionKind {
        group: K::group(&()).into_owned(),
        version: K::version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
    }
}

/// The kind as the queue's read floor names it: "group/version/Kind", "v1/Pod" for the core
/// group (the form controller names take).
pub fn kind_key<K: Resource<DynamicType = ()>>() -> String {
    let (group, version, kind) = (K::group(&()), K::version(&()), K::kind(&()));
    if group.is_empty() {
        format!("{version}/{kind}")
    } else {
        format!("{group}/{version}/{kind}")
    }
}

/// What a read asks for: the later of its own minimum (a write of this reconcile) and the
/// floor in the namespace read, and the floor over every namespace. A minimum that is not a
/// number goes as it is, for the watcher to refuse by name.
fn freshness(
    min_resource_version: Option<&str>,
    floor: (Option<u64>, Option<u64>),
) -> Option<Freshness> {
    let (namespace, kind) = floor;
    let wanted = match (min_resource_version, namespace) {
        (None, None) => None,
        (Some(rv), None) => Some(rv.to_owned()),
        (None, Some(floor)) => Some(floor.to_string()),
        (Some(rv), Some(floor)) => Some(match rv.parse::<u64>() {
            Ok(own) => own.max(floor).to_string(),
            Err(_) => rv.to_owned(),
        }),
    };
    if wanted.is_none() && kind.is_none() {
        return None;
    }
    Some(Freshness {
        min_resource_version: wanted.unwrap_or_default(),
        max_wait: prost_types::Duration::try_from(FRESHNESS_WAIT).ok(),
        kind_min_resource_version: kind.map(|rv| rv.to_string()).unwrap_or_default(),
    })
}

fn lock(floor: &Mutex<Floor>) -> std::sync::MutexGuard<'_, Floor> {
    floor.lock().unwrap_or_else(|e| e.into_inner())
}

fn decode<K: Resource<DynamicType = ()> + DeserializeOwned>(json: &[u8]) -> Result<K, CacheError> {
    serde_json::from_slice(json).map_err(|source| {
        let kind = K::kind(&()).into_owned();
        #[derive(serde::Deserialize)]
        struct Type {
            #[serde(rename = "apiVersion")]
            api_version: Option<String>,
        }
        let metadata_only = serde_json::from_slice::<Type>(json)
            .is_ok_and(|t| t.api_version.as_deref() == Some(METADATA_ONLY_API_VERSION));
        match metadata_only {
            true => CacheError::MetadataOnly { kind },
            false => CacheError::Decode { kind, source },
        }
    })
}

/// The apiVersion of what the watcher caches for a metadata-only watch
/// (`PartialObjectMetadata`).
const METADATA_ONLY_API_VERSION: &str = "meta.k8s.io/v1";

impl CacheClient {
    /// A client of the watchers at `addresses` (`host:port`, several separated by commas)
    /// through `dialer`; connects lazily.
    pub fn new(dialer: &Dialer, addresses: &str) -> Result<Self, CacheError> {
        let replicas = addresses
            .split(',')
            .map(str::trim)
            .map(|address| {
                dialer
                    .channel(address, Role::Watcher)
                    // A large object comes alone in a message above gRPC's default limit.
                    .map(|channel| {
                        Grpc::new(channel).max_decoding_message_size(MAX_CACHE_MESSAGE_BYTES)
                    })
                    .map_err(|_| CacheError::Address(addresses.to_owned()))
            })
            .collect::<Result<Arc<[_]>, _>>()?;
        Ok(Self {
            replicas,
            next: Arc::default(),
            floor: None,
            metrics: None,
            written: Arc::default(),
            shard_moved: false,
            decoded: Arc::default(),
        })
    }

    /// The same client, timing every call in `metrics`.
    pub fn with_metrics(self, metrics: CacheMetrics) -> Self {
        Self {
            metrics: Some(metrics),
            ..self
        }
    }

    /// A client for one reconcile of a key of `namespace`: every read is at least at
    /// `floor` (the lease's) and, in `namespace`, at this process's newest write there; and
    /// raises it to the newest object version it returned.
    pub fn reading_at(&self, mut floor: ReadFloor, namespace: &str) -> Self {
        let written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        for (kind, rv) in written.0.get(namespace).into_iter().flatten() {
            let at = floor.namespace.entry(kind.clone()).or_default();
            *at = (*at).max(*rv);
        }
        drop(written);
        Self {
            floor: Some(Arc::new(Mutex::new(Floor {
                versions: floor,
                namespace: namespace.to_owned(),
            }))),
            ..self.clone()
        }
    }

    /// The same client, for a reconcile of a key whose shard moved to its queue replica
    /// lately ([`moved_lately`]) or not.
    pub fn after_shard_move(self, moved: bool) -> Self {
        Self {
            shard_moved: moved,
            ..self
        }
    }

    /// Whether this reconcile's reads may lack writes that no floor names: its key's shard
    /// moved lately, so the last reconciles of the previous owner may have written what the
    /// watcher has not shown yet, in this process or another. A controller about to create
    /// objects under generated names (which nothing refuses twice) because a read lacks
    /// them confirms with the apiserver first, as the ReplicaSet controller does.
    pub fn may_lack_writes(&self) -> bool {
        self.shard_moved
    }

    /// Per kind, the newest object version this client's reads returned or waited for (with
    /// the floor it started from), over every namespace and in the key's.
    pub fn observed(&self) -> ReadFloor {
        self.floor
            .as_ref()
            .map(|floor| lock(floor).versions.clone())
            .unwrap_or_default()
    }

    /// The floors of `kind` a read of `namespace` asks for: in that namespace (when it is
    /// the key's, the only one the lease carries), and over every namespace.
    fn floor_of(&self, kind: &str, namespace: &str) -> (Option<u64>, Option<u64>) {
        let Some(floor) = &self.floor else {
            return (None, None);
        };
        let floor = lock(floor);
        let own = (floor.namespace == namespace)
            .then(|| floor.versions.namespace.get(kind).copied())
            .flatten();
        (own, floor.versions.kinds.get(kind).copied())
    }

    /// Raises the floor of `K`'s kind to the version of `object`, which this reconcile
    /// wrote. The outcome then carries the write even if the reconcile ends before a read
    /// reflects it (a read that fails, a cancelled reconcile), so the key's next reconcile,
    /// through any watcher, still sees it: a Pod created under a generated name would
    /// otherwise be created again by a retry that read a watcher without it.
    pub fn wrote<K: Resource<DynamicType = ()>>(&self, object: &K) {
        let namespace = object.meta().namespace.as_deref().unwrap_or_default();
        let kind = kind_key::<K>();
        let version = object.meta().resource_version.as_deref();
        if let Some(rv) = version.and_then(|rv| rv.parse::<u64>().ok()) {
            self.written
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(namespace, kind.clone(), rv);
        }
        self.raise(kind, namespace, None, [object.meta()]);
    }

    /// Raises the floors of `kind` to the newest of the objects read and the read's own
    /// minimum (of a read of `namespace`): each is the version of a change to an object of
    /// that kind, which every watcher's stream of the kind (or of the object's namespace)
    /// carries, so another watcher reaches it as soon as it has that change. (The cache's
    /// own version may be a relist's, which a watcher that lists no later reaches only at the
    /// kind's next change.)
    fn raise<'m>(
        &self,
        kind: String,
        namespace: &str,
        own: Option<&str>,
        read: impl IntoIterator<Item = &'m ObjectMeta>,
    ) {
        let Some(floor) = &self.floor else {
            return;
        };
        let mut floor = lock(floor);
        let Floor {
            versions: floor,
            namespace: key_namespace,
        } = &mut *floor;
        let version = |rv: Option<&str>| rv.and_then(|rv| rv.parse::<u64>().ok());
        let versions = read
            .into_iter()
            .map(|meta| {
                let in_namespace =
                    meta.namespace.as_deref().unwrap_or_default() == key_namespace.as_str();
                (version(meta.resource_version.as_deref()), in_namespace)
            })
            .chain([(version(own), namespace == key_namespace.as_str())]);
        let (mut newest, mut newest_here) = (None, None);
        for (rv, in_namespace) in versions {
            newest = newest.max(rv);
            if in_namespace {
                newest_here = newest_here.max(rv);
            }
        }
        for (versions, newest) in [
            (&mut floor.kinds, newest),
            (&mut floor.namespace, newest_here),
        ] {
            if let Some(rv) = newest {
                let at = versions.entry(kind.clone()).or_default();
                *at = (*at).max(rv);
            }
        }
    }

    /// Calls the replicas in turn, starting with the next one: a replica that is down or not
    /// synced (`UNAVAILABLE`), or did not reach the floor in time (`DEADLINE_EXCEEDED`),
    /// hands the call to the following one.
    async fn call<T, F, Fut>(&self, name: &'static str, call: F) -> Result<T, CacheError>
    where
        F: Fn(Grpc<Channel>) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let mut last = None;
        for i in 0..self.replicas.len() {
            let replica = self.replicas[(first + i) % self.replicas.len()].clone();
            let start = Instant::now();
            let answer = call(replica).await;
            if let Some(metrics) = &self.metrics {
                let code = answer.as_ref().err().map(tonic::Status::code);
                metrics.observe(name, code, start.elapsed());
            }
            match answer {
                Ok(answer) => return Ok(answer),
                Err(status)
                    if matches!(
                        status.code(),
                        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                    ) =>
                {
                    last = Some(status)
                }
                Err(status) => return Err(CacheError::call(name)(status)),
            }
        }
        Err(CacheError::call(name)(last.unwrap_or_else(|| {
            tonic::Status::unavailable("no watcher address")
        })))
    }

    /// The object `namespace/name` of `K` as the cache has it (`None`: not there), from a
    /// cache at least at `min_resource_version` (a write of this reconcile) and never older
    /// than what this client has read of the kind before.
    pub async fn get<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: &str,
        name: &str,
        min_resource_version: Option<&str>,
    ) -> Result<Option<K>, CacheError> {
        self.get_as::<K, K>(namespace, name, min_resource_version, decode)
            .await
    }

    /// The metadata of one object, whether the cache holds its kind in full or as metadata
    /// only (a watch with `metadata_only()`): for a controller that reads names, labels or
    /// owners of a kind it does not need whole.
    pub async fn get_metadata<K: Resource<DynamicType = ()>>(
        &self,
        namespace: &str,
        name: &str,
        min_resource_version: Option<&str>,
    ) -> Result<Option<PartialObjectMeta<K>>, CacheError> {
        self.get_as::<K, PartialObjectMeta<K>>(namespace, name, min_resource_version, |json| {
            serde_json::from_slice(json).map_err(|source| CacheError::Decode {
                kind: K::kind(&()).into_owned(),
                source,
            })
        })
        .await
    }

    /// One object of kind `K`, decoded as `T`; its resourceVersion raises the read floor.
    async fn get_as<K: Resource<DynamicType = ()>, T: Resource>(
        &self,
        namespace: &str,
        name: &str,
        min_resource_version: Option<&str>,
        decode: impl FnOnce(&[u8]) -> Result<T, CacheError>,
    ) -> Result<Option<T>, CacheError> {
        let kind = kind_key::<K>();
        let request = GetRequest {
            gvk: Some(gvk::<K>()),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            freshness: freshness(min_resource_version, self.floor_of(&kind, namespace)),
        };
        let response = self
            .call("Get", |mut grpc| {
                let request = request.clone();
                async move { grpc.get(request).await.map(tonic::Response::into_inner) }
            })
            .await?;
        let object = match response.found {
            true => Some(decode(&response.object_json)?),
            false => None,
        };
        self.raise(
            kind,
            namespace,
            min_resource_version,
            object.iter().map(Resource::meta),
        );
        Ok(object)
    }

    /// The `K` objects of `namespace` (every namespace when empty) that `filter` selects,
    /// decoded.
    pub async fn list<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: &str,
        filter: ListFilter<'_>,
    ) -> Result<Vec<K>, CacheError> {
        self.list_as::<K, K>(namespace, filter, |jsons| {
            jsons.iter().map(|json| decode(json)).collect()
        })
        .await
    }

    /// As [`CacheClient::list`], each object shared: one that an earlier list in this
    /// process returned unchanged is not decoded again (the same `Arc` comes back), so a
    /// controller that reads the same thousand objects at each reconcile decodes only those
    /// that changed. For reads of many objects; what is kept is bounded
    /// ([`KEPT_UNUSED`], [`MAX_PER_KIND`]).
    pub async fn list_shared<K>(
        &self,
        namespace: &str,
        filter: ListFilter<'_>,
    ) -> Result<Vec<Arc<K>>, CacheError>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned + Send + Sync + 'static,
    {
        self.list_as::<K, Arc<K>>(namespace, filter, |jsons| {
            let (objects, kept) = self.decoded.decode_all(jsons, decode::<K>)?;
            if let Some(metrics) = &self.metrics {
                let decoded_as = std::any::type_name::<K>().rsplit("::").next();
                metrics.decoded(kind_key::<K>(), decoded_as.unwrap_or_default(), kept);
            }
            Ok(objects)
        })
        .await
    }

    /// The objects of kind `K` that `filter` selects, decoded by `decode` as `T`.
    async fn list_as<K, T>(
        &self,
        namespace: &str,
        filter: ListFilter<'_>,
        decode: impl Fn(Vec<Vec<u8>>) -> Result<Vec<T>, CacheError>,
    ) -> Result<Vec<T>, CacheError>
    where
        K: Resource<DynamicType = ()>,
        T: Borrow<K>,
    {
        let (jsons, either) = self.list_once::<K>(namespace, &filter).await?;
        let objects = self.read_as(namespace, &filter, jsons, &decode)?;
        if !filter.either || either {
            return Ok(objects);
        }
        // A watcher built before `either` answered with the objects that match both: read
        // the two sets apart.
        let owned = ListFilter {
            label_selector: "",
            either: false,
            ..filter.clone()
        };
        let selected = ListFilter {
            controller_uid: "",
            either: false,
            ..filter.clone()
        };
        let (owned, selected) = futures::try_join!(
            self.list_once::<K>(namespace, &owned),
            self.list_once::<K>(namespace, &selected),
        )?;
        let owned = self.read_as(namespace, &filter, owned.0, &decode)?;
        let selected = self.read_as(namespace, &filter, selected.0, &decode)?;
        let mut union = BTreeMap::new();
        for object in owned.into_iter().chain(selected) {
            let meta = object.borrow().meta();
            let key = (meta.namespace.clone(), meta.name.clone());
            union.insert(key, object);
        }
        Ok(union.into_values().collect())
    }

    /// `jsons` decoded, raising the floor to them.
    fn read_as<K, T>(
        &self,
        namespace: &str,
        filter: &ListFilter<'_>,
        jsons: Vec<Vec<u8>>,
        decode: impl Fn(Vec<Vec<u8>>) -> Result<Vec<T>, CacheError>,
    ) -> Result<Vec<T>, CacheError>
    where
        K: Resource<DynamicType = ()>,
        T: Borrow<K>,
    {
        let objects = decode(jsons)?;
        self.raise(
            kind_key::<K>(),
            namespace,
            filter.min_resource_version,
            objects.iter().map(|object| object.borrow().meta()),
        );
        Ok(objects)
    }

    /// One `List` call: the objects' JSON, and whether the watcher honoured `either`.
    async fn list_once<K: Resource<DynamicType = ()>>(
        &self,
        namespace: &str,
        filter: &ListFilter<'_>,
    ) -> Result<(Vec<Vec<u8>>, bool), CacheError> {
        let kind = kind_key::<K>();
        let request = ListRequest {
            gvk: Some(gvk::<K>()),
            namespace: namespace.to_owned(),
            label_selector: filter.label_selector.to_owned(),
            controller_uid: filter.controller_uid.to_owned(),
            freshness: freshness(filter.min_resource_version, self.floor_of(&kind, namespace)),
            either: filter.either,
        };
        let mut chunks = self
            .call("List", |mut grpc| {
                let request = request.clone();
                async move { grpc.list(request).await.map(tonic::Response::into_inner) }
            })
            .await?;
        let call = CacheError::call("List");
        let (mut jsons, mut either) = (Vec::new(), false);
        while let Some(chunk) = chunks.message().await.map_err(&call)? {
            either |= chunk.either;
            jsons.extend(chunk.objects_json);
        }
        Ok((jsons, either))
    }
}

impl CacheClient {
    /// The garbage collector's view of the object with this UID: the object, the owners the
    /// graph holds, and its dependents. Graph reads carry no floor: the collector reads an
    /// owner missing from the graph from the apiserver, and every write it makes carries the
    /// object's UID as a precondition.
    pub async fn graph_node(&self, uid: &str) -> Result<GetGraphNodeResponse, CacheError> {
        let request = GetGraphNodeRequest {
            uid: uid.to_owned(),
        };
        self.call("GetGraphNode", |mut grpc| {
            let request = request.clone();
            async move {
                grpc.get_graph_node(request)
                    .await
                    .map(tonic::Response::into_inner)
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use switchyard_k8s::{Pod, ReplicaSet};

    use super::*;

    #[test]
    fn a_full_read_of_a_metadata_only_object_says_so_and_its_metadata_decodes() {
        use switchyard_k8s::k8s_openapi::api::core::v1::ServiceAccount;
        let cached = br#"{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":{"name":"default","namespace":"a","resourceVersion":"7"}}"#;
        let error = decode::<ServiceAccount>(cached).unwrap_err();
        assert!(matches!(error, CacheError::MetadataOnly { .. }), "{error}");
        assert!(error.to_string().contains("get_metadata"), "{error}");
        let meta: PartialObjectMeta<ServiceAccount> = serde_json::from_slice(cached).unwrap();
        assert_eq!(meta.metadata.name.as_deref(), Some("default"));
        // A full object's metadata decodes the same way.
        let full = br#"{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"default"},"secrets":[]}"#;
        let meta: PartialObjectMeta<ServiceAccount> = serde_json::from_slice(full).unwrap();
        assert_eq!(meta.metadata.name.as_deref(), Some("default"));
        assert!(matches!(
            decode::<ServiceAccount>(b"{\"apiVersion\":\"v2\"}"),
            Err(CacheError::Decode { .. })
        ));
    }

    #[test]
    fn kinds_are_named_as_controllers_are() {
        assert_eq!(kind_key::<Pod>(), "v1/Pod");
        assert_eq!(kind_key::<ReplicaSet>(), "apps/v1/ReplicaSet");
    }

    /// A client of no watcher, for what it keeps without calling one.
    fn unconnected() -> CacheClient {
        CacheClient {
            replicas: Arc::from(Vec::new()),
            next: Arc::default(),
            floor: None,
            metrics: None,
            written: Arc::default(),
            shard_moved: false,
            decoded: Arc::default(),
        }
    }

    #[test]
    fn a_shard_held_less_than_the_window_or_not_said_moved_lately() {
        assert!(moved_lately(None));
        assert!(moved_lately(Some(Duration::ZERO)));
        assert!(moved_lately(Some(
            MOVED_SHARD_WINDOW - Duration::from_millis(1)
        )));
        assert!(!moved_lately(Some(MOVED_SHARD_WINDOW)));
        let reconcile = unconnected().reading_at(ReadFloor::default(), "a");
        assert!(!reconcile.may_lack_writes());
        assert!(reconcile.after_shard_move(true).may_lack_writes());
    }

    #[test]
    fn a_write_raises_the_floor_the_outcome_reports_without_a_read() {
        let pod = |namespace: &str, rv: &str| {
            let mut pod = Pod::default();
            pod.metadata.namespace = Some(namespace.to_owned());
            pod.metadata.resource_version = Some(rv.to_owned());
            pod
        };
        let client = unconnected();
        client.wrote(&pod("c", "99"));
        assert!(client.observed().is_empty(), "no floor outside a reconcile");
        let mut lease = ReadFloor::default();
        lease.kinds.insert("v1/Pod".to_owned(), 40);
        let reconcile = client.reading_at(lease.clone(), "a");
        reconcile.wrote(&pod("a", "57"));
        reconcile.wrote(&pod("a", "12"));
        reconcile.wrote(&pod("b", "64"));
        let observed = reconcile.observed();
        assert_eq!(observed.kinds.get("v1/Pod"), Some(&64));
        assert_eq!(
            observed.namespace.get("v1/Pod"),
            Some(&57),
            "b is not the key's, nor c"
        );
        assert_eq!(observed.kinds.get("apps/v1/ReplicaSet"), None);

        // A later reconcile in this process, whatever its lease, starts at the process's
        // newest write in its key's namespace: a reconcile stopped after its writes (its
        // queue replica died) reported none of them, and the lease comes without them.
        let next = client.reading_at(ReadFloor::default(), "a");
        assert_eq!(next.observed().namespace.get("v1/Pod"), Some(&57));
        assert_eq!(next.observed().kinds.get("v1/Pod"), None);
        let elsewhere = client.reading_at(lease, "c");
        assert_eq!(elsewhere.observed().namespace.get("v1/Pod"), Some(&99));
        assert_eq!(elsewhere.observed().kinds.get("v1/Pod"), Some(&40));
    }

    #[test]
    fn a_read_of_the_keys_namespace_asks_for_its_floor_there_and_over_every_namespace() {
        let floor = ReadFloor {
            kinds: [("v1/Pod".to_owned(), 90)].into(),
            namespace: [("v1/Pod".to_owned(), 40)].into(),
        };
        let reconcile = unconnected().reading_at(floor, "a");
        assert_eq!(reconcile.floor_of("v1/Pod", "a"), (Some(40), Some(90)));
        assert_eq!(reconcile.floor_of("v1/Pod", "b"), (None, Some(90)));
        assert_eq!(reconcile.floor_of("v1/Secret", "a"), (None, None));
    }

    #[test]
    fn a_read_waits_for_the_later_of_its_own_minimum_and_the_floor() {
        let wanted = |own, floor| freshness(own, (floor, None)).map(|f| f.min_resource_version);
        assert_eq!(wanted(None, None), None);
        assert_eq!(wanted(Some("12"), None).as_deref(), Some("12"));
        assert_eq!(wanted(None, Some(9)).as_deref(), Some("9"));
        assert_eq!(wanted(Some("12"), Some(30)).as_deref(), Some("30"));
        assert_eq!(wanted(Some("42"), Some(30)).as_deref(), Some("42"));
        assert_eq!(wanted(Some("x"), Some(30)).as_deref(), Some("x"));
        let kind_only = freshness(None, (None, Some(70))).unwrap();
        assert_eq!(kind_only.min_resource_version, "");
        assert_eq!(kind_only.kind_min_resource_version, "70");
    }
}
