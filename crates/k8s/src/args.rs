//! How a service reaches the apiserver: its flags ([`KubeArgs`]), and the wait for the
//! apiserver that keeps the service unready until it answers.

use std::{path::PathBuf, time::Duration};

use switchyard_runtime::{Backoff, Drain, Gate};
use tracing::{info, warn};

use crate::{Client, Config, kube};

/// How to reach the apiserver.
#[derive(Clone, Debug, clap::Args)]
pub struct KubeArgs {
    /// Path to a kubeconfig file; without it, the in-cluster service account is used
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use instead of its current context
    #[arg(long, env = "SWITCHYARD_KUBE_CONTEXT")]
    pub kube_context: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("failed to read kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("no apiserver configuration found (set --kubeconfig or run in a pod): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    #[error("failed to build the apiserver client: {0}")]
    Client(#[from] kube::Error),
}

/// First and last delay between apiserver connection attempts at startup.
const CONNECT_BACKOFF: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(10));

impl KubeArgs {
    pub async fn client(&self) -> Result<Client, KubeError> {
        Ok(Client::try_from(self.config().await?)?)
    }

    /// The client configuration, for services that add layers to the client's stack.
    pub async fn config(&self) -> Result<Config, KubeError> {
        let options = kube::config::KubeConfigOptions {
            context: self.kube_context.clone(),
            ..Default::default()
        };
        let config = match &self.kubeconfig {
            Some(path) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                    KubeError::Kubeconfig {
                        path: path.clone(),
                        source,
                    }
                })?;
                Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|source| KubeError::Kubeconfig {
                        path: path.clone(),
                        source,
                    })?
            }
            None => Config::infer().await?,
        };
        Ok(config)
    }
}

/// Keeps `gate` closed until the apiserver answers, retrying with backoff.
pub async fn await_apiserver(client: Client, gate: Gate, drain: Drain) {
    let mut backoff = Backoff::new(CONNECT_BACKOFF.0, CONNECT_BACKOFF.1);
    loop {
        match client.apiserver_version().await {
            Ok(version) => {
                info!(version = %version.git_version, "connected to the apiserver");
                gate.ready();
                return;
            }
            Err(error) => warn!(%error, retry_in = ?backoff.current(), "apiserver unreachable"),
        }
        if !backoff.wait(&drain).await {
            return;
        }
    }
}
