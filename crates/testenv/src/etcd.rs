//! etcd on loopback, on its own (the elector's store) or under the apiserver.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use crate::{
    Binaries, Result,
    cluster::{START_TIMEOUT, http_ok},
    ports::free_port,
    process::{ManagedProcess, start_on_free_ports, wait_healthy},
};

/// A single-member etcd; stopped on drop.
#[derive(Debug)]
pub struct Etcd {
    binaries: Binaries,
    dir: PathBuf,
    ports: (u16, u16),
    endpoint: String,
    process: Option<ManagedProcess>,
    _temp: Option<tempfile::TempDir>,
}

impl Etcd {
    /// Starts etcd in a temporary directory of its own.
    pub async fn start() -> Result<Self> {
        let temp = tempfile::Builder::new()
            .prefix("switchyard-etcd-")
            .tempdir()?;
        let mut etcd = Self::start_in(&Binaries::locate()?, temp.path()).await?;
        etcd._temp = Some(temp);
        Ok(etcd)
    }

    pub(crate) async fn start_in(binaries: &Binaries, dir: &Path) -> Result<Self> {
        let _ = std::fs::remove_dir_all(dir.join("etcd-data"));
        start_on_free_ports("etcd", || async {
            let ports = (free_port()?, free_port()?);
            let mut etcd = Self {
                binaries: binaries.clone(),
                dir: dir.to_owned(),
                ports,
                endpoint: format!("http://127.0.0.1:{}", ports.0),
                process: None,
                _temp: None,
            };
            etcd.run().await?;
            Ok(etcd)
        })
        .await
    }

    /// The client URL, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Kills etcd at once (SIGKILL); its data stays for [`Self::restart`].
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.signal(libc::SIGKILL);
            process.stop(Duration::from_secs(5));
        }
    }

    /// Starts etcd again on the same ports with the same data.
    pub async fn restart(&mut self) -> Result<()> {
        self.kill();
        self.run().await
    }

    pub(crate) fn into_parts(mut self) -> (ManagedProcess, String) {
        let process = self.process.take().expect("a started etcd has a process");
        (process, std::mem::take(&mut self.endpoint))
    }

    async fn run(&mut self) -> Result<()> {
        let client_url = format!("http://127.0.0.1:{}", self.ports.0);
        let peer_url = format!("http://127.0.0.1:{}", self.ports.1);
        let args = vec![
            "--name=switchyard-testenv".to_owned(),
            format!("--data-dir={}", self.dir.join("etcd-data").display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=switchyard-testenv={peer_url}"),
            "--unsafe-no-fsync=true".to_owned(),
            "--auto-compaction-retention=1".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        let mut process = ManagedProcess::spawn(
            "etcd",
            &self.binaries.path("etcd"),
            &args,
            &[],
            &self.dir.join("etcd.log"),
        )?;
        let http = reqwest::Client::new();
        let url = format!("{client_url}/health");
        wait_healthy(&mut process, START_TIMEOUT, || http_ok(&http, &url)).await?;
        self.process = Some(process);
        Ok(())
    }
}
