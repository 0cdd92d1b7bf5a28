//! The watcher loses no change across a kube-apiserver outage, nor across a 410 Gone that
//! forces a relist. Changes are made through a second apiserver on the same etcd while the
//! watcher's own apiserver is down. Its own test binary: it stops the shared apiserver.

#![allow(clippy::unwrap_used)]

mod support;

use switchyard_k8s::{
    Api, DeleteParams, PostParams, ReplicaSet,
    kube::api::{Patch, PatchParams},
};
use switchyard_testenv::{ControlPlane, TestNamespace};

use support::*;

#[tokio::test]
async fn no_change_is_lost_across_an_apiserver_restart_or_a_410() {
    let plane = ControlPlane::shared().unwrap();
    let client = plane.client().await.unwrap();
    let second = plane.start_second_apiserver().await.unwrap();
    let other = second.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "watch-outage")
        .await
        .unwrap();
    let ns = ns.name().to_owned();
    let queue = queue(&[RS], &[]).await;
    let mut worker = Worker::start(queue.grpc()).await;
    let watcher = watcher(
        plane,
        &rs_config(&ns, false),
        &format!("--queue-addr={}", queue.grpc()),
    )
    .await;
    watcher.wait_ready(WITHIN).await;

    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    for name in ["keep", "change", "remove"] {
        sets.create(&PostParams::default(), &replica_set(name, 0))
            .await
            .unwrap();
    }
    let k = |name: &str| key(RS, &ns, name);
    worker
        .expect_all(&[k("keep"), k("change"), k("remove")], WITHIN)
        .await;

    // 1. The watcher's apiserver goes away; objects change meanwhile.
    let through_other: Api<ReplicaSet> = Api::namespaced(other.clone(), &ns);
    let scale = |n: i32| Patch::Merge(serde_json::json!({"spec": {"replicas": n}}));
    plane.stop_apiserver();
    through_other
        .patch("change", &PatchParams::default(), &scale(3))
        .await
        .unwrap();
    through_other
        .delete("remove", &DeleteParams::default())
        .await
        .unwrap();
    through_other
        .create(&PostParams::default(), &replica_set("new", 0))
        .await
        .unwrap();
    plane.restart_apiserver().await.unwrap();
    worker
        .expect_all(&[k("change"), k("remove"), k("new")], WITHIN)
        .await;

    // 2. Again, and this time etcd is compacted past the watcher's resourceVersion, so its
    //    watch cannot resume (410 Gone) and it must relist and diff against its cache.
    let relists = r#"switchyard_watch_relists_total{resource="apps/v1/ReplicaSet"}"#;
    let relists_before = watcher.metric(relists).await;
    plane.stop_apiserver();
    through_other
        .patch("keep", &PatchParams::default(), &scale(2))
        .await
        .unwrap();
    through_other
        .delete("new", &DeleteParams::default())
        .await
        .unwrap();
    through_other
        .create(&PostParams::default(), &replica_set("newer", 0))
        .await
        .unwrap();
    plane.compact_etcd().unwrap();
    plane.restart_apiserver().await.unwrap();
    worker
        .expect_all(&[k("keep"), k("new"), k("newer")], WITHIN)
        .await;
    assert!(
        watcher.metric(relists).await > relists_before,
        "the watch resumed instead of relisting after compaction"
    );

    // The cache agrees with the apiserver afterwards.
    let mut cache = cache_client(watcher.grpc()).await;
    let listed = cache
        .list(switchyard_proto::watcher::v1::ListRequest {
            gvk: Some(switchyard_proto::common::v1::GroupVersionKind {
                group: "apps".into(),
                version: "v1".into(),
                kind: "ReplicaSet".into(),
            }),
            namespace: ns.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap()
        .unwrap();
    let mut names: Vec<String> = listed
        .objects_json
        .iter()
        .map(|json| {
            let value: serde_json::Value = serde_json::from_slice(json).unwrap();
            value["metadata"]["name"].as_str().unwrap().to_owned()
        })
        .collect();
    names.sort();
    assert_eq!(names, ["change", "keep", "newer"]);

    watcher.stop().await;
    queue.stop().await;
}
