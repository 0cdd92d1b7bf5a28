//! The built-in controllers act as their own service accounts (`--controller-service-accounts`,
//! kube-controller-manager's `--use-service-account-credentials`), under the roles
//! `deploy/kustomize/base/rbac.yaml` gives them: a Deployment rolls out and its owner's
//! deletion is collected with nothing but those roles, and a controller whose account holds
//! no role cannot write, whatever the reconciler's own identity may do.
//!
//! The accounts live in the test's namespace; the base's cluster roles are copied under names
//! of the test's own, so that nothing here touches what `tests/deploy.rs` applies.

#![allow(clippy::unwrap_used)]

mod gc_scenarios;
mod support;

use std::time::Duration;

use gc_scenarios::{COLLECTED_WITHIN, Stack, eventually, exists, settles};
use serde_json::{Value, json};
use switchyard_k8s::{
    Api, Client, DeleteParams, Deployment, ListParams, Pod, PostParams, ReplicaSet,
    k8s_openapi::api::{
        core::v1::ServiceAccount,
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    },
};
use switchyard_reconciler::BUILTINS;
use switchyard_testenv::{ControlPlane, TestNamespace, manifests};

/// How long a controller without a role is watched doing nothing.
const REFUSED_FOR: Duration = Duration::from_secs(5);

/// The base's cluster role of each built-in controller's account, by account name.
fn base_roles() -> Vec<(String, Value)> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/kustomize/base/rbac.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let accounts: Vec<&str> = BUILTINS.iter().map(|b| b.service_account).collect();
    let roles: Vec<(String, Value)> = text
        .split("\n---\n")
        .map(|doc| serde_norway::from_str::<Value>(doc).unwrap())
        .filter(|doc| doc["kind"] == "ClusterRole")
        .filter_map(|doc| {
            let name = doc["metadata"]["name"].as_str()?.to_owned();
            accounts.contains(&name.as_str()).then_some((name, doc))
        })
        .collect();
    assert_eq!(roles.len(), accounts.len(), "a role per account: {roles:?}");
    roles
}

/// The test's copy of `account`'s role, bound to `account` in `ns`.
async fn grant(client: &Client, ns: &str, account: &str, role: &Value) {
    let name = format!("{ns}-{account}");
    let copy: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": name},
        "rules": role["rules"],
    }))
    .unwrap();
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &copy)
        .await
        .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

async fn revoke_all(client: &Client, ns: &str) {
    for (account, _) in base_roles() {
        let name = format!("{ns}-{account}");
        let _ = Api::<ClusterRoleBinding>::all(client.clone())
            .delete(&name, &DeleteParams::default())
            .await;
        let _ = Api::<ClusterRole>::all(client.clone())
            .delete(&name, &DeleteParams::default())
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_built_in_controller_writes_as_its_own_account_with_only_its_role() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    let ns = TestNamespace::create(plane, &client, "identities")
        .await
        .unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns.name());
    for account in BUILTINS.iter().map(|b| b.service_account) {
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": account}})).unwrap();
        accounts.create(&PostParams::default(), &sa).await.unwrap();
    }
    // Every controller's role but the ReplicaSet controller's, to begin with.
    let roles = base_roles();
    let (withheld, granted): (Vec<_>, Vec<_>) = roles
        .iter()
        .partition(|(account, _)| account == "switchyard-replicaset-controller");
    for (account, role) in &granted {
        grant(&client, ns.name(), account, role).await;
    }
    // The reconciler's own identity (the admin's here) could do anything: only the
    // controllers' accounts stand between it and the apiserver.
    // (`--controller-service-accounts`, as the built-in flags set it.)
    let stack = Stack::start_with(plane, &[ns.name()], Some(ns.name())).await;

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    deployments
        .create(
            &PostParams::default(),
            &manifests::deployment("web", 2, Value::Null),
        )
        .await
        .unwrap();
    // The Deployment controller's account creates the ReplicaSet...
    eventually("the ReplicaSet created", COLLECTED_WITHIN, || {
        let replica_sets = replica_sets.clone();
        async move { count(&replica_sets).await == 1 }
    })
    .await;
    // ...and the ReplicaSet controller's, without a role, creates no Pod.
    let created = settles(REFUSED_FOR, || {
        let pods = pods.clone();
        async move { count(&pods).await > 0 }
    })
    .await;
    assert!(
        !created,
        "a controller whose account has no role created Pods"
    );

    let (account, role) = withheld[0];
    grant(&client, ns.name(), account, role).await;
    eventually("web rolled out", Duration::from_secs(60), || {
        let deployments = deployments.clone();
        async move {
            deployments
                .get("web")
                .await
                .unwrap()
                .status
                .and_then(|s| s.available_replicas)
                == Some(2)
        }
    })
    .await;

    // The garbage collector's account collects what the Deployment owned.
    deployments
        .delete("web", &DeleteParams::background())
        .await
        .unwrap();
    eventually(
        "the ReplicaSet and its Pods collected",
        COLLECTED_WITHIN,
        || {
            let (deployments, replica_sets, pods) =
                (deployments.clone(), replica_sets.clone(), pods.clone());
            async move {
                !exists(&deployments, "web").await
                    && count(&replica_sets).await == 0
                    && count(&pods).await == 0
            }
        },
    )
    .await;
    stack.stop().await;
    revoke_all(&client, ns.name()).await;
}

async fn count<K>(api: &Api<K>) -> usize
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + switchyard_k8s::kube::Resource,
{
    api.list_metadata(&ListParams::default())
        .await
        .unwrap()
        .items
        .len()
}
