//! Apiserver requests, measured and traced: a tower layer under the kube client.
//!
//! ```text
//!  kube::Client ─► Buffer (its task enters the caller's span) ─► ApiserverLayer ─► … ─► HTTP
//!                                                                   │
//!          span "apiserver request" {verb, resource, code}, child of the caller's span
//!          switchyard_apiserver_requests_total{verb,code}
//!          switchyard_apiserver_request_duration_seconds{verb,code}
//! ```
//!
//! The verb is the Kubernetes one (`get`, `list`, `watch`, `create`, `update`, `patch`,
//! `delete`, `deletecollection`), read from the method and path as the apiserver's own
//! request info does. `code` is the HTTP status, or `error` when no response came.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Instant,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Unit,
};
use tracing::{Instrument, field::Empty};

use crate::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: &'static str,
    /// The HTTP status code, or `error` when the request failed without a response.
    pub code: String,
}

/// Buckets from 1 ms doubling to about 16 s: most requests take milliseconds; a watch
/// lasts until the apiserver's timeout and lands in the last bucket.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// Request counts and latency of one process's apiserver client.
#[derive(Clone, Debug)]
pub struct ApiserverMetrics {
    requests: Family<RequestLabels, Counter>,
    latency: Family<RequestLabels, Histogram, fn() -> Histogram>,
}

impl ApiserverMetrics {
    pub fn register(metrics: &Metrics) -> Self {
        let this = Self {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
        };
        metrics.register(
            "switchyard_apiserver_requests",
            "Apiserver requests made, by Kubernetes verb and HTTP status code",
            this.requests.clone(),
        );
        metrics.register_with_unit(
            "switchyard_apiserver_request_duration",
            "Apiserver request latency to the response headers, by verb and code",
            Unit::Seconds,
            this.latency.clone(),
        );
        this
    }
}

/// Measures every request; with `traced`, also makes a span per request.
#[derive(Clone, Debug)]
pub struct ApiserverLayer {
    metrics: ApiserverMetrics,
    traced: bool,
}

impl ApiserverLayer {
    /// `traced`: whether requests get spans (only when exporting; a watcher's long watches
    /// are not worth a span each).
    pub fn new(metrics: ApiserverMetrics, traced: bool) -> Self {
        Self { metrics, traced }
    }
}

impl<S> tower_layer::Layer<S> for ApiserverLayer {
    type Service = Apiserver<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Apiserver {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Apiserver<S> {
    inner: S,
    layer: ApiserverLayer,
}

impl<S, B, RB> tower_service::Service<http::Request<B>> for Apiserver<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let (verb, resource) = classify(request.method(), request.uri());
        let span = if self.layer.traced && crate::trace::exporting() {
            tracing::info_span!(
                "apiserver request",
                otel.kind = "client",
                verb,
                resource,
                http.request.method = %request.method(),
                url.path = request.uri().path(),
                code = Empty,
                http.response.status_code = Empty,
                otel.status_code = Empty,
            )
        } else {
            tracing::Span::none()
        };
        let future = {
            let _entered = span.enter();
            self.inner.call(request)
        };
        let metrics = self.layer.metrics.clone();
        Box::pin(
            async move {
                let start = Instant::now();
                let result = future.await;
                let code = match &result {
                    Ok(response) => response.status().as_u16().to_string(),
                    Err(_) => "error".to_owned(),
                };
                let span = tracing::Span::current();
                span.record("code", code.as_str());
                if let Ok(response) = &result {
                    span.record("http.response.status_code", response.status().as_u16());
                    if response.status().is_server_error() {
                        span.record("otel.status_code", "ERROR");
                    }
                }
                let labels = RequestLabels { verb, code };
                metrics
                    .latency
                    .get_or_create(&labels)
                    .observe(start.elapsed().as_secs_f64());
                metrics.requests.get_or_create(&labels).inc();
                result
            }
            .instrument(span),
        )
    }
}

/// The Kubernetes verb and resource of a request, from its method and path (as the
/// apiserver's request info reads them).
pub fn classify(method: &http::Method, uri: &http::Uri) -> (&'static str, String) {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => &[][..],
    };
    // namespaces/<ns>/<resource>[/<name>[/<subresource>]], or <resource>[/<name>...]
    let rest = match rest {
        ["namespaces", _ns, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    let resource = match rest {
        [] => String::new(),
        [resource] => (*resource).to_owned(),
        [resource, _name] => (*resource).to_owned(),
        [resource, _name, sub, ..] => format!("{resource}/{sub}"),
    };
    let named = rest.len() >= 2;
    let watch = uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let verb = match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE if named => "delete",
        http::Method::DELETE => "deletecollection",
        _ => "other",
    };
    (verb, resource)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verb_of(method: http::Method, uri: &str) -> (&'static str, String) {
        classify(&method, &uri.parse().expect("a valid uri"))
    }

    #[test]
    fn verbs_and_resources_follow_the_apiserver_request_info() {
        use http::Method;
        let cases = [
            (Method::GET, "/api/v1/namespaces/a/pods", "list", "pods"),
            (
                Method::GET,
                "/api/v1/namespaces/a/pods?watch=true&resourceVersion=5",
                "watch",
                "pods",
            ),
            (Method::GET, "/api/v1/namespaces/a/pods/p", "get", "pods"),
            (Method::POST, "/api/v1/namespaces/a/pods", "create", "pods"),
            (
                Method::PUT,
                "/apis/apps/v1/namespaces/a/replicasets/r/status",
                "update",
                "replicasets/status",
            ),
            (
                Method::PATCH,
                "/apis/apps/v1/namespaces/a/replicasets/r",
                "patch",
                "replicasets",
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/a/pods/p",
                "delete",
                "pods",
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/a/pods",
                "deletecollection",
                "pods",
            ),
            (Method::GET, "/api/v1/namespaces/a", "get", "namespaces"),
            (Method::GET, "/api/v1/nodes", "list", "nodes"),
            (Method::GET, "/version", "list", ""),
        ];
        for (method, uri, verb, resource) in cases {
            assert_eq!(verb_of(method, uri), (verb, resource.to_owned()), "{uri}");
        }
    }
}
