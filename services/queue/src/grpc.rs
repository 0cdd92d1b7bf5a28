//! The gRPC edge of the queue: validates requests, converts them for the actor, and maps
//! results to responses. Every key is validated here, once, into the [`ValidKey`] the actor
//! and the core take as is. Refusals are [`EdgeError`]s; `From<EdgeError> for Status` is the
//! one place a `tonic::Status` is made.

use std::{
    collections::HashMap,
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use futures::{Stream, StreamExt};
use prost::Message;
use switchyard_ownership::ShardState;
use switchyard_proto::{
    common::v1::{NotShardOwner, WorkKey as ProtoKey},
    queue::v1::{
        self as pb, outcome::Result as OutcomeResult, queue_server,
        work_request::Request as WorkMessage, work_response::Response as WorkReply,
    },
};
use switchyard_queue_core::{
    Cause, ControllerId, KeyError, KeySpace, KindVersions, Lease, LeaseId, MAX_CREDIT, MAX_DELAY,
    MAX_FLOOR_KIND_LEN, MAX_FLOOR_KINDS, Origin, Outcome, Priority, ReadFloor, ShardStats,
    ValidKey,
};
use switchyard_runtime::{
    authz::Caller,
    trace::{self, TraceFields},
};
use switchyard_shards::member::Member;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tonic::{Code, Request, Response, Status, Streaming};

use crate::actor::{Add, Closed, Command, EnqueueError, Handle, ToWorker};
use crate::grants::{NotGranted, WorkGrants};

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
        let caller = request.extensions().get::<Caller>().cloned();
        let mut inbound = request.into_inner();
        let hello = match inbound.message().await? {
            Some(pb::WorkRequest {
                request: Some(WorkMessage::Hello(hello)),
            }) => hello,
            _ => {
                return Err(EdgeError::Invalid(
                    "the first message of a work stream must be hello".into(),
                )
                .into());
            }
        };
        // More names than the queue may know could only repeat some: each lease would walk
        // them all.
        let most = self.keys.max_controllers();
        if hello.controllers.len() > most {
            return Err(EdgeError::Invalid(format!(
                "hello.controllers: {} names, at most {most} (--max-controllers)",
                hello.controllers.len()
            ))
            .into());
        }
        // Without identities (plaintext, for development) nothing is checked.
        if let Some(caller) = caller {
            self.grants
                .check(&caller.identity.service_account, &hello.controllers)
                .map_err(EdgeError::from)?;
        }
        // A worker's controllers become known here if they are new, so its stream is
        // served before the first key of theirs arrives.
        let controllers = hello
            .controllers
            .iter()
            .enumerate()
            .map(|(i, name)| {
                self.keys
                    .intern(name)
                    .map_err(|error| name_error(&format!("hello.controllers[{i}]"), error))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if hello.worker_id.len() > MAX_WORKER_ID_BYTES {
            return Err(EdgeError::Invalid(format!(
                "hello.worker_id: {} bytes, at most {}",
                hello.worker_id.len(),
                MAX_WORKER_ID_BYTES
            ))
            .into());
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let worker = self
            .handle
            .connect(Arc::from(hello.worker_id.as_str()), controllers, tx)
            .await
            .map_err(EdgeError::from)?;
        // Dropped with the response stream: tells the reader the RPC is over. Only the actor
        // holds the item sender, so the stream ends when the actor forgets the worker.
        let (stream_alive, mut stream_gone) = oneshot::channel::<()>();
        tracing::debug!(worker, worker_id = %hello.worker_id, "worker connected");

        // One permit per reply the worker has yet to read: taken before an outcome or an
        // extension goes to the actor, given back when its reply is written to the stream.
        let pending = Arc::new(Semaphore::new(MAX_PENDING_REPLIES));
        let replied = Arc::clone(&pending);
        let handle = self.handle.clone();
        tokio::spawn(async move {
            let clean = loop {
                let message = tokio::select! {
                    message = inbound.message() => message,
                    // The response stream ended (server shutdown or an invalid message).
                    _ = &mut stream_gone => break false,
                };
                let message = match message {
                    Ok(Some(message)) => message,
                    Ok(None) => break true,
                    Err(_) => break false,
                };
                let command = match convert_work_message(worker, message) {
                    Ok(command) => command,
                    Err(reason) => Command::Invalid { worker, reason },
                };
                if matches!(command, Command::Complete { .. } | Command::Extend { .. }) {
                    let permit = tokio::select! {
                        permit = pending.acquire() => permit,
                        _ = &mut stream_gone => break false,
                    };
                    match permit {
                        Ok(permit) => permit.forget(),
                        Err(_) => break false,
                    }
                }
                let invalid = matches!(command, Command::Invalid { .. });
                if handle.send(command).await.is_err() || invalid {
                    return;
                }
            };
            let _ = handle.send(Command::Disconnect { worker, clean }).await;
        });

        let keys = self.keys.clone();
        let stream = UnboundedReceiverStream::new(rx).map(move |message| {
            let _alive = &stream_alive;
            if matches!(message, ToWorker::Ack { .. } | ToWorker::Extended { .. }) {
                replied.add_permits(1);
            }
            to_response(&keys, message).map_err(Status::from)
        });
        Ok(Response::new(Box::pin(stream)))
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

fn to_response(keys: &KeySpace, message: ToWorker) -> Result<pb::WorkResponse, EdgeError> {
    match message {
        ToWorker::Item(lease) => Ok(pb::WorkResponse {
            response: Some(WorkReply::Item(leased_item(keys, &lease))),
        }),
        ToWorker::Ack { lease, result } => Ok(pb::WorkResponse {
            response: Some(WorkReply::OutcomeAck(pb::OutcomeAck {
                lease_id: lease.to_string(),
                applied: result.is_ok(),
                reason: result.err().map(|r| r.to_string()).unwrap_or_default(),
            })),
        }),
        ToWorker::Extended { lease, result } => match result {
            Ok(deadline) => Ok(pb::WorkResponse {
                response: Some(WorkReply::LeaseExtended(pb::LeaseExtended {
                    lease_id: lease.to_string(),
                    lease_deadline: Some(timestamp(deadline)),
                    applied: true,
                    reason: String::new(),
                })),
            }),
            // Refused (the lease expired, its shard moved, or another stream holds it): that
            // lease alone ends; the stream and its other leases go on.
            Err(refused) => Ok(pb::WorkResponse {
                response: Some(WorkReply::LeaseExtended(pb::LeaseExtended {
                    lease_id: lease.to_string(),
                    lease_deadline: None,
                    applied: false,
                    reason: refused.to_string(),
                })),
            }),
        },
        ToWorker::Invalid(reason) => Err(EdgeError::Invalid(reason)),
    }
}

impl QueueService {
    /// Converts and validates one item of a batch for `shard`.
    fn convert_item(
        &self,
        index: usize,
        item: pb::EnqueueItem,
        shard: u32,
    ) -> Result<Add, EdgeError> {
        let field = |name: &str| format!("items[{index}].{name}");
        let key = item
            .key
            .ok_or_else(|| EdgeError::Invalid(format!("{}: required", field("key"))))?;
        let priority = match pb::Priority::try_from(item.priority) {
            Ok(pb::Priority::Low) => Priority::Low,
            Ok(pb::Priority::Normal | pb::Priority::Unspecified) => Priority::Normal,
            Err(_) => {
                return Err(EdgeError::Invalid(format!(
                    "{}: unknown value {}",
                    field("priority"),
                    item.priority
                )));
            }
        };
        let delay = match item.delay {
            None => Duration::ZERO,
            Some(d) => {
                let delay = switchyard_proto::duration(d).ok_or_else(|| {
                    EdgeError::Invalid(format!("{}: must not be negative", field("delay")))
                })?;
                if delay > MAX_DELAY {
                    return Err(EdgeError::Invalid(format!(
                        "{}: {delay:?}, at most {MAX_DELAY:?}",
                        field("delay")
                    )));
                }
                delay
            }
        };
        let key = self
            .keys
            .validate_parts(&key.controller, &key.namespace, &key.name)
            .map_err(|error| key_error(index, error))?;
        if key.shard() != shard {
            return Err(EdgeError::Invalid(format!(
                "items[{index}].key: hashes to shard {}, not the batch's shard",
                key.shard()
            )));
        }
        let size: usize = item
            .trace_context
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum();
        if size > MAX_TRACE_CONTEXT_BYTES {
            return Err(EdgeError::Invalid(format!(
                "{}: {size} bytes, at most {MAX_TRACE_CONTEXT_BYTES}",
                field("trace_context")
            )));
        }
        let mut trace_context = item.trace_context;
        trace_context.retain(|k, _| TRACE_CONTEXT_KEYS.contains(&k.as_str()));
        let cause = trace_context
            .contains_key("traceparent")
            .then(|| self.enqueue_cause(&key, trace_context));
        let observed_at = match item.observed_at {
            None => None,
            Some(at) => Some(valid_timestamp(at).ok_or_else(|| {
                EdgeError::Invalid(format!(
                    "{}: not a valid timestamp (0001-01-01 to 9999-12-31, nanos 0 to 999999999)",
                    field("observed_at")
                ))
            })?),
        };
        Ok(Add {
            key,
            priority,
            delay,
            origin: Origin { cause, observed_at },
        })
    }

    /// The cause an add keeps: the context of an `enqueue` span, child of the sender's
    /// event, when this replica exports traces; the sender's context as it came otherwise.
    fn enqueue_cause(&self, key: &ValidKey, fields: TraceFields) -> Cause {
        enqueue_cause(&self.keys.name(key.controller()), key, fields)
    }
}

fn enqueue_cause(controller: &str, key: &ValidKey, fields: TraceFields) -> Cause {
    let fields = if trace::exporting() {
        let span = tracing::info_span!(
            "enqueue",
            otel.kind = "consumer",
            controller,
            namespace = key.namespace(),
            name = key.name(),
        );
        trace::set_parent(&span, &fields);
        let ours = trace::inject(&span);
        if ours.is_empty() { fields } else { ours }
    } else {
        fields
    };
    fields.into_iter().collect::<Vec<_>>().into()
}

/// The span of a lease that covers traced adds: a child of the oldest cause, linked to the
/// others (the reconcile links to them all); what the worker gets as the lease's context.
fn lease_context(controller: &str, lease: &Lease) -> TraceFields {
    let Some(first) = lease.causes.first() else {
        return TraceFields::new();
    };
    let first: TraceFields = first.iter().cloned().collect();
    if !trace::exporting() {
        return first;
    }
    let span = tracing::info_span!(
        "lease",
        otel.kind = "producer",
        controller,
        key = %format_args!("{}/{}", lease.key.namespace(), lease.key.name()),
        shard = lease.shard(),
        epoch = lease.epoch,
        attempt = lease.attempt,
        causes = lease.causes.len(),
        causes_dropped = lease.causes_dropped,
    );
    trace::set_parent(&span, &first);
    for cause in &lease.causes[1..] {
        trace::add_link(&span, &cause.iter().cloned().collect());
    }
    let ours = trace::inject(&span);
    if ours.is_empty() { first } else { ours }
}

/// A refused key of item `index` of a batch, naming the field.
fn key_error(index: usize, error: KeyError) -> EdgeError {
    EdgeError::Invalid(match error {
        KeyError::InvalidArgument { field, reason } => format!("items[{index}].{field}: {reason}"),
        other => format!("items[{index}].key.controller: {other}"),
    })
}

/// A refused controller name, `field` being where the request gave it.
fn name_error(field: &str, error: KeyError) -> EdgeError {
    EdgeError::Invalid(match error {
        KeyError::InvalidArgument { reason, .. } => format!("{field}: {reason}"),
        other => format!("{field}: {other}"),
    })
}

/// What an outcome reports it read at, checked against the floor's bounds.
fn read_floor(outcome: &pb::Outcome) -> Result<ReadFloor, String> {
    Ok(ReadFloor {
        kinds: kind_versions("outcome.observed", &outcome.observed)?,
        namespace: kind_versions("outcome.namespace_observed", &outcome.namespace_observed)?,
    })
}

/// One map of an outcome's report, `field` being where the request gave it.
fn kind_versions(field: &str, observed: &HashMap<String, u64>) -> Result<KindVersions, String> {
    if observed.len() > MAX_FLOOR_KINDS {
        return Err(format!(
            "{field}: {} kinds, at most {MAX_FLOOR_KINDS}",
            observed.len()
        ));
    }
    if let Some(kind) = observed
        .keys()
        .find(|kind| kind.is_empty() || kind.len() > MAX_FLOOR_KIND_LEN)
    {
        return Err(format!(
            "{field}: kind {:?} must be 1 to {MAX_FLOOR_KIND_LEN} bytes",
            kind.chars().take(64).collect::<String>()
        ));
    }
    Ok(observed
        .iter()
        .map(|(kind, rv)| (kind.as_str(), *rv))
        .collect())
}

/// The lease a message names; an id that does not parse names none, so its outcome or
/// extension is refused as unknown, as any other lease id never issued is.
fn lease_id(id: &str) -> LeaseId {
    id.parse().unwrap_or(LeaseId::NONE)
}

fn convert_work_message(worker: u64, message: pb::WorkRequest) -> Result<Command, String> {
    match message.request {
        None => Err("request: one of hello, credit, outcome or extend is required".into()),
        Some(WorkMessage::Hello(_)) => Err("hello: only the first message may be hello".into()),
        Some(WorkMessage::Credit(credit)) => {
            if !(1..=MAX_CREDIT).contains(&credit.items) {
                return Err(format!(
                    "credit.items: {} is out of range 1..={MAX_CREDIT}",
                    credit.items
                ));
            }
            Ok(Command::Credit {
                worker,
                items: credit.items,
            })
        }
        Some(WorkMessage::Outcome(outcome)) => {
            let error = match &outcome.result {
                Some(OutcomeResult::Failed(failed)) if !failed.reason.is_empty() => {
                    Some(failed.reason.clone())
                }
                _ => None,
            };
            let result = match outcome.result {
                None => return Err("outcome.result: required".into()),
                Some(OutcomeResult::Done(_)) => Outcome::Done,
                Some(OutcomeResult::Forget(_)) => Outcome::Forget,
                Some(OutcomeResult::Failed(_)) => Outcome::Failed,
                Some(OutcomeResult::RequeueAfter(r)) => {
                    let delay = match r.delay {
                        None => Duration::ZERO,
                        Some(d) => switchyard_proto::duration(d).ok_or_else(|| {
                            "outcome.requeue_after.delay: must not be negative".to_owned()
                        })?,
                    };
                    Outcome::RequeueAfter(delay)
                }
            };
            Ok(Command::Complete {
                worker,
                shard: outcome.shard,
                epoch: outcome.epoch,
                lease: lease_id(&outcome.lease_id),
                outcome: result,
                observed: read_floor(&outcome)?,
                error,
            })
        }
        Some(WorkMessage::Extend(extend)) => {
            let by = extend
                .extend_by
                .and_then(switchyard_proto::duration)
                .filter(|d| !d.is_zero())
                .ok_or_else(|| "extend.extend_by: must be a positive duration".to_owned())?;
            Ok(Command::Extend {
                worker,
                shard: extend.shard,
                epoch: extend.epoch,
                lease: lease_id(&extend.lease_id),
                by,
            })
        }
    }
}

/// A held key as callers name it.
pub(crate) fn proto_key(keys: &KeySpace, key: &ValidKey) -> ProtoKey {
    ProtoKey {
        controller: keys.name(key.controller()).to_string(),
        namespace: key.namespace().to_owned(),
        name: key.name().to_owned(),
    }
}

fn leased_item(keys: &KeySpace, lease: &Lease) -> pb::LeasedItem {
    let controller = keys.name(lease.controller());
    let now = Instant::now();
    pb::LeasedItem {
        key: Some(proto_key(keys, &lease.key)),
        shard: lease.shard(),
        epoch: lease.epoch,
        lease_id: lease.id.to_string(),
        attempt: lease.attempt,
        lease_deadline: Some(timestamp(lease.deadline)),
        queued_at: Some(timestamp(now.checked_sub(lease.waited).unwrap_or(now))),
        causes: lease
            .causes
            .iter()
            .map(|cause| pb::TraceContext {
                fields: cause.iter().cloned().collect(),
            })
            .collect(),
        causes_dropped: lease.causes_dropped,
        observed_at: lease.observed_at.map(prost_types::Timestamp::from),
        trace_context: lease_context(&controller, lease),
        read_floor: proto_versions(&lease.read_floor.kinds),
        namespace_read_floor: proto_versions(&lease.read_floor.namespace),
        shard_held_for: prost_types::Duration::try_from(lease.shard_held_for).ok(),
    }
}

fn proto_versions(versions: &KindVersions) -> HashMap<String, u64> {
    versions
        .iter()
        .map(|(kind, rv)| (kind.to_owned(), rv))
        .collect()
}

/// A `google.protobuf.Timestamp` as its definition allows it: from 0001-01-01T00:00:00Z to
/// 9999-12-31T23:59:59.999999999Z, nanos not negative and below a second.
fn valid_timestamp(at: prost_types::Timestamp) -> Option<SystemTime> {
    const SECONDS: std::ops::RangeInclusive<i64> = -62_135_596_800..=253_402_300_799;
    (SECONDS.contains(&at.seconds) && (0..1_000_000_000).contains(&at.nanos))
        .then(|| SystemTime::try_from(at).ok())
        .flatten()
}

/// A monotonic instant as wall-clock time.
pub(crate) fn timestamp(at: Instant) -> prost_types::Timestamp {
    let now = Instant::now();
    let wall = if at >= now {
        SystemTime::now() + (at - now)
    } else {
        SystemTime::now() - (now - at)
    };
    prost_types::Timestamp::from(wall)
}

pub(crate) fn duration(d: Duration) -> Option<prost_types::Duration> {
    prost_types::Duration::try_from(d).ok()
}

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
