//! etcd's own RBAC on the harness's etcd (`switchyard_shards::access`): etcd names a client
//! by its certificate's CN, and only the queue's and the elector's have a user there. A
//! watcher, reconciler or observer certificate, valid for the installation's CA and accepted
//! by etcd's TLS, can neither read nor write the shard map or the members.

#![allow(clippy::unwrap_used)]

use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use switchyard_runtime::Role;
use switchyard_shards::{
    access::ELECTION,
    member::MEMBERS_PREFIX,
    store::{SHARDS_PREFIX, shard_key},
};
use switchyard_testenv::Etcd;

const OWNED: &str = r#"{"state":"active","owner":"q-0"}"#;
const FORGED: &str = r#"{"state":"active","owner":"thief"}"#;

fn denied(what: &str, result: Result<impl std::fmt::Debug, etcd_client::Error>) {
    match result {
        Err(etcd_client::Error::GRpcStatus(status))
            if status.code() == tonic::Code::PermissionDenied => {}
        other => panic!("{what}: expected permission denied, got {other:?}"),
    }
}

async fn value(client: &mut Client, key: &str) -> Option<String> {
    let response = client.get(key, None).await.unwrap();
    response
        .kvs()
        .first()
        .map(|kv| kv.value_str().unwrap().to_owned())
}

#[tokio::test]
async fn only_queue_and_elector_certificates_reach_switchyards_keys_in_etcd() {
    let etcd = Etcd::start().await.unwrap();
    let shard = shard_key(3);
    let member = format!("{MEMBERS_PREFIX}q-0");

    // A queue member registers under its lease and writes its shard record, fenced.
    let mut queue = etcd.connection(Role::Queue).connect().await.unwrap();
    let lease = queue.lease_grant(5, None).await.unwrap().id();
    queue
        .put(
            member.clone(),
            "q-0.queue:8443",
            Some(PutOptions::new().with_lease(lease)),
        )
        .await
        .unwrap();
    queue
        .put(shard.clone(), r#"{"state":"active","owner":"q-1"}"#, None)
        .await
        .unwrap();
    let revision = queue.get(shard.clone(), None).await.unwrap().kvs()[0].mod_revision();
    let fenced = Txn::new()
        .when([Compare::mod_revision(
            shard.clone(),
            CompareOp::Equal,
            revision,
        )])
        .and_then([TxnOp::put(shard.clone(), OWNED, None)]);
    assert!(queue.txn(fenced).await.unwrap().succeeded());
    assert_eq!(value(&mut queue, &shard).await.as_deref(), Some(OWNED));
    // ... but neither campaigns nor reads the members (it has no need to).
    denied(
        "queue campaigns",
        queue.put(format!("{ELECTION}/1"), "q-0", None).await,
    );
    denied(
        "queue lists the members",
        queue
            .get(MEMBERS_PREFIX, Some(GetOptions::new().with_prefix()))
            .await,
    );

    // The elector reads both and writes the map.
    let mut elector = etcd.connection(Role::Elector).connect().await.unwrap();
    assert_eq!(
        value(&mut elector, &member).await.as_deref(),
        Some("q-0.queue:8443")
    );
    elector.put(shard.clone(), OWNED, None).await.unwrap();
    elector
        .put(format!("{ELECTION}/1"), "e-0", None)
        .await
        .unwrap();

    for role in [Role::Watcher, Role::Reconciler, Role::Observer] {
        let mut client = etcd.connection(role).connect().await.unwrap();
        denied(
            &format!("{role:?} reads the shard map"),
            client
                .get(SHARDS_PREFIX, Some(GetOptions::new().with_prefix()))
                .await,
        );
        denied(
            &format!("{role:?} writes a shard"),
            client.put(shard.clone(), FORGED, None).await,
        );
        denied(
            &format!("{role:?} registers a member"),
            client
                .put(format!("{MEMBERS_PREFIX}thief"), "x", None)
                .await,
        );
        denied(
            &format!("{role:?} revokes a member's lease"),
            client.lease_revoke(lease).await,
        );
        denied(
            &format!("{role:?} writes outside the prefixes"),
            client.put("/elsewhere", "x", None).await,
        );
    }

    // Nothing changed: the admin sees the queue's record and the member still registered.
    let mut admin = etcd.client().await.unwrap();
    assert_eq!(value(&mut admin, &shard).await.as_deref(), Some(OWNED));
    assert_eq!(
        value(&mut admin, &member).await.as_deref(),
        Some("q-0.queue:8443")
    );
    assert_eq!(
        value(&mut admin, &format!("{MEMBERS_PREFIX}thief")).await,
        None
    );
}
