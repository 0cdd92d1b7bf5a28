use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::{
    encoding::text::encode,
    metrics::{gauge::Gauge, info::Info},
    registry::{Registry, Unit},
};

/// The service's Prometheus registry, served on the admin port's `/metrics`.
#[derive(Clone, Debug)]
pub struct Metrics(Arc<Mutex<Registry>>);

impl Metrics {
    pub(crate) fn new(service: &'static str) -> Self {
        let mut registry = Registry::default();
        let info = Info::new(vec![
            ("service", service),
            ("version", env!("CARGO_PKG_VERSION")),
        ]);
        registry.register(
            "switchyard_build",
            "Build information of this Switchyard service",
            info,
        );
        let start = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        start.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or_default(),
        );
        registry.register_with_unit(
            "process_start_time",
            "Start time of the process since the Unix epoch",
            Unit::Seconds,
            start,
        );
        registry.register_collector(Box::new(crate::process::ProcessCollector));
        Self(Arc::new(Mutex::new(registry)))
    }

    /// A registry of its own, for tests and benchmarks that run parts of a service.
    pub fn new_for_tests() -> Self {
        Self::new("test")
    }

    /// Registers a metric under `name` (without the unit suffix, which is added).
    pub fn register(
        &self,
        name: &str,
        help: &str,
        metric: impl prometheus_client::registry::Metric,
    ) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .register(name, help, metric);
    }

    /// Registers a metric whose name carries a unit suffix, for example `_seconds`.
    pub fn register_with_unit(
        &self,
        name: &str,
        help: &str,
        unit: Unit,
        metric: impl prometheus_client::registry::Metric,
    ) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .register_with_unit(name, help, unit, metric);
    }

    /// The registry in the OpenMetrics text format (a superset Prometheus parses).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        encode(
            &mut out,
            &self.0.lock().unwrap_or_else(PoisonError::into_inner),
        )?;
        Ok(out)
    }
}
