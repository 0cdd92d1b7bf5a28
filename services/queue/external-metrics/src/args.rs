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
    /// PEM CA bundle that client certificates must chain to: the apiserver's requestheader
    /// CA (`requestheader-client-ca-file` of `kube-system/extension-apiserver-authentication`),
    /// so that only the aggregation layer may call. Required with --external-metrics-addr
    /// unless --external-metrics-insecure-any-client
    #[arg(long, env = "SWITCHYARD_EXTERNAL_METRICS_CLIENT_CA")]
    pub external_metrics_client_ca: Option<PathBuf>,
    /// Common names a client certificate may have (the apiserver's
    /// `--requestheader-allowed-names`, for example front-proxy-client); empty allows any
    /// certificate the client CA issued, as the apiserver does
    #[arg(
        long,
        env = "SWITCHYARD_EXTERNAL_METRICS_ALLOWED_NAMES",
        value_delimiter = ',',
        requires = "external_metrics_client_ca"
    )]
    pub external_metrics_allowed_names: Vec<String>,
    /// Serve the external metrics API to any client, with or without a certificate
    /// (development only: anyone who reaches the port reads every controller's backlog)
    #[arg(
        long,
        env = "SWITCHYARD_EXTERNAL_METRICS_INSECURE_ANY_CLIENT",
        conflicts_with = "external_metrics_client_ca"
    )]
    pub external_metrics_insecure_any_client: bool,
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
