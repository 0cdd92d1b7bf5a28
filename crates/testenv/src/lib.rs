//! A real Kubernetes control plane on loopback, for tests and for people.
//!
//! ```text
//!  scripts/testenv.sh build ─► ~/.cache/switchyard/testenv/bin/<versions>/  (built once)
//!                                         │
//!  ControlPlane::start ── pki (rcgen) ── etcd ── kube-apiserver ── kube-scheduler ── kwok
//!                                                     │                               │
//!                                      admin kubeconfig, fake Nodes  ◄── Ready ───────┘
//!                        [start_controller_manager(controllers)] ── kube-controller-manager
//!  Collector::start ── otelcol-switchyard (OTLP/gRPC in, JSON lines out), for trace tests
//!  Prometheus::start ── Debian's prometheus, scraping admin ports, for the monitoring tests
//! ```
//!
//! Every process listens on a free 127.0.0.1 port (a port taken between choosing and binding
//! is retried with another), logs to a file in the cluster's directory, and dies with its
//! parent: the harness stops it on drop, at process exit, and through `PR_SET_PDEATHSIG`
//! when the test process is killed.

mod binaries;
mod cluster;
pub mod crane;
mod error;
mod etcd;
pub mod fuzz;
mod in_process;
mod kubeconfig;
pub mod manifests;
mod namespace;
mod netns;
mod otelcol;
mod pki;
mod ports;
mod process;
mod prometheus;
pub mod publish;
mod serve_log;
mod service;
pub mod tls;

pub use binaries::Binaries;
pub use cluster::{ApiServer, ControlPlane, ControlPlaneOptions, ControllerManager};
pub use error::{Error, Result};
pub use etcd::Etcd;
pub use in_process::InProcess;
pub use namespace::TestNamespace;
pub use netns::NetNs;
pub use otelcol::{Collector, ExportedSpan};
pub use prometheus::{Prometheus, Sample, promtool};
pub use serve_log::serve_intervals;
pub use service::{
    ServiceProcess, assert_service_lifecycle, children_of, cpu_seconds, list_services,
    resident_bytes,
};
/// The OpenMetrics reader, the runtime's ([`switchyard_runtime::exposition`]).
pub use switchyard_runtime::exposition;
pub use tls::Pki;

/// A Pod annotated with this key (any value) is never made Ready by the harness's kwok: it
/// stays Pending with its containers waiting in `ImagePullBackOff`, as a kubelet keeps a Pod
/// whose image cannot be pulled. Set it on a Pod template to stall a rollout.
/// (`scripts/testenv.sh` writes the Stage and keeps kwok's pod-ready Stage off such Pods.)
pub const KWOK_IMAGE_PULL_FAILS: &str = "kwok.switchyard.dev/image-pull-fails";

/// The line `scripts/testenv.sh` puts in the kwok Stages it writes, changed with the rules
/// (Pod outcomes from their containers' commands, docs/testing.md): Stages without it were
/// written by an older script and are written again by `scripts/testenv.sh build`.
pub const KWOK_STAGES_REVISION: &str = "# switchyard-stages: 2";

/// For benchmarks: whether the measurement `name` should run. `SWITCHYARD_BENCH_RUNS`, a
/// comma-separated list of names, runs only those; unset, everything runs.
pub fn bench_selected(name: &str) -> bool {
    std::env::var("SWITCHYARD_BENCH_RUNS")
        .map(|runs| runs.split(',').any(|run| run.trim() == name))
        .unwrap_or(true)
}

/// Rounds of a comparison benchmark: `SWITCHYARD_BENCH_ROUNDS`, 2 by default.
pub fn bench_rounds() -> usize {
    std::env::var("SWITCHYARD_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .filter(|r| *r > 0)
        .unwrap_or(2)
}

/// The runs of a comparison: `rounds` rounds of the `subjects` selected
/// ([`bench_selected`]), in their order in even rounds and reversed in odd ones, so that no
/// side always runs first on a machine that warms up or loads as it goes.
pub fn alternating<T: Copy>(
    subjects: &[(&'static str, T)],
    rounds: usize,
) -> Vec<(&'static str, T)> {
    let selected: Vec<(&'static str, T)> = subjects
        .iter()
        .copied()
        .filter(|(name, _)| bench_selected(name))
        .collect();
    (0..rounds)
        .flat_map(|round| {
            let mut order = selected.clone();
            if round % 2 == 1 {
                order.reverse();
            }
            order
        })
        .collect()
}

/// The median of a comparison's runs (the mean of the middle two for an even count).
pub fn median(mut runs: Vec<f64>) -> Option<f64> {
    runs.sort_by(f64::total_cmp);
    let n = runs.len();
    match n {
        0 => None,
        n if n % 2 == 1 => Some(runs[n / 2]),
        n => Some((runs[n / 2 - 1] + runs[n / 2]) / 2.0),
    }
}

/// Runs a comparison: every selected subject once per round ([`alternating`] over
/// [`bench_rounds`] rounds), each run's figure printed on stderr as `<area>.<name> run <i>`,
/// and returns each subject's median.
pub async fn compare<T, F, Fut>(
    area: &str,
    subjects: &[(&'static str, T)],
    unit: &str,
    mut run: F,
) -> std::collections::BTreeMap<&'static str, f64>
where
    T: Copy,
    F: FnMut(&'static str, T) -> Fut,
    Fut: std::future::Future<Output = f64>,
{
    let mut runs: std::collections::BTreeMap<&'static str, Vec<f64>> = Default::default();
    for (name, subject) in alternating(subjects, bench_rounds()) {
        let figure = run(name, subject).await;
        let done = runs.entry(name).or_default();
        eprintln!("{area}.{name} run {}: {figure} {unit}", done.len());
        done.push(figure);
    }
    runs.into_iter()
        .filter_map(|(name, runs)| Some((name, median(runs)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_alternate_which_side_runs_first() {
        let subjects = [("kcm", 0), ("sy1", 1), ("sy4", 4)];
        let names: Vec<&str> = alternating(&subjects, 3).iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "kcm", "sy1", "sy4", "sy4", "sy1", "kcm", "kcm", "sy1", "sy4"
            ]
        );
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0]), Some(2.5));
        assert_eq!(median(Vec::new()), None);
    }
}
