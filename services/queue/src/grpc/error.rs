//! Why the edge refused a request or ended a stream, and the one place a `tonic::Status` is
//! made from it.

use prost::Message;
use switchyard_proto::common::v1::NotShardOwner;
use tonic::{Code, Status};

use super::QueueService;
use crate::{actor::Closed, grants::NotGranted};

/// Why the edge refused a request or ended a stream.
#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    /// A field of the request is wrong; the message names it.
    #[error("{0}")]
    Invalid(String),
    /// The shard is not served here: go to the owner, or refresh the shard map when it is not
    /// known (`owner_address` empty).
    #[error("shard {shard} is not served by this replica; {}", redirect(.owner_address))]
    NotOwner {
        shard: u32,
        owner_address: String,
        epoch: u64,
    },
    #[error("the queue is shutting down")]
    ShuttingDown,
    /// Too many batches wait for room: nothing of this one was added.
    #[error("{0}")]
    Busy(String),
    /// The caller's identity may not do what it asked.
    #[error(transparent)]
    NotGranted(#[from] NotGranted),
}

fn redirect(owner_address: &str) -> String {
    if owner_address.is_empty() {
        "refresh the shard map".to_owned()
    } else {
        format!("it is served at {owner_address}")
    }
}

impl From<Closed> for EdgeError {
    fn from(_: Closed) -> Self {
        Self::ShuttingDown
    }
}

/// The one mapping from the edge's errors to gRPC status codes.
impl From<EdgeError> for Status {
    fn from(error: EdgeError) -> Self {
        let message = switchyard_runtime::status_message(error.to_string());
        match error {
            EdgeError::Invalid(_) => Status::invalid_argument(message),
            // With a `NotShardOwner` detail, so that a sender can go to the owner.
            EdgeError::NotOwner {
                shard,
                owner_address,
                epoch,
            } => {
                let detail = NotShardOwner {
                    shard,
                    owner_address,
                    epoch,
                };
                Status::with_details(
                    Code::FailedPrecondition,
                    message,
                    detail.encode_to_vec().into(),
                )
            }
            EdgeError::ShuttingDown => Status::unavailable(message),
            EdgeError::Busy(_) => Status::resource_exhausted(message),
            EdgeError::NotGranted(_) => Status::permission_denied(message),
        }
    }
}

impl QueueService {
    pub(crate) fn not_owner(&self, shard: u32) -> EdgeError {
        let (owner_address, epoch) = self.owner_of(shard);
        EdgeError::NotOwner {
            shard,
            owner_address,
            epoch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_errors_map_to_their_codes_and_name_the_owner() {
        let status = Status::from(EdgeError::NotOwner {
            shard: 3,
            owner_address: "q-1:50052".into(),
            epoch: 9,
        });
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(
            status.message(),
            "shard 3 is not served by this replica; it is served at q-1:50052"
        );
        let detail = NotShardOwner::decode(status.details()).unwrap();
        assert_eq!((detail.shard, detail.epoch), (3, 9));
        let unknown = Status::from(EdgeError::NotOwner {
            shard: 3,
            owner_address: String::new(),
            epoch: 0,
        });
        assert_eq!(
            unknown.message(),
            "shard 3 is not served by this replica; refresh the shard map"
        );
        for (error, code) in [
            (EdgeError::Invalid("x: bad".into()), Code::InvalidArgument),
            (EdgeError::ShuttingDown, Code::Unavailable),
        ] {
            assert_eq!(Status::from(error).code(), code);
        }
    }
}
