//! `switchyard.elector.v1.Elector`: the shard map, read once or followed, for queue members,
//! watchers, reconcilers and tools. Members make their own writes in etcd (their registration
//! under their own lease, their fenced release and renewal: `switchyard_shards`), so the
//! elector's API only reads, but for operators' `DrainMember`, which writes a draining mark
//! (`switchyard_shards::draining`) that the leader then acts on. The only place a
//! `tonic::Status` is made.

use std::{collections::BTreeSet, pin::Pin, sync::Arc, time::Duration};

use etcd_client::Client;
use tokio::sync::Mutex;

use futures::{Stream, StreamExt};
use switchyard_elector_core::ShardState;
use switchyard_proto::elector::v1::{self as pb, elector_server};
use switchyard_shards::{
    Etcd,
    access::ELECTION,
    draining::{self, DrainError},
    member::Member,
};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tonic::{Request, Response, Status};

/// How long `GetShardMap` waits for etcd to name the leader and the draining members before
/// answering without them: the map itself comes from the watch and must not wait on etcd.
const ETCD_READ_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Debug)]
pub struct ElectorService {
    shard_count: u32,
    map: watch::Receiver<Option<Vec<ShardState>>>,
    members: watch::Receiver<Option<Vec<Member>>>,
    /// For the leader's name, the draining marks and `DrainMember`; without it those are
    /// absent and `DrainMember` is refused.
    etcd: Option<Etcd>,
    /// One connection for those calls, made on first use and dropped after an error.
    client: CachedClient,
}

#[derive(Clone, Default)]
struct CachedClient(Arc<Mutex<Option<Client>>>);

impl std::fmt::Debug for CachedClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CachedClient")
    }
}

/// Why `DrainMember` was refused.
#[derive(Debug, thiserror::Error)]
enum DrainRefused {
    #[error("member_id: {0}")]
    InvalidMember(String),
    #[error("this elector has no etcd to write the mark to")]
    NoEtcd,
    #[error(transparent)]
    Drain(#[from] DrainError),
}

impl From<DrainRefused> for Status {
    fn from(error: DrainRefused) -> Self {
        let message = switchyard_runtime::status_message(error.to_string());
        match error {
            DrainRefused::InvalidMember(_) => Status::invalid_argument(message),
            DrainRefused::NoEtcd => Status::unimplemented(message),
            DrainRefused::Drain(DrainError::NotFound(_)) => Status::not_found(message),
            DrainRefused::Drain(DrainError::NoOtherMember { .. }) => {
                Status::failed_precondition(message)
            }
            DrainRefused::Drain(DrainError::Changed(_)) => Status::aborted(message),
            DrainRefused::Drain(DrainError::Etcd(_)) => Status::unavailable(message),
        }
    }
}

impl ElectorService {
    pub fn new(
        shard_count: u32,
        map: watch::Receiver<Option<Vec<ShardState>>>,
        members: watch::Receiver<Option<Vec<Member>>>,
    ) -> Self {
        Self {
            shard_count,
            map,
            members,
            etcd: None,
            client: CachedClient::default(),
        }
    }

    /// The cached etcd connection, or a new one.
    async fn client(&self) -> Result<Client, DrainRefused> {
        let etcd = self.etcd.as_ref().ok_or(DrainRefused::NoEtcd)?;
        let mut cached = self.client.0.lock().await;
        if let Some(client) = cached.as_ref() {
            return Ok(client.clone());
        }
        let client = etcd.connect().await.map_err(DrainError::from)?;
        *cached = Some(client.clone());
        Ok(client)
    }

    /// Forgets the cached connection after `result` failed, so the next call reconnects.
    async fn forget_on_error<T, E>(&self, result: Result<T, E>) -> Result<T, E> {
        if result.is_err() {
            *self.client.0.lock().await = None;
        }
        result
    }

    /// Names the leader and the draining members in `GetShardMap`, and serves `DrainMember`.
    pub fn with_etcd(mut self, etcd: Etcd) -> Self {
        self.etcd = Some(etcd);
        self
    }

    /// The leading elector's id and the draining members, as etcd says now.
    async fn leader_and_draining(&self) -> Option<(String, BTreeSet<String>)> {
        self.etcd.as_ref()?;
        let read = async {
            let mut client = self.client().await.ok()?;
            let leader = match client.leader(ELECTION).await {
                Ok(response) => response
                    .kv()
                    .and_then(|kv| kv.value_str().ok())
                    .unwrap_or_default()
                    .to_owned(),
                // No campaign at all: nobody leads.
                Err(_) => String::new(),
            };
            let draining = draining::read(&mut client).await;
            Some((
                leader,
                self.forget_on_error(draining).await.ok()?.draining(),
            ))
        };
        tokio::time::timeout(ETCD_READ_TIMEOUT, read)
            .await
            .ok()
            .flatten()
    }

    /// The map as `GetShardMap` answers it, with the leader and the draining marks when etcd
    /// answers in time; `None` until the map is read from etcd.
    pub async fn snapshot(&self) -> Option<pb::ShardMap> {
        let map = self.map.borrow().clone();
        let members = self.members.borrow().clone();
        map.as_ref()?;
        let mut snapshot = snapshot(map.as_deref(), members.as_deref(), self.shard_count);
        if let Some((leader, draining)) = self.leader_and_draining().await {
            snapshot.leader_id = leader;
            for member in &mut snapshot.members {
                member.draining = draining.contains(&member.id);
            }
        }
        Some(snapshot)
    }

    async fn drain_member(&self, request: pb::DrainMemberRequest) -> Result<u32, DrainRefused> {
        if let Some(problem) = switchyard_shards::member::member_id_problem(&request.member_id) {
            return Err(DrainRefused::InvalidMember(problem));
        }
        let mut client = self.client().await?;
        let written = if request.undo {
            draining::unmark(&mut client, &request.member_id).await
        } else {
            draining::mark(&mut client, &request.member_id).await
        };
        self.forget_on_error(written).await?;
        let held = self
            .map
            .borrow()
            .iter()
            .flatten()
            .filter(|s| s.owner() == Some(request.member_id.as_str()))
            .count();
        Ok(u32::try_from(held).unwrap_or(u32::MAX))
    }

    pub fn into_server(self) -> elector_server::ElectorServer<Self> {
        elector_server::ElectorServer::new(self)
    }
}

/// The map with owner addresses, as the proto carries it.
fn snapshot(
    map: Option<&[ShardState]>,
    members: Option<&[Member]>,
    shard_count: u32,
) -> pb::ShardMap {
    let members = members.unwrap_or_default();
    let address = |id: &str| {
        members
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.address.clone())
            .unwrap_or_default()
    };
    let shards = (0..shard_count)
        .map(|shard| {
            let state = map.and_then(|m| m.get(shard as usize));
            let (member_id, epoch, state, next) = match state {
                Some(ShardState::Active { owner, epoch }) => {
                    (owner.clone(), *epoch, pb::ShardState::Active, String::new())
                }
                Some(ShardState::Releasing { owner, epoch, next }) => (
                    owner.clone(),
                    *epoch,
                    pb::ShardState::Releasing,
                    next.clone(),
                ),
                _ => (String::new(), 0, pb::ShardState::Unassigned, String::new()),
            };
            pb::ShardAssignment {
                shard,
                address: address(&member_id),
                member_id,
                epoch,
                state: state.into(),
                next_member_id: next,
            }
        })
        .collect();
    pb::ShardMap {
        revision: map
            .into_iter()
            .flatten()
            .map(|s| match s {
                ShardState::Active { epoch, .. } | ShardState::Releasing { epoch, .. } => *epoch,
                ShardState::Unassigned => 0,
            })
            .max()
            .unwrap_or(0),
        shard_count,
        shards,
        members: members
            .iter()
            .map(|m| pb::Member {
                id: m.id.clone(),
                address: m.address.clone(),
                draining: false,
            })
            .collect(),
        leader_id: String::new(),
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl elector_server::Elector for ElectorService {
    async fn get_shard_map(
        &self,
        _: Request<pb::GetShardMapRequest>,
    ) -> Result<Response<pb::ShardMap>, Status> {
        match self.snapshot().await {
            Some(snapshot) => Ok(Response::new(snapshot)),
            None => Err(Status::unavailable(
                "the shard map has not been read from etcd yet",
            )),
        }
    }

    async fn drain_member(
        &self,
        request: Request<pb::DrainMemberRequest>,
    ) -> Result<Response<pb::DrainMemberResponse>, Status> {
        let shards_held = ElectorService::drain_member(self, request.into_inner()).await?;
        Ok(Response::new(pb::DrainMemberResponse { shards_held }))
    }

    type WatchShardMapStream = BoxStream<pb::ShardMap>;

    async fn watch_shard_map(
        &self,
        _: Request<pb::WatchShardMapRequest>,
    ) -> Result<Response<Self::WatchShardMapStream>, Status> {
        let (map, members) = (self.map.clone(), self.members.clone());
        let shard_count = self.shard_count;
        // A new snapshot on every change of the map or of the members (owners' addresses
        // come from the members: a map seen before its owners registered their addresses
        // is sent again once they have); a slow reader skips to the latest.
        let changes = futures::stream::select(
            WatchStream::new(map.clone()).map(|_| ()),
            WatchStream::new(members.clone()).map(|_| ()),
        );
        let stream = changes.filter_map(move |()| {
            let map = map.borrow().clone();
            let members = members.borrow().clone();
            std::future::ready(
                map.map(|map| Ok(snapshot(Some(&map), members.as_deref(), shard_count))),
            )
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

#[cfg(test)]
mod tests {
    use elector_server::Elector as _;

    use super::*;

    #[test]
    fn a_member_reads_back_every_state_the_snapshot_sends() {
        let states = vec![
            ShardState::Active {
                owner: "a".into(),
                epoch: 7,
            },
            ShardState::Releasing {
                owner: "a".into(),
                epoch: 8,
                next: "b".into(),
            },
            ShardState::Unassigned,
        ];
        let members = vec![
            Member {
                id: "a".into(),
                address: "127.0.0.1:1".into(),
            },
            Member {
                id: "b".into(),
                address: "127.0.0.1:2".into(),
            },
        ];
        let sent = snapshot(Some(&states), Some(&members), 3);
        assert_eq!(sent.shards[1].address, "127.0.0.1:1");
        assert_eq!(switchyard_shards::member_view(&sent), (states, members));
    }

    /// An id no member could register under is refused before etcd is asked, naming the
    /// field and the limit.
    #[tokio::test]
    async fn a_member_id_no_member_could_have_is_refused_naming_the_field() {
        let (_map_tx, map) = watch::channel(Some(Vec::new()));
        let (_members_tx, members) = watch::channel(Some(Vec::new()));
        let service = ElectorService::new(2, map, members);
        for (member_id, message) in [
            (String::new(), "member_id: required"),
            ("m".repeat(254), "member_id: 254 bytes, at most 253"),
            ("m".repeat(4 << 20), "member_id: 4194304 bytes, at most 253"),
            ("q0/../q1".to_owned(), "member_id: must not contain '/'"),
        ] {
            for undo in [false, true] {
                let request = pb::DrainMemberRequest {
                    member_id: member_id.clone(),
                    undo,
                };
                let status = elector_server::Elector::drain_member(&service, Request::new(request))
                    .await
                    .unwrap_err();
                assert_eq!(
                    (status.code(), status.message()),
                    (tonic::Code::InvalidArgument, message)
                );
            }
        }
    }

    /// A subscriber that saw the map before its owners' addresses were known gets the
    /// addresses as soon as the members change, with no change of the map.
    #[tokio::test]
    async fn the_watch_sends_again_when_only_the_members_change() {
        let active = |owner: &str| ShardState::Active {
            owner: owner.into(),
            epoch: 7,
        };
        let (_map_tx, map) = watch::channel(Some(vec![active("a"), active("a")]));
        let (members_tx, members) = watch::channel(Some(Vec::new()));
        let service = ElectorService::new(2, map, members);
        let mut updates = service
            .watch_shard_map(Request::new(pb::WatchShardMapRequest {}))
            .await
            .unwrap()
            .into_inner();
        let address = |map: &pb::ShardMap| map.shards[0].address.clone();
        let first = updates.next().await.unwrap().unwrap();
        assert_eq!(address(&first), "");
        members_tx.send_replace(Some(vec![Member {
            id: "a".into(),
            address: "a:8443".into(),
        }]));
        let next = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            loop {
                let map = updates.next().await.unwrap().unwrap();
                if !address(&map).is_empty() {
                    return map;
                }
            }
        })
        .await
        .expect("a new snapshot after the members changed");
        assert_eq!(address(&next), "a:8443");
        assert_eq!(next.shards[0].epoch, 7);
    }
}
