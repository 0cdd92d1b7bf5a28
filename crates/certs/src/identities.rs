//! The certificates an installation needs: one per service account of
//! `deploy/kustomize/base/serviceaccounts.yaml`, the operators' read-only observer and
//! their `kubectl switchyard` operator, and the
//! etcd of `components/etcd`. `components/cert-manager` asks cert-manager for the same names
//! (a test compares them).

use std::time::{Duration, SystemTime};

use crate::{
    Leaf,
    authority::{CLOCK_SKEW, CLUSTER_DOMAIN, service_dns_names},
};

/// One certificate: the identity `service_account`, in the Secret `<service_account>-tls`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub service_account: &'static str,
    /// Services, besides the one named like the account, that reach the same pods.
    pub extra_services: &'static [&'static str],
    /// A headless Service whose pods are dialled one by one
    /// (`<pod>.<service>.<namespace>.svc`): the certificate gets its wildcard names.
    pub pods_of: Option<&'static str>,
}

pub const WATCHER: Identity = Identity::plain("switchyard-watcher");
/// The queue also serves the external metrics API behind `switchyard-queue-metrics`
/// (components/external-metrics) with this certificate, and its StatefulSet's pods are
/// addressed through the headless `switchyard-queue`.
pub const QUEUE: Identity = Identity {
    service_account: "switchyard-queue",
    extra_services: &["switchyard-queue-metrics"],
    pods_of: Some("switchyard-queue"),
};
pub const RECONCILER: Identity = Identity::plain("switchyard-reconciler");
pub const ELECTOR: Identity = Identity::plain("switchyard-elector");
/// Read-only tools of operators (`Queue.Stats`, the elector's shard map); no workload.
pub const OBSERVER: Identity = Identity::plain("switchyard-observer");
/// Operators' `kubectl switchyard`: the observer's reads, a key's last error and draining a
/// queue member; no workload.
pub const OPERATOR: Identity = Identity::plain("switchyard-operator");
/// The members of components/etcd advertise `<pod>.switchyard-etcd.<namespace>.svc`.
pub const ETCD: Identity = Identity {
    service_account: "switchyard-etcd",
    extra_services: &[],
    pods_of: Some("switchyard-etcd"),
};

/// Every certificate `switchyard-certs` writes, in the order it writes them.
pub const ALL: [Identity; 7] = [
    WATCHER, QUEUE, RECONCILER, ELECTOR, OBSERVER, OPERATOR, ETCD,
];

impl Identity {
    const fn plain(service_account: &'static str) -> Self {
        Self {
            service_account,
            extra_services: &[],
            pods_of: None,
        }
    }

    /// The Secret (type kubernetes.io/tls) that holds this certificate.
    pub fn secret_name(&self) -> String {
        format!("{}-tls", self.service_account)
    }

    /// Every DNS SAN, in order: the account's Service names, those of the extra Services,
    /// the pod wildcards, `localhost`.
    pub fn dns_names(&self, namespace: &str) -> Vec<String> {
        let mut names = service_dns_names(self.service_account, namespace);
        for service in self.extra_services {
            names.extend(service_dns_names(service, namespace));
        }
        if let Some(service) = self.pods_of {
            names.push(format!("*.{service}.{namespace}.svc"));
            names.push(format!("*.{service}.{namespace}.svc.{CLUSTER_DOMAIN}"));
        }
        names.push("localhost".to_owned());
        names
    }

    /// The leaf to issue: [`Leaf::service`] with [`Identity::dns_names`], valid from a
    /// little before now for `validity`.
    pub fn leaf(&self, trust_domain: &str, namespace: &str, validity: Duration) -> Leaf {
        let now = SystemTime::now();
        Leaf {
            dns: self.dns_names(namespace),
            not_before: now - CLOCK_SKEW,
            not_after: now + validity,
            ..Leaf::service(trust_domain, namespace, self.service_account)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_identity_has_the_names_of_its_service_and_localhost() {
        assert_eq!(
            WATCHER.dns_names("ns"),
            [
                "switchyard-watcher",
                "switchyard-watcher.ns",
                "switchyard-watcher.ns.svc",
                "switchyard-watcher.ns.svc.cluster.local",
                "localhost"
            ]
        );
        assert_eq!(WATCHER.secret_name(), "switchyard-watcher-tls");
    }

    #[test]
    fn the_queue_also_answers_as_the_metrics_service_and_as_each_pod() {
        let names = QUEUE.dns_names("switchyard");
        for name in [
            "switchyard-queue.switchyard.svc",
            "switchyard-queue-metrics.switchyard.svc",
            "*.switchyard-queue.switchyard.svc",
            "*.switchyard-queue.switchyard.svc.cluster.local",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
    }

    #[test]
    fn identities_are_distinct() {
        let mut accounts: Vec<_> = ALL.iter().map(|i| i.service_account).collect();
        accounts.sort_unstable();
        accounts.dedup();
        assert_eq!(accounts.len(), ALL.len());
    }
}
