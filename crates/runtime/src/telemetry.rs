//! Logs and traces, set up once per process.
//!
//! Logs go to stderr through a fmt layer (plain or JSON) filtered by `--log-level`. Traces are
//! exported over OTLP/gRPC only when the standard variables ask for it
//! (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, and
//! `OTEL_TRACES_EXPORTER` not `none`); the SDK itself reads `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`.
//! An `https` endpoint is reached over TLS: the collector's certificate is checked against
//! `OTEL_EXPORTER_OTLP_CERTIFICATE` (a CA bundle, required), and
//! `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` with `OTEL_EXPORTER_OTLP_CLIENT_KEY` are presented
//! to a collector that asks for a client certificate (each also as `OTEL_EXPORTER_OTLP_TRACES_*`,
//! which wins). The files are read once, at start.
//!
//! ```text
//!  tracing spans ─► OpenTelemetry layer (only when exporting) ─► batch ─► OTLP/gRPC
//!  tracing events ─► fmt layer ─► stderr, with trace_id and span_id of the current span
//! ```
//!
//! Without an endpoint nothing of OpenTelemetry is installed: [`exporting`] is false and the
//! services skip the spans and trace contexts they would otherwise make per key.
//!
//! Trace context crosses processes as W3C `traceparent`/`tracestate` pairs in a string map
//! ([`TraceFields`]): in gRPC metadata, or in message fields where one request carries many
//! keys each with its own cause.

use std::{
    collections::HashMap,
    io::IsTerminal,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
};

use opentelemetry::{
    Context, KeyValue,
    propagation::TextMapPropagator,
    trace::{TraceContextExt, TracerProvider as _},
};
use opentelemetry_otlp::WithTonicConfig;
use opentelemetry_sdk::{Resource, propagation::TraceContextPropagator, trace::SdkTracerProvider};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};
use tracing::{Event, Subscriber, dispatcher::WeakDispatch};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{
    EnvFilter, Layer,
    fmt::{FmtContext, FormatEvent, FormatFields, format::Writer},
    layer::SubscriberExt,
    registry::LookupSpan,
    util::SubscriberInitExt,
};

use crate::{Error, LogArgs, LogFormat, Result};

/// W3C trace context as string pairs (`traceparent`, and `tracestate` when set).
pub type TraceFields = HashMap<String, String>;

static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether this process exports traces. When false, per-key spans and trace contexts are
/// not worth making: nobody would see them.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The trace context of `span`, to send to another process. Empty when not exporting or
/// when the sampler left the span out: downstream makes no span for an unsampled cause.
pub fn inject(span: &tracing::Span) -> TraceFields {
    let mut fields = TraceFields::new();
    if exporting() {
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        if sc.is_valid() && sc.is_sampled() {
            TraceContextPropagator::new().inject_context(&cx, &mut fields);
        }
    }
    fields
}

fn extract(fields: &TraceFields) -> Option<Context> {
    let cx = TraceContextPropagator::new().extract(fields);
    cx.span().span_context().is_valid().then_some(cx)
}

/// Makes `span` a child of the remote span `fields` names. Call before the span is entered.
/// Returns whether `fields` held a valid context.
pub fn set_parent(span: &tracing::Span, fields: &TraceFields) -> bool {
    match extract(fields) {
        Some(cx) => span.set_parent(cx).is_ok(),
        None => false,
    }
}

/// Links `span` to the remote span `fields` names. Call before the span is entered.
pub fn add_link(span: &tracing::Span, fields: &TraceFields) -> bool {
    match extract(fields) {
        Some(cx) => {
            span.add_link(cx.span().span_context().clone());
            true
        }
        None => false,
    }
}

/// Flushes and stops the trace exporter; the runtime calls it once its tasks have drained,
/// and dropping it does the same (an early return).
#[derive(Debug)]
pub(crate) struct Guard(Option<SdkTracerProvider>);

impl Guard {
    pub(crate) fn shutdown(&mut self) {
        if let Some(provider) = self.0.take() {
            EXPORTING.store(false, Ordering::Relaxed);
            if let Err(error) = provider.shutdown() {
                eprintln!("failed to flush traces on shutdown: {error}");
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.shutdown();
    }
}

pub(crate) fn init(service: &'static str, log: &LogArgs) -> Result<Guard> {
    let filter = EnvFilter::try_new(&log.log_level)
        .map_err(|e| Error::Telemetry(format!("invalid --log-level {:?}: {e}", log.log_level)))?;

    // A second runtime in the same process (tests) keeps the first subscriber, and its
    // exporter: spans go to one global tracer provider, so only the first installs one.
    static INSTALLED: OnceLock<()> = OnceLock::new();
    if INSTALLED.get().is_some() {
        return Ok(Guard(None));
    }

    let provider = otlp_enabled()
        .then(|| tracer_provider(service))
        .transpose()?;
    let dispatch: Arc<OnceLock<WeakDispatch>> = Arc::default();
    let ids = TraceIds {
        dispatch: dispatch.clone(),
    };
    let fmt = match log.log_format {
        LogFormat::Plain => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .event_format(WithTraceIds {
                inner: tracing_subscriber::fmt::format(),
                ids,
                json: false,
            })
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .event_format(WithTraceIds {
                inner: tracing_subscriber::fmt::format()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true),
                ids,
                json: true,
            })
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .boxed(),
    };
    let otel = provider.as_ref().map(|p| {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        opentelemetry::global::set_tracer_provider(p.clone());
        tracing_opentelemetry::layer().with_tracer(p.tracer(service))
    });
    // Not an Option: `Option<Layer>` does not pass `on_register_dispatch` on.
    let capture = CaptureDispatch(dispatch);

    if tracing_subscriber::registry()
        .with(otel)
        .with(capture)
        .with(fmt)
        .with(filter)
        .try_init()
        .is_ok()
    {
        let _ = INSTALLED.set(());
        EXPORTING.store(provider.is_some(), Ordering::Relaxed);
        Ok(Guard(provider))
    } else {
        // Somebody else (a test harness) installed a subscriber: keep theirs, export nothing.
        Ok(Guard(None))
    }
}

fn otlp_enabled() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let exporter = std::env::var("OTEL_TRACES_EXPORTER").unwrap_or_default();
    exporter.trim() != "none"
        && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// A standard OTLP variable: the traces-specific one first, then the general one.
fn otlp_var(suffix: &str) -> Option<(String, String)> {
    [
        format!("OTEL_EXPORTER_OTLP_TRACES_{suffix}"),
        format!("OTEL_EXPORTER_OTLP_{suffix}"),
    ]
    .into_iter()
    .find_map(|name| {
        std::env::var(&name)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(|v| (name, v.trim().to_owned()))
    })
}

/// TLS for the exporter when the endpoint is `https`, from the standard variables; `None`
/// for a plaintext endpoint.
fn otlp_tls() -> Result<Option<ClientTlsConfig>> {
    let Some((endpoint_var, endpoint)) = otlp_var("ENDPOINT") else {
        return Ok(None);
    };
    if !endpoint.starts_with("https://") {
        return Ok(None);
    }
    let read = |(name, path): (String, String)| {
        std::fs::read(&path)
            .map_err(|e| Error::Telemetry(format!("{name}: cannot read {path}: {e}")))
    };
    let ca = otlp_var("CERTIFICATE").ok_or_else(|| {
        Error::Telemetry(format!(
            "{endpoint_var} is https, and OTEL_EXPORTER_OTLP_CERTIFICATE does not name the CA              bundle that signs the collector's certificate"
        ))
    })?;
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
    match (otlp_var("CLIENT_CERTIFICATE"), otlp_var("CLIENT_KEY")) {
        (Some(cert), Some(key)) => {
            tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        (None, None) => {}
        (Some((name, _)), None) | (None, Some((name, _))) => {
            return Err(Error::Telemetry(format!(
                "{name} is set without its pair: a client certificate needs                  OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY"
            )));
        }
    }
    Ok(Some(tls))
}

fn tracer_provider(service: &'static str) -> Result<SdkTracerProvider> {
    let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic();
    if let Some(tls) = otlp_tls()? {
        exporter = exporter.with_tls_config(tls);
    }
    let exporter = exporter
        .build()
        .map_err(|e| Error::Telemetry(format!("invalid OTLP exporter settings: {e}")))?;
    let mut resource = Resource::builder().with_attributes([
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        KeyValue::new("service.instance.id", instance_id()),
    ]);
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service);
    }
    // The sampler comes from OTEL_TRACES_SAMPLER(_ARG), read by the SDK's default config.
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

/// Keeps the dispatcher the subscriber is installed in, to look up OpenTelemetry contexts
/// of spans while formatting log lines.
struct CaptureDispatch(Arc<OnceLock<WeakDispatch>>);

impl<S: Subscriber> Layer<S> for CaptureDispatch {
    fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
        let _ = self.0.set(subscriber.downgrade());
    }
}

#[derive(Clone)]
struct TraceIds {
    dispatch: Arc<OnceLock<WeakDispatch>>,
}

impl TraceIds {
    /// `(trace_id, span_id)` of the event's span, when it belongs to a trace.
    fn of<S, N>(&self, ctx: &FmtContext<'_, S, N>) -> Option<(String, String)>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'w> FormatFields<'w> + 'static,
    {
        if !exporting() {
            return None;
        }
        let span = ctx.lookup_current()?;
        let dispatch = self.dispatch.get()?.upgrade()?;
        let cx = tracing_opentelemetry::get_otel_context(&span.id(), &dispatch)?;
        let span = cx.span();
        let sc = span.span_context();
        sc.is_valid()
            .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
    }
}

/// A log line format with `trace_id` and `span_id` added when the event is inside a trace.
struct WithTraceIds<F> {
    inner: F,
    ids: TraceIds,
    json: bool,
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let Some((trace_id, span_id)) = self.ids.of(ctx) else {
            return self.inner.format_event(ctx, writer, event);
        };
        if writer.has_ansi_escapes() {
            // A terminal: the ids lead the line rather than lose the colours.
            write!(writer, "trace_id={trace_id} span_id={span_id} ")?;
            return self.inner.format_event(ctx, writer, event);
        }
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        let line = line.trim_end_matches('\n');
        match line.strip_prefix('{').filter(|_| self.json) {
            Some(rest) => writeln!(
                writer,
                r#"{{"trace_id":"{trace_id}","span_id":"{span_id}",{rest}"#
            ),
            None => writeln!(writer, "{line} trace_id={trace_id} span_id={span_id}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_exporter_nothing_is_injected() {
        let span = tracing::info_span!("test");
        assert!(inject(&span).is_empty());
        assert!(!set_parent(&span, &TraceFields::new()));
        let mut fields = TraceFields::new();
        fields.insert(
            "traceparent".into(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
        );
        assert!(extract(&fields).is_some());
        fields.insert("traceparent".into(), "garbage".into());
        assert!(extract(&fields).is_none());
    }
}
