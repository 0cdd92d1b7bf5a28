//! etcd on loopback, on its own (the elector's store, over TLS with client certificates and
//! etcd's RBAC as in an installation: `switchyard_shards::access`) or under the apiserver
//! (plaintext, the apiserver's own business).

use std::{
    net::IpAddr,
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
    /// Serving certificate, and the CA client certificates must chain to.
    tls: Option<crate::tls::Files>,
    /// Another address the client port listens on, besides 127.0.0.1.
    also_on: Option<IpAddr>,
    process: Option<ManagedProcess>,
    _temp: Option<tempfile::TempDir>,
}

impl Etcd {
    /// Starts etcd in a temporary directory of its own, serving TLS with the shared test
    /// PKI's etcd certificate and requiring client certificates from its CA.
    pub async fn start() -> Result<Self> {
        Self::start_tls(None).await
    }

    /// Like [`Self::start`], with the client port also listening on `ip` (the root end of a
    /// [`crate::NetNs`], say): see [`Self::endpoint_at`].
    pub async fn start_also_on(ip: IpAddr) -> Result<Self> {
        Self::start_tls(Some(ip)).await
    }

    async fn start_tls(also_on: Option<IpAddr>) -> Result<Self> {
        let temp = tempfile::Builder::new()
            .prefix("switchyard-etcd-")
            .tempdir()?;
        let tls = crate::Pki::shared().files_of(crate::tls::ETCD_ACCOUNT);
        let mut etcd =
            Self::start_with(&Binaries::locate()?, temp.path(), Some(tls), also_on).await?;
        etcd._temp = Some(temp);
        // Only the queue and the elector have a user, each with its role; etcd's own
        // certificate administers.
        let mut admin = etcd.client().await?;
        switchyard_shards::access::apply(&mut admin, &[switchyard_shards::access::ADMIN])
            .await
            .map_err(|e| crate::Error::Setup(format!("enabling etcd auth: {e}")))?;
        Ok(etcd)
    }

    pub(crate) async fn start_in(binaries: &Binaries, dir: &Path) -> Result<Self> {
        Self::start_with(binaries, dir, None, None).await
    }

    async fn start_with(
        binaries: &Binaries,
        dir: &Path,
        tls: Option<crate::tls::Files>,
        also_on: Option<IpAddr>,
    ) -> Result<Self> {
        let _ = std::fs::remove_dir_all(dir.join("etcd-data"));
        start_on_free_ports("etcd", || async {
            let ports = (free_port()?, free_port()?);
            let mut etcd = Self {
                binaries: binaries.clone(),
                dir: dir.to_owned(),
                ports,
                endpoint: format!(
                    "{}://127.0.0.1:{}",
                    if tls.is_some() { "https" } else { "http" },
                    ports.0
                ),
                tls: tls.clone(),
                also_on,
                process: None,
                _temp: None,
            };
            etcd.run().await?;
            Ok(etcd)
        })
        .await
    }

    /// The client URL, `https://127.0.0.1:<port>` (`http://` under the apiserver).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The client URL with `host` in place of 127.0.0.1: `https://localhost:<port>` reaches
    /// the address `localhost` names where the client runs, and the certificate is valid
    /// for that name.
    pub fn endpoint_at(&self, host: &str) -> String {
        self.endpoint.replacen("127.0.0.1", host, 1)
    }

    /// How a client reaches this etcd, presenting `role`'s certificate when it serves TLS
    /// (etcd grants it what `switchyard_shards::access` gives its role, if anything).
    pub fn connection(&self, role: switchyard_runtime::Role) -> switchyard_shards::Etcd {
        self.connection_as(role.service_account())
    }

    /// Like [`Self::connection`], with the certificate the shared test PKI holds under `name`.
    pub fn connection_as(&self, name: &str) -> switchyard_shards::Etcd {
        let endpoints = vec![self.endpoint.clone()];
        match &self.tls {
            None => switchyard_shards::Etcd::plaintext(endpoints),
            Some(_) => {
                let files = crate::Pki::shared().files_of(name);
                switchyard_shards::Etcd::with_tls(endpoints, &files.cert, &files.key, &files.ca)
            }
        }
    }

    /// A client of this etcd with etcd's own certificate, an administrator: for tests that
    /// arrange or inspect any key.
    pub async fn client(&self) -> Result<etcd_client::Client> {
        self.connection_as(crate::tls::ETCD_ACCOUNT)
            .connect()
            .await
            .map_err(|e| crate::Error::Setup(format!("connecting to etcd: {e}")))
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
        let client_url = self.endpoint.clone();
        let peer_url = format!("http://127.0.0.1:{}", self.ports.1);
        let listen_urls = match self.also_on {
            Some(ip) => format!("{client_url},{}", self.endpoint_at(&ip.to_string())),
            None => client_url.clone(),
        };
        let mut args = vec![
            "--name=switchyard-testenv".to_owned(),
            format!("--data-dir={}", self.dir.join("etcd-data").display()),
            format!("--listen-client-urls={listen_urls}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=switchyard-testenv={peer_url}"),
            "--unsafe-no-fsync=true".to_owned(),
            "--auto-compaction-retention=1".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        let mut http = reqwest::Client::builder();
        if let Some(tls) = &self.tls {
            args.extend([
                format!("--cert-file={}", tls.cert.display()),
                format!("--key-file={}", tls.key.display()),
                format!("--trusted-ca-file={}", tls.ca.display()),
                "--client-cert-auth=true".to_owned(),
            ]);
            // The health check presents a client certificate like any other client.
            let pem = [std::fs::read(&tls.cert)?, std::fs::read(&tls.key)?].concat();
            let setup = |e: reqwest::Error| crate::Error::Setup(format!("etcd TLS: {e}"));
            http = http
                .add_root_certificate(
                    reqwest::Certificate::from_pem(&std::fs::read(&tls.ca)?).map_err(setup)?,
                )
                .identity(reqwest::Identity::from_pem(&pem).map_err(setup)?);
        }
        let http = http
            .build()
            .map_err(|e| crate::Error::Setup(format!("etcd health client: {e}")))?;
        let mut process = ManagedProcess::spawn(
            "etcd",
            &self.binaries.path("etcd"),
            &args,
            &[],
            &self.dir.join("etcd.log"),
        )?;
        let url = format!("{client_url}/health");
        wait_healthy(&mut process, START_TIMEOUT, || http_ok(&http, &url)).await?;
        self.process = Some(process);
        Ok(())
    }
}
