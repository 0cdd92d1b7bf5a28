//! The external metrics API (`external.metrics.k8s.io/v1beta1`), so that a
//! HorizontalPodAutoscaler can scale the reconcilers on the work waiting in the queue.
//!
//! ```text
//!  HPA controller ─► kube-apiserver ─► APIService v1beta1.external.metrics.k8s.io
//!                    (aggregation layer, front-proxy client certificate)
//!                        ─► Service ─► queue :6443 (HTTPS) ─► actor: Stats ─► backlog per controller
//! ```
//!
//! One metric, [`BACKLOG_METRIC`]: for each controller, the keys that are not done (ready,
//! delayed and leased). Each item carries the label [`CONTROLLER_LABEL`] with the
//! controller's name made label-safe (`apps/v1/ReplicaSet` → `apps.v1.ReplicaSet`). The HPA
//! sums the items that match its selector, so an empty selector scales on the backlog of
//! every controller. The namespace in the path is the HPA's; the backlog is the installation's.
//!
//! A replica that is a member of an elector-run installation adds the backlog of every other
//! member (their gRPC `Stats`) to its own, so whichever replica the APIService reaches answers
//! for the whole queue. If a member does not answer, the request fails (503) rather than
//! report a partial backlog, and the HPA keeps the replicas it has.
//!
//! The server speaks HTTPS only (the aggregation layer never dials plain HTTP). Without a
//! certificate it makes a self-signed one at start, for an APIService with
//! `insecureSkipTLSVerify`. With `--external-metrics-client-ca` (the apiserver's
//! requestheader CA) only clients with a certificate from that CA, that is the aggregation
//! layer, may call.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path as FsPath, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use axum::{
    Router,
    extract::{Path, RawQuery, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use rustls::{
    RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::WebPkiClientVerifier,
};
use serde_json::{Value, json};
use switchyard_runtime::Drain;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tracing::{debug, info, warn};

use switchyard_proto::queue::v1::{StatsRequest, queue_client::QueueClient};
use switchyard_shards::member::Member;
use tokio::sync::watch;

use crate::actor::Handle;

pub const GROUP: &str = "external.metrics.k8s.io";
pub const VERSION: &str = "v1beta1";
pub const GROUP_VERSION: &str = "external.metrics.k8s.io/v1beta1";
/// Keys not done, per controller: ready, delayed and leased.
pub const BACKLOG_METRIC: &str = "switchyard_queue_backlog";
/// The label that names the controller of an item.
pub const CONTROLLER_LABEL: &str = "controller";

/// A client that never finishes its TLS handshake gives up its slot after this long; the
/// aggregation layer completes one in milliseconds.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the HTTP server; more wait in the kernel's backlog.
const ACCEPT_QUEUE: usize = 64;
/// How long another member gets to report its backlog; the HPA asks every 15 s by default.
const PEER_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause after a failed accept (for example, out of file descriptors) before trying again.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

#[derive(Clone, Debug, clap::Args)]
pub struct ExternalMetricsArgs {
    /// Address of the external metrics API (HTTPS) that the HPA reads queue backlog from;
    /// not served when unset
    #[arg(long, env = "SWITCHYARD_EXTERNAL_METRICS_ADDR")]
    pub external_metrics_addr: Option<SocketAddr>,
    /// PEM certificate chain of the external metrics API (default: a self-signed certificate
    /// made at start)
    #[arg(
        long,
        env = "SWITCHYARD_EXTERNAL_METRICS_TLS_CERT",
        requires = "external_metrics_tls_key"
    )]
    pub external_metrics_tls_cert: Option<PathBuf>,
    /// PEM private key of --external-metrics-tls-cert
    #[arg(
        long,
        env = "SWITCHYARD_EXTERNAL_METRICS_TLS_KEY",
        requires = "external_metrics_tls_cert"
    )]
    pub external_metrics_tls_key: Option<PathBuf>,
    /// PEM CA bundle that client certificates must chain to (the apiserver's requestheader
    /// CA): only the aggregation layer may then call
    #[arg(long, env = "SWITCHYARD_EXTERNAL_METRICS_CLIENT_CA")]
    pub external_metrics_client_ca: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read {what} from {path}: {reason}")]
    Read {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("failed to make a self-signed certificate: {0}")]
    SelfSigned(#[from] rcgen::Error),
    #[error("invalid TLS configuration of the external metrics API: {0}")]
    Tls(String),
    #[error("failed to bind the external metrics address {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A bound external metrics server, not yet serving.
pub struct Server {
    addr: SocketAddr,
    listener: TcpListener,
    acceptor: TlsAcceptor,
    state: ApiState,
}

/// The other queue replicas, whose backlog a member adds to its own.
#[derive(Clone, Debug)]
pub struct Peers {
    pub members: watch::Receiver<Option<Vec<Member>>>,
    /// This replica's member id, left out of the fan-out.
    pub me: String,
}

#[derive(Clone, Debug)]
struct ApiState {
    handle: Handle,
    /// Controller names, indexed by controller id.
    names: Arc<[Arc<str>]>,
    /// Label-safe names, indexed by controller id.
    labels: Arc<[String]>,
    peers: Option<Peers>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Binds the configured address; `None` when the API is not configured.
    pub async fn bind(
        args: &ExternalMetricsArgs,
        handle: Handle,
        controllers: &[Arc<str>],
        peers: Option<Peers>,
    ) -> Result<Option<Self>> {
        let ExternalMetricsArgs {
            external_metrics_addr,
            external_metrics_tls_cert,
            external_metrics_tls_key,
            external_metrics_client_ca,
        } = args;
        let Some(addr) = *external_metrics_addr else {
            return Ok(None);
        };
        let tls = tls_config(
            external_metrics_tls_cert
                .as_deref()
                .zip(external_metrics_tls_key.as_deref()),
            external_metrics_client_ca.as_deref(),
        )?;
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
            state: ApiState {
                handle,
                names: controllers.into(),
                labels: controllers.iter().map(|c| label_value(c)).collect(),
                peers,
            },
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
        let (tx, rx) = mpsc::channel(ACCEPT_QUEUE);
        let accept = tokio::spawn(accept_tls(listener, acceptor, tx));
        info!(%addr, "serving the external metrics API");
        let served = axum::serve(TlsListener { addr, rx }, router(state))
            .with_graceful_shutdown(drain.signaled())
            .await;
        accept.abort();
        if let Err(error) = served {
            warn!(%error, "external metrics API stopped");
        }
    }
}

fn router(state: ApiState) -> Router {
    Router::new()
        .route("/apis", get(api_group_list))
        .route("/apis/external.metrics.k8s.io", get(api_group))
        .route("/apis/external.metrics.k8s.io/v1beta1", get(api_resources))
        .route(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{metric}",
            get(metric_values),
        )
        .fallback(|| async {
            status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the external metrics API serves /apis/external.metrics.k8s.io/v1beta1 and \
                 /apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{metric}"
                    .to_owned(),
            )
        })
        .with_state(state)
}

fn group_json() -> Value {
    let version = json!({"groupVersion": GROUP_VERSION, "version": VERSION});
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": [version],
        "preferredVersion": version,
    })
}

async fn api_group_list() -> Response {
    ok(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_json()]}))
}

async fn api_group() -> Response {
    ok(group_json())
}

async fn api_resources() -> Response {
    ok(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [{
            "name": BACKLOG_METRIC,
            "singularName": "",
            "namespaced": true,
            "kind": "ExternalMetricValueList",
            "verbs": ["get"],
        }],
    }))
}

async fn metric_values(
    State(state): State<ApiState>,
    Path((namespace, metric)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    if let Err(reason) = validate_dns_label(&namespace) {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("namespace {namespace:?}: {reason}"),
        );
    }
    if metric != BACKLOG_METRIC {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("external metric {metric:?} not found: this server serves {BACKLOG_METRIC}"),
        );
    }
    let raw_selector = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "labelSelector")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let selector = match Selector::parse(&raw_selector) {
        Ok(selector) => selector,
        Err(reason) => {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("labelSelector {raw_selector:?}: {reason}"),
            );
        }
    };
    let Ok(stats) = state.handle.stats(None).await else {
        return status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "the queue is shutting down".to_owned(),
        );
    };
    let mut backlog = vec![0u64; state.labels.len()];
    for s in &stats {
        if let Some(b) = backlog.get_mut(s.controller as usize) {
            *b += s.depth + s.in_flight;
        }
    }
    if let Some(peers) = &state.peers
        && let Err(message) = add_peers(peers, &state.names, &mut backlog).await
    {
        return status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            message,
        );
    }
    let timestamp = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let items: Vec<Value> = state
        .labels
        .iter()
        .zip(&backlog)
        .filter(|(label, _)| {
            selector.matches(&BTreeMap::from([(CONTROLLER_LABEL, label.as_str())]))
        })
        .map(|(label, value)| {
            json!({
                "metricName": BACKLOG_METRIC,
                "metricLabels": {CONTROLLER_LABEL: label},
                "timestamp": timestamp,
                "value": value.to_string(),
            })
        })
        .collect();
    debug!(%namespace, selector = %raw_selector, items = items.len(), "external metric read");
    ok(json!({
        "kind": "ExternalMetricValueList",
        "apiVersion": GROUP_VERSION,
        "metadata": {},
        "items": items,
    }))
}

/// Adds every other member's backlog to `backlog`, or says which member did not answer.
async fn add_peers(peers: &Peers, names: &[Arc<str>], backlog: &mut [u64]) -> Result<(), String> {
    let Some(members) = peers.members.borrow().clone() else {
        return Err("the queue's member list is not known yet".to_owned());
    };
    let others: Vec<Member> = members.into_iter().filter(|m| m.id != peers.me).collect();
    let answers = futures::future::join_all(others.iter().map(|member| async move {
        let ask = async {
            let mut client = QueueClient::connect(format!("http://{}", member.address))
                .await
                .map_err(|e| e.to_string())?;
            client
                .stats(StatsRequest::default())
                .await
                .map(|r| r.into_inner().shards)
                .map_err(|e| e.message().to_owned())
        };
        tokio::time::timeout(PEER_TIMEOUT, ask)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {PEER_TIMEOUT:?}")))
    }))
    .await;
    for (member, answer) in others.iter().zip(answers) {
        let shards = answer.map_err(|reason| {
            format!(
                "queue member {} at {} did not report its backlog: {reason}",
                member.id, member.address
            )
        })?;
        for s in shards {
            if let Some(i) = names.iter().position(|n| **n == *s.controller) {
                backlog[i] += s.depth + s.in_flight;
            }
        }
    }
    Ok(())
}

fn ok(body: Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// A `meta/v1` Status, as the apiserver answers errors.
fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// A controller name as a label value: `/` becomes `.`, any other character a label value
/// may not hold becomes `_`, and the result is cut to 63 characters.
pub fn label_value(controller: &str) -> String {
    let mapped: String = controller
        .chars()
        .map(|c| match c {
            '/' => '.',
            c if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') => c,
            _ => '_',
        })
        .take(63)
        .collect();
    mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

// ---- TLS ----

fn tls_config(
    cert_and_key: Option<(&FsPath, &FsPath)>,
    client_ca: Option<&FsPath>,
) -> Result<ServerConfig> {
    let (certs, key) = match cert_and_key {
        Some((cert, key)) => (
            CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| read_error("TLS certificate", cert, e))?,
            PrivateKeyDer::from_pem_file(key).map_err(|e| read_error("TLS key", key, e))?,
        ),
        None => {
            let made = rcgen::generate_simple_self_signed(vec![
                "localhost".to_owned(),
                "127.0.0.1".to_owned(),
            ])?;
            let key = PrivateKeyDer::try_from(made.signing_key.serialize_der())
                .map_err(|e| Error::Tls(e.to_owned()))?;
            (vec![made.cert.der().clone()], key)
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
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
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| Error::Tls(e.to_string()))?;
    // The HTTP server speaks HTTP/1.1 only.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

fn read_error(what: &'static str, path: &FsPath, error: impl std::fmt::Display) -> Error {
    Error::Read {
        what,
        path: path.to_owned(),
        reason: error.to_string(),
    }
}

/// Accepts TCP connections and hands each to its own TLS handshake, so a slow client never
/// holds up the others.
async fn accept_tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                warn!(%error, "external metrics API: accept failed");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let _ = tx.send((tls, peer)).await;
                }
                Ok(Err(error)) => {
                    debug!(%error, %peer, "external metrics API: TLS handshake failed")
                }
                Err(_) => debug!(%peer, "external metrics API: TLS handshake timed out"),
            }
        });
    }
}

struct TlsListener {
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

// ---- label selectors ----

/// A parsed label selector, in the apiserver's syntax: `k=v`, `k==v`, `k!=v`,
/// `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, comma-separated (all must hold).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector(Vec<Requirement>);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Selector {
    /// Parses `input`; the error says what is wrong and where.
    pub fn parse(input: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        if input.trim().is_empty() {
            return Ok(Self(requirements));
        }
        for term in split_terms(input)? {
            requirements.push(parse_requirement(term.trim())?);
        }
        Ok(Self(requirements))
    }

    pub fn matches(&self, labels: &BTreeMap<&str, &str>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::In(k, values) => labels
                .get(k.as_str())
                .is_some_and(|v| values.iter().any(|x| x == v)),
            Requirement::NotIn(k, values) => labels
                .get(k.as_str())
                .is_none_or(|v| !values.iter().any(|x| x == v)),
            Requirement::Exists(k) => labels.contains_key(k.as_str()),
            Requirement::DoesNotExist(k) => !labels.contains_key(k.as_str()),
        })
    }
}

/// Splits at the commas that are not inside parentheses.
fn split_terms(input: &str) -> Result<Vec<&str>, String> {
    let mut terms = Vec::new();
    let mut depth = 0u32;
    let mut start = 0;
    for (i, c) in input.char_indices() {
        match c {
            '(' if depth == 0 => depth = 1,
            '(' => return Err(format!("nested '(' at position {i}")),
            ')' if depth == 1 => depth = 0,
            ')' => return Err(format!("unmatched ')' at position {i}")),
            ',' if depth == 0 => {
                terms.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unclosed '('".to_owned());
    }
    terms.push(&input[start..]);
    Ok(terms)
}

fn parse_requirement(term: &str) -> Result<Requirement, String> {
    if term.is_empty() {
        return Err("empty requirement (two commas in a row, or a trailing comma)".to_owned());
    }
    if let Some(key) = term.strip_prefix('!') {
        let key = key.trim();
        validate_key(key)?;
        return Ok(Requirement::DoesNotExist(key.to_owned()));
    }
    for (op, negate) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((key, value)) = term.split_once(op) {
            let (key, value) = (key.trim(), value.trim());
            validate_key(key)?;
            validate_value(value)?;
            let values = vec![value.to_owned()];
            return Ok(if negate {
                Requirement::NotIn(key.to_owned(), values)
            } else {
                Requirement::In(key.to_owned(), values)
            });
        }
    }
    if let Some(open) = term.find('(') {
        let head = term[..open].trim();
        let Some(list) = term[open + 1..].trim_end().strip_suffix(')') else {
            return Err(format!("{term:?}: text after ')'"));
        };
        let (key, op) = head
            .rsplit_once(char::is_whitespace)
            .ok_or_else(|| format!("{term:?}: expected \"key in (...)\" or \"key notin (...)\""))?;
        let key = key.trim();
        validate_key(key)?;
        if list.trim().is_empty() {
            return Err(format!("{term:?}: the set of values must not be empty"));
        }
        let values: Vec<String> = list.split(',').map(|v| v.trim().to_owned()).collect();
        for value in &values {
            validate_value(value)?;
        }
        return match op {
            "in" => Ok(Requirement::In(key.to_owned(), values)),
            "notin" => Ok(Requirement::NotIn(key.to_owned(), values)),
            other => Err(format!(
                "{term:?}: unknown operator {other:?} (expected in or notin)"
            )),
        };
    }
    if term.contains(['<', '>', ')', ' ']) {
        return Err(format!(
            "{term:?}: expected key, !key, key=value, key!=value, key in (...) or key notin (...)"
        ));
    }
    validate_key(term)?;
    Ok(Requirement::Exists(term.to_owned()))
}

/// A label key: an optional DNS subdomain prefix and `/`, then a name of at most 63
/// characters.
fn validate_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() || prefix.len() > 253 {
            return Err(format!(
                "key {key:?}: the prefix must be 1 to 253 characters"
            ));
        }
        for part in prefix.split('.') {
            validate_dns_label(part).map_err(|reason| format!("key {key:?}: prefix {reason}"))?;
        }
    }
    if name.is_empty() {
        return Err(format!("key {key:?}: the name must not be empty"));
    }
    validate_name(name).map_err(|reason| format!("key {key:?}: {reason}"))
}

/// A label value: empty, or a name of at most 63 characters.
fn validate_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    validate_name(value).map_err(|reason| format!("value {value:?}: {reason}"))
}

fn validate_name(name: &str) -> Result<(), String> {
    if name.len() > 63 {
        return Err(format!("{} characters, at most 63 allowed", name.len()));
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alnum(name.chars().next()) || !alnum(name.chars().last()) {
        return Err("must begin and end with a letter or digit".to_owned());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "character {c:?} not allowed (letters, digits, '-', '_' and '.')"
        ));
    }
    Ok(())
}

fn validate_dns_label(label: &str) -> Result<(), String> {
    let ok = !label.is_empty()
        && label.len() <= 63
        && label
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !label.starts_with('-')
        && !label.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{label:?} is not a DNS label (1 to 63 lowercase letters, digits or '-', \
             beginning and ending with a letter or digit)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(controller: &str) -> BTreeMap<&str, &str> {
        BTreeMap::from([(CONTROLLER_LABEL, controller)])
    }

    #[test]
    fn controller_names_become_label_values() {
        assert_eq!(label_value("apps/v1/ReplicaSet"), "apps.v1.ReplicaSet");
        assert_eq!(label_value("v1/Pod"), "v1.Pod");
        assert_eq!(
            label_value("example.com/v1/My Kind"),
            "example.com.v1.My_Kind"
        );
        assert!(validate_value(&label_value(&"x/".repeat(40))).is_ok());
    }

    #[test]
    fn selectors_match_as_the_apiserver_does() {
        let rs = labels("apps.v1.ReplicaSet");
        let deploy = labels("apps.v1.Deployment");
        let cases = [
            ("", true, true),
            ("controller=apps.v1.ReplicaSet", true, false),
            ("controller==apps.v1.ReplicaSet", true, false),
            ("controller!=apps.v1.ReplicaSet", false, true),
            (
                "controller in (apps.v1.ReplicaSet, apps.v1.Deployment)",
                true,
                true,
            ),
            ("controller notin (apps.v1.Deployment)", true, false),
            ("controller", true, true),
            ("!controller", false, false),
            ("controller,example.com/tier=x", false, false),
            ("example.com/tier!=x", true, true),
        ];
        for (input, on_rs, on_deploy) in cases {
            let selector = Selector::parse(input).expect(input);
            assert_eq!(selector.matches(&rs), on_rs, "{input} on rs");
            assert_eq!(
                selector.matches(&deploy),
                on_deploy,
                "{input} on deployment"
            );
        }
    }

    #[test]
    fn malformed_selectors_are_refused_with_the_reason() {
        let cases = [
            ("controller=a,", "empty requirement"),
            ("controller in (a", "unclosed '('"),
            ("controller=-bad-", "must begin and end"),
            ("controller=a b", "character ' ' not allowed"),
            ("con troller", "expected key"),
            ("controller within (a)", "unknown operator \"within\""),
            ("Bad_Prefix/x=1", "not a DNS label"),
            ("controller=a)", "unmatched ')'"),
            ("/x", "prefix must be 1 to 253"),
            ("controller in ()", "must not be empty"),
        ];
        for (input, expected) in cases {
            let error = Selector::parse(input).expect_err(input);
            assert!(
                error.contains(expected),
                "{input:?}: {error:?} lacks {expected:?}"
            );
        }
        let long = format!("controller={}", "a".repeat(64));
        assert!(
            Selector::parse(&long)
                .expect_err("long")
                .contains("at most 63")
        );
    }
}
