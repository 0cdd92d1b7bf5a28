//! Mutual TLS for every internal connection: this service's certificate and the CA its peers
//! chain to, read from files and reloaded when they change.
//!
//! ```text
//!  files ──(poll every --tls-reload-interval)──► Material (key, roots, identity)
//!                                                  │  read at every handshake
//!           server: ServerConfig ◄── cert resolver ┤  client verifier (chain; cert optional)
//!           client: ClientConfig ◄── cert resolver ┘  server verifier (chain + expected role)
//! ```
//!
//! Established connections keep the certificate they were made with; new handshakes use the
//! current one. A client proves who it is with its certificate and the server authorizes each
//! call by that identity ([`crate::authz`]); a client checks that the server's certificate
//! names the role it meant to reach (the identity, not the address, which for queue members
//! is a Pod IP no certificate can name in advance).

mod accept;
mod identity;
mod verify;

use std::{
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::Duration,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Unit,
};
use rustls::{
    ClientConfig, RootCertStore, ServerConfig,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::{WebPkiClientVerifier, danger::ClientCertVerifier},
    sign::CertifiedKey,
};
use tracing::{info, warn};

pub use accept::{Handshakes, accept};
pub use identity::{Identity, IdentityError, Role};

use crate::{Drain, Metrics};

/// How this service proves who it is and whom it trusts.
#[derive(Clone, Debug, clap::Args)]
pub struct TlsArgs {
    /// PEM certificate chain of this service's identity (a spiffe:// URI SAN): served by the
    /// gRPC server and presented to the services it calls
    #[arg(
        long,
        env = "SWITCHYARD_TLS_CERT",
        requires_all = ["tls_key", "tls_ca"],
        required_unless_present = "insecure_plaintext"
    )]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert
    #[arg(long, env = "SWITCHYARD_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle that every peer's certificate must chain to
    #[arg(long, env = "SWITCHYARD_TLS_CA", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// How often the three files are checked for a change; new connections use the new ones
    #[arg(long, env = "SWITCHYARD_TLS_RELOAD_INTERVAL", default_value = "1s")]
    pub tls_reload_interval: humantime::Duration,
    /// Serve and dial gRPC in plaintext, with no caller identities and no authorization
    /// (development only; logged as a warning at start)
    #[arg(
        long,
        env = "SWITCHYARD_INSECURE_PLAINTEXT",
        conflicts_with_all = ["tls_cert", "tls_key", "tls_ca"]
    )]
    pub insecure_plaintext: bool,
}

impl TlsArgs {
    /// Arguments for plaintext: for tests of parts that never open a connection.
    pub fn plaintext() -> Self {
        Self {
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            tls_reload_interval: Duration::from_secs(1).into(),
            insecure_plaintext: true,
        }
    }

    /// Arguments naming the three files.
    pub fn files(cert: &Path, key: &Path, ca: &Path) -> Self {
        Self {
            tls_cert: Some(cert.to_owned()),
            tls_key: Some(key.to_owned()),
            tls_ca: Some(ca.to_owned()),
            ..Self::plaintext()
        }
        .secure()
    }

    fn secure(mut self) -> Self {
        self.insecure_plaintext = false;
        self
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("failed to read {what} from {path}: {reason}")]
    Read {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{path} holds no {what}")]
    Empty { what: &'static str, path: PathBuf },
    #[error("the certificate in {path} names no service identity: {source}")]
    Identity {
        path: PathBuf,
        source: IdentityError,
    },
    #[error("invalid TLS material: {0}")]
    Invalid(String),
    #[error("neither --tls-cert/--tls-key/--tls-ca nor --insecure-plaintext was given")]
    Unconfigured,
}

/// The files' contents, parsed; replaced whole on reload.
#[derive(Debug)]
struct Material {
    key: Arc<CertifiedKey>,
    roots: Arc<RootCertStore>,
    identity: Identity,
    client_verifier: Arc<dyn ClientCertVerifier>,
    not_after: Option<i64>,
    files: Vec<u8>,
}

#[derive(Debug)]
struct Files {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

/// The contents of the certificate, key and CA files, PEM, in that order.
type Contents = (Vec<u8>, Vec<u8>, Vec<u8>);

impl Files {
    fn read(&self) -> Result<Contents, TlsError> {
        let read = |what, path: &Path| {
            std::fs::read(path).map_err(|e| TlsError::Read {
                what,
                path: path.to_owned(),
                reason: e.to_string(),
            })
        };
        Ok((
            read("TLS certificate", &self.cert)?,
            read("TLS key", &self.key)?,
            read("TLS CA", &self.ca)?,
        ))
    }
}

/// This service's TLS material, shared by its server and its clients.
#[derive(Clone, Debug)]
pub struct Tls {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    files: Files,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<Material>>,
    interval: Duration,
}

impl Tls {
    /// Loads the files named by `args`; `None` with `--insecure-plaintext`.
    pub fn load(args: &TlsArgs) -> Result<Option<Tls>, TlsError> {
        if args.insecure_plaintext {
            return Ok(None);
        }
        let (Some(cert), Some(key), Some(ca)) = (&args.tls_cert, &args.tls_key, &args.tls_ca)
        else {
            return Err(TlsError::Unconfigured);
        };
        let files = Files {
            cert: cert.clone(),
            key: key.clone(),
            ca: ca.clone(),
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let material = parse(&files, files.read()?, &provider)?;
        Ok(Some(Tls {
            inner: Arc::new(Inner {
                files,
                provider,
                current: RwLock::new(Arc::new(material)),
                interval: args.tls_reload_interval.into(),
            }),
        }))
    }

    /// This service's own identity, from its current certificate.
    pub fn identity(&self) -> Identity {
        self.current().identity.clone()
    }

    /// The role `peer` holds towards this service: same trust domain and namespace, and a
    /// Switchyard service account.
    pub fn role_of(&self, peer: &Identity) -> Option<Role> {
        peer.role_among(&self.current().identity)
    }

    fn current(&self) -> Arc<Material> {
        self.inner
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Rereads the files; keeps the current material when they are unchanged or invalid.
    fn reload(&self) -> Result<bool, TlsError> {
        let contents = self.inner.files.read()?;
        if self.current().files == [&contents.0[..], &contents.1, &contents.2].concat() {
            return Ok(false);
        }
        let material = parse(&self.inner.files, contents, &self.inner.provider)?;
        *self
            .inner
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(material);
        Ok(true)
    }

    /// How often the files are checked (`--tls-reload-interval`).
    pub(crate) fn interval(&self) -> Duration {
        self.inner.interval
    }

    /// The gRPC server's configuration: this service's certificate, client certificates
    /// verified against the CA when offered (a call without one is refused per method, so
    /// that health checks stay open).
    pub fn server_config(&self) -> ServerConfig {
        let mut config = ServerConfig::builder_with_provider(self.inner.provider.clone())
            .with_safe_default_protocol_versions()
            .expect("the ring provider supports the default protocol versions")
            .with_client_cert_verifier(Arc::new(verify::CurrentClientVerifier(self.clone())))
            .with_cert_resolver(Arc::new(verify::CurrentKey(self.clone())));
        config.alpn_protocols = vec![b"h2".to_vec()];
        config
    }

    /// A client's configuration for calling a service of role `peer`: this service's
    /// certificate, and the server's verified against the CA and required to name `peer`.
    pub fn client_config(&self, peer: Role) -> ClientConfig {
        let mut config = ClientConfig::builder_with_provider(self.inner.provider.clone())
            .with_safe_default_protocol_versions()
            .expect("the ring provider supports the default protocol versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verify::PeerVerifier {
                tls: self.clone(),
                expected: peer,
            }))
            .with_client_cert_resolver(Arc::new(verify::CurrentKey(self.clone())));
        config.alpn_protocols = vec![b"h2".to_vec()];
        config
    }
}

impl Watched for Tls {
    fn reload(&self) -> Result<bool, TlsError> {
        Tls::reload(self)
    }

    fn not_after(&self) -> Option<i64> {
        self.current().not_after
    }

    fn describe(&self) -> String {
        format!("identity {}", self.identity())
    }
}

/// Files reloaded when they change: this service's own material ([`Tls`]) and any serving
/// certificate of its own ([`ServingKey`]).
pub(crate) trait Watched: Send + Sync + 'static {
    /// Rereads the files: `Ok(true)` when they changed and now serve, `Ok(false)` when they
    /// are unchanged; an error keeps the current material.
    fn reload(&self) -> Result<bool, TlsError>;
    /// When the current certificate expires, since the Unix epoch.
    fn not_after(&self) -> Option<i64>;
    /// What is served now, for the log.
    fn describe(&self) -> String;
}

/// The reload and expiry metrics of every certificate a service loads from files, by
/// `certificate` (`service`: its own identity; `external-metrics`: the queue's metrics API).
#[derive(Clone, Debug)]
pub(crate) struct ReloadMetrics {
    reloads: Family<ReloadLabels, Counter>,
    expiry: Family<CertificateLabels, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    certificate: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertificateLabels {
    certificate: &'static str,
}

impl ReloadMetrics {
    pub(crate) fn register(metrics: &Metrics) -> Self {
        let reloads = Family::<ReloadLabels, Counter>::default();
        metrics.register(
            "switchyard_tls_reloads",
            "Reloads of TLS certificate, key and CA files, by certificate and result",
            reloads.clone(),
        );
        let expiry = Family::<CertificateLabels, Gauge>::default();
        metrics.register_with_unit(
            "switchyard_tls_certificate_expiry_timestamp",
            "When each certificate this service presents expires, since the Unix epoch",
            Unit::Seconds,
            expiry.clone(),
        );
        Self { reloads, expiry }
    }
}

/// Polls `watched`'s files every `interval` until `drain`, counting reloads and exposing
/// the certificate's expiry under `certificate`.
pub(crate) async fn watch(
    watched: impl Watched,
    certificate: &'static str,
    interval: Duration,
    metrics: ReloadMetrics,
    drain: Drain,
) {
    let expiry = metrics
        .expiry
        .get_or_create(&CertificateLabels { certificate })
        .clone();
    let count = |result| {
        metrics
            .reloads
            .get_or_create(&ReloadLabels {
                certificate,
                result,
            })
            .inc();
    };
    let show_expiry = |watched: &dyn Watched| {
        if let Some(not_after) = watched.not_after() {
            expiry.set(not_after);
        }
    };
    show_expiry(&watched);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    let stop = drain.signaled();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            _ = tick.tick() => {}
        }
        match watched.reload() {
            Ok(false) => failing = false,
            Ok(true) => {
                failing = false;
                count("ok");
                show_expiry(&watched);
                info!(certificate, serving = %watched.describe(), "tls material reloaded");
            }
            Err(error) => {
                count("error");
                // Files are often written one at a time: the next tick sees them whole.
                if !failing {
                    warn!(certificate, %error, "tls material not reloaded; keeping the current one");
                }
                failing = true;
            }
        }
    }
}

/// A serving certificate and key from files, reloaded when they change, for a server that
/// presents a certificate but is no Switchyard identity (the queue's external metrics API,
/// whose certificate names the Service the APIService points at). New handshakes get the
/// current certificate; established connections keep theirs.
#[derive(Clone, Debug)]
pub struct ServingKey {
    inner: Arc<ServingInner>,
}

#[derive(Debug)]
struct ServingInner {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<Served>>,
}

#[derive(Debug)]
struct Served {
    key: Arc<CertifiedKey>,
    not_after: Option<i64>,
    subject: String,
    files: Vec<u8>,
}

impl ServingKey {
    /// Loads `cert` (a PEM chain) and `key` (its PEM private key), checking they match.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let inner = ServingInner {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current: RwLock::new(Arc::new(Served::parse(
                cert,
                key,
                Served::read(cert, key)?,
                &provider,
            )?)),
            provider,
        };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    fn current(&self) -> Arc<Served> {
        self.inner
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Served {
    /// The files' contents, PEM: certificate, key.
    fn read(cert: &Path, key: &Path) -> Result<Vec<u8>, TlsError> {
        let read = |what, path: &Path| {
            std::fs::read(path).map_err(|e| TlsError::Read {
                what,
                path: path.to_owned(),
                reason: e.to_string(),
            })
        };
        Ok([read("TLS certificate", cert)?, read("TLS key", key)?].join(&0u8))
    }

    fn parse(
        cert: &Path,
        key: &Path,
        files: Vec<u8>,
        provider: &Arc<CryptoProvider>,
    ) -> Result<Self, TlsError> {
        let split = files.iter().position(|b| *b == 0).unwrap_or(files.len());
        let (cert_pem, key_pem) = (&files[..split], files.get(split + 1..).unwrap_or(&[]));
        let (certified, not_after) = certified_key((cert, key), cert_pem, key_pem, provider)?;
        let subject = certified
            .end_entity_cert()
            .ok()
            .and_then(|leaf| x509_parser::parse_x509_certificate(leaf.as_ref()).ok())
            .map(|(_, parsed)| parsed.subject().to_string())
            .unwrap_or_default();
        Ok(Self {
            key: Arc::new(certified),
            not_after,
            subject,
            files,
        })
    }
}

impl Watched for ServingKey {
    fn reload(&self) -> Result<bool, TlsError> {
        let inner = &self.inner;
        let files = Served::read(&inner.cert, &inner.key)?;
        if files == self.current().files {
            return Ok(false);
        }
        let served = Served::parse(&inner.cert, &inner.key, files, &inner.provider)?;
        *inner
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(served);
        Ok(true)
    }

    fn not_after(&self) -> Option<i64> {
        self.current().not_after
    }

    fn describe(&self) -> String {
        self.current().subject.clone()
    }
}

impl rustls::server::ResolvesServerCert for ServingKey {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current().key.clone())
    }
}

/// The certificate chain and key in `cert_pem` and `key_pem`, checked to match, and when the
/// leaf expires; `files` name them in errors.
fn certified_key(
    (cert, key): (&Path, &Path),
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &Arc<CryptoProvider>,
) -> Result<(CertifiedKey, Option<i64>), TlsError> {
    let pem_error = |what, path: &Path| {
        let path = path.to_owned();
        move |e: rustls::pki_types::pem::Error| TlsError::Read {
            what,
            path,
            reason: e.to_string(),
        }
    };
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_error("TLS certificate", cert))?;
    let Some(leaf) = chain.first() else {
        return Err(TlsError::Empty {
            what: "certificate",
            path: cert.to_owned(),
        });
    };
    let not_after = x509_parser::parse_x509_certificate(leaf.as_ref())
        .ok()
        .map(|(_, cert)| cert.validity().not_after.timestamp());
    let private = PrivateKeyDer::from_pem_slice(key_pem).map_err(pem_error("TLS key", key))?;
    let signing = provider
        .key_provider
        .load_private_key(private)
        .map_err(|e| TlsError::Invalid(format!("{}: {e}", key.display())))?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|e| TlsError::Invalid(format!("{} and {}: {e}", cert.display(), key.display())))?;
    Ok((certified, not_after))
}

/// The material in `contents`, as read from `files` (named in errors).
fn parse(
    files: &Files,
    (cert_pem, key_pem, ca_pem): Contents,
    provider: &Arc<CryptoProvider>,
) -> Result<Material, TlsError> {
    let fingerprint = [&cert_pem[..], &key_pem, &ca_pem].concat();
    let pem_error = |what, path: &Path| {
        let path = path.to_owned();
        move |e: rustls::pki_types::pem::Error| TlsError::Read {
            what,
            path,
            reason: e.to_string(),
        }
    };
    let (key, not_after) = certified_key((&files.cert, &files.key), &cert_pem, &key_pem, provider)?;
    let leaf = key
        .end_entity_cert()
        .map_err(|e| TlsError::Invalid(e.to_string()))?;
    let identity = Identity::of_certificate(leaf).map_err(|source| TlsError::Identity {
        path: files.cert.clone(),
        source,
    })?;

    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&ca_pem) {
        let cert = cert.map_err(pem_error("TLS CA", &files.ca))?;
        roots
            .add(cert)
            .map_err(|e| TlsError::Invalid(format!("{}: {e}", files.ca.display())))?;
    }
    if roots.is_empty() {
        return Err(TlsError::Empty {
            what: "CA certificate",
            path: files.ca.clone(),
        });
    }
    let roots = Arc::new(roots);
    let client_verifier =
        WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .allow_unauthenticated()
            .build()
            .map_err(|e| TlsError::Invalid(format!("{}: {e}", files.ca.display())))?;
    Ok(Material {
        key: Arc::new(key),
        roots,
        identity,
        client_verifier,
        not_after,
        files: fingerprint,
    })
}
