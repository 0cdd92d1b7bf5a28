//! How a service dials the others: one client setup for every internal connection.
//!
//! With TLS, each connection presents this service's certificate and accepts only a server
//! whose certificate names the role the caller meant to reach ([`crate::tls`]). Channels
//! made here reconnect on their own and every new connection handshakes with the current
//! certificate, so a rotation never needs a new channel.

use std::{future::Future, pin::Pin, sync::Arc, task::Poll};

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

use crate::tls::{Role, Tls, TlsArgs, TlsError};

/// Dials Switchyard services: mutual TLS with this service's identity, or plaintext.
#[derive(Clone, Debug)]
pub struct Dialer {
    tls: Option<Tls>,
}

#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("invalid address {address:?} of the {peer}: {reason}")]
    Address {
        address: String,
        peer: Role,
        reason: String,
    },
    #[error(
        "failed to connect to the {peer} at {address}: {}",
        error_chain(source)
    )]
    Connect {
        address: String,
        peer: Role,
        source: tonic::transport::Error,
    },
}

/// An error and its causes, as one line: tonic's own says only "transport error", the
/// reason (a refused connection, a rejected certificate) being in its sources.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

impl Dialer {
    pub fn new(tls: Option<Tls>) -> Self {
        Self { tls }
    }

    /// Plaintext, with no identity: only servers started with `--insecure-plaintext` answer.
    pub fn plaintext() -> Self {
        Self { tls: None }
    }

    /// A dialer from `args` alone, for tools and tests that run no [`crate::Runtime`] (its
    /// files are read once, not watched).
    pub fn from_args(args: &TlsArgs) -> Result<Self, TlsError> {
        Ok(Self {
            tls: Tls::load(args)?,
        })
    }

    /// The identity this dialer presents, `None` in plaintext.
    pub fn identity(&self) -> Option<crate::Identity> {
        self.tls.as_ref().map(Tls::identity)
    }

    /// The endpoint of `address` (`host:port`), for the caller's timeouts and keepalives.
    pub fn endpoint(&self, address: &str, peer: Role) -> Result<Endpoint, DialError> {
        Endpoint::from_shared(format!("http://{address}")).map_err(|e| DialError::Address {
            address: address.to_owned(),
            peer,
            reason: e.to_string(),
        })
    }

    /// A channel to `endpoint` that connects on first use.
    pub fn lazy(&self, endpoint: &Endpoint, peer: Role) -> Channel {
        match &self.tls {
            None => endpoint.connect_lazy(),
            Some(tls) => endpoint.connect_with_connector_lazy(Connector::new(tls, peer)),
        }
    }

    /// A channel to `endpoint`, connected now.
    pub async fn connect(&self, endpoint: &Endpoint, peer: Role) -> Result<Channel, DialError> {
        let connected = match &self.tls {
            None => endpoint.connect().await,
            Some(tls) => {
                endpoint
                    .connect_with_connector(Connector::new(tls, peer))
                    .await
            }
        };
        connected.map_err(|source| DialError::Connect {
            address: endpoint
                .uri()
                .authority()
                .map(ToString::to_string)
                .unwrap_or_default(),
            peer,
            source,
        })
    }

    /// A lazily connected channel to the `peer` at `address`.
    pub fn channel(&self, address: &str, peer: Role) -> Result<Channel, DialError> {
        Ok(self.lazy(&self.endpoint(address, peer)?, peer))
    }
}

/// TCP, then a TLS handshake as the client of a `peer`.
#[derive(Clone)]
struct Connector {
    tls: tokio_rustls::TlsConnector,
}

impl Connector {
    fn new(tls: &Tls, peer: Role) -> Self {
        Self {
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls.client_config(peer))),
        }
    }
}

type Connecting = Pin<
    Box<
        dyn Future<Output = std::io::Result<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>>
            + Send,
    >,
>;

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = self.tls.clone();
        Box::pin(async move {
            let invalid = |what: &str| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{uri}: {what}"))
            };
            let host = uri
                .host()
                .ok_or_else(|| invalid("no host"))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let port = uri.port_u16().ok_or_else(|| invalid("no port"))?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            // Small frames (a lease, an ack) must leave at once.
            tcp.set_nodelay(true)?;
            // The name is sent as SNI only; the server is checked by its identity.
            let name = ServerName::try_from(host).map_err(|e| invalid(&e.to_string()))?;
            Ok(TokioIo::new(tls.connect(name, tcp).await?))
        })
    }
}
