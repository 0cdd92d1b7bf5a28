//! The service account controller on the SDK (kube-controller-manager's
//! `serviceaccounts-controller`): every active namespace has a `default` ServiceAccount, which
//! ServiceAccount admission needs before a Pod can be created there. The decision is
//! `switchyard_reconciler_core::serviceaccount`'s; this module reads and writes.
//!
//! ```text
//!  keys: a Namespace added or changed; a ServiceAccount changed or deleted keys its Namespace
//!  cache: Namespace ─ gone, or not Active ─► Done
//!     ─► cache: each ensured account of the namespace ─ there ─► Done
//!     ─► apiserver: create it ─ AlreadyExists, or the namespace began terminating ─► Done
//!        │ any other refusal: Err (the queue backs off)
//! ```

use switchyard_k8s::{
    Api, Namespace, ObjectMeta, PostParams, k8s_openapi::api::core::v1::ServiceAccount,
};
use switchyard_reconciler_core::serviceaccount::{ENSURED, missing};
use tracing::{debug, info};

use crate::builtin::{Builtin, Permission};
use crate::sdk::{
    Action, Builder, Context, Controller, Map, Options, Refusal, Request, Result, Watches,
    is_namespace_terminating,
};

pub const NAME: &str = switchyard_work::builtin::SERVICE_ACCOUNT;

/// This controller, as the reconciler's list of built-ins names it.
pub const BUILTIN: Builtin = Builtin {
    name: NAME,
    service_account: "switchyard-serviceaccount-controller",
    permissions: PERMISSIONS,
    register: |registry, _| {
        registry.register(ServiceAccountController);
    },
};

/// What its account may do (`deploy/kustomize/base/rbac.yaml` grants exactly this): create
/// ServiceAccounts. Namespaces and ServiceAccounts are read through the watcher's cache; it
/// records no Events, as kube-controller-manager's does not.
pub const PERMISSIONS: &[Permission] = &[Permission::new("", &["serviceaccounts"], &["create"])];

/// Every change of a Namespace keys it (a new one, and one whose phase changed); a
/// ServiceAccount's change keys its Namespace, so that a deleted `default` is made again, as
/// kube-controller-manager's controller hears of deletions. ServiceAccounts are cached as
/// metadata only: only their names are read.
pub fn watches() -> Watches {
    Builder::for_::<Namespace>()
        .named(NAME)
        .watches_with::<ServiceAccount>(Map::namespace(), Options::default().metadata_only())
        .into_watches()
}

/// kube-controller-manager's service account controller.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServiceAccountController;

impl Controller for ServiceAccountController {
    fn name(&self) -> &str {
        NAME
    }

    fn watches(&self) -> Option<Watches> {
        Some(watches())
    }

    async fn reconcile(&self, ctx: &Context, request: &Request) -> Result {
        reconcile(ctx, request).await
    }
}

async fn reconcile(ctx: &Context, request: &Request) -> Result {
    let namespace = &request.name;
    let Some(cached) = ctx.cache.get::<Namespace>("", namespace, None).await? else {
        debug!("namespace gone");
        return Ok(Action::Done);
    };
    let mut present = Vec::new();
    for name in ENSURED {
        if ctx
            .cache
            .get_metadata::<ServiceAccount>(namespace, name, None)
            .await?
            .is_some()
        {
            present.push(*name);
        }
    }
    let api: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), namespace);
    for name in missing(&cached, ENSURED, |name| present.contains(&name)) {
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &account).await {
            Ok(created) => {
                ctx.cache.wrote(&created);
                info!(account = name, "service account created");
            }
            // Made meanwhile (by this controller's previous reconcile, which the cache has not
            // shown yet, or by someone else), or the namespace began terminating: nothing to do,
            // as kube-controller-manager ignores both.
            Err(error) if error.is_already_exists() || is_namespace_terminating(&error) => {
                debug!(account = name, %error, "service account not created");
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(Action::Done)
}
