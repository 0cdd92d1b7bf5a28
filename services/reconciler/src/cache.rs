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

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use serde::de::DeserializeOwned;
use switchyard_k8s::kube::Resource;
use switchyard_proto::{
    common::v1::GroupVersionKind,
    watcher::v1::{
        Freshness, GetGraphNodeRequest, GetGraphNodeResponse, GetRequest, ListRequest,
        cache_client::CacheClient as Grpc,
    },
};
use switchyard_queue_client::Versions;
use switchyard_runtime::{Dialer, Role};
use tonic::transport::Channel;

/// How long a read waits for the cache to reach a resourceVersion (the watcher caps it at
/// 30 s): long enough for a watch event to arrive under load, short enough that a stuck
/// watcher fails the reconcile well within its timeout.
pub const FRESHNESS_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("invalid watcher address {0:?} (expected host:port[,host:port...])")]
    Address(String),
    #[error("cache {call} refused ({refusal:?}): {message}")]
    Call {
        call: &'static str,
        refusal: Refusal,
        message: String,
    },
    #[error("cache returned an undecodable {kind}: {source}")]
    Decode {
        kind: String,
        source: serde_json::Error,
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
    pub label_selector: &'a str,
    pub controller_uid: &'a str,
    /// Read at least this resourceVersion of the kind (a write of this reconcile).
    pub min_resource_version: Option<&'a str>,
}

/// Reads from one or more watcher replicas, in turn; cheap to clone. A clone made by
/// [`CacheClient::reading_at`] reads at a floor of its own (one reconcile's).
#[derive(Debug, Clone)]
pub struct CacheClient {
    replicas: Arc<[Grpc<Channel>]>,
    next: Arc<AtomicUsize>,
    floor: Option<Arc<Mutex<Versions>>>,
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

/// The later of a read's own minimum (a write of this reconcile) and the floor. A minimum
/// that is not a number goes as it is, for the watcher to refuse by name.
fn freshness(min_resource_version: Option<&str>, floor: Option<u64>) -> Option<Freshness> {
    let wanted = match (min_resource_version, floor) {
        (None, None) => return None,
        (Some(rv), None) => rv.to_owned(),
        (None, Some(floor)) => floor.to_string(),
        (Some(rv), Some(floor)) => match rv.parse::<u64>() {
            Ok(own) => own.max(floor).to_string(),
            Err(_) => rv.to_owned(),
        },
    };
    Some(Freshness {
        min_resource_version: wanted,
        max_wait: prost_types::Duration::try_from(FRESHNESS_WAIT).ok(),
    })
}

fn decode<K: Resource<DynamicType = ()> + DeserializeOwned>(json: &[u8]) -> Result<K, CacheError> {
    serde_json::from_slice(json).map_err(|source| CacheError::Decode {
        kind: K::kind(&()).into_owned(),
        source,
    })
}

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
                    .map(Grpc::new)
                    .map_err(|_| CacheError::Address(addresses.to_owned()))
            })
            .collect::<Result<Arc<[_]>, _>>()?;
        Ok(Self {
            replicas,
            next: Arc::default(),
            floor: None,
        })
    }

    /// A client for one reconcile: every read is at least at `floor` (the lease's), and
    /// raises it to the newest object version it returned.
    pub fn reading_at(&self, floor: Versions) -> Self {
        Self {
            floor: Some(Arc::new(Mutex::new(floor))),
            ..self.clone()
        }
    }

    /// Per kind, the newest object version this client's reads returned or waited for (with
    /// the floor it started from).
    pub fn observed(&self) -> Versions {
        self.floor
            .as_ref()
            .map(|floor| floor.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .unwrap_or_default()
    }

    fn floor_of(&self, kind: &str) -> Option<u64> {
        let floor = self
            .floor
            .as_ref()?
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        floor.get(kind).copied()
    }

    /// Raises the floor of `K`'s kind to the version of `object`, which this reconcile
    /// wrote. The outcome then carries the write even if the reconcile ends before a read
    /// reflects it (a read that fails, a cancelled reconcile), so the key's next reconcile,
    /// through any watcher, still sees it: a Pod created under a generated name would
    /// otherwise be created again by a retry that read a watcher without it.
    pub fn wrote<K: Resource<DynamicType = ()>>(&self, object: &K) {
        self.raise(kind_key::<K>(), None, std::slice::from_ref(object));
    }

    /// Raises the floor of `kind` to the newest of the objects read and the read's own
    /// minimum: each is the version of a change to an object of that kind, which every
    /// watcher's stream of the kind carries, so another watcher reaches it as soon as it has
    /// that change. (The cache's own version may be a relist's, which a watcher that lists no
    /// later reaches only at the kind's next change.)
    fn raise<K: Resource>(&self, kind: String, own: Option<&str>, read: &[K]) {
        let Some(floor) = &self.floor else {
            return;
        };
        let newest = read
            .iter()
            .filter_map(|object| object.meta().resource_version.as_deref())
            .chain(own)
            .filter_map(|rv| rv.parse::<u64>().ok())
            .max();
        if let Some(rv) = newest {
            let mut floor = floor.lock().unwrap_or_else(|e| e.into_inner());
            let at = floor.entry(kind).or_default();
            *at = (*at).max(rv);
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
            match call(replica).await {
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

    pub async fn get<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: &str,
        name: &str,
        min_resource_version: Option<&str>,
    ) -> Result<Option<K>, CacheError> {
        let kind = kind_key::<K>();
        let request = GetRequest {
            gvk: Some(gvk::<K>()),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            freshness: freshness(min_resource_version, self.floor_of(&kind)),
        };
        let response = self
            .call("Get", |mut grpc| {
                let request = request.clone();
                async move { grpc.get(request).await.map(tonic::Response::into_inner) }
            })
            .await?;
        let object: Option<K> = if response.found {
            Some(decode(&response.object_json)?)
        } else {
            None
        };
        self.raise(kind, min_resource_version, object.as_slice());
        Ok(object)
    }

    pub async fn list<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: &str,
        filter: ListFilter<'_>,
    ) -> Result<Vec<K>, CacheError> {
        let kind = kind_key::<K>();
        let request = ListRequest {
            gvk: Some(gvk::<K>()),
            namespace: namespace.to_owned(),
            label_selector: filter.label_selector.to_owned(),
            controller_uid: filter.controller_uid.to_owned(),
            freshness: freshness(filter.min_resource_version, self.floor_of(&kind)),
        };
        let mut chunks = self
            .call("List", |mut grpc| {
                let request = request.clone();
                async move { grpc.list(request).await.map(tonic::Response::into_inner) }
            })
            .await?;
        let call = CacheError::call("List");
        let mut objects = Vec::new();
        while let Some(chunk) = chunks.message().await.map_err(&call)? {
            for json in &chunk.objects_json {
                objects.push(decode(json)?);
            }
        }
        self.raise(kind, filter.min_resource_version, &objects);
        Ok(objects)
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
    fn kinds_are_named_as_controllers_are() {
        assert_eq!(kind_key::<Pod>(), "v1/Pod");
        assert_eq!(kind_key::<ReplicaSet>(), "apps/v1/ReplicaSet");
    }

    #[test]
    fn a_write_raises_the_floor_the_outcome_reports_without_a_read() {
        let pod = |rv: &str| {
            let mut pod = Pod::default();
            pod.metadata.resource_version = Some(rv.to_owned());
            pod
        };
        let client = CacheClient {
            replicas: Arc::from(Vec::new()),
            next: Arc::default(),
            floor: None,
        };
        client.wrote(&pod("99"));
        assert!(client.observed().is_empty(), "no floor outside a reconcile");
        let mut lease = Versions::default();
        lease.insert("v1/Pod".to_owned(), 40);
        let reconcile = client.reading_at(lease);
        reconcile.wrote(&pod("57"));
        reconcile.wrote(&pod("12"));
        assert_eq!(reconcile.observed().get("v1/Pod"), Some(&57));
        assert_eq!(reconcile.observed().get("apps/v1/ReplicaSet"), None);
    }

    #[test]
    fn a_read_waits_for_the_later_of_its_own_minimum_and_the_floor() {
        let wanted = |own, floor| freshness(own, floor).map(|f| f.min_resource_version);
        assert_eq!(wanted(None, None), None);
        assert_eq!(wanted(Some("12"), None).as_deref(), Some("12"));
        assert_eq!(wanted(None, Some(9)).as_deref(), Some("9"));
        assert_eq!(wanted(Some("12"), Some(30)).as_deref(), Some("30"));
        assert_eq!(wanted(Some("42"), Some(30)).as_deref(), Some("42"));
        assert_eq!(wanted(Some("x"), Some(30)).as_deref(), Some("x"));
    }
}
