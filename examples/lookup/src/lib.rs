//! An example of what only Switchyard gives a controller: each reconcile makes a slow call to
//! an external service, so one reconciler process answers only so many objects a second,
//! and the way to go faster is more reconciler replicas.
//!
//! ```text
//!  Lookup (spec.query) ─► queue ─► reconciler × N ─ GET <service>?q=<query> (slow) ─► status.answer
//!                           │
//!                           └─ external metric switchyard_queue_backlog{controller=example.switchyard.io.v1.Lookup}
//!                                ─► HPA (deploy/hpa.yaml) ─► replicas = backlog / 20, 1 to 4
//! ```
//!
//! The queue spreads the keys over every replica's Work stream and never hands one key to
//! two replicas at once; a replica that dies mid-call loses its leases to the others after
//! the lease timeout. With kube-rs or controller-runtime the controller runs in one active
//! process (leader election): its reconciles cannot spread over replicas.
//!
//! The reconcile skips the call when the status already answers the object's generation,
//! and the `for` watch keys generation changes only, so the status write does not key the
//! object again.

use std::{sync::Arc, time::Duration};

use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;
use switchyard_sdk::{Action, Builder, Context, Controller, Error, Options, Predicate, Result};
use tracing::Instrument;

mod lookup;
pub use lookup::{Lookup, LookupSpec, LookupStatus};

/// A call that takes longer is a failure, retried with the queue's backoff.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The external service the reconciles ask: `GET <url>?q=<query>` answers with the text.
#[derive(Clone, Debug)]
pub struct Service {
    url: reqwest::Url,
    http: reqwest::Client,
}

impl Service {
    /// The service at `url`, or an error naming what is wrong with it.
    pub fn new(url: &str) -> anyhow::Result<Self> {
        let url = reqwest::Url::parse(url)
            .map_err(|e| anyhow::anyhow!("--lookup-url: {url:?} is not a URL: {e}"))?;
        anyhow::ensure!(
            matches!(url.scheme(), "http" | "https"),
            "--lookup-url: {url} is not an http(s) URL"
        );
        let http = reqwest::Client::builder().timeout(CALL_TIMEOUT).build()?;
        Ok(Self { url, http })
    }

    async fn ask(&self, query: &str) -> Result<String> {
        let failed = |e: reqwest::Error| Error::Other(format!("lookup service: {e}"));
        let response = self
            .http
            .get(self.url.clone())
            .query(&[("q", query)])
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(failed)?;
        Ok(response.text().await.map_err(failed)?.trim().to_owned())
    }
}

/// The controller: Lookups, each answered by `service`.
pub fn controller(service: Service) -> impl Controller {
    let service = Arc::new(service);
    Builder::for_with::<Lookup>(Options::default().predicates([Predicate::GenerationChanged]))
        .reconcile(move |lookup, ctx| reconcile(lookup, ctx, service.clone()))
}

async fn reconcile(lookup: Arc<Lookup>, ctx: Context, service: Arc<Service>) -> Result {
    let generation = lookup.metadata.generation;
    let answered = lookup.status.as_ref().map(|s| s.observed_generation);
    if answered.is_some() && answered == Some(generation) {
        return Ok(Action::await_change());
    }
    // The slow external call: a span of its own inside the reconcile's, in the trace.
    let span = tracing::info_span!("lookup", otel.kind = "client", query = %lookup.spec.query);
    let answer = service.ask(&lookup.spec.query).instrument(span).await?;
    let lookups: Api<Lookup> = ctx.api(&lookup.namespace().unwrap_or_default());
    let status = json!({"status": {"answer": answer, "observedGeneration": generation}});
    lookups
        .patch_status(
            &lookup.name_any(),
            &PatchParams::default(),
            &Patch::Merge(status),
        )
        .await?;
    Ok(Action::await_change())
}
