//! With an elector, the watcher sends each key to its shard's owner, and when a shard moves
//! it re-sends that shard's keys from its cache: the new owner starts empty, and nothing is
//! left unreconciled. Real etcd, elector, two queue members and the control plane.

#![allow(clippy::unwrap_used)]

mod support;

use std::{collections::HashSet, time::Duration};

use clap::Parser;
use switchyard_k8s::{Api, PostParams, ReplicaSet};
use switchyard_proto::elector::v1::{GetShardMapRequest, ShardState};
use switchyard_runtime::Role;
use switchyard_testenv::{ControlPlane, Etcd, Pki, TestNamespace};

use support::*;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until every shard is active and owned by one of `members`.
async fn until_assigned(elector: &str, members: &[&str]) {
    let start = std::time::Instant::now();
    loop {
        if let Ok(mut client) = elector_client(elector).await
            && let Ok(map) = client.get_shard_map(GetShardMapRequest {}).await
        {
            let map = map.into_inner();
            let owners: HashSet<&str> = map.shards.iter().map(|s| s.member_id.as_str()).collect();
            let all_active = map.shards.len() == SHARDS as usize
                && map
                    .shards
                    .iter()
                    .all(|s| s.state == ShardState::Active as i32);
            if all_active && owners == members.iter().copied().collect() {
                return;
            }
        }
        assert!(
            start.elapsed() < WITHIN,
            "shards not assigned to {members:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn member(etcd: &Etcd, elector: &str, id: &str) -> InProcess {
    queue(
        &[RS],
        &[
            &format!("--member-id={id}"),
            &format!("--etcd-endpoints={}", etcd.endpoint()),
            &format!("--elector-addr={elector}"),
        ],
    )
    .await
}

#[tokio::test]
async fn a_moved_shard_is_resynced_to_its_new_owner() {
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watch-shards")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let etcd = Etcd::start().await.unwrap();
    let elector = format!("127.0.0.1:{}", free_port());
    let elector_args = switchyard_elector::Args::try_parse_from(
        [
            "switchyard-elector".to_owned(),
            "--admin-addr=127.0.0.1:0".into(),
            format!("--grpc-addr={elector}"),
            format!("--etcd-endpoints={}", etcd.endpoint()),
            format!("--shard-count={SHARDS}"),
            "--elector-id=e0".into(),
        ]
        .into_iter()
        .chain(Pki::shared().flags(Role::Elector)),
    )
    .unwrap();
    let elector_task = tokio::spawn(elector_args.run());
    let q0 = member(&etcd, &elector, "q0").await;
    let q1 = member(&etcd, &elector, "q1").await;
    until_assigned(&elector, &["q0", "q1"]).await;
    let mut w0 = Worker::start(q0.grpc()).await;
    let mut w1 = Worker::start(q1.grpc()).await;

    let watcher = watcher(
        plane,
        &rs_config(&ns, false),
        &format!("--elector-addr={elector}"),
    )
    .await;
    watcher.wait_ready(WITHIN).await;
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    let names: Vec<String> = (0..24).map(|i| format!("rs-{i}")).collect();
    for name in &names {
        sets.create(&PostParams::default(), &replica_set(name, 0))
            .await
            .unwrap();
    }
    // Every key reaches the owner of its shard, and nothing else does.
    let wanted: HashSet<String> = names.iter().map(|n| key(RS, &ns, n)).collect();
    let mut at_q0 = HashSet::new();
    let mut at_q1 = HashSet::new();
    let start = std::time::Instant::now();
    while at_q0.union(&at_q1).count() < wanted.len() {
        assert!(
            start.elapsed() < WITHIN,
            "keys missing: {at_q0:?} {at_q1:?}"
        );
        at_q0.extend(w0.leased_during(Duration::from_millis(100)).await);
        at_q1.extend(w1.leased_during(Duration::from_millis(100)).await);
    }
    assert!(at_q0.is_disjoint(&at_q1), "a key reached both owners");
    assert!(
        !at_q0.is_empty() && !at_q1.is_empty(),
        "keys did not spread over shards"
    );

    // q0 leaves gracefully: its shards move to q1, which starts them empty. The watcher
    // re-sends their keys without any object changing.
    let resyncs = r#"switchyard_watcher_resyncs_total{reason="shard_moved"}"#;
    let before = watcher.metric(resyncs).await;
    q0.stop().await;
    until_assigned(&elector, &["q1"]).await;
    let moved: Vec<String> = at_q0.into_iter().collect();
    w1.expect_all(&moved, WITHIN).await;
    assert!(watcher.metric(resyncs).await > before);

    watcher.stop().await;
    q1.stop().await;
    elector_task.abort();
}
