//! One call to one queue replica: the requests, `EnqueueMany` (or `Enqueue` per batch for a
//! replica without it), and what the replica answered for each batch.

use std::sync::Arc;

use switchyard_proto::queue::v1::{
    EnqueueManyRequest, EnqueueRequest, enqueue_result, queue_client::QueueClient,
};
use switchyard_runtime::{Dialer, Role};
use tonic::{Code, transport::Channel};
use tracing::error;

use super::{pending::Batch, schedule::Batches};
use crate::{Error, convert};

/// A queue replica's client, and whether it answers EnqueueMany (a replica from before
/// it answers UNIMPLEMENTED, and is then sent a batch per Enqueue).
#[derive(Clone, Debug)]
pub(super) struct Replica {
    pub(super) client: QueueClient<Channel>,
    pub(super) many: bool,
    /// Calls to it in flight.
    pub(super) calls: usize,
}

impl Replica {
    pub(super) fn new(dialer: &Dialer, address: &str) -> Self {
        let client = match crate::endpoint(dialer, address) {
            Ok(endpoint) => QueueClient::new(dialer.lazy(&endpoint, Role::Queue)),
            Err(error) => {
                // An address from the shard map that is not a URI authority: requests fail
                // and the keys wait until the map names a usable address.
                error!(%address, %error, "invalid queue address in the shard map");
                QueueClient::new(Channel::from_static("http://invalid.invalid").connect_lazy())
            }
        };
        Self {
            client,
            many: true,
            calls: 0,
        }
    }
}

/// A call's answer: one result per batch, in the call's order; `None` when the replica has
/// no EnqueueMany.
pub(super) struct Sent {
    pub(super) address: Arc<str>,
    pub(super) call: Batches,
    pub(super) results: Option<Vec<Result<(), Error>>>,
}

pub(super) fn request(shard: u32, batch: &Batch) -> EnqueueRequest {
    EnqueueRequest {
        batch_id: 0,
        shard,
        items: batch
            .iter()
            .flat_map(|(key, waiting)| {
                convert::enqueue_items(
                    key,
                    waiting.priority,
                    waiting.delay,
                    &waiting.causes,
                    waiting.observed_at,
                )
            })
            .collect(),
    }
}

pub(super) async fn send(replica: Replica, address: Arc<str>, call: Batches) -> Sent {
    let Replica {
        mut client, many, ..
    } = replica;
    if !many {
        let results = futures::future::join_all(call.iter().map(|(shard, batch)| {
            let mut client = client.clone();
            let request = request(*shard, batch);
            async move {
                client
                    .enqueue(request)
                    .await
                    .map(|_| ())
                    .map_err(Error::from)
            }
        }))
        .await;
        return Sent {
            address,
            call,
            results: Some(results),
        };
    }
    let request = EnqueueManyRequest {
        batches: call
            .iter()
            .map(|(shard, batch)| request(*shard, batch))
            .collect(),
    };
    let results = match client.enqueue_many(request).await {
        Ok(response) => {
            let mut results: Vec<Result<(), Error>> = response
                .into_inner()
                .results
                .into_iter()
                .map(|result| match result.result {
                    Some(enqueue_result::Result::Added(_)) => Ok(()),
                    Some(enqueue_result::Result::Refused(refusal)) => {
                        Err(Error::from(tonic::Status::with_details(
                            Code::from(refusal.code),
                            refusal.message,
                            refusal.details.into(),
                        )))
                    }
                    None => Err(Error::Other {
                        code: Code::Unknown,
                        message: "EnqueueMany: a result without an outcome".into(),
                    }),
                })
                .collect();
            // A batch the replica did not answer was not acknowledged: it goes again.
            results.resize_with(call.len(), || {
                Err(Error::Other {
                    code: Code::Unknown,
                    message: format!("EnqueueMany: {} batches sent, fewer answered", call.len()),
                })
            });
            results
        }
        Err(status) if status.code() == Code::Unimplemented => {
            return Sent {
                address,
                call,
                results: None,
            };
        }
        Err(status) => {
            let error = Error::from(status);
            call.iter().map(|_| Err(error.clone())).collect()
        }
    };
    Sent {
        address,
        call,
        results: Some(results),
    }
}
