//! Switchyard reconciler: the built-in controllers (kube-controller-manager's workload,
//! batch, networking and garbage collection controllers), written with the controller SDK
//! (`switchyard-sdk`) and run by its reconciler.
//!
//! ```text
//!  queue ─ Work stream ─► worker (switchyard-sdk) ─► Controller::reconcile
//!                                                     ├─ reads:  watcher Cache API
//!                                                     └─ writes: apiserver, behind a QPS/burst limit
//! ```
//!
//! Built-in controllers: ReplicaSet ([`replicaset`]), Deployment ([`deployment`]), the garbage
//! collector ([`gc`]), Namespace ([`namespace`]), the service account controller
//! ([`serviceaccount`]), Job ([`job`]), CronJob ([`cronjob`]), TTL-after-finished
//! ([`ttlafterfinished`]), the pod garbage collector ([`podgc`]), ReplicationController
//! ([`replicationcontroller`]), StatefulSet ([`statefulset`]), the disruption controller
//! ([`disruption`]), DaemonSet ([`daemonset`]), EndpointSlice ([`endpointslice`]), Endpoints
//! ([`endpoints`]) and EndpointSlice mirroring ([`mirroring`]).

pub mod builtin;
pub mod claim;
pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
pub mod endpointslice;
pub mod gc;
pub mod job;
pub mod mirroring;
pub mod namespace;
pub mod podgc;
pub mod replicaset;
pub mod replicationcontroller;
pub mod serviceaccount;
pub mod statefulset;
pub mod ttlafterfinished;

use std::time::Duration;

/// The SDK the built-in controllers are written with, under the name they use.
pub use switchyard_sdk as sdk;
use switchyard_sdk::{Registry, ServiceError, cache};

pub use crate::builtin::{Builtin, Permission, RECORD_EVENTS, Tuning};

pub use switchyard_sdk::SERVICE;
/// The longest batch period the watcher accepts for a rule.
const MAX_BATCH_PERIOD: Duration = Duration::from_secs(60);

/// The built-in reconciler's command line: the SDK's reconciler flags and the built-in
/// controllers' own.
#[derive(Debug, clap::Parser)]
#[command(name = SERVICE, version, about)]
// No argument group of its own: the SDK's flattened `Args` has the name.
#[group(skip)]
pub struct Args {
    #[command(flatten)]
    pub service: switchyard_sdk::Args,
    #[command(flatten)]
    pub builtin: BuiltinArgs,
}

/// The flags of the built-in controllers (kube-controller-manager's of the same names).
#[derive(Clone, Debug, clap::Args)]
pub struct BuiltinArgs {
    /// Make each built-in controller's apiserver requests as its own service account in
    /// this namespace (impersonated: `switchyard-deployment-controller`, ...), as
    /// kube-controller-manager's --use-service-account-credentials does; unset, every request
    /// is the reconciler's own
    #[arg(long, env = "SWITCHYARD_CONTROLLER_SERVICE_ACCOUNTS")]
    pub controller_service_accounts: Option<String>,
    /// Terminated Pods the pod garbage collector keeps before it deletes the oldest (as
    /// kube-controller-manager's flag); 0 keeps them all
    #[arg(long, env = "SWITCHYARD_TERMINATED_POD_GC_THRESHOLD", default_value_t = switchyard_reconciler_core::podgc::DEFAULT_TERMINATED_THRESHOLD)]
    pub terminated_pod_gc_threshold: u32,
    /// Endpoints in one EndpointSlice at most, 1 to 1000 (as kube-controller-manager's
    /// flag)
    #[arg(long, env = "SWITCHYARD_MAX_ENDPOINTS_PER_SLICE", default_value_t = switchyard_reconciler_core::endpointslice::DEFAULT_MAX_ENDPOINTS_PER_SLICE)]
    pub max_endpoints_per_slice: usize,
    /// How long a Pod's change waits before its Services' EndpointSlices are written, so
    /// that changes in that time are written together (as kube-controller-manager's flag);
    /// at most 60s
    #[arg(
        long,
        env = "SWITCHYARD_ENDPOINTSLICE_UPDATES_BATCH_PERIOD",
        default_value = "0s"
    )]
    pub endpointslice_updates_batch_period: humantime::Duration,
    /// The same for the Endpoints controller (as kube-controller-manager's flag); at most
    /// 60s
    #[arg(
        long,
        env = "SWITCHYARD_ENDPOINT_UPDATES_BATCH_PERIOD",
        default_value = "0s"
    )]
    pub endpoint_updates_batch_period: humantime::Duration,
    /// Addresses of one Endpoints subset mirrored into EndpointSlices at most, 1 to 1000 (as
    /// kube-controller-manager's flag)
    #[arg(long, env = "SWITCHYARD_MIRRORING_MAX_ENDPOINTS_PER_SUBSET", default_value_t = switchyard_reconciler_core::mirroring::DEFAULT_MAX_ENDPOINTS_PER_SUBSET)]
    pub mirroring_max_endpoints_per_subset: usize,
}

impl BuiltinArgs {
    /// The built-in controllers, tuned by these flags and acting as their own service
    /// accounts under `--controller-service-accounts`, or an error naming the bad flag.
    pub fn registry(&self) -> Result<Registry, ServiceError> {
        let mut registry = builtin_controllers_with(&self.tuning()?);
        if let Some(namespace) = &self.controller_service_accounts {
            check_namespace(namespace).map_err(|problem| {
                ServiceError::Args(format!(
                    "--controller-service-accounts: {namespace:?} is not a namespace name: {problem}"
                ))
            })?;
            acting_as_service_accounts(&mut registry, namespace);
        }
        Ok(registry)
    }

    /// What these flags tune in the built-in controllers, or an error naming the bad flag.
    pub fn tuning(&self) -> Result<Tuning, ServiceError> {
        let limit = switchyard_reconciler_core::endpointslice::MAX_ENDPOINTS_PER_SLICE_LIMIT;
        for (flag, value) in [
            ("--max-endpoints-per-slice", self.max_endpoints_per_slice),
            (
                "--mirroring-max-endpoints-per-subset",
                self.mirroring_max_endpoints_per_subset,
            ),
        ] {
            if !(1..=limit).contains(&value) {
                return Err(ServiceError::Args(format!(
                    "{flag}: {value} is not between 1 and {limit}"
                )));
            }
        }
        for (flag, period) in [
            (
                "--endpointslice-updates-batch-period",
                self.endpointslice_updates_batch_period,
            ),
            (
                "--endpoint-updates-batch-period",
                self.endpoint_updates_batch_period,
            ),
        ] {
            if *period > MAX_BATCH_PERIOD {
                return Err(ServiceError::Args(format!(
                    "{flag}: {period} is longer than {}",
                    humantime::format_duration(MAX_BATCH_PERIOD)
                )));
            }
        }
        Ok(Tuning {
            terminated_pod_gc_threshold: self.terminated_pod_gc_threshold,
            max_endpoints_per_slice: self.max_endpoints_per_slice,
            endpoint_updates_batch_period: *self.endpointslice_updates_batch_period,
            endpoints_batch_period: *self.endpoint_updates_batch_period,
            mirroring_max_endpoints_per_subset: self.mirroring_max_endpoints_per_subset,
        })
    }
}

/// Why `name` is not a namespace name (an RFC 1123 label), if it is not.
fn check_namespace(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() || name.len() > 63 {
        return Err("it must have 1 to 63 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err("it may hold only lowercase letters, digits and '-'");
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err("it must start and end with a letter or digit");
    }
    Ok(())
}

/// The controllers built into the reconciler, each declared in its adapter module, in the
/// order of `switchyard_work::builtin::ALL`.
pub const BUILTINS: &[Builtin] = &[
    replicaset::BUILTIN,
    deployment::BUILTIN,
    gc::BUILTIN,
    namespace::BUILTIN,
    serviceaccount::BUILTIN,
    job::BUILTIN,
    ttlafterfinished::BUILTIN,
    cronjob::BUILTIN,
    podgc::BUILTIN,
    replicationcontroller::BUILTIN,
    statefulset::BUILTIN,
    disruption::BUILTIN,
    disruption::STALE_BUILTIN,
    daemonset::BUILTIN,
    endpointslice::BUILTIN,
    endpoints::BUILTIN,
    mirroring::BUILTIN,
];

/// The user a built-in controller's requests impersonate, with service accounts in
/// `namespace`; `None` for a controller that is not built in.
pub fn controller_user(controller: &str, namespace: &str) -> Option<String> {
    BUILTINS
        .iter()
        .find(|builtin| builtin.name == controller)
        .map(|builtin| {
            format!(
                "system:serviceaccount:{namespace}:{}",
                builtin.service_account
            )
        })
}

/// The names of the controllers built into the reconciler: what a queue serving this
/// reconciler's defaults must serve (the queue's own default `--controllers`, from the same
/// list, `switchyard_work::builtin`).
pub const BUILTIN: &[&str] = switchyard_work::builtin::ALL;

/// Makes each built-in controller of `registry` act as its own service account in
/// `namespace` (`--controller-service-accounts`).
pub fn acting_as_service_accounts(registry: &mut Registry, namespace: &str) {
    for name in registry.names() {
        if let Some(user) = controller_user(&name, namespace) {
            registry.act_as(&name, user);
        }
    }
}

/// The controllers built into the reconciler, tuned as by default.
pub fn builtin_controllers() -> Registry {
    builtin_controllers_with(&Tuning::default())
}

/// The controllers built into the reconciler, tuned by `settings`.
pub fn builtin_controllers_with(tuning: &Tuning) -> Registry {
    let mut registry = Registry::default();
    for builtin in BUILTINS {
        (builtin.register)(&mut registry, tuning);
    }
    registry
}

impl Args {
    /// Runs the reconciler with the built-in controllers until shutdown.
    pub async fn run(self) -> Result<(), ServiceError> {
        let registry = self.builtin.registry()?;
        self.service.start(registry).await?.run().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// The flags every reconciler requires; these tests only parse them (no file is read).
    const REQUIRED: [&str; 6] = [
        "switchyard-reconciler",
        "--watcher-addr=127.0.0.1:1",
        "--queue-addr=127.0.0.1:2",
        "--tls-cert=tls.crt",
        "--tls-key=tls.key",
        "--tls-ca=ca.crt",
    ];

    fn args(flags: &[&str]) -> BuiltinArgs {
        Args::try_parse_from(REQUIRED.iter().chain(flags))
            .unwrap()
            .builtin
    }

    #[test]
    fn the_built_in_table_follows_the_one_list_of_names() {
        let names: Vec<&str> = BUILTINS.iter().map(|b| b.name).collect();
        assert_eq!(names, BUILTIN);
        let mut registered = builtin_controllers().names();
        registered.sort_unstable();
        let mut names = names;
        names.sort_unstable();
        assert_eq!(registered, names);
    }

    #[test]
    fn every_built_in_controller_has_a_service_account_of_its_own() {
        let mut accounts: Vec<&str> = BUILTINS.iter().map(|b| b.service_account).collect();
        accounts.sort_unstable();
        accounts.dedup();
        assert_eq!(accounts.len(), BUILTIN.len());
        for name in BUILTIN {
            let user = controller_user(name, "switchyard").unwrap();
            assert!(
                user.starts_with("system:serviceaccount:switchyard:switchyard-"),
                "{user}"
            );
        }
        assert_eq!(
            controller_user("example.com/v1/Greeting", "switchyard"),
            None
        );
    }

    #[test]
    fn bad_built_in_flags_are_named() {
        for (flags, named) in [
            (
                &["--controller-service-accounts=Switchyard"][..],
                "--controller-service-accounts",
            ),
            (
                &["--controller-service-accounts="],
                "--controller-service-accounts",
            ),
            (
                &["--max-endpoints-per-slice=0"],
                "--max-endpoints-per-slice",
            ),
            (
                &["--mirroring-max-endpoints-per-subset=1001"],
                "--mirroring-max-endpoints-per-subset",
            ),
            (
                &["--endpoint-updates-batch-period=61s"],
                "--endpoint-updates-batch-period",
            ),
        ] {
            match args(flags).registry() {
                Err(ServiceError::Args(message)) => {
                    assert!(message.starts_with(named), "{flags:?}: {message}")
                }
                other => panic!("{flags:?}: expected a flag error, got {other:?}"),
            }
        }
    }

    #[test]
    fn each_built_in_controller_acts_as_its_service_account_when_asked() {
        let registry = args(&["--controller-service-accounts=switchyard"])
            .registry()
            .unwrap();
        for name in BUILTIN {
            assert_eq!(
                registry.user(name),
                controller_user(name, "switchyard").as_deref(),
                "{name}"
            );
        }
        assert!(args(&[]).registry().unwrap().users().is_empty());
    }
}
