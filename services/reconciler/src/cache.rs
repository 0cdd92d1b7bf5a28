//! Typed reads from the watcher's Cache API (`switchyard.watcher.v1.Cache`).
//!
//! A reconcile reads what it needs here, never from the apiserver. After a write it passes the
//! write's resourceVersion as `min_resource_version`, so the read reflects the write: this
//! replaces client-go's expectations.

use std::time::Duration;

use serde::de::DeserializeOwned;
use switchyard_k8s::Resource;
use switchyard_proto::{
    common::v1::GroupVersionKind,
    watcher::v1::{Freshness, GetRequest, ListRequest, cache_client::CacheClient as Grpc},
};
use switchyard_runtime::{Dialer, Role};
use tonic::transport::Channel;

/// How long a read waits for the cache to reach a resourceVersion (the watcher caps it at
/// 30 s): long enough for a watch event to arrive under load, short enough that a stuck
/// watcher fails the reconcile well within its timeout.
pub const FRESHNESS_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("invalid watcher address {0:?} (expected host:port)")]
    Address(String),
    #[error("cache {call} refused ({refusal:?}): {message}")]
    Call {
        call: &'static str,
        refusal: Refusal,
        message: String,
    },
    #[error("cache returned an undecodable {kind}: {source}")]
    Decode {
        kind: &'static str,
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

#[derive(Debug, Clone)]
pub struct CacheClient {
    grpc: Grpc<Channel>,
}

fn gvk<K: Resource>() -> GroupVersionKind {
    GroupVersionKind {
        group: K::GROUP.to_owned(),
        version: K::VERSION.to_owned(),
        kind: K::KIND.to_owned(),
    }
}

fn freshness(min_resource_version: Option<&str>) -> Option<Freshness> {
    min_resource_version.map(|rv| Freshness {
        min_resource_version: rv.to_owned(),
        max_wait: prost_types::Duration::try_from(FRESHNESS_WAIT).ok(),
    })
}

fn decode<K: Resource + DeserializeOwned>(json: &[u8]) -> Result<K, CacheError> {
    serde_json::from_slice(json).map_err(|source| CacheError::Decode {
        kind: K::KIND,
        source,
    })
}

impl CacheClient {
    /// A client of the watcher at `address` (host:port) through `dialer`; connects lazily.
    pub fn new(dialer: &Dialer, address: &str) -> Result<Self, CacheError> {
        let channel = dialer
            .channel(address, Role::Watcher)
            .map_err(|_| CacheError::Address(address.to_owned()))?;
        Ok(Self {
            grpc: Grpc::new(channel),
        })
    }

    pub async fn get<K: Resource + DeserializeOwned>(
        &self,
        namespace: &str,
        name: &str,
        min_resource_version: Option<&str>,
    ) -> Result<Option<K>, CacheError> {
        let request = GetRequest {
            gvk: Some(gvk::<K>()),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            freshness: freshness(min_resource_version),
        };
        let response = self
            .grpc
            .clone()
            .get(request)
            .await
            .map_err(CacheError::call("Get"))?
            .into_inner();
        if !response.found {
            return Ok(None);
        }
        decode(&response.object_json).map(Some)
    }

    pub async fn list<K: Resource + DeserializeOwned>(
        &self,
        namespace: &str,
        filter: ListFilter<'_>,
    ) -> Result<Vec<K>, CacheError> {
        let request = ListRequest {
            gvk: Some(gvk::<K>()),
            namespace: namespace.to_owned(),
            label_selector: filter.label_selector.to_owned(),
            controller_uid: filter.controller_uid.to_owned(),
            freshness: freshness(filter.min_resource_version),
        };
        let call = CacheError::call("List");
        let mut chunks = self
            .grpc
            .clone()
            .list(request)
            .await
            .map_err(&call)?
            .into_inner();
        let mut objects = Vec::new();
        while let Some(chunk) = chunks.message().await.map_err(&call)? {
            for json in &chunk.objects_json {
                objects.push(decode(json)?);
            }
        }
        Ok(objects)
    }
}
