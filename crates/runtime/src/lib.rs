//! The shell every Switchyard service runs in.
//!
//! ```text
//!  main.rs ── Args::parse ──► Runtime::start ──► telemetry (fmt + optional OTLP)
//!                                │              admin port: /livez /readyz /metrics
//!                                │              signal watcher (SIGTERM/SIGINT)
//!                                ├─ serve_grpc(routes)    health + reflection (+ mTLS)
//!                                ├─ spawn(name, |drain| task)
//!                                └─ run() ── first signal: not ready, drain every task and
//!                                            stream (bounded); second signal: abort
//! ```

mod admin;
pub mod apiserver;
mod args;
pub mod authz;
mod backoff;
mod dial;
pub mod exposition;
mod grpc;
mod instance;
mod log_limiter;
mod metrics;
mod process;
mod shutdown;
mod supervise;
mod telemetry;
mod timer;
pub mod tls;

/// Trace context across processes, and whether this process exports traces at all.
pub mod trace {
    pub use crate::telemetry::{TraceFields, add_link, exporting, inject, set_parent};
}

use std::{future::Future, net::SocketAddr, time::Duration};

use tokio::net::TcpListener;
use tracing::{Instrument, info, info_span, warn};

pub use admin::{Gate, Readiness};
pub use args::{AdminArgs, GrpcArgs, LogArgs, LogFormat, RuntimeArgs};
pub use backoff::Backoff;
pub use dial::{DialError, Dialer, error_chain};
pub use grpc::{GrpcServer, MAX_STATUS_MESSAGE_BYTES, status_message};
pub use instance::{InstanceScope, instance_id};
pub use metrics::Metrics;
pub use shutdown::{Drain, ShutdownHandle, Stop, drain_channel};
pub use supervise::panic_message;
pub use timer::sleep_until;
pub use tls::{Identity, Role, ServingKey, Tls, TlsArgs, TlsError};

/// Errors of the runtime shell.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to bind the {what} address {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("failed to set up telemetry: {0}")]
    Telemetry(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("invalid gRPC server configuration: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("failed to build the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("tasks still running after the drain timeout of {timeout:?}: {running}")]
    DrainTimeout { timeout: Duration, running: String },
    #[error("aborted by a second shutdown signal")]
    Aborted,
    #[error("stopped because {0}")]
    TaskFailed(String),
    #[error("failed to install the signal handler: {0}")]
    Signal(std::io::Error),
    #[error(
        "--debug-fault-injection: this is a release build; fault injection is compiled only \
         into debug builds, for tests"
    )]
    FaultInjectionNotBuilt,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How long the drain may take after an essential task failed the process.
const FAILED_DRAIN: Duration = Duration::from_secs(5);

/// Starts supervised tasks after [`Runtime::start`], for work that comes and goes while the
/// service runs (an informer that a registration needs). Each task is tracked as the
/// runtime's own are: shutdown drains and waits for it.
#[derive(Clone, Debug)]
pub struct Spawner {
    tasks: shutdown::Tasks,
    supervisor: supervise::Supervisor,
    drain: Drain,
}

impl Spawner {
    /// Like [`Runtime::spawn_restarting`]: `task(drain)` runs again after a panic or an
    /// early return, until shutdown or until the returned handle is dropped. Its drain
    /// handle is signaled by either; a task stopped by its handle is not counted as a
    /// restart. After shutdown began, the task is not started at all.
    pub fn spawn_restarting<F, Fut>(&self, name: &'static str, task: F) -> TaskHandle
    where
        F: FnMut(Drain) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (drain, stop) = self.drain.child();
        if !drain.is_draining() {
            self.tasks
                .spawn(name, self.supervisor.clone().restarting(name, task, drain));
        }
        TaskHandle(stop)
    }
}

/// Stops its task (signals the task's drain handle) when dropped.
#[derive(Debug)]
#[must_use = "dropping it stops the task at once"]
pub struct TaskHandle(Stop);

impl TaskHandle {
    pub fn stop(self) {
        self.0.stop();
    }
}

/// A running service: its telemetry, admin port, readiness and shutdown.
#[derive(Debug)]
pub struct Runtime {
    grpc: GrpcArgs,
    tls: Option<Tls>,
    tls_reload: (Duration, tls::ReloadMetrics),
    drain_timeout: Duration,
    readiness: Readiness,
    metrics: Metrics,
    shutdown: shutdown::Shutdown,
    admin_addr: SocketAddr,
    admin_task: tokio::task::JoinHandle<()>,
    startup: Gate,
    supervisor: supervise::Supervisor,
    _telemetry: telemetry::Guard,
}

impl Runtime {
    /// Sets up telemetry, binds and serves the admin port and starts listening for signals.
    pub async fn start(service: &'static str, args: RuntimeArgs) -> Result<Self> {
        let RuntimeArgs {
            admin,
            grpc,
            tls,
            log,
            drain_timeout,
        } = args;
        let telemetry = telemetry::init(service, &log)?;
        let metrics = Metrics::new(service);
        let tls_reload = (
            tls.tls_reload_interval.into(),
            tls::ReloadMetrics::register(&metrics),
        );
        let tls = Tls::load(&tls)?;
        let readiness = Readiness::default();
        // Closed until run(): services register their own gates before that.
        let startup = readiness.gate("startup");
        let shutdown = shutdown::Shutdown::new()?;
        metrics.register(
            "switchyard_tasks",
            "Supervised tasks running, by name",
            shutdown.tasks().gauge(),
        );
        if admin.debug_fault_injection && !cfg!(debug_assertions) {
            return Err(Error::FaultInjectionNotBuilt);
        }
        let supervisor =
            supervise::Supervisor::new(shutdown.handle(), &metrics, admin.debug_fault_injection);
        if admin.debug_fault_injection {
            warn!(
                "--debug-fault-injection: POST /debug/panic/<task> on the admin port panics a task"
            );
        }

        let listener = TcpListener::bind(admin.admin_addr)
            .await
            .map_err(|source| Error::Bind {
                what: "admin",
                addr: admin.admin_addr,
                source,
            })?;
        let admin_addr = listener.local_addr().map_err(|source| Error::Bind {
            what: "admin",
            addr: admin.admin_addr,
            source,
        })?;
        let admin_task = tokio::spawn(
            admin::serve(
                listener,
                readiness.clone(),
                metrics.clone(),
                supervisor.clone(),
            )
            .instrument(info_span!("admin", addr = %admin_addr)),
        );
        info!(%admin_addr, version = env!("CARGO_PKG_VERSION"), "starting");
        match &tls {
            Some(tls) => {
                info!(identity = %tls.identity(), "mutual tls on every internal connection")
            }
            None => warn!(
                "--insecure-plaintext: internal connections are neither encrypted nor authenticated"
            ),
        }
        if let Some(tls) = &tls {
            shutdown.spawn(
                "tls-reload",
                tls::watch(
                    tls.clone(),
                    "service",
                    tls.interval(),
                    tls_reload.1.clone(),
                    shutdown.drain(),
                )
                .instrument(info_span!("task", name = "tls-reload")),
            );
        }

        Ok(Self {
            grpc,
            tls,
            tls_reload,
            drain_timeout: drain_timeout.into(),
            readiness,
            metrics,
            shutdown,
            admin_addr,
            admin_task,
            startup,
            supervisor,
            _telemetry: telemetry,
        })
    }

    /// The bound admin address (useful when the configured port was 0).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// How this service dials the others (mutual TLS with its identity, or plaintext).
    pub fn dialer(&self) -> Dialer {
        Dialer::new(self.tls.clone())
    }

    /// A serving certificate of this service other than its identity (`certificate` names
    /// it in `switchyard_tls_reloads_total` and the expiry gauge), reloaded from `cert` and
    /// `key` every `--tls-reload-interval` as the service's own is, until shutdown.
    pub fn serving_key(
        &self,
        certificate: &'static str,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> Result<ServingKey, TlsError> {
        let serving = ServingKey::load(cert, key)?;
        let (interval, metrics) = self.tls_reload.clone();
        self.shutdown.spawn(
            "tls-reload",
            tls::watch(
                serving.clone(),
                certificate,
                interval,
                metrics,
                self.shutdown.drain(),
            )
            .instrument(info_span!("task", name = "tls-reload", certificate)),
        );
        Ok(serving)
    }

    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// A drain handle for work that is not a task of this runtime (watch helpers).
    pub fn drain(&self) -> Drain {
        self.shutdown.drain()
    }

    /// A handle that triggers the same graceful shutdown as SIGTERM.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.handle()
    }

    /// Spawns a task that is given a drain handle; shutdown waits for it. It may return
    /// (a readiness check does); a panic fails the process (see [`Self::spawn_essential`]).
    pub fn spawn<F, Fut>(&self, name: &'static str, task: F)
    where
        F: FnOnce(Drain) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.spawn_once(name, supervise::OnExit::MayReturn, task);
    }

    /// Spawns a task that must run until shutdown, one that cannot be restarted without
    /// losing what it holds (the queue's actor, a member's lease, the elector's term): if it
    /// panics or returns before shutdown, `/livez` fails naming it, shutdown begins and
    /// [`Self::run`] returns [`Error::TaskFailed`], so the process exits non-zero and the
    /// kubelet restarts it.
    pub fn spawn_essential<F, Fut>(&self, name: &'static str, task: F)
    where
        F: FnOnce(Drain) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.spawn_once(name, supervise::OnExit::Essential, task);
    }

    /// Spawns `task(drain)` and runs it again, after a jittered backoff, whenever it panics
    /// or returns before shutdown (counted in `switchyard_task_restarts_total{task}`): for
    /// tasks whose state lives outside them (an informer's cache, the enqueuer's pending
    /// keys, a worker's streams).
    pub fn spawn_restarting<F, Fut>(&self, name: &'static str, task: F)
    where
        F: FnMut(Drain) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let drain = self.shutdown.drain();
        self.shutdown
            .spawn(name, self.supervisor.clone().restarting(name, task, drain));
    }

    /// Starts tasks while the service runs, each stopped on its own or by shutdown.
    pub fn spawner(&self) -> Spawner {
        Spawner {
            tasks: self.shutdown.tasks().clone(),
            supervisor: self.supervisor.clone(),
            drain: self.shutdown.drain(),
        }
    }

    fn spawn_once<F, Fut>(&self, name: &'static str, on_exit: supervise::OnExit, task: F)
    where
        F: FnOnce(Drain) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let drain = self.shutdown.drain();
        let fut = task(drain.clone());
        self.shutdown.spawn(
            name,
            self.supervisor.clone().once(name, on_exit, fut, drain),
        );
    }

    /// Binds the gRPC port and serves `server`'s routes plus health and reflection until
    /// shutdown. Returns the bound address.
    pub async fn serve_grpc(&self, server: GrpcServer) -> Result<SocketAddr> {
        self.serve_grpc_until(server, self.shutdown.drain()).await
    }

    /// Like [`Self::serve_grpc`], but the port stays open until `stop` rather than until
    /// shutdown begins: for a service that must keep listening while it drains (a queue
    /// member closes its port only after it has left, so a closed port proves it serves
    /// nothing). Shutdown still waits for the server, bounded by the drain timeout.
    pub async fn serve_grpc_until(&self, server: GrpcServer, stop: Drain) -> Result<SocketAddr> {
        let gate = self.readiness.gate("grpc");
        let (addr, serve) = server
            .bind(&self.grpc, self.tls.as_ref(), &self.metrics, stop)
            .await?;
        self.spawn_essential("grpc", move |_| serve.instrument(info_span!("grpc", %addr)));
        gate.ready();
        Ok(addr)
    }

    /// Waits for a shutdown signal (or [`ShutdownHandle::trigger`]), then turns not-ready,
    /// drains every task and stream within the drain timeout and stops the admin port.
    /// A second signal aborts the drain.
    pub async fn run(self) -> Result<()> {
        let Self {
            drain_timeout,
            readiness,
            mut shutdown,
            admin_task,
            startup,
            supervisor,
            _telemetry: mut telemetry,
            ..
        } = self;
        startup.ready();
        let signal = shutdown.signaled().await;
        info!(%signal, "shutting down");
        readiness.shutting_down();
        // A failed essential task may be what the others wait for (the queue's actor): the
        // drain gets a short bound, enough for a member to hand back its lease.
        let bound = match supervisor.failure() {
            Some(_) => drain_timeout.min(FAILED_DRAIN),
            None => drain_timeout,
        };
        let drained = shutdown.drain_all(bound).await;
        let result = match supervisor.failure() {
            Some(reason) => Err(Error::TaskFailed(reason)),
            None => drained,
        };
        admin_task.abort();
        // The exporter's last batch: spans of the drain itself included. Its shutdown blocks
        // until the export is answered, which needs this runtime's I/O, so off the workers.
        let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
        match &result {
            Ok(()) => info!("stopped"),
            Err(error) => warn!(%error, "stopped without a clean drain"),
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    use super::*;

    fn spawner() -> (Spawner, ShutdownHandle, shutdown::Tasks, Metrics) {
        let metrics = Metrics::new_for_tests();
        let (trigger, drain) = drain_channel();
        let tasks = shutdown::Tasks::default();
        let supervisor = supervise::Supervisor::new(trigger.clone(), &metrics, false);
        let spawner = Spawner {
            tasks: tasks.clone(),
            supervisor,
            drain,
        };
        (spawner, trigger, tasks, metrics)
    }

    fn running(tasks: &shutdown::Tasks, name: &str) -> i64 {
        tasks
            .gauge()
            .get_or_create(&shutdown::TaskLabels { task: name.into() })
            .get()
    }

    /// Waits (in paused time) until `condition` holds.
    async fn until(mut condition: impl FnMut() -> bool) {
        for _ in 0..1000 {
            if condition() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("condition not reached");
    }

    #[tokio::test(start_paused = true)]
    async fn a_spawned_task_stops_with_its_handle_without_a_restart() {
        let (spawner, _trigger, tasks, metrics) = spawner();
        let runs = Arc::new(AtomicUsize::new(0));
        let handle = spawner.spawn_restarting("informer", {
            let runs = runs.clone();
            move |drain: Drain| {
                runs.fetch_add(1, Ordering::SeqCst);
                drain.signaled()
            }
        });
        let other = spawner.spawn_restarting("informer", |drain: Drain| drain.signaled());
        until(|| running(&tasks, "informer") == 2).await;
        handle.stop();
        until(|| running(&tasks, "informer") == 1).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        let text = metrics.encode().unwrap();
        assert!(
            !text.contains("switchyard_task_restarts_total{"),
            "a stop counted as a restart: {text}"
        );
        drop(other);
        until(|| running(&tasks, "informer") == 0).await;
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_spawned_tasks_and_none_start_after_it() {
        let (spawner, trigger, tasks, _) = spawner();
        let _handle = spawner.spawn_restarting("informer", |drain: Drain| drain.signaled());
        until(|| running(&tasks, "informer") == 1).await;
        trigger.trigger();
        until(|| running(&tasks, "informer") == 0).await;
        let _late = spawner.spawn_restarting("informer", |drain: Drain| drain.signaled());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(running(&tasks, "informer"), 0);
    }
}
