//! The Greeting controller of `src/lib.rs` written with kube-rs's `Controller`, for the
//! comparison in docs/sdk.md: the same watches, finalizer, ConfigMap, events and status.
//! The CRD type is the example's own (both derive it the same way).

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::{api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    runtime::{
        Controller,
        controller::Action,
        events::{Event, EventType, Recorder, Reporter},
        finalizer::{Event as Step, finalizer},
        watcher,
    },
};
use serde_json::json;
use switchyard_example_greeting::{FINALIZER, Greeting, GreetingStatus, config_map_name};

pub struct Ctx {
    client: Client,
    recorder: Recorder,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Finalizer(#[from] Box<kube::runtime::finalizer::Error<kube::Error>>),
}

/// Runs the controller for one namespace until the process ends.
pub async fn run(client: Client, namespace: &str) {
    let greetings = Api::<Greeting>::namespaced(client.clone(), namespace);
    let maps = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    let reporter = Reporter {
        controller: "greeting-kube-rs".into(),
        instance: None,
    };
    let recorder = Recorder::new(client.clone(), reporter);
    Controller::new(greetings, watcher::Config::default())
        .owns(maps, watcher::Config::default())
        .run(reconcile, error_policy, Arc::new(Ctx { client, recorder }))
        .for_each(|_| async {})
        .await;
}

async fn reconcile(greeting: Arc<Greeting>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let namespace = greeting.namespace().unwrap_or_default();
    let greetings: Api<Greeting> = Api::namespaced(ctx.client.clone(), &namespace);
    finalizer(&greetings, FINALIZER, greeting, |step| async {
        match step {
            Step::Apply(greeting) => apply(&ctx, &greetings, &greeting).await,
            Step::Cleanup(greeting) => cleanup(&ctx, &greeting).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

fn error_policy(_: Arc<Greeting>, _: &Error, _: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

async fn apply(ctx: &Ctx, greetings: &Api<Greeting>, greeting: &Greeting) -> kube::Result<Action> {
    let (namespace, name) = (
        greeting.namespace().unwrap_or_default(),
        greeting.name_any(),
    );
    let map_name = config_map_name(&name);
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
    let data = Some([("message".to_owned(), greeting.spec.message.clone())].into());
    match maps.get_opt(&map_name).await? {
        None => {
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
            )
            .await;
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
            )
            .await;
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

async fn cleanup(ctx: &Ctx, greeting: &Greeting) -> kube::Result<Action> {
    let map_name = config_map_name(&greeting.name_any());
    let maps: Api<ConfigMap> = Api::namespaced(
        ctx.client.clone(),
        &greeting.namespace().unwrap_or_default(),
    );
    match maps.delete(&map_name, &DeleteParams::default()).await {
        Ok(_) => {
            record(
                ctx,
                greeting,
                "Deleted",
                format!("deleted ConfigMap {map_name}"),
            )
            .await
        }
        Err(kube::Error::Api(status)) if status.is_not_found() => {}
        Err(error) => return Err(error),
    }
    Ok(Action::await_change())
}

async fn record(ctx: &Ctx, greeting: &Greeting, reason: &str, note: String) {
    let event = Event {
        type_: EventType::Normal,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    // As the Switchyard version: an event that cannot be recorded does not fail the reconcile.
    let _ = ctx
        .recorder
        .publish(&event, &greeting.object_ref(&()))
        .await;
}
