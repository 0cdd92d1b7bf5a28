//! The gRPC server every service runs: its own routes, plus the standard health service
//! and server reflection (v1 and v1alpha), over mutual TLS with every call authorized by
//! the caller's identity ([`crate::authz`]), or in plaintext when asked to.

use std::{convert::Infallible, future::Future, net::SocketAddr, sync::Arc, time::Duration};

use prometheus_client::metrics::counter::Counter;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_stream::StreamExt;
use tonic::{
    body::Body,
    server::NamedService,
    service::RoutesBuilder,
    transport::{Server, server::TcpIncoming},
};
use tonic_health::ServingStatus;
use tracing::{info, warn};

use crate::{
    Drain, Error, GrpcArgs, Metrics, Result,
    authz::Authorize,
    tls::{Handshakes, Tls},
};

/// How often the server pings a connection that sent nothing: a peer that vanished without
/// closing its TCP connection (its node lost, a partition) would otherwise hold its streams,
/// and what they hold (a registration's informers), forever. Well above any RPC's idle gap
/// on a healthy connection, so that pings cost nothing there.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is closed (tonic's default).
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The longest status message a service sends. A message travels in the `grpc-message`
/// header, and clients refuse a header list over 16 KiB (h2's default) as a protocol error:
/// a refusal that quotes an oversized field must still reach its caller.
pub const MAX_STATUS_MESSAGE_BYTES: usize = 4096;

/// `message`, cut to [`MAX_STATUS_MESSAGE_BYTES`] on a character boundary, saying how much
/// was cut. Each service's one mapping of its errors to status codes passes its messages
/// through this.
pub fn status_message(message: String) -> String {
    if message.len() <= MAX_STATUS_MESSAGE_BYTES {
        return message;
    }
    // Room for the note, which is at most 40 bytes.
    let mut end = MAX_STATUS_MESSAGE_BYTES - 40;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes cut)", &message[..end], message.len() - end)
}

/// The routes a service serves; health and reflection are added by the runtime.
#[derive(Debug, Default)]
pub struct GrpcServer {
    routes: RoutesBuilder,
    names: Vec<&'static str>,
    descriptor_sets: Vec<&'static [u8]>,
    /// Plain HTTP/2 routes beside the gRPC services (the elector's console), under the same
    /// authorization table.
    http: Option<axum::Router>,
}

impl GrpcServer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a service; it is reported SERVING by the health service while the server runs.
    pub fn add_service<S>(mut self, service: S) -> Self
    where
        S: tower_service::Service<
                http::Request<Body>,
                Response = http::Response<Body>,
                Error = Infallible,
            > + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        self.names.push(S::NAME);
        self.routes.add_service(service);
        self
    }

    /// Serves `router`'s plain HTTP routes on the same port and mutual TLS as the gRPC
    /// services. The authorization table governs their paths as it does methods; a refusal
    /// is a plain-text 401 or 403.
    pub fn with_http(mut self, router: axum::Router) -> Self {
        self.http = Some(match self.http.take() {
            Some(routes) => routes.merge(router),
            None => router,
        });
        self
    }

    /// Adds an encoded `FileDescriptorSet` that reflection serves.
    pub fn with_descriptor_set(mut self, set: &'static [u8]) -> Self {
        self.descriptor_sets.push(set);
        self
    }

    pub(crate) async fn bind(
        self,
        args: &GrpcArgs,
        tls: Option<&Tls>,
        metrics: &Metrics,
        drain: Drain,
    ) -> Result<(SocketAddr, impl Future<Output = ()> + use<>)> {
        let Self {
            mut routes,
            names,
            descriptor_sets,
            http,
        } = self;
        let (health, health_service) = tonic_health::server::health_reporter();
        routes.add_service(health_service);
        routes.add_service(reflection(&descriptor_sets).build_v1()?);
        routes.add_service(reflection(&descriptor_sets).build_v1alpha()?);

        let listener = TcpListener::bind(args.grpc_addr)
            .await
            .map_err(|source| Error::Bind {
                what: "gRPC",
                addr: args.grpc_addr,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            what: "gRPC",
            addr: args.grpc_addr,
            source,
        })?;
        let router = Server::builder()
            .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
            .max_connection_age(args.grpc_max_connection_age.into())
            .max_connection_age_grace(args.grpc_max_connection_age_grace.into())
            .layer(Authorize::new(tls.cloned(), metrics))
            .add_routes(match http {
                Some(http) => routes.routes().into_axum_router().merge(http).into(),
                None => routes.routes(),
            });
        let incoming = match tls {
            None => Incoming::Tcp(TcpIncoming::from(listener).with_nodelay(Some(true))),
            Some(tls) => {
                let failures = Counter::default();
                metrics.register(
                    "switchyard_grpc_tls_handshake_failures",
                    "TLS handshakes refused by the gRPC server (no common protocol, a \
                     certificate from another CA or expired)",
                    failures.clone(),
                );
                Incoming::Tls(crate::tls::accept(
                    listener,
                    Handshakes {
                        acceptor: TlsAcceptor::from(Arc::new(tls.server_config())),
                        failures,
                        what: "grpc",
                        // Small frames (a lease, an ack) must leave at once: Nagle's
                        // algorithm with delayed ACKs would hold them for tens of ms.
                        nodelay: true,
                    },
                ))
            }
        };
        let identity = tls.map(|tls| tls.identity().to_string());

        let serve = async move {
            for name in std::iter::once("").chain(names.iter().copied()) {
                health
                    .set_service_status(name, ServingStatus::Serving)
                    .await;
            }
            match &identity {
                Some(identity) => info!(%addr, %identity, "serving gRPC over mutual TLS"),
                None => {
                    warn!(%addr, "serving gRPC in plaintext: callers are neither authenticated nor authorized (--insecure-plaintext)")
                }
            }
            let shutdown = {
                let health = health.clone();
                async move {
                    drain.signaled().await;
                    for name in std::iter::once("").chain(names.iter().copied()) {
                        health
                            .set_service_status(name, ServingStatus::NotServing)
                            .await;
                    }
                }
            };
            let served = match incoming {
                Incoming::Tcp(tcp) => router.serve_with_incoming_shutdown(tcp, shutdown).await,
                Incoming::Tls(tls) => {
                    let tls = tokio_stream::wrappers::ReceiverStream::new(tls)
                        .map(|(conn, _)| Ok::<_, std::io::Error>(conn));
                    router.serve_with_incoming_shutdown(tls, shutdown).await
                }
            };
            if let Err(error) = served {
                warn!(%error, "gRPC server failed");
            }
            info!("gRPC server stopped");
        };
        Ok((addr, serve))
    }
}

/// Where connections come from: plain TCP, or TLS after the handshake.
enum Incoming {
    Tcp(TcpIncoming),
    Tls(tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>),
}

fn reflection(sets: &[&'static [u8]]) -> tonic_reflection::server::Builder<'static> {
    sets.iter().fold(
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET),
        |builder, set| builder.register_encoded_file_descriptor_set(set),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_messages_are_cut_to_what_a_header_carries() {
        assert_eq!(status_message("gvk: required".into()), "gvk: required");
        let long = format!("gvk: {} is not served", "é".repeat(70_000));
        let cut = status_message(long.clone());
        assert!(cut.len() <= MAX_STATUS_MESSAGE_BYTES, "{}", cut.len());
        assert!(cut.starts_with("gvk: éé"));
        let kept = cut.rsplit_once('…').unwrap().0.len();
        assert!(
            cut.ends_with(&format!("({} bytes cut)", long.len() - kept)),
            "{cut}"
        );
    }
}
