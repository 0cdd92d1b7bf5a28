//! Helpers shared by the integration tests in this directory.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use switchyard_k8s::{Pod, await_condition, kube::Api};

/// How long a test waits for the control plane to converge on something.
pub const CONVERGE_TIMEOUT: Duration = Duration::from_secs(90);

pub mod browser;
pub mod fleet;
pub mod topology;

/// The shipped watcher configuration (`deploy/kustomize/base/watcher-config.yaml`) with
/// `shards` shards, watching only `namespaces`, written to `path`.
#[allow(clippy::unwrap_used)]
pub fn write_watcher_config(path: &Path, shards: u32, namespaces: &[&str]) {
    const SHIPPED: &str = include_str!("../deploy/kustomize/base/watcher-config.yaml");
    let config = format!(
        "{}namespaces:\n  include: [{}]\n",
        SHIPPED.replace("shardCount: 256", &format!("shardCount: {shards}")),
        namespaces.join(", ")
    );
    std::fs::write(path, config).unwrap();
}

/// `cargo metadata` of the workspace (offline; `--no-deps` when `no_deps`), as JSON.
#[allow(clippy::unwrap_used)]
pub fn cargo_metadata(no_deps: bool) -> serde_json::Value {
    let mut args = vec!["metadata", "--format-version=1", "--offline"];
    if no_deps {
        args.push("--no-deps");
    }
    let output = std::process::Command::new(env!("CARGO"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// A service binary built beside the running test (`target/<profile>/`).
#[allow(clippy::unwrap_used)]
pub fn service_binary(name: &str) -> PathBuf {
    let path = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: `make test` builds it first (or `cargo build --workspace --bins`)",
        path.display()
    );
    path
}

/// Scheduled to a Node, phase Running and condition Ready=True.
pub fn pod_running_and_ready(pod: Option<&Pod>) -> bool {
    let Some(pod) = pod else { return false };
    let scheduled = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
    let status = pod.status.as_ref();
    let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    scheduled && running && ready
}

/// Waits until the named Pod is Running and Ready; panics with the Pod's state otherwise.
pub async fn await_pod_ready(api: &Api<Pod>, name: &str) -> Pod {
    match tokio::time::timeout(
        CONVERGE_TIMEOUT,
        await_condition(api.clone(), name, pod_running_and_ready),
    )
    .await
    {
        Ok(Ok(Some(pod))) => pod,
        other => {
            let pod = api.get_opt(name).await.ok().flatten();
            panic!("pod {name} did not become Running and Ready: {other:?}\nlast seen: {pod:?}")
        }
    }
}

/// A minimal Pod spec; kwok plays the kubelet, so the image is never pulled.
pub fn pod_template(labels: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"labels": labels},
        "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
    })
}
