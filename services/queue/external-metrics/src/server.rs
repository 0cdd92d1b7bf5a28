//! The server: binds the configured address with its TLS configuration, then serves the
//! routes until drained.

use std::{net::SocketAddr, sync::Arc};

use switchyard_runtime::{Drain, Runtime};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

use crate::{
    Backlog, Error, ExternalMetricsArgs, Peers, Result,
    routes::{self, ApiState},
    tls,
};

/// Names the API's certificate in `switchyard_tls_reloads_total` and the expiry gauge.
const CERTIFICATE: &str = "external-metrics";

/// A bound external metrics server, not yet serving.
pub struct Server<B> {
    addr: SocketAddr,
    listener: TcpListener,
    acceptor: TlsAcceptor,
    state: ApiState<B>,
}

impl<B> std::fmt::Debug for Server<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl<B: Backlog> Server<B> {
    /// Binds the configured address; `None` when the API is not configured.
    pub async fn bind(
        args: &ExternalMetricsArgs,
        rt: &Runtime,
        backlog: B,
        peers: Option<Peers>,
    ) -> Result<Option<Self>> {
        let ExternalMetricsArgs {
            external_metrics_addr,
            external_metrics_tls_cert,
            external_metrics_tls_key,
            external_metrics_client_ca,
            external_metrics_allowed_names,
            external_metrics_insecure_any_client,
        } = args;
        let Some(addr) = *external_metrics_addr else {
            return Ok(None);
        };
        if external_metrics_client_ca.is_none() && !external_metrics_insecure_any_client {
            return Err(tls::Error::Tls(
                "--external-metrics-client-ca: required with --external-metrics-addr (the \
                 apiserver's requestheader CA, so that only the aggregation layer may call); \
                 --external-metrics-insecure-any-client serves any client instead"
                    .into(),
            )
            .into());
        }
        let serving = match external_metrics_tls_cert
            .as_deref()
            .zip(external_metrics_tls_key.as_deref())
        {
            Some((cert, key)) => Some(
                rt.serving_key(CERTIFICATE, cert, key)
                    .map_err(tls::Error::from)?,
            ),
            None => None,
        };
        let clients = external_metrics_client_ca
            .as_deref()
            .map(|ca| tls::Clients {
                ca,
                allowed_names: external_metrics_allowed_names,
            });
        let tls = tls::config(serving, clients)?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| Error::Bind { addr, source })?;
        Ok(Some(Self {
            addr,
            listener,
            acceptor: TlsAcceptor::from(Arc::new(tls)),
            state: ApiState { backlog, peers },
        }))
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `drain` is signalled.
    pub async fn run(self, drain: Drain) {
        let Self {
            addr,
            listener,
            acceptor,
            state,
        } = self;
        let listener = tls::listen(addr, listener, acceptor);
        info!(%addr, "serving the external metrics API");
        let served = axum::serve(listener, routes::router(state))
            .with_graceful_shutdown(drain.signaled())
            .await;
        if let Err(error) = served {
            warn!(%error, "external metrics API stopped");
        }
    }
}
