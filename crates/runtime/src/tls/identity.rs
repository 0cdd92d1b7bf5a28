//! Service identities: the SPIFFE URI a certificate carries, and the role it grants.
//!
//! A Switchyard certificate names its holder in a URI SAN,
//! `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`, as linkerd and Istio do.
//! The role is read from the service account's name: `switchyard-queue` (with any prefix a
//! kustomize `namePrefix` adds) is a queue member.

use std::fmt;

use rustls::pki_types::CertificateDer;

/// What a service identity may do; the authorization table is written in these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Watcher,
    Queue,
    Reconciler,
    Elector,
    /// Operators' tools: read-only calls (stats, the shard map).
    Observer,
    /// Operators' hands (`kubectl switchyard`): what the observer reads, plus a key's state
    /// and last error (`Queue.DescribeKey`) and draining a queue member
    /// (`Elector.DrainMember`).
    Operator,
}

impl Role {
    pub const ALL: [Role; 6] = [
        Role::Watcher,
        Role::Queue,
        Role::Reconciler,
        Role::Elector,
        Role::Observer,
        Role::Operator,
    ];

    /// The service account (without a prefix) whose certificates carry this role.
    pub fn service_account(self) -> &'static str {
        match self {
            Role::Watcher => "switchyard-watcher",
            Role::Queue => "switchyard-queue",
            Role::Reconciler => "switchyard-reconciler",
            Role::Elector => "switchyard-elector",
            Role::Observer => "switchyard-observer",
            Role::Operator => "switchyard-operator",
        }
    }

    fn of_service_account(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|role| {
            name.strip_suffix(role.service_account())
                .is_some_and(|prefix| prefix.is_empty() || prefix.ends_with('-'))
        })
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Watcher => "watcher",
            Role::Queue => "queue",
            Role::Reconciler => "reconciler",
            Role::Elector => "elector",
            Role::Observer => "observer",
            Role::Operator => "operator",
        })
    }
}

/// A SPIFFE identity of the Kubernetes form.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    pub trust_domain: String,
    pub namespace: String,
    pub service_account: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("the certificate cannot be parsed: {0}")]
    Parse(String),
    #[error("the certificate carries no spiffe://<trust-domain>/ns/<namespace>/sa/<name> URI")]
    Missing,
    #[error("the certificate carries more than one SPIFFE URI")]
    Ambiguous,
}

impl Identity {
    /// Parses `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.
    pub fn parse(uri: &str) -> Option<Identity> {
        let rest = uri.strip_prefix("spiffe://")?;
        let mut parts = rest.split('/');
        let (trust_domain, ns, namespace, sa, service_account) = (
            parts.next()?,
            parts.next()?,
            parts.next()?,
            parts.next()?,
            parts.next()?,
        );
        let valid = |s: &str| !s.is_empty();
        (parts.next().is_none()
            && ns == "ns"
            && sa == "sa"
            && valid(trust_domain)
            && valid(namespace)
            && valid(service_account))
        .then(|| Identity {
            trust_domain: trust_domain.to_owned(),
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
        })
    }

    /// The identity in a certificate's URI SANs; exactly one SPIFFE URI is allowed.
    pub fn of_certificate(cert: &CertificateDer<'_>) -> Result<Identity, IdentityError> {
        let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
            .map_err(|e| IdentityError::Parse(e.to_string()))?;
        let names = parsed
            .subject_alternative_name()
            .map_err(|e| IdentityError::Parse(e.to_string()))?;
        let mut found = names
            .into_iter()
            .flat_map(|ext| ext.value.general_names.iter())
            .filter_map(|name| match name {
                x509_parser::extensions::GeneralName::URI(uri) if uri.starts_with("spiffe://") => {
                    Some(*uri)
                }
                _ => None,
            });
        let first = found.next().ok_or(IdentityError::Missing)?;
        if found.next().is_some() {
            return Err(IdentityError::Ambiguous);
        }
        Identity::parse(first).ok_or(IdentityError::Missing)
    }

    /// The role this identity holds among `peers` (identities of the same trust domain and
    /// namespace); `None` for any other identity.
    pub fn role_among(&self, peers: &Identity) -> Option<Role> {
        if self.trust_domain != peers.trust_domain || self.namespace != peers.namespace {
            return None;
        }
        Role::of_service_account(&self.service_account)
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(sa: &str) -> Identity {
        Identity::parse(&format!("spiffe://cluster.local/ns/switchyard/sa/{sa}")).expect("valid")
    }

    #[test]
    fn roles_come_from_the_service_account_in_the_same_namespace_only() {
        let me = id("switchyard-queue");
        assert_eq!(
            id("switchyard-watcher").role_among(&me),
            Some(Role::Watcher)
        );
        assert_eq!(
            id("prod-switchyard-reconciler").role_among(&me),
            Some(Role::Reconciler)
        );
        assert_eq!(id("notswitchyard-queue").role_among(&me), None);
        assert_eq!(id("default").role_among(&me), None);
        let elsewhere =
            Identity::parse("spiffe://cluster.local/ns/other/sa/switchyard-queue").expect("ok");
        assert_eq!(elsewhere.role_among(&me), None);
        let foreign =
            Identity::parse("spiffe://example.org/ns/switchyard/sa/switchyard-queue").expect("ok");
        assert_eq!(foreign.role_among(&me), None);
    }

    #[test]
    fn only_the_kubernetes_spiffe_form_parses() {
        assert_eq!(
            id("switchyard-queue").to_string(),
            "spiffe://cluster.local/ns/switchyard/sa/switchyard-queue"
        );
        for bad in [
            "https://cluster.local/ns/a/sa/b",
            "spiffe://cluster.local/ns/a/sa/",
            "spiffe://cluster.local/ns/a/sa/b/c",
            "spiffe://cluster.local/namespace/a/sa/b",
            "spiffe:///ns/a/sa/b",
        ] {
            assert_eq!(Identity::parse(bad), None, "{bad}");
        }
    }
}
