//! The SDK's webhooks called by the real apiserver on loopback: the example's mutating and
//! validating webhooks for Greetings, and a conversion webhook between two versions of a
//! CRD of the test's own, all served by one reconciler (`--webhook-addr`) with its
//! certificate from the test PKI (which names 127.0.0.1), trusted through the configurations'
//! `caBundle`.
//!
//! ```text
//!  kubectl-like client ─► apiserver ─ POST https://127.0.0.1:<port>/mutate-greeting ──► reconciler
//!                                    ─ POST .../validate-greeting, .../convert-sizes ─►  (webhook server)
//! ```

#![allow(clippy::unwrap_used)]

mod scenario;

use serde_json::json;
use switchyard_example_greeting::{
    Greeting,
    webhooks::{DEFAULT_PATH, VALIDATE_PATH, webhooks},
};
use switchyard_k8s::{
    Api, Client, DeleteParams, PostParams,
    k8s_openapi::{
        ByteString,
        api::admissionregistration::v1::{
            MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
            ValidatingWebhookConfiguration, WebhookClientConfig,
        },
        apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta},
    },
    kube::{
        self,
        api::{ApiResource, DynamicObject, GroupVersionKind, ListParams},
    },
};
use switchyard_sdk::{Action, Builder, Registry, Webhooks};
use switchyard_sdk_test::{Env, EnvOptions, eventually};
use switchyard_testenv::Pki;

/// The test CRD's group: `Size` objects, `spec.size` in v1 (stored) and `spec.replicas` in v2.
const SIZES_GROUP: &str = "sizes.switchyard.io";
const CONVERT_PATH: &str = "/convert-sizes";

/// A free loopback port for the webhook server.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The webhook client configuration the apiserver dials: the URL on loopback, trusted
/// through the test PKI's CA.
fn client_config(port: u16, path: &str) -> WebhookClientConfig {
    WebhookClientConfig {
        url: Some(format!("https://127.0.0.1:{port}{path}")),
        ca_bundle: Some(ByteString(std::fs::read(Pki::shared().ca_path()).unwrap())),
        service: None,
    }
}

/// The rule of both Greeting webhooks: creations and updates of Greetings.
fn greeting_rules() -> Option<Vec<RuleWithOperations>> {
    Some(vec![RuleWithOperations {
        api_groups: Some(vec!["example.switchyard.io".into()]),
        api_versions: Some(vec!["v1".into()]),
        resources: Some(vec!["greetings".into()]),
        operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
        scope: Some("Namespaced".into()),
    }])
}

fn in_namespace(namespace: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(
            [(
                "kubernetes.io/metadata.name".to_owned(),
                namespace.to_owned(),
            )]
            .into(),
        ),
        ..LabelSelector::default()
    }
}

/// Registers both Greeting webhooks for `namespace`, named after it.
async fn register_greeting_webhooks(client: &Client, namespace: &str, port: u16) {
    let rules = greeting_rules();
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    mutating
        .create(
            &PostParams::default(),
            &MutatingWebhookConfiguration {
                metadata: ObjectMeta {
                    name: Some(format!("greeting-defaults-{namespace}")),
                    ..ObjectMeta::default()
                },
                webhooks: Some(vec![MutatingWebhook {
                    name: "default.greetings.example.switchyard.io".into(),
                    client_config: client_config(port, DEFAULT_PATH),
                    rules: rules.clone(),
                    namespace_selector: Some(in_namespace(namespace)),
                    side_effects: "None".into(),
                    admission_review_versions: vec!["v1".into()],
                    failure_policy: Some("Fail".into()),
                    timeout_seconds: Some(5),
                    ..MutatingWebhook::default()
                }]),
            },
        )
        .await
        .unwrap();
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    validating
        .create(
            &PostParams::default(),
            &ValidatingWebhookConfiguration {
                metadata: ObjectMeta {
                    name: Some(format!("greeting-checks-{namespace}")),
                    ..ObjectMeta::default()
                },
                webhooks: Some(vec![ValidatingWebhook {
                    name: "validate.greetings.example.switchyard.io".into(),
                    client_config: client_config(port, VALIDATE_PATH),
                    rules,
                    namespace_selector: Some(in_namespace(namespace)),
                    side_effects: "None".into(),
                    admission_review_versions: vec!["v1".into()],
                    failure_policy: Some("Fail".into()),
                    timeout_seconds: Some(5),
                    ..ValidatingWebhook::default()
                }]),
            },
        )
        .await
        .unwrap();
}

async fn unregister_greeting_webhooks(client: &Client, namespace: &str) {
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let _ = mutating
        .delete(
            &format!("greeting-defaults-{namespace}"),
            &DeleteParams::default(),
        )
        .await;
    let _ = validating
        .delete(
            &format!("greeting-checks-{namespace}"),
            &DeleteParams::default(),
        )
        .await;
}

fn greeting(name: &str, message: &str) -> Greeting {
    serde_json::from_value(json!({
        "apiVersion": "example.switchyard.io/v1",
        "kind": "Greeting",
        "metadata": {"name": name},
        "spec": {"message": message}
    }))
    .unwrap()
}

/// The CRD of `Size`: v1 stored (`spec.size`), v2 served (`spec.replicas`), converted by
/// the webhook at `port`.
fn sizes_crd(port: u16) -> CustomResourceDefinition {
    let version = |name: &str, field: &str, storage: bool| {
        json!({
            "name": name, "served": true, "storage": storage,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "properties": {field: {"type": "integer"}}}
            }}}
        })
    };
    let ca = std::fs::read(Pki::shared().ca_path()).unwrap();
    let ca = String::from_utf8(ca).unwrap();
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("sizes.{SIZES_GROUP}")},
        "spec": {
            "group": SIZES_GROUP,
            "names": {"kind": "Size", "plural": "sizes", "singular": "size", "listKind": "SizeList"},
            "scope": "Namespaced",
            "versions": [version("v1", "size", true), version("v2", "replicas", false)],
            "conversion": {"strategy": "Webhook", "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {
                    "url": format!("https://127.0.0.1:{port}{CONVERT_PATH}"),
                    "caBundle": base64(ca.as_bytes()),
                },
            }},
        }
    }))
    .unwrap()
}

/// Standard base64 with padding, as `caBundle` is written.
fn base64(bytes: &[u8]) -> String {
    let json = serde_json::to_value(ByteString(bytes.to_vec())).unwrap();
    json.as_str().unwrap().to_owned()
}

/// v1's `spec.size` is v2's `spec.replicas`, both ways.
fn convert_sizes(
    mut object: serde_json::Value,
    desired: &str,
) -> Result<serde_json::Value, String> {
    let (from, to) = match desired {
        "sizes.switchyard.io/v2" => ("size", "replicas"),
        "sizes.switchyard.io/v1" => ("replicas", "size"),
        other => return Err(format!("no conversion to {other}")),
    };
    if let Some(spec) = object.get_mut("spec").and_then(|s| s.as_object_mut())
        && let Some(value) = spec.remove(from)
    {
        spec.insert(to.into(), value);
    }
    Ok(object)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apiserver_calls_the_binary_s_admission_and_conversion_webhooks() {
    let port = free_port();
    // The reconciler: a controller (it must run one) and the webhooks.
    let mut registry = Registry::default();
    registry
        .register(
            Builder::for_::<switchyard_k8s::k8s_openapi::api::core::v1::ConfigMap>()
                .named("example.switchyard.io/v1/Idle")
                .reconcile(|_, _| async { Ok(Action::Done) }),
        )
        .webhooks(webhooks())
        .webhooks(Webhooks::default().convert(CONVERT_PATH, convert_sizes));
    let env = Env::start_with(
        "webhooks",
        registry,
        EnvOptions {
            reconciler_flags: vec![format!("--webhook-addr=127.0.0.1:{port}")],
            ..EnvOptions::default()
        },
    )
    .await;
    let (client, namespace) = (env.client(), env.namespace());
    scenario::install_crd(&client).await;

    // Admission: the apiserver's webhook configuration informer takes a moment to see the
    // new configurations; a dry-run creation says when the defaulting one is called.
    register_greeting_webhooks(&client, namespace, port).await;
    let greetings: Api<Greeting> = Api::namespaced(client.clone(), namespace);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    eventually("the defaulting webhook is called", || async {
        let probe = greetings
            .create(&dry_run, &greeting("probe", ""))
            .await
            .ok()?;
        (probe.spec.message == "Hello from probe!").then_some(())
    })
    .await;
    let quiet = greetings
        .create(&PostParams::default(), &greeting("quiet", ""))
        .await
        .unwrap();
    assert_eq!(quiet.spec.message, "Hello from quiet!");
    let kept = greetings
        .create(&PostParams::default(), &greeting("kept", "good morning"))
        .await
        .unwrap();
    assert_eq!(kept.spec.message, "good morning");
    eventually("the validating webhook is called", || async {
        match greetings.create(&dry_run, &greeting("probe", "HI")).await {
            Err(kube::Error::Api(status)) => Some(status),
            _ => None,
        }
    })
    .await;
    let refused = greetings
        .create(&PostParams::default(), &greeting("loud", "HELLO, WORLD"))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = refused else {
        panic!("{refused}")
    };
    assert!(
        status
            .message
            .contains("denied the request: a Greeting does not shout"),
        "{status:?}"
    );
    // An update is checked too.
    let mut louder = kept.clone();
    louder.spec.message = "GOOD MORNING".into();
    let refused = greetings
        .replace("kept", &PostParams::default(), &louder)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("does not shout"), "{refused}");
    unregister_greeting_webhooks(&client, namespace).await;

    // Conversion: an object written as v1 reads as v2 and the other way round.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd_name = format!("sizes.{SIZES_GROUP}");
    let _ = crds.delete(&crd_name, &DeleteParams::default()).await;
    eventually("an earlier Size CRD is gone", || async {
        crds.get_opt(&crd_name)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    crds.create(&PostParams::default(), &sizes_crd(port))
        .await
        .unwrap();
    let sizes = |version: &str| {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(SIZES_GROUP, version, "Size"));
        Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource)
    };
    let (v1, v2) = (sizes("v1"), sizes("v2"));
    eventually("both versions are served", || async {
        v1.list(&ListParams::default()).await.ok()?;
        v2.list(&ListParams::default()).await.ok()
    })
    .await;
    let size = |version: &str, name: &str, field: &str, value: i64| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": format!("{SIZES_GROUP}/{version}"),
            "kind": "Size",
            "metadata": {"name": name},
            "spec": {field: value},
        }))
        .unwrap()
    };
    v1.create(&PostParams::default(), &size("v1", "small", "size", 3))
        .await
        .unwrap();
    let read = v2.get("small").await.unwrap();
    assert_eq!(read.data["spec"], json!({"replicas": 3}));
    // Written as v2, stored as v1 (converted), read back as v1.
    v2.create(&PostParams::default(), &size("v2", "large", "replicas", 5))
        .await
        .unwrap();
    let read = v1.get("large").await.unwrap();
    assert_eq!(read.data["spec"], json!({"size": 5}));
    // A conversion the webhook refuses fails the read with its message: none here, every
    // read above converted. The CRD goes with the test.
    crds.delete(&crd_name, &DeleteParams::default())
        .await
        .unwrap();

    // What the webhook server answered, by path and result.
    let (_, metrics) = env.reconciler().admin_get("/metrics").await;
    for line in [
        "path=\"/mutate-greeting\",result=\"patched\"",
        "path=\"/validate-greeting\",result=\"denied\"",
        "path=\"/convert-sizes\",result=\"converted\"",
    ] {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }
    env.stop().await;
}
