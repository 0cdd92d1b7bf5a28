//! The Deployment controller on the SDK: reads from the watcher's cache, decides with
//! `switchyard_reconciler_core::deployment`, writes to the apiserver.
//!
//! ```text
//!  cache: Deployment, its ReplicaSets (by controller UID) ∪ the selector's
//!     ─► claim: adopt orphans, release those that stopped matching  (patches, resourceVersion-guarded)
//!     ─► being deleted: status only
//!     ─► paused, or replicas changed: scale (one active RS, or proportionally)
//!     ─► RollingUpdate: new RS (created or brought up to date) ─► scale new up | old down
//!        Recreate:      old RSs to 0 ─► no old Pod left (Pod cache) ─► new RS at replicas
//!     ─► complete: old RSs beyond revisionHistoryLimit deleted
//!     ─► status (Available, Progressing) ─► replace status (409 on a stale read: failed, backoff)
//!     ─► cache again at the resourceVersion of the last write   (the next reconcile reads it)
//! ```
//!
//! One step per reconcile, as kube-controller-manager takes it: the ReplicaSets' status
//! changes key the Deployment again, and `RequeueAfter` brings it back at its progress
//! deadline.

use std::collections::BTreeMap;

use futures::future::join_all;
use switchyard_k8s::{
    Api, DeleteParams, Deployment, Pod, PostParams, ReplicaSet,
    k8s_openapi::{api::apps::v1::DeploymentStatus, jiff::Timestamp},
};
use switchyard_reconciler_core::deployment::{
    self as core, REVISION, Spec, Strategy, controller_of, replicas, revision,
};
use tracing::{debug, info, warn};

use crate::builtin::{Builtin, Permission, RECORD_EVENTS};
use crate::{
    cache::ListFilter,
    sdk::{
        self, Action, Builder, Context, Error, EventType, Options, Predicate, Refusal, Request,
        Result, Watches, is_namespace_terminating, status_message,
    },
};

pub const NAME: &str = switchyard_work::builtin::DEPLOYMENT;

/// This controller, as the reconciler's list of built-ins names it.
pub const BUILTIN: Builtin = Builtin {
    name: NAME,
    service_account: "switchyard-deployment-controller",
    permissions: PERMISSIONS,
    register: |registry, _| {
        registry.register(DeploymentController);
    },
};

/// What its account may do (`deploy/kustomize/base/rbac.yaml` grants exactly this): write
/// ReplicaSets, read a Deployment before adopting, write the status and set
/// blockOwnerDeletion, record Events.
pub const PERMISSIONS: &[Permission] = &[
    Permission::new(
        "apps",
        &["replicasets"],
        &["get", "create", "update", "patch", "delete"],
    ),
    Permission::new("apps", &["deployments"], &["get"]),
    Permission::new(
        "apps",
        &["deployments/status", "deployments/finalizers"],
        &["update"],
    ),
    RECORD_EVENTS,
];
/// kube-controller-manager's Event reason for every change of a ReplicaSet's size.
const SCALING_REPLICA_SET: &str = "ScalingReplicaSet";

/// kube-controller-manager's Deployment controller.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeploymentController;

/// Every change of a Deployment; every change of a ReplicaSet it controls (its status sums
/// theirs); and a Pod of such a ReplicaSet created, deleted or relabeled: Recreate starts the
/// new Pods once the last old one is gone (kube-controller-manager's deletePod).
pub fn watches() -> Watches {
    Builder::for_::<Deployment>()
        .owns::<ReplicaSet>()
        .owns_through::<Pod, ReplicaSet>(Options::default().predicates([Predicate::LabelsChanged]))
        .into_watches()
}

impl crate::sdk::Controller for DeploymentController {
    fn name(&self) -> &str {
        NAME
    }

    fn watches(&self) -> Option<Watches> {
        Some(watches())
    }

    async fn reconcile(&self, ctx: &Context, request: &Request) -> Result {
        reconcile(ctx, request).await
    }
}

fn rs_name(rs: &ReplicaSet) -> &str {
    rs.metadata.name.as_deref().unwrap_or_default()
}

/// One reconcile's view: the Deployment as last written, the status being built, the
/// ReplicaSets it owns as last read or written, and its last ReplicaSet write.
struct Run<'c> {
    ctx: &'c Context,
    rs_api: Api<ReplicaSet>,
    d_api: Api<Deployment>,
    d: Deployment,
    status: DeploymentStatus,
    owned: Vec<ReplicaSet>,
    /// resourceVersion (as a number and as written) and name of the newest ReplicaSet write.
    last_write: Option<(u64, String, String)>,
    /// The revision annotation of `d` changed and is to be written.
    revision_changed: bool,
    now: Timestamp,
}

impl Run<'_> {
    fn saw(&mut self, rs: &ReplicaSet) {
        let Some(rv) = rs.metadata.resource_version.as_deref() else {
            return;
        };
        let Ok(number) = rv.parse::<u64>() else {
            return;
        };
        if self
            .last_write
            .as_ref()
            .is_none_or(|(max, _, _)| number > *max)
        {
            self.last_write = Some((number, rv.to_owned(), rs_name(rs).to_owned()));
        }
    }

    /// Keeps `rs` as the owned ReplicaSet of its name.
    fn keep(&mut self, rs: ReplicaSet) {
        self.saw(&rs);
        match self.owned.iter_mut().find(|o| rs_name(o) == rs_name(&rs)) {
            Some(slot) => *slot = rs,
            None => self.owned.push(rs),
        }
    }

    async fn replace(&mut self, rs: &ReplicaSet) -> Result<()> {
        let written = self
            .rs_api
            .replace(rs_name(rs), &PostParams::default(), rs)
            .await?;
        self.keep(written);
        Ok(())
    }

    /// kube-controller-manager's `ScalingReplicaSet` event on the Deployment: each message an
    /// Event of its own. It is written in the background; the reconcile goes on.
    fn scaled_event(&self, replica_set: &str, from: i32, to: i32) {
        let direction = if to > from { "up" } else { "down" };
        let note = format!("Scaled {direction} replica set {replica_set} from {from} to {to}");
        self.ctx.events.publish(
            &self.d,
            EventType::Normal,
            SCALING_REPLICA_SET,
            "Scale",
            note,
        );
    }

    /// Writes the sizes the decision gave, by name, where they differ.
    async fn resize(&mut self, spec: &Spec<'_>, sizes: &[(String, i32)]) -> Result<bool> {
        let updates: Vec<(i32, ReplicaSet)> = sizes
            .iter()
            .filter_map(|(name, size)| {
                let rs = self.owned.iter().find(|rs| rs_name(rs) == name)?;
                Some((replicas(rs), core::scaled(spec, rs, *size)?))
            })
            .collect();
        let params = PostParams::default();
        let results = join_all(
            updates
                .iter()
                .map(|(_, rs)| self.rs_api.replace(rs_name(rs), &params, rs)),
        )
        .await;
        let mut first_error = None;
        let mut any = false;
        for ((from, _), result) in updates.iter().zip(results) {
            match result {
                Ok(rs) => {
                    debug!(
                        replica_set = rs_name(&rs),
                        replicas = replicas(&rs),
                        "scaled"
                    );
                    any = true;
                    self.scaled_event(rs_name(&rs), *from, replicas(&rs));
                    self.keep(rs);
                }
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            Some(error) => Err(error.into()),
            None => Ok(any),
        }
    }

    /// The new ReplicaSet, brought up to date, or created when `create` and there is none
    /// (`getNewReplicaSet`). Its name, if any.
    async fn new_replica_set(&mut self, spec: &Spec<'_>, create: bool) -> Result<Option<String>> {
        let refs: Vec<&ReplicaSet> = self.owned.iter().collect();
        let (new, old) = core::split(spec, &refs);
        if let Some(new) = new {
            let name = rs_name(new).to_owned();
            let refreshed = core::refresh_new_replica_set(spec, new, &old);
            let revision = revision(refreshed.as_ref().unwrap_or(new));
            if let Some(updated) = refreshed {
                self.replace(&updated).await?;
            }
            core::note_new_replica_set(&mut self.status, spec, &name, false, self.now);
            self.set_revision(revision);
            return Ok(Some(name));
        }
        if !create {
            return Ok(None);
        }
        let rs = core::new_replica_set(spec, &old);
        let name = rs_name(&rs).to_owned();
        match self.rs_api.create(&PostParams::default(), &rs).await {
            Ok(created) => {
                info!(replica_set = %name, replicas = replicas(&created), "created new replica set");
                if replicas(&created) > 0 {
                    self.scaled_event(&name, 0, replicas(&created));
                }
                let revision = revision(&created);
                self.keep(created);
                core::note_new_replica_set(&mut self.status, spec, &name, true, self.now);
                self.set_revision(revision);
                Ok(Some(name))
            }
            Err(error) if error.is_already_exists() => {
                let existing = self.rs_api.get(&name).await?;
                if core::is_ours_with_template(spec, &existing) {
                    let revision = revision(&existing);
                    self.keep(existing);
                    self.set_revision(revision);
                    return Ok(Some(name));
                }
                // A hash collision: the next name comes from a higher collision count.
                let mut status = self.d.status.clone().unwrap_or_default();
                status.collision_count = Some(status.collision_count.unwrap_or(0) + 1);
                warn!(replica_set = %name, collision_count = status.collision_count, "pod-template-hash collision");
                self.write_status(status).await?;
                Err(Error::Other(format!(
                    "replica set {name:?} exists with another template; collision count raised"
                )))
            }
            // As kube-controller-manager: in a namespace being deleted every creation fails,
            // and there is nothing to note; the worker takes the error as done.
            Err(error) if is_namespace_terminating(&error) => Err(error.into()),
            Err(error) => {
                let message = status_message(&error);
                self.ctx.events.publish(
                    &self.d,
                    EventType::Warning,
                    core::FAILED_RS_CREATE,
                    "Create",
                    format!("Failed to create new replica set {name:?}: {message}"),
                );
                let mut status = self.status.clone();
                core::note_create_failure(&mut status, spec, &name, &message, self.now);
                if let Err(status_error) = self.write_status(status).await {
                    debug!(error = %status_error, "could not report the failed creation");
                }
                Err(error.into())
            }
        }
    }

    /// The Deployment's revision annotation follows its new ReplicaSet's
    /// (`SetDeploymentRevision`). It is written with the status: the apiserver keeps
    /// annotations on a status write without raising the generation, which a metadata
    /// change through the main resource would.
    fn set_revision(&mut self, revision: i64) {
        let value = revision.to_string();
        let annotations = self
            .d
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new);
        if revision != 0 && annotations.get(REVISION) != Some(&value) {
            annotations.insert(REVISION.to_owned(), value);
            self.revision_changed = true;
        }
    }

    /// Deletes old ReplicaSets beyond the history limit (`cleanupDeployment`).
    async fn clean_up(&mut self, spec: &Spec<'_>) -> Result<()> {
        let refs: Vec<&ReplicaSet> = self.owned.iter().collect();
        let (_, old) = core::split(spec, &refs);
        let doomed: Vec<String> = core::to_clean_up(spec, &old)
            .into_iter()
            .map(|rs| rs_name(rs).to_owned())
            .collect();
        for name in doomed {
            match self.rs_api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {
                    debug!(replica_set = %name, "deleted old replica set");
                    self.owned.retain(|rs| rs_name(rs) != name);
                }
                Err(error) if error.is_not_found() => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }

    async fn write_status(&mut self, status: DeploymentStatus) -> Result<()> {
        let mut updated = self.d.clone();
        updated.status = Some(status);
        let name = self.d.metadata.name.clone().unwrap_or_default();
        self.d = self
            .d_api
            .replace_status(&name, &PostParams::default(), &updated)
            .await?;
        self.revision_changed = false;
        Ok(())
    }

    /// The Pods the old ReplicaSets still control, from the cache.
    async fn old_pods(&self, old: &[&ReplicaSet]) -> Result<Vec<Pod>> {
        let namespace = self.d.metadata.namespace.as_deref().unwrap_or_default();
        let lists = join_all(old.iter().map(|rs| {
            self.ctx.cache.list::<Pod>(
                namespace,
                ListFilter {
                    controller_uid: rs.metadata.uid.as_deref().unwrap_or_default(),
                    ..ListFilter::default()
                },
            )
        }))
        .await;
        let mut pods = Vec::new();
        for list in lists {
            pods.extend(list?);
        }
        Ok(pods)
    }

    fn split<'s>(&'s self, spec: &Spec<'_>) -> (Option<&'s ReplicaSet>, Vec<&'s ReplicaSet>) {
        let refs: Vec<&ReplicaSet> = self.owned.iter().collect();
        core::split(spec, &refs)
    }

    fn all(&self) -> Vec<&ReplicaSet> {
        self.owned.iter().collect()
    }

    /// `sync`: scaling, and the history while paused; the status without `Progressing`
    /// changes (`syncDeploymentStatus`).
    async fn sync(&mut self, spec: &Spec<'_>) -> Result<DeploymentStatus> {
        self.new_replica_set(spec, false).await?;
        let (new, old) = self.split(spec);
        let sizes = core::scale(spec, new, &old);
        self.resize(spec, &sizes).await?;
        if spec.paused {
            self.clean_up(spec).await?;
        }
        let (new, _) = self.split(spec);
        Ok(core::calculate_status(
            spec,
            new,
            &self.all(),
            &self.status,
            self.now,
        ))
    }

    fn rollout_status(&self, spec: &Spec<'_>) -> DeploymentStatus {
        let (new, _) = self.split(spec);
        core::rollout_status(spec, new, &self.all(), &self.status, self.now)
    }

    /// `rolloutRolling`.
    async fn rolling(&mut self, spec: &Spec<'_>) -> Result<DeploymentStatus> {
        let Some(new_name) = self.new_replica_set(spec, true).await? else {
            return Ok(self.rollout_status(spec));
        };
        let (new, old) = self.split(spec);
        let Some(new) = new.filter(|rs| rs_name(rs) == new_name) else {
            return Ok(self.rollout_status(spec));
        };
        if let Some(size) = core::rolling_new_size(spec, new, &self.all()) {
            self.resize(spec, &[(new_name, size)]).await?;
            return Ok(self.rollout_status(spec));
        }
        let sizes = core::rolling_old_sizes(spec, new, &old);
        if self.resize(spec, &sizes).await? {
            return Ok(self.rollout_status(spec));
        }
        self.clean_up_if_complete(spec).await
    }

    /// The rollout status, after cleaning up the history if the rollout was complete in the
    /// status read, as kube-controller-manager checks it. A rollout completing now is cleaned
    /// up by the next reconcile, which its own status write keys.
    async fn clean_up_if_complete(&mut self, spec: &Spec<'_>) -> Result<DeploymentStatus> {
        let status = self.rollout_status(spec);
        let before = self.d.status.clone().unwrap_or_default();
        if core::is_complete(spec, &before) {
            self.clean_up(spec).await?;
        }
        Ok(status)
    }

    /// `rolloutRecreate`.
    async fn recreate(&mut self, spec: &Spec<'_>) -> Result<DeploymentStatus> {
        self.new_replica_set(spec, false).await?;
        let (_, old) = self.split(spec);
        let to_zero: Vec<(String, i32)> = old
            .iter()
            .filter(|rs| replicas(rs) > 0)
            .map(|rs| (rs_name(rs).to_owned(), 0))
            .collect();
        if self.resize(spec, &to_zero).await? {
            return Ok(self.rollout_status(spec));
        }
        let (_, old) = self.split(spec);
        let pods = if old
            .iter()
            .any(|rs| rs.status.as_ref().is_some_and(|s| s.replicas > 0))
        {
            Vec::new()
        } else {
            self.old_pods(&old).await?
        };
        if core::old_pods_running(&old, &pods) {
            debug!("waiting for the old pods to go");
            return Ok(self.rollout_status(spec));
        }
        let Some(new_name) = self.new_replica_set(spec, true).await? else {
            return Ok(self.rollout_status(spec));
        };
        self.resize(spec, &[(new_name, spec.replicas)]).await?;
        self.clean_up_if_complete(spec).await
    }
}

/// The ReplicaSets the Deployment controls and those its selector matches (orphans to
/// adopt), in name order.
async fn read_replica_sets(ctx: &Context, spec: &Spec<'_>) -> Result<Vec<ReplicaSet>> {
    let query = spec.selector.to_query();
    let rss = ctx
        .cache
        .list::<ReplicaSet>(
            spec.namespace,
            ListFilter {
                label_selector: &query,
                controller_uid: spec.uid,
                either: true,
                ..ListFilter::default()
            },
        )
        .await?;
    Ok(rss)
}

/// kube-controller-manager's `canAdopt` for a Deployment ([`sdk::can_adopt`]).
pub async fn can_adopt(ctx: &Context, d: &Deployment) -> Result<()> {
    sdk::can_adopt(ctx, d, "deployment").await
}

async fn reconcile(ctx: &Context, request: &Request) -> Result {
    let Some(d) = ctx
        .cache
        .get::<Deployment>(&request.namespace, &request.name, None)
        .await?
    else {
        debug!("deployment gone");
        return Ok(Action::Done);
    };
    let spec = match Spec::new(&d) {
        Ok(spec) => spec,
        Err(error) => {
            // Retrying cannot fix the object; its next change is keyed again.
            warn!(%error, "invalid deployment, not reconciled");
            return Ok(Action::Done);
        }
    };
    let rs_api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), &request.namespace);
    let rss = read_replica_sets(ctx, &spec).await?;
    let claim = core::claim(&spec, &rss);
    if !claim.adopt.is_empty() {
        can_adopt(ctx, &d).await?;
    }

    let patched = join_all(
        claim
            .adopt
            .iter()
            .map(|rs| sdk::set_controller_ref(&rs_api, rs, spec.uid, Some(spec.controller_ref())))
            .chain(
                claim
                    .release
                    .iter()
                    .map(|rs| sdk::set_controller_ref(&rs_api, rs, spec.uid, None)),
            ),
    )
    .await;
    let mut run = Run {
        ctx,
        rs_api: rs_api.clone(),
        d_api: Api::namespaced(ctx.client.clone(), &request.namespace),
        d: d.clone(),
        status: d.status.clone().unwrap_or_default(),
        owned: claim.owned.iter().map(|rs| (*rs).clone()).collect(),
        last_write: None,
        revision_changed: false,
        now: core::whole_seconds(Timestamp::now()),
    };
    let mut first_error: Option<Error> = None;
    for result in patched {
        match result {
            Ok(rs) => {
                run.saw(&rs);
                if controller_of(&rs.metadata).is_some_and(|r| r.uid == spec.uid) {
                    run.owned.push(rs);
                }
            }
            Err(error) if error.is_not_found() => {}
            Err(error) => {
                first_error.get_or_insert(error.into());
            }
        }
    }
    // As kube-controller-manager: no rollout on a failed claim.
    if let Some(error) = first_error {
        return Err(error);
    }

    let outcome = if spec.deleting {
        let (new, _) = run.split(&spec);
        Ok(core::calculate_status(
            &spec,
            new,
            &run.all(),
            &run.status,
            run.now,
        ))
    } else {
        if let Some(status) = core::paused_status(&spec, run.now) {
            run.status = status;
        }
        let refs: Vec<&ReplicaSet> = run.owned.iter().collect();
        if spec.paused || core::is_scaling_event(&spec, &refs) {
            run.sync(&spec).await
        } else {
            match spec.strategy {
                Strategy::RollingUpdate { .. } => run.rolling(&spec).await,
                Strategy::Recreate => run.recreate(&spec).await,
            }
        }
    };
    // Whatever happened, the next reconcile must see this one's ReplicaSet writes.
    if let Some((_, rv, name)) = run.last_write.clone() {
        ctx.cache
            .get::<ReplicaSet>(&request.namespace, &name, Some(&rv))
            .await?;
    }
    let status = outcome?;
    let original = run.d.status.clone().unwrap_or_default();
    if run.revision_changed || core::status_changed(&original, &status) {
        run.write_status(status.clone()).await?;
        let rv = run.d.metadata.resource_version.clone();
        ctx.cache
            .get::<Deployment>(&request.namespace, &request.name, rv.as_deref())
            .await?;
    }
    if spec.paused || spec.deleting {
        return Ok(Action::Done);
    }
    Ok(match core::recheck_after(&spec, &status, run.now) {
        Some(delay) => Action::RequeueAfter(delay),
        None => Action::Done,
    })
}
