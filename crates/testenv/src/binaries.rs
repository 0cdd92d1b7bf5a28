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
        let dir = testenv_script("build")?;
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

    /// The OpenTelemetry Collector the trace tests export to. Only tests use it, so
    /// `scripts/testenv.sh build` (what `make run` builds) leaves it out; the first test that
    /// asks for it builds it here with `scripts/testenv.sh otelcol` (about 100 s cold), and
    /// `make test` builds it before the tests.
    pub fn otelcol(&self) -> Result<PathBuf> {
        let program = self.path("otelcol-switchyard");
        if !program.exists() {
            testenv_script("otelcol")?;
        }
        Ok(program)
    }

    /// The kwok Stage definitions: node initialize and heartbeat, pod ready and delete, the
    /// Stage that keeps Pods annotated [`crate::KWOK_IMAGE_PULL_FAILS`] from Ready, and the
    /// Pod outcomes their containers' commands ask for (docs/testing.md).
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
            "crane",
            "kwok-stages.yaml",
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
        // Stages written by an older scripts/testenv.sh lack the rules tests rely on.
        let stages = std::fs::read_to_string(self.kwok_stages()).unwrap_or_default();
        if !stages.lines().any(|l| l == crate::KWOK_STAGES_REVISION) {
            return Err(Error::Build(format!(
                "{} was written by an older scripts/testenv.sh (no {:?} line); run \
                 `scripts/testenv.sh build`",
                self.kwok_stages().display(),
                crate::KWOK_STAGES_REVISION
            )));
        }
        Ok(())
    }
}

/// Runs `scripts/testenv.sh <command>`, its progress going straight to this process's stderr;
/// what it printed on stdout (the bin directory).
fn testenv_script(command: &str) -> Result<String> {
    let script = workspace_root().join("scripts/testenv.sh");
    let output = Command::new(&script)
        .arg(command)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| Error::Build(format!("failed to run {}: {e}", script.display())))?;
    if !output.status.success() {
        return Err(Error::Build(format!(
            "{} {command} failed ({}); its output is above",
            script.display(),
            output.status
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The workspace root, found from this crate's manifest directory.
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}
