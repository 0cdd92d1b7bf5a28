//! Which resources the apiserver serves, in two requests: aggregated discovery of the core
//! group (`/api`) and of every other group (`/apis`), preferred versions only, as client-go's
//! `ServerPreferredResources` gives them to kube-controller-manager's garbage collector and
//! namespace controller.
//!
//! A group version the apiserver could not refresh (an aggregated API that is down is served
//! as `Stale`) is reported as a failure of its own and leaves the others usable, as client-go's
//! `ErrGroupDiscoveryFailed` does.

use kube::{
    Client,
    api::ApiResource,
    core::discovery::v2::{APIGroupDiscovery, APIGroupDiscoveryList},
};

/// One resource the apiserver serves at its group's preferred version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedResource {
    pub resource: ApiResource,
    pub namespaced: bool,
    /// The verbs discovery lists (`get`, `list`, `watch`, `delete`, `deletecollection`, ...).
    pub verbs: Vec<String>,
}

impl ServedResource {
    pub fn supports(&self, verb: &str) -> bool {
        self.verbs.iter().any(|v| v == verb)
    }

    /// `resource.group` (`replicasets.apps`; `pods` in the core group): how
    /// kube-controller-manager writes a group resource in its logs.
    pub fn group_resource(&self) -> String {
        if self.resource.group.is_empty() {
            self.resource.plural.clone()
        } else {
            format!("{}.{}", self.resource.plural, self.resource.group)
        }
    }
}

/// A group version whose discovery failed, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryFailure {
    /// `apps/v1`, or `v1` for the core group.
    pub group_version: String,
    pub reason: String,
}

/// What one discovery found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Discovered {
    pub resources: Vec<ServedResource>,
    pub failures: Vec<DiscoveryFailure>,
}

/// Every resource at its group's preferred version (never subresources). An error only when
/// neither request is answered; failed group versions are in [`Discovered::failures`].
pub async fn preferred_resources(client: &Client) -> kube::Result<Discovered> {
    let core = client.list_core_api_versions_aggregated().await?;
    let groups = client.list_api_groups_aggregated().await?;
    Ok(preferred(core.items.iter().chain(&groups.items)))
}

/// [`preferred_resources`] of documents already fetched.
pub fn preferred<'a>(groups: impl IntoIterator<Item = &'a APIGroupDiscovery>) -> Discovered {
    let mut found = Discovered::default();
    for group in groups {
        let name = group
            .metadata
            .as_ref()
            .and_then(|m| m.name.clone())
            .unwrap_or_default();
        let Some(preferred) = group.versions.first() else {
            continue;
        };
        let version = preferred.version.clone().unwrap_or_default();
        let group_version = if name.is_empty() {
            version.clone()
        } else {
            format!("{name}/{version}")
        };
        if version.is_empty() {
            found.failures.push(DiscoveryFailure {
                group_version,
                reason: "the preferred version has no name".into(),
            });
            continue;
        }
        if preferred.freshness.as_deref() == Some("Stale") {
            found.failures.push(DiscoveryFailure {
                group_version,
                reason: "the apiserver could not refresh its discovery (Stale)".into(),
            });
            continue;
        }
        for resource in &preferred.resources {
            let (Some(plural), Some(kind)) = (
                resource.resource.as_deref(),
                resource
                    .response_kind
                    .as_ref()
                    .and_then(|k| k.kind.as_deref()),
            ) else {
                continue;
            };
            found.resources.push(ServedResource {
                resource: ApiResource {
                    group: name.clone(),
                    version: version.clone(),
                    api_version: group_version.clone(),
                    kind: kind.to_owned(),
                    plural: plural.to_owned(),
                },
                namespaced: resource.scope.as_deref() == Some("Namespaced"),
                verbs: resource.verbs.clone(),
            });
        }
    }
    found
}

/// Parses an aggregated discovery document (for tests and tools).
pub fn parse(json: &[u8]) -> serde_json::Result<APIGroupDiscoveryList> {
    serde_json::from_slice(json)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"{"items": [
      {"metadata": {"name": ""}, "versions": [{"version": "v1", "resources": [
        {"resource": "pods", "responseKind": {"group": "", "version": "v1", "kind": "Pod"},
         "scope": "Namespaced", "verbs": ["create","delete","deletecollection","get","list","patch","update","watch"]},
        {"resource": "nodes", "responseKind": {"group": "", "version": "v1", "kind": "Node"},
         "scope": "Cluster", "verbs": ["get","list","watch","delete"]}]}]},
      {"metadata": {"name": "apps"}, "versions": [
        {"version": "v1", "resources": [{"resource": "replicasets",
          "responseKind": {"group": "apps", "version": "v1", "kind": "ReplicaSet"},
          "scope": "Namespaced", "verbs": ["get","list","watch","delete"]}]},
        {"version": "v1beta2", "resources": [{"resource": "old",
          "responseKind": {"kind": "Old"}, "scope": "Namespaced", "verbs": ["list"]}]}]},
      {"metadata": {"name": "metrics.example.com"}, "versions": [
        {"version": "v1", "freshness": "Stale", "resources": []}]}
    ]}"#;

    #[test]
    fn preferred_versions_only_and_stale_group_versions_are_failures() {
        let list = parse(DOC.as_bytes()).unwrap();
        let found = preferred(&list.items);
        let names: Vec<(String, String, bool)> = found
            .resources
            .iter()
            .map(|r| {
                (
                    r.resource.api_version.clone(),
                    r.resource.plural.clone(),
                    r.namespaced,
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("v1".into(), "pods".into(), true),
                ("v1".into(), "nodes".into(), false),
                ("apps/v1".into(), "replicasets".into(), true),
            ]
        );
        assert_eq!(found.resources[2].resource.kind, "ReplicaSet");
        assert!(found.resources[0].supports("deletecollection"));
        assert!(!found.resources[2].supports("deletecollection"));
        assert_eq!(found.resources[2].group_resource(), "replicasets.apps");
        assert_eq!(found.resources[0].group_resource(), "pods");
        assert_eq!(found.failures.len(), 1);
        assert_eq!(found.failures[0].group_version, "metrics.example.com/v1");
    }
}
