//! The proto conversions of the queue protocol, client side, in one place.

use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use switchyard_proto::{
    common::v1::WorkKey as ProtoKey,
    queue::v1::{
        self as pb, outcome::Result as Verdict, work_request::Request as Msg,
        work_response::Response as Reply,
    },
};
use switchyard_runtime::trace::TraceFields;
use switchyard_work::{MAX_DELAY, MAX_LEASE_EXTENSION, Priority, WorkKey};

use crate::{Cause, Event, Lease, Outcome, ReadFloor, Versions};

fn priority(priority: Priority) -> pb::Priority {
    match priority {
        Priority::Low => pb::Priority::Low,
        Priority::Normal => pb::Priority::Normal,
    }
}

/// `asked`, at most `longest` (what the queue takes): past it the queue refuses an add, and
/// past protobuf's range the duration would go as none at all.
fn duration(asked: Duration, longest: Duration) -> Option<prost_types::Duration> {
    prost_types::Duration::try_from(asked.min(longest)).ok()
}

fn key(key: &WorkKey) -> ProtoKey {
    ProtoKey {
        controller: key.controller.to_string(),
        namespace: key.namespace.to_string(),
        name: key.name.to_string(),
    }
}

/// One item per cause (repeats of a key coalesce at the queue, which keeps each cause), or
/// one without a trace context. Each names when the key's earliest event was observed.
pub(crate) fn enqueue_items<'a>(
    work_key: &'a WorkKey,
    priority_: Priority,
    delay: Duration,
    causes: &'a [Cause],
    observed_at: Option<SystemTime>,
) -> impl Iterator<Item = pb::EnqueueItem> + 'a {
    let delay = (!delay.is_zero())
        .then(|| duration(delay, MAX_DELAY))
        .flatten();
    let observed_at = observed_at.map(prost_types::Timestamp::from);
    let item = move |trace_context: TraceFields| pb::EnqueueItem {
        key: Some(key(work_key)),
        priority: priority(priority_) as i32,
        delay,
        trace_context,
        observed_at,
    };
    let uncaused = causes.is_empty().then(|| item(TraceFields::new()));
    causes
        .iter()
        .map(move |cause| item((**cause).clone()))
        .chain(uncaused)
}

fn request(request: Msg) -> pb::WorkRequest {
    pb::WorkRequest {
        request: Some(request),
    }
}

pub(crate) fn hello(worker_id: &str, controllers: Vec<String>) -> pb::WorkRequest {
    request(Msg::Hello(pb::WorkerHello {
        worker_id: worker_id.to_owned(),
        controllers,
    }))
}

pub(crate) fn credit(items: u32) -> pb::WorkRequest {
    request(Msg::Credit(pb::Credit { items }))
}

pub(crate) fn outcome(
    lease: &Lease,
    outcome: Outcome,
    took: Duration,
    observed: &ReadFloor,
) -> pb::WorkRequest {
    let result = match outcome {
        Outcome::Done => Verdict::Done(pb::Done {}),
        Outcome::RequeueAfter(delay) => Verdict::RequeueAfter(pb::RequeueAfter {
            delay: duration(delay, MAX_DELAY),
        }),
        Outcome::Failed(reason) => Verdict::Failed(pb::Failed { reason }),
        Outcome::Forget => Verdict::Forget(pb::Forget {}),
    };
    request(Msg::Outcome(pb::Outcome {
        shard: lease.shard,
        epoch: lease.epoch,
        lease_id: lease.id.clone(),
        result: Some(result),
        duration: prost_types::Duration::try_from(took).ok(),
        observed: proto_versions(&observed.kinds),
        namespace_observed: proto_versions(&observed.namespace),
    }))
}

fn proto_versions(versions: &Versions) -> HashMap<String, u64> {
    versions
        .iter()
        .map(|(kind, rv)| (kind.clone(), *rv))
        .collect()
}

pub(crate) fn extend(lease: &Lease, by: Duration) -> pb::WorkRequest {
    request(Msg::Extend(pb::ExtendLease {
        shard: lease.shard,
        epoch: lease.epoch,
        lease_id: lease.id.clone(),
        extend_by: duration(by, MAX_LEASE_EXTENSION),
    }))
}

fn time(timestamp: Option<prost_types::Timestamp>) -> Option<SystemTime> {
    timestamp.and_then(|t| SystemTime::try_from(t).ok())
}

fn lease(item: pb::LeasedItem) -> Lease {
    // A queue always names the key; an item without one leases an empty key, which no
    // controller serves (the worker reports it failed).
    let ProtoKey {
        controller,
        namespace,
        name,
    } = item.key.unwrap_or_default();
    Lease {
        key: WorkKey::new(controller, namespace, name),
        shard: item.shard,
        epoch: item.epoch,
        id: item.lease_id,
        attempt: item.attempt,
        deadline: time(item.lease_deadline),
        queued_at: time(item.queued_at),
        observed_at: time(item.observed_at),
        causes: item.causes.into_iter().map(|c| c.fields).collect(),
        causes_dropped: item.causes_dropped,
        trace_context: item.trace_context,
        read_floor: ReadFloor {
            kinds: item.read_floor.into_iter().collect(),
            namespace: item.namespace_read_floor.into_iter().collect(),
        },
        shard_held_for: item.shard_held_for.and_then(switchyard_proto::duration),
    }
}

/// The event a response carries; `None` for an empty response.
pub(crate) fn event(response: pb::WorkResponse) -> Option<Event> {
    Some(match response.response? {
        Reply::Item(item) => Event::Lease(Box::new(lease(item))),
        Reply::OutcomeAck(ack) if ack.applied => Event::Applied {
            lease_id: ack.lease_id,
        },
        Reply::OutcomeAck(ack) => Event::Refused {
            lease_id: ack.lease_id,
            reason: ack.reason,
        },
        // A queue that predates `applied` sends neither it nor a reason when it extends.
        Reply::LeaseExtended(refused) if !refused.applied && !refused.reason.is_empty() => {
            Event::Refused {
                lease_id: refused.lease_id,
                reason: refused.reason,
            }
        }
        Reply::LeaseExtended(extended) => Event::Extended {
            lease_id: extended.lease_id,
            deadline: time(extended.lease_deadline),
        },
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_key_goes_as_one_item_per_cause_or_one_without() {
        let key = WorkKey::new("c", "ns", "a");
        let causes: Vec<Cause> = (1..=2)
            .map(|n| Arc::new(TraceFields::from([("traceparent".into(), n.to_string())])))
            .collect();
        let observed = SystemTime::UNIX_EPOCH + Duration::from_millis(1_500);
        let items: Vec<_> = enqueue_items(
            &key,
            Priority::Normal,
            Duration::ZERO,
            &causes,
            Some(observed),
        )
        .collect();
        assert_eq!(items.len(), 2);
        assert_eq!(items[1].trace_context["traceparent"], "2");
        assert!(items.iter().all(|item| {
            item.observed_at
                == Some(prost_types::Timestamp {
                    seconds: 1,
                    nanos: 500_000_000,
                })
        }));
        assert_eq!(items[0].priority, pb::Priority::Normal as i32);
        assert_eq!(items[0].delay, None);
        let items: Vec<_> =
            enqueue_items(&key, Priority::Low, Duration::from_millis(250), &[], None).collect();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].observed_at, None);
        assert_eq!(items[0].priority, pb::Priority::Low as i32);
        assert_eq!(
            items[0].delay,
            Some(prost_types::Duration {
                seconds: 0,
                nanos: 250_000_000
            })
        );
        assert_eq!(
            items[0].key,
            Some(ProtoKey {
                controller: "c".into(),
                namespace: "ns".into(),
                name: "a".into()
            })
        );
    }

    #[test]
    fn durations_longer_than_the_queue_takes_go_as_its_longest() {
        // Sent as asked, an add's delay past a week loses the key (the queue refuses it), an
        // extension past an hour is cut there, and anything past protobuf's range went as no
        // duration at all: an add or a requeue ready at once, an extension the queue refuses
        // by ending the stream.
        let proto = |d: Duration| prost_types::Duration::try_from(d).ok();
        let key = WorkKey::new("c", "ns", "a");
        for asked in [MAX_DELAY + Duration::from_secs(1), Duration::MAX] {
            let items: Vec<_> = enqueue_items(&key, Priority::Normal, asked, &[], None).collect();
            assert_eq!(items[0].delay, proto(MAX_DELAY), "{asked:?}");
        }
        let leased = lease(pb::LeasedItem {
            lease_id: "l".into(),
            ..Default::default()
        });
        let requeue = outcome(
            &leased,
            Outcome::RequeueAfter(Duration::MAX),
            Duration::MAX,
            &ReadFloor::default(),
        );
        let Some(Msg::Outcome(sent)) = requeue.request else {
            panic!("{requeue:?}");
        };
        assert_eq!(
            sent.result,
            Some(Verdict::RequeueAfter(pb::RequeueAfter {
                delay: proto(MAX_DELAY)
            }))
        );
        let extension = extend(&leased, Duration::MAX);
        let Some(Msg::Extend(sent)) = extension.request else {
            panic!("{extension:?}");
        };
        assert_eq!(sent.extend_by, proto(MAX_LEASE_EXTENSION));
    }

    #[test]
    fn an_extension_refused_for_another_streams_lease_is_a_refusal() {
        let extended = |applied: bool, reason: &str| {
            event(pb::WorkResponse {
                response: Some(Reply::LeaseExtended(pb::LeaseExtended {
                    lease_id: "l".into(),
                    lease_deadline: None,
                    applied,
                    reason: reason.into(),
                })),
            })
        };
        let reason = "failed precondition: lease held by another stream";
        assert_eq!(
            extended(false, reason),
            Some(Event::Refused {
                lease_id: "l".into(),
                reason: reason.into()
            })
        );
        let extension = Some(Event::Extended {
            lease_id: "l".into(),
            deadline: None,
        });
        assert_eq!(extended(true, ""), extension);
        assert_eq!(extended(false, ""), extension, "a queue before `applied`");
    }
}
