//! The gRPC server every service runs: its own routes, plus the standard health service
//! and server reflection (v1 and v1alpha), optionally over TLS or mutual TLS.

use std::{convert::Infallible, future::Future, net::SocketAddr, path::Path};

use tokio::net::TcpListener;
use tonic::{
    body::Body,
    server::NamedService,
    service::RoutesBuilder,
    transport::{Certificate, Identity, Server, ServerTlsConfig, server::TcpIncoming},
};
use tonic_health::ServingStatus;
use tracing::{info, warn};

use crate::{Drain, Error, GrpcArgs, Result};

/// The routes a service serves; health and reflection are added by the runtime.
#[derive(Debug, Default)]
pub struct GrpcServer {
    routes: RoutesBuilder,
    names: Vec<&'static str>,
    descriptor_sets: Vec<&'static [u8]>,
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

    /// Adds an encoded `FileDescriptorSet` that reflection serves.
    pub fn with_descriptor_set(mut self, set: &'static [u8]) -> Self {
        self.descriptor_sets.push(set);
        self
    }

    pub(crate) async fn bind(
        self,
        args: &GrpcArgs,
        drain: Drain,
    ) -> Result<(SocketAddr, impl Future<Output = ()> + use<>)> {
        let Self {
            mut routes,
            names,
            descriptor_sets,
        } = self;
        let (health, health_service) = tonic_health::server::health_reporter();
        routes.add_service(health_service);
        routes.add_service(reflection(&descriptor_sets).build_v1()?);
        routes.add_service(reflection(&descriptor_sets).build_v1alpha()?);

        let mut server = Server::builder();
        if let Some(tls) = tls_config(args)? {
            server = server.tls_config(tls)?;
        }
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
        let router = server.add_routes(routes.routes());
        let tls = args.grpc_tls_cert.is_some();
        let mtls = args.grpc_tls_client_ca.is_some();

        let serve = async move {
            for name in std::iter::once("").chain(names.iter().copied()) {
                health
                    .set_service_status(name, ServingStatus::Serving)
                    .await;
            }
            info!(%addr, tls, mtls, "serving gRPC");
            // Small frames (a lease, an ack) must leave at once: Nagle's algorithm with
            // delayed ACKs would hold them for tens of milliseconds.
            let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
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
            if let Err(error) = router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await
            {
                warn!(%error, "gRPC server failed");
            }
            info!("gRPC server stopped");
        };
        Ok((addr, serve))
    }
}

fn reflection(sets: &[&'static [u8]]) -> tonic_reflection::server::Builder<'static> {
    sets.iter().fold(
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET),
        |builder, set| builder.register_encoded_file_descriptor_set(set),
    )
}

fn tls_config(args: &GrpcArgs) -> Result<Option<ServerTlsConfig>> {
    let (Some(cert), Some(key)) = (&args.grpc_tls_cert, &args.grpc_tls_key) else {
        return Ok(None);
    };
    let identity = Identity::from_pem(read("TLS certificate", cert)?, read("TLS key", key)?);
    let mut tls = ServerTlsConfig::new().identity(identity);
    if let Some(ca) = &args.grpc_tls_client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read("client CA", ca)?));
    }
    Ok(Some(tls))
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::ReadTls {
        what,
        path: path.to_owned(),
        source,
    })
}
