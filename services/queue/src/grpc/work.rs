//! A worker's `Work` stream at the edge: the hello (its controllers, checked against the
//! caller's grants), leases handed out as the worker grants credits, and its outcomes and
//! lease extensions converted for the actor and answered in order.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::StreamExt;
use switchyard_proto::queue::v1::{
    self as pb, outcome::Result as OutcomeResult, work_request::Request as WorkMessage,
    work_response::Response as WorkReply,
};
use switchyard_queue_core::{
    KeySpace, KindVersions, Lease, LeaseId, MAX_CREDIT, MAX_FLOOR_KIND_LEN, MAX_FLOOR_KINDS,
    Outcome, ReadFloor,
};
use switchyard_runtime::{
    authz::Caller,
    trace::{self, TraceFields},
};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::{
    BoxStream, MAX_PENDING_REPLIES, MAX_WORKER_ID_BYTES, QueueService,
    convert::{name_error, proto_key, timestamp},
    error::EdgeError,
};
use crate::actor::{Command, Completion, ToWorker};

impl QueueService {
    /// A worker's `Work` stream: its hello, then leases out as credits allow and outcomes
    /// and extensions in, each answered in order.
    pub(super) async fn work_session(
        &self,
        request: Request<Streaming<pb::WorkRequest>>,
    ) -> Result<Response<BoxStream<pb::WorkResponse>>, Status> {
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
                done: Completion {
                    shard: outcome.shard,
                    epoch: outcome.epoch,
                    lease: lease_id(&outcome.lease_id),
                    outcome: result,
                    observed: read_floor(&outcome)?,
                    error,
                },
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
