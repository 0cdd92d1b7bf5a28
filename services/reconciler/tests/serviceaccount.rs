//! The service account controller against the real control plane, beside
//! kube-controller-manager's `serviceaccount-controller` (each on namespaces of its own, one
//! after the other): the same script ends the same under both.
//!
//! - a new namespace gets its `default` ServiceAccount;
//! - a deleted `default` is made again (the account's deletion keys its namespace);
//! - a terminating namespace gets nothing, and nothing fails: its deleted `default` stays gone;
//! - no reconcile ends in an error (a namespace whose account exists is Done).
//!
//! The harness runs no serviceaccount controller of its own (test namespaces get `default`
//! from the harness), so whatever creates the accounts here is the controller under test.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use switchyard_k8s::{
    Api, Client, DeleteParams, Namespace, PostParams, k8s_openapi::api::core::v1::ServiceAccount,
};
use switchyard_reconciler::serviceaccount::NAME;
use switchyard_testenv::ControlPlane;

use support::WITHIN;

/// How long a terminating namespace is watched for an account that must not come.
const LEFT_ALONE_FOR: Duration = Duration::from_secs(3);

/// What one controller did to the script's namespaces.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    /// A new namespace got `default`.
    created: bool,
    /// A deleted `default` came back, as a new object.
    recreated: bool,
    /// A terminating namespace's deleted `default` stayed gone.
    terminating_left_alone: bool,
}

/// A namespace of its own, created without the harness's `default` account.
async fn bare_namespace(client: &Client, prefix: &str) -> String {
    let suffix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let name = format!("{prefix}-{suffix:x}");
    let namespace: Namespace = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"switchyard.dev/test": prefix}},
    }))
    .unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    name
}

/// The UID of the `default` account of `namespace` once it exists and is not `previous`;
/// `None` if none came within `within`.
async fn default_account(
    client: &Client,
    namespace: &str,
    previous: Option<&str>,
    within: Duration,
) -> Option<String> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + within;
    loop {
        if let Some(account) = api.get_opt("default").await.unwrap() {
            let uid = account.metadata.uid.clone().unwrap_or_default();
            if previous != Some(uid.as_str()) {
                return Some(uid);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Lets a namespace that no namespace controller empties go: its `kubernetes` finalizer
/// removed, as the namespace controller's last step.
async fn finalize(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let mut namespace = api.get(name).await.unwrap();
    namespace
        .spec
        .get_or_insert_with(Default::default)
        .finalizers = Some(Vec::new());
    api.replace_subresource("finalize", name, &PostParams::default(), &namespace)
        .await
        .unwrap();
}

/// The script; `prefix` names its namespaces.
async fn scenario(client: &Client, prefix: &str) -> Outcome {
    let first = bare_namespace(client, prefix).await;
    let created = default_account(client, &first, None, WITHIN).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &first);
    let mut recreated = false;
    if let Some(uid) = &created {
        accounts
            .delete("default", &DeleteParams::default())
            .await
            .unwrap();
        recreated = default_account(client, &first, Some(uid), WITHIN)
            .await
            .is_some();
    }

    // Terminating: deleted while it still holds its `kubernetes` finalizer (no namespace
    // controller runs here), then its account deleted.
    let second = bare_namespace(client, prefix).await;
    let before = default_account(client, &second, None, WITHIN).await;
    Api::<Namespace>::all(client.clone())
        .delete(&second, &DeleteParams::default())
        .await
        .unwrap();
    let mut terminating_left_alone = false;
    if let Some(uid) = &before {
        Api::<ServiceAccount>::namespaced(client.clone(), &second)
            .delete("default", &DeleteParams::default())
            .await
            .unwrap();
        terminating_left_alone = default_account(client, &second, Some(uid), LEFT_ALONE_FOR)
            .await
            .is_none();
    }

    Api::<Namespace>::all(client.clone())
        .delete(&first, &DeleteParams::default())
        .await
        .unwrap();
    for namespace in [&first, &second] {
        finalize(client, namespace).await;
    }
    Outcome {
        created: created.is_some(),
        recreated,
        terminating_left_alone,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_active_namespace_gets_its_default_account_as_under_kube_controller_manager() {
    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();

    let kcm = plane
        .start_controller_manager(&["serviceaccount-controller"], &[])
        .await
        .expect("kube-controller-manager starts");
    let under_kcm = scenario(&client, "sa-kcm").await;
    drop(kcm);

    let switchyard = support::Builtins::start(plane, &[NAME]).await;
    let under_switchyard = scenario(&client, "sa-sy").await;
    // The accounts were this reconciler's: it is the only one running, and its one
    // controller made the script's three creations (and any the cluster's own namespaces
    // lacked).
    let created = switchyard.requests("create", &["201"]).await;
    // Each creation keys the namespace again, and that reconcile finds the account in the
    // cache (metadata only): it ends Done, never in an error the queue would retry.
    let errors = switchyard
        .reconciler
        .metric(&format!(
            r#"switchyard_reconcile_errors_total{{controller="{NAME}"}}"#
        ))
        .await;
    switchyard.stop().await;

    eprintln!("kube-controller-manager: {under_kcm:?}");
    eprintln!("switchyard: {under_switchyard:?}");
    assert_eq!(
        under_kcm,
        Outcome {
            created: true,
            recreated: true,
            terminating_left_alone: true,
        }
    );
    assert_eq!(under_switchyard, under_kcm);
    assert!(created >= 3.0, "the reconciler created {created} accounts");
    assert_eq!(errors, 0.0, "reconciles of {NAME} that ended in an error");
}
