//! An example of a user's own controller on the Switchyard SDK.
//!
//! A `Greeting` (`example.switchyard.io/v1`) asks for a ConfigMap `greeting-<name>` holding
//! its message:
//!
//! ```text
//!  Greeting ─► finalizer (example.switchyard.io/cleanup)
//!     Apply:   ConfigMap absent ─► create (controller owner: the Greeting)   event Created
//!              message differs  ─► patch (resourceVersion-guarded)           event Updated
//!              status: observedGeneration, configMap
//!     Cleanup: delete the ConfigMap                                          event Deleted
//! ```
//!
//! The type and its CRD come from kube's `CustomResource` derive (`src/greeting.rs`;
//! `crd.yaml` is generated from it); what the controller watches is declared in code and
//! registered with the watcher when the reconciler starts. The ConfigMap is deleted by the
//! finalizer rather than left to the garbage collector, so the example also works where no
//! garbage collector runs.

use std::sync::Arc;

use k8s_openapi::{api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use switchyard_sdk::{
    Action, Builder, Context, Controller, EventType, Refusal, Result,
    finalizer::{Step, finalize},
};

mod greeting;
pub mod webhooks;
pub use greeting::{FINALIZER, Greeting, GreetingSpec, GreetingStatus, config_map_name};

/// The controller: Greetings, and the ConfigMaps they control; what it writes (its RBAC).
pub fn controller() -> impl Controller {
    Builder::for_::<Greeting>()
        .owns::<ConfigMap>()
        .writes::<Greeting>(&["patch"])
        .writes_subresource::<Greeting>("status", &["patch"])
        .writes::<ConfigMap>(&["create", "patch", "delete"])
        .reconcile(reconcile)
}

async fn reconcile(greeting: Arc<Greeting>, ctx: Context) -> Result {
    let greetings: Api<Greeting> = ctx.api(&greeting.namespace().unwrap_or_default());
    finalize(&greetings, FINALIZER, (*greeting).clone(), |step| async {
        match step {
            Step::Apply(greeting) => apply(&ctx, &greetings, &greeting).await,
            Step::Cleanup(greeting) => cleanup(&ctx, &greeting).await,
        }
    })
    .await
}

async fn apply(ctx: &Context, greetings: &Api<Greeting>, greeting: &Greeting) -> Result {
    let (namespace, name) = (
        greeting.namespace().unwrap_or_default(),
        greeting.name_any(),
    );
    let map_name = config_map_name(&name);
    let maps: Api<ConfigMap> = ctx.api(&namespace);
    let data = Some([("message".to_owned(), greeting.spec.message.clone())].into());
    match ctx
        .cache
        .get::<ConfigMap>(&namespace, &map_name, None)
        .await?
    {
        None => {
            // A stale cache may miss one that exists: the create then fails with 409 and
            // the queue retries from a fresher read.
            let metadata = ObjectMeta {
                name: Some(map_name.clone()),
                owner_references: greeting.controller_owner_ref(&()).map(|r| vec![r]),
                ..Default::default()
            };
            let map = ConfigMap {
                metadata,
                data,
                ..Default::default()
            };
            maps.create(&PostParams::default(), &map).await?;
            record(
                ctx,
                greeting,
                "Created",
                format!("created ConfigMap {map_name}"),
            );
        }
        Some(map) if map.data != data => {
            let patch =
                json!({"metadata": {"resourceVersion": map.resource_version()}, "data": data});
            maps.patch(&map_name, &PatchParams::default(), &Patch::Merge(patch))
                .await?;
            record(
                ctx,
                greeting,
                "Updated",
                format!("updated ConfigMap {map_name}"),
            );
        }
        Some(_) => {}
    }
    let status = GreetingStatus {
        observed_generation: greeting.metadata.generation,
        config_map: Some(map_name),
    };
    if greeting.status.as_ref() != Some(&status) {
        let patch = Patch::Merge(json!({ "status": status }));
        greetings
            .patch_status(&name, &PatchParams::default(), &patch)
            .await?;
    }
    Ok(Action::await_change())
}

async fn cleanup(ctx: &Context, greeting: &Greeting) -> Result {
    let map_name = config_map_name(&greeting.name_any());
    let maps: Api<ConfigMap> = ctx.api(&greeting.namespace().unwrap_or_default());
    match maps.delete(&map_name, &DeleteParams::default()).await {
        Ok(_) => record(
            ctx,
            greeting,
            "Deleted",
            format!("deleted ConfigMap {map_name}"),
        ),
        Err(error) if error.is_not_found() => {}
        Err(error) => return Err(error.into()),
    }
    Ok(Action::await_change())
}

fn record(ctx: &Context, greeting: &Greeting, reason: &str, note: String) {
    ctx.events
        .publish(greeting, EventType::Normal, reason, "Reconcile", note);
}
