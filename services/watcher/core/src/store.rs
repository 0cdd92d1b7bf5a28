//! The object cache of one resource.
//!
//! Objects are kept as their JSON (without `managedFields`, which the adapter strips) next to a
//! small [`Summary`] that key mapping and queries need. Namespace queries are a range of the
//! ordered map; controller-owner queries go through an index by owner UID; a selector that
//! requires a label's value (`key=value`, as every ReplicaSet's and Deployment's does) goes
//! through an index by label, and is evaluated on the candidates those give. Without these
//! indexes a reconciler's "Pods of this ReplicaSet" read tests every Pod of the namespace.
//!
//! A relist (initial list, or after a watch expired with 410 Gone) is a mark and sweep:
//! [`Store::begin_relist`] starts it, every listed object is marked as it is applied, and
//! [`Store::finish_relist`] removes and returns what was not listed: objects deleted while the
//! watch was away.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet, hash_map::DefaultHasher},
    hash::{Hash, Hasher},
    ops::Bound,
    sync::Arc,
};

use switchyard_selector::{Labels, Selector};

/// The controller owner reference (`controller: true`) of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl ControllerRef {
    /// The owner's API group (`apps` for `apps/v1`, empty for `v1`).
    pub fn group(&self) -> &str {
        self.api_version
            .split_once('/')
            .map(|(group, _)| group)
            .unwrap_or("")
    }
}

/// What key mapping and queries need to know about an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    /// `metadata.resourceVersion` as a number (etcd's revision); 0 when absent.
    pub resource_version: u64,
    pub generation: i64,
    /// Sorted by key.
    pub labels: Box<[(Box<str>, Box<str>)]>,
    pub annotations_hash: u64,
    pub controller: Option<Box<ControllerRef>>,
    /// For `fieldChanged` predicates: per JSON pointer a rule of the kind names, a hash of
    /// the value there (`None`: absent), taken as the object came ([`Summary::with_fields`]).
    pub fields: Box<[(Arc<str>, Option<u64>)]>,
    /// For `notWrittenBy` predicates: per field manager a rule of the kind names, what the
    /// object's `managedFields` said of it as the object came ([`Summary::with_writers`]).
    pub writers: Box<[(Arc<str>, Writers)]>,
}

/// What an object's `managedFields` say of one field manager: a hash of its entries and one
/// of every other manager's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Writers {
    /// Its own entries' (`None`: it has none).
    pub own: Option<u64>,
    /// Every other entry's, in any order.
    pub others: u64,
}

impl Writers {
    /// Reads `entries` (each `managedFields` entry's manager and hash) for `manager`.
    fn of(manager: &str, entries: &[(Option<&str>, u64)]) -> Self {
        let mut own: Option<u64> = None;
        let mut others = 0u64;
        for &(writer, hash) in entries {
            if writer == Some(manager) {
                own = Some(own.unwrap_or(0).wrapping_add(hash));
            } else {
                others = others.wrapping_add(hash);
            }
        }
        Self { own, others }
    }

    /// Whether the change from `before` to `self` was the manager's own write. The apiserver
    /// gives the writer of a change the fields it set and stamps its entry with the time (in
    /// whole seconds); the fields a writer takes leave their former manager's entry. So a
    /// write by another manager changes that manager's entry, unless it sets again, within
    /// the second of its last write, only fields it already owned alone; the manager's own
    /// entry then stays as it was. Either way, not the manager's own write. A write of the
    /// manager's within the second of its last that sets only fields it owns counts as not
    /// its own: one reconcile too many, never one too few.
    pub fn written_by_own(&self, before: &Self) -> bool {
        self.own.is_some() && self.own != before.own && self.others == before.others
    }
}

impl Summary {
    pub fn new<'a>(
        namespace: &str,
        name: &str,
        resource_version: &str,
        generation: Option<i64>,
        labels: impl IntoIterator<Item = (&'a str, &'a str)>,
        annotations: impl IntoIterator<Item = (&'a str, &'a str)>,
        controller: Option<ControllerRef>,
    ) -> Self {
        let mut labels: Vec<(Box<str>, Box<str>)> = labels
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        labels.sort();
        let mut annotations: Vec<(&str, &str)> = annotations.into_iter().collect();
        annotations.sort();
        let mut hasher = DefaultHasher::new();
        annotations.hash(&mut hasher);
        Self {
            namespace: namespace.into(),
            name: name.into(),
            resource_version: resource_version.parse().unwrap_or(0),
            generation: generation.unwrap_or(0),
            labels: labels.into(),
            annotations_hash: hasher.finish(),
            controller: controller.map(Box::new),
            fields: Box::new([]),
            writers: Box::new([]),
        }
    }

    /// The same summary, with what `entries` (the object's `managedFields`, each entry as
    /// JSON) say of each of `managers` ([`Writers`]).
    pub fn with_writers(mut self, managers: &[Arc<str>], entries: &[serde_json::Value]) -> Self {
        // Each entry hashed once, whatever the number of managers.
        let hashed: Vec<(Option<&str>, u64)> = entries
            .iter()
            .map(|entry| {
                let manager = entry.get("manager").and_then(serde_json::Value::as_str);
                (manager, value_hash(entry))
            })
            .collect();
        self.writers = managers
            .iter()
            .map(|manager| (manager.clone(), Writers::of(manager, &hashed)))
            .collect();
        self
    }

    /// What the object's `managedFields` said of `manager`, if it was read.
    pub fn writers(&self, manager: &str) -> Option<Writers> {
        self.writers
            .iter()
            .find(|(m, _)| &**m == manager)
            .map(|(_, writers)| *writers)
    }

    /// The same summary, with a hash of the value at each of `pointers` in `object` (the
    /// object's JSON, parsed).
    pub fn with_fields(mut self, pointers: &[Arc<str>], object: &serde_json::Value) -> Self {
        self.fields = pointers
            .iter()
            .map(|pointer| {
                let hash = resolve(object, pointer).map(value_hash);
                (pointer.clone(), hash)
            })
            .collect();
        self
    }

    /// The hash of the value at `pointer`, if it was taken: `Some(None)` for a value absent.
    pub fn field(&self, pointer: &str) -> Option<Option<u64>> {
        self.fields
            .iter()
            .find(|(p, _)| &**p == pointer)
            .map(|(_, hash)| *hash)
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.labels[i].1)
    }
}

/// The value at `pointer` in `object`: a JSON pointer (RFC 6901), whose tokens may also pick
/// an element of a list by the value of one of its fields, as Kubernetes' lists keyed by a
/// field are (`/status/conditions[type=Ready]/status`: the `status` of the condition whose
/// `type` is `Ready`). `None` when the path leads nowhere.
pub fn resolve<'a>(object: &'a serde_json::Value, pointer: &str) -> Option<&'a serde_json::Value> {
    if pointer.is_empty() {
        return Some(object);
    }
    let mut value = object;
    for token in pointer.strip_prefix('/')?.split('/') {
        let (name, selected) = match token.strip_suffix(']').and_then(|t| t.split_once('[')) {
            Some((name, selection)) => (name, Some(selection.split_once('=')?)),
            None => (token, None),
        };
        let name = unescape(name);
        if !name.is_empty() || selected.is_none() {
            value = match value {
                serde_json::Value::Object(fields) => fields.get(name.as_ref())?,
                serde_json::Value::Array(items) => items.get(name.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        if let Some((field, wanted)) = selected {
            let (field, wanted) = (unescape(field), unescape(wanted));
            value = value.as_array()?.iter().find(|item| {
                item.get(field.as_ref()).and_then(serde_json::Value::as_str)
                    == Some(wanted.as_ref())
            })?;
        }
    }
    Some(value)
}

/// A JSON pointer token's text: `~1` is `/`, `~0` is `~`.
fn unescape(token: &str) -> std::borrow::Cow<'_, str> {
    if token.contains('~') {
        token.replace("~1", "/").replace("~0", "~").into()
    } else {
        token.into()
    }
}

/// The hash [`Summary::with_fields`] keeps of `value`.
pub fn value_hash(value: &serde_json::Value) -> u64 {
    let mut hasher = DefaultHasher::new();
    hash_value(value, &mut hasher);
    hasher.finish()
}

/// Hashes a JSON value by its structure (object keys in order, so a reordering is no change).
fn hash_value(value: &serde_json::Value, hasher: &mut impl Hasher) {
    use serde_json::Value;
    match value {
        Value::Null => 0u8.hash(hasher),
        Value::Bool(b) => (1u8, b).hash(hasher),
        Value::Number(n) => (2u8, n).hash(hasher),
        Value::String(text) => (3u8, text).hash(hasher),
        Value::Array(items) => {
            (4u8, items.len()).hash(hasher);
            for item in items {
                hash_value(item, hasher);
            }
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            (5u8, entries.len()).hash(hasher);
            for (key, value) in entries {
                key.hash(hasher);
                hash_value(value, hasher);
            }
        }
    }
}

impl Labels for Summary {
    fn label(&self, key: &str) -> Option<&str> {
        Summary::label(self, key)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct ObjKey {
    namespace: Arc<str>,
    name: Arc<str>,
}

#[derive(Debug)]
struct Entry {
    summary: Summary,
    json: Box<[u8]>,
}

/// What [`Store::apply`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    /// Not cached before.
    Created,
    /// Cached at another resourceVersion; the previous summary.
    Updated(Summary),
    /// Cached at this very resourceVersion (a relist or a duplicate event).
    Unchanged,
}

#[derive(Debug, Default)]
pub struct Store {
    objects: BTreeMap<ObjKey, Entry>,
    by_owner: HashMap<Box<str>, BTreeSet<ObjKey>>,
    /// Objects by label key, then value.
    by_label: HashMap<Box<str>, HashMap<Box<str>, BTreeSet<ObjKey>>>,
    /// Interned namespace names: many objects share few namespaces.
    namespaces: HashSet<Arc<str>>,
    resource_version: u64,
    /// Objects listed so far by each relist under way, by scope (one namespace, or `None`
    /// for every namespace).
    relisting: HashMap<Option<Arc<str>>, HashSet<ObjKey>>,
    json_bytes: usize,
}

impl Store {
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Bytes of cached JSON (the objects themselves, without the indexes).
    pub fn json_bytes(&self) -> usize {
        self.json_bytes
    }

    /// The highest resourceVersion seen (objects and deletions).
    pub fn resource_version(&self) -> u64 {
        self.resource_version
    }

    /// Notes a resourceVersion seen without an object change (a list or a bookmark).
    pub fn observe_resource_version(&mut self, rv: u64) {
        self.resource_version = self.resource_version.max(rv);
    }

    fn key(&mut self, summary: &Summary) -> ObjKey {
        let namespace = match self.namespaces.get(&summary.namespace) {
            Some(ns) => ns.clone(),
            None => {
                self.namespaces.insert(summary.namespace.clone());
                summary.namespace.clone()
            }
        };
        ObjKey {
            namespace,
            name: summary.name.clone(),
        }
    }

    /// Stores an object (added, modified or listed).
    pub fn apply(&mut self, mut summary: Summary, json: Vec<u8>) -> Applied {
        let key = self.key(&summary);
        summary.namespace = key.namespace.clone();
        self.observe_resource_version(summary.resource_version);
        if !self.relisting.is_empty() {
            let scope = Some(key.namespace.clone());
            let listed = match self.relisting.get_mut(&scope) {
                Some(listed) => Some(listed),
                None => self.relisting.get_mut(&None),
            };
            if let Some(listed) = listed {
                listed.insert(key.clone());
            }
        }
        let unchanged = self
            .objects
            .get(&key)
            .is_some_and(|e| e.summary.resource_version == summary.resource_version);
        if unchanged {
            return Applied::Unchanged;
        }
        if let Some(uid) = summary.controller.as_ref().map(|c| c.uid.as_str()) {
            self.by_owner
                .entry(uid.into())
                .or_default()
                .insert(key.clone());
        }
        let old_labels = self.objects.get(&key).map(|e| &e.summary.labels);
        if old_labels != Some(&summary.labels) {
            if let Some(old) = old_labels {
                unindex_labels(&mut self.by_label, old, &key);
            }
            index_labels(&mut self.by_label, &summary.labels, &key);
        }
        self.json_bytes += json.len();
        let entry = Entry {
            summary,
            json: json.into_boxed_slice(),
        };
        match self.objects.insert(key.clone(), entry) {
            None => Applied::Created,
            Some(old) => {
                self.json_bytes -= old.json.len();
                let new_owner = self.objects[&key]
                    .summary
                    .controller
                    .as_ref()
                    .map(|c| c.uid.clone());
                let old_owner = old.summary.controller.as_ref().map(|c| &c.uid);
                if old_owner.is_some() && old_owner != new_owner.as_ref() {
                    self.unindex_owner(old_owner.map(String::as_str), &key);
                }
                Applied::Updated(old.summary)
            }
        }
    }

    /// Removes an object; returns what was cached.
    pub fn delete(
        &mut self,
        namespace: &str,
        name: &str,
        resource_version: u64,
    ) -> Option<Summary> {
        self.observe_resource_version(resource_version);
        let key = ObjKey {
            namespace: namespace.into(),
            name: name.into(),
        };
        self.remove(&key)
    }

    fn remove(&mut self, key: &ObjKey) -> Option<Summary> {
        let entry = self.objects.remove(key)?;
        self.json_bytes -= entry.json.len();
        let owner = entry.summary.controller.as_ref().map(|c| c.uid.as_str());
        self.unindex_owner(owner, key);
        unindex_labels(&mut self.by_label, &entry.summary.labels, key);
        Some(entry.summary)
    }

    fn unindex_owner(&mut self, owner: Option<&str>, key: &ObjKey) {
        let Some(uid) = owner else { return };
        if let Some(set) = self.by_owner.get_mut(uid) {
            set.remove(key);
            if set.is_empty() {
                self.by_owner.remove(uid);
            }
        }
    }

    /// Starts a relist of `scope` (one namespace, or every namespace when `None`): objects of
    /// that scope not applied before [`Store::finish_relist`] are swept.
    pub fn begin_relist(&mut self, scope: Option<&str>) {
        self.relisting.insert(scope.map(Arc::from), HashSet::new());
    }

    /// Ends a relist of `scope`; removes and returns every cached object of that scope it did
    /// not list.
    pub fn finish_relist(&mut self, scope: Option<&str>) -> Vec<Summary> {
        let Some(listed) = self.relisting.remove(&scope.map(Arc::from)) else {
            return Vec::new();
        };
        let gone: Vec<ObjKey> = self
            .objects
            .keys()
            .filter(|k| scope.is_none_or(|ns| *k.namespace == *ns) && !listed.contains(*k))
            .cloned()
            .collect();
        gone.iter().filter_map(|k| self.remove(k)).collect()
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<&[u8]> {
        let key = ObjKey {
            namespace: namespace.into(),
            name: name.into(),
        };
        self.objects.get(&key).map(|e| &*e.json)
    }

    /// The summary of a cached object (its controller owner, for mapping through owners).
    pub fn summary(&self, namespace: &str, name: &str) -> Option<&Summary> {
        let key = ObjKey {
            namespace: namespace.into(),
            name: name.into(),
        };
        self.objects.get(&key).map(|e| &e.summary)
    }

    /// Objects in `namespace` (all when `None`) owned by `controller_uid` (any when `None`)
    /// and matching `selector`, in namespace/name order.
    pub fn list<'a>(
        &'a self,
        namespace: Option<&'a str>,
        controller_uid: Option<&'a str>,
        selector: &'a Selector,
    ) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.entries(namespace, controller_uid, selector)
            .map(|(_, e)| &*e.json)
    }

    /// [`Store::list`], each object with its summary.
    pub fn list_summarized<'a>(
        &'a self,
        namespace: Option<&'a str>,
        controller_uid: Option<&'a str>,
        selector: &'a Selector,
    ) -> impl Iterator<Item = (&'a Summary, &'a [u8])> + 'a {
        self.entries(namespace, controller_uid, selector)
            .map(|(_, e)| (&e.summary, &*e.json))
    }

    /// Objects in `namespace` (all when `None`) owned by `controller_uid` or matching
    /// `selector`, each once, in namespace/name order: what [`Store::list`] gives for each,
    /// merged.
    pub fn list_either<'a>(
        &'a self,
        namespace: Option<&'a str>,
        controller_uid: &'a str,
        selector: &'a Selector,
    ) -> impl Iterator<Item = &'a [u8]> + 'a {
        let mut union: BTreeMap<&ObjKey, &Entry> = self
            .by_owner
            .get(controller_uid)
            .into_iter()
            .flatten()
            .filter(|k| namespace.is_none_or(|ns| *k.namespace == *ns))
            .filter_map(|k| self.objects.get_key_value(k))
            .collect();
        union.extend(self.entries(namespace, None, selector));
        union.into_values().map(|e| &*e.json)
    }

    /// [`Store::list`]'s entries, with their keys.
    fn entries<'a>(
        &'a self,
        namespace: Option<&'a str>,
        controller_uid: Option<&'a str>,
        selector: &'a Selector,
    ) -> Box<dyn Iterator<Item = (&'a ObjKey, &'a Entry)> + 'a> {
        let matching = move |(_, e): &(&ObjKey, &Entry)| {
            namespace.is_none_or(|ns| *e.summary.namespace == *ns) && selector.matches(&e.summary)
        };
        let cached = |k| self.objects.get_key_value(k);
        match controller_uid {
            Some(uid) => Box::new(
                self.by_owner
                    .get(uid)
                    .into_iter()
                    .flatten()
                    .filter_map(cached)
                    .filter(matching),
            ),
            None if selector.equalities().next().is_some() => {
                let keys = self.labeled(selector);
                let keys: Box<dyn Iterator<Item = &ObjKey>> = match namespace {
                    Some(ns) => Box::new(namespace_range(keys, ns)),
                    None => Box::new(keys.into_iter().flatten()),
                };
                Box::new(keys.filter_map(cached).filter(matching))
            }
            None => {
                let entries: Box<dyn Iterator<Item = (&ObjKey, &Entry)>> = match namespace {
                    Some(ns) => {
                        let ns: Arc<str> = ns.into();
                        let start = ObjKey {
                            namespace: ns.clone(),
                            name: "".into(),
                        };
                        Box::new(
                            self.objects
                                .range((Bound::Included(start), Bound::Unbounded))
                                .take_while(move |(k, _)| k.namespace == ns),
                        )
                    }
                    None => Box::new(self.objects.iter()),
                };
                Box::new(entries.filter(matching))
            }
        }
    }

    /// The fewest candidates among the objects that have each label value `selector`
    /// requires (`None`: no object has one of them).
    fn labeled(&self, selector: &Selector) -> Option<&BTreeSet<ObjKey>> {
        let mut fewest: Option<&BTreeSet<ObjKey>> = None;
        for (key, value) in selector.equalities() {
            let keys = self.by_label.get(key)?.get(value)?;
            if fewest.is_none_or(|f| keys.len() < f.len()) {
                fewest = Some(keys);
            }
        }
        fewest
    }

    /// Every cached object's summary (for resyncs).
    pub fn summaries(&self) -> impl Iterator<Item = &Summary> {
        self.objects.values().map(|e| &e.summary)
    }
}

/// The keys of `keys` in namespace `ns`, in order.
fn namespace_range<'a>(
    keys: Option<&'a BTreeSet<ObjKey>>,
    ns: &str,
) -> impl Iterator<Item = &'a ObjKey> {
    let ns: Arc<str> = ns.into();
    let start = ObjKey {
        namespace: ns.clone(),
        name: "".into(),
    };
    keys.into_iter()
        .flat_map(move |keys| keys.range((Bound::Included(start.clone()), Bound::Unbounded)))
        .take_while(move |k| k.namespace == ns)
}

fn index_labels(
    index: &mut HashMap<Box<str>, HashMap<Box<str>, BTreeSet<ObjKey>>>,
    labels: &[(Box<str>, Box<str>)],
    key: &ObjKey,
) {
    for (k, v) in labels {
        index
            .entry(k.clone())
            .or_default()
            .entry(v.clone())
            .or_default()
            .insert(key.clone());
    }
}

fn unindex_labels(
    index: &mut HashMap<Box<str>, HashMap<Box<str>, BTreeSet<ObjKey>>>,
    labels: &[(Box<str>, Box<str>)],
    key: &ObjKey,
) {
    for (k, v) in labels {
        let Some(values) = index.get_mut(k) else {
            continue;
        };
        if let Some(keys) = values.get_mut(v) {
            keys.remove(key);
            if keys.is_empty() {
                values.remove(v);
            }
        }
        if values.is_empty() {
            index.remove(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pointer_may_pick_a_list_element_by_one_of_its_fields() {
        let pod = serde_json::json!({
            "metadata": {"labels": {"a/b": "x", "c~d": "y"}},
            "status": {"conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "example.com/Ready", "status": "True"},
            ]},
            "spec": {"containers": [{"name": "c"}]},
        });
        let at = |pointer| resolve(&pod, pointer).cloned();
        assert_eq!(
            at("/status/conditions[type=Ready]/status"),
            Some("False".into())
        );
        assert_eq!(
            at("/status/conditions[type=example.com~1Ready]/status"),
            Some("True".into())
        );
        assert_eq!(at("/status/conditions[type=Other]/status"), None);
        assert_eq!(at("/spec/containers[name=c]/name"), Some("c".into()));
        // Plain RFC 6901 as before: indexes and escapes.
        assert_eq!(at("/spec/containers/0/name"), Some("c".into()));
        assert_eq!(at("/metadata/labels/a~1b"), Some("x".into()));
        assert_eq!(at("/metadata/labels/c~0d"), Some("y".into()));
        assert_eq!(at(""), Some(pod.clone()));
        assert_eq!(at("no-slash"), None);
        assert_eq!(at("/spec/containers[name]/name"), None);
        assert_eq!(at("/metadata[name=x]"), None);
    }

    fn mk_pod(
        ns: &str,
        name: &str,
        rv: u64,
        labels: &[(&str, &str)],
        owner: Option<&str>,
    ) -> Summary {
        Summary::new(
            ns,
            name,
            &rv.to_string(),
            None,
            labels.iter().copied(),
            [],
            owner.map(|uid| ControllerRef {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: format!("rs-{uid}"),
                uid: uid.into(),
            }),
        )
    }

    fn names(store: &Store, ns: Option<&str>, owner: Option<&str>, selector: &str) -> Vec<String> {
        let selector = Selector::parse(selector).unwrap();
        store
            .list(ns, owner, &selector)
            .map(|json| String::from_utf8(json.to_vec()).unwrap())
            .collect()
    }

    fn put(store: &mut Store, summary: Summary) -> Applied {
        let json = format!("{}/{}", summary.namespace, summary.name).into_bytes();
        store.apply(summary, json)
    }

    #[test]
    fn queries_by_namespace_owner_and_labels() {
        let mut store = Store::default();
        put(
            &mut store,
            mk_pod("a", "p1", 1, &[("app", "web")], Some("u1")),
        );
        put(
            &mut store,
            mk_pod("a", "p2", 2, &[("app", "db")], Some("u1")),
        );
        put(
            &mut store,
            mk_pod("ab", "p3", 3, &[("app", "web")], Some("u2")),
        );
        put(&mut store, mk_pod("b", "p4", 4, &[], None));
        assert_eq!(names(&store, Some("a"), None, ""), ["a/p1", "a/p2"]);
        assert_eq!(names(&store, Some("a"), None, "app=web"), ["a/p1"]);
        assert_eq!(names(&store, None, None, "app=web"), ["a/p1", "ab/p3"]);
        assert_eq!(names(&store, None, Some("u1"), ""), ["a/p1", "a/p2"]);
        assert_eq!(names(&store, None, Some("u1"), "app!=web"), ["a/p2"]);
        assert_eq!(
            names(&store, Some("b"), Some("u1"), ""),
            Vec::<String>::new()
        );
        assert_eq!(
            names(&store, None, Some("nobody"), ""),
            Vec::<String>::new()
        );
        assert_eq!(store.resource_version(), 4);
        assert_eq!(store.get("a", "p2"), Some(&b"a/p2"[..]));
        assert_eq!(store.get("a", "p9"), None);
    }

    #[test]
    fn a_changed_owner_moves_in_the_index() {
        let mut store = Store::default();
        put(&mut store, mk_pod("a", "p1", 1, &[], Some("u1")));
        let applied = put(&mut store, mk_pod("a", "p1", 2, &[], Some("u2")));
        assert!(
            matches!(applied, Applied::Updated(old) if old.controller.as_ref().unwrap().uid == "u1")
        );
        assert_eq!(names(&store, None, Some("u1"), ""), Vec::<String>::new());
        assert_eq!(names(&store, None, Some("u2"), ""), ["a/p1"]);
        put(&mut store, mk_pod("a", "p1", 3, &[], None));
        assert_eq!(names(&store, None, Some("u2"), ""), Vec::<String>::new());
        assert!(store.by_owner.is_empty());
    }

    #[test]
    fn same_resource_version_is_unchanged() {
        let mut store = Store::default();
        assert_eq!(
            put(&mut store, mk_pod("a", "p1", 1, &[], None)),
            Applied::Created
        );
        assert_eq!(
            put(&mut store, mk_pod("a", "p1", 1, &[], None)),
            Applied::Unchanged
        );
    }

    #[test]
    fn relist_sweeps_what_was_not_listed() {
        let mut store = Store::default();
        for (i, name) in ["p1", "p2", "p3"].into_iter().enumerate() {
            put(&mut store, mk_pod("a", name, i as u64 + 1, &[], Some("u1")));
        }
        store.begin_relist(None);
        put(&mut store, mk_pod("a", "p1", 1, &[], Some("u1")));
        put(&mut store, mk_pod("a", "p3", 7, &[], Some("u1")));
        let gone = store.finish_relist(None);
        assert_eq!(gone.len(), 1);
        assert_eq!(&*gone[0].name, "p2");
        assert_eq!(names(&store, None, Some("u1"), ""), ["a/p1", "a/p3"]);
        assert_eq!(store.json_bytes(), "a/p1".len() + "a/p3".len());
        assert_eq!(store.resource_version(), 7);
    }

    #[test]
    fn a_namespace_relist_sweeps_only_its_namespace() {
        let mut store = Store::default();
        put(&mut store, mk_pod("a", "p1", 1, &[], None));
        put(&mut store, mk_pod("b", "p2", 2, &[], None));
        store.begin_relist(Some("a"));
        store.begin_relist(Some("b"));
        put(&mut store, mk_pod("b", "p2", 2, &[], None));
        assert!(store.finish_relist(Some("b")).is_empty());
        let gone = store.finish_relist(Some("a"));
        assert_eq!(gone.len(), 1);
        assert_eq!(&*gone[0].name, "p1");
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn changed_labels_move_in_the_label_index() {
        let mut store = Store::default();
        put(&mut store, mk_pod("a", "p1", 1, &[("app", "web")], None));
        put(&mut store, mk_pod("a", "p1", 2, &[("app", "db")], None));
        assert_eq!(names(&store, None, None, "app=web"), Vec::<String>::new());
        assert_eq!(names(&store, Some("a"), None, "app in (db)"), ["a/p1"]);
        put(&mut store, mk_pod("a", "p1", 3, &[], None));
        assert_eq!(names(&store, None, None, "app=db"), Vec::<String>::new());
        assert!(store.by_label.is_empty());
    }

    /// Lists answered through the indexes, and their unions of an owner's objects and a
    /// selector's, equal a scan of every object, over a long run of creates, label and owner
    /// changes and deletes.
    #[test]
    fn indexed_lists_equal_a_full_scan() {
        let selectors = [
            "",
            "app=web",
            "app=db",
            "app=web,tier=front",
            "tier in (front)",
            "app=web,tier!=front",
            "app in (web,db)",
            "app=web,!tier",
            "app=none",
        ];
        let mut store = Store::default();
        // A fixed linear congruential sequence: the same run every time.
        let mut seed: u64 = 42;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        for rv in 1..800 {
            let ns = ["a", "ab", "b"][next(3) as usize];
            let name = format!("p{}", next(40));
            if next(5) == 0 {
                store.delete(ns, &name, rv);
                continue;
            }
            let mut labels = Vec::new();
            match next(3) {
                0 => labels.push(("app", "web")),
                1 => labels.push(("app", "db")),
                _ => {}
            }
            if next(2) == 0 {
                labels.push(("tier", "front"));
            }
            let owner = ["u1", "u2"].get(next(3) as usize).copied();
            put(&mut store, mk_pod(ns, &name, rv, &labels, owner));
            for text in selectors {
                let selector = Selector::parse(text).unwrap();
                for ns in [None, Some("a"), Some("ab"), Some("c")] {
                    for owner in [None, Some("u1")] {
                        let scanned: Vec<String> = store
                            .objects
                            .iter()
                            .filter(|(k, e)| {
                                ns.is_none_or(|ns| *k.namespace == *ns)
                                    && owner.is_none_or(|uid| {
                                        e.summary.controller.as_ref().is_some_and(|c| c.uid == uid)
                                    })
                                    && selector.matches(&e.summary)
                            })
                            .map(|(k, _)| format!("{}/{}", k.namespace, k.name))
                            .collect();
                        assert_eq!(
                            names(&store, ns, owner, text),
                            scanned,
                            "{text:?} in {ns:?} owned by {owner:?} after rv {rv}"
                        );
                    }
                    let scanned: Vec<String> = store
                        .objects
                        .iter()
                        .filter(|(k, e)| {
                            ns.is_none_or(|ns| *k.namespace == *ns)
                                && (e.summary.controller.as_ref().is_some_and(|c| c.uid == "u1")
                                    || selector.matches(&e.summary))
                        })
                        .map(|(k, _)| format!("{}/{}", k.namespace, k.name))
                        .collect();
                    let either: Vec<String> = store
                        .list_either(ns, "u1", &selector)
                        .map(|json| String::from_utf8(json.to_vec()).unwrap())
                        .collect();
                    assert_eq!(
                        either, scanned,
                        "{text:?} or owned by u1 in {ns:?} after rv {rv}"
                    );
                }
            }
        }
    }

    #[test]
    fn delete_unindexes() {
        let mut store = Store::default();
        put(
            &mut store,
            mk_pod("a", "p1", 1, &[("app", "web")], Some("u1")),
        );
        let gone = store.delete("a", "p1", 5).unwrap();
        assert_eq!(&*gone.name, "p1");
        assert!(store.is_empty());
        assert!(store.by_owner.is_empty());
        assert!(store.by_label.is_empty());
        assert_eq!(store.json_bytes(), 0);
        assert_eq!(store.resource_version(), 5);
        assert!(store.delete("a", "p1", 6).is_none());
    }
}
