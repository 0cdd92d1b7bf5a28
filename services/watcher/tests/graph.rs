//! The garbage collector's graph in the watcher, against the real control plane: objects of
//! every deletable resource are taken in (metadata only), an owner's deletion keys its
//! dependents by UID, the Cache API answers by UID, and bad requests are named.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use serde_json::json;
use switchyard_k8s::{Api, DeleteParams, PostParams, k8s_openapi::api::core::v1::ConfigMap};
use switchyard_proto::watcher::v1::{GetGraphNodeRequest, cache_client::CacheClient};
use switchyard_testenv::{ControlPlane, TestNamespace};
use tonic::Code;

use support::*;

const COLLECTOR: &str = "garbage-collector";
/// A reconciler identity of its own, not granted the graph.
const OTHER: &str = "vault-switchyard-reconciler";

async fn create(api: &Api<ConfigMap>, name: &str, owners: serde_json::Value) -> String {
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": owners}}))
            .unwrap();
    api.create(&PostParams::default(), &cm)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap()
}

#[tokio::test]
async fn the_graph_keys_dependents_of_a_deleted_owner_and_answers_by_uid() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "graph")
        .await
        .unwrap();
    let queue = support::queue(&[COLLECTOR], &[]).await;
    // The built-in reconciler's account may read the graph; another reconciler's account,
    // granted Secrets whole, may not.
    let config = format!(
        "shardCount: {SHARDS}\nnamespaces: {{include: [{}]}}\ngarbageCollector: {{}}
registrations:
  - {{serviceAccount: switchyard-reconciler, graph: true}}
  - serviceAccount: {OTHER}
    kinds: [{{apiVersion: v1, kind: Secret, objects: full}}]
",
        ns.name()
    );
    let watcher = support::watcher(plane, &config, &format!("--queue-addr={}", queue.grpc())).await;
    watcher.wait_ready(Duration::from_secs(60)).await;
    let mut worker = Worker::start(queue.grpc()).await;
    let mut cache = cache_client(watcher.grpc()).await;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    let owner = create(&cms, "owner", json!([])).await;
    let reference = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                            "uid": owner, "blockOwnerDeletion": true}]);
    let dependent = create(&cms, "dependent", reference).await;

    // Both are in the graph, the dependent indexed under its owner.
    let mut answer = None;
    for _ in 0..100 {
        let got = cache
            .get_graph_node(GetGraphNodeRequest { uid: owner.clone() })
            .await
            .unwrap()
            .into_inner();
        if got.node.is_some() && !got.dependents.is_empty() {
            answer = Some(got);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = answer.expect("the owner and its dependent in the graph");
    let node = answer.node.unwrap();
    assert_eq!(
        (node.name.as_str(), node.resource.as_str()),
        ("owner", "configmaps")
    );
    assert!(node.namespaced);
    assert_eq!(answer.dependents.len(), 1);
    let seen = &answer.dependents[0];
    assert_eq!(
        (seen.name.as_str(), seen.uid.as_str()),
        ("dependent", dependent.as_str())
    );
    assert!(seen.owner_references[0].block_owner_deletion);
    let of_dependent = cache
        .get_graph_node(GetGraphNodeRequest {
            uid: dependent.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(of_dependent.owners.len(), 1, "its owner, from the graph");

    // The graph names objects of every kind (Secrets too) and their owners: an account not
    // granted it is refused, naming the account and the grant.
    let mut other = CacheClient::new(reconciler_as(OTHER, watcher.grpc()).await);
    let status = match other
        .get_graph_node(GetGraphNodeRequest { uid: owner.clone() })
        .await
    {
        Ok(served) => panic!("the graph was served to {OTHER}: {:?}", served.into_inner()),
        Err(status) => status,
    };
    assert_eq!(
        status.code(),
        Code::PermissionDenied,
        "{}",
        status.message()
    );
    assert_eq!(
        status.message(),
        format!(
            "the garbage collector's graph is not granted to service account {OTHER:?} \
             (graph: true in the watcher configuration's registrations)"
        )
    );

    // The owner goes: its dependent's key (by UID) is sent.
    cms.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    worker
        .expect(
            &key(COLLECTOR, ns.name(), &dependent),
            Duration::from_secs(20),
        )
        .await;

    // Bad requests name the field; an unknown UID is simply absent.
    let status = cache
        .get_graph_node(GetGraphNodeRequest { uid: String::new() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "uid: required");
    let status = cache
        .get_graph_node(GetGraphNodeRequest {
            uid: "u".repeat(129),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().starts_with("uid: 129 characters"),
        "{}",
        status.message()
    );
    let absent = cache
        .get_graph_node(GetGraphNodeRequest {
            uid: "no-such-uid".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(absent.node.is_none() && absent.dependents.is_empty());

    watcher.stop().await;
    queue.stop().await;
}

#[tokio::test]
async fn a_watcher_without_a_graph_says_so() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "nograph")
        .await
        .unwrap();
    let queue = support::queue(&[RS], &[]).await;
    let watcher = support::watcher(
        plane,
        &rs_config(ns.name(), false),
        &format!("--queue-addr={}", queue.grpc()),
    )
    .await;
    watcher.wait_ready(Duration::from_secs(60)).await;
    let status = cache_client(watcher.grpc())
        .await
        .get_graph_node(GetGraphNodeRequest { uid: "u".into() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert!(
        status.message().contains("garbageCollector"),
        "{}",
        status.message()
    );
    watcher.stop().await;
    queue.stop().await;
}
