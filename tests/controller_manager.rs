//! The harness starts kube-controller-manager with a chosen set of controllers: here only
//! its ReplicaSet controller, which must create the Pods a ReplicaSet asks for.

use switchyard_k8s::{
    Pod, PostParams, ReplicaSet,
    kube::{Api, api::ListParams},
};
use switchyard_testenv::{ControlPlane, TestNamespace};
use switchyard_tests::{CONVERGE_TIMEOUT, pod_template};

#[tokio::test]
async fn kube_controller_manager_runs_only_the_chosen_controllers() {
    let plane = ControlPlane::shared().expect("control plane");
    let _kcm = plane
        .start_controller_manager(&["replicaset-controller"], &[])
        .await
        .expect("kube-controller-manager starts");
    let client = plane.client().await.expect("client");
    let ns = TestNamespace::create(plane, &client, "kcm")
        .await
        .expect("namespace");

    let labels = serde_json::json!({"app": "kcm-web"});
    let rs: ReplicaSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kcm-web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": pod_template(&labels),
        },
    }))
    .expect("replicaset");
    let rs_api: Api<ReplicaSet> = Api::namespaced(client.clone(), ns.name());
    rs_api
        .create(&PostParams::default(), &rs)
        .await
        .expect("create replicaset");

    let ready = |rs: Option<&ReplicaSet>| {
        rs.and_then(|rs| rs.status.as_ref())
            .is_some_and(|s| s.ready_replicas == Some(2) && s.available_replicas == Some(2))
    };
    tokio::time::timeout(
        CONVERGE_TIMEOUT,
        switchyard_k8s::await_condition(rs_api.clone(), "kcm-web", ready),
    )
    .await
    .expect("the ReplicaSet reports 2 ready replicas in time")
    .expect("watch");

    let pods = Api::<Pod>::namespaced(client, ns.name())
        .list(&ListParams::default().labels("app=kcm-web"))
        .await
        .expect("list pods");
    assert_eq!(pods.items.len(), 2);
    for pod in &pods.items {
        let owner = pod
            .metadata
            .owner_references
            .as_ref()
            .and_then(|o| o.iter().find(|o| o.controller == Some(true)))
            .expect("controller owner reference");
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("ReplicaSet", "kcm-web")
        );
    }

    // Only the chosen controller runs: no Deployment controller turns a Deployment into a
    // ReplicaSet. (The namespace controller is absent too, so nothing else touches it.)
    let deployments = plane
        .kubectl()
        .args([
            "create",
            "deployment",
            "nobody-reconciles-me",
            "--image=registry.invalid/x:1",
        ])
        .args(["--namespace", ns.name()])
        .output()
        .expect("kubectl create deployment");
    assert!(deployments.status.success());
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let replicasets = rs_api.list(&ListParams::default()).await.expect("list");
    assert_eq!(
        replicasets.items.len(),
        1,
        "only the test's own ReplicaSet exists: no deployment controller is running"
    );
}
