//! The elector against a real etcd: one leader keeps the shard map in step with the live
//! members; joins hand shards over through a fenced release; a crashed member's shards move
//! at once when its lease expires; a crashed leader is replaced without churning the map.

#![allow(clippy::unwrap_used)]

use std::{collections::HashMap, time::Duration};

use etcd_client::Client;
use switchyard_elector::{
    leader::{self, LeaderConfig},
    shardmap,
};
use switchyard_elector_core::{ShardState, Transition, plan};
use switchyard_runtime::{Role, ShutdownHandle, drain_channel};
use switchyard_shards::{
    member::{LeaseState, LeaseTiming, Member, join},
    store,
};
use switchyard_testenv::{Etcd, Pki};
use tokio::sync::watch;

const SHARDS: u32 = 16;

struct Running {
    _stop: ShutdownHandle,
    task: tokio::task::JoinHandle<()>,
}

/// A registered member (waits until it holds its lease), with a queue member's certificate.
async fn member(etcd: &Etcd, id: &str) -> Running {
    let (stop, drain) = drain_channel();
    let (mut state, task) = join(
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
    Running { _stop: stop, task }
}

/// An elector's leader loop, with the elector's certificate for etcd and for its probes.
fn elector(etcd: &Etcd, id: &str) -> (Running, watch::Receiver<bool>) {
    let (stop, drain) = drain_channel();
    let (leading, rx) = watch::channel(false);
    let config = LeaderConfig::new(id, SHARDS);
    let task = tokio::spawn(leader::run(
        etcd.connection(Role::Elector),
        Pki::shared().dialer(Role::Elector),
        config,
        leading,
        drain,
    ));
    (Running { _stop: stop, task }, rx)
}

async fn map(client: &mut Client) -> Vec<ShardState> {
    shardmap::read(client, SHARDS).await.unwrap().0
}

/// Polls the map until `pred` holds (the map changes through etcd writes we cannot await).
async fn map_until(
    client: &mut Client,
    within: Duration,
    pred: impl Fn(&[ShardState]) -> bool,
) -> Vec<ShardState> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let current = map(client).await;
        if pred(&current) {
            return current;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "map never got there: {current:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn owners(map: &[ShardState]) -> HashMap<String, usize> {
    let mut load = HashMap::new();
    for state in map {
        if let ShardState::Active { owner, .. } = state {
            *load.entry(owner.clone()).or_insert(0) += 1;
        }
    }
    load
}

fn all_active_among(map: &[ShardState], ids: &[&str]) -> bool {
    map.iter()
        .all(|s| matches!(s, ShardState::Active { owner, .. } if ids.contains(&owner.as_str())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_assigns_hands_over_and_reassigns_a_crashed_members_shards() {
    let etcd = Etcd::start().await.unwrap();
    let mut client = etcd.client().await.unwrap();
    // Both members are registered before the first assignment; nobody here plays an owner
    // that would release shards to a later member (the test does that by hand below).
    let _a = member(&etcd, "a").await;
    let b = member(&etcd, "b").await;
    let (_elector, mut leading) = elector(&etcd, "elector-0");
    leading.wait_for(|l| *l).await.unwrap();
    let first = map_until(&mut client, Duration::from_secs(10), |m| {
        all_active_among(m, &["a", "b"])
    })
    .await;
    assert!(
        owners(&first).values().all(|n| *n <= 9),
        "balanced: {:?}",
        owners(&first)
    );

    // A third member joins: the shards it should take are first released by their live owners.
    let _c = member(&etcd, "c").await;
    let releasing = map_until(&mut client, Duration::from_secs(10), |m| {
        m.iter()
            .any(|s| matches!(s, ShardState::Releasing { next, .. } if next == "c"))
    })
    .await;
    for (shard, state) in releasing.iter().enumerate() {
        let ShardState::Releasing { owner, epoch, next } = state else {
            continue;
        };
        let shard = shard as u32;
        // Bad releases are refused and change nothing.
        let stale = store::release(&mut client, shard, owner, epoch + 1)
            .await
            .unwrap_err();
        assert!(stale.to_string().starts_with("stale epoch"), "{stale}");
        let stranger = store::release(&mut client, shard, "nobody", *epoch)
            .await
            .unwrap_err();
        assert!(
            stranger
                .to_string()
                .contains("not held by member \"nobody\""),
            "{stranger}"
        );
        assert_eq!(&map(&mut client).await[shard as usize], state);
        // The owner drained: it hands the shard over.
        assert_eq!(
            &store::release(&mut client, shard, owner, *epoch)
                .await
                .unwrap(),
            next
        );
        let ShardState::Active {
            owner: now,
            epoch: new_epoch,
        } = &map(&mut client).await[shard as usize]
        else {
            panic!("shard {shard} active after the release");
        };
        assert_eq!(now, "c");
        assert!(new_epoch > epoch, "epochs only grow");
    }
    let balanced = map_until(&mut client, Duration::from_secs(10), |m| {
        all_active_among(m, &["a", "b", "c"])
    })
    .await;
    assert!(
        owners(&balanced).values().all(|n| *n <= 7),
        "{:?}",
        owners(&balanced)
    );

    // b crashes: when its lease expires its shards move at once, no release needed.
    let held_by_b: Vec<usize> = balanced
        .iter()
        .enumerate()
        .filter(|(_, s)| s.owner() == Some("b"))
        .map(|(i, _)| i)
        .collect();
    b.task.abort();
    let after = map_until(&mut client, Duration::from_secs(10), |m| {
        all_active_among(m, &["a", "c"])
    })
    .await;
    for shard in held_by_b {
        let (ShardState::Active { epoch: old, .. }, ShardState::Active { epoch: new, .. }) =
            (&balanced[shard], &after[shard])
        else {
            unreachable!()
        };
        assert!(new > old);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_leader_is_replaced_without_churning_the_map() {
    let etcd = Etcd::start().await.unwrap();
    let mut client = etcd.client().await.unwrap();
    let _a = member(&etcd, "a").await;
    let _b = member(&etcd, "b").await;
    let (first, mut first_leads) = elector(&etcd, "elector-0");
    first_leads.wait_for(|l| *l).await.unwrap();
    let (_second, mut second_leads) = elector(&etcd, "elector-1");
    let before = map_until(&mut client, Duration::from_secs(10), |m| {
        all_active_among(m, &["a", "b"])
    })
    .await;
    assert!(!*second_leads.borrow(), "one leader at a time");

    first.task.abort();
    let started = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(10), second_leads.wait_for(|l| *l))
        .await
        .unwrap()
        .unwrap();
    // The old leader's lease (2 s) had to expire first.
    let took = started.elapsed();
    assert!(took <= Duration::from_secs(4), "took over after {took:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(map(&mut client).await, before, "same owners, same epochs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_larger_than_one_etcd_transaction_is_written_whole() {
    let etcd = Etcd::start().await.unwrap();
    let mut client = etcd.client().await.unwrap();
    let (stop, drain) = drain_channel();
    let (leading, _) = watch::channel(false);
    let config = LeaderConfig::new("elector", 1024);
    tokio::spawn(leader::run(
        etcd.connection(Role::Elector),
        Pki::shared().dialer(Role::Elector),
        config,
        leading,
        drain,
    ));
    let _a = member(&etcd, "a").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (map, _) = shardmap::read(&mut client, 1024).await.unwrap();
        if map.iter().all(|s| s.owner() == Some("a")) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "1024 shards not all assigned"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.trigger();
}

/// The leader plans from a read of the map and a watch of the members, and writes a moment
/// later. Meanwhile an owner may release a shard, renew its epoch, or register again under
/// its id. A write planned from the older view must not land on any of those: it would move
/// a shard away from a live owner without that owner's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_from_a_stale_view_moves_no_live_owners_shard() {
    let etcd = Etcd::start().await.unwrap();
    let mut client = etcd.client().await.unwrap();
    let _a = member(&etcd, "a").await;
    let _b = member(&etcd, "b").await;
    let _c = member(&etcd, "c").await;
    // Stands in for the leader's election key: the writes below are fenced on it.
    let leader_key = b"/switchyard/elector/test-leader".to_vec();
    client
        .put(leader_key.clone(), "leader", None)
        .await
        .unwrap();
    let abc: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
    let activate = |shard, owner: &str| Transition::Activate {
        shard,
        owner: owner.into(),
        gone: None,
    };

    // Shard 0 releasing from a to b, shards 1 and 2 active at b, shard 3 unassigned.
    let (current, revision) = shardmap::read(&mut client, SHARDS).await.unwrap();
    let setup = [activate(0, "a"), activate(1, "b"), activate(2, "b")];
    shardmap::apply(&mut client, &leader_key, &current, revision, &setup)
        .await
        .unwrap();
    let (current, revision) = shardmap::read(&mut client, SHARDS).await.unwrap();
    let release = Transition::Release {
        shard: 0,
        owner: "a".into(),
        next: "b".into(),
    };
    shardmap::apply(&mut client, &leader_key, &current, revision, &[release])
        .await
        .unwrap();

    // The leader reads the map ...
    let (stale, revision) = shardmap::read(&mut client, SHARDS).await.unwrap();
    let ShardState::Releasing { epoch: a_epoch, .. } = stale[0].clone() else {
        panic!("shard 0 releasing: {:?}", stale[0]);
    };
    let ShardState::Active { epoch: b_epoch, .. } = stale[1].clone() else {
        panic!("shard 1 active: {:?}", stale[1]);
    };
    // ... a hands shard 0 over to b, and b renews the epoch of shard 1 (as a restarted
    // member does) ...
    assert_eq!(
        store::release(&mut client, 0, "a", a_epoch).await.unwrap(),
        "b"
    );
    store::renew(&mut client, 1, "b", b_epoch).await.unwrap();
    let (now, _) = shardmap::read(&mut client, SHARDS).await.unwrap();

    // ... and the leader's plan from what it read: shards 0 and 1 should go to c, and its
    // member watch, behind etcd, has not seen b (registered all along) yet, so shard 2 looks
    // orphaned.
    let mut desired = vec!["a".to_owned(); SHARDS as usize];
    desired[0] = "c".into();
    desired[1] = "c".into();
    desired[2] = "c".into();
    let lagging: Vec<Transition> = plan(&stale, &desired, &["a".into(), "c".into()])
        .into_iter()
        .filter(|t| t.shard() == 2)
        .collect();
    let over_b = Transition::Activate {
        shard: 2,
        owner: "c".into(),
        gone: Some("b".into()),
    };
    assert_eq!(lagging, [over_b], "b looks gone");
    let all: Vec<Transition> = plan(&stale, &desired, &abc)
        .into_iter()
        .filter(|t| t.shard() != 2)
        .chain(lagging)
        .collect();
    let applied = shardmap::apply(&mut client, &leader_key, &stale, revision, &all)
        .await
        .unwrap();
    assert_eq!(applied.stale, [0, 1, 2], "{applied:?}");
    assert_eq!(applied.written, all.len() - 3, "{applied:?}");

    let after = map(&mut client).await;
    // b serves shards 0, 1 and 2, which are its own until it releases them.
    let moved: Vec<(&str, &ShardState, &ShardState)> = [
        "a release landed after the read",
        "a renewal landed after the read",
        "b is registered",
    ]
    .into_iter()
    .zip(after.iter().zip(&now))
    .filter(|(_, (after, now))| after != now)
    .map(|(why, (after, now))| (why, now, after))
    .collect();
    assert!(
        moved.is_empty(),
        "moved from b without its release: {moved:#?}"
    );
    // The rest of the plan still lands.
    assert_eq!(after[3].owner(), Some("a"));
}
