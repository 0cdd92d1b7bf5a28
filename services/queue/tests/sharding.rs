//! Three real queue replicas, an elector and a real etcd: the replicas split the shards, a
//! request for a shard served elsewhere is redirected to its owner, a killed replica's shards
//! are served elsewhere, a stopped replica hands its shards over, and no shard is ever served
//! by two replicas at once (checked from each replica's serve intervals).

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use prost::Message;
use switchyard_proto::{
    common::v1::{NotShardOwner, WorkKey},
    queue::v1::{EnqueueItem, EnqueueRequest},
};
use switchyard_queue_core::shard::shard_of;
use switchyard_runtime::Role;

use support::{RS, assert_no_two_owners, cluster, queue_client, until_all_served, until_served};
use tonic::Code;

const SHARDS: u32 = 16;

fn key(name: &str) -> WorkKey {
    WorkKey {
        controller: RS.into(),
        namespace: "default".into(),
        name: name.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_split_the_shards_and_redirect_to_the_owner() {
    let cluster = cluster(SHARDS).await;
    // Settled once the handovers of the joins are done: every replica serves some shards and
    // none more than ceil(16 / 3) + slack 1 (bounded-load rendezvous promises only the cap).
    let settled = |owners: &HashMap<u32, usize>| {
        (0..3).all(|i| (1..=7).contains(&owners.values().filter(|o| **o == i).count()))
    };
    let (_, owners) = until_served(&cluster, Duration::from_secs(15), settled).await;

    let shard = shard_of(RS, "default", "web", SHARDS);
    let owner = cluster.replicas[owners[&shard]].as_ref().unwrap();
    let other = cluster.replicas[(owners[&shard] + 1) % 3].as_ref().unwrap();
    let request = EnqueueRequest {
        batch_id: 1,
        shard,
        items: vec![EnqueueItem {
            key: Some(key("web")),
            ..Default::default()
        }],
    };
    let mut wrong = queue_client(Role::Watcher, other.grpc_addr())
        .await
        .unwrap();
    let status = wrong.enqueue(request.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    let detail = NotShardOwner::decode(status.details()).unwrap();
    assert_eq!(
        detail.owner_address,
        owner.grpc_addr().to_string(),
        "{status:?}"
    );
    assert!(detail.epoch > 0);
    let mut right = queue_client(Role::Watcher, owner.grpc_addr())
        .await
        .unwrap();
    assert_eq!(right.enqueue(request).await.unwrap().into_inner().added, 1);
    drop(cluster.etcd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_fails_over_a_stopped_one_hands_over_and_no_shard_has_two_owners() {
    let mut cluster = cluster(SHARDS).await;
    until_all_served(&cluster, Duration::from_secs(15)).await;

    let mut logs = Vec::new();
    let killed = cluster.replicas[1].take().unwrap();
    let killed_at = SystemTime::now();
    logs.push((killed.kill(), killed_at));
    let (failover, _) = until_all_served(&cluster, Duration::from_secs(10)).await;
    println!("failover after kill -9: {failover:?}");
    // The elector found the killed replica's port refusing connections and revoked its
    // registration: no wait for the 2 s lease (and etcd's 500 ms expiry tick).
    let counted = tokio::time::Instant::now() + Duration::from_secs(1);
    while cluster.members_found_gone.get() == 0 && tokio::time::Instant::now() < counted {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(cluster.members_found_gone.get(), 1);
    assert!(
        failover <= Duration::from_secs(1),
        "failover took {failover:?}"
    );

    let stopped = cluster.replicas[2].take().unwrap();
    let (status, log) = stopped.terminate().await.unwrap();
    assert!(status.success());
    let stopped_at = SystemTime::now();
    logs.push((log, stopped_at));
    let (handover, owners) = until_all_served(&cluster, Duration::from_secs(10)).await;
    println!("handover after SIGTERM: {handover:?}");
    assert!(owners.values().all(|o| *o == 0));

    let last = cluster.replicas[0].take().unwrap();
    let (_, log) = last.terminate().await.unwrap();
    logs.push((log, SystemTime::now()));

    let served = assert_no_two_owners(&logs);
    assert_eq!(served, SHARDS as usize, "every shard was served");
}

/// What a replica logs when it wakes past its member lease's deadline.
const LEASE_EXPIRED: &str = "member lease may have expired";

/// A frozen replica (SIGSTOP) still holds its port, so the elector has no proof that it is
/// gone: its shards move only when its lease expires, by which time it has stopped serving
/// on its own deadline. When it runs again it finds its lease lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_replica_is_not_taken_for_a_crashed_one() {
    let mut cluster = cluster(SHARDS).await;
    until_all_served(&cluster, Duration::from_secs(15)).await;

    let frozen = cluster.replicas[1].take().unwrap();
    frozen.pause();
    let (failover, _) = until_all_served(&cluster, Duration::from_secs(10)).await;
    println!("shards of a frozen replica served elsewhere after {failover:?}");
    assert_eq!(cluster.members_found_gone.get(), 0, "no proof, no revoke");
    // The replica renews every third of the 2 s TTL, so its lease has at least 1.33 s left
    // when it freezes.
    assert!(
        failover >= Duration::from_millis(1300),
        "shards moved after {failover:?}, before the lease could expire"
    );

    frozen.resume();
    // Woken, it finds its lease's deadline passed, unless the SIGTERM sent at once came
    // first: so it gets a moment before it is stopped.
    let noticed = tokio::time::Instant::now() + Duration::from_secs(10);
    while !frozen.log().contains(LEASE_EXPIRED) && tokio::time::Instant::now() < noticed {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, log) = frozen.terminate().await.unwrap();
    assert!(status.success(), "{status}: {log}");
    assert!(log.contains(LEASE_EXPIRED), "{log}");
    for replica in cluster.replicas.iter_mut().filter_map(Option::take) {
        let (status, _) = replica.terminate().await.unwrap();
        assert!(status.success());
    }
}
