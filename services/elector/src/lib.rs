//! Switchyard elector: queue membership, shard assignment and fencing epochs in etcd.
//!
//! Queue replicas register themselves and make their own fenced writes to the map
//! (`switchyard-shards`); the elector reads the members and writes everything else:
//!
//! - [`membership`]: the registered members, read and watched;
//! - [`leader`]: elector replicas campaign; the leader keeps the shard map in step with the
//!   live members (assignment and handover plans come from `switchyard-elector-core`);
//! - [`shardmap`]: the leader's reads and fenced writes of the map in etcd;
//! - [`mirror`]: a prefix of etcd mirrored in memory (the map and the members the API serves);
//! - [`liveness`]: the leader revokes the registration of a member whose port refuses
//!   connections, so a crashed member's shards move before its lease would expire;
//! - [`grpc`]: `switchyard.elector.v1.Elector`: the shard map for queue members, watchers,
//!   reconcilers and tools;
//! - [`console`]: the live console on the same port: the shard map, backlog, reconcilers and
//!   failing keys as a page for a browser.

pub mod console;
pub mod grpc;
pub mod leader;
pub mod liveness;
pub mod membership;
pub mod mirror;
pub mod shardmap;

use std::{net::SocketAddr, time::Duration};

use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
use switchyard_runtime::{Backoff, GrpcServer, InstanceScope, Runtime, RuntimeArgs, instance_id};
use switchyard_shards::{Etcd, EtcdTlsArgs};
use tokio::sync::watch;
use tracing::{info, warn};

pub const SERVICE: &str = "switchyard-elector";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Runtime(#[from] switchyard_runtime::Error),
    #[error("invalid configuration: {0}")]
    Config(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, clap::Parser)]
#[command(name = SERVICE, version, about)]
pub struct Args {
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    #[command(flatten)]
    pub elector: ElectorArgs,
    #[command(flatten)]
    pub etcd_tls: EtcdTlsArgs,
    #[command(flatten)]
    pub console: console::ConsoleArgs,
}

#[derive(Clone, Debug, clap::Args)]
pub struct ElectorArgs {
    /// etcd client URLs, comma-separated: https:// (TLS with this service's certificate, or
    /// --etcd-tls-*), or http:// only with --etcd-insecure-plaintext
    #[arg(
        long,
        env = "SWITCHYARD_ETCD_ENDPOINTS",
        value_delimiter = ',',
        default_value = "https://127.0.0.1:2379"
    )]
    pub etcd_endpoints: Vec<String>,
    /// This elector's id in the election (default: the host name, which is the pod name)
    #[arg(long, env = "SWITCHYARD_ELECTOR_ID")]
    pub elector_id: Option<String>,
    /// Number of virtual shards; must match the queue's --shard-count
    #[arg(long, env = "SWITCHYARD_SHARD_COUNT", default_value_t = 256)]
    pub shard_count: u32,
    /// Shards a member may hold above ceil(shards / members)
    #[arg(long, env = "SWITCHYARD_SHARD_SLACK", default_value_t = 1)]
    pub shard_slack: u32,
    /// TTL of the leader's election lease: how soon a follower replaces a dead leader
    #[arg(long, env = "SWITCHYARD_ELECTION_TTL", default_value = "2s")]
    pub election_ttl: humantime::Duration,
    /// Revoke the registration of a member whose gRPC port refuses connections (a crashed
    /// process), rather than wait for its lease to expire. Turn off where a firewall between
    /// the elector and the queue rejects connections instead of dropping them.
    #[arg(long, env = "SWITCHYARD_MEMBER_PROBE", default_value_t = true, action = clap::ArgAction::Set)]
    pub member_probe: bool,
}

/// The elector's flags, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub etcd_endpoints: Vec<String>,
    /// `--elector-id`, else the host name.
    pub id: String,
    pub shard_count: u32,
    pub shard_slack: u32,
    pub election_ttl: Duration,
    pub member_probe: bool,
}

/// The shortest election lease: etcd lease TTLs are whole seconds.
const MIN_ELECTION_TTL: Duration = Duration::from_secs(1);

impl ElectorArgs {
    /// The checked configuration, or an error naming the bad flag.
    pub fn config(&self) -> Result<Config> {
        let Self {
            etcd_endpoints,
            elector_id,
            shard_count,
            shard_slack,
            election_ttl,
            member_probe,
        } = self;
        if etcd_endpoints.iter().all(|e| e.trim().is_empty()) {
            return Err(Error::Config(
                "--etcd-endpoints: at least one URL is needed".into(),
            ));
        }
        if *shard_count == 0 {
            return Err(Error::Config("--shard-count: must be at least 1".into()));
        }
        let election_ttl: Duration = (*election_ttl).into();
        if election_ttl < MIN_ELECTION_TTL {
            return Err(Error::Config(
                "--election-ttl: etcd leases last at least 1s".into(),
            ));
        }
        Ok(Config {
            etcd_endpoints: etcd_endpoints.clone(),
            id: instance_id(elector_id.clone(), "elector", InstanceScope::Host),
            shard_count: *shard_count,
            shard_slack: *shard_slack,
            election_ttl,
            member_probe: *member_probe,
        })
    }
}

/// First and last delay between attempts to reach etcd at start.
const CONNECT_RETRY: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(5));

impl Args {
    pub async fn run(self) -> Result<()> {
        let (rt, _) = self.start().await?;
        rt.run().await?;
        Ok(())
    }

    /// Starts the service and returns its runtime (not yet running) and gRPC address.
    pub async fn start(self) -> Result<(Runtime, SocketAddr)> {
        let Self {
            runtime,
            elector,
            etcd_tls,
            console,
        } = self;
        let console = console.config().map_err(Error::Config)?;
        let etcd = Etcd::from_args(&elector.etcd_endpoints, &etcd_tls, &runtime.tls)
            .map_err(|e| Error::Config(e.to_string()))?;
        let Config {
            etcd_endpoints: _,
            id,
            shard_count,
            shard_slack,
            election_ttl: ttl,
            member_probe,
        } = elector.config()?;
        let rt = Runtime::start(SERVICE, runtime).await?;
        etcd.announce();

        let leader_gauge = Gauge::<i64>::default();
        rt.metrics().register(
            "switchyard_elector_leader",
            "1 while this elector leads the shard assignment",
            leader_gauge.clone(),
        );
        let (leading, mut is_leading) = watch::channel(false);
        rt.spawn("leader-gauge", move |drain| async move {
            loop {
                leader_gauge.set(i64::from(*is_leading.borrow_and_update()));
                tokio::select! {
                    changed = is_leading.changed() => if changed.is_err() { return },
                    _ = drain.clone().signaled() => return,
                }
            }
        });

        let gate = rt.readiness().gate("etcd");
        let check = etcd.clone();
        rt.spawn("etcd-check", move |drain| async move {
            let mut backoff = Backoff::new(CONNECT_RETRY.0, CONNECT_RETRY.1);
            loop {
                let status = match check.connect().await {
                    Ok(mut client) => client.status().await,
                    Err(error) => Err(error),
                };
                match status {
                    Ok(status) => {
                        info!(version = status.version(), "connected to etcd");
                        gate.ready();
                        return;
                    }
                    Err(error) => warn!(%error, retry_in = ?backoff.current(), "etcd unreachable"),
                }
                if !backoff.wait(&drain).await {
                    return;
                }
            }
        });

        let members_found_gone = Counter::default();
        rt.metrics().register(
            "switchyard_elector_members_found_gone",
            "Members the leader found gone because their port refused connections (a crashed \
             process), their registrations then revoked ahead of the lease's expiry",
            members_found_gone.clone(),
        );
        let config = leader::LeaderConfig {
            id,
            shard_count,
            slack: shard_slack,
            ttl,
            member_probe,
            members_found_gone,
        };
        // What the gRPC service answers from. Essential: a follower that panicked or stopped
        // would leave its readers a map that never changes again, so the process fails
        // (`/livez`) and is restarted instead.
        let (shard_map, follow_shard_map) = shardmap::follow(etcd.clone(), shard_count, rt.drain());
        rt.spawn_essential("shard-map-follower", |_| follow_shard_map);
        let (members, follow_members) = membership::follow_members(etcd.clone(), rt.drain());
        rt.spawn_essential("member-follower", |_| follow_members);
        let service =
            grpc::ElectorService::new(shard_count, shard_map, members).with_etcd(etcd.clone());
        let console = console::Console::new(console, service.clone(), rt.dialer());
        // Its state (the samples) lives in the console, so a panic loses nothing but a sample.
        rt.spawn_restarting("console-sampler", {
            let console = console.clone();
            move |drain| console.clone().run(drain)
        });
        let dialer = rt.dialer();
        // Not restarted: a broken term ends the process, and another elector takes over
        // within the election TTL.
        rt.spawn_essential("leader", move |drain| {
            leader::run(etcd, dialer, config, leading, drain)
        });
        let addr = rt
            .serve_grpc(
                GrpcServer::new()
                    .add_service(service.into_server())
                    .with_http(console.router())
                    .with_descriptor_set(switchyard_proto::FILE_DESCRIPTOR_SET),
            )
            .await?;
        Ok((rt, addr))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// The TLS flags every service requires; these tests only parse them (no file is read).
    const TLS: [&str; 3] = ["--tls-cert=tls.crt", "--tls-key=tls.key", "--tls-ca=ca.crt"];

    fn config_error(flags: &[&str]) -> String {
        let args =
            Args::try_parse_from(["switchyard-elector"].iter().chain(&TLS).chain(flags)).unwrap();
        match args.elector.config() {
            Err(Error::Config(message)) => message,
            other => panic!("{flags:?}: expected a configuration error, got {other:?}"),
        }
    }

    #[test]
    fn bad_flags_are_named() {
        for (flags, named) in [
            (&["--etcd-endpoints= "][..], "--etcd-endpoints"),
            (&["--shard-count=0"], "--shard-count"),
            (&["--election-ttl=500ms"], "--election-ttl"),
        ] {
            let message = config_error(flags);
            assert!(message.starts_with(named), "{flags:?}: {message}");
        }
        let args = Args::try_parse_from(["switchyard-elector"].iter().chain(&TLS).chain(&[
            "--elector-id=e1",
            "--election-ttl=1s",
            "--shard-count=8",
        ]))
        .unwrap();
        let config = args.elector.config().unwrap();
        assert_eq!(
            (config.id.as_str(), config.shard_count, config.election_ttl),
            ("e1", 8, Duration::from_secs(1))
        );
    }
}
