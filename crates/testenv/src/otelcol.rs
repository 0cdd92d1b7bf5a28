//! An OpenTelemetry Collector as a process: OTLP/gRPC in on a free loopback port, every span
//! out to a file as OTLP JSON lines, which tests read back as [`ExportedSpan`]s.
//!
//! The collector is built by `scripts/testenv.sh` with the collector builder (OTLP receiver,
//! file exporter) and cached with the control plane.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::Value;

use crate::{
    Binaries, Error, Result,
    ports::free_port,
    process::{ManagedProcess, start_on_free_ports, wait_healthy},
    tls::{Files, Pki},
};

/// How long the collector gets to listen.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the file exporter writes: short, so a test sees spans soon after they arrive.
const FLUSH_INTERVAL: &str = "100ms";

#[derive(Debug)]
pub struct Collector {
    process: ManagedProcess,
    otlp: SocketAddr,
    output: PathBuf,
    /// With TLS: the collector's certificate and the CA it checks clients against.
    tls: Option<Files>,
    _dir: tempfile::TempDir,
}

/// The service account of the collector's serving certificate in a TLS [`Collector`].
const COLLECTOR_ACCOUNT: &str = "otel-collector";

impl Collector {
    /// Starts the collector built by the harness, receiving OTLP in plaintext.
    pub async fn start(binaries: &Binaries) -> Result<Self> {
        Self::start_with(binaries, None).await
    }

    /// Starts the collector receiving OTLP over mutual TLS: its certificate is issued by
    /// `pki`, and it accepts only clients with a certificate of `pki`'s CA.
    pub async fn start_tls(binaries: &Binaries, pki: &Pki) -> Result<Self> {
        let files = pki.issue_as(COLLECTOR_ACCOUNT, COLLECTOR_ACCOUNT)?;
        Self::start_with(binaries, Some(files)).await
    }

    async fn start_with(binaries: &Binaries, tls: Option<Files>) -> Result<Self> {
        let program = binaries.otelcol()?;
        let dir = tempfile::Builder::new()
            .prefix("switchyard-otelcol-")
            .tempdir()?;
        let output = dir.path().join("traces.jsonl");
        let (process, otlp) = start_on_free_ports("otelcol", || async {
            let otlp: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
            let config = dir.path().join("config.yaml");
            std::fs::write(&config, config_yaml(otlp, &output, tls.as_ref()))?;
            let mut process = ManagedProcess::spawn(
                "otelcol",
                &program,
                &[format!("--config=file:{}", config.display())],
                &[],
                &dir.path().join("otelcol.log"),
            )?;
            wait_healthy(&mut process, START_TIMEOUT, || async {
                tokio::net::TcpStream::connect(otlp).await.is_ok()
            })
            .await?;
            Ok((process, otlp))
        })
        .await?;
        Ok(Self {
            process,
            otlp,
            output,
            tls,
            _dir: dir,
        })
    }

    /// The value for `OTEL_EXPORTER_OTLP_ENDPOINT`: `https` when the collector wants TLS.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.otlp)
    }

    /// The variables a process exporting to this collector sets: the endpoint and, with
    /// TLS, the CA to check the collector against and `client`'s certificate and key.
    pub fn exporter_env(&self, client: &Files) -> Vec<(&'static str, String)> {
        let mut env = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", self.endpoint())];
        if let Some(tls) = &self.tls {
            let path = |p: &Path| p.display().to_string();
            env.extend([
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", path(&tls.ca)),
                ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", path(&client.cert)),
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", path(&client.key)),
            ]);
        }
        env
    }

    /// The collector's own log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.process.log()).unwrap_or_default()
    }

    /// Every span written so far.
    pub fn spans(&self) -> Result<Vec<ExportedSpan>> {
        let text = match std::fs::read_to_string(&self.output) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        parse_lines(&text)
    }
}

/// The spans in every complete line. The exporter writes through a buffer, so a read can end
/// inside a line it is still writing: text after the last newline is left for the next read.
fn parse_lines(text: &str) -> Result<Vec<ExportedSpan>> {
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    let mut spans = Vec::new();
    for line in complete.lines().filter(|l| !l.trim().is_empty()) {
        let export: Value = serde_json::from_str(line)
            .map_err(|e| Error::Setup(format!("the collector wrote invalid JSON: {e}")))?;
        parse_export(&export, &mut spans);
    }
    Ok(spans)
}

fn config_yaml(otlp: SocketAddr, output: &Path, tls: Option<&Files>) -> String {
    // Mutual TLS: a client without a certificate of the CA is refused.
    let tls = tls.map_or_else(String::new, |files| {
        format!(
            "\n        tls:\n          cert_file: {}\n          key_file: {}\n          client_ca_file: {}",
            files.cert.display(),
            files.key.display(),
            files.ca.display()
        )
    });
    // The collector's own metrics would listen on :8888 by default; tests run several.
    format!(
        r#"receivers:
  otlp:
    protocols:
      grpc:
        endpoint: {otlp}{tls}
exporters:
  file:
    path: {output}
    flush_interval: {FLUSH_INTERVAL}
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
"#,
        output = output.display()
    )
}

/// One span as the collector exported it (OTLP JSON), with its resource's service name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportedSpan {
    pub service: String,
    pub resource: BTreeMap<String, String>,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    pub attributes: BTreeMap<String, String>,
    /// `(trace_id, span_id)` of each linked span.
    pub links: Vec<(String, String)>,
}

impl ExportedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }

    /// Whether every ancestor of this span, up to its trace's root, is among `spans`.
    ///
    /// Each process exports a span when it ends, in batches, so a child is often exported
    /// before its parent: a test that walks up from a span waits for this first.
    pub fn ancestry_exported(&self, spans: &[ExportedSpan]) -> bool {
        let mut parent = self.parent_span_id.as_str();
        // A trace's spans are at most all of them: a longer walk is a cycle.
        for _ in 0..=spans.len() {
            if parent.is_empty() {
                return true;
            }
            match spans.iter().find(|s| s.span_id == parent) {
                Some(span) => parent = span.parent_span_id.as_str(),
                None => return false,
            }
        }
        false
    }
}

fn parse_export(export: &Value, out: &mut Vec<ExportedSpan>) {
    for resource_spans in array(&export["resourceSpans"]) {
        let resource = attributes(&resource_spans["resource"]["attributes"]);
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for scope_spans in array(&resource_spans["scopeSpans"]) {
            for span in array(&scope_spans["spans"]) {
                out.push(ExportedSpan {
                    service: service.clone(),
                    resource: resource.clone(),
                    trace_id: string(&span["traceId"]),
                    span_id: string(&span["spanId"]),
                    parent_span_id: string(&span["parentSpanId"]),
                    name: string(&span["name"]),
                    attributes: attributes(&span["attributes"]),
                    links: array(&span["links"])
                        .map(|l| (string(&l["traceId"]), string(&l["spanId"])))
                        .collect(),
                });
            }
        }
    }
}

fn array(value: &Value) -> impl Iterator<Item = &Value> {
    value.as_array().into_iter().flatten()
}

fn string(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}

/// OTLP key-values as strings (ints arrive as JSON strings, bools and doubles as values).
fn attributes(list: &Value) -> BTreeMap<String, String> {
    array(list)
        .filter_map(|kv| {
            let key = kv["key"].as_str()?.to_owned();
            let value = kv["value"].as_object()?.values().next()?;
            let value = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            Some((key, value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otlp_json_lines_become_spans() {
        let line = serde_json::json!({"resourceSpans": [{
            "resource": {"attributes": [
                {"key": "service.name", "value": {"stringValue": "switchyard-queue"}}
            ]},
            "scopeSpans": [{"spans": [{
                "traceId": "aa", "spanId": "bb", "parentSpanId": "cc", "name": "lease",
                "attributes": [
                    {"key": "attempt", "value": {"intValue": "1"}},
                    {"key": "controller", "value": {"stringValue": "rs"}}
                ],
                "links": [{"traceId": "dd", "spanId": "ee"}]
            }]}]
        }]});
        let mut spans = Vec::new();
        parse_export(&line, &mut spans);
        assert_eq!(spans.len(), 1);
        let span = &spans[0];
        assert_eq!(span.service, "switchyard-queue");
        assert_eq!(span.parent_span_id, "cc");
        assert_eq!(span.attribute("attempt"), Some("1"));
        assert_eq!(span.links, vec![("dd".to_owned(), "ee".to_owned())]);
    }

    #[test]
    fn ancestry_is_exported_once_every_parent_up_to_the_root_is() {
        let span = |id: &str, parent: &str| ExportedSpan {
            span_id: id.to_owned(),
            parent_span_id: parent.to_owned(),
            ..ExportedSpan::default()
        };
        let root = span("a", "");
        let middle = span("b", "a");
        let leaf = span("c", "b");
        assert!(root.ancestry_exported(&[]));
        assert!(leaf.ancestry_exported(&[root.clone(), middle.clone()]));
        assert!(!leaf.ancestry_exported(&[root]), "middle missing");
        assert!(!leaf.ancestry_exported(&[middle]), "root missing");
        let cycle = [span("x", "y"), span("y", "x")];
        assert!(!cycle[0].ancestry_exported(&cycle));
    }

    #[test]
    fn a_line_still_being_written_waits_for_the_next_read() {
        let line = serde_json::json!({"resourceSpans": [{"scopeSpans": [{"spans": [
            {"traceId": "aa", "spanId": "bb", "name": "lease"}
        ]}]}]})
        .to_string();
        let written = format!("{line}\n{}", &line[..line.len() / 2]);
        assert_eq!(parse_lines(&written).unwrap().len(), 1);
        assert!(parse_lines(&line[..line.len() / 2]).unwrap().is_empty());
        assert_eq!(parse_lines(&format!("{line}\n{line}\n")).unwrap().len(), 2);
        let broken = format!("{}\n", &line[..line.len() / 2]);
        assert!(
            parse_lines(&broken).is_err(),
            "a complete line that is not JSON is an error"
        );
    }
}
