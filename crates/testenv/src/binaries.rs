use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use crate::{Error, Result};

/// The control-plane binaries, built from their Go modules by `scripts/testenv.sh`.
#[derive(Clone, Debug)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// `$SWITCHYARD_TESTENV_BIN` when set (as `make` sets it); otherwise runs
    /// `scripts/testenv.sh build`, which builds whatever is missing and prints the directory.
    /// The script's progress (a cold build takes minutes per product) goes straight to this
    /// process's stderr, where a person running the tests sees it: the test harness captures
    /// only what the tests print themselves.
    pub fn locate() -> Result<Self> {
        if let Some(dir) = std::env::var_os("SWITCHYARD_TESTENV_BIN") {
            let binaries = Self { dir: dir.into() };
            binaries.check()?;
            return Ok(binaries);
        }
        let script = workspace_root().join("scripts/testenv.sh");
        let output = Command::new(&script)
            .arg("build")
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| Error::Build(format!("failed to run {}: {e}", script.display())))?;
        if !output.status.success() {
            return Err(Error::Build(format!(
                "{} build failed ({}); its output is above",
                script.display(),
                output.status
            )));
        }
        let dir = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        let binaries = Self { dir: dir.into() };
        binaries.check()?;
        Ok(binaries)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The kwok Stage definitions (node initialize and heartbeat, pod ready/complete/delete,
    /// and the Stage that keeps Pods annotated [`crate::KWOK_IMAGE_PULL_FAILS`] from Ready).
    pub fn kwok_stages(&self) -> PathBuf {
        self.dir.join("kwok-stages.yaml")
    }

    /// cert-manager's CustomResourceDefinitions, one multi-document YAML (from the
    /// `deploy/crds` directory of its Go module; see `scripts/testenv.sh`).
    pub fn cert_manager_crds(&self) -> PathBuf {
        self.dir.join("cert-manager/crds.yaml")
    }

    /// The Helm chart's CRD templates of the same cert-manager version
    /// (`deploy/charts/cert-manager/templates/crd-*.yaml`), to compare with
    /// [`Binaries::cert_manager_crds`].
    pub fn cert_manager_chart_crds(&self) -> PathBuf {
        self.dir.join("cert-manager/chart")
    }

    /// cert-manager approver-policy's CertificateRequestPolicy CRD (from the `deploy/crds`
    /// directory of its Go module; see `scripts/testenv.sh`).
    pub fn approver_policy_crds(&self) -> PathBuf {
        self.dir.join("approver-policy/crds.yaml")
    }

    /// The Prometheus Operator's ServiceMonitor and PrometheusRule CRDs, one multi-document
    /// YAML (from `example/prometheus-operator-crd` of its Go module; see
    /// `scripts/testenv.sh`).
    pub fn prometheus_operator_crds(&self) -> PathBuf {
        self.dir.join("prometheus-operator/crds.yaml")
    }

    fn check(&self) -> Result<()> {
        let needed = [
            "etcd",
            "kube-apiserver",
            "kube-scheduler",
            "kube-controller-manager",
            "kubectl",
            "kwok",
            "kwok-stages.yaml",
            "otelcol-switchyard",
            "cert-manager/crds.yaml",
            "approver-policy/crds.yaml",
            "prometheus-operator/crds.yaml",
        ];
        if let Some(missing) = needed.iter().find(|b| !self.dir.join(b).exists()) {
            return Err(Error::Build(format!(
                "{missing} is missing from {}; run `scripts/testenv.sh build`",
                self.dir.display()
            )));
        }
        // Stages written by an older scripts/testenv.sh lack the one tests rely on.
        let stages = std::fs::read_to_string(self.kwok_stages()).unwrap_or_default();
        if !stages.contains(crate::KWOK_IMAGE_PULL_FAILS) {
            return Err(Error::Build(format!(
                "{} has no Stage for {}; run `scripts/testenv.sh build`",
                self.kwok_stages().display(),
                crate::KWOK_IMAGE_PULL_FAILS
            )));
        }
        Ok(())
    }
}

/// The workspace root, found from this crate's manifest directory.
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}
