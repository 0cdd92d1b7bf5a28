//! `kubectl switchyard status`: one look at the whole installation.

use std::{collections::BTreeMap, time::Duration};

use futures::future::join_all;
use serde::Serialize;
use switchyard_proto::{
    elector::v1::{ShardMap, ShardState},
    queue::v1::{StatsRequest, StatsResponse},
};

use crate::{
    cluster::{ClusterArgs, Workload},
    connect::{Connections, Error, Result, call},
    prom,
    render::{Cell, Colour, Style, Table, coloured, human},
};

#[derive(Debug, Serialize)]
pub struct Status {
    /// The services' Deployments and StatefulSets, through the kubeconfig (absent without one).
    pub workloads: Option<Vec<Workload>>,
    /// Per service, from the admin ports given (`--admin-addr`).
    pub services: Vec<ServiceStatus>,
    pub elector: Option<ElectorStatus>,
    pub queue_replicas: Vec<ReplicaStatus>,
    /// Shards no replica holds.
    pub unassigned_shards: u32,
    /// Per controller, summed over the queue replicas.
    pub backlog: Vec<Backlog>,
    /// The queue's Work streams: one per reconciler worker and replica.
    pub reconcilers: Vec<Reconciler>,
    /// What could not be reached, and why.
    pub problems: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct ServiceStatus {
    pub service: String,
    pub replicas: usize,
    pub ready: usize,
    pub versions: Vec<String>,
    pub instances: Vec<Instance>,
}

#[derive(Debug, Serialize)]
pub struct Instance {
    pub admin_address: String,
    pub ready: bool,
    pub version: String,
}

#[derive(Debug, Serialize)]
pub struct ElectorStatus {
    /// The elector replica that answered.
    pub address: String,
    /// The elector replica that leads (writes the map); empty when none does.
    pub leader: String,
    pub shard_count: u32,
    /// The highest epoch in the map.
    pub revision: u64,
}

#[derive(Debug, Serialize)]
pub struct ReplicaStatus {
    /// Empty for a replica given by --queue-addr that the map does not name.
    pub member_id: String,
    pub address: String,
    pub draining: bool,
    pub reachable: bool,
    /// Shards the map gives it (active or releasing), with their epochs.
    pub shards: Vec<ShardEpoch>,
    /// Shards it serves, by its own Stats (may lag the map during a move).
    pub serving: usize,
}

#[derive(Debug, Serialize)]
pub struct ShardEpoch {
    pub shard: u32,
    pub epoch: u64,
    pub releasing: bool,
}

#[derive(Debug, Default, Serialize)]
pub struct Backlog {
    pub controller: String,
    pub depth: u64,
    pub in_flight: u64,
    pub retrying: u64,
    pub oldest_age_seconds: f64,
}

#[derive(Debug, Serialize)]
pub struct Reconciler {
    pub worker_id: String,
    pub queue_replica: String,
    pub controllers: Vec<String>,
    pub credits: u32,
    pub in_flight: u64,
}

pub async fn gather(connections: &Connections, cluster: &ClusterArgs) -> Result<Status> {
    let mut problems = Vec::new();
    // `Ok(None)`: no kubeconfig anywhere; an unreachable apiserver is one problem among others.
    let (workloads, kubeconfig_found) = match cluster.workloads(connections.timeout).await {
        Ok(workloads) => {
            let found = workloads.is_some();
            (workloads, found)
        }
        Err(error @ Error::Config(_)) => return Err(error),
        Err(error) => {
            problems.push(error.to_string());
            (None, true)
        }
    };
    let services = services(connections, &mut problems).await;

    // The map names the replicas; with --queue-addr and no elector (static shards) there
    // is none, and with both an unreachable elector is one problem among others.
    let addressed = connections.has_elector() || !connections.queues.is_empty();
    if !addressed && !kubeconfig_found && connections.admins.is_empty() {
        return Err(Error::Config(
            "nothing to look at: give --elector-addr (or --queue-addr), --admin-addr or \
             --kubeconfig"
                .into(),
        ));
    }
    let map = if !addressed {
        None
    } else if connections.queues.is_empty() {
        Some(connections.shard_map().await?)
    } else if connections.has_elector() {
        match connections.shard_map().await {
            Ok(map) => Some(map),
            Err(error) => {
                problems.push(error.to_string());
                None
            }
        }
    } else {
        None
    };
    let (elector, replicas, unassigned) = match &map {
        Some((address, map)) => (
            Some(ElectorStatus {
                address: address.clone(),
                leader: map.leader_id.clone(),
                shard_count: map.shard_count,
                revision: map.revision,
            }),
            replicas_of(map, &connections.queues),
            map.shards
                .iter()
                .filter(|s| s.state() == ShardState::Unassigned)
                .count() as u32,
        ),
        None => (
            None,
            replicas_of(&ShardMap::default(), &connections.queues),
            0,
        ),
    };
    if elector.as_ref().is_some_and(|e| e.leader.is_empty()) {
        problems.push("no elector leads: the shard map is not being kept".into());
    }

    let stats = join_all(replicas.iter().map(|r| async {
        let mut client = connections.queue(&r.address).await?;
        call(
            "queue replica",
            &r.address,
            "Stats",
            connections.timeout,
            async { client.stats(StatsRequest::default()).await },
        )
        .await
    }))
    .await;
    let mut backlog: BTreeMap<String, Backlog> = BTreeMap::new();
    let mut reconcilers = Vec::new();
    let mut queue_replicas = Vec::new();
    for (mut replica, stats) in replicas.into_iter().zip(stats) {
        match stats {
            Ok(stats) => {
                replica.reachable = true;
                add_stats(&mut replica, &stats, &mut backlog, &mut reconcilers);
            }
            Err(error) => problems.push(error.to_string()),
        }
        queue_replicas.push(replica);
    }
    Ok(Status {
        workloads,
        services,
        elector,
        queue_replicas,
        unassigned_shards: unassigned,
        backlog: backlog.into_values().collect(),
        reconcilers,
        problems,
    })
}

/// The replicas to ask: the map's members, and any --queue-addr the map does not name.
fn replicas_of(map: &ShardMap, extra: &[String]) -> Vec<ReplicaStatus> {
    let mut replicas: Vec<ReplicaStatus> = map
        .members
        .iter()
        .map(|m| ReplicaStatus {
            member_id: m.id.clone(),
            address: m.address.clone(),
            draining: m.draining,
            reachable: false,
            shards: map
                .shards
                .iter()
                .filter(|s| s.member_id == m.id && s.state() != ShardState::Unassigned)
                .map(|s| ShardEpoch {
                    shard: s.shard,
                    epoch: s.epoch,
                    releasing: s.state() == ShardState::Releasing,
                })
                .collect(),
            serving: 0,
        })
        .collect();
    for address in extra {
        if !replicas.iter().any(|r| &r.address == address) {
            replicas.push(ReplicaStatus {
                member_id: String::new(),
                address: address.clone(),
                draining: false,
                reachable: false,
                shards: Vec::new(),
                serving: 0,
            });
        }
    }
    replicas
}

fn add_stats(
    replica: &mut ReplicaStatus,
    stats: &StatsResponse,
    backlog: &mut BTreeMap<String, Backlog>,
    reconcilers: &mut Vec<Reconciler>,
) {
    let mut serving: BTreeMap<u32, u64> = BTreeMap::new();
    for s in &stats.shards {
        serving.insert(s.shard, s.epoch);
        let entry = backlog
            .entry(s.controller.clone())
            .or_insert_with(|| Backlog {
                controller: s.controller.clone(),
                ..Default::default()
            });
        entry.depth += s.depth;
        entry.in_flight += s.in_flight;
        entry.retrying += s.retrying;
        let age = s
            .oldest_age
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or_default()
            .as_secs_f64();
        entry.oldest_age_seconds = entry.oldest_age_seconds.max(age);
    }
    replica.serving = serving.len();
    if replica.shards.is_empty() {
        // Not in a map (--static-shards): what it serves is all there is to say.
        replica.shards = serving
            .into_iter()
            .map(|(shard, epoch)| ShardEpoch {
                shard,
                epoch,
                releasing: false,
            })
            .collect();
    }
    let name = if replica.member_id.is_empty() {
        replica.address.clone()
    } else {
        replica.member_id.clone()
    };
    for w in &stats.workers {
        reconcilers.push(Reconciler {
            worker_id: w.worker_id.clone(),
            queue_replica: name.clone(),
            controllers: w.controllers.clone(),
            credits: w.credits,
            in_flight: w.in_flight,
        });
    }
}

/// Service, readiness and version of every admin port given.
async fn services(connections: &Connections, problems: &mut Vec<String>) -> Vec<ServiceStatus> {
    let answers = join_all(connections.admins.iter().map(|address| async move {
        let (_, metrics) = connections.admin_get(address, "/metrics").await?;
        let (ready, _) = connections.admin_get(address, "/readyz").await?;
        let samples = prom::parse(&metrics).map_err(|unreadable| Error::Unreachable {
            what: "admin port",
            address: address.clone(),
            reason: format!("its /metrics is not OpenMetrics: {unreadable}"),
        })?;
        let peers = peers(address, &samples);
        let info = samples
            .into_iter()
            .find(|s| s.name == "switchyard_build_info")
            .ok_or_else(|| Error::Unreachable {
                what: "admin port",
                address: address.clone(),
                reason: "its /metrics has no switchyard_build_info: not a Switchyard service"
                    .into(),
            })?;
        Ok::<_, Error>((
            info.label("service").unwrap_or_default().to_owned(),
            Instance {
                admin_address: address.clone(),
                ready: ready == 200,
                version: info.label("version").unwrap_or_default().to_owned(),
            },
            peers,
        ))
    }))
    .await;
    let mut by_service: BTreeMap<String, Vec<Instance>> = BTreeMap::new();
    for answer in answers {
        match answer {
            Ok((service, instance, peers)) => {
                by_service.entry(service).or_default().push(instance);
                problems.extend(peers);
            }
            Err(error) => problems.push(error.to_string()),
        }
    }
    by_service
        .into_iter()
        .map(|(service, instances)| {
            let mut versions: Vec<String> = instances.iter().map(|i| i.version.clone()).collect();
            versions.sort();
            versions.dedup();
            ServiceStatus {
                service,
                replicas: instances.len(),
                ready: instances.iter().filter(|i| i.ready).count(),
                versions,
                instances,
            }
        })
        .collect()
}

/// What a watcher's handover check saw (docs/watcher.md): per controller, another controller
/// manager that writes the status of its objects, and whether the controller stands down.
fn peers(address: &str, samples: &[prom::Sample]) -> Vec<String> {
    samples
        .iter()
        .filter(|s| s.name == "switchyard_watcher_peer_status_writes_total" && s.value > 0.0)
        .map(|s| {
            let controller = s.label("controller").unwrap_or_default();
            let standing_down = samples.iter().any(|d| {
                d.name == "switchyard_watcher_standing_down"
                    && d.label("controller") == Some(controller)
                    && d.value > 0.0
            });
            format!(
                "watcher {address}: {} wrote the status of objects {controller} reconciles \
                 ({} changes since the watcher started): it runs that controller too; turn it \
                 off there (docs/deploy.md, beside kube-controller-manager){}",
                s.label("manager").unwrap_or_default(),
                s.value,
                if standing_down {
                    "; standing down meanwhile"
                } else {
                    ""
                }
            )
        })
        .collect()
}

/// Epochs as a range: `41` or `41–97`.
fn epochs(shards: &[ShardEpoch]) -> String {
    let min = shards.iter().map(|s| s.epoch).min();
    let max = shards.iter().map(|s| s.epoch).max();
    match (min, max) {
        (Some(a), Some(b)) if a == b => a.to_string(),
        (Some(a), Some(b)) => format!("{a}-{b}"),
        _ => "-".into(),
    }
}

pub fn table(status: &Status, style: Style) -> String {
    let mut out = String::new();
    if let Some(workloads) = &status.workloads {
        let mut t = Table::new(&["WORKLOAD", "READY", "UP-TO-DATE", "VERSION"]);
        for w in workloads {
            let ready = format!("{}/{}", w.ready, w.replicas);
            let colour = if w.ready >= w.replicas {
                Colour::Green
            } else {
                Colour::Red
            };
            t.row(vec![
                format!("{}/{}", w.kind.to_ascii_lowercase(), w.name).into(),
                coloured(ready, colour),
                w.updated.into(),
                w.version.as_str().into(),
            ]);
        }
        out.push_str(&t.render(style));
        out.push('\n');
    }
    if !status.services.is_empty() {
        let mut t = Table::new(&["SERVICE", "READY", "VERSION"]);
        for s in &status.services {
            let ready = format!("{}/{}", s.ready, s.replicas);
            let colour = if s.ready == s.replicas {
                Colour::Green
            } else {
                Colour::Red
            };
            t.row(vec![
                s.service.as_str().into(),
                coloured(ready, colour),
                s.versions.join(",").into(),
            ]);
        }
        out.push_str(&t.render(style));
        out.push('\n');
    }
    if let Some(e) = &status.elector {
        let leader: Cell = if e.leader.is_empty() {
            coloured("none", Colour::Red)
        } else {
            e.leader.as_str().into()
        };
        let mut t = Table::new(&["ELECTOR LEADER", "SHARDS", "UNASSIGNED", "REVISION"]);
        let unassigned: Cell = if status.unassigned_shards == 0 {
            0.into()
        } else {
            coloured(status.unassigned_shards, Colour::Red)
        };
        t.row(vec![
            leader,
            e.shard_count.into(),
            unassigned,
            e.revision.into(),
        ]);
        out.push_str(&t.render(style));
        out.push('\n');
    }
    let mut t = Table::new(&[
        "QUEUE REPLICA",
        "ADDRESS",
        "SHARDS",
        "RELEASING",
        "SERVING",
        "EPOCHS",
        "STATE",
    ]);
    for r in &status.queue_replicas {
        let state = match (r.reachable, r.draining) {
            (false, _) => coloured("unreachable", Colour::Red),
            (true, true) => coloured("draining", Colour::Yellow),
            (true, false) => coloured("serving", Colour::Green),
        };
        t.row(vec![
            if r.member_id.is_empty() {
                "-"
            } else {
                &r.member_id
            }
            .into(),
            r.address.as_str().into(),
            r.shards.len().into(),
            r.shards.iter().filter(|s| s.releasing).count().into(),
            r.serving.into(),
            epochs(&r.shards).into(),
            state,
        ]);
    }
    out.push_str(&t.render(style));
    out.push('\n');
    let mut t = Table::new(&["CONTROLLER", "DEPTH", "IN FLIGHT", "RETRYING", "OLDEST"]);
    for b in &status.backlog {
        let retrying: Cell = if b.retrying == 0 {
            0.into()
        } else {
            coloured(b.retrying, Colour::Yellow)
        };
        t.row(vec![
            b.controller.as_str().into(),
            b.depth.into(),
            b.in_flight.into(),
            retrying,
            human(b.oldest_age_seconds).into(),
        ]);
    }
    out.push_str(&t.render(style));
    out.push('\n');
    let mut t = Table::new(&[
        "RECONCILER",
        "QUEUE REPLICA",
        "CREDITS",
        "IN FLIGHT",
        "CONTROLLERS",
    ]);
    for w in &status.reconcilers {
        t.row(vec![
            w.worker_id.as_str().into(),
            w.queue_replica.as_str().into(),
            w.credits.into(),
            w.in_flight.into(),
            if w.controllers.is_empty() {
                "all".to_owned()
            } else {
                w.controllers.join(",")
            }
            .into(),
        ]);
    }
    out.push_str(&t.render(style));
    if !status.problems.is_empty() {
        let mut t = Table::new(&["PROBLEM"]);
        for problem in &status.problems {
            t.row(vec![coloured(problem, Colour::Red)]);
        }
        out.push('\n');
        out.push_str(&t.render(style));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_the_watcher_counted_is_a_problem_naming_it_and_the_controller() {
        let metrics = "# TYPE switchyard_watcher_peer_status_writes counter
switchyard_watcher_peer_status_writes_total{controller=\"apps/v1/Deployment\",manager=\"kube-controller-manager\"} 12
switchyard_watcher_peer_status_writes_total{controller=\"batch/v1/Job\",manager=\"kube-controller-manager\"} 0
# TYPE switchyard_watcher_standing_down gauge
switchyard_watcher_standing_down{controller=\"apps/v1/Deployment\"} 1
# EOF
";
        let samples = prom::parse(metrics).unwrap();
        assert_eq!(
            peers("10.0.0.1:9090", &samples),
            [
                "watcher 10.0.0.1:9090: kube-controller-manager wrote the status of objects \
              apps/v1/Deployment reconciles (12 changes since the watcher started): it runs \
              that controller too; turn it off there (docs/deploy.md, beside \
              kube-controller-manager); standing down meanwhile"
            ]
        );
        let quiet = prom::parse("# EOF\n").unwrap();
        assert!(peers("10.0.0.1:9090", &quiet).is_empty());
    }
}
