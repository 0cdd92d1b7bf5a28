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
//! A valid key holds its namespace and name in one allocation, the namespace's length
//! first: one small allocation per queued key, as a million keys need, and the two parts are
//! never joined with a separator nor parsed apart.

use std::{cell::RefCell, collections::HashMap, fmt, sync::Arc};

use crate::shard::shard_of;

/// Kubernetes limits: a namespace is a DNS label, a name at most a DNS subdomain.
pub const MAX_NAMESPACE_LEN: usize = 63;
pub const MAX_NAME_LEN: usize = 253;

/// The index of a controller among those a queue serves, in the order they were configured.
pub type ControllerId = u32;

/// Why a key was refused; the field is named relative to the key's message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("invalid {field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    #[error("unknown controller {0:?}")]
    UnknownController(String),
}

/// A work key as callers name it: the reconciler kind, and the object's namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkKey {
    pub controller: Arc<str>,
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl WorkKey {
    pub fn new(
        controller: impl Into<Arc<str>>,
        namespace: impl Into<Arc<str>>,
        name: impl Into<Arc<str>>,
    ) -> Self {
        Self {
            controller: controller.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key's virtual shard among `shard_count` (see [`crate::shard`]).
    pub fn shard(&self, shard_count: u32) -> u32 {
        shard_of(&self.controller, &self.namespace, &self.name, shard_count)
    }
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
#[derive(Clone, Debug)]
pub struct KeySpace {
    names: Arc<[Arc<str>]>,
    by_name: HashMap<Arc<str>, ControllerId>,
    shard_count: u32,
}

impl KeySpace {
    pub fn new(controllers: &[&str], shard_count: u32) -> Self {
        let names: Arc<[Arc<str>]> = controllers.iter().map(|c| Arc::from(*c)).collect();
        let by_name = names
            .iter()
            .enumerate()
            .map(|(i, name)| (name.clone(), i as ControllerId))
            .collect();
        Self {
            names,
            by_name,
            shard_count,
        }
    }

    pub fn shard_count(&self) -> u32 {
        self.shard_count
    }

    /// The served controllers; a [`ControllerId`] indexes them.
    pub fn names(&self) -> &Arc<[Arc<str>]> {
        &self.names
    }

    /// The name of a served controller.
    pub fn name(&self, controller: ControllerId) -> &Arc<str> {
        &self.names[controller as usize]
    }

    pub fn controller_id(&self, name: &str) -> Option<ControllerId> {
        self.by_name.get(name).copied()
    }

    /// Checks a key given in parts (as it comes off the wire), or names the bad field.
    pub fn validate_parts(
        &self,
        controller: &str,
        namespace: &str,
        name: &str,
    ) -> Result<ValidKey, KeyError> {
        let id = self
            .controller_id(controller)
            .ok_or_else(|| KeyError::UnknownController(controller.to_owned()))?;
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
        WorkKey::new(
            self.name(key.controller).clone(),
            key.namespace(),
            key.name(),
        )
    }
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
                WorkKey::new("v1/Nope", "default", "a"),
                "unknown controller \"v1/Nope\"",
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
    }
}
