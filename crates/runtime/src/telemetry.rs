//! Logs and traces, set up once per process.
//!
//! Logs go to stderr through a fmt layer (plain or JSON) filtered by `--log-level`. Traces are
//! exported over OTLP/gRPC only when the standard variables ask for it
//! (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, and
//! `OTEL_TRACES_EXPORTER` not `none`); the SDK itself reads `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_TRACES_SAMPLER`.

use std::io::IsTerminal;

use opentelemetry::{KeyValue, trace::TracerProvider as _};
use opentelemetry_sdk::{Resource, propagation::TraceContextPropagator, trace::SdkTracerProvider};
use tracing_subscriber::{EnvFilter, Layer, layer::SubscriberExt, util::SubscriberInitExt};

use crate::{Error, LogArgs, LogFormat, Result};

/// Flushes and stops the trace exporter when dropped.
#[derive(Debug)]
pub(crate) struct Guard(Option<SdkTracerProvider>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take()
            && let Err(error) = provider.shutdown()
        {
            eprintln!("failed to flush traces on shutdown: {error}");
        }
    }
}

pub(crate) fn init(service: &'static str, log: &LogArgs) -> Result<Guard> {
    let filter = EnvFilter::try_new(&log.log_level)
        .map_err(|e| Error::Telemetry(format!("invalid --log-level {:?}: {e}", log.log_level)))?;
    let fmt = match log.log_format {
        LogFormat::Plain => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_writer(std::io::stderr)
            .boxed(),
    };

    let provider = otlp_enabled()
        .then(|| tracer_provider(service))
        .transpose()?;
    let otel = provider.as_ref().map(|p| {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        opentelemetry::global::set_tracer_provider(p.clone());
        tracing_opentelemetry::layer().with_tracer(p.tracer(service))
    });

    // A second runtime in the same process (tests) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(otel)
        .with(fmt)
        .with(filter)
        .try_init();
    Ok(Guard(provider))
}

fn otlp_enabled() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let exporter = std::env::var("OTEL_TRACES_EXPORTER").unwrap_or_default();
    exporter.trim() != "none"
        && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

fn tracer_provider(service: &'static str) -> Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .map_err(|e| Error::Telemetry(format!("invalid OTLP exporter settings: {e}")))?;
    let mut resource = Resource::builder().with_attributes([
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        KeyValue::new("service.instance.id", instance_id()),
    ]);
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service);
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// `<hostname>/<pid>`: unique per process, and the pod name in Kubernetes.
fn instance_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .unwrap_or_default();
    format!("{}/{}", host.trim(), std::process::id())
}
