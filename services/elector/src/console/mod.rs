//! The live console: one page, served on the elector's gRPC port under the same mutual TLS
//! and authorization table as its methods, that shows the installation as the elector sees
//! it (`kubectl switchyard console` opens it in a browser with the operator's identity).
//!
//! ```text
//!  sampler (every --console-interval) ─► the shard map (this elector's mirror, the leader
//!                                          and draining marks from etcd)
//!                                      ─► Queue.Stats on every member: backlog per
//!                                          controller, Work streams and their outcomes
//!  GET /console/        ─► the page: shard map coloured by owner, backlog per controller over
//!                          --console-history, reconcilers and their throughput, failing keys
//!  GET /console/body    ─► the same without the frame; the page's script fetches it again
//!                          every two seconds
//! ```
//!
//! Failing keys come from `Queue.ListFailing` on each member when a page is rendered, and only
//! for a caller with the `switchyard-operator` identity: a key names an object and its error
//! says more, which is why `DescribeKey` is the operator's only too.

mod page;

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, RwLock},
    time::{Duration, Instant, SystemTime},
};

use axum::{
    Router,
    extract::{Extension, State},
    response::{Html, IntoResponse, Redirect},
    routing::get,
};
use futures::future::join_all;
use switchyard_proto::{
    elector::v1 as elector_pb,
    queue::v1::{self as pb, queue_client::QueueClient},
};
use switchyard_runtime::{Dialer, Drain, Role, authz::Caller};
use tonic::transport::Channel;
use tracing::debug;

use crate::grpc::ElectorService;

/// The console's flags.
#[derive(Clone, Debug, clap::Args)]
pub struct ConsoleArgs {
    /// How often the console samples the shard map and every queue replica's Stats
    #[arg(long, env = "SWITCHYARD_CONSOLE_INTERVAL", default_value = "5s")]
    pub console_interval: humantime::Duration,
    /// How much backlog history the console keeps and draws
    #[arg(long, env = "SWITCHYARD_CONSOLE_HISTORY", default_value = "10m")]
    pub console_history: humantime::Duration,
    /// Link for a trace id, with `{trace_id}` where the id goes (for example
    /// `https://jaeger.example/trace/{trace_id}` or a Grafana Tempo explore URL); without
    /// it trace ids are shown as text
    #[arg(long, env = "SWITCHYARD_CONSOLE_TRACE_URL")]
    pub console_trace_url: Option<String>,
}

/// The console's flags, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsoleConfig {
    pub interval: Duration,
    /// Samples kept: the history divided by the interval.
    pub samples: usize,
    pub trace_url: Option<String>,
}

/// The shortest sampling interval: each sample asks every queue replica.
const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// Samples kept at most, whatever the flags say (a day at 5 s is 17,280).
const MAX_SAMPLES: usize = 20_000;
/// Failing keys asked of each queue replica for one page.
const FAILING_PER_REPLICA: u32 = 25;
/// How long one call to a queue replica may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

impl ConsoleArgs {
    /// The checked configuration, or an error naming the bad flag.
    pub fn config(&self) -> Result<ConsoleConfig, String> {
        let interval: Duration = self.console_interval.into();
        let history: Duration = self.console_history.into();
        if interval < MIN_INTERVAL {
            return Err(format!(
                "--console-interval: at least {MIN_INTERVAL:?}, got {interval:?}"
            ));
        }
        if history < interval {
            return Err(format!(
                "--console-history: {history:?} is shorter than --console-interval {interval:?}"
            ));
        }
        let samples = (history.as_millis() / interval.as_millis()) as usize;
        if samples > MAX_SAMPLES {
            return Err(format!(
                "--console-history: {samples} samples of {interval:?} is more than \
                 {MAX_SAMPLES}; lengthen --console-interval"
            ));
        }
        let trace_url = match self.console_trace_url.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(url) if !url.contains("{trace_id}") => {
                return Err(format!(
                    "--console-trace-url: {url:?} has no {{trace_id}} to put the id in"
                ));
            }
            Some(url) => Some(url.to_owned()),
        };
        Ok(ConsoleConfig {
            interval,
            samples,
            trace_url,
        })
    }
}

/// One queue replica as last sampled.
#[derive(Clone, Debug, Default)]
pub(crate) struct Replica {
    pub id: String,
    pub address: String,
    pub draining: bool,
    /// Shards it holds in the map, active or releasing.
    pub shards: usize,
    /// Why its Stats could not be read, if they could not.
    pub error: Option<String>,
}

/// A controller's backlog summed over the replicas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Backlog {
    pub depth: u64,
    pub in_flight: u64,
    pub retrying: u64,
    /// The oldest ready key's age, over every shard.
    pub oldest: Duration,
}

/// One Work stream of a reconciler on one replica.
#[derive(Clone, Debug, Default)]
pub(crate) struct Reconciler {
    pub worker_id: String,
    pub replica: String,
    pub controllers: Vec<String>,
    pub credits: u32,
    pub in_flight: u64,
    /// Outcomes per second since the previous sample; `None` on its first.
    pub per_second: Option<f64>,
}

/// What the page shows, as of the last sample.
#[derive(Clone, Debug, Default)]
pub(crate) struct Snapshot {
    pub interval: Duration,
    /// `None` until the map is read from etcd.
    pub map: Option<elector_pb::ShardMap>,
    pub replicas: Vec<Replica>,
    /// Oldest first: when, and each controller's backlog then; the last is the latest sample.
    pub history: VecDeque<(SystemTime, BTreeMap<String, Backlog>)>,
    pub reconcilers: Vec<Reconciler>,
}

/// A failing key as a queue replica described it, with the replica's id.
#[derive(Clone, Debug)]
pub(crate) struct Failing {
    pub replica: String,
    pub key: pb::DescribeKeyResponse,
}

/// The failing keys of one page, or why they are not shown.
#[derive(Clone, Debug)]
pub(crate) enum FailingKeys {
    /// Only operators see them.
    NotAllowed,
    Listed {
        keys: Vec<Failing>,
        /// Failing keys in all on the replicas that answered.
        total: u64,
        /// Replicas that did not answer, and why.
        errors: Vec<String>,
    },
}

/// The sampler's state and what the routes read.
#[derive(Clone, Debug)]
pub struct Console {
    config: ConsoleConfig,
    service: ElectorService,
    dialer: Dialer,
    snapshot: Arc<RwLock<Snapshot>>,
    /// A channel per queue replica address, made on first use.
    channels: Arc<RwLock<HashMap<String, Channel>>>,
}

impl Console {
    pub fn new(config: ConsoleConfig, service: ElectorService, dialer: Dialer) -> Self {
        let snapshot = Snapshot {
            interval: config.interval,
            ..Snapshot::default()
        };
        Self {
            config,
            service,
            dialer,
            snapshot: Arc::new(RwLock::new(snapshot)),
            channels: Arc::default(),
        }
    }

    /// The page's routes, for `GrpcServer::with_http`.
    pub fn router(self) -> Router {
        Router::new()
            .route(
                "/console",
                get(|| async { Redirect::permanent("/console/") }),
            )
            .route("/console/", get(full_page))
            .route("/console/body", get(body_only))
            .with_state(self)
    }

    /// Samples every interval until `drain` is signalled.
    pub async fn run(self, drain: Drain) {
        let mut finished: HashMap<(String, String), (u64, Instant)> = HashMap::new();
        let mut tick = tokio::time::interval(self.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = drain.clone().signaled() => return,
            }
            self.sample(&mut finished).await;
        }
    }

    fn queue(&self, address: &str) -> Result<QueueClient<Channel>, String> {
        if let Some(channel) = self
            .channels
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(address)
        {
            return Ok(QueueClient::new(channel.clone()));
        }
        let channel = self
            .dialer
            .channel(address, Role::Queue)
            .map_err(|e| e.to_string())?;
        let mut channels = self.channels.write().unwrap_or_else(|e| e.into_inner());
        // Replicas come and go with new addresses: start afresh rather than keep every one.
        if channels.len() > 256 {
            channels.clear();
        }
        channels.insert(address.to_owned(), channel.clone());
        Ok(QueueClient::new(channel))
    }

    async fn sample(&self, finished: &mut HashMap<(String, String), (u64, Instant)>) {
        let map = self.service.snapshot().await;
        let members: Vec<elector_pb::Member> =
            map.as_ref().map(|m| m.members.clone()).unwrap_or_default();
        let stats = join_all(members.iter().map(|member| async {
            let mut client = self.queue(&member.address)?;
            let call = client.stats(pb::StatsRequest::default());
            match tokio::time::timeout(CALL_TIMEOUT, call).await {
                Ok(Ok(response)) => Ok(response.into_inner()),
                Ok(Err(status)) => Err(format!("Stats: {}", status.message())),
                Err(_) => Err(format!("Stats: no answer within {CALL_TIMEOUT:?}")),
            }
        }))
        .await;

        let now = Instant::now();
        let mut replicas = Vec::new();
        let mut backlog: BTreeMap<String, Backlog> = BTreeMap::new();
        let mut reconcilers = Vec::new();
        let mut seen = HashMap::new();
        for (member, stats) in members.iter().zip(stats) {
            let shards = map.as_ref().map_or(0, |m| {
                m.shards.iter().filter(|s| s.member_id == member.id).count()
            });
            let mut replica = Replica {
                id: member.id.clone(),
                address: member.address.clone(),
                draining: member.draining,
                shards,
                error: None,
            };
            match stats {
                Err(error) => {
                    debug!(replica = %member.id, %error, "console sample: queue replica unreadable");
                    replica.error = Some(error);
                }
                Ok(stats) => {
                    for shard in &stats.shards {
                        let sum = backlog.entry(shard.controller.clone()).or_default();
                        sum.depth += shard.depth;
                        sum.in_flight += shard.in_flight;
                        sum.retrying += shard.retrying;
                        let oldest = shard
                            .oldest_age
                            .and_then(switchyard_proto::duration)
                            .unwrap_or_default();
                        sum.oldest = sum.oldest.max(oldest);
                    }
                    for worker in stats.workers {
                        let stream = (member.id.clone(), worker.worker_id.clone());
                        let per_second = finished.get(&stream).and_then(|(before, at)| {
                            let seconds = now.duration_since(*at).as_secs_f64();
                            (seconds > 0.0 && worker.finished >= *before)
                                .then(|| (worker.finished - before) as f64 / seconds)
                        });
                        seen.insert(stream, (worker.finished, now));
                        reconcilers.push(Reconciler {
                            worker_id: worker.worker_id,
                            replica: member.id.clone(),
                            controllers: worker.controllers,
                            credits: worker.credits,
                            in_flight: worker.in_flight,
                            per_second,
                        });
                    }
                }
            }
            replicas.push(replica);
        }
        *finished = seen;
        reconcilers.sort_by(|a, b| (&a.worker_id, &a.replica).cmp(&(&b.worker_id, &b.replica)));

        let at = SystemTime::now();
        let mut snapshot = self.snapshot.write().unwrap_or_else(|e| e.into_inner());
        if snapshot.history.len() == self.config.samples {
            snapshot.history.pop_front();
        }
        snapshot.history.push_back((at, backlog));
        snapshot.map = map;
        snapshot.replicas = replicas;
        snapshot.reconcilers = reconcilers;
    }

    /// The failing keys of every replica the last sample saw, for an operator.
    async fn failing(&self, caller: Option<&Caller>) -> FailingKeys {
        // Without identities (--insecure-plaintext) nobody is told apart, as for the methods.
        if caller.is_some_and(|c| c.role != Role::Operator) {
            return FailingKeys::NotAllowed;
        }
        let replicas = self
            .snapshot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .replicas
            .clone();
        let answers = join_all(replicas.iter().map(|replica| async {
            let mut client = self.queue(&replica.address)?;
            let call = client.list_failing(pb::ListFailingRequest {
                controller: String::new(),
                limit: FAILING_PER_REPLICA,
            });
            match tokio::time::timeout(CALL_TIMEOUT, call).await {
                Ok(Ok(response)) => Ok(response.into_inner()),
                Ok(Err(status)) => Err(format!("ListFailing: {}", status.message())),
                Err(_) => Err(format!("ListFailing: no answer within {CALL_TIMEOUT:?}")),
            }
        }))
        .await;
        let mut keys = Vec::new();
        let mut total = 0;
        let mut errors = Vec::new();
        for (replica, answer) in replicas.iter().zip(answers) {
            match answer {
                Ok(answer) => {
                    total += answer.total;
                    keys.extend(answer.keys.into_iter().map(|key| Failing {
                        replica: replica.id.clone(),
                        key,
                    }));
                }
                Err(error) => errors.push(format!("{}: {error}", replica.id)),
            }
        }
        keys.sort_by_key(|f| std::cmp::Reverse(f.key.failures));
        FailingKeys::Listed {
            keys,
            total,
            errors,
        }
    }

    async fn render(&self, caller: Option<&Caller>) -> String {
        let failing = self.failing(caller).await;
        let snapshot = self.snapshot.read().unwrap_or_else(|e| e.into_inner());
        page::body(
            &snapshot,
            &failing,
            self.config.trace_url.as_deref(),
            caller,
        )
    }
}

async fn full_page(
    State(console): State<Console>,
    caller: Option<Extension<Caller>>,
) -> impl IntoResponse {
    let body = console.render(caller.as_deref()).await;
    Html(page::frame(&body))
}

async fn body_only(
    State(console): State<Console>,
    caller: Option<Extension<Caller>>,
) -> impl IntoResponse {
    Html(console.render(caller.as_deref()).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(interval: &str, history: &str, trace: Option<&str>) -> ConsoleArgs {
        ConsoleArgs {
            console_interval: interval.parse().unwrap(),
            console_history: history.parse().unwrap(),
            console_trace_url: trace.map(str::to_owned),
        }
    }

    #[test]
    fn bad_flags_are_named() {
        for (args, named) in [
            (args("10ms", "10m", None), "--console-interval"),
            (args("5s", "1s", None), "--console-history"),
            (args("100ms", "1d", None), "--console-history"),
            (
                args("5s", "10m", Some("http://jaeger/trace/")),
                "--console-trace-url",
            ),
        ] {
            let message = args.config().unwrap_err();
            assert!(message.starts_with(named), "{message}");
        }
        let config = args("5s", "10m", Some("http://jaeger/trace/{trace_id}"))
            .config()
            .unwrap();
        assert_eq!(config.samples, 120);
        assert_eq!(
            config.trace_url.as_deref(),
            Some("http://jaeger/trace/{trace_id}")
        );
    }
}
