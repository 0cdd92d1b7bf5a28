//! Faults a test injects into the control plane: kube-apiserver stopped and restarted on
//! its address, a second kube-apiserver on the same etcd, etcd compacted.

use std::{path::PathBuf, sync::PoisonError, time::Duration};

use switchyard_k8s::Client;

use super::{
    ControlPlane, client_from,
    components::{APISERVER, start_apiserver},
};
use crate::{Error, Result, kubeconfig, process::ManagedProcess};

/// A second kube-apiserver on the control plane's etcd; stopped on drop.
#[derive(Debug)]
pub struct ApiServer {
    process: ManagedProcess,
    server: String,
    kubeconfig: PathBuf,
}

impl ApiServer {
    /// Its URL, `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// An admin client of this apiserver (bound to the runtime it is created on).
    pub async fn client(&self) -> Result<Client> {
        client_from(&self.kubeconfig).await
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.process.stop(Duration::from_secs(10));
    }
}

impl ControlPlane {
    /// Stops kube-apiserver (SIGTERM, then SIGKILL after 10 s); everything else keeps
    /// running. [`Self::restart_apiserver`] brings it back on the same address.
    pub fn stop_apiserver(&self) {
        let process = {
            let mut processes = self
                .processes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let index = processes.iter().position(|p| p.name() == APISERVER);
            index.map(|i| processes.remove(i))
        };
        if let Some(mut process) = process {
            process.stop(Duration::from_secs(10));
        }
    }

    /// Starts kube-apiserver again on the address it had, and waits until it is ready.
    pub async fn restart_apiserver(&self) -> Result<()> {
        let port = self
            .server
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .ok_or_else(|| Error::Setup(format!("no port in {}", self.server)))?;
        let (process, _) = start_apiserver(
            &self.binaries,
            &self.dir,
            &self.pki,
            &self.etcd_url,
            APISERVER,
            Some(port),
        )
        .await?;
        self.push(process);
        Ok(())
    }

    /// Starts a second kube-apiserver on the same etcd (writes through it reach the first
    /// one's watchers, through etcd).
    pub async fn start_second_apiserver(&self) -> Result<ApiServer> {
        let name = "kube-apiserver-2";
        let (process, server) = start_apiserver(
            &self.binaries,
            &self.dir,
            &self.pki,
            &self.etcd_url,
            name,
            None,
        )
        .await?;
        let kubeconfig = self.dir.join(format!("{name}.kubeconfig"));
        kubeconfig::write(&kubeconfig, &server, &self.pki)?;
        Ok(ApiServer {
            process,
            server,
            kubeconfig,
        })
    }

    /// Compacts etcd's history up to its current revision, so that a watch resuming from
    /// an older resourceVersion gets 410 Gone. Returns the revision.
    pub fn compact_etcd(&self) -> Result<u64> {
        let etcdctl = |args: &[&str]| -> Result<Vec<u8>> {
            let output = std::process::Command::new(self.binaries.path("etcdctl"))
                .arg(format!("--endpoints={}", self.etcd_url))
                .args(args)
                .output()?;
            if !output.status.success() {
                return Err(Error::Setup(format!(
                    "etcdctl {args:?} failed: {}",
                    String::from_utf8_lossy(&output.stderr)
                )));
            }
            Ok(output.stdout)
        };
        let status: serde_json::Value =
            serde_json::from_slice(&etcdctl(&["endpoint", "status", "--write-out=json"])?)
                .map_err(|e| Error::Setup(format!("unreadable etcdctl status: {e}")))?;
        let revision = status[0]["Status"]["header"]["revision"]
            .as_u64()
            .ok_or_else(|| Error::Setup(format!("no revision in etcdctl status: {status}")))?;
        etcdctl(&["compaction", &revision.to_string()])?;
        Ok(revision)
    }
}
