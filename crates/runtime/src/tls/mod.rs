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
//! current one, and the gRPC server closes every connection after `--grpc-max-connection-age`
//! so that a rotated CA or a denied serial reaches open connections too. Certificates whose
//! serial `--tls-denied-serials` lists are refused at every handshake, in both directions. A client proves who it is with its certificate and the server authorizes each
//! call by that identity ([`crate::authz`]); a client checks that the server's certificate
//! names the role it meant to reach (the identity, not the address, which for queue members
//! is a Pod IP no certificate can name in advance).

mod accept;
mod identity;
mod verify;

use std::{
    collections::HashSet,
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

pub use accept::{Handshakes, HttpsListener, accept};
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
    /// A file of certificate serial numbers to refuse (hex, one per line, colons allowed,
    /// '#' starts a comment), reloaded with the other files: a peer presenting one of them
    /// fails the handshake, as a client and as a server
    #[arg(long, env = "SWITCHYARD_TLS_DENIED_SERIALS", requires = "tls_cert")]
    pub tls_denied_serials: Option<PathBuf>,
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
            tls_denied_serials: None,
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
    #[error("{path}, line {line}: {text:?} is not a hexadecimal serial number")]
    Serial {
        path: PathBuf,
        line: usize,
        text: String,
    },
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
    /// Serials refused whatever signed them, without leading zero bytes.
    denied: HashSet<Vec<u8>>,
    not_after: Option<i64>,
    files: Vec<u8>,
}

#[derive(Debug)]
struct Files {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    denied: Option<PathBuf>,
}

/// The contents of the certificate, key and CA files, PEM, and of the denied serials file
/// (empty without one), in that order.
type Contents = (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>);

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
            match &self.denied {
                Some(path) => read("denied serials", path)?,
                None => Vec::new(),
            },
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
            denied: args.tls_denied_serials.clone(),
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
        if self.current().files == fingerprint(&contents) {
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
        // No session resumption: a resumed session skips the client's certificate, so a
        // denied serial or a rotated CA would not reach a client that reconnects.
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
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
        // Every connection verifies the server's certificate afresh (see `server_config`).
        config.resumption = rustls::client::Resumption::disabled();
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
    contents: Contents,
    provider: &Arc<CryptoProvider>,
) -> Result<Material, TlsError> {
    let fingerprint = fingerprint(&contents);
    let (cert_pem, key_pem, ca_pem, denied) = contents;
    let denied = match &files.denied {
        Some(path) => denied_serials(path, &denied)?,
        None => HashSet::new(),
    };
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
        denied,
        not_after,
        files: fingerprint,
    })
}

/// What tells one set of files from another: each file's length, then the files.
fn fingerprint((cert, key, ca, denied): &Contents) -> Vec<u8> {
    let mut all = Vec::new();
    for file in [cert, key, ca, denied] {
        all.extend_from_slice(&(file.len() as u64).to_be_bytes());
        all.extend_from_slice(file);
    }
    all
}

/// The serials of a denied serials file: hexadecimal, one per line, colons allowed, `#`
/// comments and blank lines skipped; leading zero bytes dropped, as [`serial_of`] does.
fn denied_serials(path: &Path, text: &[u8]) -> Result<HashSet<Vec<u8>>, TlsError> {
    let text = String::from_utf8_lossy(text);
    let mut serials = HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let serial = line.split('#').next().unwrap_or_default().trim();
        if serial.is_empty() {
            continue;
        }
        let bad = || TlsError::Serial {
            path: path.to_owned(),
            line: n + 1,
            text: serial.chars().take(80).collect(),
        };
        let digits: String = serial.chars().filter(|c| *c != ':').collect();
        let digits = digits.strip_prefix("0x").unwrap_or(&digits);
        if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let padded = if digits.len() % 2 == 1 {
            format!("0{digits}")
        } else {
            digits.to_owned()
        };
        let bytes: Vec<u8> = (0..padded.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&padded[i..i + 2], 16))
            .collect::<Result<_, _>>()
            .map_err(|_| bad())?;
        serials.insert(significant(&bytes).to_vec());
    }
    Ok(serials)
}

/// `serial` without its leading zero bytes (DER pads a serial whose top bit is set).
fn significant(serial: &[u8]) -> &[u8] {
    let start = serial.iter().position(|b| *b != 0).unwrap_or(serial.len());
    &serial[start..]
}

/// The serial number of `cert`, as [`denied_serials`] writes it; `None` when it cannot be
/// parsed (the chain check refuses such a certificate anyway).
fn serial_of(cert: &CertificateDer<'_>) -> Option<Vec<u8>> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    Some(significant(parsed.raw_serial()).to_vec())
}

impl Material {
    /// Refuses `end_entity` or any of `intermediates` whose serial is denied.
    fn check_serials(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> Result<(), rustls::Error> {
        if self.denied.is_empty() {
            return Ok(());
        }
        let denied = std::iter::once(end_entity)
            .chain(intermediates)
            .filter_map(serial_of)
            .any(|serial| self.denied.contains(&serial));
        if denied {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Revoked,
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denied_serials_are_hex_with_or_without_colons_and_comments() {
        let path = Path::new("denied");
        let serials = denied_serials(
            path,
            b"# revoked 2026-11-28\n01:A2:ff\n\n  0x00b3  # the elector's old one\n7\n",
        )
        .unwrap();
        let want: HashSet<Vec<u8>> = [vec![0x01, 0xa2, 0xff], vec![0xb3], vec![0x07]].into();
        assert_eq!(serials, want);
        assert_eq!(
            denied_serials(path, b"01a2\nserial-7\n")
                .unwrap_err()
                .to_string(),
            "denied, line 2: \"serial-7\" is not a hexadecimal serial number"
        );
        assert_eq!(significant(&[0, 0, 0x80, 0]), [0x80, 0]);
    }
}
