//! The work key, one type from the watcher to the queue core, validated once.
//!
//! ```text
//!  watcher core ─ WorkKey ─► queue client ─ proto WorkKey ─► queue gRPC edge
//!   (mapping)                 (Enqueuer)      (the wire)      KeySpace::validate, once
//!                                                                   │
//!                                    ValidKey: controller id, shard, namespace and name
//!                                                                   ▼
//!                                                   actor ─► Queue (stored, leased, as is)
//! ```
//!
//! A [`WorkKey`] is what callers name: `(controller, namespace, name)`, each apart. A
//! [`ValidKey`] is what the queue keeps: only [`KeySpace::validate`] makes one, so holding
//! one proves the controller is served (and gives its id), the namespace and name are within
//! Kubernetes' limits, and the shard is the key's own. The actor and the core take it as is.
//!
//! The controllers are not fixed when the queue starts: a name the queue has not seen becomes
//! known the first time an authorized caller uses it (a worker's hello, an enqueued key), up to
//! a bound ([`KeySpace::intern`]). Ids are handed out in order and never reused, so the core's
//! per-controller vectors only grow; the names are shared between the gRPC edge (which
//! validates) and the actor (which stores), behind one lock that is written once per new name.
//!
//! A valid key holds its namespace and name in one allocation, the namespace's length
//! first: one small allocation per queued key, as a million keys need, and the two parts are
//! never joined with a separator nor parsed apart.

use std::{
    cell::RefCell,
    collections::HashMap,
    fmt,
    sync::{Arc, PoisonError, RwLock},
};

use switchyard_work::{MAX_CONTROLLER_LEN, MAX_NAME_LEN, MAX_NAMESPACE_LEN, WorkKey, shard_of};

/// Controllers one queue serves at most unless configured otherwise: the built-in ones and
/// 16 more (32 with today's sixteen). Each name costs a queue of its own and up to 33 metric
/// series per served shard (docs/operations.md), so 32 names over 256 shards stay near
/// 270,000 series; the bound keeps a caller that makes up names from growing either without
/// end.
pub const DEFAULT_MAX_CONTROLLERS: usize = switchyard_work::builtin::ALL.len() + 16;

/// The index of a controller among those a queue serves, in the order it became known.
pub type ControllerId = u32;

/// Why a key was refused; the field is named relative to the key's message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("invalid {field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    /// A new controller name beyond the queue's bound; the names already known still work.
    #[error(
        "controller {name:?} is new and the queue already serves {limit} controllers, its \
         limit (--max-controllers)"
    )]
    TooManyControllers { name: String, limit: usize },
}

/// A key's namespace and name as the queue holds them: one allocation, the namespace's
/// length (at most [`MAX_NAMESPACE_LEN`], so one ASCII character) first.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ObjectName(Arc<str>);

impl ObjectName {
    /// `namespace` must be at most [`MAX_NAMESPACE_LEN`] bytes long.
    fn new(namespace: &str, name: &str) -> Self {
        debug_assert!(namespace.len() <= MAX_NAMESPACE_LEN);
        thread_local! {
            // Assembled here, then copied once into the key's own allocation: a key costs one
            // allocation, as the queue's hot path needs.
            static SCRATCH: RefCell<String> = const { RefCell::new(String::new()) };
        }
        SCRATCH.with_borrow_mut(|text| {
            text.clear();
            text.push(char::from(namespace.len() as u8));
            text.push_str(namespace);
            text.push_str(name);
            Self(Arc::from(text.as_str()))
        })
    }

    fn split(&self) -> usize {
        1 + usize::from(self.0.as_bytes()[0])
    }

    pub(crate) fn namespace(&self) -> &str {
        &self.0[1..self.split()]
    }

    pub(crate) fn name(&self) -> &str {
        &self.0[self.split()..]
    }
}

impl fmt::Debug for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectName")
            .field("namespace", &self.namespace())
            .field("name", &self.name())
            .finish()
    }
}

/// A key checked by [`KeySpace::validate`]: its controller is served, its namespace and name
/// are within limits, and it carries its controller id and shard.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ValidKey {
    controller: ControllerId,
    shard: u32,
    object: ObjectName,
}

impl ValidKey {
    pub(crate) fn from_parts(controller: ControllerId, shard: u32, object: ObjectName) -> Self {
        Self {
            controller,
            shard,
            object,
        }
    }

    pub fn controller(&self) -> ControllerId {
        self.controller
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    pub fn namespace(&self) -> &str {
        self.object.namespace()
    }

    pub fn name(&self) -> &str {
        self.object.name()
    }

    pub(crate) fn object(&self) -> &ObjectName {
        &self.object
    }
}

/// The controllers a queue serves and its shard count: what a key is validated against.
/// Clones share the names: one that becomes known through a clone is known to all.
#[derive(Clone, Debug)]
pub struct KeySpace {
    names: Arc<RwLock<Names>>,
    max_controllers: usize,
    shard_count: u32,
}

#[derive(Debug, Default)]
struct Names {
    by_id: Vec<Arc<str>>,
    /// Looked up once per key validated; seeded, as the names come from callers.
    by_name: HashMap<Arc<str>, ControllerId, foldhash::fast::RandomState>,
}

impl KeySpace {
    /// A key space that knows `controllers` from the start (ids in that order) and learns
    /// others up to [`DEFAULT_MAX_CONTROLLERS`] in all.
    pub fn new(controllers: &[&str], shard_count: u32) -> Self {
        Self::with_limit(controllers, DEFAULT_MAX_CONTROLLERS, shard_count)
    }

    /// A key space that knows `controllers` from the start and learns others up to
    /// `max_controllers` in all (never fewer than `controllers`).
    pub fn with_limit(controllers: &[&str], max_controllers: usize, shard_count: u32) -> Self {
        let mut names = Names::default();
        for name in controllers {
            if !names.by_name.contains_key(*name) {
                let name: Arc<str> = Arc::from(*name);
                names
                    .by_name
                    .insert(name.clone(), names.by_id.len() as ControllerId);
                names.by_id.push(name);
            }
        }
        Self {
            max_controllers: max_controllers.max(names.by_id.len()),
            names: Arc::new(RwLock::new(names)),
            shard_count,
        }
    }

    pub fn shard_count(&self) -> u32 {
        self.shard_count
    }

    /// Controllers this key space serves at most.
    pub fn max_controllers(&self) -> usize {
        self.max_controllers
    }

    /// The known controllers, indexed by [`ControllerId`]: a snapshot, which later names
    /// extend but never reorder.
    pub fn names(&self) -> Vec<Arc<str>> {
        self.read().by_id.clone()
    }

    /// How many controllers are known.
    pub fn len(&self) -> usize {
        self.read().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The name of a known controller.
    ///
    /// # Panics
    ///
    /// If `controller` was not handed out by this key space (or a clone of it).
    pub fn name(&self, controller: ControllerId) -> Arc<str> {
        self.read().by_id[controller as usize].clone()
    }

    /// The id of a known controller; `None` for a name never seen.
    pub fn controller_id(&self, name: &str) -> Option<ControllerId> {
        self.read().by_name.get(name).copied()
    }

    /// The id of `name`, making it known if it is new: 1 to [`MAX_CONTROLLER_LEN`]
    /// characters, not blank, and room under the bound. A refused name changes nothing.
    pub fn intern(&self, name: &str) -> Result<ControllerId, KeyError> {
        if let Some(id) = self.controller_id(name) {
            return Ok(id);
        }
        check_controller(name)?;
        let mut names = self.names.write().unwrap_or_else(PoisonError::into_inner);
        // Another caller may have added it between the read and the write.
        if let Some(id) = names.by_name.get(name) {
            return Ok(*id);
        }
        if names.by_id.len() >= self.max_controllers {
            return Err(KeyError::TooManyControllers {
                name: name.chars().take(MAX_CONTROLLER_LEN).collect(),
                limit: self.max_controllers,
            });
        }
        let id = names.by_id.len() as ControllerId;
        let name: Arc<str> = Arc::from(name);
        names.by_name.insert(name.clone(), id);
        names.by_id.push(name);
        Ok(id)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Names> {
        // Nothing panics while holding the lock, and the names stay whole if it did.
        self.names.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Checks a key given in parts (as it comes off the wire), or names the bad field. A
    /// controller name not seen before becomes known ([`KeySpace::intern`]).
    pub fn validate_parts(
        &self,
        controller: &str,
        namespace: &str,
        name: &str,
    ) -> Result<ValidKey, KeyError> {
        if namespace.len() > MAX_NAMESPACE_LEN {
            return Err(invalid(
                "key.namespace",
                format!(
                    "{} characters, at most {MAX_NAMESPACE_LEN}",
                    namespace.len()
                ),
            ));
        }
        if namespace.contains('/') {
            return Err(invalid("key.namespace", "must not contain '/'".into()));
        }
        if name.is_empty() {
            return Err(invalid("key.name", "must not be empty".into()));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(invalid(
                "key.name",
                format!("{} characters, at most {MAX_NAME_LEN}", name.len()),
            ));
        }
        if name.contains('/') {
            return Err(invalid("key.name", "must not contain '/'".into()));
        }
        // Last, so a key refused for another field makes no name known.
        let id = self.intern(controller)?;
        Ok(ValidKey {
            controller: id,
            shard: shard_of(controller, namespace, name, self.shard_count),
            object: ObjectName::new(namespace, name),
        })
    }

    /// Checks a key, or names the bad field.
    pub fn validate(&self, key: &WorkKey) -> Result<ValidKey, KeyError> {
        self.validate_parts(&key.controller, &key.namespace, &key.name)
    }

    /// The caller's form of a valid key.
    pub fn work_key(&self, key: &ValidKey) -> WorkKey {
        WorkKey::new(self.name(key.controller), key.namespace(), key.name())
    }
}

/// A controller name as the watcher's configuration takes it: not blank, at most
/// [`MAX_CONTROLLER_LEN`] characters.
fn check_controller(name: &str) -> Result<(), KeyError> {
    if name.trim().is_empty() {
        return Err(invalid("key.controller", "must not be empty".into()));
    }
    if name.len() > MAX_CONTROLLER_LEN {
        return Err(invalid(
            "key.controller",
            format!("{} characters, at most {MAX_CONTROLLER_LEN}", name.len()),
        ));
    }
    Ok(())
}

fn invalid(field: &'static str, reason: String) -> KeyError {
    KeyError::InvalidArgument { field, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RS: &str = "apps/v1/ReplicaSet";

    fn space() -> KeySpace {
        KeySpace::new(&[RS, "apps/v1/Deployment"], 4)
    }

    #[test]
    fn a_valid_key_keeps_its_parts_apart_and_carries_its_controller_and_shard() {
        let space = space();
        for (namespace, name) in [("default", "web"), ("", "node-1"), (&*"n".repeat(63), "x")] {
            let key = WorkKey::new("apps/v1/Deployment", namespace, name);
            let valid = space.validate(&key).unwrap();
            assert_eq!((valid.namespace(), valid.name()), (namespace, name));
            assert_eq!(valid.controller(), 1);
            assert_eq!(valid.shard(), key.shard(4));
            assert_eq!(space.work_key(&valid), key);
        }
        // Parts that would join to the same text stay different keys.
        let a = space.validate_parts(RS, "ab", "c").unwrap();
        let b = space.validate_parts(RS, "a", "bc").unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn bad_keys_are_refused_naming_the_field() {
        let space = space();
        let cases = [
            (
                WorkKey::new(RS, "default", ""),
                "invalid key.name: must not be empty",
            ),
            (
                WorkKey::new(RS, "default", "n".repeat(254)),
                "invalid key.name: 254 characters, at most 253",
            ),
            (
                WorkKey::new(RS, "n".repeat(64), "a"),
                "invalid key.namespace: 64 characters, at most 63",
            ),
            (
                WorkKey::new(RS, "a/b", "a"),
                "invalid key.namespace: must not contain '/'",
            ),
            (
                WorkKey::new(RS, "default", "a/b"),
                "invalid key.name: must not contain '/'",
            ),
            (
                WorkKey::new(" ", "default", "a"),
                "invalid key.controller: must not be empty",
            ),
            (
                WorkKey::new("c".repeat(254), "default", "a"),
                "invalid key.controller: 254 characters, at most 253",
            ),
        ];
        for (bad, message) in cases {
            let error = space.validate(&bad).unwrap_err();
            assert_eq!(error.to_string(), message);
        }
        assert!(
            space
                .validate(&WorkKey::new(RS, "default", "n".repeat(253)))
                .is_ok()
        );
        // None of the refused keys made its controller known.
        assert_eq!(space.len(), 2);
    }

    #[test]
    fn a_new_controller_becomes_known_up_to_the_bound() {
        let space = KeySpace::with_limit(&[RS], 3, 4);
        let copy = space.clone();
        let key = WorkKey::new("example.com/v1/Thing", "default", "a");
        let valid = space.validate(&key).unwrap();
        assert_eq!(valid.controller(), 1);
        // Clones share what became known; the same name keeps its id.
        assert_eq!(copy.controller_id("example.com/v1/Thing"), Some(1));
        assert_eq!(copy.intern("example.com/v1/Thing"), Ok(1));
        assert_eq!(space.work_key(&valid), key);
        let longest = "c".repeat(253);
        assert_eq!(copy.intern(&longest), Ok(2));
        let error = space.intern("example.com/v1/Other").unwrap_err();
        assert_eq!(
            error.to_string(),
            "controller \"example.com/v1/Other\" is new and the queue already serves 3 \
             controllers, its limit (--max-controllers)"
        );
        // Known names still work at the bound; the refused one was not added.
        assert!(space.validate(&key).is_ok());
        assert_eq!(space.controller_id("example.com/v1/Other"), None);
        assert_eq!(
            space.names().iter().map(|n| &**n).collect::<Vec<_>>(),
            [RS, "example.com/v1/Thing", &longest]
        );
        // Pre-declared names beyond the bound are all served.
        assert_eq!(
            KeySpace::with_limit(&[RS, "b", "c"], 1, 4).max_controllers(),
            3
        );
    }
}
