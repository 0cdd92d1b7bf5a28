//! `Queue.DescribeKey` at the edge: validates the key, asks the actor, and converts what it
//! answers (`kubectl switchyard why`). The key's shard must be served here; a caller that
//! asked the wrong replica is redirected as an enqueue is.

use switchyard_proto::{common::v1::WorkKey as ProtoKey, queue::v1 as pb};
use switchyard_queue_core::{KeyError, KeyPhase, OutcomeKind};

use crate::{
    actor::Described,
    grpc::{EdgeError, QueueService, duration, proto_key, timestamp},
};

impl QueueService {
    pub(crate) async fn describe_key(
        &self,
        request: pb::DescribeKeyRequest,
    ) -> Result<pb::DescribeKeyResponse, EdgeError> {
        let key = request
            .key
            .ok_or_else(|| EdgeError::Invalid("key: required".into()))?;
        // Describing makes no controller name known: one never served has no keys.
        if self.keys().controller_id(&key.controller).is_none() {
            return Err(EdgeError::Invalid(format!(
                "key.controller: unknown controller {:?}",
                key.controller
            )));
        }
        let valid = self
            .keys()
            .validate_parts(&key.controller, &key.namespace, &key.name)
            .map_err(|error| match error {
                KeyError::InvalidArgument { field, reason } => {
                    EdgeError::Invalid(format!("{field}: {reason}"))
                }
                KeyError::TooManyControllers { .. } => EdgeError::Invalid(error.to_string()),
            })?;
        let shard = valid.shard();
        match self.handle().describe(valid).await? {
            Some(described) => Ok(response(key, shard, described)),
            None => Err(self.not_owner(shard)),
        }
    }
}

/// Keys at most one `ListFailing` returns.
pub const MAX_FAILING: u32 = 1000;
/// Keys it returns when the request names no limit.
const DEFAULT_FAILING: u32 = 100;

impl QueueService {
    pub(crate) async fn list_failing(
        &self,
        request: pb::ListFailingRequest,
    ) -> Result<pb::ListFailingResponse, EdgeError> {
        let controller = self.controller_filter(&request.controller)?;
        let limit = match request.limit {
            0 => DEFAULT_FAILING,
            n if n > MAX_FAILING => {
                return Err(EdgeError::Invalid(format!(
                    "limit: {n} is more than {MAX_FAILING}"
                )));
            }
            n => n,
        };
        let (keys, total) = self.handle().failing(controller, limit as usize).await?;
        Ok(pb::ListFailingResponse {
            keys: keys
                .into_iter()
                .map(|(key, described)| {
                    response(proto_key(self.keys(), &key), key.shard(), described)
                })
                .collect(),
            total: total as u64,
        })
    }
}

fn response(key: ProtoKey, shard: u32, described: Described) -> pb::DescribeKeyResponse {
    let mut response = pb::DescribeKeyResponse {
        key: Some(key),
        shard,
        epoch: described.epoch,
        failures: described.failures,
        ..Default::default()
    };
    let phase = match described.phase {
        KeyPhase::Absent => pb::KeyPhase::Absent,
        KeyPhase::Queued { since } => {
            response.ready_since = Some(timestamp(since));
            pb::KeyPhase::Queued
        }
        KeyPhase::Delayed { until } => {
            response.ready_at = Some(timestamp(until));
            pb::KeyPhase::Delayed
        }
        KeyPhase::Leased {
            deadline,
            readd_pending,
            ..
        } => {
            response.lease_deadline = Some(timestamp(deadline));
            response.readd_pending = readd_pending;
            response.worker_id = described.holder.as_deref().unwrap_or_default().to_owned();
            pb::KeyPhase::Leased
        }
    };
    response.set_phase(phase);
    response.last_outcome = described.last.map(|(last, worker)| {
        let mut out = pb::LastOutcome {
            finished_at: Some(timestamp(last.finished_at)),
            attempt: last.attempt,
            error: last.error.as_deref().unwrap_or_default().to_owned(),
            trace_id: last.trace_id.map(|t| t.to_string()).unwrap_or_default(),
            worker_id: worker.as_deref().unwrap_or_default().to_owned(),
            duration: duration(last.duration),
            ..Default::default()
        };
        out.set_kind(match last.kind {
            OutcomeKind::Done => pb::OutcomeKind::Done,
            OutcomeKind::RequeueAfter => pb::OutcomeKind::RequeueAfter,
            OutcomeKind::Failed => pb::OutcomeKind::Failed,
            OutcomeKind::Forget => pb::OutcomeKind::Forget,
            OutcomeKind::LeaseExpired => pb::OutcomeKind::LeaseExpired,
        });
        out
    });
    response
}
