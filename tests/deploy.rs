//! deploy/kustomize against the real apiserver: every overlay builds with the harness's
//! kustomize and applies with server-side apply, with no error and no warning, and a second
//! apply changes nothing; the service accounts can do what their services need and no more.

#![allow(clippy::unwrap_used)]

#[path = "deploy_support.rs"]
mod support;

use support::{
    FIELD_MANAGER, NAMESPACE, OVERLAYS, Queue, apply_cleanly, await_apiservice_available, base_dir,
    build_for_loopback, kubectl, kustomize_build, resource_versions,
};
use switchyard_testenv::ControlPlane;

/// The tests of this binary apply overlapping objects; one at a time.
static APPLYING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_overlay_applies_cleanly_and_a_second_apply_changes_nothing() {
    let _one_at_a_time = APPLYING.lock().await;
    let plane = ControlPlane::shared().expect("control plane");
    // The APIService must be served for discovery to stay quiet: an unavailable aggregated
    // API makes kubectl print discovery errors.
    let queue = Queue::start(256, plane.front_proxy_ca()).await;

    // The base builds on its own too.
    let base = kustomize_build(plane, &base_dir()).await;
    assert!(base.contains("kind: APIService"));

    for overlay in OVERLAYS {
        let manifests = build_for_loopback(plane, overlay, queue.metrics_port, "").await;
        let first = apply_cleanly(plane, &format!("{overlay}: first apply"), &manifests).await;
        assert!(first.contains("serverside-applied"), "{overlay}: {first}");
        // The aggregation layer reaches the queue (its status changes once, so wait before
        // recording resource versions).
        await_apiservice_available(plane).await;

        let before = resource_versions(plane, &manifests).await;
        assert!(
            before.len() > 20,
            "{overlay}: every object exists: {before:?}"
        );
        apply_cleanly(plane, &format!("{overlay}: second apply"), &manifests).await;
        let after = resource_versions(plane, &manifests).await;
        assert_eq!(before, after, "{overlay}: the second apply changed objects");

        let diff = kubectl(
            plane,
            &[
                "diff",
                "--server-side",
                &format!("--field-manager={FIELD_MANAGER}"),
                "-f",
                "-",
            ],
            Some(&manifests),
        )
        .await;
        assert_eq!(
            diff.code,
            Some(0),
            "{overlay}: kubectl diff finds no difference\n{}\n{}",
            diff.stdout,
            diff.stderr
        );
    }
    queue.stop().await;
}

/// Objects of these kinds from the base: identities and their permissions.
fn rbac_only(manifests: &str) -> String {
    const KINDS: [&str; 4] = [
        "kind: Namespace",
        "kind: ServiceAccount",
        "kind: ClusterRole",
        "kind: ClusterRoleBinding",
    ];
    manifests
        .split("\n---\n")
        .filter(|doc| doc.lines().any(|line| KINDS.contains(&line)))
        .collect::<Vec<_>>()
        .join("\n---\n")
}

async fn can_i(plane: &ControlPlane, service: &str, verb: &str, resource: &str) -> bool {
    let account = format!("--as=system:serviceaccount:{NAMESPACE}:switchyard-{service}");
    let mut args = vec!["auth", "can-i", verb];
    let (resource, subresource) = match resource.split_once('/') {
        Some((resource, sub)) => (resource, Some(format!("--subresource={sub}"))),
        None => (resource, None),
    };
    args.push(resource);
    if let Some(sub) = &subresource {
        args.push(sub);
    }
    args.extend([account.as_str(), "--namespace=default"]);
    let out = kubectl(plane, &args, None).await;
    match out.stdout.trim() {
        "yes" => true,
        "no" => false,
        other => panic!("kubectl auth can-i {args:?}: {other:?} {}", out.stderr),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_service_account_has_what_its_service_needs_and_nothing_more() {
    let _one_at_a_time = APPLYING.lock().await;
    let plane = ControlPlane::shared().expect("control plane");
    let base = kustomize_build(plane, &base_dir()).await;
    let rbac = rbac_only(&base);
    assert_eq!(
        rbac.matches("kind: ClusterRoleBinding").count(),
        2,
        "only the watcher and the reconciler are bound to roles:\n{rbac}"
    );
    apply_cleanly(plane, "base RBAC", &rbac).await;

    let allowed: &[(&str, &[&str], &[&str])] = &[
        (
            "watcher",
            &["get", "list", "watch"],
            &["pods", "replicasets.apps", "deployments.apps"],
        ),
        ("reconciler", &["create", "delete", "patch"], &["pods"]),
        (
            "reconciler",
            &[
                "get", "list", "watch", "create", "update", "patch", "delete",
            ],
            &["replicasets.apps", "deployments.apps"],
        ),
        (
            "reconciler",
            &["update", "patch"],
            &["replicasets.apps/status", "deployments.apps/status"],
        ),
        (
            "reconciler",
            &["create", "patch"],
            &["events.events.k8s.io"],
        ),
    ];
    for (service, verbs, resources) in allowed {
        for verb in *verbs {
            for resource in *resources {
                assert!(
                    can_i(plane, service, verb, resource).await,
                    "{service} must be allowed to {verb} {resource}"
                );
            }
        }
    }

    let denied: &[(&str, &[&str], &[&str])] = &[
        // The watcher never writes, and reads only what it watches.
        (
            "watcher",
            &["create", "update", "patch", "delete"],
            &["pods", "replicasets.apps", "deployments.apps"],
        ),
        (
            "watcher",
            &["get", "list"],
            &["secrets", "configmaps", "nodes"],
        ),
        // The reconcilers read pods through the watcher's cache; no secrets, no RBAC.
        ("reconciler", &["list", "watch", "update"], &["pods"]),
        ("reconciler", &["get", "list"], &["secrets", "configmaps"]),
        (
            "reconciler",
            &["create"],
            &["events", "clusterroles.rbac.authorization.k8s.io"],
        ),
        ("reconciler", &["delete"], &["nodes", "namespaces"]),
        // The queue and the elector need no Kubernetes access at all.
        (
            "queue",
            &["get", "list", "create", "patch", "delete"],
            &[
                "pods",
                "configmaps",
                "secrets",
                "replicasets.apps",
                "leases.coordination.k8s.io",
            ],
        ),
        (
            "elector",
            &["get", "list", "create", "patch", "delete"],
            &[
                "pods",
                "configmaps",
                "secrets",
                "replicasets.apps",
                "leases.coordination.k8s.io",
            ],
        ),
    ];
    for (service, verbs, resources) in denied {
        for verb in *verbs {
            for resource in *resources {
                assert!(
                    !can_i(plane, service, verb, resource).await,
                    "{service} must not be allowed to {verb} {resource}"
                );
            }
        }
    }

    // The queue and the elector do not even get a token mounted.
    for service in ["queue", "elector"] {
        let out = kubectl(
            plane,
            &[
                "get",
                "serviceaccount",
                &format!("switchyard-{service}"),
                "--namespace",
                NAMESPACE,
                "-o",
                "jsonpath={.automountServiceAccountToken}",
            ],
            None,
        )
        .await;
        assert_eq!(out.stdout, "false", "{service}: {}", out.stderr);
    }
}
