use std::net::SocketAddr;

/// The arguments every service shares. Services flatten this into their own `Args`.
#[derive(Clone, Debug, clap::Args)]
pub struct RuntimeArgs {
    #[command(flatten)]
    pub admin: AdminArgs,
    #[command(flatten)]
    pub grpc: GrpcArgs,
    #[command(flatten)]
    pub tls: crate::tls::TlsArgs,
    #[command(flatten)]
    pub log: LogArgs,
    /// How long shutdown waits for in-flight work and streams to finish before giving up
    #[arg(long, env = "SWITCHYARD_DRAIN_TIMEOUT", default_value = "30s")]
    pub drain_timeout: humantime::Duration,
}

#[derive(Clone, Debug, clap::Args)]
pub struct AdminArgs {
    /// Address of the admin HTTP server (/livez, /readyz, /metrics)
    #[arg(long, env = "SWITCHYARD_ADMIN_ADDR", default_value = "0.0.0.0:9990")]
    pub admin_addr: SocketAddr,
    /// Serve POST /debug/panic/<task> on the admin port, which panics the named task (for
    /// tests of supervision). Compiled into debug builds only: a release build refuses it.
    /// No environment variable: nothing in a Pod's environment can turn it on
    #[arg(long, hide = !cfg!(debug_assertions))]
    pub debug_fault_injection: bool,
}

#[derive(Clone, Debug, clap::Args)]
pub struct GrpcArgs {
    /// Address of the gRPC server
    #[arg(long, env = "SWITCHYARD_GRPC_ADDR", default_value = "0.0.0.0:8443")]
    pub grpc_addr: SocketAddr,
    /// How long a connection to the gRPC server lasts before the server asks its client to
    /// reconnect (HTTP/2 GOAWAY): a rotated CA or a denied serial then reaches every peer
    /// within this plus the grace
    #[arg(long, env = "SWITCHYARD_GRPC_MAX_CONNECTION_AGE", default_value = "1h")]
    pub grpc_max_connection_age: humantime::Duration,
    /// How long calls still open on a connection past its age may finish before it is closed
    #[arg(
        long,
        env = "SWITCHYARD_GRPC_MAX_CONNECTION_AGE_GRACE",
        default_value = "5m"
    )]
    pub grpc_max_connection_age_grace: humantime::Duration,
}

#[derive(Clone, Debug, clap::Args)]
pub struct LogArgs {
    /// Log filter in tracing's EnvFilter syntax, for example "info,switchyard_queue=debug"
    #[arg(long, env = "SWITCHYARD_LOG", default_value = "info")]
    pub log_level: String,
    /// Log line format
    #[arg(long, env = "SWITCHYARD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Plain,
    Json,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Flags {
        #[command(flatten)]
        admin: AdminArgs,
    }

    #[test]
    fn fault_injection_is_a_flag_only_never_read_from_the_environment() {
        let command = Flags::command();
        let flag = command
            .get_arguments()
            .find(|a| a.get_id() == "debug_fault_injection")
            .unwrap();
        assert_eq!(flag.get_env(), None);
        // Every other admin flag keeps its variable.
        let admin = command
            .get_arguments()
            .find(|a| a.get_id() == "admin_addr")
            .unwrap();
        assert_eq!(
            admin.get_env().and_then(|e| e.to_str()),
            Some("SWITCHYARD_ADMIN_ADDR")
        );
    }
}
