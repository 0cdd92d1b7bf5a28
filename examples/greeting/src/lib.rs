//! An example of a user's own controller on the Switchyard SDK.
//!
//! A `Greeting` (`example.switchyard.io/v1`, `crd.yaml`) asks for a ConfigMap
//! `greeting-<name>` holding its message. The controller:
//!
//! ```text
//!  cache: Greeting ─► finalizer (example.switchyard.io/cleanup)
//!     Apply:   ConfigMap absent ─► create (controller owner: the Greeting)   event Created
//!              message differs  ─► patch (resourceVersion-guarded)           event Updated
//!              status: observedGeneration, configMap
//!     Cleanup: delete the ConfigMap                                          event Deleted
//! ```
//!
//! It shows the pieces a controller of one's own uses: a typed custom resource without
//! derive macros, reads from the watcher's cache, writes to the apiserver, an event, and a
//! finalizer. The ConfigMap is deleted by the finalizer rather than left to the garbage
//! collector, so the example also works where no garbage collector runs.

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::json;
use switchyard_k8s::{
    Api, DeleteParams, ObjectMeta, PostParams,
    k8s_openapi::{self, NamespaceResourceScope, api::core::v1::ConfigMap},
    kube::{
        Resource, ResourceExt,
        api::{Patch, PatchParams},
    },
};

use switchyard_reconciler::{
    finalizer::{Step, finalize},
    sdk::{Action, Context, Controller, Error, EventType, Request, Result},
};

/// The name the watcher's keys carry (`watcher-config.yaml`).
pub const NAME: &str = "example.switchyard.io/v1/Greeting";
/// The finalizer that deletes the ConfigMap before the Greeting goes.
pub const FINALIZER: &str = "example.switchyard.io/cleanup";

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Greeting {
    pub metadata: ObjectMeta,
    pub spec: GreetingSpec,
    #[serde(default)]
    pub status: Option<GreetingStatus>,
}

/// With `apiVersion` and `kind`, which the apiserver needs on a create.
impl Serialize for Greeting {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use k8s_openapi::Resource;
        use serde::ser::SerializeStruct;
        let mut object = serializer.serialize_struct("Greeting", 5)?;
        object.serialize_field("apiVersion", Self::API_VERSION)?;
        object.serialize_field("kind", Self::KIND)?;
        object.serialize_field("metadata", &self.metadata)?;
        object.serialize_field("spec", &self.spec)?;
        if let Some(status) = &self.status {
            object.serialize_field("status", status)?;
        }
        object.end()
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct GreetingSpec {
    pub message: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GreetingStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<String>,
}

impl k8s_openapi::Resource for Greeting {
    const API_VERSION: &'static str = "example.switchyard.io/v1";
    const GROUP: &'static str = "example.switchyard.io";
    const KIND: &'static str = "Greeting";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "greetings";
    type Scope = NamespaceResourceScope;
}

impl k8s_openapi::Metadata for Greeting {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The ConfigMap a Greeting named `name` controls.
pub fn config_map_name(name: &str) -> String {
    format!("greeting-{name}")
}

/// The ConfigMap `greeting` asks for, controlled by it.
pub fn desired_config_map(greeting: &Greeting) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(config_map_name(&greeting.name_any())),
            namespace: greeting.namespace(),
            owner_references: greeting.controller_owner_ref(&()).map(|r| vec![r]),
            ..Default::default()
        },
        data: Some([("message".to_owned(), greeting.spec.message.clone())].into()),
        ..Default::default()
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct GreetingController;

impl Controller for GreetingController {
    fn name(&self) -> &str {
        NAME
    }

    fn reconcile<'a>(&'a self, ctx: &'a Context, request: &'a Request) -> BoxFuture<'a, Result> {
        Box::pin(reconcile(ctx, request))
    }
}

async fn reconcile(ctx: &Context, request: &Request) -> Result {
    let Some(greeting) = ctx
        .cache
        .get::<Greeting>(&request.namespace, &request.name, None)
        .await?
    else {
        // Gone: its finalizer already ran.
        return Ok(Action::Done);
    };
    let greetings: Api<Greeting> = Api::namespaced(ctx.client.clone(), &request.namespace);
    let api = &greetings;
    finalize(api, FINALIZER, greeting, |step| async move {
        match step {
            Step::Apply(greeting) => apply(ctx, api, &greeting).await,
            Step::Cleanup(greeting) => cleanup(ctx, &greeting).await,
        }
    })
    .await
}

async fn apply(ctx: &Context, greetings: &Api<Greeting>, greeting: &Greeting) -> Result {
    let namespace = greeting.namespace().unwrap_or_default();
    let name = config_map_name(&greeting.name_any());
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
    let desired = desired_config_map(greeting);
    match ctx.cache.get::<ConfigMap>(&namespace, &name, None).await? {
        None => {
            // A stale cache may miss one that exists: the create then fails with 409 and
            // the queue retries from a fresher read.
            maps.create(&PostParams::default(), &desired).await?;
            record(
                ctx,
                greeting,
                "Created",
                format!("created ConfigMap {name}"),
            );
        }
        Some(current) if current.data != desired.data => {
            let patch = json!({
                "metadata": {"resourceVersion": current.resource_version()},
                "data": desired.data,
            });
            maps.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await?;
            record(
                ctx,
                greeting,
                "Updated",
                format!("updated ConfigMap {name}"),
            );
        }
        Some(_) => {}
    }
    let status = GreetingStatus {
        observed_generation: greeting.metadata.generation,
        config_map: Some(name),
    };
    if greeting.status.as_ref() != Some(&status) {
        greetings
            .patch_status(
                &greeting.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await?;
    }
    Ok(Action::Done)
}

async fn cleanup(ctx: &Context, greeting: &Greeting) -> Result {
    let namespace = greeting.namespace().unwrap_or_default();
    let name = config_map_name(&greeting.name_any());
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
    match maps.delete(&name, &DeleteParams::default()).await {
        Ok(_) => {
            record(
                ctx,
                greeting,
                "Deleted",
                format!("deleted ConfigMap {name}"),
            );
        }
        Err(switchyard_k8s::kube::Error::Api(status)) if status.is_not_found() => {}
        Err(error) => return Err(Error::from(error)),
    }
    Ok(Action::Done)
}

/// Records a Normal event; it is written in the background, and one that cannot be recorded
/// does not fail the reconcile.
fn record(ctx: &Context, greeting: &Greeting, reason: &str, note: String) {
    ctx.events
        .publish(greeting, EventType::Normal, reason, "Reconcile", note);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_map_is_controlled_by_its_greeting() {
        let greeting = Greeting {
            metadata: ObjectMeta {
                name: Some("hi".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: GreetingSpec {
                message: "hello".into(),
            },
            status: None,
        };
        let map = desired_config_map(&greeting);
        assert_eq!(map.metadata.name.as_deref(), Some("greeting-hi"));
        let owner = &map.metadata.owner_references.expect("owned")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("Greeting", "u1", Some(true))
        );
        assert_eq!(map.data.expect("data")["message"], "hello");
    }
}
