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
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
    client::danger::HandshakeSignatureValid,
    pki_types::{CertificateDer, PrivateKeyDer, UnixTime, pem::PemObject},
    server::{
        WebPkiClientVerifier,
        danger::{ClientCertVerified, ClientCertVerifier},
    },
};
use switchyard_runtime::{
    ServingKey,
    tls::{Handshakes, HttpsListener},
};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

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

/// Who may call: certificates `ca` issued, with one of `allowed_names` as their common name
/// if any are given.
#[derive(Clone, Copy, Debug)]
pub struct Clients<'a> {
    pub ca: &'a Path,
    pub allowed_names: &'a [String],
}

/// The server's TLS configuration: `serving` (the certificate from its files, current at
/// every handshake) or a self-signed certificate for `localhost`, and, with `clients`,
/// client certificates required to chain to their CA and to bear an allowed name.
pub fn config(
    serving: Option<ServingKey>,
    clients: Option<Clients<'_>>,
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
    let builder = match clients {
        None => builder.with_no_client_auth(),
        Some(Clients {
            ca: path,
            allowed_names,
        }) => {
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
            if allowed_names.is_empty() {
                builder.with_client_cert_verifier(verifier)
            } else {
                builder.with_client_cert_verifier(Arc::new(AllowedNames {
                    inner: verifier,
                    names: allowed_names.to_vec(),
                }))
            }
        }
    };
    let mut config = builder.with_cert_resolver(serving);
    // The HTTP server speaks HTTP/1.1 only.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // Every connection presents its certificate: a resumed session would skip the check.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(config)
}

/// A client verifier that also requires the certificate's common name to be allowed, as the
/// apiserver checks `--requestheader-allowed-names` of a front proxy.
#[derive(Debug)]
struct AllowedNames {
    inner: Arc<dyn ClientCertVerifier>,
    names: Vec<String>,
}

/// The common names of `cert`'s subject.
fn common_names(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    parsed
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_owned))
        .collect()
}

impl ClientCertVerifier for AllowedNames {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if common_names(end_entity)
            .iter()
            .any(|cn| self.names.contains(cn))
        {
            Ok(verified)
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
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
) -> HttpsListener {
    HttpsListener::new(
        addr,
        listener,
        Handshakes {
            acceptor,
            failures: Counter::default(),
            what: "external metrics API",
            nodelay: false,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_without_a_certificate_and_files_named_when_unreadable() {
        let made = config(None, None).unwrap();
        assert_eq!(made.alpn_protocols, [b"http/1.1".to_vec()]);
        let clients = Clients {
            ca: Path::new("/nonexistent/ca.crt"),
            allowed_names: &[],
        };
        let error = config(None, Some(clients)).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("failed to read client CA from /nonexistent/ca.crt"),
            "{error}"
        );
    }
}
