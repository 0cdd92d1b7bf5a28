//! Events recorded the way kube-controller-manager's recorder records them (client-go's
//! `EventCorrelator`), published as `events.k8s.io/v1` Events.
//!
//! ```text
//!  publish(object, type, reason, action, note)
//!     ─► spam filter: per object, a bucket of 25 that refills one every 5 minutes; empty: dropped
//!     ─► aggregation: per (object, type, reason, action), the distinct notes of the last
//!        10 minutes; from the 10th on, the note becomes "(combined from similar events): <note>"
//!     ─► series: the same (object, type, reason, action, note) within 6 minutes raises the
//!        Event's series.count (patch); otherwise a new Event (create). All combined notes
//!        count in one series, which keeps its first note (`note` is immutable in
//!        events.k8s.io/v1)
//! ```
//!
//! Each distinct note is an Event of its own: "Scaled up replica set a from 0 to 4" and
//! "Scaled down replica set a from 4 to 2" are two Events, as `kubectl describe` shows them
//! under kube-controller-manager. (kube-runtime's `Recorder` keys its series without the note,
//! so a later message would be counted under the first one.)
//!
//! [`Correlator`] is the decision, without I/O; [`Recorder`] performs it.

use std::{
    collections::{BTreeSet, HashMap},
    time::Duration,
};

use switchyard_k8s::{
    Api, Client, PostParams,
    k8s_openapi::{
        api::{
            core::v1::ObjectReference,
            events::v1::{Event as K8sEvent, EventSeries},
        },
        apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
        jiff::Timestamp,
    },
    kube::{
        self,
        api::{Patch, PatchParams},
    },
};

use tracing::{Instrument, debug, warn};

use super::is_namespace_terminating;

/// Repeats of one Event within this time raise its `series.count` (kube-runtime's recorder
/// keeps the same six minutes).
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);
/// client-go's `maxIntervalInSeconds`: notes of one kind are aggregated over 10 minutes.
const AGGREGATE_WINDOW: Duration = Duration::from_secs(600);
/// client-go's `maxEvents`: from the 10th distinct note of one kind on, they are combined.
const AGGREGATE_MAX_NOTES: usize = 10;
/// client-go's `defaultSpamBurst`: Events one object may get at once.
const SPAM_BURST: f64 = 25.0;
/// client-go's `defaultSpamQPS` (1/300): one more Event per object every five minutes.
const SPAM_REFILL: Duration = Duration::from_secs(300);
/// The prefix of a combined note (`EventAggregatorByReasonMessageFunc`).
pub const COMBINED: &str = "(combined from similar events): ";

pub use switchyard_k8s::kube::runtime::events::EventType;

/// The object an Event is about, as the correlator tells objects apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ObjectKey {
    kind: String,
    namespace: String,
    name: String,
    uid: String,
}

impl ObjectKey {
    fn of(reference: &ObjectReference) -> Self {
        Self {
            kind: reference.kind.clone().unwrap_or_default(),
            namespace: reference.namespace.clone().unwrap_or_default(),
            name: reference.name.clone().unwrap_or_default(),
            uid: reference.uid.clone().unwrap_or_default(),
        }
    }
}

/// One kind of Event about one object: what aggregation groups.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct KindKey {
    object: ObjectKey,
    type_: &'static str,
    reason: String,
    action: String,
}

/// One Event (one note): what a series counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey {
    kind: KindKey,
    note: String,
}

#[derive(Debug)]
struct Aggregate {
    notes: BTreeSet<String>,
    last: Timestamp,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Timestamp,
}

#[derive(Debug, Clone)]
struct Series {
    name: String,
    count: i32,
    last: Timestamp,
}

/// One `publish` call: an Event about `regarding`, before correlation.
#[derive(Debug, Clone)]
pub struct Occurrence {
    /// The object the Event is about.
    pub regarding: ObjectReference,
    /// `Normal` or `Warning`.
    pub type_: EventType,
    /// Why, in one CamelCase word.
    pub reason: String,
    /// What was done (or failed), in one CamelCase word.
    pub action: String,
    /// The human-readable note.
    pub note: String,
}

/// What to do with one occurrence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The object had too many Events lately.
    Drop,
    /// A new Event with this note.
    Create {
        /// The note it carries.
        note: String,
    },
    /// The Event `name` occurred again: its series count becomes `count`. `note` is the
    /// occurrence's own (combined or not).
    Repeat {
        /// The repeated Event's name.
        name: String,
        /// The note it carries.
        note: String,
        /// Its series count.
        count: i32,
    },
}

/// client-go's correlation (spam filter, aggregation, deduplication), with `now` passed in.
#[derive(Debug, Default)]
pub struct Correlator {
    buckets: HashMap<ObjectKey, Bucket>,
    aggregates: HashMap<KindKey, Aggregate>,
    series: HashMap<SeriesKey, Series>,
}

fn type_name(type_: EventType) -> &'static str {
    match type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

impl Correlator {
    /// Decides about one occurrence. `name` is the name a new Event would get.
    pub fn observe(&mut self, o: &Occurrence, name: &str, now: Timestamp) -> Decision {
        let (regarding, type_, reason, action, note) = (
            &o.regarding,
            o.type_,
            o.reason.as_str(),
            o.action.as_str(),
            o.note.as_str(),
        );
        self.forget_old(now);
        let object = ObjectKey::of(regarding);
        let bucket = self.buckets.entry(object.clone()).or_insert(Bucket {
            tokens: SPAM_BURST,
            last: now,
        });
        let elapsed = now.duration_since(bucket.last).as_secs_f64().max(0.0);
        bucket.tokens = (bucket.tokens + elapsed / SPAM_REFILL.as_secs_f64()).min(SPAM_BURST);
        bucket.last = now;
        if bucket.tokens < 1.0 {
            return Decision::Drop;
        }
        bucket.tokens -= 1.0;

        let kind = KindKey {
            object,
            type_: type_name(type_),
            reason: reason.to_owned(),
            action: action.to_owned(),
        };
        let aggregate = self.aggregates.entry(kind.clone()).or_insert(Aggregate {
            notes: BTreeSet::new(),
            last: now,
        });
        aggregate.last = now;
        aggregate.notes.insert(note.to_owned());
        let (note, series_key) = if aggregate.notes.len() < AGGREGATE_MAX_NOTES {
            let key = SeriesKey {
                kind,
                note: note.to_owned(),
            };
            (note.to_owned(), key)
        } else {
            // As client-go: the set stays below its bound, and every combined note counts
            // in one series, whose note follows the latest.
            aggregate.notes.pop_first();
            let key = SeriesKey {
                kind,
                note: COMBINED.to_owned(),
            };
            (format!("{COMBINED}{note}"), key)
        };
        match self.series.get_mut(&series_key) {
            Some(series) => {
                series.count += 1;
                series.last = now;
                Decision::Repeat {
                    name: series.name.clone(),
                    note,
                    count: series.count,
                }
            }
            None => {
                self.series.insert(
                    series_key,
                    Series {
                        name: name.to_owned(),
                        count: 1,
                        last: now,
                    },
                );
                Decision::Create { note }
            }
        }
    }

    /// Forgets an Event the apiserver did not take, so that its next occurrence creates it.
    fn unrecord(&mut self, name: &str) {
        self.series.retain(|_, s| s.name != name);
    }

    fn forget_old(&mut self, now: Timestamp) {
        let older = |last: Timestamp, ttl: Duration| now.duration_since(last).unsigned_abs() > ttl;
        self.series.retain(|_, s| !older(s.last, SERIES_TTL));
        self.aggregates
            .retain(|_, a| !older(a.last, AGGREGATE_WINDOW));
        self.buckets
            .retain(|_, b| b.tokens < SPAM_BURST || !older(b.last, SPAM_REFILL));
    }
}

/// Occurrences waiting to be written: client-go's broadcaster buffers 1000 and drops the rest
/// (`DropIfChannelFull`); a controller never waits for its Events.
const QUEUED_EVENTS: usize = 1000;

/// Publishes Events for one reporting controller and instance. Cheap to clone. Writes happen
/// on a task of their own, in order, as client-go's broadcaster writes them: a reconcile
/// does not wait for its Events, and one that cannot be written is logged, never retried.
#[derive(Clone)]
pub struct Recorder {
    queue: tokio::sync::mpsc::Sender<Occurrence>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").finish_non_exhaustive()
    }
}

/// The writer task's state.
struct Writer {
    client: Client,
    controller: String,
    instance: String,
    correlator: Correlator,
}

impl Recorder {
    /// Starts the writer task (so: within a Tokio runtime); it ends when the last clone of
    /// the recorder is dropped.
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        let (queue, mut pending) = tokio::sync::mpsc::channel::<Occurrence>(QUEUED_EVENTS);
        let mut writer = Writer {
            client,
            controller: controller.to_owned(),
            instance: instance.to_owned(),
            correlator: Correlator::default(),
        };
        tokio::spawn(
            async move {
                while let Some(occurrence) = pending.recv().await {
                    if let Err(error) = writer.write(&occurrence).await {
                        warn!(%error, reason = %occurrence.reason, "could not record an event");
                    }
                }
            }
            .instrument(tracing::info_span!("events")),
        );
        Self { queue }
    }

    /// Queues one occurrence; when the queue is full it is dropped, as client-go drops it.
    pub fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        let occurrence = Occurrence {
            regarding: regarding.clone(),
            type_,
            reason: reason.to_owned(),
            action: action.to_owned(),
            note: note.to_owned(),
        };
        if self.queue.try_send(occurrence).is_err() {
            debug!(reason, "event queue full, event dropped");
        }
    }
}

impl Writer {
    async fn write(&mut self, o: &Occurrence) -> kube::Result<()> {
        let now = Timestamp::now();
        let name = format!(
            "{}.{:x}",
            o.regarding.name.as_deref().unwrap_or(&self.controller),
            now.as_nanosecond()
        );
        let decision = self.correlator.observe(o, &name, now);
        let namespace = o.regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        let (written, result) = match decision {
            Decision::Drop => return Ok(()),
            Decision::Create { note } => {
                let event = K8sEvent {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(namespace.to_owned()),
                        ..ObjectMeta::default()
                    },
                    action: Some(o.action.clone()),
                    reason: Some(o.reason.clone()),
                    note: Some(note),
                    type_: Some(type_name(o.type_).to_owned()),
                    event_time: Some(MicroTime(now)),
                    regarding: Some(o.regarding.clone()),
                    reporting_controller: Some(self.controller.clone()),
                    reporting_instance: Some(self.instance.clone()),
                    ..K8sEvent::default()
                };
                let result = api.create(&PostParams::default(), &event).await.map(drop);
                (name, result)
            }
            // `note` is immutable in events.k8s.io/v1: a combined series keeps the note it
            // started with (client-go's core/v1 Events would take the latest).
            Decision::Repeat { name, count, .. } => {
                let patch = K8sEvent {
                    series: Some(EventSeries {
                        count,
                        last_observed_time: MicroTime(now),
                    }),
                    ..K8sEvent::default()
                };
                let result = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(drop);
                (name, result)
            }
        };
        match result {
            Ok(()) => Ok(()),
            // A namespace being deleted takes no Events; nothing to report.
            Err(error) if is_namespace_terminating(&error) => Ok(()),
            Err(error) => {
                // Its next occurrence creates the Event anew.
                self.correlator.unrecord(&written);
                Err(error)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rs(name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("ReplicaSet".into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectReference::default()
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn observe(c: &mut Correlator, object: &str, note: &str, seconds: i64) -> Decision {
        let occurrence = Occurrence {
            regarding: rs(object),
            type_: EventType::Normal,
            reason: "ScalingReplicaSet".into(),
            action: "Scale".into(),
            note: note.into(),
        };
        c.observe(&occurrence, &format!("{object}.{seconds}"), at(seconds))
    }

    #[test]
    fn each_note_is_an_event_of_its_own_and_repeats_count() {
        let mut c = Correlator::default();
        let up = "Scaled up replica set web-1 from 0 to 4";
        let down = "Scaled down replica set web-1 from 4 to 2";
        assert_eq!(
            observe(&mut c, "d", up, 0),
            Decision::Create { note: up.into() }
        );
        assert_eq!(
            observe(&mut c, "d", down, 1),
            Decision::Create { note: down.into() }
        );
        assert_eq!(
            observe(&mut c, "d", up, 2),
            Decision::Repeat {
                name: "d.0".into(),
                note: up.into(),
                count: 2
            }
        );
        // Another object, the same note: its own Event.
        assert_eq!(
            observe(&mut c, "e", up, 3),
            Decision::Create { note: up.into() }
        );
        // Past the series time, the same note starts a new Event.
        assert_eq!(
            observe(&mut c, "d", up, 2 + 6 * 60 + 1),
            Decision::Create { note: up.into() }
        );
    }

    #[test]
    fn from_the_tenth_distinct_note_they_are_combined_in_one_series() {
        let mut c = Correlator::default();
        for i in 0..9 {
            let note = format!("Created pod: web-{i}");
            assert_eq!(observe(&mut c, "rs", &note, i), Decision::Create { note });
        }
        assert_eq!(
            observe(&mut c, "rs", "Created pod: web-9", 9),
            Decision::Create {
                note: format!("{COMBINED}Created pod: web-9")
            }
        );
        assert_eq!(
            observe(&mut c, "rs", "Created pod: web-10", 10),
            Decision::Repeat {
                name: "rs.9".into(),
                note: format!("{COMBINED}Created pod: web-10"),
                count: 2
            }
        );
        // Ten quiet minutes later the notes stand alone again.
        assert_eq!(
            observe(&mut c, "rs", "Created pod: web-11", 10 + 601),
            Decision::Create {
                note: "Created pod: web-11".into()
            }
        );
    }

    #[test]
    fn an_object_gets_25_events_at_once_then_one_every_five_minutes() {
        let mut c = Correlator::default();
        let kept = (0..30)
            .filter(|i| observe(&mut c, "rs", &format!("n{}", i % 3), 0) != Decision::Drop)
            .count();
        assert_eq!(kept, 25);
        assert_eq!(observe(&mut c, "rs", "n0", 299), Decision::Drop);
        assert_ne!(observe(&mut c, "rs", "n0", 301), Decision::Drop);
        assert_eq!(observe(&mut c, "rs", "n0", 302), Decision::Drop);
        // Another object has its own bucket.
        assert_ne!(observe(&mut c, "other", "n0", 302), Decision::Drop);
    }
}
