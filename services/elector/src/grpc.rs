//! `switchyard.elector.v1.Elector`: the shard map for tools and watchers, and the calls a
//! member makes. Members hold their own lease in etcd (so their liveness is theirs, not the
//! elector's): `Join` confirms a registration, `Leave` revokes the member's lease, `Release`
//! performs the fenced release of a drained shard. The only place a `tonic::Status` is made.

use std::pin::Pin;

use etcd_client::Client;
use futures::{Stream, StreamExt};
use switchyard_elector_core::ShardState;
use switchyard_proto::elector::v1::{self as pb, elector_server};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tonic::{Request, Response, Status};

use crate::{
    membership::{MEMBERS_PREFIX, Member},
    shardmap::{self, ShardMapError},
};

#[derive(Clone, Debug)]
pub struct ElectorService {
    endpoints: Vec<String>,
    shard_count: u32,
    map: watch::Receiver<Option<Vec<ShardState>>>,
    members: watch::Receiver<Option<Vec<Member>>>,
}

impl ElectorService {
    pub fn new(
        endpoints: Vec<String>,
        shard_count: u32,
        map: watch::Receiver<Option<Vec<ShardState>>>,
        members: watch::Receiver<Option<Vec<Member>>>,
    ) -> Self {
        Self {
            endpoints,
            shard_count,
            map,
            members,
        }
    }

    pub fn into_server(self) -> elector_server::ElectorServer<Self> {
        elector_server::ElectorServer::new(self)
    }

    async fn client(&self) -> Result<Client, Status> {
        Client::connect(&self.endpoints, None)
            .await
            .map_err(|e| Status::unavailable(format!("etcd unreachable: {e}")))
    }
}

/// A member's view of a map the elector sent: every shard's state (as many as `map` names;
/// a shard it leaves out is unassigned) and the members. The inverse of [`snapshot`].
pub fn from_snapshot(map: &pb::ShardMap) -> (Vec<ShardState>, Vec<Member>) {
    let mut states = vec![ShardState::Unassigned; map.shard_count as usize];
    for shard in &map.shards {
        let state = match pb::ShardState::try_from(shard.state) {
            Ok(pb::ShardState::Active) => ShardState::Active {
                owner: shard.member_id.clone(),
                epoch: shard.epoch,
            },
            Ok(pb::ShardState::Releasing) => ShardState::Releasing {
                owner: shard.member_id.clone(),
                epoch: shard.epoch,
                next: shard.next_member_id.clone(),
            },
            _ => ShardState::Unassigned,
        };
        if let Some(slot) = states.get_mut(shard.shard as usize) {
            *slot = state;
        }
    }
    let members = map
        .members
        .iter()
        .map(|m| Member {
            id: m.id.clone(),
            address: m.address.clone(),
        })
        .collect();
    (states, members)
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
            })
            .collect(),
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn member_id(field: &str, id: &str) -> Result<(), Status> {
    if id.is_empty() || id.contains('/') || id.len() > 253 {
        return Err(Status::invalid_argument(format!(
            "{field}: must be 1 to 253 characters without '/'"
        )));
    }
    Ok(())
}

#[tonic::async_trait]
impl elector_server::Elector for ElectorService {
    async fn join(
        &self,
        request: Request<pb::JoinRequest>,
    ) -> Result<Response<pb::JoinResponse>, Status> {
        let member = request
            .into_inner()
            .member
            .ok_or_else(|| Status::invalid_argument("member: required"))?;
        member_id("member.id", &member.id)?;
        let response = self
            .client()
            .await?
            .get(format!("{MEMBERS_PREFIX}{}", member.id), None)
            .await
            .map_err(|e| Status::unavailable(format!("etcd: {e}")))?;
        let Some(kv) = response.kvs().first() else {
            return Err(Status::failed_precondition(format!(
                "member {:?} is not registered: members register in etcd under their own lease",
                member.id
            )));
        };
        if kv.value() != member.address.as_bytes() {
            return Err(Status::failed_precondition(format!(
                "member {:?} is registered with address {:?}, not {:?}",
                member.id,
                String::from_utf8_lossy(kv.value()),
                member.address
            )));
        }
        Ok(Response::new(pb::JoinResponse {
            revision: u64::try_from(kv.mod_revision()).unwrap_or(0),
        }))
    }

    async fn leave(
        &self,
        request: Request<pb::LeaveRequest>,
    ) -> Result<Response<pb::LeaveResponse>, Status> {
        let id = request.into_inner().member_id;
        member_id("member_id", &id)?;
        let mut client = self.client().await?;
        let response = client
            .get(format!("{MEMBERS_PREFIX}{id}"), None)
            .await
            .map_err(|e| Status::unavailable(format!("etcd: {e}")))?;
        let Some(kv) = response.kvs().first() else {
            return Err(Status::not_found(format!("unknown member {id:?}")));
        };
        // Revoking the member's lease removes it at once; the leader then moves its shards.
        client
            .lease_revoke(kv.lease())
            .await
            .map_err(|e| Status::unavailable(format!("etcd: {e}")))?;
        Ok(Response::new(pb::LeaveResponse {}))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let request = request.into_inner();
        member_id("member_id", &request.member_id)?;
        if request.shard >= self.shard_count {
            return Err(Status::invalid_argument(format!(
                "shard: {} is not below the shard count {}",
                request.shard, self.shard_count
            )));
        }
        let mut client = self.client().await?;
        match shardmap::release(
            &mut client,
            request.shard,
            &request.member_id,
            request.epoch,
        )
        .await
        {
            Ok(_) => Ok(Response::new(pb::ReleaseResponse {})),
            Err(error @ (ShardMapError::Release(_) | ShardMapError::Fenced)) => {
                Err(Status::failed_precondition(error.to_string()))
            }
            Err(error) => Err(Status::unavailable(error.to_string())),
        }
    }

    async fn get_shard_map(
        &self,
        _: Request<pb::GetShardMapRequest>,
    ) -> Result<Response<pb::ShardMap>, Status> {
        let map = self.map.borrow().clone();
        let members = self.members.borrow().clone();
        if map.is_none() {
            return Err(Status::unavailable(
                "the shard map has not been read from etcd yet",
            ));
        }
        Ok(Response::new(snapshot(
            map.as_deref(),
            members.as_deref(),
            self.shard_count,
        )))
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
        assert_eq!(from_snapshot(&sent), (states, members));
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
        let service = ElectorService::new(Vec::new(), 2, map, members);
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
