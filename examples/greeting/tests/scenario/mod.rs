//! What the Greeting controller does, as a user sees it through the apiserver: shared by the
//! Switchyard controller's test and the kube-rs comparison's.

#![allow(clippy::unwrap_used, dead_code)]

use serde_json::json;
use switchyard_example_greeting::{FINALIZER, Greeting};
use switchyard_k8s::{
    Api, Client, DeleteParams, PostParams,
    k8s_openapi::api::{core::v1::ConfigMap, events::v1::Event},
    kube::{
        ResourceExt,
        api::{ListParams, Patch, PatchParams},
    },
};
use switchyard_sdk_test::eventually;

/// Installs the Greeting CRD (generated from the type) and waits until it is served.
pub async fn install_crd(client: &Client) {
    switchyard_sdk_test::install_crd::<Greeting>(client).await;
}

/// A Greeting gets its ConfigMap, an event (reported by `reporting_controller`) and its
/// status; a new message updates the ConfigMap; a deleted Greeting has its ConfigMap deleted
/// by the finalizer before it goes.
pub async fn greeting_lifecycle(client: &Client, namespace: &str, reporting_controller: &str) {
    let greetings: Api<Greeting> = Api::namespaced(client.clone(), namespace);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let greeting: Greeting = serde_json::from_value(json!({
        "apiVersion": "example.switchyard.io/v1",
        "kind": "Greeting",
        "metadata": {"name": "hi"},
        "spec": {"message": "hello"}
    }))
    .unwrap();
    let created = greetings
        .create(&PostParams::default(), &greeting)
        .await
        .unwrap();

    let map = eventually("the ConfigMap is created", || async {
        maps.get_opt("greeting-hi").await.unwrap()
    })
    .await;
    assert_eq!(map.data.as_ref().unwrap()["message"], "hello");
    let owner = &map.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Greeting", created.uid().unwrap().as_str(), Some(true))
    );
    let status = eventually("the status is written", || async {
        let g = greetings.get("hi").await.unwrap();
        g.status.filter(|s| s.observed_generation == Some(1))
    })
    .await;
    assert_eq!(status.config_map.as_deref(), Some("greeting-hi"));
    assert!(
        greetings
            .get("hi")
            .await
            .unwrap()
            .finalizers()
            .contains(&FINALIZER.to_owned())
    );
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let event = eventually("the Created event is recorded", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Created"))
    })
    .await;
    let regarding = event.regarding.unwrap();
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("Greeting"), Some("hi"))
    );
    assert_eq!(
        event.reporting_controller.as_deref(),
        Some(reporting_controller)
    );

    greetings
        .patch(
            "hi",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"message": "bonjour"}})),
        )
        .await
        .unwrap();
    eventually("the ConfigMap follows the new message", || async {
        let map = maps.get("greeting-hi").await.unwrap();
        (map.data.unwrap()["message"] == "bonjour").then_some(())
    })
    .await;
    eventually("the status follows generation 2", || async {
        let g = greetings.get("hi").await.unwrap();
        g.status
            .filter(|s| s.observed_generation == Some(2))
            .map(|_| ())
    })
    .await;

    greetings
        .delete("hi", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Greeting is gone once its finalizer ran", || async {
        greetings
            .get_opt("hi")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(
        maps.get_opt("greeting-hi").await.unwrap().is_none(),
        "the finalizer deleted the ConfigMap"
    );
}
