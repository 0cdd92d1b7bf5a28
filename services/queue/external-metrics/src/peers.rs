//! The fan-out to the other queue replicas: a member answers for the whole queue by adding
//! every other member's backlog (their gRPC `Stats`) to its own.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use switchyard_proto::queue::v1::{StatsRequest, queue_client::QueueClient};
use switchyard_runtime::{Dialer, Role};
use tokio::sync::watch;
use tonic::transport::Channel;

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
    members: watch::Receiver<Option<Vec<Peer>>>,
    /// This replica's member id, left out of the fan-out.
    me: String,
    /// How this replica reaches the others.
    dialer: Dialer,
    /// One channel per member address, reused by every request: the HPA asks every 15 s,
    /// and a handshake per member per request would cost more than the answer.
    channels: Arc<Channels>,
}

/// Channels by address, for the members there are now.
#[derive(Debug, Default)]
struct Channels(Mutex<HashMap<String, Channel>>);

impl Channels {
    /// The channel to `address`, made by `dial` the first time.
    fn get_or_dial<E>(
        &self,
        address: &str,
        dial: impl FnOnce() -> Result<Channel, E>,
    ) -> Result<Channel, E> {
        let mut channels = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        let channel = dial()?;
        channels.insert(address.to_owned(), channel.clone());
        Ok(channel)
    }

    /// Forgets the channels to addresses no member has any more.
    fn keep_only(&self, addresses: &[&str]) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|address, _| addresses.contains(&address.as_str()));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl Peers {
    /// The members of `members` but `me`, reached with `dialer`.
    pub fn new(members: watch::Receiver<Option<Vec<Peer>>>, me: String, dialer: Dialer) -> Self {
        Self {
            members,
            me,
            dialer,
            channels: Arc::default(),
        }
    }

    /// Adds every other member's backlog to `backlog`, by controller name (a controller only
    /// another member knows is added to the list), or says which member did not answer.
    pub(crate) async fn add_to(&self, backlog: &mut crate::routes::Totals) -> Result<(), String> {
        let Some(members) = self.members.borrow().clone() else {
            return Err("the queue's member list is not known yet".to_owned());
        };
        let others: Vec<Peer> = members.into_iter().filter(|m| m.id != self.me).collect();
        let addresses: Vec<&str> = others.iter().map(|m| m.address.as_str()).collect();
        self.channels.keep_only(&addresses);
        let answers = futures::future::join_all(others.iter().map(|member| async move {
            let ask = async {
                // Connected on first use and again after a failure, by the channel itself.
                let channel = self.channels.get_or_dial(&member.address, || {
                    self.dialer
                        .channel(&member.address, Role::Queue)
                        .map_err(|e| e.to_string())
                })?;
                let mut client = QueueClient::new(channel);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_channel_per_member_address_for_as_long_as_it_is_a_member() {
        let channels = Channels::default();
        let dials = std::sync::atomic::AtomicUsize::new(0);
        let dial = || {
            dials.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, String>(
                tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy(),
            )
        };
        for _ in 0..3 {
            channels.get_or_dial("q1:8443", dial).unwrap();
            channels.get_or_dial("q2:8443", dial).unwrap();
        }
        assert_eq!(dials.load(std::sync::atomic::Ordering::SeqCst), 2);
        channels.keep_only(&["q2:8443"]);
        assert_eq!(channels.len(), 1);
        channels.get_or_dial("q1:8443", dial).unwrap();
        assert_eq!(dials.load(std::sync::atomic::Ordering::SeqCst), 3);
        let failed = channels.get_or_dial("q3:8443", || Err("unreachable".to_owned()));
        assert_eq!(failed.err().as_deref(), Some("unreachable"));
        assert_eq!(channels.len(), 2, "a failed dial is not kept");
    }
}
