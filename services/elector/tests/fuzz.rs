//! Every gRPC handler of the elector, driven with arbitrary requests by every identity of
//! the installation, against a real etcd with two queue members registered: no request
//! stops the elector, which still serves the shard map and drains a member afterwards.
//! Bounded (a few hundred calls), so it runs in `make test`.

#![allow(clippy::unwrap_used)]

use std::{path::Path, time::Duration};

use proptest::{prelude::*, strategy::ValueTree, test_runner::TestRunner};
use switchyard_proto::elector::v1::{
    DrainMemberRequest, GetShardMapRequest, WatchShardMapRequest, elector_client::ElectorClient,
};
use switchyard_runtime::{Role, drain_channel};
use switchyard_shards::member::{LeaseTiming, Member, join};
use switchyard_testenv::{Etcd, Pki, ServiceProcess};
use tonic::transport::Channel;

const SHARDS: u32 = 8;
const CASES: u32 = 300;
const MEMBERS: [&str; 2] = ["q0", "q1"];

/// A member id as a caller may send it: empty, a registered one, any Unicode, an etcd key
/// of its own or of another prefix, oversized.
fn member_id() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just(MEMBERS[0].to_owned()),
        Just(MEMBERS[1].to_owned()),
        ".{0,24}",
        Just("/switchyard/shards/0".to_owned()),
        Just("../../elector".to_owned()),
        Just("q0\0".to_owned()),
        (1000usize..5000).prop_map(|n| "m".repeat(n)),
    ]
}

#[derive(Clone, Debug)]
enum Call {
    Get,
    Watch,
    Drain(String, bool),
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        Just(Call::Get),
        Just(Call::Watch),
        (member_id(), any::<bool>()).prop_map(|(id, undo)| Call::Drain(id, undo)),
    ]
}

async fn make(client: &mut ElectorClient<Channel>, call: Call) {
    // Refusals are expected; only the elector's survival is asserted.
    match call {
        Call::Get => drop(client.get_shard_map(GetShardMapRequest {}).await),
        Call::Watch => {
            if let Ok(response) = client.watch_shard_map(WatchShardMapRequest {}).await {
                let mut stream = response.into_inner();
                let _ = tokio::time::timeout(Duration::from_millis(20), stream.message()).await;
            }
        }
        Call::Drain(member_id, undo) => drop(
            client
                .drain_member(DrainMemberRequest { member_id, undo })
                .await,
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbitrary_calls_from_every_identity_leave_the_elector_serving() {
    let etcd = Etcd::start().await.unwrap();
    let mut members = Vec::new();
    for id in MEMBERS {
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
        members.push(stop);
    }
    let mut process = ServiceProcess::start(
        Path::new(env!("CARGO_BIN_EXE_switchyard-elector")),
        &[&format!("--shard-count={SHARDS}"), "--elector-id=e0"],
        &[("SWITCHYARD_ETCD_ENDPOINTS", etcd.endpoint())],
    )
    .await
    .unwrap();
    process.wait_ready().await.unwrap();
    let mut clients = Vec::new();
    for role in Role::ALL {
        let channel = Pki::shared()
            .channel(role, Role::Elector, process.grpc_addr())
            .await
            .unwrap();
        clients.push(ElectorClient::new(channel));
    }

    let mut runner = TestRunner::new(ProptestConfig {
        cases: CASES,
        ..ProptestConfig::default()
    });
    let strategy = (0..Role::ALL.len(), call());
    for _ in 0..CASES {
        let (who, call) = strategy.new_tree(&mut runner).unwrap().current();
        make(&mut clients[who], call).await;
    }

    // Alive, and serving: the whole map to an observer, and a drain and its undo to the
    // operator.
    let (status, body) = process.admin_get("/livez").await.unwrap();
    assert_eq!((status, body.as_str()), (200, "ok\n"), "{}", process.log());
    let map = clients[4]
        .get_shard_map(GetShardMapRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(map.shard_count, SHARDS);
    let operator = &mut clients[5];
    // The fuzz may have left either member draining: both undone first.
    for (member, undo) in [(1, true), (0, true), (0, false), (0, true)] {
        operator
            .drain_member(DrainMemberRequest {
                member_id: MEMBERS[member].into(),
                undo,
            })
            .await
            .unwrap();
    }
    for stop in members {
        stop.trigger();
    }
    let (status, log) = process.terminate().await.unwrap();
    assert!(status.success(), "{log}");
}
