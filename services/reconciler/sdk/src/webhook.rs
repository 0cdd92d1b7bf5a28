//! Admission (validating and mutating) and CRD conversion webhooks, served by a controller's
//! reconciler binary over HTTPS beside its controllers.
//!
//! ```text
//!  apiserver ─ POST <path> (AdmissionReview / ConversionReview) ─► --webhook-addr (TLS)
//!     validating: check(request)   ─► allowed | denied with its message (+ warnings)
//!     mutating:   mutate(request)  ─► the object as it should be ─► a JSON patch from the one sent
//!     conversion: convert(object, desired apiVersion), each object ─► converted | failed
//! ```
//!
//! The server presents `--webhook-tls-cert` (by default the service's own `--tls-cert`, whose
//! names are its Service's), reloaded when its files change as the service's certificate is.
//! The apiserver finds it through the webhook configuration's `clientConfig` (a Service, or a
//! URL) and trusts it through its `caBundle`. A body that is no review of the kind gets a 400
//! naming what is wrong; an object that does not decode as the webhook's type is denied with
//! the decoding error, so the apiserver's answer names it.

use std::{collections::BTreeMap, fmt, future::Future, sync::Arc, time::Instant};

use futures::future::BoxFuture;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;
use switchyard_k8s::kube::{
    Resource,
    core::{
        DynamicObject, Status,
        admission::{AdmissionRequest, AdmissionResponse, AdmissionReview},
        conversion::{ConversionRequest, ConversionResponse, ConversionReview},
    },
};

use crate::metrics::WebhookMetrics;

/// The largest review accepted: an object and its old version, each at most the apiserver's
/// 3 MiB request limit, with room to spare.
pub(crate) const MAX_REVIEW_BYTES: usize = 16 << 20;

/// What a validating webhook decides about one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    allowed: bool,
    message: String,
    warnings: Vec<String>,
}

impl Verdict {
    /// The request may go ahead.
    pub fn allow() -> Self {
        Self {
            allowed: true,
            message: String::new(),
            warnings: Vec::new(),
        }
    }

    /// The request is refused; the apiserver's error carries `message`.
    pub fn deny(message: impl Into<String>) -> Self {
        Self {
            allowed: false,
            message: message.into(),
            warnings: Vec::new(),
        }
    }

    /// Adds a warning the client is shown (`kubectl` prints it), allowed or not.
    pub fn warning(mut self, warning: impl Into<String>) -> Self {
        self.warnings.push(warning.into());
        self
    }

    /// Whether the request may go ahead.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }
}

/// What one path answers: a review's response, or a request that is none.
#[derive(Debug, PartialEq)]
pub(crate) enum Reply {
    /// The review to send back (200), and the outcome for the metrics.
    Review(Value, Outcome),
    /// Not a review this path serves (400), with what is wrong.
    Malformed(String),
}

/// How a request ended, as the metrics count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed,
    Denied,
    Patched,
    Converted,
    Failed,
    Malformed,
}

impl Outcome {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::Patched => "patched",
            Self::Converted => "converted",
            Self::Failed => "failed",
            Self::Malformed => "malformed",
        }
    }
}

type Handler = Arc<dyn Fn(Vec<u8>) -> BoxFuture<'static, Reply> + Send + Sync>;

/// A path's handler, and what kind of webhook it is.
#[derive(Clone)]
struct Route {
    kind: &'static str,
    handler: Handler,
}

/// The webhooks a binary serves, by path: `Webhooks::default().validate::<K>(...)`, then
/// [`crate::Registry::webhooks`].
#[derive(Clone, Default)]
pub struct Webhooks {
    routes: BTreeMap<String, Route>,
}

impl fmt::Debug for Webhooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.routes.iter().map(|(path, route)| (path, route.kind)))
            .finish()
    }
}

impl Webhooks {
    /// A validating admission webhook for `K` at `path` (controller-runtime's
    /// `WithValidator`): `check` sees each request (operation, object, old object, user) and
    /// allows or denies it.
    ///
    /// # Panics
    ///
    /// If `path` does not start with `/`, or already has a webhook.
    pub fn validate<K, F, Fut>(self, path: &str, check: F) -> Self
    where
        K: Resource + DeserializeOwned + Send + 'static,
        F: Fn(AdmissionRequest<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Verdict> + Send + 'static,
    {
        let check = Arc::new(check);
        self.route(path, "validating", move |body| {
            let check = check.clone();
            Box::pin(async move {
                let request = match admission_request::<K>(&body) {
                    Ok(request) => request,
                    Err(reply) => return reply,
                };
                let response = AdmissionResponse::from(&request);
                let verdict = check(request).await;
                let outcome = if verdict.allowed {
                    Outcome::Allowed
                } else {
                    Outcome::Denied
                };
                let mut response = if verdict.allowed {
                    response
                } else {
                    response.deny(verdict.message)
                };
                if !verdict.warnings.is_empty() {
                    response.warnings = Some(verdict.warnings);
                }
                review(response, outcome)
            })
        })
    }

    /// A mutating admission webhook for `K` at `path` (controller-runtime's
    /// `WithDefaulter`): `mutate` returns the object as it should be created or updated
    /// (`Ok(None)`: as it is), or a denial; the apiserver is sent the JSON patch from the
    /// object it sent to that one.
    ///
    /// # Panics
    ///
    /// If `path` does not start with `/`, or already has a webhook.
    pub fn mutate<K, F, Fut>(self, path: &str, mutate: F) -> Self
    where
        K: Resource + DeserializeOwned + Serialize + Send + 'static,
        F: Fn(AdmissionRequest<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<K>, String>> + Send + 'static,
    {
        let mutate = Arc::new(mutate);
        self.route(path, "mutating", move |body| {
            let mutate = mutate.clone();
            Box::pin(async move {
                let request = match admission_request::<K>(&body) {
                    Ok(request) => request,
                    Err(reply) => return reply,
                };
                let response = AdmissionResponse::from(&request);
                let sent = request.object.as_ref().map(serde_json::to_value);
                match (mutate(request).await, sent) {
                    (Err(message), _) => review(response.deny(message), Outcome::Denied),
                    (Ok(Some(object)), Some(Ok(sent))) => {
                        match serde_json::to_value(&object).map(|new| patch_from(&sent, &new)) {
                            Ok(patch) if patch.0.is_empty() => review(response, Outcome::Allowed),
                            Ok(patch) => match response.clone().with_patch(patch) {
                                Ok(patched) => review(patched, Outcome::Patched),
                                Err(error) => failed(response, &error),
                            },
                            Err(error) => failed(response, &error),
                        }
                    }
                    // Nothing to patch: no change, or a request without an object (a
                    // deletion).
                    (Ok(_), _) => review(response, Outcome::Allowed),
                }
            })
        })
    }

    /// A CRD conversion webhook at `path`: `convert` turns each object into the desired
    /// `apiVersion` (its `apiVersion` is set to that one afterwards), or says why it cannot;
    /// one failure fails the whole review, as the apiserver requires.
    ///
    /// # Panics
    ///
    /// If `path` does not start with `/`, or already has a webhook.
    pub fn convert<F>(self, path: &str, convert: F) -> Self
    where
        F: Fn(Value, &str) -> Result<Value, String> + Send + Sync + 'static,
    {
        let convert = Arc::new(convert);
        self.route(path, "conversion", move |body| {
            let convert = convert.clone();
            Box::pin(async move { conversion(&body, &*convert) })
        })
    }

    /// Whether no webhook is registered.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Each path and its kind of webhook (`validating`, `mutating`, `conversion`).
    pub fn paths(&self) -> Vec<(&str, &'static str)> {
        self.routes
            .iter()
            .map(|(path, route)| (path.as_str(), route.kind))
            .collect()
    }

    /// Adds `other`'s webhooks.
    ///
    /// # Panics
    ///
    /// If a path has a webhook in both.
    pub(crate) fn merge(&mut self, other: Webhooks) {
        for (path, route) in other.routes {
            assert!(
                !self.routes.contains_key(&path),
                "webhook path {path} registered twice"
            );
            self.routes.insert(path, route);
        }
    }

    fn route(
        mut self,
        path: &str,
        kind: &'static str,
        handler: impl Fn(Vec<u8>) -> BoxFuture<'static, Reply> + Send + Sync + 'static,
    ) -> Self {
        assert!(
            path.starts_with('/') && path.len() > 1,
            "webhook path {path:?} must start with '/' and name something"
        );
        assert!(
            !self.routes.contains_key(path),
            "webhook path {path} registered twice"
        );
        self.routes.insert(
            path.to_owned(),
            Route {
                kind,
                handler: Arc::new(handler),
            },
        );
        self
    }

    /// Answers one request to `path` (`None`: no webhook there).
    pub(crate) async fn answer(&self, path: &str, body: Vec<u8>) -> Option<Reply> {
        let route = self.routes.get(path)?;
        Some((route.handler)(body).await)
    }
}

/// The request of an `AdmissionReview` of `K`; a body that is no review is malformed, and a
/// review whose object is no `K` is denied with the decoding error.
fn admission_request<K: Resource + DeserializeOwned>(
    body: &[u8],
) -> Result<AdmissionRequest<K>, Reply> {
    match serde_json::from_slice::<AdmissionReview<K>>(body) {
        Ok(review) => review
            .try_into()
            .map_err(|_| Reply::Malformed("the AdmissionReview has no request".into())),
        Err(error) => {
            // A review whose object is no K still has a uid to answer with.
            let any: AdmissionReview<DynamicObject> = serde_json::from_slice(body)
                .map_err(|e| Reply::Malformed(format!("not an AdmissionReview: {e}")))?;
            let request: AdmissionRequest<DynamicObject> = any
                .try_into()
                .map_err(|_| Reply::Malformed("the AdmissionReview has no request".into()))?;
            let response = AdmissionResponse::from(&request).deny(format!(
                "the webhook cannot read the {}: {error}",
                request.kind.kind
            ));
            Err(review(response, Outcome::Denied))
        }
    }
}

fn review(response: AdmissionResponse, outcome: Outcome) -> Reply {
    match serde_json::to_value(response.into_review()) {
        Ok(value) => Reply::Review(value, outcome),
        Err(error) => Reply::Malformed(format!("the response does not serialize: {error}")),
    }
}

/// The request denied because its answer could not be made.
fn failed(response: AdmissionResponse, error: &dyn fmt::Display) -> Reply {
    match review(
        response.deny(format!("the webhook failed: {error}")),
        Outcome::Failed,
    ) {
        Reply::Review(value, _) => Reply::Review(value, Outcome::Failed),
        malformed => malformed,
    }
}

/// The JSON patch (RFC 6902) that turns `sent` into `wanted`.
fn patch_from(sent: &Value, wanted: &Value) -> json_patch::Patch {
    json_patch::diff(sent, wanted)
}

fn conversion(body: &[u8], convert: &dyn Fn(Value, &str) -> Result<Value, String>) -> Reply {
    let review: ConversionReview = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(error) => return Reply::Malformed(format!("not a ConversionReview: {error}")),
    };
    let request = match ConversionRequest::from_review(review) {
        Ok(request) => request,
        Err(_) => return Reply::Malformed("the ConversionReview has no request".into()),
    };
    let desired = request.desired_api_version.clone();
    let objects = request.objects.clone();
    let response = ConversionResponse::for_request(request);
    let mut converted = Vec::with_capacity(objects.len());
    let mut failure = None;
    for object in objects {
        match convert(object, &desired) {
            Ok(mut object) => {
                if let Some(fields) = object.as_object_mut() {
                    fields.insert("apiVersion".into(), Value::String(desired.clone()));
                }
                converted.push(object);
            }
            Err(message) => {
                failure = Some(message);
                break;
            }
        }
    }
    let (response, outcome) = match failure {
        None => (response.success(converted), Outcome::Converted),
        Some(message) => (
            response.failure(Status::failure(&message, "ConversionFailed")),
            Outcome::Failed,
        ),
    };
    match serde_json::to_value(response.into_review()) {
        Ok(value) => Reply::Review(value, outcome),
        Err(error) => Reply::Malformed(format!("the response does not serialize: {error}")),
    }
}

/// Serves `webhooks` on `listener` until `drain` is signaled.
pub(crate) async fn serve(
    webhooks: Webhooks,
    listener: switchyard_runtime::tls::HttpsListener,
    metrics: WebhookMetrics,
    drain: switchyard_runtime::Drain,
) {
    use axum::{
        body::Bytes,
        extract::{DefaultBodyLimit, State},
        http::{StatusCode, Uri, header},
        response::IntoResponse,
    };

    let state = Arc::new((webhooks, metrics));
    let handler = |State(state): State<Arc<(Webhooks, WebhookMetrics)>>, uri: Uri, body: Bytes| async move {
        let (webhooks, metrics) = &*state;
        let started = Instant::now();
        let path = uri.path().to_owned();
        let Some(reply) = webhooks.answer(&path, body.to_vec()).await else {
            return (StatusCode::NOT_FOUND, format!("no webhook at {path}")).into_response();
        };
        match reply {
            Reply::Review(value, outcome) => {
                metrics.observe(&path, outcome.label(), started.elapsed());
                (
                    [(header::CONTENT_TYPE, "application/json")],
                    value.to_string(),
                )
                    .into_response()
            }
            Reply::Malformed(message) => {
                metrics.observe(&path, Outcome::Malformed.label(), started.elapsed());
                tracing::warn!(%path, %message, "malformed webhook request");
                (StatusCode::BAD_REQUEST, message).into_response()
            }
        }
    };
    let router = axum::Router::new()
        .fallback(axum::routing::post(handler))
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
        .with_state(state);
    let shutdown = async move { drain.signaled().await };
    if let Err(error) = axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::warn!(%error, "the webhook server stopped");
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;

    use super::*;

    fn admission(operation: &str, object: Value) -> Vec<u8> {
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
                "resource": {"group": "", "version": "v1", "resource": "configmaps"},
                "name": "web",
                "namespace": "team",
                "operation": operation,
                "userInfo": {"username": "alice"},
                "object": object,
                "oldObject": null,
                "dryRun": false,
            }
        })
        .to_string()
        .into_bytes()
    }

    fn config_map(data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "web", "namespace": "team"}, "data": data})
    }

    fn response(reply: Reply) -> (Value, Outcome) {
        match reply {
            Reply::Review(value, outcome) => (value["response"].clone(), outcome),
            Reply::Malformed(message) => panic!("malformed: {message}"),
        }
    }

    fn webhooks() -> Webhooks {
        Webhooks::default()
            .validate::<ConfigMap, _, _>("/validate", |request| async move {
                let object = request.object.unwrap();
                match object.data.as_ref().and_then(|d| d.get("size")) {
                    Some(size) if size.parse::<u32>().is_err() => {
                        Verdict::deny(format!("size {size:?} is not a number"))
                    }
                    Some(_) => Verdict::allow(),
                    None => Verdict::allow().warning("no size: 1 is assumed"),
                }
            })
            .mutate::<ConfigMap, _, _>("/default", |request| async move {
                let mut object = request.object.unwrap();
                let data = object.data.get_or_insert_default();
                if data.contains_key("size") {
                    return Ok(None);
                }
                data.insert("size".into(), "1".into());
                Ok(Some(object))
            })
            .convert("/convert", |mut object, desired| {
                if desired != "example.com/v2" {
                    return Err(format!("cannot convert to {desired}"));
                }
                let size = object["spec"]["size"].take();
                object["spec"] = json!({"replicas": size});
                Ok(object)
            })
    }

    #[tokio::test]
    async fn a_validating_webhook_allows_denies_and_warns() {
        let hooks = webhooks();
        let (ok, outcome) = response(
            hooks
                .answer(
                    "/validate",
                    admission("CREATE", config_map(json!({"size": "3"}))),
                )
                .await
                .unwrap(),
        );
        assert_eq!(
            (ok["allowed"].as_bool(), ok["uid"].as_str()),
            (Some(true), Some("u-1"))
        );
        assert_eq!(outcome, Outcome::Allowed);
        let (denied, outcome) = response(
            hooks
                .answer(
                    "/validate",
                    admission("UPDATE", config_map(json!({"size": "big"}))),
                )
                .await
                .unwrap(),
        );
        assert_eq!(denied["allowed"], false);
        assert_eq!(denied["status"]["message"], "size \"big\" is not a number");
        assert_eq!(outcome, Outcome::Denied);
        let (warned, _) = response(
            hooks
                .answer("/validate", admission("CREATE", config_map(json!({}))))
                .await
                .unwrap(),
        );
        assert_eq!(warned["warnings"], json!(["no size: 1 is assumed"]));
    }

    #[tokio::test]
    async fn a_mutating_webhook_answers_the_patch_from_the_object_sent() {
        let hooks = webhooks();
        let (patched, outcome) = response(
            hooks
                .answer(
                    "/default",
                    admission("CREATE", config_map(json!({"a": "b"}))),
                )
                .await
                .unwrap(),
        );
        assert_eq!(outcome, Outcome::Patched);
        assert_eq!(patched["patchType"], "JSONPatch");
        // kube's response carries the patch's bytes as a list of numbers, which the
        // apiserver's decoder reads as it reads base64.
        let patch: Vec<u8> = serde_json::from_value(patched["patch"].clone()).unwrap();
        let patch: Value = serde_json::from_slice(&patch).unwrap();
        assert_eq!(
            patch,
            json!([{"op": "add", "path": "/data/size", "value": "1"}])
        );
        // Already defaulted: allowed with no patch.
        let (unchanged, outcome) = response(
            hooks
                .answer(
                    "/default",
                    admission("CREATE", config_map(json!({"size": "2"}))),
                )
                .await
                .unwrap(),
        );
        assert_eq!(
            (unchanged["allowed"].as_bool(), outcome),
            (Some(true), Outcome::Allowed)
        );
        assert!(unchanged.get("patch").is_none_or(Value::is_null));
    }

    #[tokio::test]
    async fn bad_input_is_named_and_an_object_of_another_shape_is_denied() {
        let hooks = webhooks();
        assert!(hooks.answer("/nothing", Vec::new()).await.is_none());
        match hooks
            .answer("/validate", b"{not json".to_vec())
            .await
            .unwrap()
        {
            Reply::Malformed(message) => assert!(message.starts_with("not an AdmissionReview")),
            other => panic!("{other:?}"),
        }
        let no_request = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
        assert_eq!(
            hooks
                .answer("/validate", no_request.to_string().into_bytes())
                .await
                .unwrap(),
            Reply::Malformed("the AdmissionReview has no request".into())
        );
        // `data` of a ConfigMap holds strings only.
        let (denied, outcome) = response(
            hooks
                .answer(
                    "/validate",
                    admission("CREATE", config_map(json!({"size": 3}))),
                )
                .await
                .unwrap(),
        );
        assert_eq!(
            (denied["uid"].as_str(), outcome),
            (Some("u-1"), Outcome::Denied)
        );
        let message = denied["status"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("the webhook cannot read the ConfigMap"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn a_conversion_webhook_converts_every_object_or_fails_the_review() {
        let hooks = webhooks();
        let review = |desired: &str| {
            json!({
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "ConversionReview",
                "request": {
                    "uid": "c-1",
                    "desiredAPIVersion": desired,
                    "objects": [
                        {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "a"}, "spec": {"size": 2}},
                        {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "b"}, "spec": {"size": 5}},
                    ],
                }
            })
            .to_string()
            .into_bytes()
        };
        let (converted, outcome) = response(
            hooks
                .answer("/convert", review("example.com/v2"))
                .await
                .unwrap(),
        );
        assert_eq!(outcome, Outcome::Converted);
        assert_eq!(converted["uid"], "c-1");
        assert_eq!(converted["result"]["status"], "Success");
        let objects = converted["convertedObjects"].as_array().unwrap();
        assert_eq!(objects.len(), 2);
        assert_eq!(objects[1]["apiVersion"], "example.com/v2");
        assert_eq!(objects[1]["spec"], json!({"replicas": 5}));
        let (failed, outcome) = response(
            hooks
                .answer("/convert", review("example.com/v3"))
                .await
                .unwrap(),
        );
        assert_eq!(outcome, Outcome::Failed);
        assert_eq!(failed["result"]["status"], "Failure");
        assert_eq!(
            failed["result"]["message"],
            "cannot convert to example.com/v3"
        );
    }

    #[test]
    #[should_panic(expected = "registered twice")]
    fn a_path_has_one_webhook() {
        let _ = webhooks().convert("/convert", |object, _| Ok(object));
    }
}
