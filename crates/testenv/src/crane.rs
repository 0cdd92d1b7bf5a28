//! go-containerregistry's `crane` (built by `scripts/testenv.sh`): a registry it serves on
//! loopback, and its commands against that registry. `make images` assembles the images in
//! one; the image tests load the archives into one.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::{Error, Result};

/// `crane registry serve` on a loopback port, stopped on drop.
#[derive(Debug)]
pub struct Registry {
    crane: PathBuf,
    child: Child,
    address: String,
}

impl Registry {
    /// Starts it with the `crane` binary at `crane`, once it says its port.
    pub fn serve(crane: &Path) -> Result<Self> {
        let mut child = Command::new(crane)
            .args(["registry", "serve", "--address", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                Error::Setup(format!("starting {} registry serve: {e}", crane.display()))
            })?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| Error::Setup("crane's stderr".into()))?;
        let (tx, rx) = std::sync::mpsc::channel();
        // Keeps reading after the port, so crane never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr)
                .lines()
                .map_while(std::io::Result::ok)
            {
                if let Some((_, port)) = line.rsplit_once("serving on port ") {
                    let _ = tx.send(port.trim().to_owned());
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(port) => Ok(Self {
                crane: crane.to_owned(),
                child,
                address: format!("127.0.0.1:{port}"),
            }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(Error::Setup(
                    "crane registry serve did not say its port within 30 s".into(),
                ))
            }
        }
    }

    /// `host:port`, the start of every reference in it.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Runs `crane <args> --insecure` (the registry is plain HTTP); returns what it printed.
    pub fn crane(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(&self.crane)
            .args(args)
            .arg("--insecure")
            .output()
            .map_err(|e| Error::Setup(format!("running crane: {e}")))?;
        if !out.status.success() {
            return Err(Error::Setup(format!(
                "crane {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
