//! What a queue call can end with. [`Error::from`] a `tonic::Status` is the one place the
//! queue's status codes are read.

use prost::Message;
use switchyard_proto::common::v1::NotShardOwner;
use tonic::Code;

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The queue refused the request as invalid (INVALID_ARGUMENT): resending it cannot help.
    #[error("the queue refused the request as invalid: {0}")]
    Invalid(String),
    /// The replica does not serve the shard (FAILED_PRECONDITION with a `NotShardOwner`
    /// detail): the shard is moving, or the caller's shard map is stale.
    #[error("shard {shard} is not served by that replica; {message}")]
    NotOwner {
        shard: u32,
        /// The owner, when the replica knows it; empty otherwise.
        owner_address: String,
        message: String,
    },
    /// The queue refused an operation on a lease (FAILED_PRECONDITION): the lease expired,
    /// or its shard moved.
    #[error("the queue refused: {0}")]
    Refused(String),
    /// The queue refused this caller (UNAUTHENTICATED: no valid certificate;
    /// PERMISSION_DENIED: an identity that may not make the call).
    #[error("the queue refused this caller: {0}")]
    Denied(String),
    /// The queue is full (RESOURCE_EXHAUSTED).
    #[error("the queue is full: {0}")]
    Full(String),
    /// The queue is unreachable, shutting down, or ended the stream: try again later.
    #[error("the queue is unavailable: {0}")]
    Unavailable(String),
    /// The work stream is closed: nothing more can be sent on it.
    #[error("the work stream is closed")]
    Closed,
    #[error("queue address {address:?}: {reason}")]
    InvalidAddress { address: String, reason: String },
    /// Any other status the queue does not send on purpose.
    #[error("the queue answered {code:?}: {message}")]
    Other { code: Code, message: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether sending the same request again later may succeed.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Self::Invalid(_) | Self::InvalidAddress { .. })
    }
}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Self {
        let message = status.message().to_owned();
        match status.code() {
            Code::InvalidArgument => Self::Invalid(message),
            Code::FailedPrecondition => match NotShardOwner::decode(status.details()) {
                Ok(detail) if !status.details().is_empty() => Self::NotOwner {
                    shard: detail.shard,
                    owner_address: detail.owner_address,
                    message,
                },
                _ => Self::Refused(message),
            },
            Code::ResourceExhausted => Self::Full(message),
            Code::Unauthenticated | Code::PermissionDenied => Self::Denied(message),
            Code::Unavailable | Code::Cancelled | Code::DeadlineExceeded | Code::Aborted => {
                Self::Unavailable(message)
            }
            code => Self::Other { code, message },
        }
    }
}

impl From<tonic::transport::Error> for Error {
    fn from(error: tonic::transport::Error) -> Self {
        Self::Unavailable(error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use tonic::Status;

    use super::*;

    #[test]
    fn statuses_become_typed_errors() {
        let detail = NotShardOwner {
            shard: 7,
            owner_address: "q-2:50052".into(),
            epoch: 4,
        };
        let moved = Status::with_details(
            Code::FailedPrecondition,
            "moved",
            detail.encode_to_vec().into(),
        );
        assert!(matches!(
            Error::from(moved),
            Error::NotOwner { shard: 7, ref owner_address, .. } if owner_address == "q-2:50052"
        ));
        assert!(matches!(
            Error::from(Status::failed_precondition("extend lease 3: unknown lease")),
            Error::Refused(_)
        ));
        let invalid = Error::from(Status::invalid_argument(
            "items[0].key.name: must not be empty",
        ));
        assert!(!invalid.is_retryable());
        assert_eq!(
            invalid.to_string(),
            "the queue refused the request as invalid: items[0].key.name: must not be empty"
        );
        for retryable in [
            Status::unavailable("the queue is shutting down"),
            Status::resource_exhausted("full"),
            Status::internal("boom"),
        ] {
            assert!(Error::from(retryable).is_retryable());
        }
    }
}
