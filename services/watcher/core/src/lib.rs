//! The watcher's domain, free of Kubernetes clients and gRPC.
//!
//! ```text
//!  watch event ─► Summary (namespace, name, rv, generation, labels, controller ref) + JSON
//!                    │
//!                    ├─► Store::apply / delete        (cache; owner-UID index; relist sweep)
//!                    └─► Mapper::keys(old, new)       (for / owns [through] / mapByLabel, predicates)
//!                               │
//!                               └─► WorkKey (controller, namespace, name) ─► shard ─► queue
//!
//!  configuration file + registrations ─► Watches (merge, conflicts) ─► effective Config
//! ```

pub mod config;
pub mod fields;
pub mod graph;
pub mod mapping;
pub mod peer;
pub mod store;
pub mod watches;

pub use config::{
    CollectorConfig, Config, ConfigError, Grants, GroupResource, Gvk, MAX_FIELD_PREDICATES,
    Objects, Predicate, ResourceConfig,
};
pub use mapping::{EventKind, KeySink, Mapper, NoOwners, Owners, WorkKey};
pub use store::{ControllerRef, Store, Summary};
pub use watches::{
    AccessDenied, Change, ControllerWatches, Registration, RegistrationId, Watch, Watches,
    WatchesError,
};
