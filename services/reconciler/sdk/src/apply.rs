//! Writing as the controller: server-side apply (`Context::apply`, `Context::apply_status`)
//! under the controller's field manager, and a write's version as the key's read floor.
//!
//! ```text
//!  ctx.apply(&object)            ─► PATCH  .../<kind>/<name>         application/apply-patch+yaml
//!  ctx.apply_status::<K>(n, ns, status) ─► PATCH .../<kind>/<name>/status   fieldManager=<controller>, force
//!     ─► the object as written; the cache read next by this key holds at least it
//! ```
//!
//! Server-side apply sends only the fields the controller sets, and the apiserver merges
//! them with everyone else's: a controller that applies the same fields on every reconcile
//! owns them (controller-runtime's `client.Apply` with `client.ForceOwnership`, kube-rs's
//! `Patch::Apply` with `PatchParams::apply(manager).force()`). The field manager is the
//! controller's name, so `kubectl get -o yaml --show-managed-fields` says which controller
//! wrote what.

use serde::Serialize;
use serde_json::{Value, json};
use switchyard_k8s::kube::{
    self,
    api::{Patch, PatchParams},
};

use super::{Context, Error, Object, Result};

/// The most a field manager may be (the apiserver's limit).
const MAX_FIELD_MANAGER: usize = 128;

/// The field manager of a controller: its name, cut to the apiserver's 128 bytes.
pub(crate) fn field_manager_of(controller: &str) -> String {
    let mut end = controller.len().min(MAX_FIELD_MANAGER);
    while !controller.is_char_boundary(end) {
        end -= 1;
    }
    controller[..end].to_owned()
}

impl Context {
    /// The field manager this context's writes by [`Context::apply`] and
    /// [`Context::apply_status`] carry: the controller's name.
    pub fn field_manager(&self) -> &str {
        &self.field_manager
    }

    /// Server-side applies `object` (its `metadata.name`, its namespace when namespaced, and
    /// the fields it sets) as this controller, taking over fields another manager set
    /// (`force`). A `metadata.resourceVersion` in it makes the write conditional on it.
    /// Returns the object as written; the next cache read of this key holds at least it.
    pub async fn apply<K: Object + Serialize>(&self, object: &K) -> Result<K> {
        let meta = object.meta();
        let name = meta
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                Error::Other(format!("apply of a {}: no metadata.name", K::kind(&())))
            })?;
        let mut body = serde_json::to_value(object).map_err(|e| Error::Other(e.to_string()))?;
        if let Some(metadata) = body.get_mut("metadata").and_then(Value::as_object_mut) {
            // The apiserver refuses an applied configuration that carries them.
            metadata.remove("managedFields");
            metadata.remove("creationTimestamp");
        }
        self.patch_applied::<K>(name, meta.namespace.as_deref(), None, &body)
            .await
    }

    /// Server-side applies `status` as the status of the `K` named `name` (in `namespace`,
    /// for a namespaced kind) as this controller: only the status fields it sets, others'
    /// left as they are. Returns the object as written.
    pub async fn apply_status<K: Object>(
        &self,
        name: &str,
        namespace: Option<&str>,
        status: &impl Serialize,
    ) -> Result<K> {
        let mut metadata = json!({ "name": name });
        if let Some(namespace) = namespace {
            metadata["namespace"] = json!(namespace);
        }
        let body = json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "metadata": metadata,
            "status": status,
        });
        self.patch_applied::<K>(name, namespace, Some("status"), &body)
            .await
    }

    async fn patch_applied<K: Object>(
        &self,
        name: &str,
        namespace: Option<&str>,
        subresource: Option<&str>,
        body: &Value,
    ) -> Result<K> {
        let params = PatchParams::apply(&self.field_manager).force();
        let request = kube::core::Request::new(K::url_path(&(), namespace));
        let patch = Patch::Apply(body);
        let request = match subresource {
            None => request.patch(name, &params, &patch),
            Some(subresource) => request.patch_subresource(subresource, name, &params, &patch),
        }
        .map_err(|e| Error::Other(format!("apply of {} {name}: {e}", K::kind(&()))))?;
        let written: K = self.client.request(request).await?;
        self.cache.wrote(&written);
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_manager_is_the_controller_name_within_the_apiserver_limit() {
        assert_eq!(field_manager_of("apps/v1/ReplicaSet"), "apps/v1/ReplicaSet");
        let long = "é".repeat(100);
        let cut = field_manager_of(&long);
        assert!(cut.len() <= MAX_FIELD_MANAGER && long.starts_with(&cut));
        assert_eq!(cut.len(), 128);
    }
}
