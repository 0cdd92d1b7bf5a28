//! The harness's control plane is a real one: the apiserver stores objects, kube-scheduler
//! binds Pods to kwok's Nodes, and kwok reports them Running and Ready.

use switchyard_k8s::{
    Node, Pod, PostParams,
    kube::{Api, api::ListParams},
};
use switchyard_testenv::{ControlPlane, TestNamespace};
use switchyard_tests::{await_pod_ready, pod_template};

#[tokio::test]
async fn a_pod_is_bound_to_a_kwok_node_and_becomes_running_and_ready() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.expect("client");
    let ns = TestNamespace::create(plane, &client, "pod-ready")
        .await
        .expect("namespace");
    let api: Api<Pod> = Api::namespaced(client, ns.name());
    let mut pod = pod_template(&serde_json::json!({"app": "web"}));
    pod["metadata"]["name"] = "web".into();
    let pod: Pod = serde_json::from_value(pod).expect("pod");
    api.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");

    let pod = await_pod_ready(&api, "web").await;
    let node = pod.spec.and_then(|s| s.node_name).expect("bound");
    assert!(
        plane.nodes().contains(&node),
        "bound by kube-scheduler to a kwok node, got {node}"
    );
    let status = pod.status.expect("status");
    assert!(status.pod_ip.is_some_and(|ip| ip.starts_with("10.244.")));
    assert_eq!(status.host_ip.as_deref(), Some("127.0.0.1"));
}

#[tokio::test]
async fn every_node_is_ready() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.expect("client");
    let nodes = Api::<Node>::all(client)
        .list(&ListParams::default().labels("type=kwok"))
        .await
        .expect("list nodes");
    let mut ready: Vec<String> = nodes
        .items
        .iter()
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    ready.sort();
    assert_eq!(ready, plane.nodes());
}

#[tokio::test]
async fn kubectl_version_reports_v1_35_for_client_and_server() {
    let plane = ControlPlane::shared().expect("control plane");
    let output = plane
        .kubectl()
        .args(["version", "--output=json"])
        .output()
        .expect("run kubectl");
    assert!(
        output.status.success(),
        "kubectl version failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let version: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("kubectl prints JSON");
    for side in ["clientVersion", "serverVersion"] {
        let git_version = version[side]["gitVersion"].as_str().unwrap_or_default();
        assert!(
            git_version.starts_with("v1.35."),
            "{side} is {git_version:?}, not v1.35.x"
        );
    }
}

#[tokio::test]
async fn the_apiserver_refuses_an_unknown_resource_with_not_found() {
    let plane = ControlPlane::shared().expect("control plane");
    let output = plane
        .kubectl()
        .args(["get", "switchyardwidgets"])
        .output()
        .expect("run kubectl");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("doesn't have a resource type \"switchyardwidgets\""),
        "{stderr}"
    );
}
