//! Crash detection faster than a member lease, on proof only.
//!
//! etcd frees a crashed member's shards when its lease expires: up to the TTL after its last
//! renewal, plus etcd's 500 ms expiry tick. The leader shortens that for a member whose
//! process is gone:
//!
//! ```text
//!  per live member: Health.Watch stream to its gRPC address
//!      │ stream breaks, or cannot be opened
//!      ▼
//!  read the member key (its lease L) ─► TCP connect to the address
//!      refused ─► revoke L: the member key goes, and the leader moves its shards
//!      accepted, no answer, DNS error ─► no proof: keep watching (the lease decides)
//! ```
//!
//! Why a refused connection is proof: a member binds its gRPC port before it registers, and
//! closes it only after it has drained, handed back every shard and left
//! (`Runtime::serve_grpc_until` in the queue). So while registration L's process serves
//! anything, its port accepts. L is read before the probe: a registration made after the
//! probe cannot be the one revoked. A stalled or partitioned member still holds its port
//! (the kernel accepts for it) or does not answer at all; neither is taken as proof, and its
//! own lease deadline stops it as before.
//!
//! The one assumption: nothing between the elector and the members answers for them with a
//! refusal (a firewall rule that rejects rather than drops). `--member-probe=false` turns
//! this off for such networks.

use std::{collections::BTreeMap, time::Duration};

use etcd_client::Client;
use prometheus_client::metrics::counter::Counter;
use tokio::{net::TcpStream, sync::watch};
use tokio_util::task::AbortOnDropHandle;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
use tracing::{debug, info, warn};

use switchyard_runtime::{Backoff, Dialer, Role};
use switchyard_shards::member::{MEMBERS_PREFIX, Member};

/// How long a probe connection may take before the answer counts as "no proof".
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Between health watches of one member after a break that proved nothing.
const RETRY: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// What a probe of a member's address found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// Something accepted the connection: the member may be alive.
    Accepted,
    /// The address refused the connection: nothing listens there.
    Refused,
    /// No answer in time, or the address did not resolve: nothing is proven.
    Unknown,
}

/// Connects to `address` once.
pub async fn probe(address: &str) -> Probe {
    match tokio::time::timeout(PROBE_TIMEOUT, TcpStream::connect(address)).await {
        Ok(Ok(_)) => Probe::Accepted,
        Ok(Err(error)) if error.kind() == std::io::ErrorKind::ConnectionRefused => Probe::Refused,
        Ok(Err(_)) | Err(_) => Probe::Unknown,
    }
}

/// Watches every member in `members` until the receiver closes (or the task is dropped, at
/// the end of a term of leadership). `detected` counts the members found gone (each one's
/// registration then revoked).
pub async fn run(
    client: Client,
    dialer: Dialer,
    mut members: watch::Receiver<Option<Vec<Member>>>,
    detected: Counter,
) {
    let mut watched: BTreeMap<Member, AbortOnDropHandle<()>> = BTreeMap::new();
    loop {
        let live = members.borrow_and_update().clone().unwrap_or_default();
        watched.retain(|member, _| live.contains(member));
        for member in live {
            watched.entry(member.clone()).or_insert_with(|| {
                AbortOnDropHandle::new(tokio::spawn(follow(
                    client.clone(),
                    dialer.clone(),
                    member,
                    detected.clone(),
                )))
            });
        }
        if members.changed().await.is_err() {
            return;
        }
    }
}

/// Follows one member until its process is proven gone (its registration then revoked) or
/// it leaves the member set (the task is dropped).
async fn follow(mut client: Client, dialer: Dialer, member: Member, detected: Counter) {
    let mut backoff = Backoff::new(RETRY.0, RETRY.1);
    loop {
        let watched = watch_health(&dialer, &member.address).await;
        // The registration that a refusal would prove dead, read before the probe.
        let lease = match registration(&mut client, &member).await {
            Ok(Some(lease)) => lease,
            // Left, or registered again at another address: nothing of this one to watch.
            Ok(None) => return,
            Err(error) => {
                debug!(member = %member.id, %error, "cannot read the member's registration");
                tokio::time::sleep(backoff.advance()).await;
                continue;
            }
        };
        match probe(&member.address).await {
            Probe::Refused => {
                // Counted and said before the revoke: its effect (the member key deleted)
                // reaches `run` through the member watch, which may drop this task before
                // the revoke's answer is read.
                detected.inc();
                info!(member = %member.id, address = %member.address, lease, "member's port refuses connections: revoking its registration");
                if let Err(error) = client.lease_revoke(lease).await {
                    warn!(member = %member.id, lease, %error, "cannot revoke the registration of a member found gone");
                }
                return;
            }
            outcome => {
                debug!(member = %member.id, ?outcome, stream_held = watched, "member health stream ended without proof");
                if watched {
                    backoff.reset();
                }
                tokio::time::sleep(backoff.advance()).await;
            }
        }
    }
}

/// Holds a `grpc.health.v1.Health/Watch` stream to `address` until it ends. Returns whether
/// the stream was open at all (a member that accepted it once is followed without delay).
async fn watch_health(dialer: &Dialer, address: &str) -> bool {
    let Ok(endpoint) = dialer.endpoint(address, Role::Queue) else {
        return false;
    };
    let endpoint = endpoint.connect_timeout(PROBE_TIMEOUT);
    let Ok(channel) = dialer.connect(&endpoint, Role::Queue).await else {
        return false;
    };
    let Ok(response) = HealthClient::new(channel)
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
    else {
        return false;
    };
    let mut stream = response.into_inner();
    while let Ok(Some(_)) = stream.message().await {}
    true
}

/// The lease of `member`'s registration, if it is still registered at the same address.
async fn registration(
    client: &mut Client,
    member: &Member,
) -> Result<Option<i64>, etcd_client::Error> {
    let response = client
        .get(format!("{MEMBERS_PREFIX}{}", member.id), None)
        .await?;
    Ok(response
        .kvs()
        .first()
        .filter(|kv| kv.value() == member.address.as_bytes())
        .map(|kv| kv.lease()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_port_is_refused_and_an_open_one_accepted() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        assert_eq!(probe(&address).await, Probe::Accepted);
        drop(listener);
        assert_eq!(probe(&address).await, Probe::Refused);
    }

    #[tokio::test]
    async fn an_unresolvable_address_proves_nothing() {
        assert_eq!(probe("no-such-host.invalid:1").await, Probe::Unknown);
    }
}
