//! The service account controller's decision (kube-controller-manager's
//! `serviceaccounts-controller`, `pkg/controller/serviceaccount`): which of the accounts
//! every namespace must have are missing from an active namespace.
//!
//! A namespace not `Active` (terminating, or with no phase written yet) gets nothing: the
//! apiserver would refuse a creation in a terminating namespace, and one that is terminating
//! should not gain objects.

use k8s_openapi::api::core::v1::Namespace;

/// The accounts every namespace gets: kube-controller-manager's default, `default`.
pub const ENSURED: &[&str] = &["default"];

/// `status.phase` of a namespace that takes new objects.
pub const ACTIVE: &str = "Active";

/// The accounts of `ensured` that `namespace` lacks (`exists` says whether one is there), in
/// order; none unless the namespace is `Active`.
pub fn missing<'a>(
    namespace: &Namespace,
    ensured: &[&'a str],
    exists: impl Fn(&str) -> bool,
) -> Vec<&'a str> {
    let phase = namespace.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase != Some(ACTIVE) {
        return Vec::new();
    }
    ensured
        .iter()
        .copied()
        .filter(|name| !exists(name))
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::NamespaceStatus;

    use super::*;

    fn namespace(phase: Option<&str>) -> Namespace {
        Namespace {
            status: Some(NamespaceStatus {
                phase: phase.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn an_active_namespace_gets_the_accounts_it_lacks() {
        let active = namespace(Some(ACTIVE));
        assert_eq!(missing(&active, ENSURED, |_| false), ["default"]);
        assert!(missing(&active, ENSURED, |name| name == "default").is_empty());
        let two = ["default", "builder"];
        assert_eq!(
            missing(&active, &two, |name| name == "default"),
            ["builder"]
        );
    }

    #[test]
    fn a_namespace_not_active_gets_nothing() {
        for phase in [Some("Terminating"), None] {
            assert!(missing(&namespace(phase), ENSURED, |_| false).is_empty());
        }
        let no_status = Namespace::default();
        assert!(missing(&no_status, ENSURED, |_| false).is_empty());
    }
}
