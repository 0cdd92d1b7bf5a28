use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Build(String),
    #[error("failed to start {name}: {source}")]
    Spawn {
        name: String,
        source: std::io::Error,
    },
    #[error("{name} exited before it was healthy ({status}); see {log}")]
    Exited {
        name: String,
        status: std::process::ExitStatus,
        log: PathBuf,
    },
    #[error("{name} was not healthy after {seconds} s; see {log}")]
    Unhealthy {
        name: String,
        seconds: u64,
        log: PathBuf,
    },
    #[error("{0}")]
    Setup(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Kube(#[from] switchyard_k8s::kube::Error),
    #[error("failed to generate certificates: {0}")]
    Pki(#[from] rcgen::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
