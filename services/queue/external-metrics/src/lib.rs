//! The external metrics API (`external.metrics.k8s.io/v1beta1`), so that a
//! HorizontalPodAutoscaler can scale the reconcilers on the work waiting in the queue.
//!
//! ```text
//!  HPA controller ─► kube-apiserver ─► APIService v1beta1.external.metrics.k8s.io
//!                    (aggregation layer, front-proxy client certificate)
//!                        ─► Service ─► queue :6443 (HTTPS, tls) ─► routes ─► Backlog (this replica)
//!                                                                     └─► peers: gRPC Stats (other members)
//! ```
//!
//! One metric, [`BACKLOG_METRIC`]: for each controller, the keys that are not done (ready,
//! delayed and leased). Each item carries the label [`CONTROLLER_LABEL`] with the
//! controller's name made label-safe (`apps/v1/ReplicaSet` → `apps.v1.ReplicaSet`). The HPA
//! sums the items that match its selector, so an empty selector scales on the backlog of
//! every controller. The namespace in the path is the HPA's; the backlog is the installation's.
//!
//! A replica that is a member of an elector-run installation adds the backlog of every other
//! member ([`peers`]: their gRPC `Stats`) to its own, so whichever replica the APIService
//! reaches answers for the whole queue. If a member does not answer, the request fails (503)
//! rather than report a partial backlog, and the HPA keeps the replicas it has.
//!
//! The server speaks HTTPS only (the aggregation layer never dials plain HTTP). Without a
//! certificate it makes a self-signed one at start, for an APIService with
//! `insecureSkipTLSVerify`. With `--external-metrics-client-ca` (the apiserver's
//! requestheader CA) only clients with a certificate from that CA, that is the aggregation
//! layer, may call ([`tls`]).
//!
//! The crate depends on no service: the queue hands in its own backlog through [`Backlog`]
//! and the members it knows of as [`Peer`]s.

mod args;
pub mod peers;
mod routes;
mod server;
pub mod tls;

use std::{future::Future, net::SocketAddr, sync::Arc};

pub use args::ExternalMetricsArgs;
pub use peers::{Peer, Peers};
pub use server::Server;

pub const GROUP: &str = "external.metrics.k8s.io";
pub const VERSION: &str = "v1beta1";
pub const GROUP_VERSION: &str = "external.metrics.k8s.io/v1beta1";
/// Keys not done, per controller: ready, delayed and leased.
pub const BACKLOG_METRIC: &str = "switchyard_queue_backlog";
/// The label that names the controller of an item.
pub const CONTROLLER_LABEL: &str = "controller";

/// The queue this server answers for.
pub trait Backlog: Clone + Send + Sync + 'static {
    /// This replica's keys that are not done (ready, delayed and leased), as entries of
    /// (controller name, keys) that add up; every controller the replica knows has at least
    /// one entry, so that an idle one reads 0 rather than nothing. Controllers become known
    /// while the queue runs, so the names are asked each time.
    fn backlog(&self) -> impl Future<Output = Result<Vec<(Arc<str>, u64)>, ShuttingDown>> + Send;
}

/// The queue no longer answers: it is shutting down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the queue is shutting down")]
pub struct ShuttingDown;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Tls(#[from] tls::Error),
    #[error("failed to bind the external metrics address {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A controller name as a label value: `/` becomes `.`, any other character a label value
/// may not hold becomes `_`, and the result is cut to 63 characters.
pub fn label_value(controller: &str) -> String {
    let mapped: String = controller
        .chars()
        .map(|c| match c {
            '/' => '.',
            c if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') => c,
            _ => '_',
        })
        .take(switchyard_selector::label::MAX_NAME_LENGTH)
        .collect();
    mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_names_become_label_values() {
        assert_eq!(label_value("apps/v1/ReplicaSet"), "apps.v1.ReplicaSet");
        assert_eq!(label_value("v1/Pod"), "v1.Pod");
        assert_eq!(
            label_value("example.com/v1/My Kind"),
            "example.com.v1.My_Kind"
        );
        for name in [&"x/".repeat(40), "-a-/", "é/v1/Ü"] {
            let value = label_value(name);
            assert_eq!(
                switchyard_selector::validate_value(&value),
                Ok(()),
                "{name:?}"
            );
        }
    }
}
