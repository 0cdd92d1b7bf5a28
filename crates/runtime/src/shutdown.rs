//! One shutdown path: the first SIGTERM/SIGINT (or a [`ShutdownHandle`]) cancels the drain
//! token every task holds; the runtime then waits, bounded, for every tracked task. A second
//! signal aborts the wait.
//!
//! A task started while the service runs, and stopped before shutdown (an informer that a
//! registration needs), holds a child of the drain token ([`Drain::child`]): its own stop
//! cancels only the child, shutdown cancels every child.

use std::{
    collections::BTreeMap,
    future::Future,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, gauge::Gauge},
};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_util::{
    sync::{CancellationToken, DropGuard},
    task::TaskTracker,
};

use crate::{Error, Result};

/// Given to every long-lived task and server stream; resolves when shutdown begins.
#[derive(Clone, Debug)]
pub struct Drain(CancellationToken);

impl Drain {
    /// Resolves once shutdown has begun.
    pub async fn signaled(self) {
        self.0.cancelled_owned().await
    }

    pub fn is_draining(&self) -> bool {
        self.0.is_cancelled()
    }

    /// A drain handle signaled by shutdown or by its [`Stop`], whichever comes first.
    pub fn child(&self) -> (Drain, Stop) {
        let child = self.0.child_token();
        (
            Drain(child.clone()),
            Stop {
                _guard: child.drop_guard(),
            },
        )
    }
}

/// Signals the drain handle of one task (made by [`Drain::child`]) when stopped or dropped.
#[derive(Debug)]
#[must_use = "dropping it stops the task at once"]
pub struct Stop {
    _guard: DropGuard,
}

impl Stop {
    pub fn stop(self) {
        drop(self);
    }
}

/// A drain handle and the trigger that signals it, for tasks run outside a [`crate::Runtime`]
/// (tests, benchmarks).
pub fn drain_channel() -> (ShutdownHandle, Drain) {
    let token = CancellationToken::new();
    (ShutdownHandle(token.clone()), Drain(token))
}

/// Starts a graceful shutdown from code (tests, fatal errors in a task).
#[derive(Clone, Debug)]
pub struct ShutdownHandle(CancellationToken);

impl ShutdownHandle {
    pub fn trigger(&self) {
        self.0.cancel();
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TaskLabels {
    pub(crate) task: String,
}

/// The names of the tracked tasks still running, so a drain that times out can say which,
/// and their count by name (`switchyard_tasks`).
#[derive(Clone, Debug, Default)]
struct Running {
    tasks: Arc<Mutex<BTreeMap<u64, &'static str>>>,
    next_id: Arc<AtomicU64>,
    gauge: Family<TaskLabels, Gauge>,
}

/// Removes its task from [`Running`] when the task ends (or is dropped).
struct Registered {
    running: Running,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(name) = self.running.lock().remove(&self.id) {
            self.running.count(name).dec();
        }
    }
}

impl Running {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, &'static str>> {
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn count(&self, name: &'static str) -> Gauge {
        self.gauge
            .get_or_create(&TaskLabels {
                task: name.to_owned(),
            })
            .clone()
    }

    fn register(&self, name: &'static str) -> Registered {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, name);
        self.count(name).inc();
        Registered {
            running: self.clone(),
            id,
        }
    }

    fn names(&self) -> Vec<&'static str> {
        self.lock().values().copied().collect()
    }
}

/// Where tracked tasks are spawned: shutdown waits for each of them. Cloned into a
/// [`crate::Spawner`] for tasks started while the service runs.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tasks {
    tracker: TaskTracker,
    running: Running,
}

impl Tasks {
    /// Runs `task` as a tracked task named `name`: shutdown waits for it, and names it if
    /// it is still running when the drain times out.
    pub(crate) fn spawn(
        &self,
        name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        let registered = self.running.register(name);
        self.tracker.spawn(async move {
            let _registered = registered;
            task.await;
        });
    }

    /// Tracked tasks running, by name.
    pub(crate) fn gauge(&self) -> Family<TaskLabels, Gauge> {
        self.running.gauge.clone()
    }
}

#[derive(Debug)]
pub(crate) struct Shutdown {
    drain: CancellationToken,
    requested: CancellationToken,
    tasks: Tasks,
    sigterm: Signal,
    sigint: Signal,
}

impl Shutdown {
    pub(crate) fn new() -> Result<Self> {
        Ok(Self {
            drain: CancellationToken::new(),
            requested: CancellationToken::new(),
            tasks: Tasks::default(),
            sigterm: signal(SignalKind::terminate()).map_err(Error::Signal)?,
            sigint: signal(SignalKind::interrupt()).map_err(Error::Signal)?,
        })
    }

    pub(crate) fn tasks(&self) -> &Tasks {
        &self.tasks
    }

    pub(crate) fn drain(&self) -> Drain {
        Drain(self.drain.clone())
    }

    pub(crate) fn handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.requested.clone())
    }

    pub(crate) fn spawn(
        &self,
        name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        self.tasks.spawn(name, task);
    }

    /// Waits for the first signal or a triggered handle; names what it was.
    pub(crate) async fn signaled(&mut self) -> &'static str {
        tokio::select! {
            _ = self.sigterm.recv() => "SIGTERM",
            _ = self.sigint.recv() => "SIGINT",
            _ = self.requested.cancelled() => "requested",
        }
    }

    /// Cancels the drain token and waits for every tracked task, at most `timeout`.
    pub(crate) async fn drain_all(&mut self, timeout: Duration) -> Result<()> {
        self.drain.cancel();
        self.tasks.tracker.close();
        tokio::select! {
            _ = self.tasks.tracker.wait() => Ok(()),
            _ = tokio::time::sleep(timeout) => Err(Error::DrainTimeout {
                timeout,
                running: self.tasks.running.names().join(", "),
            }),
            _ = self.sigterm.recv() => Err(Error::Aborted),
            _ = self.sigint.recv() => Err(Error::Aborted),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn drain_waits_for_tasks_that_observe_the_token() {
        let mut shutdown = Shutdown::new().expect("signal handlers");
        let drain = shutdown.drain();
        let (tx, rx) = tokio::sync::oneshot::channel();
        shutdown.spawn("worker", async move {
            drain.signaled().await;
            // Finishing in-flight work takes a while after the signal.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let _ = tx.send(());
        });
        shutdown.handle().trigger();
        assert_eq!(shutdown.signaled().await, "requested");
        shutdown
            .drain_all(Duration::from_secs(10))
            .await
            .expect("drains in time");
        rx.await
            .expect("task finished its work before drain returned");
    }

    #[tokio::test(start_paused = true)]
    async fn drain_gives_up_after_the_timeout() {
        let mut shutdown = Shutdown::new().expect("signal handlers");
        shutdown.spawn("done", async {});
        shutdown.spawn("stuck", std::future::pending::<()>());
        let err = shutdown
            .drain_all(Duration::from_secs(3))
            .await
            .expect_err("a stuck task times out");
        assert!(
            matches!(&err, Error::DrainTimeout { timeout, running }
                if *timeout == Duration::from_secs(3) && running == "stuck"),
            "{err}"
        );
    }
}
