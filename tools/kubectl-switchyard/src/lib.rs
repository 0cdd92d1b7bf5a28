//! `kubectl switchyard`, the operators' view of a Switchyard installation, found on `PATH` by
//! kubectl as a plugin:
//!
//! ```text
//!  status ─► elector: GetShardMap (leader, members, draining, shards and epochs)
//!            queue replicas (from the map, or --queue-addr): Stats (backlog, workers)
//!            admin ports (--admin-addr): /readyz, /metrics (service and version)
//!            apiserver (--kubeconfig, --context): the services' Deployments, StatefulSets
//!  top    ─► queue admin ports: /metrics every --interval (adds/s, depth, retries, p99s)
//!  why    ─► shard of the key ─► its owner in the map ─► Queue.DescribeKey
//!  drain  ─► Elector.DrainMember, then GetShardMap until the member holds no shard
//!  console ─► a loopback port whose GETs go to the elector's console with this identity
//! ```
//!
//! It dials the services with the same `--tls-*` flags (and `SWITCHYARD_TLS_*` variables)
//! as the services dial each other, and checks each server's role. Without them, it reads
//! the identity from its Secret in the installation's namespace through the kubeconfig. `why` and `drain` need the
//! `switchyard-operator` identity; `status` and `top` need any identity of the installation
//! (the read-only `switchyard-observer` suffices).

mod cluster;
mod connect;
mod console;
mod drain;
mod prom;
mod render;
mod status;
mod top;
mod why;

use std::{path::PathBuf, process::ExitCode, time::Duration};

use switchyard_runtime::TlsArgs;

pub use connect::Error;
pub use render::Output;

#[derive(Debug, clap::Parser)]
#[command(
    name = "kubectl-switchyard",
    bin_name = "kubectl switchyard",
    version,
    about = "Status, top, why, drain and the live console of a Switchyard installation"
)]
pub struct Cli {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(flatten)]
    pub cluster: cluster::ClusterArgs,
    /// Output format
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Debug, clap::Args)]
pub struct ConnectArgs {
    /// gRPC address of an elector replica (comma-separated or repeated: the first that
    /// answers is used)
    #[arg(
        long,
        global = true,
        env = "SWITCHYARD_ELECTOR_ADDR",
        value_delimiter = ','
    )]
    pub elector_addr: Vec<String>,
    /// gRPC addresses of the queue replicas, instead of the members the elector's shard map
    /// names (a queue with --static-shards has no elector)
    #[arg(
        long,
        global = true,
        env = "SWITCHYARD_QUEUE_ADDR",
        value_delimiter = ','
    )]
    pub queue_addr: Vec<String>,
    /// Admin ports (/readyz, /metrics) of the services, any service: each names its own
    /// service and version; `top` reads the queue replicas' among them
    #[arg(
        long,
        global = true,
        env = "SWITCHYARD_ADMIN_ADDR",
        value_delimiter = ','
    )]
    pub admin_addr: Vec<String>,
    /// How long one call may take before its service counts as unreachable
    #[arg(
        long,
        global = true,
        env = "SWITCHYARD_CALL_TIMEOUT",
        default_value = "5s"
    )]
    pub call_timeout: humantime::Duration,
    #[command(flatten)]
    pub tls: CliTls,
}

/// The identity the command dials the services with. Anywhere on the command line, before or
/// after the verb.
#[derive(Clone, Debug, clap::Args)]
pub struct CliTls {
    /// Client certificate (PEM) of an identity of the installation: tls.crt of the Secret
    /// switchyard-observer-tls for status and top, of switchyard-operator-tls for why, drain
    /// and console
    #[arg(long, global = true, env = "SWITCHYARD_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Its private key (tls.key of the same Secret)
    #[arg(long, global = true, env = "SWITCHYARD_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// The installation's CA (ca.crt of the same Secret)
    #[arg(long, global = true, env = "SWITCHYARD_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Dial an installation whose services run with --insecure-plaintext (development only)
    #[arg(
        long,
        global = true,
        env = "SWITCHYARD_INSECURE_PLAINTEXT",
        conflicts_with_all = ["tls_cert", "tls_key", "tls_ca"]
    )]
    pub insecure_plaintext: bool,
}

impl CliTls {
    /// Neither an identity nor plaintext was asked for.
    pub fn is_unset(&self) -> bool {
        !self.insecure_plaintext
            && self.tls_cert.is_none()
            && self.tls_key.is_none()
            && self.tls_ca.is_none()
    }

    /// The runtime's TLS arguments, or an error naming what is missing.
    pub fn args(&self) -> Result<TlsArgs, Error> {
        if self.insecure_plaintext {
            return Ok(TlsArgs::plaintext());
        }
        match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (Some(cert), Some(key), Some(ca)) => Ok(TlsArgs::files(cert, key, ca)),
            (None, None, None) => Err(Error::Config(
                "no identity: give --tls-cert, --tls-key and --tls-ca (tls.crt, tls.key and \
                 ca.crt of the Secret switchyard-observer-tls, or switchyard-operator-tls for \
                 why, drain and console), or --insecure-plaintext; with a kubeconfig, they \
                 are read from that Secret"
                    .into(),
            )),
            _ => Err(Error::Config(
                "--tls-cert, --tls-key and --tls-ca go together: give all three".into(),
            )),
        }
    }
}

#[derive(Clone, Debug, clap::Subcommand)]
pub enum Command {
    /// Every service's replicas, readiness and version; the elector's leader; shards per
    /// queue replica with their epochs; backlog per controller; reconcilers and their credits
    Status,
    /// A live table per controller: adds/s, depth, retries/s, p99 queue and work durations
    Top {
        /// Seconds between refreshes
        #[arg(long, default_value = "2s")]
        interval: humantime::Duration,
        /// Stop after this many refreshes (default: until Ctrl-C)
        #[arg(long)]
        iterations: Option<u32>,
    },
    /// Where an object's key is now and how its last reconcile ended
    Why {
        /// The object: <resource>/<name>, for example replicaset/web or deploy/api; the
        /// resource is matched against the controllers the queue serves (kind, plural or
        /// short name, or the controller's own name)
        object: String,
        /// The object's namespace (empty for a cluster-scoped object); by default the
        /// kubeconfig context's namespace, else `default`, as kubectl does
        #[arg(short, long)]
        namespace: Option<String>,
        /// The controller whose key to look at, when the resource names several
        #[arg(long)]
        controller: Option<String>,
    },
    /// Move every shard off a queue replica (by member id) before maintenance, and wait
    /// until it holds none
    Drain {
        /// The queue replica's member id (see `status`)
        member: String,
        /// How long to wait for the shards to move
        #[arg(long, default_value = "5m")]
        timeout: humantime::Duration,
        /// Clear the drain mark instead, so the replica gets shards again
        #[arg(long)]
        undo: bool,
    },
    /// Serve the elector's live console (shard map, backlog, reconcilers, failing keys) on a
    /// loopback port for a browser, with this command's identity, until Ctrl-C
    Console {
        /// Where to listen: a loopback address (port 0 picks a free one)
        #[arg(long, default_value = "127.0.0.1:8001")]
        listen: std::net::SocketAddr,
    },
    /// Print a shell completion script: `source <(kubectl-switchyard completion bash)`, or
    /// save it where your shell loads completions from
    Completion {
        /// The shell
        shell: clap_complete::Shell,
    },
}

impl Command {
    /// The Secret of the least identity the verb needs: the observer's reads, the operator's
    /// sees failing keys and drains.
    fn identity_secret(&self) -> &'static str {
        match self {
            Command::Status | Command::Top { .. } | Command::Completion { .. } => {
                "switchyard-observer-tls"
            }
            Command::Why { .. } | Command::Drain { .. } | Command::Console { .. } => {
                "switchyard-operator-tls"
            }
        }
    }
}

impl Cli {
    /// Runs the command, printing its result or the error, and says how it went.
    pub async fn run(self) -> ExitCode {
        let Cli {
            connect,
            cluster,
            output,
            command,
        } = self;
        if let Command::Completion { shell } = command {
            use clap::CommandFactory;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "kubectl-switchyard",
                &mut std::io::stdout(),
            );
            return ExitCode::SUCCESS;
        }
        // Without the identity flags, the kubeconfig's user reads the identity the verb
        // needs from its Secret (kept in a private directory for this run).
        let mut connect = connect;
        let mut _identity = None;
        if connect.tls.is_unset() {
            let secret = command.identity_secret();
            match cluster.identity(secret, connect.call_timeout.into()).await {
                Ok(Some(identity)) => {
                    connect.tls = identity.tls();
                    _identity = Some(identity);
                }
                Ok(None) => {}
                Err(error) => {
                    eprintln!("error: {error}");
                    return ExitCode::FAILURE;
                }
            }
        }
        // Without addresses, those of services published in the installation's namespace
        // (local processes, as `make run` runs them).
        if connect.elector_addr.is_empty() && connect.queue_addr.is_empty() {
            // An apiserver that cannot be read leaves them unset: `status` reports it with the
            // rest, and the other verbs name the address they lack.
            if let Ok(Some(published)) = cluster.published(connect.call_timeout.into()).await {
                connect.elector_addr = published.electors;
                if connect.admin_addr.is_empty() {
                    connect.admin_addr = published.admins;
                }
            }
        }
        let result = match connect::Connections::new(&connect) {
            Ok(connections) => run(&connections, &cluster, output, command).await,
            Err(error) => Err(error),
        };
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("error: {error}");
                ExitCode::FAILURE
            }
        }
    }
}

async fn run(
    connections: &connect::Connections,
    cluster: &cluster::ClusterArgs,
    output: Output,
    command: Command,
) -> Result<(), Error> {
    match command {
        Command::Status => {
            let status = status::gather(connections, cluster).await?;
            render::print(output, &status, status::table)?;
            match status.problems.first() {
                None => Ok(()),
                Some(first) => Err(Error::Degraded {
                    count: status.problems.len(),
                    first: first.clone(),
                }),
            }
        }
        Command::Top {
            interval,
            iterations,
        } => top::run(connections, output, interval.into(), iterations).await,
        Command::Why {
            object,
            namespace,
            controller,
        } => {
            let namespace = namespace
                .or_else(|| cluster.context_namespace())
                .unwrap_or_else(|| "default".to_owned());
            let why = why::find(connections, &object, &namespace, controller.as_deref()).await?;
            render::print(output, &why, why::table)
        }
        Command::Drain {
            member,
            timeout,
            undo,
        } => {
            let drained = drain::run(connections, &member, undo, timeout.into()).await?;
            render::print(output, &drained, drain::table)
        }
        Command::Console { listen } => console::run(connections, listen).await,
        Command::Completion { .. } => Ok(()),
    }
}

/// How often `drain` looks at the map while it waits.
const DRAIN_POLL: Duration = Duration::from_millis(250);
