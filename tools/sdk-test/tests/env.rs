//! `Env` as envtest's `Environment`: one call starts what a controller needs, granting the
//! watcher what it watches; dropping it tears everything down.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use switchyard_k8s::{
    Api, PostParams,
    k8s_openapi::{
        api::core::v1::{ConfigMap, Namespace},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    },
    kube::{
        ResourceExt,
        api::{Patch, PatchParams},
    },
};
use switchyard_sdk::{Action, Builder, Context, Registry, Result};
use switchyard_sdk_test::{Env, eventually};

async fn label(map: Arc<ConfigMap>, ctx: Context) -> Result {
    if map.labels().contains_key("seen") {
        return Ok(Action::Done);
    }
    let maps: Api<ConfigMap> = ctx.api(&map.namespace().unwrap_or_default());
    let patch = serde_json::json!({"metadata": {"labels": {"seen": "yes"}}});
    maps.patch(
        &map.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(Action::Done)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_env_runs_the_controllers_and_is_torn_down_when_dropped() {
    let mut controllers = Registry::default();
    controllers.register(
        Builder::for_::<ConfigMap>()
            .named("example.switchyard.io/v1/Seen")
            .reconcile(label),
    );
    let env = Env::start("env", controllers).await;
    let (client, namespace) = (env.client(), env.namespace().to_owned());
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let map = ConfigMap {
        metadata: ObjectMeta {
            name: Some("first".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    maps.create(&PostParams::default(), &map).await.unwrap();
    eventually("the controller labels the ConfigMap", || async {
        maps.get("first")
            .await
            .unwrap()
            .labels()
            .get("seen")
            .cloned()
    })
    .await;

    let admin = env.reconciler().admin;
    drop(env);
    // The services stop, and the namespace goes.
    eventually("the reconciler's admin port closes", || async {
        tokio::net::TcpStream::connect(admin).await.err().map(drop)
    })
    .await;
    let namespaces: Api<Namespace> = Api::all(client);
    eventually("the namespace is deleted", || async {
        let gone = namespaces.get_opt(&namespace).await.unwrap();
        gone.is_none_or(|ns| ns.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await;
}
