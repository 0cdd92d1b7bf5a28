//! The flags of the external metrics API, flattened into the queue's arguments.

use std::{net::SocketAddr, path::PathBuf};

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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        external_metrics: ExternalMetricsArgs,
    }

    #[test]
    fn a_certificate_needs_its_key_and_the_key_its_certificate() {
        for (given, missing) in [
            (
                "--external-metrics-tls-cert=c.pem",
                "--external-metrics-tls-key",
            ),
            (
                "--external-metrics-tls-key=k.pem",
                "--external-metrics-tls-cert",
            ),
        ] {
            let error = Flags::try_parse_from(["queue", given]).unwrap_err();
            assert!(error.to_string().contains(missing), "{given}: {error}");
        }
        let flags = Flags::try_parse_from([
            "queue",
            "--external-metrics-addr=127.0.0.1:6443",
            "--external-metrics-tls-cert=c.pem",
            "--external-metrics-tls-key=k.pem",
        ])
        .unwrap();
        assert!(flags.external_metrics.external_metrics_addr.is_some());
    }
}
