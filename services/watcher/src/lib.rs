//! Switchyard watcher: lists and watches resources, caches them and streams work keys to the queue shards.
//!
//! The service's own work is added by its issue; until then the binary runs the shared
//! runtime shell (admin port, health, reflection, drain), connects to the apiserver and
//! reports ready once the apiserver answers.

use switchyard_runtime::{GrpcServer, KubeArgs, Runtime, RuntimeArgs, await_apiserver};

pub const SERVICE: &str = "switchyard-watcher";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Runtime(#[from] switchyard_runtime::Error),
    #[error(transparent)]
    Kube(#[from] switchyard_runtime::KubeError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, clap::Parser)]
#[command(name = SERVICE, version, about)]
pub struct Args {
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
}

impl Args {
    pub async fn run(self) -> Result<()> {
        let Self { runtime, kube } = self;
        let rt = Runtime::start(SERVICE, runtime).await?;
        let client = kube.client().await?;
        let gate = rt.readiness().gate("apiserver");
        rt.spawn("apiserver-check", move |drain| {
            await_apiserver(client, gate, drain)
        });
        rt.serve_grpc(GrpcServer::new()).await?;
        rt.run().await?;
        Ok(())
    }
}
