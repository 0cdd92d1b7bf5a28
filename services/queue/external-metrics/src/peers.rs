//! The fan-out to the other queue replicas: a member answers for the whole queue by adding
//! every other member's backlog (their gRPC `Stats`) to its own.

use std::time::Duration;

use switchyard_proto::queue::v1::{StatsRequest, queue_client::QueueClient};
use switchyard_runtime::{Dialer, Role};
use tokio::sync::watch;

/// How long another member gets to report its backlog; the HPA asks every 15 s by default.
const PEER_TIMEOUT: Duration = Duration::from_secs(3);

/// A queue replica of the installation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its member id.
    pub id: String,
    /// Its gRPC address (`host:port`).
    pub address: String,
}

/// The other queue replicas, whose backlog a member adds to its own.
#[derive(Clone, Debug)]
pub struct Peers {
    /// Every member, this replica included; `None` until the member list is known.
    pub members: watch::Receiver<Option<Vec<Peer>>>,
    /// This replica's member id, left out of the fan-out.
    pub me: String,
    /// How this replica reaches the others.
    pub dialer: Dialer,
}

impl Peers {
    /// Adds every other member's backlog to `backlog`, by controller name (a controller only
    /// another member knows is added to the list), or says which member did not answer.
    pub(crate) async fn add_to(&self, backlog: &mut crate::routes::Totals) -> Result<(), String> {
        let Some(members) = self.members.borrow().clone() else {
            return Err("the queue's member list is not known yet".to_owned());
        };
        let others: Vec<Peer> = members.into_iter().filter(|m| m.id != self.me).collect();
        let answers = futures::future::join_all(others.iter().map(|member| async move {
            let ask = async {
                let endpoint = self
                    .dialer
                    .endpoint(&member.address, Role::Queue)
                    .map_err(|e| e.to_string())?;
                let mut client = QueueClient::new(
                    self.dialer
                        .connect(&endpoint, Role::Queue)
                        .await
                        .map_err(|e| e.to_string())?,
                );
                client
                    .stats(StatsRequest::default())
                    .await
                    .map(|r| r.into_inner().shards)
                    .map_err(|e| e.message().to_owned())
            };
            tokio::time::timeout(PEER_TIMEOUT, ask)
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {PEER_TIMEOUT:?}")))
        }))
        .await;
        for (member, answer) in others.iter().zip(answers) {
            let shards = answer.map_err(|reason| {
                format!(
                    "queue member {} at {} did not report its backlog: {reason}",
                    member.id, member.address
                )
            })?;
            for s in shards {
                backlog.add(&s.controller, s.depth + s.in_flight);
            }
        }
        Ok(())
    }
}
