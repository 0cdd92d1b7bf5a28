//! The pod garbage collector on the SDK (kube-controller-manager's `pod-garbage-collector`):
//! a sweep over every Pod and Node every 20 s, deciding with
//! `switchyard_reconciler_core::podgc`, force-deleting what it chose.
//!
//! ```text
//!  keys: a Node created, deleted or relabelled; a Pod a Node controls (a mirror Pod); a resync
//!     ─► the sweep key (pod-garbage-collector, "", "*") enqueued         (seeds it; never lost)
//!        at once for a Node the cache no longer has, else to run within 20 s (a sweep due
//!        sooner keeps its time: Node churn does not sweep more often)
//!  key "*": cache: every Pod, every Node
//!     ─► quarantine: Nodes Pods are bound to that the cache lacks, 40 s each
//!     ─► apiserver: each Node whose quarantine is over, read ─ gone ─► its Pods are orphans
//!     ─► core::sweep: terminated over the threshold, terminating on out-of-service Nodes,
//!        orphans, unscheduled terminating
//!     ─► each: status Failed (UID-guarded strategic merge) ─► delete, grace 0, that UID
//!     ─► RequeueAfter(20 s)
//! ```
//!
//! One key does the sweep, as one loop does in kube-controller-manager: a terminated-Pod
//! threshold is a count over the whole cluster. Its quarantine of missing Nodes lives in the
//! replica that holds the key; a key that moves starts it again (a Pod is deleted later,
//! never earlier).

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex, PoisonError},
};

use futures::{StreamExt, stream};
use switchyard_k8s::{
    Api, DeleteParams, Pod,
    k8s_openapi::{api::core::v1::Node, jiff::Timestamp},
    kube::api::{Patch, PatchParams, Preconditions},
};
use switchyard_queue_client::WorkKey;
use switchyard_reconciler_core::podgc::{self as core, Deletion, Quarantine};
use tracing::{debug, info, warn};

use crate::builtin::{Builtin, Permission};
use crate::cache::ListFilter;
use crate::sdk::{
    Action, Builder, Context, Controller, Error, Options, Predicate, Refusal, Request, Result,
    Watches,
};

pub const NAME: &str = switchyard_work::builtin::POD_GC;

/// The name of the one key that sweeps; no Node can have it (`*` is not in a DNS name).
pub const SWEEP: &str = "*";

/// This controller, as the reconciler's list of built-ins names it.
pub const BUILTIN: Builtin = Builtin {
    name: NAME,
    service_account: "switchyard-pod-garbage-collector",
    permissions: PERMISSIONS,
    register: |registry, tuning| {
        registry.register(PodGcController::new(tuning.terminated_pod_gc_threshold));
    },
};

/// What its account may do (`deploy/kustomize/base/rbac.yaml` grants exactly this): read a
/// Node from the apiserver once its quarantine is over, mark a Pod failed and delete it.
/// Pods and Nodes are otherwise read through the watcher's cache; it records no Events, as
/// kube-controller-manager's does not.
pub const PERMISSIONS: &[Permission] = &[
    Permission::new("", &["nodes"], &["get"]),
    Permission::new("", &["pods"], &["delete"]),
    Permission::new("", &["pods/status"], &["patch"]),
];

/// Pod deletions (and their status writes) in flight at once during a sweep.
const AT_ONCE: usize = 16;

/// Nodes (in full: their taints and Ready condition) and Pods. Only a Node created,
/// deleted or relabelled keys it, and a Pod only through a Node that controls it (a mirror
/// Pod): each such key just makes sure the sweep is queued.
pub fn watches() -> Watches {
    Builder::for_with::<Node>(Options::default().predicates([Predicate::LabelsChanged]))
        .named(NAME)
        .owns::<Pod>()
        .into_watches()
}

/// kube-controller-manager's pod garbage collector.
#[derive(Debug, Clone)]
pub struct PodGcController {
    /// `--terminated-pod-gc-threshold`: terminated Pods kept; 0 keeps them all.
    threshold: u32,
    quarantine: Arc<Mutex<Quarantine>>,
}

impl PodGcController {
    pub fn new(threshold: u32) -> Self {
        Self {
            threshold,
            quarantine: Arc::default(),
        }
    }
}

impl Controller for PodGcController {
    fn name(&self) -> &str {
        NAME
    }

    fn watches(&self) -> Option<Watches> {
        Some(watches())
    }

    async fn reconcile(&self, ctx: &Context, request: &Request) -> Result {
        if request.namespace.is_empty() && request.name == SWEEP {
            return self.sweep(ctx).await;
        }
        let node = ctx
            .cache
            .get_metadata::<Node>("", &request.name, None)
            .await?;
        let sweep = WorkKey::new(NAME, "", SWEEP);
        ctx.enqueue([(sweep, Some(core::sweep_after(node.is_some())))])
            .await?;
        Ok(Action::Done)
    }
}

impl PodGcController {
    async fn sweep(&self, ctx: &Context) -> Result {
        let all = ListFilter::default();
        let (pods, nodes) = futures::try_join!(
            ctx.cache.list_shared::<Pod>("", all.clone()),
            ctx.cache.list_shared::<Node>("", all),
        )?;
        let due = self
            .quarantine
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .due(&pods, &nodes, Timestamp::now());
        let deleted_nodes = confirm_deleted(ctx, due).await;
        let deletions = core::sweep(
            &pods,
            &nodes,
            self.threshold,
            &deleted_nodes,
            Timestamp::now(),
        );
        debug!(
            pods = pods.len(),
            nodes = nodes.len(),
            deletions = deletions.len(),
            "swept"
        );
        let mut first = None;
        let mut outcomes = stream::iter(deletions.into_iter().map(|d| force_delete(ctx, d)))
            .buffer_unordered(AT_ONCE);
        while let Some(outcome) = outcomes.next().await {
            if let Err(error) = outcome {
                crate::sdk::keep_first(&mut first, error);
            }
        }
        match first {
            Some(error) => Err(error),
            None => Ok(Action::RequeueAfter(core::SWEEP_PERIOD)),
        }
    }
}

/// The Nodes among `due` that the apiserver does not have either.
async fn confirm_deleted(ctx: &Context, due: Vec<String>) -> BTreeSet<String> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let mut deleted = BTreeSet::new();
    for name in due {
        match api.get_opt(&name).await {
            Ok(None) => {
                info!(node = %name, "node no longer exists: its pods are orphans");
                deleted.insert(name);
            }
            Ok(Some(_)) => debug!(node = %name, "node exists after all"),
            Err(error) => warn!(node = %name, %error, "reading a missing node failed"),
        }
    }
    deleted
}

/// `markFailedAndDeletePodWithCondition`: the status first, then the deletion; both for this
/// UID only (a Pod made again under the name is spared). A Pod already gone is no error.
async fn force_delete(ctx: &Context, deletion: Deletion) -> Result<()> {
    let Deletion {
        namespace,
        name,
        uid,
        reason,
        status_patch,
    } = deletion;
    let api: Api<Pod> = ctx.api(&namespace);
    let gone = |error: &switchyard_k8s::kube::Error| error.is_not_found() || error.is_conflict();
    if let Some(patch) = status_patch {
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
        {
            Ok(_) => {}
            Err(error) if gone(&error) => return Ok(()),
            Err(error) => return Err(Error::from(error)),
        }
    }
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&name, &params).await {
        Ok(_) => {
            info!(%namespace, pod = %name, reason = reason.as_str(), "pod force-deleted");
            Ok(())
        }
        Err(error) if gone(&error) => Ok(()),
        Err(error) => Err(error.into()),
    }
}
