//! The ReplicationController controller on the SDK: the ReplicaSet controller
//! ([`crate::replicaset`]) over the ReplicationController's ReplicaSet form, as
//! kube-controller-manager's `replicationcontroller-controller` is its ReplicaSet controller
//! over a conversion (`pkg/controller/replication`): the same claim, creation, deletion and
//! status, with the Pods' controller references, the status and the Events the
//! ReplicationController's own (and no `terminatingReplicas`, which its status lacks).

use switchyard_k8s::{Pod, k8s_openapi::api::core::v1::ReplicationController};

use crate::builtin::{Builtin, Permission, RECORD_EVENTS};
use crate::replicaset::{POD_BATCH_PERIOD, reconcile};
use crate::sdk::{Builder, Context, Controller, Options, Request, Result, Watches};

pub const NAME: &str = switchyard_work::builtin::REPLICATION_CONTROLLER;

/// This controller, as the reconciler's list of built-ins names it.
pub const BUILTIN: Builtin = Builtin {
    name: NAME,
    service_account: "switchyard-replicationcontroller-controller",
    permissions: PERMISSIONS,
    register: |registry, _| {
        registry.register(ReplicationControllerController);
    },
};

/// What its account may do (`deploy/kustomize/base/rbac.yaml` grants exactly this): the
/// ReplicaSet controller's verbs, on ReplicationControllers.
pub const PERMISSIONS: &[Permission] = &[
    Permission::new("", &["pods"], &["list", "create", "delete", "patch"]),
    Permission::new("", &["replicationcontrollers"], &["get"]),
    Permission::new(
        "",
        &[
            "replicationcontrollers/status",
            "replicationcontrollers/finalizers",
        ],
        &["update"],
    ),
    RECORD_EVENTS,
];

/// kube-controller-manager's ReplicationController controller.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReplicationControllerController;

/// As the ReplicaSet controller's: every change of a ReplicationController, and every change
/// of a Pod it controls, held for the same batch period.
pub fn watches() -> Watches {
    Builder::for_::<ReplicationController>()
        .owns_with::<Pod>(Options::default().batch_period(POD_BATCH_PERIOD))
        .into_watches()
}

impl Controller for ReplicationControllerController {
    fn name(&self) -> &str {
        NAME
    }

    fn watches(&self) -> Option<Watches> {
        Some(watches())
    }

    async fn reconcile(&self, ctx: &Context, request: &Request) -> Result {
        reconcile::<ReplicationController>(ctx, request).await
    }
}
