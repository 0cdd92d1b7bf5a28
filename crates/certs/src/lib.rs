//! The certificates of Switchyard's mutual TLS.
//!
//! ```text
//!   Authority (self-signed root, ECDSA P-256)
//!      │ issue(&Leaf)
//!      ├─► switchyard-watcher     ┐  URI SAN  spiffe://<trust-domain>/ns/<namespace>/sa/<sa>
//!      ├─► switchyard-queue       │  DNS SANs <service>, <service>.<ns>, <service>.<ns>.svc,
//!      ├─► switchyard-reconciler  │           <service>.<ns>.svc.cluster.local, localhost
//!      ├─► switchyard-elector     │  IP SANs  127.0.0.1, ::1
//!      ├─► switchyard-observer    │  EKU      serverAuth + clientAuth
//!      ├─► switchyard-operator    │
//!      └─► switchyard-etcd        ┘
//! ```
//!
//! Every service is a server and a client, so one certificate does both; its identity is the
//! URI SAN ([`spiffe_id`]). [`identities`] names the certificates an installation needs and
//! their DNS names; [`kustomize`] writes them as a kustomize Component; [`cli`] is the
//! `switchyard-certs` command. The same names are in `deploy/kustomize/components/cert-manager`,
//! and a test keeps the two in step.

mod authority;
pub mod cli;
mod error;
pub mod identities;
pub mod kustomize;

pub use authority::{Authority, Issued, Leaf};
pub use error::{Error, Result};

/// The trust domain of an installation that names none.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";
/// The namespace the kustomize base installs into.
pub const DEFAULT_NAMESPACE: &str = "switchyard";

/// The identity a certificate carries as its URI SAN:
/// `spiffe://<trust_domain>/ns/<namespace>/sa/<service_account>`, as linkerd and Istio name
/// a Kubernetes workload.
pub fn spiffe_id(trust_domain: &str, namespace: &str, service_account: &str) -> String {
    format!("spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_names_trust_domain_namespace_and_service_account() {
        assert_eq!(
            spiffe_id("cluster.local", "switchyard", "switchyard-queue"),
            "spiffe://cluster.local/ns/switchyard/sa/switchyard-queue"
        );
    }
}
