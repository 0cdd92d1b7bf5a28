//! The StatefulSet controller on the SDK: reads from the watcher's cache, decides with
//! `switchyard_reconciler_core::statefulset` and `history`, writes to the apiserver.
//!
//! ```text
//!  cache: StatefulSet, its ControllerRevisions, its Pods (by controller UID) ∪ the selector's,
//!         the namespace's PersistentVolumeClaims
//!     ─► adopt orphan revisions and Pods, release Pods that stopped matching
//!     ─► update revision: the newest equal one | an older equal one renumbered | a new one
//!        (named by hash; collisionCount raised on a clash)
//!     ─► plan: phases of steps (create with claims first, replace, fix, condemn, roll),
//!        one at a time (OrderedReady) or in slow-start batches (Parallel)
//!     ─► status (409 on a stale read: failed, queue backoff)
//!     ─► history past revisionHistoryLimit deleted
//! ```
//!
//! Pods have fixed names, so a reconcile that reads a cache without the previous one's
//! creations is refused by the apiserver (`AlreadyExists`) rather than making a Pod twice,
//! as in kube-controller-manager, which keeps no expectations for StatefulSets. Every write
//! still raises the key's read floor ([`crate::cache::CacheClient::wrote`]).

use std::{
    borrow::Cow,
    collections::{BTreeMap, BTreeSet},
};

use futures::future::join_all;
use switchyard_k8s::{
    Api, DeleteParams, Pod, PostParams,
    k8s_openapi::{
        api::{
            apps::v1::{ControllerRevision, StatefulSet},
            core::v1::PersistentVolumeClaim,
        },
        jiff::Timestamp,
    },
};
use switchyard_reconciler_core::{
    history::{self, UpdateRevision},
    statefulset::{self as core, Revisions, Spec, Step},
};
use tracing::{debug, warn};

use crate::builtin::{Builtin, Permission, RECORD_EVENTS};
use crate::cache::ListFilter;
use crate::claim::Owner;
use crate::replicaset::POD_BATCH_PERIOD;
use crate::sdk::{
    Action, Builder, Context, Controller, Error, EventType, Options, Refusal, Request, Result,
    Watches, keep_first, status_message,
};

pub const NAME: &str = switchyard_work::builtin::STATEFULSET;

/// This controller, as the reconciler's list of built-ins names it.
pub const BUILTIN: Builtin = Builtin {
    name: NAME,
    service_account: "switchyard-statefulset-controller",
    permissions: PERMISSIONS,
    register: |registry, _| {
        registry.register(StatefulSetController);
    },
};

/// What its account may do (`deploy/kustomize/base/rbac.yaml` grants exactly this): write
/// Pods (create, delete, fix their identity, adopt and release them), create claims and set
/// their owners, keep the ControllerRevisions, read a StatefulSet before adopting, write the
/// status and set blockOwnerDeletion (`finalizers`), record Events. Reads go through the
/// watcher's cache.
pub const PERMISSIONS: &[Permission] = &[
    Permission::new("", &["pods"], &["create", "delete", "update", "patch"]),
    Permission::new("", &["persistentvolumeclaims"], &["create", "update"]),
    Permission::new(
        "apps",
        &["controllerrevisions"],
        &["get", "create", "update", "patch", "delete"],
    ),
    Permission::new("apps", &["statefulsets"], &["get"]),
    Permission::new(
        "apps",
        &["statefulsets/status", "statefulsets/finalizers"],
        &["update"],
    ),
    RECORD_EVENTS,
];

/// kube-controller-manager's StatefulSet controller.
#[derive(Debug, Clone, Copy, Default)]
pub struct StatefulSetController;

/// Every change of a StatefulSet, of a Pod it controls (held as the ReplicaSet controller's
/// are, so that Pods turning Ready together are one reconcile), and of a ControllerRevision
/// or PersistentVolumeClaim it controls: the revisions and claims are read from the cache.
pub fn watches() -> Watches {
    Builder::for_::<StatefulSet>()
        .owns_with::<Pod>(Options::default().batch_period(POD_BATCH_PERIOD))
        .owns::<ControllerRevision>()
        .owns::<PersistentVolumeClaim>()
        .into_watches()
}

impl Controller for StatefulSetController {
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

/// How kube-controller-manager's messages name the kind.
const NOUN: &str = "statefulset";
/// The most collisions tried before a reconcile gives up naming a new revision.
const MAX_COLLISIONS: i32 = 16;

/// One reconcile of a StatefulSet.
pub async fn reconcile(ctx: &Context, request: &Request) -> Result {
    let Some(set) = ctx
        .cache
        .get::<StatefulSet>(&request.namespace, &request.name, None)
        .await?
    else {
        debug!("statefulset gone");
        return Ok(Action::Done);
    };
    let spec = match Spec::new(&set) {
        Ok(spec) => spec,
        Err(error) => {
            // Retrying cannot fix the object; its next change is keyed again.
            warn!(%error, "invalid statefulset, not reconciled");
            return Ok(Action::Done);
        }
    };
    let namespace = spec.namespace;
    let query = spec.selector.to_query();

    let mut revisions = adopt_revisions(ctx, &set, &spec, &query).await?;
    let pods = owned_pods(ctx, &set, &spec, &query).await?;
    let claims: BTreeMap<String, PersistentVolumeClaim> = ctx
        .cache
        .list::<PersistentVolumeClaim>(namespace, ListFilter::default())
        .await?
        .into_iter()
        .filter_map(|c| Some((c.metadata.name.clone()?, c)))
        .collect();

    history::sort(&mut revisions);
    let mut collision_count = set
        .status
        .as_ref()
        .and_then(|s| s.collision_count)
        .unwrap_or(0);
    let update = update_revision(ctx, &spec, &revisions, &mut collision_count).await?;
    let current_name = set
        .status
        .as_ref()
        .and_then(|s| s.current_revision.as_deref())
        .unwrap_or_default();
    let current = revisions
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(current_name))
        .unwrap_or(&update);
    let template = |revision: &ControllerRevision| {
        core::revision_template(revision).map_err(|e| {
            Error::Other(format!(
                "controllerrevision {}: {e}",
                revision.metadata.name.as_deref().unwrap_or_default()
            ))
        })
    };
    let (current_template, update_template) = (template(current)?, template(&update)?);
    let revs = Revisions {
        current: current.metadata.name.as_deref().unwrap_or_default(),
        current_template: &current_template,
        update: update.metadata.name.as_deref().unwrap_or_default(),
        update_template: &update_template,
        collision_count,
    };

    let owned: Vec<&Pod> = pods.iter().collect();
    let now = Timestamp::now();
    let plan = core::plan(&spec, &revs, &owned, &claims, now);
    let mut writer = Writer {
        ctx,
        set: &set,
        spec: &spec,
        pods: Api::namespaced(ctx.client.clone(), namespace),
        claims_api: Api::namespaced(ctx.client.clone(), namespace),
        claims,
    };
    let mut first_error = None;
    for phase in &plan.phases {
        if let Err(error) = writer.run(phase).await {
            first_error = Some(error);
            break;
        }
    }
    debug!(
        pods = owned.len(),
        steps = plan.phases.iter().map(Vec::len).sum::<usize>(),
        update = revs.update,
        failed = first_error.is_some(),
        "reconciled statefulset"
    );

    let status = core::completed(&spec, plan.status);
    if core::status_changed(&set, &status) {
        let mut updated = set.clone();
        updated.status = Some(status.clone());
        let sets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), namespace);
        match sets
            .replace_status(&request.name, &PostParams::default(), &updated)
            .await
        {
            Ok(written) => {
                // The next reconcile compares against the cached status: it must hold this.
                if let Some(rv) = written.metadata.resource_version.as_deref() {
                    ctx.cache
                        .get::<StatefulSet>(namespace, &request.name, Some(rv))
                        .await?;
                }
            }
            Err(error) => keep_first(&mut first_error, error),
        }
    }

    // History past the limit, oldest first, never a revision in use.
    let live: BTreeSet<&str> = [revs.current, revs.update]
        .into_iter()
        .chain(owned.iter().map(|p| core::pod_revision(p)))
        .collect();
    let revisions_api: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), namespace);
    for old in history::to_truncate(&revisions, &live, spec.revision_history_limit) {
        let name = old.metadata.name.as_deref().unwrap_or_default();
        match revisions_api.delete(name, &DeleteParams::default()).await {
            Ok(_) => debug!(revision = name, "deleted old revision"),
            Err(error) if error.is_not_found() => {}
            Err(error) => keep_first(&mut first_error, error),
        }
    }

    if let Some(error) = first_error {
        return Err(error);
    }
    Ok(match core::recheck_after(&spec, &owned, &status, now) {
        Some(delay) => Action::RequeueAfter(delay),
        None => Action::Done,
    })
}

fn owner<'a>(set: &'a StatefulSet, spec: &Spec<'_>) -> Owner<'a, StatefulSet> {
    Owner {
        object: set,
        noun: NOUN,
        controller: spec.controller_ref(),
    }
}

/// The revisions the StatefulSet controls, with the orphans its selector matches adopted
/// (`adoptOrphanRevisions`).
async fn adopt_revisions(
    ctx: &Context,
    set: &StatefulSet,
    spec: &Spec<'_>,
    query: &str,
) -> Result<Vec<ControllerRevision>> {
    let listed = ctx
        .cache
        .list::<ControllerRevision>(
            spec.namespace,
            ListFilter {
                label_selector: query,
                ..ListFilter::default()
            },
        )
        .await?;
    let (owned, orphans) = core::own_revisions(spec, &listed);
    owner(set, spec).adopt_revisions(ctx, owned, orphans).await
}

/// The Pods the StatefulSet controls after adopting the orphans it matches and releasing
/// those it no longer does (`getPodsForStatefulSet`).
async fn owned_pods(
    ctx: &Context,
    set: &StatefulSet,
    spec: &Spec<'_>,
    query: &str,
) -> Result<Vec<Pod>> {
    let listed = ctx
        .cache
        .list::<Pod>(
            spec.namespace,
            ListFilter {
                label_selector: query,
                controller_uid: spec.uid,
                either: true,
                ..ListFilter::default()
            },
        )
        .await?;
    let settled = owner(set, spec)
        .settle(ctx, core::claim(spec, &listed))
        .await?;
    Ok(settled.into_iter().map(Cow::into_owned).collect())
}

/// The revision of the StatefulSet as it is now (`getStatefulSetRevisions`): the newest
/// revision if it holds the same template, an older one that does renumbered newest (a
/// rollback), or a new one, its name's hash probed with `collision_count` until free.
async fn update_revision(
    ctx: &Context,
    spec: &Spec<'_>,
    sorted: &[ControllerRevision],
    collision_count: &mut i32,
) -> Result<ControllerRevision> {
    let data = core::revision_data(spec.set);
    let next = history::next_revision(sorted);
    let api: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), spec.namespace);
    match history::find_update_revision(sorted, &data) {
        UpdateRevision::Newest(i) => Ok(sorted[i].clone()),
        UpdateRevision::Renumber(i) => {
            let mut renumbered = sorted[i].clone();
            renumbered.revision = next;
            let name = renumbered.metadata.name.clone().unwrap_or_default();
            let written = api
                .replace(&name, &PostParams::default(), &renumbered)
                .await?;
            ctx.cache.wrote(&written);
            Ok(written)
        }
        UpdateRevision::Create => loop {
            let revision = core::new_revision(spec, &data, next, *collision_count);
            let name = revision.metadata.name.clone().unwrap_or_default();
            match api.create(&PostParams::default(), &revision).await {
                Ok(created) => {
                    ctx.cache.wrote(&created);
                    return Ok(created);
                }
                Err(error) if error.is_already_exists() => {
                    let existing = api.get(&name).await?;
                    if history::same_data(history::data(&existing), &data) {
                        return Ok(existing);
                    }
                    if *collision_count >= MAX_COLLISIONS {
                        return Err(Error::Other(format!(
                            "controllerrevision {name}: {MAX_COLLISIONS} hash collisions in a row"
                        )));
                    }
                    *collision_count += 1;
                    debug!(revision = name, collision_count, "revision name taken");
                }
                Err(error) => return Err(error.into()),
            }
        },
    }
}

/// kube-controller-manager's Event for a Pod write (`recordPodEvent`).
fn pod_event(ctx: &Context, set: &StatefulSet, verb: &str, pod: &str, error: Option<&str>) {
    let title = title(verb);
    let name = set.metadata.name.as_deref().unwrap_or_default();
    match error {
        None => ctx.events.publish(
            set,
            EventType::Normal,
            &format!("Successful{title}"),
            &title,
            format!("{title} Pod {pod} in StatefulSet {name} successful"),
        ),
        Some(error) => ctx.events.publish(
            set,
            EventType::Warning,
            &format!("Failed{title}"),
            &title,
            format!("{title} Pod {pod} in StatefulSet {name} failed error: {error}"),
        ),
    }
}

fn title(verb: &str) -> String {
    let mut chars = verb.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// The writes of one reconcile, with the claims as this reconcile has left them.
struct Writer<'a> {
    ctx: &'a Context,
    set: &'a StatefulSet,
    spec: &'a Spec<'a>,
    pods: Api<Pod>,
    claims_api: Api<PersistentVolumeClaim>,
    claims: BTreeMap<String, PersistentVolumeClaim>,
}

/// What one step changed in the claims, to merge once its batch is done.
type Written = Vec<PersistentVolumeClaim>;

impl Writer<'_> {
    /// A phase: one step after another (`OrderedReady`) or in slow-start batches of 1, 2,
    /// 4, … (`Parallel`); the first failure ends it.
    async fn run(&mut self, phase: &[Step<'_>]) -> Result<()> {
        let mut rest = phase;
        let mut size = 1;
        while !rest.is_empty() {
            let batch = if self.spec.parallel { size } else { 1 };
            let (now, later) = rest.split_at(batch.min(rest.len()));
            rest = later;
            size *= 2;
            let results = join_all(now.iter().map(|step| self.step(step))).await;
            let mut first_error = None;
            for result in results {
                match result {
                    Ok(written) => {
                        for claim in written {
                            let name = claim.metadata.name.clone().unwrap_or_default();
                            self.claims.insert(name, claim);
                        }
                    }
                    Err(error) => keep_first(&mut first_error, error),
                }
            }
            if let Some(error) = first_error {
                return Err(error);
            }
        }
        Ok(())
    }

    async fn step(&self, step: &Step<'_>) -> Result<Written> {
        match step {
            Step::Replace(pod) | Step::Condemn(pod) | Step::Roll(pod) => {
                self.delete(pod).await?;
                Ok(Vec::new())
            }
            Step::Create(pod) => self.create(pod).await,
            Step::CreateClaims(pod) => {
                let mut written = self.create_claims(pod).await?;
                written.extend(self.claim_owners(pod, &written).await?);
                Ok(written)
            }
            Step::Update(pod) => self.update(pod).await,
            Step::ClaimOwners(pod) => self.claim_owners(pod, &[]).await,
        }
    }

    fn pod_name(pod: &Pod) -> &str {
        pod.metadata.name.as_deref().unwrap_or_default()
    }

    async fn delete(&self, pod: &Pod) -> Result<()> {
        let name = Self::pod_name(pod);
        match self.pods.delete(name, &DeleteParams::default()).await {
            Ok(either) => {
                if let Some(deleting) = either.left() {
                    self.ctx.cache.wrote(&deleting);
                }
                pod_event(self.ctx, self.set, "delete", name, None);
                Ok(())
            }
            // Gone already: what the step wanted.
            Err(error) if error.is_not_found() => Ok(()),
            Err(error) => {
                pod_event(
                    self.ctx,
                    self.set,
                    "delete",
                    name,
                    Some(&status_message(&error)),
                );
                Err(error.into())
            }
        }
    }

    /// `CreateStatefulPod`: the claims first, then the Pod, then the claims' owners.
    async fn create(&self, pod: &Pod) -> Result<Written> {
        let name = Self::pod_name(pod);
        let mut written = match self.create_claims(pod).await {
            Ok(written) => written,
            Err(error) => {
                pod_event(self.ctx, self.set, "create", name, Some(&error.to_string()));
                return Err(error);
            }
        };
        let created = match self.pods.create(&PostParams::default(), pod).await {
            Ok(created) => created,
            // Made by an earlier reconcile the cache had not shown yet.
            Err(error) if error.is_already_exists() => return Err(error.into()),
            Err(error) => {
                pod_event(
                    self.ctx,
                    self.set,
                    "create",
                    name,
                    Some(&status_message(&error)),
                );
                return Err(error.into());
            }
        };
        self.ctx.cache.wrote(&created);
        match self.claim_owners(&created, &written).await {
            Ok(owners) => written.extend(owners),
            Err(error) => {
                pod_event(self.ctx, self.set, "update", name, Some(&error.to_string()));
                return Err(error);
            }
        }
        pod_event(self.ctx, self.set, "create", name, None);
        Ok(written)
    }

    /// `createPersistentVolumeClaims`: each missing claim of the Pod's ordinal, with an Event
    /// per claim; one being deleted fails the step.
    async fn create_claims(&self, pod: &Pod) -> Result<Written> {
        let ordinal = core::ordinal(pod).unwrap_or(0);
        let missing =
            core::missing_claims(self.spec, ordinal, &self.claims).map_err(Error::Other)?;
        let set_name = self.spec.name;
        let pod_name = Self::pod_name(pod);
        let mut written = Vec::new();
        let mut errors = Vec::new();
        for claim in missing {
            let claim_name = claim.metadata.name.clone().unwrap_or_default();
            match self.claims_api.create(&PostParams::default(), &claim).await {
                Ok(created) => {
                    self.ctx.cache.wrote(&created);
                    self.ctx.events.publish(
                        self.set,
                        EventType::Normal,
                        "SuccessfulCreate",
                        "Create",
                        format!(
                            "Create Claim {claim_name} Pod {pod_name} in StatefulSet {set_name} success"
                        ),
                    );
                    written.push(created);
                }
                Err(error) => {
                    let message = status_message(&error);
                    if !error.is_already_exists() {
                        self.ctx.events.publish(
                            self.set,
                            EventType::Warning,
                            "FailedCreate",
                            "Create",
                            format!(
                                "Create Claim {claim_name} for Pod {pod_name} in StatefulSet {set_name} failed error: {message}"
                            ),
                        );
                    }
                    errors.push(format!("failed to create PVC {claim_name}: {message}"));
                }
            }
        }
        if errors.is_empty() {
            Ok(written)
        } else {
            Err(Error::Other(errors.join(", ")))
        }
    }

    /// `UpdatePodClaimForRetentionPolicy`: the Pod's claims with the owners the retention
    /// policy asks for; `fresher` are claims this step already wrote.
    async fn claim_owners(&self, pod: &Pod, fresher: &[PersistentVolumeClaim]) -> Result<Written> {
        let ordinal = core::ordinal(pod).unwrap_or(0);
        // This Pod's claims: the ones this step wrote, else the reconcile's.
        let claims: BTreeMap<String, PersistentVolumeClaim> = core::claims_for(self.spec, ordinal)
            .into_iter()
            .filter_map(|c| {
                let name = c.metadata.name?;
                let found = fresher
                    .iter()
                    .find(|f| f.metadata.name.as_deref() == Some(&name))
                    .or_else(|| self.claims.get(&name))?;
                Some((name, found.clone()))
            })
            .collect();
        for claim in core::claims_for(self.spec, ordinal) {
            let name = claim.metadata.name.as_deref().unwrap_or_default();
            if let Some(found) = claims.get(name)
                && core::has_unexpected_controller(self.spec, found, pod)
            {
                self.ctx.events.publish(
                    self.set,
                    EventType::Warning,
                    "ConflictingController",
                    "Update",
                    format!(
                        "PersistentVolumeClaim {name} has a conflicting OwnerReference that acts as a manging controller, the retention policy is ignored for this claim"
                    ),
                );
            }
        }
        let mut written = Vec::new();
        for claim in core::claims_out_of_policy(self.spec, pod, &claims) {
            let name = claim.metadata.name.clone().unwrap_or_default();
            let updated = self
                .claims_api
                .replace(&name, &PostParams::default(), &claim)
                .await
                .map_err(|e| {
                    Error::Other(format!(
                        "could not update claim {name} for delete policy ownerRefs: {}",
                        status_message(&e)
                    ))
                })?;
            self.ctx.cache.wrote(&updated);
            written.push(updated);
        }
        Ok(written)
    }

    /// `UpdateStatefulPod`: identity and storage put right (claims made for new storage),
    /// claim owners set, the Pod written if it changed.
    async fn update(&self, pod: &Pod) -> Result<Written> {
        let name = Self::pod_name(pod);
        let result = async {
            let mut written = Vec::new();
            if !core::storage_matches(self.spec, pod) {
                written.extend(self.create_claims(pod).await?);
            }
            written.extend(self.claim_owners(pod, &written).await?);
            let fixed = core::fixed_pod(self.spec, pod);
            if &fixed != pod {
                let updated = self
                    .pods
                    .replace(name, &PostParams::default(), &fixed)
                    .await?;
                self.ctx.cache.wrote(&updated);
            }
            Ok::<_, Error>(written)
        }
        .await;
        let error = result.as_ref().err().map(ToString::to_string);
        pod_event(self.ctx, self.set, "update", name, error.as_deref());
        result
    }
}
