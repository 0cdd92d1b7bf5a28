//! How the elector and the queue members reach etcd: its endpoints and the client
//! certificate they present and the CA etcd's certificate chains to.
//!
//! The rule is the gRPC one: TLS with client certificates (`https://` endpoints), or, only
//! with `--etcd-insecure-plaintext`, plaintext (`http://`), announced by a warning at start.
//! An `http://` endpoint without the flag is refused at start, naming it.
//!
//! The files are read at every connection, so a rotated certificate is used from the next
//! reconnect; a connection already open keeps the one it was made with.

use std::path::{Path, PathBuf};

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use switchyard_runtime::TlsArgs;
use tracing::{info, warn};

/// How to reach etcd when it differs from the service's own certificate (`--tls-*`).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct EtcdTlsArgs {
    /// PEM client certificate presented to etcd (default: --tls-cert)
    #[arg(long, env = "SWITCHYARD_ETCD_TLS_CERT", requires = "etcd_tls_key")]
    pub etcd_tls_cert: Option<PathBuf>,
    /// PEM private key of --etcd-tls-cert (default: --tls-key)
    #[arg(long, env = "SWITCHYARD_ETCD_TLS_KEY", requires = "etcd_tls_cert")]
    pub etcd_tls_key: Option<PathBuf>,
    /// PEM CA bundle etcd's serving certificate chains to (default: --tls-ca)
    #[arg(long, env = "SWITCHYARD_ETCD_TLS_CA")]
    pub etcd_tls_ca: Option<PathBuf>,
    /// Reach etcd at http:// endpoints in plaintext, with no client certificate (development
    /// only; logged as a warning at start)
    #[arg(
        long,
        env = "SWITCHYARD_ETCD_INSECURE_PLAINTEXT",
        conflicts_with_all = ["etcd_tls_cert", "etcd_tls_key", "etcd_tls_ca"]
    )]
    pub etcd_insecure_plaintext: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum EtcdConfigError {
    #[error("--etcd-endpoints: at least one URL is needed")]
    NoEndpoints,
    #[error(
        "--etcd-endpoints: {0} has no scheme; give https:// (or http:// with --etcd-insecure-plaintext)"
    )]
    NoScheme(String),
    #[error(
        "--etcd-endpoints: {0} is plaintext; use https:// (etcd with TLS and client certificates) \
         or pass --etcd-insecure-plaintext"
    )]
    PlaintextNotAllowed(String),
    #[error("--etcd-insecure-plaintext: {0} is https://; drop the flag or use http:// endpoints")]
    TlsEndpointWithPlaintext(String),
    #[error("--etcd-endpoints: mix http:// and https:// URLs ({0})")]
    Mixed(String),
    #[error(
        "--etcd-endpoints are https:// but no {0} is given (--etcd-tls-* or the service's --tls-*)"
    )]
    Missing(&'static str),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Files {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

/// etcd's endpoints, and how to authenticate to them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Etcd {
    endpoints: Vec<String>,
    tls: Option<Files>,
}

impl Etcd {
    /// Endpoints reached in plaintext (`http://`), with no client certificate.
    pub fn plaintext(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            tls: None,
        }
    }

    /// `https://` endpoints, presenting `cert`/`key` and trusting `ca`.
    pub fn with_tls(endpoints: Vec<String>, cert: &Path, key: &Path, ca: &Path) -> Self {
        Self {
            endpoints,
            tls: Some(Files {
                cert: cert.to_owned(),
                key: key.to_owned(),
                ca: ca.to_owned(),
            }),
        }
    }

    /// From the flags: `https://` endpoints with `--etcd-tls-*` or else the service's own
    /// certificate; `http://` endpoints only with `--etcd-insecure-plaintext`.
    pub fn from_args(
        endpoints: &[String],
        etcd: &EtcdTlsArgs,
        service: &TlsArgs,
    ) -> Result<Self, EtcdConfigError> {
        let endpoints: Vec<String> = endpoints
            .iter()
            .map(|e| e.trim().to_owned())
            .filter(|e| !e.is_empty())
            .collect();
        if endpoints.is_empty() {
            return Err(EtcdConfigError::NoEndpoints);
        }
        if let Some(bare) = endpoints
            .iter()
            .find(|e| !e.starts_with("https://") && !e.starts_with("http://"))
        {
            return Err(EtcdConfigError::NoScheme(bare.clone()));
        }
        let (https, http): (Vec<&String>, Vec<&String>) =
            endpoints.iter().partition(|e| e.starts_with("https://"));
        match (https.first(), http.first()) {
            (Some(_), Some(_)) => return Err(EtcdConfigError::Mixed(endpoints.join(","))),
            (None, Some(plain)) if !etcd.etcd_insecure_plaintext => {
                return Err(EtcdConfigError::PlaintextNotAllowed((*plain).clone()));
            }
            (None, _) => return Ok(Self::plaintext(endpoints)),
            (Some(tls), None) if etcd.etcd_insecure_plaintext => {
                return Err(EtcdConfigError::TlsEndpointWithPlaintext((*tls).clone()));
            }
            (Some(_), None) => {}
        }
        let pick = |own: &Option<PathBuf>, fallback: &Option<PathBuf>, what| {
            own.clone()
                .or_else(|| fallback.clone())
                .ok_or(EtcdConfigError::Missing(what))
        };
        Ok(Self {
            tls: Some(Files {
                cert: pick(&etcd.etcd_tls_cert, &service.tls_cert, "client certificate")?,
                key: pick(&etcd.etcd_tls_key, &service.tls_key, "client key")?,
                ca: pick(&etcd.etcd_tls_ca, &service.tls_ca, "CA")?,
            }),
            endpoints,
        })
    }

    /// Whether etcd is reached in plaintext (`--etcd-insecure-plaintext`).
    pub fn is_plaintext(&self) -> bool {
        self.tls.is_none()
    }

    /// Says at start how etcd is reached: a warning when in plaintext.
    pub fn announce(&self) {
        let endpoints = self.endpoints.join(",");
        match &self.tls {
            Some(files) => info!(
                %endpoints,
                cert = %files.cert.display(),
                "etcd over tls with a client certificate"
            ),
            None => warn!(
                %endpoints,
                "--etcd-insecure-plaintext: etcd is reached neither encrypted nor authenticated"
            ),
        }
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// A client, connected now, with the certificate files as they are now.
    pub async fn connect(&self) -> Result<Client, etcd_client::Error> {
        let options = match &self.tls {
            None => None,
            Some(files) => {
                let read = |path: &Path| {
                    std::fs::read(path).map_err(|e| {
                        etcd_client::Error::InvalidArgs(format!(
                            "etcd TLS file {}: {e}",
                            path.display()
                        ))
                    })
                };
                let tls = TlsOptions::new()
                    .ca_certificate(Certificate::from_pem(read(&files.ca)?))
                    .identity(Identity::from_pem(read(&files.cert)?, read(&files.key)?));
                Some(ConnectOptions::new().with_tls(tls))
            }
        };
        Client::connect(&self.endpoints, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_endpoints_take_the_etcd_files_or_the_services_own() {
        let service = TlsArgs::files(Path::new("s.crt"), Path::new("s.key"), Path::new("s.ca"));
        let etcd = EtcdTlsArgs {
            etcd_tls_ca: Some("etcd-ca.crt".into()),
            ..EtcdTlsArgs::default()
        };
        let made = Etcd::from_args(&["https://e:2379".into()], &etcd, &service).unwrap();
        assert_eq!(
            made,
            Etcd::with_tls(
                vec!["https://e:2379".into()],
                Path::new("s.crt"),
                Path::new("s.key"),
                Path::new("etcd-ca.crt")
            )
        );
        let none = TlsArgs::plaintext();
        assert!(matches!(
            Etcd::from_args(&["https://e:2379".into()], &EtcdTlsArgs::default(), &none),
            Err(EtcdConfigError::Missing("client certificate"))
        ));
        assert!(matches!(
            Etcd::from_args(
                &["https://a:2379".into(), "http://b:2379".into()],
                &etcd,
                &service
            ),
            Err(EtcdConfigError::Mixed(_))
        ));
        assert!(matches!(
            Etcd::from_args(&[" ".into()], &etcd, &service),
            Err(EtcdConfigError::NoEndpoints)
        ));
    }

    #[test]
    fn plaintext_needs_its_flag_and_errors_name_it() {
        let service = TlsArgs::files(Path::new("s.crt"), Path::new("s.key"), Path::new("s.ca"));
        let http = ["http://e:2379".to_owned()];
        let error = Etcd::from_args(&http, &EtcdTlsArgs::default(), &service).unwrap_err();
        assert!(matches!(error, EtcdConfigError::PlaintextNotAllowed(_)));
        assert!(
            error.to_string().contains("http://e:2379")
                && error.to_string().contains("--etcd-insecure-plaintext"),
            "{error}"
        );
        let insecure = EtcdTlsArgs {
            etcd_insecure_plaintext: true,
            ..EtcdTlsArgs::default()
        };
        let plain = Etcd::from_args(&http, &insecure, &service).unwrap();
        assert_eq!(plain, Etcd::plaintext(http.to_vec()));
        assert!(plain.is_plaintext());
        assert!(matches!(
            Etcd::from_args(&["https://e:2379".into()], &insecure, &service),
            Err(EtcdConfigError::TlsEndpointWithPlaintext(_))
        ));
        let error = Etcd::from_args(&["e:2379".into()], &insecure, &service).unwrap_err();
        assert!(
            matches!(error, EtcdConfigError::NoScheme(ref e) if e == "e:2379"),
            "{error}"
        );
    }

    #[test]
    fn the_plaintext_flag_parses_and_conflicts_with_etcd_certificates() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            etcd: EtcdTlsArgs,
        }
        let parsed = Flags::try_parse_from(["x", "--etcd-insecure-plaintext"]).unwrap();
        assert!(parsed.etcd.etcd_insecure_plaintext);
        assert!(
            Flags::try_parse_from(["x", "--etcd-insecure-plaintext", "--etcd-tls-ca=ca.crt"])
                .is_err()
        );
    }
}
