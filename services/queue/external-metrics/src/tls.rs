//! HTTPS for the external metrics API: the server's certificate (given, and then reloaded by
//! the runtime when its files change, as the gRPC certificates are; or self-signed at start),
//! the optional client CA that only the aggregation layer's certificate chains to, and the
//! runtime's accept loop, which runs each TLS handshake on its own task.
//!
//! ```text
//!  TcpListener ─► runtime accept loop (a task per handshake) ─► mpsc ─► TlsListener ─► axum
//! ```

use std::{net::SocketAddr, path::Path, path::PathBuf, sync::Arc};

use rustls::server::ResolvesServerCert;

use prometheus_client::metrics::counter::Counter;
use rustls::{
    RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::WebPkiClientVerifier,
};
use switchyard_runtime::{ServingKey, tls::Handshakes};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read {what} from {path}: {reason}")]
    Read {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("the external metrics API's certificate: {0}")]
    Certificate(#[from] switchyard_runtime::TlsError),
    #[error("failed to make a self-signed certificate: {0}")]
    SelfSigned(#[from] rcgen::Error),
    #[error("invalid TLS configuration of the external metrics API: {0}")]
    Tls(String),
}

/// The server's TLS configuration: `serving` (the certificate from its files, current at
/// every handshake) or a self-signed certificate for `localhost`, and, with `client_ca`,
/// client certificates required to chain to it.
pub fn config(
    serving: Option<ServingKey>,
    client_ca: Option<&Path>,
) -> Result<ServerConfig, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let serving: Arc<dyn ResolvesServerCert> = match serving {
        Some(serving) => Arc::new(serving),
        None => {
            let made = rcgen::generate_simple_self_signed(vec![
                "localhost".to_owned(),
                "127.0.0.1".to_owned(),
            ])?;
            let key = PrivateKeyDer::try_from(made.signing_key.serialize_der())
                .map_err(|e| Error::Tls(e.to_owned()))?;
            let signing = provider
                .key_provider
                .load_private_key(key)
                .map_err(|e| Error::Tls(e.to_string()))?;
            Arc::new(rustls::sign::SingleCertAndKey::from(
                rustls::sign::CertifiedKey::new(vec![made.cert.der().clone()], signing),
            ))
        }
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in
                CertificateDer::pem_file_iter(path).map_err(|e| read_error("client CA", path, e))?
            {
                roots
                    .add(cert.map_err(|e| read_error("client CA", path, e))?)
                    .map_err(|e| Error::Tls(format!("client CA {}: {e}", path.display())))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| Error::Tls(format!("client CA {}: {e}", path.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(serving);
    // The HTTP server speaks HTTP/1.1 only.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

fn read_error(what: &'static str, path: &Path, error: impl std::fmt::Display) -> Error {
    Error::Read {
        what,
        path: path.to_owned(),
        reason: error.to_string(),
    }
}

/// Starts accepting on `listener` (each handshake on its own task, the runtime's accept
/// loop): the handshaken connections arrive on the returned listener, for the HTTP server;
/// the listener closes when that is dropped.
pub(crate) fn listen(
    addr: SocketAddr,
    listener: TcpListener,
    acceptor: TlsAcceptor,
) -> TlsListener {
    let rx = switchyard_runtime::tls::accept(
        listener,
        Handshakes {
            acceptor,
            failures: Counter::default(),
            what: "external metrics API",
            nodelay: false,
        },
    );
    TlsListener { addr, rx }
}

/// The handshaken connections, as the HTTP server's listener.
pub(crate) struct TlsListener {
    addr: SocketAddr,
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(accepted) => accepted,
            // The accept task has stopped: nothing more will arrive.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_without_a_certificate_and_files_named_when_unreadable() {
        let made = config(None, None).unwrap();
        assert_eq!(made.alpn_protocols, [b"http/1.1".to_vec()]);
        let error = config(None, Some(Path::new("/nonexistent/ca.crt"))).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("failed to read client CA from /nonexistent/ca.crt"),
            "{error}"
        );
    }
}
