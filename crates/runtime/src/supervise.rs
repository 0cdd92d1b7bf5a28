//! Supervision of a service's long-lived tasks: none ends unnoticed.
//!
//! ```text
//!  spawn(name, task)            one-shot or long-lived: a panic fails the process
//!  spawn_essential(name, task)  must run until shutdown: a panic or an early return fails it
//!  spawn_restarting(name, f)    a panic or an early return restarts it (jittered backoff),
//!                               counted in switchyard_task_restarts_total{task}
//!  Spawner::spawn_restarting    the same, started while the service runs, until shutdown
//!                               or until its TaskHandle is dropped (no restart counted)
//!
//!  switchyard_tasks{task}: the tracked tasks running now, by name
//!
//!  fail: /livez answers 503 naming the task, shutdown begins, run() returns TaskFailed and
//!        the process exits non-zero, so the kubelet restarts it
//! ```
//!
//! With `--debug-fault-injection` (debug builds only), `POST /debug/panic/<task>` on the admin
//! port makes every running task of that name panic, for the tests that prove the above.

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use prometheus_client::metrics::{counter::Counter, family::Family};
use tokio::sync::Notify;
use tracing::{Instrument, error, info_span, warn};

use crate::{Backoff, Drain, ShutdownHandle, shutdown::TaskLabels};

/// First and last pause before a restarted task runs again.
const RESTART_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(10));

/// What happens when a task ends before shutdown began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnExit {
    /// Returning is its job (a readiness check); only a panic fails the process.
    MayReturn,
    /// It must run until shutdown: returning or panicking fails the process.
    Essential,
}

/// Liveness, faults and restarts of one runtime's tasks.
#[derive(Clone, Debug)]
pub(crate) struct Supervisor {
    failed: Arc<Mutex<Option<String>>>,
    shutdown: ShutdownHandle,
    restarts: Family<TaskLabels, Counter>,
    faults: Option<Faults>,
}

/// Triggers of injected panics, by task name.
#[derive(Clone, Debug, Default)]
pub(crate) struct Faults(Arc<Mutex<HashMap<&'static str, Arc<Notify>>>>);

impl Faults {
    fn trigger_of(&self, task: &'static str) -> Arc<Notify> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(task)
            .or_default()
            .clone()
    }

    /// Makes every running task named `task` panic; false when there is none by that name.
    #[cfg(debug_assertions)]
    pub(crate) fn inject(&self, task: &str) -> bool {
        let faults = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match faults.get(task) {
            Some(trigger) => {
                trigger.notify_waiters();
                true
            }
            None => false,
        }
    }
}

impl Supervisor {
    pub(crate) fn new(
        shutdown: ShutdownHandle,
        metrics: &crate::Metrics,
        fault_injection: bool,
    ) -> Self {
        let restarts = Family::<TaskLabels, Counter>::default();
        metrics.register(
            "switchyard_task_restarts",
            "Restarts of supervised tasks that panicked or ended before shutdown",
            restarts.clone(),
        );
        Self {
            failed: Arc::default(),
            shutdown,
            restarts,
            // Never in a release build, whatever the caller asked.
            faults: (cfg!(debug_assertions) && fault_injection).then(Faults::default),
        }
    }

    #[cfg(debug_assertions)]
    pub(crate) fn faults(&self) -> Option<&Faults> {
        self.faults.as_ref()
    }

    /// Why the process failed, if a task failed it.
    pub(crate) fn failure(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn fail(&self, task: &'static str, how: &str) {
        let reason = format!("task {task} {how}");
        error!(%task, how, "essential task ended: failing liveness and shutting down");
        self.failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(reason);
        self.shutdown.trigger();
    }

    /// `task`'s future with its fault trigger, run on its own tokio task so a panic is
    /// caught; how it ended.
    async fn run_once(
        &self,
        name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> Ended {
        let trigger = self.faults.as_ref().map(|f| f.trigger_of(name));
        let task = async move {
            match trigger {
                None => task.await,
                Some(trigger) => tokio::select! {
                    () = trigger.notified() => panic!("fault injected into task {name}"),
                    () = task => {}
                },
            }
        };
        match tokio::spawn(task.instrument(info_span!("task", name))).await {
            Ok(()) => Ended::Returned,
            Err(error) if error.is_panic() => Ended::Panicked(panic_message(error.into_panic())),
            Err(_) => Ended::Cancelled,
        }
    }

    /// Runs `task` once; a panic, or for an essential task an early return, fails the
    /// process.
    pub(crate) async fn once(
        self,
        name: &'static str,
        on_exit: OnExit,
        task: impl Future<Output = ()> + Send + 'static,
        drain: Drain,
    ) {
        match self.run_once(name, task).await {
            Ended::Panicked(message) => self.fail(name, &format!("panicked: {message}")),
            Ended::Returned if on_exit == OnExit::Essential && !drain.is_draining() => {
                self.fail(name, "returned before shutdown")
            }
            Ended::Returned | Ended::Cancelled => {}
        }
    }

    /// Runs `task(drain)` until shutdown, again after every panic or early return.
    pub(crate) async fn restarting<F, Fut>(self, name: &'static str, mut task: F, drain: Drain)
    where
        F: FnMut(Drain) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut backoff = Backoff::new(RESTART_BACKOFF.0, RESTART_BACKOFF.1);
        loop {
            let how = match self.run_once(name, task(drain.clone())).await {
                Ended::Panicked(message) => format!("panicked: {message}"),
                Ended::Returned | Ended::Cancelled => "returned".to_owned(),
            };
            if drain.is_draining() {
                return;
            }
            self.restarts
                .get_or_create(&TaskLabels {
                    task: name.to_owned(),
                })
                .inc();
            warn!(task = name, %how, restart_in = ?backoff.current(), "task ended before shutdown: restarting it");
            if !backoff.wait(&drain).await {
                return;
            }
        }
    }
}

enum Ended {
    Returned,
    Panicked(String),
    Cancelled,
}

/// The message of a panic's payload (a `&str` or `String`, as `panic!` makes them).
pub fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string payload".into())
}
