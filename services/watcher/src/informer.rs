//! One resource's list and watch: discovery, kube-runtime's watcher, the cache, and the keys
//! each change causes.
//!
//! ```text
//!  discovery (retried until the apiserver serves the kind: a CRD may come later)
//!     │
//!  watcher per scope (all namespaces, or one per included namespace), bookmarks on,
//!  streaming or paged lists, backoff on errors; 410 Gone -> kube-runtime relists
//!     │
//!  Init ─► begin_relist        InitApply ─► apply: first list -> every key, low priority;
//!                                           a relist -> only what changed, normal priority
//!  InitDone ─► finish_relist: what the relist did not return was deleted while the watch was
//!              away -> its keys, normal priority; the first InitDone marks the scope synced
//!  Apply / Delete ─► apply / delete ─► keys, normal priority
//! ```
//!
//! Keys come from the rules of the current snapshot ([`crate::cache::Watching`]), looked up
//! for every event: registrations change them while the informer runs. An informer whose
//! cache is no longer current (being stopped, or replaced by one of another mode) keys
//! nothing.

use std::{
    collections::HashSet,
    fmt::Debug,
    sync::Arc,
    time::{Duration, SystemTime},
};

use futures::{StreamExt, stream::BoxStream};
use switchyard_k8s::{
    Api, Client, ObjectMeta,
    kube::{
        self, Resource,
        api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PartialObjectMeta},
        core::DynamicResourceScope,
        discovery::{self, Scope},
        runtime::{
            WatchStreamExt,
            watcher::{self, InitialListStrategy, watcher},
        },
    },
};
use switchyard_queue_client::{Enqueuer, Priority};
use switchyard_runtime::{Backoff, Drain, trace};
use switchyard_watcher_core::{
    ControllerRef, EventKind, Summary, WorkKey,
    peer::{self, Part},
    store::Applied,
};
use tracing::{info, warn};

use crate::{
    cache::{Caches, ResourceCache, Watching},
    metrics::{EventLabels, ResourceLabels, WatcherMetrics},
};

/// First and last delay between discovery attempts for a kind the apiserver does not serve
/// (yet): short enough that a CRD created while the watcher runs is picked up in seconds.
const DISCOVERY_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(200), Duration::from_secs(5));

#[derive(Clone)]
pub struct Informer {
    pub client: Client,
    pub caches: Arc<Caches>,
    pub cache: Arc<ResourceCache>,
    pub enqueuer: Arc<Enqueuer>,
    pub metrics: WatcherMetrics,
    pub streaming_lists: bool,
}

impl Informer {
    pub async fn run(self, drain: Drain) {
        let Some((resource, scope)) = self.resolve(&drain).await else {
            return;
        };
        let namespaces = &self.caches.namespaces;
        let namespaced = scope == Scope::Namespaced;
        let scopes: Vec<Option<String>> = if namespaced && !namespaces.include.is_empty() {
            namespaces.include.iter().cloned().map(Some).collect()
        } else {
            vec![None]
        };
        // A stream of one namespace is read on its own (cache.rs), so it must vouch for
        // every version before its list: only a paged list, a quorum read the watcher can
        // order after one of its own, lets it (`committed`). A streaming list starts at
        // whatever the apiserver's watch cache has.
        let streaming = self.streaming_lists && scopes == [None];
        let mut config = watcher::Config::default();
        if streaming {
            config = config.streaming_lists();
        }
        if namespaced && !namespaces.exclude.is_empty() {
            let selector: Vec<String> = namespaces
                .exclude
                .iter()
                .map(|ns| format!("metadata.namespace!={ns}"))
                .collect();
            config = config.fields(&selector.join(","));
        }
        self.cache.open_streams(&scopes);
        info!(resource = %self.cache.gvk(), plural = %resource.plural, ?scopes, metadata_only = self.cache.resource.metadata_only, "watching");
        // kube's `Api<PartialObjectMeta<_>>` lists and watches through the metadata API
        // (`as=PartialObjectMetadata`): only metadata crosses the wire.
        if self.cache.resource.metadata_only {
            self.watch::<PartialObjectMeta<DynamicObject>>(&resource, scopes, config, drain)
                .await
        } else {
            self.watch::<DynamicObject>(&resource, scopes, config, drain)
                .await
        }
    }

    /// Finds the resource behind the configured kind, retrying until the apiserver serves it.
    async fn resolve(&self, drain: &Drain) -> Option<(ApiResource, Scope)> {
        let gvk = self.cache.gvk();
        let wanted = GroupVersionKind::gvk(&gvk.group, &gvk.version, &gvk.kind);
        let mut backoff = Backoff::new(DISCOVERY_BACKOFF.0, DISCOVERY_BACKOFF.1);
        loop {
            match discovery::pinned_kind(&self.client, &wanted).await {
                Ok((resource, capabilities)) => return Some((resource, capabilities.scope)),
                Err(error) => {
                    warn!(resource = %gvk, %error, retry_in = ?backoff.current(), "the apiserver does not serve this resource (yet); retrying discovery")
                }
            }
            if !backoff.wait(drain).await {
                return None;
            }
        }
    }

    async fn watch<K>(
        &self,
        resource: &ApiResource,
        scopes: Vec<Option<String>>,
        config: watcher::Config,
        drain: Drain,
    ) where
        K: Resource<DynamicType = ApiResource, Scope = DynamicResourceScope>
            + Clone
            + Debug
            + serde::de::DeserializeOwned
            + serde::Serialize
            + Send
            + 'static,
    {
        let apis: Vec<Api<K>> = scopes
            .iter()
            .map(|scope| match scope {
                Some(ns) => Api::namespaced_with(self.client.clone(), ns, resource),
                None => Api::all_with(self.client.clone(), resource),
            })
            .collect();
        let streams: Vec<BoxStream<'static, (usize, watcher::Result<watcher::Event<K>>)>> = apis
            .iter()
            .enumerate()
            .map(|(i, api)| {
                watcher(api.clone(), config.clone())
                    .default_backoff()
                    .map(move |event| (i, event))
                    .boxed()
            })
            .collect();
        let mut events = futures::stream::select_all(streams);
        let mut listed_once: HashSet<usize> = HashSet::new();
        // Per stream, the newest resourceVersion it delivered, and whether it is listing:
        // a list comes in name order, so only its end vouches for every version below.
        let mut reached = vec![0u64; scopes.len()];
        if config.initial_list_strategy == InitialListStrategy::StreamingList {
            // A streaming list starts before its `Init` event, so `committed` cannot be read
            // there; but the streams are lazy, and their first list starts at the first poll
            // below, after this read: it has every change up to this version. Without it, a
            // version whose object was deleted before the watcher started is never reached
            // until the kind next changes (relists keep what the stream reached before).
            for (stream, api) in apis.iter().enumerate() {
                reached[stream] = self.committed(api, scopes[stream].as_deref()).await;
            }
        }
        let mut listing = vec![false; scopes.len()];
        let mut keys: Vec<(WorkKey, Option<Duration>)> = Vec::new();
        loop {
            let (stream, event) = tokio::select! {
                event = events.next() => match event {
                    Some(event) => event,
                    None => return,
                },
                _ = drain.clone().signaled() => return,
            };
            // When the change reached this watcher, handed on with its keys.
            let received = SystemTime::now();
            let scope = scopes[stream].as_deref();
            let event = match event {
                Ok(event) => event,
                Err(error) => {
                    self.count("error");
                    warn!(resource = %self.cache.gvk(), %error, "watch failed; retrying with backoff");
                    if let Some(reason) = refusal(&error) {
                        self.cache.refuse(reason);
                    }
                    continue;
                }
            };
            let first_list = !listed_once.contains(&stream);
            if let watcher::Event::Apply(object)
            | watcher::Event::InitApply(object)
            | watcher::Event::Delete(object) = &event
            {
                reached[stream] = reached[stream].max(version_of(object));
            }
            // The event's span: made only when traces are exported, and not for the first
            // list (a sync, not a change).
            let mut span = None;
            let priority = match event {
                watcher::Event::Init => {
                    if !first_list {
                        self.metrics
                            .relists
                            .get_or_create(&self.resource_labels())
                            .inc();
                        info!(resource = %self.cache.gvk(), ?scope, "relisting");
                    }
                    self.cache.write().begin_relist(scope);
                    listing[stream] = true;
                    if config.initial_list_strategy == InitialListStrategy::ListWatch {
                        let before = self.committed(&apis[stream], scope).await;
                        reached[stream] = reached[stream].max(before);
                    }
                    continue;
                }
                watcher::Event::InitApply(object) => {
                    self.count("listed");
                    if first_list {
                        self.apply(object, |_| Some(EventKind::Sync), &mut keys);
                        Priority::Low
                    } else {
                        span = self.event_span(&object);
                        let kind = self.apply(object, changed, &mut keys);
                        record_event(&span, kind);
                        Priority::Normal
                    }
                }
                watcher::Event::InitDone => {
                    let gone = self.cache.write().finish_relist(scope);
                    listing[stream] = false;
                    let now = self.caches.current();
                    for summary in &gone {
                        self.keys(&now, EventKind::Deleted, None, summary, &mut keys);
                    }
                    if !gone.is_empty() {
                        info!(resource = %self.cache.gvk(), deleted = gone.len(), "relist found objects deleted while the watch was away");
                    }
                    if listed_once.insert(stream) && listed_once.len() == scopes.len() {
                        self.cache.mark_synced();
                        info!(resource = %self.cache.gvk(), objects = self.cache.read().len(), "initial list done");
                    }
                    Priority::Normal
                }
                watcher::Event::Apply(object) => {
                    span = self.event_span(&object);
                    let kind = self.apply(object, changed, &mut keys);
                    record_event(&span, kind);
                    Priority::Normal
                }
                watcher::Event::Delete(object) => {
                    self.count("deleted");
                    span = self.event_span(&object);
                    record_event(&span, Some(EventKind::Deleted));
                    let (summary, json) = summarize(object);
                    let cached = self.cache.write().delete(
                        &summary.namespace,
                        &summary.name,
                        summary.resource_version,
                    );
                    let now = self.caches.current();
                    self.keys(
                        &now,
                        EventKind::Deleted,
                        None,
                        cached.as_ref().unwrap_or(&summary),
                        &mut keys,
                    );
                    if let Some(index) = now.index_of(&self.cache).filter(|i| now.mapper.places(*i))
                    {
                        now.mapper.keys_by_placement(
                            index,
                            EventKind::Deleted,
                            None,
                            &json,
                            &*now,
                            &mut keys,
                        );
                    }
                    Priority::Normal
                }
            };
            if !listing[stream] {
                self.cache.publish_resource_version(scope, reached[stream]);
            }
            self.after_change();
            let cause = span
                .filter(|_| !keys.is_empty())
                .map(|span| trace::inject(&span))
                .filter(|fields| !fields.is_empty())
                .map(Arc::new);
            self.caches.peers.hold_back(&mut keys, |(k, _)| k);
            // A first list is a sync, not a change: nothing was observed changing.
            let observed_at = (priority == Priority::Normal).then_some(received);
            self.enqueuer
                .push(keys.drain(..), priority, cause, observed_at)
                .await;
        }
    }

    /// A version at or below which etcd had committed every change when this returns: the
    /// version of a one-object quorum list of the stream's scope (0 when it fails).
    ///
    /// A stream's list (kube-runtime's default, a quorum read) starts after its `Init` event
    /// is handled, so it is at least this version, and the stream has every change up to it
    /// once the list is done. A streaming list's first one starts after the informer reads
    /// this before polling its streams. Without it, a stream whose namespace's newest objects were
    /// deleted before a relist would stay below a read floor set by them (the deletions are
    /// not in the list) until the namespace next changes, and the reads waiting for it would
    /// time out.
    async fn committed<K>(&self, api: &Api<K>, scope: Option<&str>) -> u64
    where
        K: Clone + Debug + serde::de::DeserializeOwned,
    {
        match api.list_metadata(&ListParams::default().limit(1)).await {
            Ok(list) => list
                .metadata
                .resource_version
                .and_then(|rv| rv.parse().ok())
                .unwrap_or(0),
            Err(error) => {
                warn!(resource = %self.cache.gvk(), ?scope, %error, "could not read the apiserver's current resourceVersion before a list; reads wait for the list's objects instead");
                0
            }
        }
    }

    /// A root span for a watch event, when traces are exported: the first span of the trace
    /// that follows the change through the queue to its reconciles.
    fn event_span<K: Resource>(&self, object: &K) -> Option<tracing::Span> {
        if !trace::exporting() {
            return None;
        }
        let meta = object.meta();
        Some(tracing::info_span!(
            parent: None,
            "watch event",
            otel.kind = "producer",
            kind = %self.cache.gvk(),
            namespace = meta.namespace.as_deref().unwrap_or_default(),
            name = meta.name.as_deref().unwrap_or_default(),
            resource_version = meta.resource_version.as_deref().unwrap_or_default(),
            event = tracing::field::Empty,
        ))
    }

    /// Caches an object and appends the keys `kind_of` says its change causes. Returns the
    /// change's kind (`None`: a repeat of what is cached, or a namespace not watched).
    fn apply<K: Resource + serde::Serialize>(
        &self,
        object: K,
        kind_of: impl Fn(&Applied) -> Option<EventKind>,
        keys: &mut Vec<(WorkKey, Option<Duration>)>,
    ) -> Option<EventKind> {
        // The handover check, for kinds a controller reconciles (only they have a status
        // that is a controller's own), and for the objects a controller here writes instead.
        let now = self.caches.current();
        let gvk = self.cache.gvk();
        let index = now.index_of(&self.cache);
        if let Some(index) = index.filter(|_| peer::status_is_owned(&gvk.group, &gvk.kind)) {
            let mut controllers = now.config.reconciled_by(index).peekable();
            if controllers.peek().is_some() {
                self.caches.peers.observe(
                    self.cache.gvk(),
                    object.meta(),
                    Part::Status,
                    controllers,
                );
            }
        }
        if let Some(controller) =
            peer::written_by(&gvk.group, &gvk.kind, object.meta().labels.as_ref())
            && now.config.runs(controller)
        {
            self.caches
                .peers
                .observe(gvk, object.meta(), Part::Object, [controller]);
        }
        // What `managedFields` say of the managers `notWrittenBy` predicates name, read
        // before the cache drops them.
        let writers = index
            .map(|i| now.mapper.writers(i))
            .filter(|managers| !managers.is_empty())
            .map(|managers| {
                let entries: Vec<serde_json::Value> = object
                    .meta()
                    .managed_fields
                    .iter()
                    .flatten()
                    .filter_map(|entry| serde_json::to_value(entry).ok())
                    .collect();
                (managers, entries)
            });
        let (summary, json) = summarize(object);
        if !self.caches.namespaces.admits(&summary.namespace) {
            return None;
        }
        let summary = match writers {
            Some((managers, entries)) => summary.with_writers(managers, &entries),
            None => summary,
        };
        // The values `fieldChanged` predicates compare, from the JSON as cached.
        let summary = match index.map(|i| now.mapper.fields(i)) {
            Some(pointers) if !pointers.is_empty() => {
                match serde_json::from_slice::<serde_json::Value>(&json) {
                    Ok(object) => summary.with_fields(pointers, &object),
                    Err(_) => summary,
                }
            }
            _ => summary,
        };
        let new = summary.clone();
        // A kind mapped by placement (Nodes) is weighed from its JSON before and after.
        let placed = index
            .filter(|index| now.mapper.places(*index))
            .map(|index| {
                let old = self
                    .cache
                    .read()
                    .get(&summary.namespace, &summary.name)
                    .map(<[u8]>::to_vec);
                (index, old, json.clone())
            });
        let applied = self.cache.write().apply(summary, json);
        let kind = kind_of(&applied)?;
        // A listed object was counted as `listed` when it came (InitApply).
        match kind {
            EventKind::Added => self.count("added"),
            EventKind::Modified => self.count("modified"),
            _ => {}
        }
        let old = match &applied {
            Applied::Updated(old) => Some(old),
            _ => None,
        };
        self.keys(&now, kind, old, &new, keys);
        if let Some((index, old, new)) = placed {
            now.mapper
                .keys_by_placement(index, kind, old.as_deref(), &new, &*now, keys);
        }
        Some(kind)
    }

    /// Appends the keys of a change by the rules of `now` (what is watched now), if this
    /// cache is current.
    fn keys(
        &self,
        now: &Watching,
        event: EventKind,
        old: Option<&Summary>,
        new: &Summary,
        keys: &mut Vec<(WorkKey, Option<Duration>)>,
    ) {
        if let Some(index) = now.index_of(&self.cache) {
            now.mapper.keys(index, event, old, new, now, keys);
        }
    }

    fn after_change(&self) {
        let len = self.cache.read().len();
        // A cache no longer current has had its series removed (informers.rs).
        if self.caches.current().index_of(&self.cache).is_none() {
            return;
        }
        self.metrics
            .cached_objects
            .get_or_create(&self.resource_labels())
            .set(len as i64);
    }

    fn count(&self, event: &'static str) {
        self.metrics
            .watch_events
            .get_or_create(&EventLabels {
                resource: self.cache.gvk().to_string(),
                event,
            })
            .inc();
    }

    fn resource_labels(&self) -> ResourceLabels {
        ResourceLabels {
            resource: self.cache.gvk().to_string(),
        }
    }
}

impl std::fmt::Debug for Informer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Informer")
            .field("resource", self.cache.gvk())
            .finish_non_exhaustive()
    }
}

fn record_event(span: &Option<tracing::Span>, kind: Option<EventKind>) {
    if let Some(span) = span {
        let kind = match kind {
            Some(EventKind::Added) => "added",
            Some(EventKind::Modified) => "modified",
            Some(EventKind::Deleted) => "deleted",
            Some(_) => "listed",
            None => "unchanged",
        };
        span.record("event", kind);
    }
}

/// The apiserver's refusal of the list or watch (forbidden, unauthorized, or the kind not
/// served any more): retrying cannot fix it by itself, so a registration waiting for this
/// kind's list is told rather than kept waiting.
fn refusal(error: &watcher::Error) -> Option<String> {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status))
        | watcher::Error::WatchError(status) => status,
        _ => return None,
    };
    matches!(status.code, 401 | 403 | 404).then(|| {
        format!(
            "the apiserver refuses the watcher's list ({} {}): {}",
            status.code, status.reason, status.message
        )
    })
}

/// An object's `metadata.resourceVersion` as a number; 0 when absent.
fn version_of<K: Resource>(object: &K) -> u64 {
    object
        .meta()
        .resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

/// The event kind of a live change; `None` for a repeat of what is cached.
fn changed(applied: &Applied) -> Option<EventKind> {
    match applied {
        Applied::Created => Some(EventKind::Added),
        Applied::Updated(_) => Some(EventKind::Modified),
        Applied::Unchanged => None,
    }
}

/// The object's summary and its JSON without `managedFields`: what the cache stores.
pub fn summarize<K: Resource + serde::Serialize>(mut object: K) -> (Summary, Vec<u8>) {
    object.meta_mut().managed_fields = None;
    let summary = summary_of(object.meta());
    // Serialising a value that was just deserialised cannot fail.
    let json = serde_json::to_vec(&object).unwrap_or_default();
    (summary, json)
}

fn summary_of(meta: &ObjectMeta) -> Summary {
    let controller = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| ControllerRef {
            api_version: o.api_version.clone(),
            kind: o.kind.clone(),
            name: o.name.clone(),
            uid: o.uid.clone(),
        });
    Summary::new(
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
        meta.resource_version.as_deref().unwrap_or_default(),
        meta.generation,
        pairs(&meta.labels),
        pairs(&meta.annotations),
        controller,
    )
}

fn pairs(map: &Option<std::collections::BTreeMap<String, String>>) -> Vec<(&str, &str)> {
    map.iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

#[cfg(test)]
mod tests {
    use switchyard_k8s::OwnerReference;

    use super::*;

    #[test]
    fn the_summary_takes_the_controller_owner_and_json_drops_managed_fields() {
        let mut pod =
            DynamicObject::new("p", &ApiResource::erase::<switchyard_k8s::Pod>(&())).within("ns");
        pod.metadata.resource_version = Some("42".into());
        pod.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
        pod.metadata.owner_references = Some(vec![
            OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: "n".into(),
                uid: "u0".into(),
                ..Default::default()
            },
            OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: "rs".into(),
                uid: "u1".into(),
                controller: Some(true),
                ..Default::default()
            },
        ]);
        pod.metadata.managed_fields = Some(vec![Default::default()]);
        let (summary, json) = summarize(pod);
        assert_eq!(summary.resource_version, 42);
        assert_eq!(summary.label("app"), Some("web"));
        assert_eq!(summary.controller.unwrap().uid, "u1");
        let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(value["metadata"]["name"], "p");
        assert!(value["metadata"].get("managedFields").is_none());
    }
}
