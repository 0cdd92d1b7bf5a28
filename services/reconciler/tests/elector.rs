//! With an elector, the reconciler leases from every queue replica of the shard map and keeps
//! reconciling when a replica leaves. Real etcd, elector, two queue members, a watcher
//! following the same map, and the control plane.

#![allow(clippy::unwrap_used)]

mod support;

use std::{collections::HashSet, time::Duration};

use clap::Parser;
use futures::future::join_all;
use serde_json::json;
use switchyard_k8s::{
    Api, Pod, PostParams, ReplicaSet,
    kube::api::{Patch, PatchParams},
};
use switchyard_proto::elector::v1::{GetShardMapRequest, ShardMap, ShardState};
use switchyard_runtime::Role;
use switchyard_testenv::{ControlPlane, Etcd, Pki, TestNamespace};
use switchyard_work::shard::shard_of;

use support::{RS, SHARDS, WITHIN, converged, replica_set};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until every shard is active and owned by one of `members`; returns the map.
async fn until_assigned(elector: &str, members: &[&str]) -> ShardMap {
    let start = std::time::Instant::now();
    loop {
        if let Ok(mut client) = support::elector_client(elector).await
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
                return map;
            }
        }
        assert!(
            start.elapsed() < WITHIN,
            "shards not assigned to {members:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn member(etcd: &Etcd, elector: &str, id: &str) -> support::InProcess {
    support::queue(
        &[RS],
        &[
            &format!("--member-id={id}"),
            &format!("--etcd-endpoints={}", etcd.endpoint()),
            &format!("--elector-addr={elector}"),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_sets_on_every_queue_replica_converge_and_keep_converging_after_one_leaves() {
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "rs-elector")
        .await
        .unwrap();
    let etcd = Etcd::start().await.unwrap();
    let elector = format!("127.0.0.1:{}", free_port());
    let elector_task = tokio::spawn(
        switchyard_elector::Args::try_parse_from(
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
        .unwrap()
        .run(),
    );
    let q0 = member(&etcd, &elector, "q0").await;
    let q1 = member(&etcd, &elector, "q1").await;
    let map = until_assigned(&elector, &["q0", "q1"]).await;

    let route = format!("--elector-addr={elector}");
    let watcher =
        support::watcher_routed(plane, &support::watcher_config(&[ns.name()], ""), &route).await;
    watcher.wait_ready(WITHIN).await;
    let reconciler = support::reconciler_routed(
        plane,
        support::replica_set_controller(),
        &route,
        watcher.grpc(),
        &[&format!("--shard-count={SHARDS}")],
    )
    .await;
    reconciler.wait_ready(WITHIN).await;

    let names: Vec<String> = (0..8).map(|i| format!("rs-{i}")).collect();
    let owners: HashSet<&str> = names
        .iter()
        .map(|n| {
            let shard = shard_of(RS, ns.name(), n, SHARDS);
            map.shards[shard as usize].member_id.as_str()
        })
        .collect();
    assert_eq!(owners.len(), 2, "the keys spread over both queue replicas");

    let rs_api: Api<ReplicaSet> = Api::namespaced(client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    for name in &names {
        rs_api
            .create(&PostParams::default(), &replica_set(name, 2))
            .await
            .unwrap();
    }
    join_all(names.iter().map(|n| converged(&rs_api, &pods, n, 2))).await;

    // q0 leaves: its shards move to q1; the reconciler drains its stream to q0 and keeps
    // leasing from q1.
    q0.stop().await;
    until_assigned(&elector, &["q1"]).await;
    for name in &names {
        rs_api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 3}})),
            )
            .await
            .unwrap();
    }
    join_all(names.iter().map(|n| converged(&rs_api, &pods, n, 3))).await;

    reconciler.stop().await;
    watcher.stop().await;
    q1.stop().await;
    elector_task.abort();
}
