//! Switchyard elector: queue membership, shard assignment and fencing epochs in etcd.
//!
//! The service's own gRPC API is added by its issue; until then the binary runs the shared
//! runtime shell (admin port, health, reflection, drain) and reports ready.

pub mod membership;

use switchyard_runtime::{GrpcServer, Runtime, RuntimeArgs};

pub const SERVICE: &str = "switchyard-elector";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Runtime(#[from] switchyard_runtime::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, clap::Parser)]
#[command(name = SERVICE, version, about)]
pub struct Args {
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

impl Args {
    pub async fn run(self) -> Result<()> {
        let Self { runtime } = self;
        let rt = Runtime::start(SERVICE, runtime).await?;
        rt.serve_grpc(GrpcServer::new()).await?;
        rt.run().await?;
        Ok(())
    }
}
