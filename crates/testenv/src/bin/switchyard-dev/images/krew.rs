//! The plugin for krew: its release archive (the binary and the licence, as krew installs
//! them) and the krew manifest naming that archive's address and checksum.

use std::{path::Path, process::Command};

use anyhow::Context;

use super::{platform, tar};

/// The archive's file name: `kubectl-switchyard-v<version>-<os>-<arch>.tar.gz`.
pub(crate) fn archive_name(version: &str) -> anyhow::Result<String> {
    Ok(format!(
        "kubectl-switchyard-v{version}-{}.tar.gz",
        platform()?.replace('/', "-")
    ))
}

/// Writes `out/<archive>` from the plugin binary and the workspace's LICENSE, and
/// `out/krew/switchyard.yaml`; returns the archive's SHA-256.
pub(crate) fn write(
    out: &Path,
    work: &Path,
    binary: &Path,
    license: &Path,
    version: &str,
    source: &str,
    epoch: i64,
) -> anyhow::Result<String> {
    let staged = work.join("krew");
    if staged.exists() {
        std::fs::remove_dir_all(&staged)?;
    }
    std::fs::create_dir_all(&staged)?;
    std::fs::copy(binary, staged.join("kubectl-switchyard"))?;
    std::fs::copy(license, staged.join("LICENSE"))?;
    let name = archive_name(version)?;
    let tarball = work.join(name.trim_end_matches(".gz"));
    tar(&staged, &tarball, epoch)?;
    // -n: no name or time in the gzip header, so the same tar gives the same archive.
    let gz = std::fs::File::create(out.join(&name))?;
    let status = Command::new("gzip")
        .args(["-n", "-9", "-c"])
        .arg(&tarball)
        .stdout(gz)
        .status()
        .context("running gzip")?;
    anyhow::ensure!(status.success(), "gzip {} failed", tarball.display());
    let sha256 = sha256(&out.join(&name))?;
    let (os, arch) = platform()?
        .split_once('/')
        .map(|(o, a)| (o.to_owned(), a.to_owned()))
        .context("platform")?;
    let manifest = format!(
        r#"apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: switchyard
spec:
  version: v{version}
  homepage: {source}
  shortDescription: See and operate Switchyard's controllers, queues and shards
  description: |
    kubectl switchyard shows how Switchyard (a controller manager split into a watcher, a
    sharded work queue, reconcilers and an elector) is doing: its services, shard owners,
    queue backlog and lease holders (status, top), why an object is waiting (why), drains a
    queue replica (drain), and serves a live console (console).
  platforms:
    - selector:
        matchLabels:
          os: {os}
          arch: {arch}
      uri: {source}/releases/download/v{version}/{name}
      sha256: {sha256}
      bin: kubectl-switchyard
      files:
        - from: kubectl-switchyard
          to: .
        - from: LICENSE
          to: .
"#
    );
    std::fs::create_dir_all(out.join("krew"))?;
    std::fs::write(out.join("krew/switchyard.yaml"), manifest)?;
    Ok(sha256)
}

fn sha256(file: &Path) -> anyhow::Result<String> {
    let out = Command::new("sha256sum")
        .arg(file)
        .output()
        .context("running sha256sum")?;
    anyhow::ensure!(out.status.success(), "sha256sum {} failed", file.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .map(str::to_owned)
        .context("sha256sum printed nothing")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_archive_is_named_for_the_version_and_platform() {
        let name = super::archive_name("0.1.0").unwrap();
        assert!(
            name.starts_with("kubectl-switchyard-v0.1.0-linux-"),
            "{name}"
        );
        assert!(name.ends_with(".tar.gz"));
    }
}
