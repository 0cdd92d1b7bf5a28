//! How the elector and the queue members reach etcd: its endpoints and, for `https://`
//! endpoints, the client certificate they present and the CA etcd's certificate chains to.
//!
//! The files are read at every connection, so a rotated certificate is used from the next
//! reconnect; a connection already open keeps the one it was made with.

use std::path::{Path, PathBuf};

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use switchyard_runtime::TlsArgs;

/// Certificates for etcd when they differ from the service's own (`--tls-*`).
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
}

#[derive(Debug, thiserror::Error)]
pub enum EtcdConfigError {
    #[error("--etcd-endpoints: at least one URL is needed")]
    NoEndpoints,
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

    /// From the flags: TLS when the endpoints are `https://`, with `--etcd-tls-*` or else
    /// the service's own certificate.
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
        let https = endpoints
            .iter()
            .filter(|e| e.starts_with("https://"))
            .count();
        if https == 0 {
            return Ok(Self::plaintext(endpoints));
        }
        if https != endpoints.len() {
            return Err(EtcdConfigError::Mixed(endpoints.join(",")));
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
        let plain = Etcd::from_args(&["http://e:2379".into()], &etcd, &service).unwrap();
        assert_eq!(plain, Etcd::plaintext(vec!["http://e:2379".into()]));
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
}
