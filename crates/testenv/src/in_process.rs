//! A Switchyard service running inside the test process, for tests and benchmarks that start
//! several services against one control plane.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use switchyard_runtime::{Runtime, ShutdownHandle};
use tokio::task::JoinHandle;

/// How long a stopping service may take before the test fails.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// A started [`Runtime`] running on the test's tokio runtime until [`InProcess::stop`].
#[derive(Debug)]
pub struct InProcess {
    grpc: Option<SocketAddr>,
    pub admin: SocketAddr,
    shutdown: ShutdownHandle,
    running: JoinHandle<()>,
}

impl InProcess {
    /// Runs `rt` in the background; `grpc` is its bound gRPC address, if it serves one the
    /// test uses.
    pub fn spawn(rt: Runtime, grpc: Option<SocketAddr>) -> Self {
        let (admin, shutdown) = (rt.admin_addr(), rt.shutdown_handle());
        let running = tokio::spawn(async move {
            rt.run().await.expect("the service stops cleanly");
        });
        Self {
            grpc,
            admin,
            shutdown,
            running,
        }
    }

    /// Starts a service with `start` on a tokio runtime of its own, on threads of its own, as
    /// a process of its own would run it: the caller's tasks never wait behind the service's
    /// (a benchmark that times what its own watch sees must not time the watcher's work
    /// as well). `start` returns the started service and its gRPC address.
    pub async fn start_on_own_runtime<F, Fut, E>(name: &str, start: F) -> Result<Self, E>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<(Runtime, SocketAddr), E>>,
        E: Send + 'static,
    {
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let (stopped_tx, stopped) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()
                    .expect("a tokio runtime for the service");
                runtime.block_on(async move {
                    let rt = match start().await {
                        Ok((rt, grpc)) => {
                            let parts = (grpc, rt.admin_addr(), rt.shutdown_handle());
                            let _ = started_tx.send(Ok(parts));
                            rt
                        }
                        Err(error) => {
                            let _ = started_tx.send(Err(error));
                            return;
                        }
                    };
                    let _ = stopped_tx.send(rt.run().await.is_ok());
                });
            })
            .expect("a thread for the service");
        let (grpc, admin, shutdown) = started.await.expect("the service's thread started it")?;
        let running = tokio::spawn(async move {
            assert!(
                stopped.await.expect("the service's thread ran it"),
                "the service stops cleanly"
            );
        });
        Ok(Self {
            grpc: Some(grpc),
            admin,
            shutdown,
            running,
        })
    }

    /// The gRPC address given to [`InProcess::spawn`].
    pub fn grpc(&self) -> SocketAddr {
        self.grpc
            .expect("the service was spawned with its gRPC address")
    }

    /// Triggers shutdown and waits for the service to stop; returns how long that took.
    pub async fn stop(self) -> Duration {
        let start = Instant::now();
        self.shutdown.trigger();
        self.stopped(STOP_TIMEOUT).await;
        start.elapsed()
    }

    /// Triggers shutdown without waiting (see [`InProcess::stopped`]).
    pub fn trigger_shutdown(&self) {
        self.shutdown.trigger();
    }

    /// Waits, at most `within`, for the service to stop.
    pub async fn stopped(self, within: Duration) {
        tokio::time::timeout(within, self.running)
            .await
            .expect("stopped in time")
            .expect("the service task did not panic");
    }

    /// GET `path` on the admin port: status and body.
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        let response = reqwest::get(format!("http://{}{path}", self.admin))
            .await
            .expect("the admin port answers");
        let status = response.status().as_u16();
        (status, response.text().await.expect("a text body"))
    }

    pub async fn is_ready(&self) -> bool {
        self.admin_get("/readyz").await.0 == 200
    }

    /// Waits until `/readyz` answers 200; fails the test with what it waits for after `within`.
    pub async fn wait_ready(&self, within: Duration) {
        let start = Instant::now();
        loop {
            let (status, body) = self.admin_get("/readyz").await;
            if status == 200 {
                return;
            }
            assert!(
                start.elapsed() < within,
                "not ready after {within:?}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The value of one sample of `/metrics`, written as it is exposed (`name{label="v"}` or
    /// `name`), 0 if absent; the body must parse as OpenMetrics.
    pub async fn metric(&self, series: &str) -> f64 {
        let (_, text) = self.admin_get("/metrics").await;
        let exposition = crate::exposition::parse(&text)
            .unwrap_or_else(|e| panic!("/metrics is not OpenMetrics: {e}"));
        exposition.series(series).unwrap_or(0.0)
    }
}
