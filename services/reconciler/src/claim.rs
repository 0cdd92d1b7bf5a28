//! Adoption and release of what a claim names, for the controllers that claim every
//! matching Pod and their ControllerRevisions: StatefulSets and DaemonSets.

use std::{borrow::Cow, fmt::Debug};

use futures::future::join_all;
use serde::de::DeserializeOwned;
use switchyard_k8s::{
    Api, OwnerReference, Pod,
    k8s_openapi::{NamespaceResourceScope, api::apps::v1::ControllerRevision},
    kube::Resource,
};
use switchyard_reconciler_core::{claim::Claim, replicaset::controller_of};

use crate::sdk::{self, Context, Refusal, Result, keep_first};

/// The owner a claim is for: the object, kube-controller-manager's noun for its kind, and
/// the controller reference its Pods and revisions carry.
#[derive(Debug)]
pub struct Owner<'a, K> {
    pub object: &'a K,
    pub noun: &'a str,
    pub controller: OwnerReference,
}

impl<K> Owner<'_, K>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug,
{
    fn namespace(&self) -> &str {
        self.object.meta().namespace.as_deref().unwrap_or_default()
    }

    /// The Pods the owner controls after adopting `claim.adopt` and releasing
    /// `claim.release` (each a patch guarded by the Pod's resourceVersion; one gone since the
    /// read is skipped). The owner is read live before the first adoption. The Pods it kept
    /// are those claimed, the adopted ones as the adoption returned them.
    pub async fn settle<'p>(&self, ctx: &Context, claim: Claim<'p>) -> Result<Vec<Cow<'p, Pod>>> {
        let uid = self.controller.uid.as_str();
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), self.namespace());
        if !claim.adopt.is_empty() {
            sdk::can_adopt(ctx, self.object, self.noun).await?;
        }
        let adopted = join_all(
            claim
                .adopt
                .iter()
                .map(|pod| sdk::set_controller_ref(&api, pod, uid, Some(self.controller.clone()))),
        )
        .await;
        let released = join_all(
            claim
                .release
                .iter()
                .map(|pod| sdk::set_controller_ref(&api, pod, uid, None)),
        )
        .await;
        let mut pods: Vec<Cow<'p, Pod>> = claim.owned.into_iter().map(Cow::Borrowed).collect();
        let mut first_error = None;
        for result in adopted {
            match result {
                Ok(pod) => {
                    ctx.cache.wrote(&pod);
                    if controller_of(&pod).is_some_and(|r| r.uid == uid) {
                        pods.push(Cow::Owned(pod));
                    }
                }
                Err(error) if error.is_not_found() => {}
                Err(error) => keep_first(&mut first_error, error),
            }
        }
        for result in released {
            match result {
                Ok(pod) => ctx.cache.wrote(&pod),
                Err(error) if error.is_not_found() => {}
                Err(error) => keep_first(&mut first_error, error),
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(pods),
        }
    }

    /// The revisions the owner controls, with `orphans` adopted (`adoptOrphanRevisions`;
    /// none while the owner is being deleted).
    pub async fn adopt_revisions(
        &self,
        ctx: &Context,
        owned: Vec<&ControllerRevision>,
        orphans: Vec<&ControllerRevision>,
    ) -> Result<Vec<ControllerRevision>> {
        let mut revisions: Vec<ControllerRevision> = owned.into_iter().cloned().collect();
        if orphans.is_empty() || self.object.meta().deletion_timestamp.is_some() {
            return Ok(revisions);
        }
        sdk::can_adopt(ctx, self.object, self.noun).await?;
        let api: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), self.namespace());
        for orphan in orphans {
            let adopted = sdk::set_controller_ref(
                &api,
                orphan,
                &self.controller.uid,
                Some(self.controller.clone()),
            )
            .await?;
            ctx.cache.wrote(&adopted);
            revisions.push(adopted);
        }
        Ok(revisions)
    }
}
