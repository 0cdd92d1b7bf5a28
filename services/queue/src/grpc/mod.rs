//! The gRPC edge of the queue: validates requests, converts them for the actor, and maps
//! results to responses. Every key is validated here, once, into the [`ValidKey`] the actor
//! and the core take as is. Refusals are [`EdgeError`]s; `From<EdgeError> for Status` is the
//! one place a `tonic::Status` is made.

use std::pin::Pin;

use futures::Stream;
use switchyard_ownership::ShardState;
use switchyard_proto::queue::v1::{self as pb, queue_server};
use switchyard_queue_core::{ControllerId, KeySpace, MAX_CREDIT, ShardStats};
use switchyard_shards::member::Member;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

mod convert;
mod describe;
mod error;
mod work;

pub(crate) use convert::{duration, proto_key, timestamp};
pub use error::EdgeError;

use crate::actor::{Add, EnqueueError, Handle};
use crate::grants::WorkGrants;

/// Outcomes and extensions of one work stream whose replies the worker has not yet read. A
/// worker that sends faster than it reads is held here (and so by HTTP/2 flow control)
/// rather than growing the queue's memory; a well-behaved worker has at most one pending
/// reply per lease it holds.
pub const MAX_PENDING_REPLIES: usize = 2 * MAX_CREDIT as usize;
/// Bytes of one item's trace context, keys and values: a W3C `traceparent` is 55 bytes and a
/// `tracestate` at most 512, so this leaves room for a longer future version and nothing more
/// (a queued key keeps up to 16 of them).
pub const MAX_TRACE_CONTEXT_BYTES: usize = 1024;
/// Bytes of a worker's id kept from its hello: a pod name and a suffix fit.
pub const MAX_WORKER_ID_BYTES: usize = 253;
/// Batches of one `EnqueueMany` call: a sender's keys for one replica, a batch per shard
/// (at most the shard count, 256 by default), with room for a sender that splits a shard's
/// keys over several batches.
pub const MAX_BATCHES_PER_CALL: usize = 4096;
/// The trace context keys kept; others are dropped.
const TRACE_CONTEXT_KEYS: [&str; 2] = ["traceparent", "tracestate"];

/// What the edge needs to validate and convert without asking the actor.
#[derive(Clone, Debug)]
pub struct QueueService {
    handle: Handle,
    keys: KeySpace,
    directory: Option<Directory>,
    grants: WorkGrants,
}

/// Who serves which shard, for redirecting callers (membership mode).
#[derive(Clone, Debug)]
pub struct Directory {
    pub map: watch::Receiver<Option<Vec<ShardState>>>,
    pub members: watch::Receiver<Option<Vec<Member>>>,
}

impl QueueService {
    /// Serves the queue behind `handle`, checking each Work stream's controllers against
    /// `grants`.
    pub fn new(handle: Handle, keys: KeySpace, grants: WorkGrants) -> Self {
        Self {
            handle,
            keys,
            directory: None,
            grants,
        }
    }

    pub fn with_directory(mut self, directory: Directory) -> Self {
        self.directory = Some(directory);
        self
    }

    /// The owner of `shard` and its epoch, when known.
    fn owner_of(&self, shard: u32) -> (String, u64) {
        let Some(directory) = &self.directory else {
            return (String::new(), 0);
        };
        let (owner, epoch) = match directory
            .map
            .borrow()
            .as_ref()
            .and_then(|m| m.get(shard as usize))
        {
            Some(ShardState::Active { owner, epoch }) => (owner.clone(), *epoch),
            // Draining: the next owner takes it within the drain grace.
            Some(ShardState::Releasing { next, .. }) => (next.clone(), 0),
            _ => return (String::new(), 0),
        };
        let address = directory
            .members
            .borrow()
            .iter()
            .flatten()
            .find(|m| m.id == owner)
            .map(|m| m.address.clone())
            .unwrap_or_default();
        (address, epoch)
    }

    pub fn into_server(self) -> queue_server::QueueServer<Self> {
        queue_server::QueueServer::new(self)
    }

    pub(crate) fn keys(&self) -> &KeySpace {
        &self.keys
    }

    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// A request's `controller` filter: empty for all, else a controller the queue knows.
    pub(crate) fn controller_filter(&self, name: &str) -> Result<Option<ControllerId>, EdgeError> {
        match name {
            "" => Ok(None),
            name => self.keys.controller_id(name).map(Some).ok_or_else(|| {
                EdgeError::Invalid(format!("controller: unknown controller {name:?}"))
            }),
        }
    }

    /// Checks a whole batch, every key validated and in the batch's shard, before any of it
    /// is applied.
    fn convert_batch(&self, request: pb::EnqueueRequest) -> Result<(u32, Vec<Add>), EdgeError> {
        let shard = request.shard;
        if shard >= self.keys.shard_count() {
            return Err(EdgeError::Invalid(format!(
                "shard: {shard} is not below the shard count {}",
                self.keys.shard_count()
            )));
        }
        let adds = request
            .items
            .into_iter()
            .enumerate()
            .map(|(i, item)| self.convert_item(i, item, shard))
            .collect::<Result<_, _>>()?;
        Ok((shard, adds))
    }

    async fn enqueue_batch(
        &self,
        request: pb::EnqueueRequest,
    ) -> Result<pb::EnqueueResponse, EdgeError> {
        let batch_id = request.batch_id;
        let (shard, adds) = self.convert_batch(request)?;
        let added = self
            .handle
            .enqueue(shard, adds)
            .await?
            .map_err(|error| match error {
                EnqueueError::NotOwner { shard } => self.not_owner(shard),
                EnqueueError::Busy { .. } => EdgeError::Busy(error.to_string()),
            })?;
        Ok(pb::EnqueueResponse {
            batch_id,
            added: added.added,
            coalesced: added.coalesced,
        })
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl queue_server::Queue for QueueService {
    async fn enqueue(
        &self,
        request: Request<pb::EnqueueRequest>,
    ) -> Result<Response<pb::EnqueueResponse>, Status> {
        Ok(Response::new(
            self.enqueue_batch(request.into_inner()).await?,
        ))
    }

    type EnqueueStreamStream = BoxStream<pb::EnqueueAck>;

    async fn enqueue_stream(
        &self,
        request: Request<Streaming<pb::EnqueueRequest>>,
    ) -> Result<Response<Self::EnqueueStreamStream>, Status> {
        let mut inbound = request.into_inner();
        // One batch at a time: the next is read only after this one is acknowledged, so a
        // full queue slows the sender through HTTP/2 flow control.
        let (tx, rx) = mpsc::channel(1);
        let service = self.clone();
        tokio::spawn(async move {
            loop {
                let request = match inbound.message().await {
                    Ok(Some(request)) => request,
                    Ok(None) => return,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                };
                let ack = service
                    .enqueue_batch(request)
                    .await
                    .map(|response| pb::EnqueueAck {
                        response: Some(response),
                    })
                    .map_err(Status::from);
                let failed = ack.is_err();
                if tx.send(ack).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn enqueue_many(
        &self,
        request: Request<pb::EnqueueManyRequest>,
    ) -> Result<Response<pb::EnqueueManyResponse>, Status> {
        let batches = request.into_inner().batches;
        if batches.len() > MAX_BATCHES_PER_CALL {
            return Err(EdgeError::Invalid(format!(
                "batches: {} batches, at most {MAX_BATCHES_PER_CALL}",
                batches.len()
            ))
            .into());
        }
        // Every batch goes to the actor at once; each is answered as Enqueue answers it.
        let results = futures::future::join_all(batches.into_iter().enumerate().map(
            |(i, batch)| async move {
                let result = match self.enqueue_batch(batch).await {
                    Ok(added) => pb::enqueue_result::Result::Added(added),
                    Err(error) => {
                        let error = match error {
                            EdgeError::Invalid(message) => {
                                EdgeError::Invalid(format!("batches[{i}].{message}"))
                            }
                            error => error,
                        };
                        let status = Status::from(error);
                        pb::enqueue_result::Result::Refused(pb::BatchRefusal {
                            code: status.code() as i32,
                            message: status.message().to_owned(),
                            details: status.details().to_vec(),
                        })
                    }
                };
                pb::EnqueueResult {
                    result: Some(result),
                }
            },
        ))
        .await;
        Ok(Response::new(pb::EnqueueManyResponse { results }))
    }

    type WorkStream = BoxStream<pb::WorkResponse>;

    async fn work(
        &self,
        request: Request<Streaming<pb::WorkRequest>>,
    ) -> Result<Response<Self::WorkStream>, Status> {
        self.work_session(request).await
    }

    async fn stats(
        &self,
        request: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsResponse>, Status> {
        let filter = self.controller_filter(&request.into_inner().controller)?;
        let stats = self.handle.stats(filter).await.map_err(EdgeError::from)?;
        let workers = self.handle.workers().await.map_err(EdgeError::from)?;
        Ok(Response::new(pb::StatsResponse {
            shards: stats.iter().map(|s| self.shard_stats(s)).collect(),
            workers: workers
                .into_iter()
                .map(|w| pb::WorkerStats {
                    worker_id: w.name.to_string(),
                    controllers: w
                        .controllers
                        .iter()
                        .map(|c| self.keys.name(*c).to_string())
                        .collect(),
                    credits: w.credits,
                    in_flight: w.in_flight as u64,
                    finished: w.finished,
                })
                .collect(),
        }))
    }

    async fn describe_key(
        &self,
        request: Request<pb::DescribeKeyRequest>,
    ) -> Result<Response<pb::DescribeKeyResponse>, Status> {
        Ok(Response::new(
            QueueService::describe_key(self, request.into_inner()).await?,
        ))
    }

    async fn list_failing(
        &self,
        request: Request<pb::ListFailingRequest>,
    ) -> Result<Response<pb::ListFailingResponse>, Status> {
        Ok(Response::new(
            QueueService::list_failing(self, request.into_inner()).await?,
        ))
    }
}

impl QueueService {
    fn shard_stats(&self, s: &ShardStats) -> pb::ShardStats {
        pb::ShardStats {
            controller: self.keys.name(s.controller).to_string(),
            shard: s.shard,
            epoch: s.epoch,
            depth: s.depth,
            in_flight: s.in_flight,
            oldest_age: duration(s.oldest_ready),
            retrying: s.retrying,
        }
    }
}
