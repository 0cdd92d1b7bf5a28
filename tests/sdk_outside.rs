//! The SDK as a team uses it from its own repository: a controller crate in a directory of
//! its own, outside this workspace, that depends on `switchyard-sdk` by path and on nothing
//! else of Switchyard's (kube and k8s-openapi through the SDK's re-exports), built with cargo
//! and run as a reconciler process against the test control plane, beside a queue and a
//! watcher.
//!
//! ```text
//!  tempdir/Cargo.toml ─ switchyard-sdk = { path } ─► cargo build (target/sdk-outside, offline,
//!                                                     this workspace's Cargo.lock)
//!  queue, watcher (in process) ◄─ hello-controller (a process, reconciler's certificate)
//!  ConfigMap created ─► labelled by the controller ─► SIGTERM ─► clean exit
//! ```

#![allow(clippy::unwrap_used)]

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use switchyard_k8s::{
    Api,
    k8s_openapi::{
        api::core::v1::ConfigMap,
        apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    },
    kube::{
        self,
        api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams},
    },
};
use switchyard_runtime::Role;
use switchyard_sdk_test::{ControlPlane, SHARDS, TestNamespace, eventually, queue, watcher};
use switchyard_testenv::{Pki, ServiceProcess};

/// The controller crate's manifest: the SDK by path, tokio for `main`, serde_json for the
/// patch. `[workspace]` makes it a workspace of its own; the profile is this workspace's, so
/// that the dependencies built once are reused.
const MANIFEST: &str = r#"[package]
name = "hello-controller"
version = "0.1.0"
edition = "2024"
publish = false

[dependencies]
switchyard-sdk = { path = "@SDK@" }
schemars = "1"
serde = { version = "1", features = ["derive"] }
serde_json = "1"
tokio = { version = "1", features = ["macros", "rt-multi-thread"] }

[profile.dev]
debug = "line-tables-only"

[profile.dev.package."*"]
debug = false

[workspace]
"#;

/// Two controllers. ConfigMaps get the label `example.com/greeted`, whose value names the
/// greeting the ConfigMap's `greeting` key holds (or `hello`). A `Hello` (a custom resource
/// derived through the SDK's re-exports) gets a ConfigMap `hello-<name>` holding its message,
/// server-side applied and controlled by it. `<binary> crd` prints the Hello CRD.
const MAIN: &str = r#"use std::{collections::BTreeMap, sync::Arc};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use switchyard_sdk::{
    Action, Builder, Context, Registry, Result,
    k8s_openapi::{api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::ObjectMeta},
    kube::{
        Api, CustomResource, CustomResourceExt, Resource, ResourceExt,
        api::{Patch, PatchParams},
    },
};

#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(group = "example.com", version = "v1", kind = "Hello", namespaced)]
#[kube(crates(
    kube_core = "switchyard_sdk::kube::core",
    k8s_openapi = "switchyard_sdk::k8s_openapi"
))]
pub struct HelloSpec {
    pub message: String,
}

async fn hello(hello: Arc<Hello>, ctx: Context) -> Result {
    let map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("hello-{}", hello.name_any())),
            namespace: hello.namespace(),
            owner_references: hello.controller_owner_ref(&()).map(|owner| vec![owner]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("message".to_owned(), hello.spec.message.clone())])),
        ..ConfigMap::default()
    };
    ctx.apply(&map).await?;
    Ok(Action::Done)
}

const LABEL: &str = "example.com/greeted";

async fn reconcile(map: Arc<ConfigMap>, ctx: Context) -> Result {
    let greeting = map
        .data
        .as_ref()
        .and_then(|data| data.get("greeting"))
        .map_or("hello", String::as_str);
    if map.labels().get(LABEL).map(String::as_str) == Some(greeting) {
        return Ok(Action::Done);
    }
    let maps: Api<ConfigMap> = ctx.api(&map.namespace().unwrap_or_default());
    let patch = serde_json::json!({"metadata": {"labels": {LABEL: greeting}}});
    maps.patch(&map.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(Action::Done)
}

#[tokio::main]
async fn main() -> Result<(), switchyard_sdk::ServiceError> {
    if std::env::args().nth(1).as_deref() == Some("crd") {
        println!("{}", serde_json::to_string(&Hello::crd()).expect("the CRD serializes"));
        return Ok(());
    }
    let mut controllers = Registry::default();
    controllers
        .register(
            Builder::for_::<ConfigMap>()
                .named("example.com/v1/GreetedConfigMap")
                .reconcile(reconcile),
        )
        .register(Builder::for_::<Hello>().owns::<ConfigMap>().reconcile(hello));
    switchyard_sdk::run(controllers).await
}
"#;

/// The workspace's root directory.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Writes the crate into `dir` and builds it as a user would (`cargo build`), offline with
/// this workspace's lock file so that the versions are the ones tested here; returns the
/// binary.
fn build(dir: &Path) -> PathBuf {
    let root = workspace();
    let sdk = root.join("services/reconciler/sdk");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        MANIFEST.replace("@SDK@", sdk.to_str().unwrap()),
    )
    .unwrap();
    std::fs::write(dir.join("src/main.rs"), MAIN).unwrap();
    for file in ["Cargo.lock", "rust-toolchain.toml"] {
        std::fs::copy(root.join(file), dir.join(file)).unwrap();
    }
    // Kept between runs, apart from the workspace's own artifacts (whose features differ).
    let target = root.join("target/sdk-outside");
    let output = Command::new(env!("CARGO"))
        .args(["build", "--offline", "--quiet"])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", &target)
        // What this workspace's .cargo/config.toml gives its builds, which a crate elsewhere
        // does not read.
        .env("PROTOC", root.join("tools/protoc"))
        .env_remove("RUSTUP_TOOLCHAIN")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "the crate outside the workspace does not build:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    target.join("debug/hello-controller")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_crate_outside_the_workspace_builds_on_the_sdk_and_reconciles() {
    let dir = tempfile::tempdir().unwrap();
    let binary = tokio::task::spawn_blocking({
        let dir = dir.path().to_path_buf();
        move || build(&dir)
    })
    .await
    .unwrap();
    // The crate names kube and k8s-openapi only through the SDK: a manifest with no
    // dependency of its own on them built.
    let manifest = std::fs::read_to_string(dir.path().join("Cargo.toml")).unwrap();
    assert!(!manifest.contains("kube") && !manifest.contains("k8s-openapi"));
    let help = Command::new(&binary).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--queue-addr",
        "--elector-addr",
        "--watcher-addr",
        "--tls-cert",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
    }

    let plane = ControlPlane::shared().expect("control plane");
    let client = plane.client().await.unwrap();
    // The binary prints the CRD its derived type generates; the apiserver takes it.
    let crd = Command::new(&binary).arg("crd").output().unwrap();
    assert!(crd.status.success(), "{crd:?}");
    let crd: CustomResourceDefinition = serde_json::from_slice(&crd.stdout).unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => panic!("the Hello CRD: {error}"),
    }
    let ns = TestNamespace::create(plane, &client, "sdk-outside")
        .await
        .unwrap();
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Hello"));
    let hellos: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns.name(), &resource);
    eventually("the Hello CRD is served", || async {
        hellos.list(&ListParams::default().limit(1)).await.ok()
    })
    .await;
    let queue = queue(&[], &[]).await;
    let config = format!(
        "shardCount: {SHARDS}\nnamespaces:\n  include: [{}]\nregistrations:\n  - serviceAccount: switchyard-reconciler\n    kinds:\n      - {{apiVersion: v1, kind: ConfigMap, objects: full}}\n      - {{apiVersion: example.com/v1, kind: Hello, objects: full}}\n",
        ns.name()
    );
    let watcher = watcher(plane, &config, queue.grpc()).await;
    let flags = [
        format!("--kubeconfig={}", plane.kubeconfig().display()),
        format!("--queue-addr={}", queue.grpc()),
        format!("--watcher-addr={}", watcher.grpc()),
        format!("--shard-count={SHARDS}"),
    ];
    let tls = Pki::shared().flags(Role::Reconciler);
    let args: Vec<&str> = flags.iter().chain(&tls).map(String::as_str).collect();
    let mut controller = ServiceProcess::start(&binary, &args, &[]).await.unwrap();
    controller
        .wait_ready()
        .await
        .unwrap_or_else(|e| panic!("not ready: {e}\n{}", controller.log()));

    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    let map = |name: &str, greeting: Option<&str>| ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: greeting.map(|g| BTreeMap::from([("greeting".to_owned(), g.to_owned())])),
        ..ConfigMap::default()
    };
    for (name, greeting) in [("plain", None), ("friendly", Some("bonjour"))] {
        maps.create(&PostParams::default(), &map(name, greeting))
            .await
            .unwrap();
    }
    for (name, label) in [("plain", "hello"), ("friendly", "bonjour")] {
        eventually(&format!("{name} is labelled {label}"), || async {
            let map = maps.get(name).await.ok()?;
            (map.metadata.labels?.get("example.com/greeted")? == label).then_some(())
        })
        .await;
    }

    let hello: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "example.com/v1",
        "kind": "Hello",
        "metadata": {"name": "world"},
        "spec": {"message": "hello, world"},
    }))
    .unwrap();
    let hello = hellos.create(&PostParams::default(), &hello).await.unwrap();
    let applied = eventually("hello-world holds the message", || async {
        let map = maps.get("hello-world").await.ok()?;
        (map.data.as_ref()?.get("message")? == "hello, world").then_some(map)
    })
    .await;
    let owner = &applied.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), Some(&owner.uid), owner.controller),
        ("Hello", hello.metadata.uid.as_ref(), Some(true))
    );
    // Written by server-side apply, as the controller's field manager.
    let managers: Vec<String> = applied
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|f| f.manager)
        .collect();
    assert!(
        managers.iter().any(|m| m == "example.com/v1/Hello"),
        "{managers:?}"
    );

    let (status, log) = controller.terminate().await.unwrap();
    assert!(status.success(), "{status}:\n{log}");
    watcher.stop().await;
    queue.stop().await;
}
