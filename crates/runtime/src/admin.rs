//! The admin HTTP port: `/livez`, `/readyz` and `/metrics`, and nothing else (a debug build
//! started with `--debug-fault-injection` adds `POST /debug/panic/<task>` for tests).
//!
//! Readiness is a set of named gates. The runtime holds a `startup` gate until `run()` is
//! called, the gRPC server holds one until it is bound, and services add their own (initial
//! lists synced, shard map received). `/readyz` answers 200 only when every gate is open and
//! shutdown has not begun.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use tokio::net::TcpListener;
use tracing::warn;

use crate::{Metrics, supervise::Supervisor};

#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<Mutex<ReadinessState>>);

#[derive(Debug, Default)]
struct ReadinessState {
    /// Gate name -> open.
    gates: BTreeMap<&'static str, bool>,
    shutting_down: bool,
}

/// One condition readiness waits for; opening it is final.
#[derive(Debug)]
pub struct Gate {
    readiness: Readiness,
    name: &'static str,
}

impl Readiness {
    /// Adds a closed gate that keeps the service not-ready until [`Gate::ready`].
    pub fn gate(&self, name: &'static str) -> Gate {
        self.with(|s| s.gates.insert(name, false));
        Gate {
            readiness: self.clone(),
            name,
        }
    }

    /// True when every gate is open and shutdown has not begun.
    pub fn is_ready(&self) -> bool {
        self.with(|s| !s.shutting_down && s.gates.values().all(|open| *open))
    }

    /// Names of the gates still closed.
    pub fn waiting_for(&self) -> Vec<&'static str> {
        self.with(|s| {
            s.gates
                .iter()
                .filter(|(_, open)| !**open)
                .map(|(name, _)| *name)
                .collect()
        })
    }

    pub(crate) fn shutting_down(&self) {
        self.with(|s| s.shutting_down = true);
    }

    fn with<T>(&self, f: impl FnOnce(&mut ReadinessState) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Gate {
    pub fn ready(self) {
        self.readiness.with(|s| s.gates.insert(self.name, true));
    }
}

#[derive(Clone)]
struct AdminState {
    readiness: Readiness,
    metrics: Metrics,
    supervisor: Supervisor,
}

/// 200 while every supervised task lives; 503 naming the one that failed the process.
async fn livez(State(state): State<AdminState>) -> impl IntoResponse {
    match state.supervisor.failure() {
        None => (StatusCode::OK, "ok\n".to_owned()),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

#[cfg(debug_assertions)]
async fn inject_panic(
    State(state): State<AdminState>,
    axum::extract::Path(task): axum::extract::Path<String>,
) -> impl IntoResponse {
    match state.supervisor.faults() {
        Some(faults) if faults.inject(&task) => (StatusCode::OK, format!("panicking {task}\n")),
        _ => (
            StatusCode::NOT_FOUND,
            format!("no running task named {task}\n"),
        ),
    }
}

pub(crate) async fn serve(
    listener: TcpListener,
    readiness: Readiness,
    metrics: Metrics,
    supervisor: Supervisor,
) {
    let app = Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text));
    // Probes and metrics only; fault injection exists in debug builds alone.
    #[cfg(debug_assertions)]
    let app = match supervisor.faults() {
        Some(_) => app.route("/debug/panic/{task}", axum::routing::post(inject_panic)),
        None => app,
    };
    let app = app.with_state(AdminState {
        readiness,
        metrics,
        supervisor,
    });
    if let Err(error) = axum::serve(listener, app).await {
        warn!(%error, "admin server stopped");
    }
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    if state.readiness.is_ready() {
        return (StatusCode::OK, "ok\n".to_owned());
    }
    let waiting = state.readiness.waiting_for();
    let body = if waiting.is_empty() {
        "shutting down\n".to_owned()
    } else {
        format!("waiting for: {}\n", waiting.join(", "))
    };
    (StatusCode::SERVICE_UNAVAILABLE, body)
}

async fn metrics_text(State(state): State<AdminState>) -> impl IntoResponse {
    match state.metrics.encode() {
        Ok(text) => (
            StatusCode::OK,
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(error) => {
            warn!(%error, "failed to encode metrics");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_gate_is_open_and_not_shutting_down() {
        let readiness = Readiness::default();
        assert!(readiness.is_ready(), "no gates means ready");
        let a = readiness.gate("a");
        let b = readiness.gate("b");
        assert!(!readiness.is_ready());
        a.ready();
        assert_eq!(readiness.waiting_for(), ["b"]);
        b.ready();
        assert!(readiness.is_ready());
        readiness.shutting_down();
        assert!(!readiness.is_ready());
        assert!(readiness.waiting_for().is_empty());
    }
}
