//! `kubectl switchyard top`: a live table per controller, from the queue replicas' own
//! `/metrics` (the series Prometheus scrapes), sampled every `--interval`:
//!
//! ```text
//!  sample ── interval ── sample ─► frame: rates and p99s over the interval, depth now
//! ```

use std::{collections::BTreeMap, io::IsTerminal, time::Duration};

use futures::future::join_all;
use serde::Serialize;

use crate::{
    Output,
    connect::{Connections, Error, Result},
    prom::{self, Sample},
    render::{self, Colour, Style, Table, coloured, human},
};

const QUEUE_SERVICE: &str = "switchyard-queue";

/// Cumulative figures of one controller, summed over shards and replicas.
#[derive(Clone, Debug, Default)]
struct Totals {
    adds: f64,
    retries: f64,
    depth: f64,
    queue_buckets: BTreeMap<String, f64>,
    work_buckets: BTreeMap<String, f64>,
}

#[derive(Debug, Serialize)]
pub struct Frame {
    pub interval_seconds: f64,
    /// Queue replicas whose /metrics answered, of those given.
    pub replicas: usize,
    pub controllers: Vec<Row>,
    pub problems: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Row {
    pub controller: String,
    pub adds_per_second: f64,
    pub depth: f64,
    pub retries_per_second: f64,
    /// Over the interval; over everything observed when nothing was in the interval.
    pub queue_p99_seconds: Option<f64>,
    pub work_p99_seconds: Option<f64>,
}

pub async fn run(
    connections: &Connections,
    output: Output,
    interval: Duration,
    iterations: Option<u32>,
) -> Result<()> {
    if connections.admins.is_empty() {
        return Err(Error::Config(
            "top reads the queue replicas' /metrics: pass their admin ports with --admin-addr"
                .into(),
        ));
    }
    let (mut previous, _) = sample(connections).await?;
    let terminal = std::io::stdout().is_terminal();
    let mut shown = 0;
    loop {
        if iterations.is_some_and(|n| shown >= n) {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
        let (current, problems) = sample(connections).await?;
        let frame = frame(&previous, &current.0, interval, current.1, problems);
        previous = current;
        shown += 1;
        let text = match output {
            Output::Table => {
                let table = table(&frame, Style::detect());
                if terminal {
                    // Redraw in place, like top.
                    format!("\x1b[H\x1b[2J{table}")
                } else {
                    format!("{table}\n")
                }
            }
            Output::Json => {
                serde_json::to_string(&frame).map_err(|e| Error::Output(e.to_string()))? + "\n"
            }
            Output::Yaml => format!("---\n{}", render::render(output, &frame, table)?),
        };
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(|e| Error::Output(e.to_string()))?;
    }
}

type Sampled = (BTreeMap<String, Totals>, usize);

/// One scrape of every queue admin port. An error only when none answered.
async fn sample(connections: &Connections) -> Result<(Sampled, Vec<String>)> {
    let scraped = join_all(
        connections
            .admins
            .iter()
            .map(|address| connections.admin_get(address, "/metrics")),
    )
    .await;
    let mut totals: BTreeMap<String, Totals> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut replicas = 0;
    let mut last_error = None;
    for answer in scraped {
        let samples = match answer.map(|(_, body)| prom::parse(&body)) {
            Ok(Ok(samples)) => samples,
            Ok(Err(unreadable)) => {
                problems.push(format!("/metrics: {unreadable}"));
                continue;
            }
            Err(error) => {
                problems.push(error.to_string());
                last_error = Some(error);
                continue;
            }
        };
        let service = samples
            .iter()
            .find(|s| s.name == "switchyard_build_info")
            .and_then(|s| s.label("service"));
        if service != Some(QUEUE_SERVICE) {
            continue;
        }
        replicas += 1;
        for s in &samples {
            add(&mut totals, s);
        }
    }
    if replicas == 0 {
        return Err(last_error.unwrap_or_else(|| {
            Error::Config(
                "no --admin-addr is a queue replica's (switchyard_build_info names another \
                 service)"
                    .into(),
            )
        }));
    }
    Ok(((totals, replicas), problems))
}

fn add(totals: &mut BTreeMap<String, Totals>, s: &Sample) {
    let Some(controller) = s.label("name") else {
        return;
    };
    let entry = || Totals::default();
    let t = totals.entry(controller.to_owned()).or_insert_with(entry);
    let le = || s.label("le").unwrap_or_default().to_owned();
    match s.name.as_str() {
        "workqueue_adds_total" => t.adds += s.value,
        "workqueue_retries_total" => t.retries += s.value,
        "workqueue_depth" => t.depth += s.value,
        "workqueue_queue_duration_seconds_bucket" => {
            *t.queue_buckets.entry(le()).or_default() += s.value
        }
        "workqueue_work_duration_seconds_bucket" => {
            *t.work_buckets.entry(le()).or_default() += s.value
        }
        _ => {}
    }
}

fn p99(now: &BTreeMap<String, f64>, before: Option<&BTreeMap<String, f64>>) -> Option<f64> {
    let bound = |le: &str| match le {
        "+Inf" => Some(f64::INFINITY),
        le => le.parse().ok(),
    };
    let buckets = |delta: bool| -> Vec<(f64, f64)> {
        now.iter()
            .filter_map(|(le, count)| {
                let base = if delta {
                    before.and_then(|b| b.get(le)).copied().unwrap_or(0.0)
                } else {
                    0.0
                };
                Some((bound(le)?, count - base))
            })
            .collect()
    };
    prom::quantile(0.99, &buckets(true)).or_else(|| prom::quantile(0.99, &buckets(false)))
}

fn frame(
    before: &Sampled,
    now: &BTreeMap<String, Totals>,
    interval: Duration,
    replicas: usize,
    problems: Vec<String>,
) -> Frame {
    let seconds = interval.as_secs_f64().max(f64::EPSILON);
    let controllers = now
        .iter()
        .map(|(controller, t)| {
            let b = before.0.get(controller);
            let rate =
                |now: f64, before: Option<f64>| ((now - before.unwrap_or(now)) / seconds).max(0.0);
            Row {
                controller: controller.clone(),
                adds_per_second: rate(t.adds, b.map(|b| b.adds)),
                depth: t.depth,
                retries_per_second: rate(t.retries, b.map(|b| b.retries)),
                queue_p99_seconds: p99(&t.queue_buckets, b.map(|b| &b.queue_buckets)),
                work_p99_seconds: p99(&t.work_buckets, b.map(|b| &b.work_buckets)),
            }
        })
        .collect();
    Frame {
        interval_seconds: seconds,
        replicas,
        controllers,
        problems,
    }
}

pub fn table(frame: &Frame, style: Style) -> String {
    let mut t = Table::new(&[
        "CONTROLLER",
        "ADDS/S",
        "DEPTH",
        "RETRIES/S",
        "QUEUE P99",
        "WORK P99",
    ]);
    for row in &frame.controllers {
        let retries = format!("{:.1}", row.retries_per_second);
        t.row(vec![
            row.controller.as_str().into(),
            format!("{:.1}", row.adds_per_second).into(),
            format!("{:.0}", row.depth).into(),
            if row.retries_per_second > 0.0 {
                coloured(retries, Colour::Yellow)
            } else {
                retries.into()
            },
            row.queue_p99_seconds.map_or("-".into(), human).into(),
            row.work_p99_seconds.map_or("-".into(), human).into(),
        ]);
    }
    let mut out = format!(
        "{} queue replica(s), every {}\n",
        frame.replicas,
        human(frame.interval_seconds)
    );
    out.push_str(&t.render(style));
    for problem in &frame.problems {
        out.push_str(&format!("problem: {problem}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_p99s_are_over_the_interval() {
        let text = |adds: u32, fast: u32, slow: u32| {
            format!(
                "# TYPE switchyard_build info\n\
                 switchyard_build_info{{service=\"switchyard-queue\",version=\"0.1.0\"}} 1\n\
                 # TYPE workqueue_adds counter\n\
                 workqueue_adds_total{{name=\"rs\",shard=\"0\"}} {adds}\n\
                 workqueue_adds_total{{name=\"rs\",shard=\"1\"}} {adds}\n\
                 # TYPE workqueue_depth gauge\n\
                 workqueue_depth{{name=\"rs\",shard=\"0\"}} 3\n\
                 # TYPE workqueue_work_duration_seconds histogram\n\
                 workqueue_work_duration_seconds_bucket{{name=\"rs\",shard=\"0\",le=\"0.1\"}} {fast}\n\
                 workqueue_work_duration_seconds_bucket{{name=\"rs\",shard=\"0\",le=\"1.0\"}} {}\n\
                 workqueue_work_duration_seconds_bucket{{name=\"rs\",shard=\"0\",le=\"+Inf\"}} {}\n\
                 # EOF\n",
                fast + slow,
                fast + slow
            )
        };
        let totals = |body: String| {
            let mut t = BTreeMap::new();
            for s in prom::parse(&body).unwrap() {
                add(&mut t, &s);
            }
            t
        };
        // Before: 100 fast reconciles. Over the 2 s: 10 adds per shard, all slow.
        let before = (totals(text(50, 100, 0)), 1);
        let now = totals(text(60, 100, 10));
        let frame = frame(&before, &now, Duration::from_secs(2), 1, Vec::new());
        let row = &frame.controllers[0];
        assert_eq!(row.adds_per_second, 10.0);
        assert_eq!(row.depth, 3.0);
        let p99 = row.work_p99_seconds.unwrap();
        assert!(
            p99 > 0.9 && p99 <= 1.0,
            "the interval's reconciles were slow: {p99}"
        );
    }
}
