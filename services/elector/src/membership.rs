//! The elector's reading of the members: who is registered (each queue replica keeps its own
//! registration under its lease, see `switchyard_shards::member`).

use etcd_client::{Client, GetOptions};
use switchyard_runtime::Drain;
use switchyard_shards::Etcd;
use switchyard_shards::member::{MEMBERS_PREFIX, Member, MembershipError};
use tokio::sync::watch;

/// The registered members and the etcd revision they were read at.
pub async fn members(client: &mut Client) -> Result<(Vec<Member>, i64), MembershipError> {
    let response = client
        .get(MEMBERS_PREFIX, Some(GetOptions::new().with_prefix()))
        .await?;
    let revision = response.header().map_or(0, |h| h.revision());
    let mut members: Vec<Member> = response
        .kvs()
        .iter()
        .filter_map(|kv| {
            Some(Member {
                id: kv.key_str().ok()?.strip_prefix(MEMBERS_PREFIX)?.to_owned(),
                address: kv.value_str().ok()?.to_owned(),
            })
        })
        .collect();
    members.sort();
    Ok((members, revision))
}

/// Publishes the member set now and after every change, until `drain`, from a task of its
/// own (see [`follow_members`]).
pub fn watch_members(
    etcd: Etcd,
    drain: Drain,
) -> (
    watch::Receiver<Option<Vec<Member>>>,
    tokio::task::JoinHandle<()>,
) {
    let (rx, follow) = follow_members(etcd, drain);
    (rx, tokio::spawn(follow))
}

/// The member set, published now and after every change by the returned future until
/// `drain`; the caller runs it (a service, as a supervised task).
pub fn follow_members(
    etcd: Etcd,
    drain: Drain,
) -> (
    watch::Receiver<Option<Vec<Member>>>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (mut entries, mirror) = crate::mirror::mirror(etcd, MEMBERS_PREFIX, drain);
    let (tx, rx) = watch::channel(None);
    let task = async move {
        let _mirror = tokio_util::task::AbortOnDropHandle::new(mirror);
        loop {
            let set = entries.borrow_and_update().as_ref().map(|entries| {
                entries
                    .iter()
                    .map(|(id, (address, _))| Member {
                        id: id.clone(),
                        address: String::from_utf8_lossy(address).into_owned(),
                    })
                    .collect::<Vec<_>>()
            });
            tx.send_if_modified(|old| {
                let changed = *old != set;
                *old = set;
                changed
            });
            if entries.changed().await.is_err() {
                return;
            }
        }
    };
    (rx, task)
}
