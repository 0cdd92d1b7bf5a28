//! Conversions between the contracts' messages and the queue's own types: items to add,
//! keys, their causes, timestamps and durations.

use std::time::{Duration, Instant, SystemTime};

use switchyard_proto::{common::v1::WorkKey as ProtoKey, queue::v1 as pb};
use switchyard_queue_core::{Cause, KeyError, KeySpace, MAX_DELAY, Origin, Priority, ValidKey};
use switchyard_runtime::trace::{self, TraceFields};

use super::{MAX_TRACE_CONTEXT_BYTES, QueueService, TRACE_CONTEXT_KEYS, error::EdgeError};
use crate::actor::Add;

impl QueueService {
    /// Converts and validates one item of a batch for `shard`.
    pub(super) fn convert_item(
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
    pub(super) fn enqueue_cause(&self, key: &ValidKey, fields: TraceFields) -> Cause {
        enqueue_cause(&self.keys.name(key.controller()), key, fields)
    }
}

pub(super) fn enqueue_cause(controller: &str, key: &ValidKey, fields: TraceFields) -> Cause {
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
/// A refused key of item `index` of a batch, naming the field.
pub(super) fn key_error(index: usize, error: KeyError) -> EdgeError {
    EdgeError::Invalid(match error {
        KeyError::InvalidArgument { field, reason } => format!("items[{index}].{field}: {reason}"),
        other => format!("items[{index}].key.controller: {other}"),
    })
}

/// A refused controller name, `field` being where the request gave it.
pub(super) fn name_error(field: &str, error: KeyError) -> EdgeError {
    EdgeError::Invalid(match error {
        KeyError::InvalidArgument { reason, .. } => format!("{field}: {reason}"),
        other => format!("{field}: {other}"),
    })
}

/// What an outcome reports it read at, checked against the floor's bounds.
pub(crate) fn proto_key(keys: &KeySpace, key: &ValidKey) -> ProtoKey {
    ProtoKey {
        controller: keys.name(key.controller()).to_string(),
        namespace: key.namespace().to_owned(),
        name: key.name().to_owned(),
    }
}

pub(super) fn valid_timestamp(at: prost_types::Timestamp) -> Option<SystemTime> {
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
