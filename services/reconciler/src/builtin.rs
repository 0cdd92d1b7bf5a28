//! What a built-in controller declares beside its code, in its adapter module, as one
//! [`Builtin`]: its name, the service account it acts as, what that account may do, and how
//! it is registered. The reconciler's list of them (`crate::BUILTINS`) is the one place the
//! reconciler, its flags and the kustomize base's checks read it from.

use switchyard_k8s::kube::Resource;
use switchyard_reconciler_core::event::Event;

use crate::sdk::{Context, EventType, Registry};

/// A controller built into the reconciler.
#[derive(Clone, Copy, Debug)]
pub struct Builtin {
    /// The name its keys carry, from `switchyard_work::builtin` (the queue's default
    /// `--controllers` comes from the same list).
    pub name: &'static str,
    /// The service account it acts as under `--controller-service-accounts`;
    /// `deploy/kustomize/base/rbac.yaml` binds it a role of its own.
    pub service_account: &'static str,
    /// What that account may do: the role grants exactly this (`tests/boundaries.rs`).
    pub permissions: &'static [Permission],
    /// Adds the controller (and its watches, which it declares itself) to a registry,
    /// tuned by the reconciler's flags.
    pub register: fn(&mut Registry, &Tuning),
}

/// What the reconciler's flags tune in the built-in controllers (kube-controller-manager's
/// flags of the same names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// `--terminated-pod-gc-threshold`: the terminated Pods the pod garbage collector keeps;
    /// 0 keeps them all.
    pub terminated_pod_gc_threshold: u32,
    /// `--max-endpoints-per-slice`.
    pub max_endpoints_per_slice: usize,
    /// `--endpointslice-updates-batch-period`: how long a Pod's change is held before it
    /// keys its Services.
    pub endpoint_updates_batch_period: std::time::Duration,
    /// `--endpoint-updates-batch-period`: the same for the Endpoints controller.
    pub endpoints_batch_period: std::time::Duration,
    /// `--mirroring-max-endpoints-per-subset`.
    pub mirroring_max_endpoints_per_subset: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            terminated_pod_gc_threshold:
                switchyard_reconciler_core::podgc::DEFAULT_TERMINATED_THRESHOLD,
            max_endpoints_per_slice:
                switchyard_reconciler_core::endpointslice::DEFAULT_MAX_ENDPOINTS_PER_SLICE,
            endpoint_updates_batch_period: std::time::Duration::ZERO,
            endpoints_batch_period: std::time::Duration::ZERO,
            mirroring_max_endpoints_per_subset:
                switchyard_reconciler_core::mirroring::DEFAULT_MAX_ENDPOINTS_PER_SUBSET,
        }
    }
}

/// One RBAC rule a controller's account needs: `verbs` on `resources` of API `group` (`""`
/// the core group, `"*"` every group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permission {
    pub group: &'static str,
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
}

impl Permission {
    pub const fn new(
        group: &'static str,
        resources: &'static [&'static str],
        verbs: &'static [&'static str],
    ) -> Self {
        Self {
            group,
            resources,
            verbs,
        }
    }
}

/// Events (`events.k8s.io/v1`), as every built-in controller records them.
pub const RECORD_EVENTS: Permission =
    Permission::new("events.k8s.io", &["events"], &["create", "patch"]);

/// Records the Events a built-in controller's decision asked for on `object`.
pub fn publish<K: Resource<DynamicType = ()>>(ctx: &Context, object: &K, events: &[Event]) {
    for event in events {
        let type_ = if event.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        ctx.events
            .publish(object, type_, &event.reason, "Sync", event.message.clone());
    }
}
