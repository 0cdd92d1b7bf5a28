//! Who may call what: the one authorization table, and the layer that applies it to every
//! gRPC call before the service sees it.
//!
//! A caller is identified by its client certificate ([`crate::tls`]). No certificate →
//! `UNAUTHENTICATED`; an identity the table does not list for the method → `PERMISSION_DENIED`
//! naming both. Each refusal is counted in `switchyard_grpc_denied_total{method,reason}`
//! (`method`: the table's row, or `unknown` for a path in none, so that no caller can add
//! series) and logged once per caller and minute.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
};
use tonic::{
    Status,
    body::Body,
    transport::server::{TcpConnectInfo, TlsConnectInfo},
};
use tracing::warn;

use crate::{
    Metrics,
    log_limiter::LogLimiter,
    status_message,
    tls::{Identity, Role, Tls},
};

/// Who may call a method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Anyone who completes the TLS handshake, with or without a certificate: health
    /// checks, for probes and load balancers that hold no Switchyard identity.
    Open,
    /// Every Switchyard identity of this installation, the observer included.
    AnyRole,
    /// Only these roles.
    Roles(&'static [Role]),
}

/// The authorization table, by full gRPC method path or by service prefix (ending in `/`).
/// A method in no row is refused to everyone.
pub const TABLE: &[(&str, Access)] = &[
    ("/grpc.health.v1.Health/", Access::Open),
    ("/grpc.reflection.v1.ServerReflection/", Access::AnyRole),
    (
        "/grpc.reflection.v1alpha.ServerReflection/",
        Access::AnyRole,
    ),
    (
        "/switchyard.queue.v1.Queue/Enqueue",
        Access::Roles(&[Role::Watcher, Role::Reconciler]),
    ),
    (
        "/switchyard.queue.v1.Queue/EnqueueStream",
        Access::Roles(&[Role::Watcher, Role::Reconciler]),
    ),
    (
        "/switchyard.queue.v1.Queue/EnqueueMany",
        Access::Roles(&[Role::Watcher, Role::Reconciler]),
    ),
    (
        "/switchyard.queue.v1.Queue/Work",
        Access::Roles(&[Role::Reconciler]),
    ),
    ("/switchyard.queue.v1.Queue/Stats", Access::AnyRole),
    // A key's name and its last error say more about the cluster's objects than depths do.
    (
        "/switchyard.queue.v1.Queue/DescribeKey",
        Access::Roles(&[Role::Operator]),
    ),
    // The same for the failing keys; the elector's console asks on an operator's behalf
    // (its own page for them is the operator's only).
    (
        "/switchyard.queue.v1.Queue/ListFailing",
        Access::Roles(&[Role::Operator, Role::Elector]),
    ),
    (
        "/switchyard.watcher.v1.Cache/Get",
        Access::Roles(&[Role::Reconciler]),
    ),
    (
        "/switchyard.watcher.v1.Cache/List",
        Access::Roles(&[Role::Reconciler]),
    ),
    (
        "/switchyard.watcher.v1.Cache/GetGraphNode",
        Access::Roles(&[Role::Reconciler]),
    ),
    (
        "/switchyard.watcher.v1.Watches/Register",
        Access::Roles(&[Role::Reconciler]),
    ),
    (
        "/switchyard.elector.v1.Elector/GetShardMap",
        Access::AnyRole,
    ),
    (
        "/switchyard.elector.v1.Elector/WatchShardMap",
        Access::AnyRole,
    ),
    (
        "/switchyard.elector.v1.Elector/DrainMember",
        Access::Roles(&[Role::Operator]),
    ),
    // The elector's console (plain HTTP on the gRPC port): what Stats and GetShardMap show,
    // to any identity; its failing keys only to operators, as DescribeKey.
    ("/console", Access::AnyRole),
    ("/console/", Access::AnyRole),
];

/// The row that governs `path` (`/package.Service/Method`).
pub fn access(path: &str) -> Option<Access> {
    row(path).map(|(_, access)| *access)
}

fn row(path: &str) -> Option<&'static (&'static str, Access)> {
    TABLE
        .iter()
        .find(|(key, _)| *key == path || (key.ends_with('/') && path.starts_with(key)))
}

/// What a refusal of `path` is counted under: the table's key for it, or `unknown`. A
/// caller chooses the path, so the metric's labels must come from a closed set.
fn method_label(path: &str) -> &'static str {
    row(path).map_or(UNKNOWN_METHOD, |(key, _)| key)
}

const UNKNOWN_METHOD: &str = "unknown";

/// The authenticated caller of a call, in the request's extensions for the service.
#[derive(Clone, Debug)]
pub struct Caller {
    pub identity: Identity,
    pub role: Role,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeniedLabels {
    /// A key of [`TABLE`], or `unknown`.
    method: &'static str,
    reason: &'static str,
}

#[derive(Debug)]
struct Policy {
    tls: Tls,
    denied: Family<DeniedLabels, Counter>,
    logged: LogLimiter,
}

impl Policy {
    fn check(&self, path: &str, peer: Peer<'_>) -> Result<Option<Caller>, Status> {
        let access = access(path);
        if access == Some(Access::Open) {
            return Ok(None);
        }
        let Some(cert) = peer.cert else {
            return Err(self.deny(path, "unauthenticated", peer.addr(), || {
                Status::unauthenticated(status_message(format!(
                    "{path} requires a client certificate of a Switchyard service"
                )))
            }));
        };
        let identity = match Identity::of_certificate(cert) {
            Ok(identity) => identity,
            Err(error) => {
                return Err(self.deny(path, "unauthenticated", peer.addr(), || {
                    Status::unauthenticated(status_message(format!("{path}: {error}")))
                }));
            }
        };
        let role = self.tls.role_of(&identity);
        let allowed = match (access, role) {
            (Some(Access::AnyRole), Some(_)) => true,
            (Some(Access::Roles(roles)), Some(role)) => roles.contains(&role),
            _ => false,
        };
        match role {
            Some(role) if allowed => Ok(Some(Caller { identity, role })),
            _ => Err(self.deny(path, "forbidden", identity.to_string(), || {
                Status::permission_denied(status_message(format!("{identity} may not call {path}")))
            })),
        }
    }

    fn deny(
        &self,
        path: &str,
        reason: &'static str,
        who: String,
        status: impl FnOnce() -> Status,
    ) -> Status {
        self.denied
            .get_or_create(&DeniedLabels {
                method: method_label(path),
                reason,
            })
            .inc();
        let status = status();
        if self.logged.due(who.clone()) {
            warn!(caller = %who, method = path, reason, message = status.message(), "grpc call refused (logged once a minute per caller)");
        }
        status
    }
}

struct Peer<'a> {
    cert: Option<&'a rustls::pki_types::CertificateDer<'static>>,
    remote: Option<std::net::SocketAddr>,
}

impl Peer<'_> {
    fn addr(&self) -> String {
        self.remote
            .map(|addr| addr.ip().to_string())
            .unwrap_or_else(|| "unknown".to_owned())
    }
}

/// The layer the gRPC server wraps its routes in; in plaintext (no identities) it lets
/// every call through.
#[derive(Clone, Debug)]
pub(crate) struct Authorize(Option<Arc<Policy>>);

impl Authorize {
    pub(crate) fn new(tls: Option<Tls>, metrics: &Metrics) -> Self {
        let Some(tls) = tls else {
            return Self(None);
        };
        let denied = Family::<DeniedLabels, Counter>::default();
        metrics.register(
            "switchyard_grpc_denied",
            "gRPC calls refused by the authorization table, by method and reason \
             (unauthenticated: no valid identity; forbidden: an identity the method does \
             not allow)",
            denied.clone(),
        );
        Self(Some(Arc::new(Policy {
            tls,
            denied,
            logged: LogLimiter::default(),
        })))
    }
}

impl<S> tower_layer::Layer<S> for Authorize {
    type Service = Authorized<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authorized {
            inner,
            policy: self.0.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Authorized<S> {
    inner: S,
    policy: Option<Arc<Policy>>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> tower_service::Service<http::Request<Body>> for Authorized<S>
where
    S: tower_service::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        let info = request
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .cloned();
        let certs = info.as_ref().and_then(|info| info.peer_certs());
        let peer = Peer {
            cert: certs.as_deref().and_then(|certs| certs.first()),
            remote: info.as_ref().and_then(|info| info.get_ref().remote_addr()),
        };
        let checked = match &self.policy {
            Some(policy) => policy.check(request.uri().path(), peer),
            None => Ok(None),
        };
        match checked {
            Ok(caller) => {
                if let Some(caller) = caller {
                    request.extensions_mut().insert(caller);
                }
                // The clone is ready only if polled; the polled one serves this call.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                Box::pin(inner.call(request))
            }
            Err(status) if is_grpc(&request) => {
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
            Err(status) => Box::pin(std::future::ready(Ok(plain_refusal(&status)))),
        }
    }
}

fn is_grpc(request: &http::Request<Body>) -> bool {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A refusal as a browser or `curl` reads it: 401 without an identity, 403 for the wrong one.
fn plain_refusal(status: &Status) -> http::Response<Body> {
    let code = match status.code() {
        tonic::Code::Unauthenticated => http::StatusCode::UNAUTHORIZED,
        _ => http::StatusCode::FORBIDDEN,
    };
    let mut response = http::Response::new(Body::new(format!("{}\n", status.message())));
    *response.status_mut() = code;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_reachable_and_unknown_methods_are_refused() {
        assert_eq!(access("/grpc.health.v1.Health/Watch"), Some(Access::Open));
        assert_eq!(
            access("/switchyard.queue.v1.Queue/Work"),
            Some(Access::Roles(&[Role::Reconciler]))
        );
        assert_eq!(access("/switchyard.queue.v1.Queue/Purge"), None);
        assert_eq!(access("/switchyard.queue.v1.Queue/Worker"), None);
        for (path, row) in TABLE {
            let probe = if path.ends_with('/') {
                format!("{path}Any")
            } else {
                (*path).to_owned()
            };
            assert_eq!(access(&probe), Some(*row), "{path}");
        }
        assert_eq!(access("/console/body"), Some(Access::AnyRole));
        assert_eq!(access("/consoles"), None);
    }

    #[test]
    fn refusals_are_labelled_by_their_row_or_unknown() {
        assert_eq!(
            method_label("/switchyard.queue.v1.Queue/Work"),
            "/switchyard.queue.v1.Queue/Work"
        );
        assert_eq!(
            method_label("/grpc.health.v1.Health/Watch"),
            "/grpc.health.v1.Health/"
        );
        assert_eq!(method_label("/switchyard.queue.v1.Queue/Purge"), "unknown");
        assert_eq!(method_label(&"x".repeat(10_000)), "unknown");
    }

    #[test]
    fn a_browser_is_refused_in_plain_text_and_a_grpc_client_in_grpc() {
        let refused = plain_refusal(&Status::permission_denied("x may not call /console/"));
        assert_eq!(refused.status(), http::StatusCode::FORBIDDEN);
        assert_eq!(
            refused.headers()[http::header::CONTENT_TYPE],
            "text/plain; charset=utf-8"
        );
        let refused = plain_refusal(&Status::unauthenticated("no certificate"));
        assert_eq!(refused.status(), http::StatusCode::UNAUTHORIZED);

        let mut grpc = http::Request::new(Body::empty());
        grpc.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc+proto"),
        );
        assert!(is_grpc(&grpc));
        assert!(!is_grpc(&http::Request::new(Body::empty())));
    }
}
