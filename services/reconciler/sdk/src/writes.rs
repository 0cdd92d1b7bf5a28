//! What a controller writes to the apiserver, declared beside what it watches
//! ([`crate::Builder::writes`]), so that its identity's RBAC is derived from the declaration
//! ([`crate::Registry::rbac_rules`]) and checked against what is deployed. Reads need no
//! rule: they go through the watcher, which the watcher's grants govern.

use std::collections::{BTreeMap, BTreeSet};

use switchyard_k8s::{k8s_openapi::api::rbac::v1::PolicyRule, kube::Resource};

/// The verbs Events are written with ([`crate::Events`]: created, then patched as a series).
pub const EVENT_VERBS: [&str; 2] = ["create", "patch"];

/// One kind (or one of its subresources) and the verbs a controller writes it with.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Write {
    /// The API group (`""` for the core group).
    pub group: String,
    /// The resource, as RBAC names it (`configmaps`, `greetings/status`).
    pub resource: String,
    /// `create`, `patch`, `update`, `delete`, ...
    pub verbs: Vec<String>,
}

impl Write {
    /// `verbs` on the objects of `K`.
    pub fn of<K: Resource<DynamicType = ()>>(verbs: &[&str]) -> Self {
        Self::to::<K>(String::new(), verbs)
    }

    /// `verbs` on the `subresource` of the objects of `K` (`status`, `scale`).
    pub fn subresource_of<K: Resource<DynamicType = ()>>(
        subresource: &str,
        verbs: &[&str],
    ) -> Self {
        Self::to::<K>(format!("/{subresource}"), verbs)
    }

    fn to<K: Resource<DynamicType = ()>>(suffix: String, verbs: &[&str]) -> Self {
        Self {
            group: K::group(&()).into_owned(),
            resource: format!("{}{suffix}", K::plural(&())),
            verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        }
    }
}

/// The ClusterRole rules `writes` need, plus the Events every controller writes: one rule per
/// group and resource, verbs merged and sorted.
pub(crate) fn rules<'a>(writes: impl IntoIterator<Item = &'a Write>) -> Vec<PolicyRule> {
    let mut merged: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for write in writes {
        merged
            .entry((write.group.clone(), write.resource.clone()))
            .or_default()
            .extend(write.verbs.iter().cloned());
    }
    merged
        .entry(("events.k8s.io".into(), "events".into()))
        .or_default()
        .extend(EVENT_VERBS.iter().map(|v| (*v).to_owned()));
    merged
        .into_iter()
        .map(|((group, resource), verbs)| PolicyRule {
            api_groups: Some(vec![group]),
            resources: Some(vec![resource]),
            verbs: verbs.into_iter().collect(),
            ..PolicyRule::default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use switchyard_k8s::k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};

    use super::*;

    #[test]
    fn writes_become_one_rule_per_resource_with_the_events_every_controller_writes() {
        let writes = [
            Write::of::<ConfigMap>(&["patch", "create"]),
            Write::of::<ConfigMap>(&["delete", "patch"]),
            Write::subresource_of::<Deployment>("status", &["patch"]),
        ];
        let rules = rules(&writes);
        let flat: Vec<(String, String, Vec<String>)> = rules
            .iter()
            .map(|r| {
                (
                    r.api_groups.clone().unwrap()[0].clone(),
                    r.resources.clone().unwrap()[0].clone(),
                    r.verbs.clone(),
                )
            })
            .collect();
        let owned = |g: &str, r: &str, v: &[&str]| {
            (
                g.to_owned(),
                r.to_owned(),
                v.iter().map(|s| (*s).to_owned()).collect(),
            )
        };
        assert_eq!(
            flat,
            [
                owned("", "configmaps", &["create", "delete", "patch"]),
                owned("apps", "deployments/status", &["patch"]),
                owned("events.k8s.io", "events", &["create", "patch"]),
            ]
        );
    }
}
