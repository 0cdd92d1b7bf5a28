//! Cleanup that must finish before an object goes: a finalizer in `metadata.finalizers`.
//!
//! ```text
//!  object ─┬─ not deleting, finalizer missing ─► add it (guarded) ─► Apply(patched object)
//!          ├─ not deleting, finalizer present ─► Apply(object)
//!          ├─ deleting, finalizer present ─────► Cleanup(object) ─ Ok ─► remove it (guarded)
//!          └─ deleting, finalizer gone ────────► Done (another reconcile finished it)
//! ```
//!
//! Both writes are merge patches that carry the object's `resourceVersion`, so the apiserver
//! refuses them with 409 when the object changed since it was read (a stale cache, another
//! writer): the reconcile fails and the queue retries it with backoff from a fresh read.
//! `Apply` follows the add directly, rather than waiting for the update event, because an
//! update of the finalizers alone leaves `generation` unchanged and a `generationChanged`
//! predicate would filter it out. `Apply` and `Cleanup` must both be idempotent; `Cleanup`
//! must tolerate an `Apply` that never ran.

use std::future::Future;

use serde::{Serialize, de::DeserializeOwned};
use serde_json::json;
use switchyard_k8s::{
    Api,
    kube::{
        Resource, ResourceExt,
        api::{Patch, PatchParams},
    },
};

use crate::{Action, Result};

/// What the reconcile is asked to do.
#[derive(Debug)]
pub enum Step<K> {
    /// Bring the world in line with the object (it carries the finalizer).
    Apply(K),
    /// The object is being deleted: undo what `Apply` did; the finalizer goes on success.
    Cleanup(K),
}

/// Runs `reconcile` for `object` under the finalizer `name` (a qualified name, for example
/// `example.switchyard.io/cleanup`), adding and removing the finalizer around it.
pub async fn finalize<K, F, Fut>(api: &Api<K>, name: &str, object: K, reconcile: F) -> Result
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
    F: FnOnce(Step<K>) -> Fut,
    Fut: Future<Output = Result>,
{
    let has = object.finalizers().iter().any(|f| f == name);
    let deleting = object.meta().deletion_timestamp.is_some();
    match (deleting, has) {
        (false, true) => reconcile(Step::Apply(object)).await,
        (false, false) => {
            let mut finalizers = object.finalizers().to_vec();
            finalizers.push(name.to_owned());
            let patched = set_finalizers(api, &object, finalizers).await?;
            reconcile(Step::Apply(patched)).await
        }
        (true, true) => {
            let finalizers: Vec<String> = object
                .finalizers()
                .iter()
                .filter(|f| *f != name)
                .cloned()
                .collect();
            let reference = object.clone();
            let action = reconcile(Step::Cleanup(object)).await?;
            set_finalizers(api, &reference, finalizers).await?;
            Ok(action)
        }
        (true, false) => Ok(Action::Done),
    }
}

/// Replaces `object`'s finalizers, refused (409) if it changed since it was read.
async fn set_finalizers<K>(api: &Api<K>, object: &K, finalizers: Vec<String>) -> Result<K>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let patch = finalizers_patch(object.resource_version().as_deref(), &finalizers);
    Ok(api
        .patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await?)
}

/// The merge patch that sets the finalizers, guarded by `resource_version` when known.
fn finalizers_patch(resource_version: Option<&str>, finalizers: &[String]) -> serde_json::Value {
    let mut metadata = json!({ "finalizers": finalizers });
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    json!({ "metadata": metadata })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_carries_the_resource_version_as_a_precondition() {
        assert_eq!(
            finalizers_patch(Some("42"), &["a/b".to_owned()]),
            json!({"metadata": {"finalizers": ["a/b"], "resourceVersion": "42"}})
        );
        // The last finalizer removed: an empty list, not a missing field (a merge patch
        // leaves a missing field alone).
        assert_eq!(
            finalizers_patch(None, &[]),
            json!({"metadata": {"finalizers": []}})
        );
    }
}
