//! Applies Switchyard's etcd access table (`switchyard_shards::access`): a user and role for
//! the queue and the elector, etcd's own certificate as administrator, auth enabled. Run
//! once per etcd by `components/etcd`'s Job with etcd's certificate; running it again
//! changes nothing.

use std::time::Duration;

use clap::Parser;
use switchyard_runtime::{Backoff, TlsArgs, drain_channel};
use switchyard_shards::{Etcd, EtcdTlsArgs, access};
use tracing::warn;

/// First and last delay between attempts while etcd is not yet up.
const RETRY: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(10));

#[derive(Debug, clap::Parser)]
#[command(name = "switchyard-etcd-access", version, about)]
struct Args {
    /// etcd client URLs, comma-separated (https://)
    #[arg(
        long,
        env = "SWITCHYARD_ETCD_ENDPOINTS",
        value_delimiter = ',',
        required = true
    )]
    etcd_endpoints: Vec<String>,
    #[command(flatten)]
    etcd_tls: EtcdTlsArgs,
    /// Users made administrators: the CN of the certificate this command presents, at least
    #[arg(long, env = "SWITCHYARD_ETCD_ADMINS", value_delimiter = ',', default_value = access::ADMIN)]
    admin: Vec<String>,
    /// Give up when etcd has not been reached within this long
    #[arg(long, env = "SWITCHYARD_ETCD_ACCESS_TIMEOUT", default_value = "5m")]
    timeout: humantime::Duration,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_target(false).init();
    let Args {
        etcd_endpoints,
        etcd_tls,
        admin,
        timeout,
    } = Args::parse();
    let etcd = Etcd::from_args(&etcd_endpoints, &etcd_tls, &TlsArgs::plaintext())?;
    etcd.announce();
    let admins: Vec<&str> = admin.iter().map(String::as_str).collect();
    let (_stop, drain) = drain_channel();
    let mut backoff = Backoff::new(RETRY.0, RETRY.1);
    let applied = tokio::time::timeout(timeout.into(), async {
        loop {
            let error = match etcd.connect().await {
                Ok(mut client) => match access::apply(&mut client, &admins).await {
                    Ok(()) => return,
                    Err(error) => error.to_string(),
                },
                Err(error) => error.to_string(),
            };
            warn!(%error, retry_in = ?backoff.current(), "etcd access not applied yet");
            backoff.wait(&drain).await;
        }
    })
    .await;
    applied.map_err(|_| {
        anyhow::anyhow!("--timeout: etcd not reached or access not applied within {timeout}")
    })
}
