//! A real Prometheus server as a process, for the monitoring tests: it scrapes the given
//! admin ports on loopback every second (a static scrape config it is given, job by job),
//! evaluates the given rule files, and answers PromQL on a free 127.0.0.1 port.
//!
//! Prometheus and promtool come from Debian's `prometheus` package (`scripts/install-deps.sh`
//! installs it), not from the harness's Go builds: when they are missing the tests fail with
//! that instruction instead of skipping.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::Value;

use crate::{
    Error, Result,
    ports::free_port,
    process::{ManagedProcess, start_on_free_ports, wait_healthy},
};

/// How long Prometheus gets to open its storage and answer `/-/ready`.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Scrapes and rule evaluations once a second: a test waits seconds, not minutes, for data.
const INTERVAL: &str = "1s";
/// How long one query may take before the test gives up on it.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// The instruction every "not installed" error carries.
const INSTALL: &str = "install Debian's prometheus package: scripts/install-deps.sh, \
                       or `sudo apt-get install prometheus`";

/// `name` on `PATH`, or an error that says how to install it.
fn on_path(name: &str) -> Result<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .ok_or_else(|| Error::Setup(format!("{name} is not installed (not on PATH): {INSTALL}")))
}

/// promtool, from the same package as the server.
pub fn promtool() -> Result<PathBuf> {
    on_path("promtool")
}

/// One series of an instant query's result.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

#[derive(Debug)]
pub struct Prometheus {
    process: ManagedProcess,
    address: SocketAddr,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus scraping `/metrics` of each `(job, address)` and evaluating the rule
    /// files given, and waits until it is ready.
    pub async fn start(targets: &[(&str, SocketAddr)], rule_files: &[&Path]) -> Result<Self> {
        let program = on_path("prometheus")?;
        let dir = tempfile::Builder::new()
            .prefix("switchyard-prometheus-")
            .tempdir()?;
        let config = dir.path().join("prometheus.yml");
        std::fs::write(&config, config_yaml(targets, rule_files))?;
        let http = reqwest::Client::new();
        let (process, address) = start_on_free_ports("prometheus", || async {
            let address: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
            let mut process = ManagedProcess::spawn(
                "prometheus",
                &program,
                &[
                    format!("--config.file={}", config.display()),
                    format!("--storage.tsdb.path={}", dir.path().join("data").display()),
                    format!("--web.listen-address={address}"),
                ],
                &[],
                &dir.path().join("prometheus.log"),
            )?;
            let ready = format!("http://{address}/-/ready");
            wait_healthy(&mut process, START_TIMEOUT, || async {
                http.get(&ready)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            })
            .await?;
            Ok((process, address))
        })
        .await?;
        Ok(Self {
            process,
            address,
            http,
            _dir: dir,
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Prometheus's own log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.process.log()).unwrap_or_default()
    }

    /// An instant query, now: every series of the resulting vector (a scalar is one series
    /// without labels).
    pub async fn query(&self, expr: &str) -> Result<Vec<Sample>> {
        let data = self.get("/api/v1/query", &[("query", expr)]).await?;
        let value = |pair: &Value| -> Result<f64> {
            pair[1]
                .as_str()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| Error::Setup(format!("{expr}: unexpected value {pair}")))
        };
        match data["resultType"].as_str() {
            Some("vector") => data["result"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|series| {
                    Ok(Sample {
                        labels: series["metric"]
                            .as_object()
                            .into_iter()
                            .flatten()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                            .collect(),
                        value: value(&series["value"])?,
                    })
                })
                .collect(),
            Some("scalar") => Ok(vec![Sample {
                labels: BTreeMap::new(),
                value: value(&data["result"])?,
            }]),
            other => Err(Error::Setup(format!(
                "{expr}: unexpected result type {other:?}"
            ))),
        }
    }

    /// The rule groups as `/api/v1/rules` reports them (each rule with its `health`,
    /// `lastError` and `lastEvaluation`).
    pub async fn rules(&self) -> Result<Value> {
        Ok(self.get("/api/v1/rules", &[]).await?["groups"].take())
    }

    /// The `data` of a successful API answer; the API's error otherwise.
    async fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<Value> {
        let fail = |e: &dyn std::fmt::Display| Error::Setup(format!("prometheus {path}: {e}"));
        let response = self
            .http
            .get(format!("{}{path}", self.url()))
            .query(query)
            .timeout(QUERY_TIMEOUT)
            .send()
            .await
            .map_err(|e| fail(&e))?;
        let mut body: Value = response.json().await.map_err(|e| fail(&e))?;
        if body["status"] != "success" {
            return Err(fail(&format!(
                "{}: {}",
                body["errorType"].as_str().unwrap_or("error"),
                body["error"].as_str().unwrap_or_default()
            )));
        }
        Ok(body["data"].take())
    }
}

fn config_yaml(targets: &[(&str, SocketAddr)], rule_files: &[&Path]) -> String {
    let mut jobs: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (job, address) in targets {
        jobs.entry(job).or_default().push(format!("'{address}'"));
    }
    let mut yaml = format!(
        "global:\n  scrape_interval: {INTERVAL}\n  scrape_timeout: {INTERVAL}\n  \
         evaluation_interval: {INTERVAL}\nrule_files:\n"
    );
    for file in rule_files {
        yaml.push_str(&format!("  - '{}'\n", file.display()));
    }
    yaml.push_str("scrape_configs:\n");
    for (job, addresses) in jobs {
        yaml.push_str(&format!(
            "  - job_name: '{job}'\n    static_configs:\n      - targets: [{}]\n",
            addresses.join(", ")
        ));
    }
    yaml
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scrape_config_has_one_job_per_name() {
        let a: SocketAddr = "127.0.0.1:1000".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2000".parse().unwrap();
        let yaml = config_yaml(
            &[
                ("switchyard-queue", a),
                ("switchyard-elector", b),
                ("switchyard-queue", b),
            ],
            &[Path::new("/tmp/rules.yaml")],
        );
        let config: serde_norway::Value = serde_norway::from_str(&yaml).unwrap();
        assert_eq!(config["global"]["scrape_interval"], "1s");
        assert_eq!(config["rule_files"][0], "/tmp/rules.yaml");
        let jobs = config["scrape_configs"].as_sequence().unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[1]["job_name"], "switchyard-queue");
        assert_eq!(
            jobs[1]["static_configs"][0]["targets"],
            serde_norway::to_value(["127.0.0.1:1000", "127.0.0.1:2000"]).unwrap()
        );
    }

    #[test]
    fn a_missing_program_names_the_package() {
        let error = on_path("switchyard-no-such-program")
            .unwrap_err()
            .to_string();
        assert!(error.contains("apt-get install prometheus"), "{error}");
    }
}
