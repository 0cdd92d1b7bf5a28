//! Adoption and release, as kube-controller-manager's `ControllerRefManager` does them for
//! every workload controller: an owner re-read from the apiserver before it adopts
//! ([`can_adopt`]), and an object's controller reference set or removed with a patch that
//! lands only on the version that was read ([`set_controller_ref`]).

use std::fmt::Debug;

use serde::de::DeserializeOwned;
use serde_json::json;
use switchyard_k8s::{
    Api, ListParams, OwnerReference,
    k8s_openapi::NamespaceResourceScope,
    kube::{
        self, Resource,
        api::{Patch, PatchParams},
    },
};

use super::{Context, Error, Result};

/// kube-controller-manager's `canAdopt` (`RecheckDeletionTimestamp`): before the first
/// adoption, `owner` is read again from the apiserver, not the cache. One deleted, or deleted
/// and recreated under the same name, since the cache read must not adopt: what it adopted
/// would go to an owner that is gone. `noun` names the kind in kube-controller-manager's
/// words for the error ("replica set", "deployment").
pub async fn can_adopt<K>(ctx: &Context, owner: &K, noun: &str) -> Result<()>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug,
{
    let meta = owner.meta();
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let name = meta.name.as_deref().unwrap_or_default();
    let fresh = Api::<K>::namespaced(ctx.client.clone(), namespace)
        .get(name)
        .await?;
    let fresh = fresh.meta();
    if fresh.uid != meta.uid {
        return Err(Error::Other(format!(
            "original {noun} {namespace}/{name} is gone: got uid {}, wanted {}",
            fresh.uid.as_deref().unwrap_or_default(),
            meta.uid.as_deref().unwrap_or_default()
        )));
    }
    if fresh.deletion_timestamp.is_some() {
        return Err(Error::Other(format!(
            "{noun} {namespace}/{name} has just been deleted"
        )));
    }
    Ok(())
}

/// `object`'s owner references with every reference to `owner_uid` taken out and, when
/// adopting, `controller` (a reference to that owner with `controller: true`) added.
pub fn owner_references(
    object: &impl Resource,
    owner_uid: &str,
    controller: Option<OwnerReference>,
) -> Vec<OwnerReference> {
    object
        .meta()
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.uid != owner_uid)
        .cloned()
        .chain(controller)
        .collect()
}

/// Adopts `object` (`controller` is the owner's controller reference) or releases it
/// (`None`) from the owner whose uid is `owner_uid`: a merge patch of its owner references
/// that carries the resourceVersion it was read at, so that it lands only if the object has
/// not changed since (a 409 otherwise, and the owner's next reconcile decides again).
pub async fn set_controller_ref<K>(
    api: &Api<K>,
    object: &K,
    owner_uid: &str,
    controller: Option<OwnerReference>,
) -> kube::Result<K>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let meta = object.meta();
    let patch = json!({
        "metadata": {
            "ownerReferences": owner_references(object, owner_uid, controller),
            "resourceVersion": meta.resource_version,
        }
    });
    api.patch(
        meta.name.as_deref().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
}

/// The newest resourceVersion of the objects `labels` selects, read from the apiserver (a
/// consistent list of their metadata): a version the watcher's stream of their namespace
/// reaches once it has every one of them. A reconcile whose key's shard moved lately reads
/// its cache again at least there before creating objects under generated names
/// ([`crate::cache::CacheClient::may_lack_writes`]).
pub async fn newest_version<K>(api: &Api<K>, labels: &str) -> kube::Result<Option<String>>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let objects = api
        .list_metadata(&ListParams::default().labels(labels))
        .await?;
    Ok(objects
        .items
        .iter()
        .filter_map(|object| object.metadata.resource_version.as_deref())
        .filter_map(|rv| Some((rv.parse::<u64>().ok()?, rv)))
        .max()
        .map(|(_, rv)| rv.to_owned()))
}

#[cfg(test)]
mod tests {
    use switchyard_k8s::{ObjectMeta, Pod};

    use super::*;

    fn reference(uid: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: format!("rs-{uid}"),
            uid: uid.into(),
            controller: Some(controller),
            block_owner_deletion: Some(true),
        }
    }

    #[test]
    fn adopting_replaces_the_owners_references_and_releasing_keeps_the_others() {
        let pod = Pod {
            metadata: ObjectMeta {
                owner_references: Some(vec![reference("other", false), reference("a", false)]),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        assert_eq!(
            owner_references(&pod, "a", Some(reference("a", true))),
            [reference("other", false), reference("a", true)]
        );
        assert_eq!(
            owner_references(&pod, "a", None),
            [reference("other", false)]
        );
        assert_eq!(
            owner_references(&Pod::default(), "a", Some(reference("a", true))),
            [reference("a", true)]
        );
    }
}
