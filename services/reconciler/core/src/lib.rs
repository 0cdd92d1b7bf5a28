//! The reconciler's decisions, without I/O: what the ReplicaSet, Deployment, Job and CronJob
//! controllers and the garbage collector should create, scale, delete, adopt, release and
//! report, what the namespace controller deletes and reports while a namespace terminates,
//! which accounts the service account controller creates, which Pods, claims and
//! ControllerRevisions a StatefulSet needs, when a finished Job is due for
//! deletion, and the token bucket that bounds
//! apiserver calls. The service crate reads the cache, calls these functions and performs the
//! writes.
//!
//! Every function takes the objects it decides on and, where time matters, `now`; the tests
//! beside the code build the objects by hand.

pub mod claim;
pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
pub mod endpointslice;
pub mod event;
pub mod gc;
pub mod hash;
pub mod history;
pub mod job;
pub mod mirroring;
pub mod namespace;
pub mod podgc;
pub mod ratelimit;
pub mod replicaset;
pub mod selector;
pub mod serviceaccount;
pub mod statefulset;
pub mod ttlafterfinished;

pub use k8s_openapi;
