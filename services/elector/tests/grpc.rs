//! The elector binary's gRPC API against a real etcd: the shard map snapshot and its watch
//! with owner addresses, followed through members' own fenced releases (refused with a clear
//! error when stale, changing nothing) and a member leaving; a member an operator drains
//! (`DrainMember`), which hands its shards over and gets none until it registers again; and
//! a leader process killed (SIGKILL) while a follower process stands by.

#![allow(clippy::unwrap_used)]

use std::{path::Path, time::Duration};

use switchyard_proto::elector::v1::{
    GetShardMapRequest, Member as ProtoMember, ShardMap, ShardState, WatchShardMapRequest,
    elector_client::ElectorClient,
};
use switchyard_runtime::{Role, ShutdownHandle, drain_channel};
use switchyard_shards::{
    member::{LeaseState, LeaseTiming, Member, join},
    store::{self, ShardMapError},
};
use switchyard_testenv::{Etcd, Pki, ServiceProcess};
use tonic::transport::Channel;

const SHARDS: u32 = 8;

/// A client of the elector at `address`, as an operator's tool that reads the shard map.
async fn elector_client(address: impl std::fmt::Display) -> ElectorClient<Channel> {
    ElectorClient::new(
        Pki::shared()
            .channel(Role::Observer, Role::Elector, address)
            .await
            .unwrap(),
    )
}

/// A queue member's registration in `etcd`, made with a queue member's certificate.
fn member(etcd: &Etcd, id: &str) -> ShutdownHandle {
    let (stop, drain) = drain_channel();
    join(
        etcd.connection(Role::Queue),
        Member {
            id: id.into(),
            address: format!("{id}:8443"),
        },
        LeaseTiming::default(),
        drain,
    )
    .unwrap();
    stop
}

async fn elector(etcd: &Etcd) -> (ServiceProcess, ElectorClient<Channel>) {
    let mut process = ServiceProcess::start(
        Path::new(env!("CARGO_BIN_EXE_switchyard-elector")),
        &[&format!("--shard-count={SHARDS}"), "--elector-id=e0"],
        &[("SWITCHYARD_ETCD_ENDPOINTS", etcd.endpoint())],
    )
    .await
    .unwrap();
    process.wait_ready().await.unwrap();
    let client = elector_client(process.grpc_addr()).await;
    (process, client)
}

async fn map_until(
    client: &mut ElectorClient<Channel>,
    pred: impl Fn(&ShardMap) -> bool,
) -> ShardMap {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(map) = client.get_shard_map(GetShardMapRequest {}).await {
            let map = map.into_inner();
            if pred(&map) {
                return map;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "shard map never got there"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn all_owned_by(map: &ShardMap, ids: &[&str]) -> bool {
    map.shards.len() == SHARDS as usize
        && map
            .shards
            .iter()
            .all(|s| s.state() == ShardState::Active && ids.contains(&s.member_id.as_str()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shard_map_is_served_watched_and_handed_over_through_grpc() {
    let etcd = Etcd::start().await.unwrap();
    let (process, mut client) = elector(&etcd).await;
    let _a = member(&etcd, "a");

    let map = map_until(&mut client, |m| all_owned_by(m, &["a"])).await;
    assert!(
        map.shards
            .iter()
            .all(|s| s.address == "a:8443" && s.epoch > 0)
    );
    assert_eq!(
        map.members,
        [ProtoMember {
            id: "a".into(),
            address: "a:8443".into(),
            draining: false,
        }]
    );

    let mut updates = client
        .watch_shard_map(WatchShardMapRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = updates.message().await.unwrap().unwrap();
    assert!(all_owned_by(&first, &["a"]));

    // b joins: the watch shows shards releasing from a, live.
    let b = member(&etcd, "b");
    let releasing = loop {
        let map = tokio::time::timeout(Duration::from_secs(15), updates.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let releasing: Vec<_> = map
            .shards
            .iter()
            .filter(|s| s.state() == ShardState::Releasing)
            .cloned()
            .collect();
        if !releasing.is_empty() {
            break releasing;
        }
    };
    // a releases each drained shard itself, fenced in etcd; the elector's map follows.
    let mut etcd_client = etcd.client().await.unwrap();
    for shard in &releasing {
        assert_eq!(shard.member_id, "a", "the live owner drains first");
        let next = store::release(&mut etcd_client, shard.shard, "a", shard.epoch)
            .await
            .unwrap();
        assert_eq!(next, "b");
    }
    map_until(&mut client, |m| {
        all_owned_by(m, &["a", "b"]) && m.shards.iter().any(|s| s.member_id == "b")
    })
    .await;

    // b leaves (its lease is revoked): its shards return to a at once.
    b.trigger();
    map_until(&mut client, |m| all_owned_by(m, &["a"])).await;

    let (status, log) = process.terminate().await.unwrap();
    assert!(status.success(), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_or_foreign_release_gets_a_clear_error_and_changes_nothing() {
    let etcd = Etcd::start().await.unwrap();
    let (_process, mut client) = elector(&etcd).await;
    let _a = member(&etcd, "a");
    let before = map_until(&mut client, |m| all_owned_by(m, &["a"])).await;
    let mut etcd_client = etcd.client().await.unwrap();
    let epoch = before.shards[0].epoch;

    let error = store::release(&mut etcd_client, 0, "a", epoch)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "shard 0 is not held by member \"a\"",
        "an active shard is not releasing"
    );
    let error = store::release(&mut etcd_client, 0, "ghost", epoch)
        .await
        .unwrap_err();
    assert!(matches!(error, ShardMapError::Release(_)), "{error}");
    let error = store::renew(&mut etcd_client, 0, "a", epoch + 1)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "stale epoch {} for shard 0 (current epoch {epoch})",
            epoch + 1
        )
    );
    let error = store::renew(&mut etcd_client, 0, "ghost", epoch)
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("not held by member \"ghost\""),
        "{error}"
    );

    let after = client
        .get_shard_map(GetShardMapRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after.shards, before.shards, "nothing changed");
}

/// A registered member (waits until it holds its lease); dropping the handle keeps it, and
/// triggering it leaves (the lease is revoked).
async fn registered(etcd: &Etcd, id: &str) -> ShutdownHandle {
    let (stop, drain) = drain_channel();
    let (mut state, _) = join(
        etcd.connection(Role::Queue),
        Member {
            id: id.into(),
            address: format!("{id}:8443"),
        },
        LeaseTiming::default(),
        drain,
    )
    .unwrap();
    state
        .wait_for(|s| matches!(s, LeaseState::Held { .. }))
        .await
        .unwrap();
    stop
}

async fn elector_process(etcd: &Etcd, id: &str) -> ServiceProcess {
    let mut process = ServiceProcess::start(
        Path::new(env!("CARGO_BIN_EXE_switchyard-elector")),
        &[
            &format!("--shard-count={SHARDS}"),
            &format!("--elector-id={id}"),
        ],
        &[("SWITCHYARD_ETCD_ENDPOINTS", etcd.endpoint())],
    )
    .await
    .unwrap();
    process.wait_ready().await.unwrap();
    process
}

/// `switchyard_elector_leader` of an elector process.
async fn leads(process: &ServiceProcess) -> bool {
    let (_, body) = process.admin_get("/metrics").await.unwrap();
    body.lines().any(|l| l == "switchyard_elector_leader 1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_by_a_follower_and_the_map_does_not_churn() {
    let etcd = Etcd::start().await.unwrap();
    // Both members are registered before the first assignment, so no shard waits for a
    // release that nobody here would perform.
    let _a = registered(&etcd, "a").await;
    let b = registered(&etcd, "b").await;
    let leader = elector_process(&etcd, "e0").await;
    let follower = elector_process(&etcd, "e1").await;
    let mut client = elector_client(follower.grpc_addr()).await;
    let before = map_until(&mut client, |m| {
        all_owned_by(m, &["a", "b"]) && m.shards.iter().any(|s| s.member_id == "b")
    })
    .await;
    assert!(leads(&leader).await, "the first elector leads");
    assert!(!leads(&follower).await, "one leader at a time");

    let _ = leader.kill();
    let killed = tokio::time::Instant::now();
    // Until the follower leads, and for two of its resync periods after, the map is exactly
    // what it was: same owners, same epochs.
    let mut took = None;
    while took.is_none() || killed.elapsed() < took.unwrap() + Duration::from_secs(2) {
        let map = client
            .get_shard_map(GetShardMapRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(map.shards, before.shards, "the map churned");
        if took.is_none() && leads(&follower).await {
            took = Some(killed.elapsed());
        }
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "the follower never took over"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = took.unwrap();
    println!("the follower leads {took:?} after the leader was killed");
    // The killed leader's election lease (2 s) expires first; etcd checks expiry every 500 ms.
    assert!(took <= Duration::from_secs(4), "took over after {took:?}");

    // The new leader keeps the map valid: b leaves, and b's shards go to a at new epochs
    // while a's keep theirs.
    b.trigger();
    let after = map_until(&mut client, |m| all_owned_by(m, &["a"])).await;
    for (old, new) in before.shards.iter().zip(&after.shards) {
        if old.member_id == "a" {
            assert_eq!(old.epoch, new.epoch, "shard {} churned", old.shard);
        } else {
            assert!(
                new.epoch > old.epoch,
                "shard {} moved at a new epoch",
                old.shard
            );
        }
    }
    let (status, log) = follower.terminate().await.unwrap();
    assert!(status.success(), "{log}");
}

/// An operator's client of the elector at `address` (`kubectl switchyard drain`).
async fn operator_client(address: impl std::fmt::Display) -> ElectorClient<Channel> {
    ElectorClient::new(
        Pki::shared()
            .channel(Role::Operator, Role::Elector, address)
            .await
            .unwrap(),
    )
}

/// Releases every shard `member` holds as releasing, as a drained queue replica does.
async fn release_all(etcd: &Etcd, map: &ShardMap, member: &str) {
    let mut etcd_client = etcd.client().await.unwrap();
    for shard in &map.shards {
        if shard.member_id == member && shard.state() == ShardState::Releasing {
            store::release(&mut etcd_client, shard.shard, member, shard.epoch)
                .await
                .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_member_hands_its_shards_over_and_gets_none_until_it_registers_again() {
    use switchyard_proto::elector::v1::DrainMemberRequest;
    let etcd = Etcd::start().await.unwrap();
    let _a = registered(&etcd, "a").await;
    let b = registered(&etcd, "b").await;
    let (process, mut client) = elector(&etcd).await;
    let mut operator = operator_client(process.grpc_addr()).await;
    let before = map_until(&mut client, |m| {
        all_owned_by(m, &["a", "b"]) && m.shards.iter().any(|s| s.member_id == "b")
    })
    .await;
    let held = before.shards.iter().filter(|s| s.member_id == "b").count();
    let drain = |member: &str, undo| DrainMemberRequest {
        member_id: member.into(),
        undo,
    };

    let answer = operator
        .drain_member(drain("b", false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.shards_held as usize, held);
    // Each of b's shards is released to a by the planned handover, none taken from it.
    let releasing = map_until(&mut client, |m| {
        m.shards.iter().all(|s| {
            (s.member_id == "a" && s.state() == ShardState::Active)
                || (s.member_id == "b"
                    && s.state() == ShardState::Releasing
                    && s.next_member_id == "a")
        }) && m.members.iter().any(|m| m.id == "b" && m.draining)
    })
    .await;
    release_all(&etcd, &releasing, "b").await;
    map_until(&mut client, |m| all_owned_by(m, &["a"])).await;
    // b stays registered and draining: nothing comes back to it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = map_until(&mut client, |m| all_owned_by(m, &["a"])).await;
    assert!(still.members.iter().any(|m| m.id == "b" && m.draining));

    // a is the last member not draining; an unknown member is not found.
    let last = operator.drain_member(drain("a", false)).await.unwrap_err();
    assert_eq!(last.code(), tonic::Code::FailedPrecondition, "{last:?}");
    assert!(last.message().contains("no other member"), "{last:?}");
    let unknown = operator
        .drain_member(drain("ghost", false))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");

    // b restarts: a new registration, which the mark does not name. It gets shards again.
    b.trigger();
    map_until(&mut client, |m| m.members.iter().all(|m| m.id != "b")).await;
    let _b = registered(&etcd, "b").await;
    let back = map_until(&mut client, |m| {
        m.shards
            .iter()
            .any(|s| s.next_member_id == "b" || s.member_id == "b")
    })
    .await;
    assert!(
        back.members.iter().any(|m| m.id == "b" && !m.draining),
        "{back:?}"
    );
    // The observer may not drain.
    let denied = client.drain_member(drain("b", false)).await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
}
