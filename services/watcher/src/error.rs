//! Why a request was not answered, and the one place a gRPC [`Status`] is made from it.

use std::time::Duration;

use switchyard_watcher_core::{Gvk, WatchesError};
use tonic::Status;

use crate::informers::RegisterError;

/// Why a request was not answered; [`Status`] is made from it in one place.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    /// A registration that disagrees with the configuration file.
    #[error("{field}: {reason}")]
    Conflict { field: String, reason: String },
    /// A registration of a kind the apiserver does not serve.
    #[error("{0}")]
    NotServed(String),
    /// The watcher cannot do it now: a retry may succeed (discovery failed, a list refused,
    /// shutting down).
    #[error("{0}")]
    Unavailable(String),
    #[error("gvk: {gvk} is not watched by this watcher (it watches {watched})")]
    NotWatched { gvk: Gvk, watched: String },
    /// Granted to the caller, and watched for no registration now (the watcher restarted
    /// and the reconcilers have not registered again yet).
    #[error(
        "gvk: {0} is watched for no registration of this watcher now (it restarted lately, or \
         no reconciler registered the kind): a reconciler that registers it brings it back"
    )]
    NotRegistered(Gvk),
    #[error("the cache of {0} has not finished its initial list")]
    NotSynced(Gvk),
    #[error(
        "this watcher keeps no garbage collector graph (its configuration has no garbageCollector)"
    )]
    NoGraph,
    #[error("the garbage collector graph has not finished its initial lists")]
    GraphNotSynced,
    #[error(
        "the cache of {gvk}{} is at resourceVersion {at}, not yet {wanted}, after waiting {waited:?}",
        .namespace.as_deref().map(|n| format!(" (the stream of namespace {n})")).unwrap_or_default()
    )]
    NotFresh {
        gvk: Gvk,
        /// The namespace whose own stream was behind; none for the kind's one stream.
        namespace: Option<Box<str>>,
        at: u64,
        wanted: u64,
        waited: Duration,
    },
    #[error(
        "freshness.min_resource_version: this watcher watches {0} with one stream per namespace (namespaces.include), so a read of every namespace cannot wait for a version; read one namespace"
    )]
    EveryNamespace(Gvk),
    /// A kind the caller's service account may not register or read.
    #[error("{0}")]
    Denied(String),
}

impl From<ApiError> for Status {
    fn from(error: ApiError) -> Self {
        let message = switchyard_runtime::status_message(error.to_string());
        match error {
            ApiError::Invalid { .. } => Status::invalid_argument(message),
            ApiError::Conflict { .. } | ApiError::EveryNamespace(_) => {
                Status::failed_precondition(message)
            }
            ApiError::NotWatched { .. } | ApiError::NoGraph | ApiError::NotServed(_) => {
                Status::not_found(message)
            }
            ApiError::NotSynced(_)
            | ApiError::NotRegistered(_)
            | ApiError::GraphNotSynced
            | ApiError::Unavailable(_) => Status::unavailable(message),
            ApiError::NotFresh { .. } => Status::deadline_exceeded(message),
            ApiError::Denied(_) => Status::permission_denied(message),
        }
    }
}

impl From<RegisterError> for ApiError {
    fn from(error: RegisterError) -> Self {
        match error {
            RegisterError::Watches(WatchesError::Invalid { field, problem }) => ApiError::Invalid {
                field,
                reason: problem,
            },
            RegisterError::Watches(WatchesError::Conflict { field, problem }) => {
                ApiError::Conflict {
                    field,
                    reason: problem,
                }
            }
            error @ RegisterError::UnknownKind { .. } => ApiError::NotServed(error.to_string()),
            error @ (RegisterError::Discovery { .. }
            | RegisterError::Refused { .. }
            | RegisterError::ShuttingDown) => ApiError::Unavailable(error.to_string()),
        }
    }
}

pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ApiError {
    ApiError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}
