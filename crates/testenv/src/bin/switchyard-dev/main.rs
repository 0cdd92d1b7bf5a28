//! `switchyard-dev`: the local control plane for people.
//!
//! - `up`: start etcd, kube-apiserver, kube-scheduler and kwok and keep them running
//!   (`--detach` returns once the cluster is ready; `make cluster-up`);
//! - `down`: stop a detached cluster (`make cluster-down`);
//! - `run`: start a control plane (unless `KUBECONFIG` names a cluster) and every Switchyard
//!   service against it, apply a sample workload and follow it until it is Available, and
//!   stop everything on Ctrl-C (`make run`);
//! - `test`: build every test binary of the workspace and run a few at a time (`make test`);
//! - `bench`: run a benchmark, record its figures in docs/bench-results.tsv and regenerate
//!   docs/benchmarks.md's headline table (`make bench-<area>`); `bench-table` regenerates
//!   (or, `--check`, checks) the table alone;
//! - `images`: OCI image archives of the services and the plugin from the release build, and
//!   the release overlay that pins them by digest (`make images`).

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use switchyard_testenv::{Binaries, ControlPlane, ControlPlaneOptions};
use tokio::signal::unix::{SignalKind, signal};

mod bench;
mod images;
mod reap;
mod run;
mod test;

#[derive(Debug, Parser)]
#[command(
    name = "switchyard-dev",
    about = "A local Kubernetes control plane for Switchyard"
)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Start a control plane and keep it running until SIGTERM or Ctrl-C
    Up {
        /// Directory for certificates, data, logs and the kubeconfig
        #[arg(long, env = "SWITCHYARD_CLUSTER_DIR", default_value_os_t = default_dir())]
        dir: PathBuf,
        /// Number of fake kwok Nodes
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Run in the background and return once the control plane is ready
        #[arg(long)]
        detach: bool,
    },
    /// Stop a control plane started with `up --detach`
    Down {
        /// The directory given to `up`
        #[arg(long, env = "SWITCHYARD_CLUSTER_DIR", default_value_os_t = default_dir())]
        dir: PathBuf,
    },
    /// Start a control plane (unless KUBECONFIG names a cluster) and every Switchyard
    /// service against it, apply a sample workload and show its progress
    Run {
        /// Where the service binaries are (default: beside this binary)
        #[arg(long)]
        services_dir: Option<PathBuf>,
        /// Exit as soon as the sample workload is Available (a smoke test)
        #[arg(long)]
        exit_when_ready: bool,
        /// A reconciler binary of your own (built on the SDK) to run beside the built-in
        /// ones, with the same flags; it registers its controllers' watches itself
        #[arg(long)]
        reconciler: Option<PathBuf>,
        /// Optional: controllers that binary runs, declared to the queues from the start (they
        /// learn any name when it is first used, so this only makes its metrics appear early)
        #[arg(long, value_delimiter = ',', requires = "reconciler")]
        controllers: Vec<String>,
        /// CustomResourceDefinition manifests (YAML) to install before the services start;
        /// the reconciler's identity is granted their kinds in full (the watcher's
        /// `registrations`)
        #[arg(long)]
        crd: Vec<PathBuf>,
        /// More kinds the reconciler's identity may register in full, as apiVersion/Kind
        /// (for example v1/ConfigMap, for a controller that owns ConfigMaps)
        #[arg(long, value_delimiter = ',', requires = "reconciler")]
        grant: Vec<String>,
    },
    /// Build every test binary of the workspace and run them and the doc tests, several at a
    /// time (most wait on a control plane); fails if any test failed. Run from the workspace
    #[command(name = "test")]
    Test {
        /// Test binaries run at once (0 counts as 1)
        #[arg(long, env = "SWITCHYARD_TEST_JOBS", default_value_t = DEFAULT_TEST_JOBS)]
        jobs: usize,
        /// More binaries at once beside those, of the light ones: those whose whole process
        /// tree used under a quarter of a core on average in their last run
        #[arg(long, env = "SWITCHYARD_TEST_LIGHT_JOBS", default_value_t = DEFAULT_LIGHT_JOBS)]
        light_jobs: usize,
        /// Without timings of an earlier run in target/, schedule by those recorded in this
        /// document (docs/testing.md)
        #[arg(long, value_name = "DOCUMENT")]
        seed: Option<PathBuf>,
        /// Write each binary's time into this document, between its
        /// `<!-- switchyard-dev test --record: begin -->` and `end` lines (docs/testing.md)
        #[arg(long, value_name = "DOCUMENT")]
        record: Option<PathBuf>,
        /// Arguments for every test binary (a test name filter, --nocapture)
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Run one command as `test` runs each test binary: wait for it and everything it left
    /// running, write their CPU seconds to a file, exit with its code
    #[command(hide = true)]
    Reap {
        /// Where the CPU seconds are written
        #[arg(long)]
        cpu: PathBuf,
        /// The command
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Run a benchmark command, append the `bench <area>.<figure> <value> <unit>` lines it
    /// prints to docs/bench-results.tsv (with the date, commit, machine and load) and
    /// regenerate docs/benchmarks.md's headline table. Run from the workspace
    Bench {
        /// The area whose figures are recorded (queue, elector, watcher, e2e, gc, capacity, batch)
        area: String,
        /// The benchmark command
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Write an OCI image archive per service and one for the plugin from the release
    /// binaries, each with its SBOM, then images.json and release/kustomization.yaml (the
    /// kustomize base with the images pinned by digest). Run from the workspace
    Images {
        /// Where the archives and the rest are written
        #[arg(long, default_value = "target/images")]
        out: PathBuf,
        /// Where the release binaries are
        #[arg(long, default_value = "target/release")]
        binaries: PathBuf,
        /// The registry and path the images are named under
        #[arg(
            long,
            env = "SWITCHYARD_IMAGE_REPOSITORY",
            default_value = "ghcr.io/switchyard"
        )]
        repository: String,
    },
    /// Regenerate docs/benchmarks.md's headline table from docs/bench-results.tsv. Run from
    /// the workspace
    BenchTable {
        /// Fail if the table is not the one the results give, instead of writing it
        #[arg(long)]
        check: bool,
    },
}

/// Two on the 2-core machine the tests are written for. Two binaries at a time already keep
/// both cores busy (ha_watchers alone runs twelve service processes); three finished less
/// than a minute sooner, and slowed the tests that bound a time (a status repaired within
/// 2 s) past their bounds.
const DEFAULT_TEST_JOBS: usize = 2;
/// One light binary beside those two (`test::LIGHT_CORES`).
const DEFAULT_LIGHT_JOBS: usize = 1;

fn default_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("switchyard/cluster")
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // The error and its causes on one line, with no backtrace even under RUST_BACKTRACE: the
    // last lines of a failed `make test` are the summary of what failed.
    if let Err(error) = run().await {
        eprintln!("switchyard-dev: {error:#}");
        std::process::exit(1);
    }
}

async fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SWITCHYARD_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Args::parse().command {
        Cmd::Up {
            dir,
            nodes,
            detach: true,
        } => up_detached(&dir, nodes).await,
        Cmd::Up { dir, nodes, .. } => up(&dir, nodes).await,
        Cmd::Down { dir } => down(&dir).await,
        Cmd::Run {
            services_dir,
            exit_when_ready,
            reconciler,
            controllers,
            crd,
            grant,
        } => {
            let own = match reconciler {
                Some(binary) => Some(run::Own {
                    binary: std::fs::canonicalize(&binary).with_context(|| {
                        format!("--reconciler: {} does not exist", binary.display())
                    })?,
                    controllers,
                    grants: grant,
                }),
                None => None,
            };
            run::run(services_dir, exit_when_ready, own, &crd).await
        }
        Cmd::Test {
            jobs,
            light_jobs,
            record,
            seed,
            args,
        } => {
            let lanes = test::Lanes {
                jobs,
                light: light_jobs,
            };
            test::test(lanes, args, record, seed).await
        }
        Cmd::Reap { cpu, command } => {
            let code = reap::reap(&cpu, &command[0], &command[1..])?;
            std::process::exit(code)
        }
        Cmd::Bench { area, command } => bench::bench(&std::env::current_dir()?, &area, &command),
        Cmd::BenchTable { check } => bench::write_table(&std::env::current_dir()?, check),
        Cmd::Images {
            out,
            binaries,
            repository,
        } => {
            std::fs::create_dir_all(&out)?;
            images::images(&images::Options {
                workspace: std::env::current_dir()?,
                out,
                binaries,
                repository,
                crane: Binaries::locate()?.path("crane"),
                cache: default_dir()
                    .parent()
                    .unwrap_or(Path::new("."))
                    .join("images"),
            })
        }
    }
}

async fn up(dir: &Path, nodes: usize) -> anyhow::Result<()> {
    if let Some(pid) = running_pid(dir) {
        bail!(
            "a control plane is already running from {} (pid {pid}); stop it with `make cluster-down`",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir)?;
    let _ = std::fs::remove_file(dir.join("ready"));
    std::fs::write(dir.join("pid"), std::process::id().to_string())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let plane = ControlPlane::start(ControlPlaneOptions {
        nodes,
        dir: Some(dir.to_owned()),
    })
    .await
    .context("starting the control plane")?;
    std::fs::write(dir.join("ready"), plane.server())?;
    println!("control plane ready: {}", plane.server());
    println!("kubeconfig: {}", plane.kubeconfig().display());
    tokio::select! {
        _ = sigterm.recv() => {}
        _ = sigint.recv() => {}
    }
    println!("stopping the control plane");
    plane.stop();
    let _ = std::fs::remove_file(dir.join("ready"));
    let _ = std::fs::remove_file(dir.join("pid"));
    Ok(())
}

async fn up_detached(dir: &Path, nodes: usize) -> anyhow::Result<()> {
    if let Some(pid) = running_pid(dir) {
        bail!(
            "a control plane is already running from {} (pid {pid}); stop it with `make cluster-down`",
            dir.display()
        );
    }
    // Build (or find) the binaries here, where the person sees the progress.
    let binaries = Binaries::locate()?;
    std::fs::create_dir_all(dir)?;
    let _ = std::fs::remove_file(dir.join("ready"));
    let log_path = dir.join("switchyard-dev.log");
    let log = std::fs::File::create(&log_path)?;
    let mut child = Command::new(std::env::current_exe()?)
        .args(["up", "--nodes", &nodes.to_string(), "--dir"])
        .arg(dir)
        .env("SWITCHYARD_TESTENV_BIN", binaries.dir())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("starting the background control plane")?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while !dir.join("ready").exists() {
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!(
                "the control plane exited ({status}); {}:\n{log}",
                log_path.display()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "the control plane was not ready after 300 s; see {}",
                log_path.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "control plane ready (pid {}, log {})",
        child.id(),
        log_path.display()
    );
    println!("kubeconfig: {}", dir.join("kubeconfig").display());
    println!(
        "try: kubectl --kubeconfig {} get nodes",
        dir.join("kubeconfig").display()
    );
    Ok(())
}

async fn down(dir: &Path) -> anyhow::Result<()> {
    let Some(pid) = running_pid(dir) else {
        println!("no control plane running from {}", dir.display());
        return Ok(());
    };
    signal_pid(pid, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(60);
    while alive(pid) {
        if Instant::now() > deadline {
            signal_pid(pid, libc::SIGKILL);
            bail!("the control plane (pid {pid}) did not stop within 60 s; killed it");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = std::fs::remove_file(dir.join("pid"));
    println!("control plane stopped");
    Ok(())
}

/// The pid recorded by `up` in `dir`, if that process is still alive.
fn running_pid(dir: &Path) -> Option<libc::pid_t> {
    let pid = std::fs::read_to_string(dir.join("pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    alive(pid).then_some(pid)
}

#[allow(unsafe_code)]
fn alive(pid: libc::pid_t) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

#[allow(unsafe_code)]
fn signal_pid(pid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid, signal);
    }
}
