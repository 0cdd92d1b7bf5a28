//! Which resources the apiserver serves, in two requests: aggregated discovery of the core
//! group (`/api`) and of every other group (`/apis`), preferred versions only, as client-go's
//! `ServerPreferredResources` gives them to kube-controller-manager's garbage collector and
//! namespace controller.
//!
//! A group version the apiserver could not refresh (an aggregated API that is down is served
//! as `Stale`) is reported as a failure of its own and leaves the others usable (a resource is
//! then taken from the group's next version that serves it), as client-go's
//! `ErrGroupDiscoveryFailed` does.

use std::collections::BTreeMap;

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

/// Every resource at its preferred version (never subresources), ordered by group and
/// resource. An error only when a request is not answered; failed group versions are in
/// [`Discovered::failures`].
pub async fn preferred_resources(client: &Client) -> kube::Result<Discovered> {
    let core = client.list_core_api_versions_aggregated().await?;
    let groups = client.list_api_groups_aggregated().await?;
    Ok(preferred(core.items.iter().chain(&groups.items)))
}

/// [`preferred_resources`] of documents already fetched, as client-go's
/// `ServerPreferredResources` gives them: per group and resource, the first version (in the
/// group's order of preference) that is not stale and serves it; subresources and resources
/// discovery names no kind for are left out. A stale version is a failure of its own, in
/// client-go's words.
pub fn preferred<'a>(groups: impl IntoIterator<Item = &'a APIGroupDiscovery>) -> Discovered {
    let mut failures = Vec::new();
    let mut chosen: BTreeMap<(String, String), ServedResource> = BTreeMap::new();
    for group in groups {
        let name = group
            .metadata
            .as_ref()
            .and_then(|m| m.name.clone())
            .unwrap_or_default();
        for version in &group.versions {
            let version_name = version.version.clone().unwrap_or_default();
            let group_version = if name.is_empty() {
                version_name.clone()
            } else {
                format!("{name}/{version_name}")
            };
            if version.freshness.as_deref() == Some("Stale") {
                failures.push(DiscoveryFailure {
                    reason: format!("stale GroupVersion discovery: {group_version}"),
                    group_version,
                });
                continue;
            }
            for resource in &version.resources {
                let (Some(plural), Some(kind)) = (
                    resource
                        .resource
                        .as_deref()
                        .filter(|p| !p.is_empty() && !p.contains('/')),
                    resource
                        .response_kind
                        .as_ref()
                        .and_then(|k| k.kind.as_deref())
                        .filter(|k| !k.is_empty()),
                ) else {
                    continue;
                };
                chosen
                    .entry((name.clone(), plural.to_owned()))
                    .or_insert_with(|| ServedResource {
                        resource: ApiResource {
                            group: name.clone(),
                            version: version_name.clone(),
                            api_version: group_version.clone(),
                            kind: kind.to_owned(),
                            plural: plural.to_owned(),
                        },
                        namespaced: resource.scope.as_deref() == Some("Namespaced"),
                        verbs: resource.verbs.clone(),
                    });
            }
        }
    }
    Discovered {
        resources: chosen.into_values().collect(),
        failures,
    }
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
        {"resource": "pods/status", "responseKind": {"kind": "Pod"}, "scope": "Namespaced", "verbs": ["get"]},
        {"resource": "nodes", "responseKind": {"group": "", "version": "v1", "kind": "Node"},
         "scope": "Cluster", "verbs": ["get","list","watch","delete"]}]}]},
      {"metadata": {"name": "autoscaling"}, "versions": [
        {"version": "v2", "resources": [{"resource": "horizontalpodautoscalers",
          "responseKind": {"kind": "HorizontalPodAutoscaler"}, "scope": "Namespaced", "verbs": ["list"]}]},
        {"version": "v1", "resources": [{"resource": "horizontalpodautoscalers",
          "responseKind": {"kind": "HorizontalPodAutoscaler"}, "scope": "Namespaced", "verbs": ["list"]}]}]},
      {"metadata": {"name": "example.com"}, "versions": [
        {"version": "v2", "freshness": "Stale", "resources": []},
        {"version": "v1", "resources": [
          {"resource": "widgets", "responseKind": {"kind": "Widget"}, "scope": "Namespaced", "verbs": ["delete","list"]},
          {"resource": "gadgets", "responseKind": {}, "scope": "Namespaced", "verbs": ["list"]}]}]}
    ]}"#;

    #[test]
    fn each_resource_at_its_first_fresh_version_and_stale_versions_are_failures() {
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
                ("v1".into(), "nodes".into(), false),
                ("v1".into(), "pods".into(), true),
                // The preferred version, not every version that serves it.
                (
                    "autoscaling/v2".into(),
                    "horizontalpodautoscalers".into(),
                    true
                ),
                // The preferred version is stale: the next one serves what it can. A resource
                // with no kind is left out.
                ("example.com/v1".into(), "widgets".into(), true),
            ]
        );
        assert_eq!(found.resources[3].resource.kind, "Widget");
        assert!(found.resources[1].supports("deletecollection"));
        assert!(!found.resources[3].supports("deletecollection"));
        assert_eq!(
            found.resources[2].group_resource(),
            "horizontalpodautoscalers.autoscaling"
        );
        assert_eq!(found.resources[1].group_resource(), "pods");
        assert_eq!(
            found.failures,
            [DiscoveryFailure {
                group_version: "example.com/v2".into(),
                reason: "stale GroupVersion discovery: example.com/v2".into(),
            }]
        );
    }
}
