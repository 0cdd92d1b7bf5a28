//! `kubectl switchyard why <resource>/<name>`: where an object's key is now and how its last
//! reconcile ended, from the queue replica that serves the key's shard.

use std::time::{Duration, SystemTime};

use prost::Message;
use serde::Serialize;
use switchyard_proto::{
    common::v1::{NotShardOwner, WorkKey},
    queue::v1::{DescribeKeyRequest, DescribeKeyResponse, KeyPhase, OutcomeKind, StatsRequest},
};
use switchyard_work::shard::shard_of;
use tonic::Code;

use crate::{
    connect::{Connections, Error, Result, call, refused},
    render::{Colour, Style, Table, coloured, human},
};

/// Short names kubectl knows for the kinds of the built-in controllers and common others.
const SHORT_NAMES: &[(&str, &str)] = &[
    ("rs", "replicaset"),
    ("deploy", "deployment"),
    ("ns", "namespace"),
    ("po", "pod"),
    ("svc", "service"),
    ("sts", "statefulset"),
    ("ds", "daemonset"),
    ("cm", "configmap"),
];

#[derive(Debug, Serialize)]
pub struct Why {
    pub controller: String,
    pub namespace: String,
    pub name: String,
    pub shard: u32,
    /// The member id of the replica serving the shard (its address without an elector).
    pub queue_replica: String,
    pub address: String,
    pub epoch: u64,
    /// absent, queued, delayed or leased.
    pub state: String,
    /// queued: since when it has been ready.
    pub ready_since: Option<String>,
    /// delayed: when it is ready again (backing off after failures, or a requeue after).
    pub ready_at: Option<String>,
    /// leased: the worker holding it and until when.
    pub worker: Option<String>,
    pub lease_deadline: Option<String>,
    pub readd_pending: bool,
    /// Failures not yet forgotten.
    pub retries: u32,
    pub last_outcome: Option<Last>,
}

#[derive(Debug, Serialize)]
pub struct Last {
    pub result: String,
    pub finished_at: Option<String>,
    pub attempt: u32,
    pub error: String,
    pub trace_id: String,
    pub worker: String,
    pub duration_seconds: f64,
}

/// The controller that owns keys of `resource`, among `controllers`.
pub fn resolve<'a>(resource: &str, controllers: &'a [String]) -> Result<&'a str> {
    let wanted = resource.to_ascii_lowercase();
    let wanted = SHORT_NAMES
        .iter()
        .find(|(short, _)| *short == wanted)
        .map_or(wanted.clone(), |(_, kind)| (*kind).to_owned());
    let matches: Vec<&str> = controllers
        .iter()
        .map(String::as_str)
        .filter(|controller| {
            let lower = controller.to_ascii_lowercase();
            if lower == wanted {
                return true;
            }
            // group/version/Kind, or version/Kind for the core group.
            let mut parts = lower.rsplit('/');
            let kind = parts.next().unwrap_or_default();
            let group = match lower.matches('/').count() {
                2 => lower.split('/').next().unwrap_or_default(),
                _ => "",
            };
            let plural = format!("{kind}s");
            [kind.to_owned(), plural.clone()].into_iter().any(|name| {
                wanted == name || (!group.is_empty() && wanted == format!("{name}.{group}"))
            })
        })
        .collect();
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(Error::NotFound(format!(
            "no controller of the queue reconciles {resource:?}; it serves: {}",
            controllers.join(", ")
        ))),
        several => Err(Error::Config(format!(
            "{resource:?} names several controllers ({}): pick one with --controller",
            several.join(", ")
        ))),
    }
}

/// The object's key, found on the replica that serves its shard.
pub async fn find(
    connections: &Connections,
    object: &str,
    namespace: &str,
    controller: Option<&str>,
) -> Result<Why> {
    let (resource, name) = object.split_once('/').ok_or_else(|| {
        Error::Config(format!(
            "{object:?}: expected <resource>/<name>, for example replicaset/web"
        ))
    })?;
    if name.is_empty() || resource.is_empty() {
        return Err(Error::Config(format!(
            "{object:?}: expected <resource>/<name>, for example replicaset/web"
        )));
    }
    // The replicas to ask, in order: the shard's owner first when the map is known.
    let map = if connections.has_elector() {
        Some(connections.shard_map().await?.1)
    } else if connections.queues.is_empty() {
        return Err(Error::Config(
            "--elector-addr or --queue-addr: one is required to find the key's replica".into(),
        ));
    } else {
        None
    };
    let mut candidates: Vec<(String, String)> = match &map {
        Some(map) => map
            .members
            .iter()
            .map(|m| (m.id.clone(), m.address.clone()))
            .collect(),
        None => connections
            .queues
            .iter()
            .map(|a| (a.clone(), a.clone()))
            .collect(),
    };
    if candidates.is_empty() {
        return Err(Error::NotFound(
            "the shard map names no queue replica: none is registered".into(),
        ));
    }
    let controllers = controllers(connections, &candidates).await?;
    let controller = match controller {
        Some(c) => c,
        None => resolve(resource, &controllers)?,
    };
    // A cluster-scoped object's key has no namespace.
    let namespace = if controller.eq_ignore_ascii_case("v1/Namespace") {
        ""
    } else {
        namespace
    };
    if let Some(map) = &map {
        let shard = shard_of(controller, namespace, name, map.shard_count);
        let owner = map
            .shards
            .get(shard as usize)
            .map(|s| s.member_id.clone())
            .unwrap_or_default();
        candidates.sort_by_key(|(id, _)| *id != owner);
    }
    let key = WorkKey {
        controller: controller.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    };
    let mut redirects = 0;
    let mut index = 0;
    let mut last_error = None;
    while index < candidates.len() {
        let (id, address) = candidates[index].clone();
        index += 1;
        let mut client = match connections.queue(&address).await {
            Ok(client) => client,
            Err(error) => {
                last_error = Some(error);
                continue;
            }
        };
        let answer = tokio::time::timeout(
            connections.timeout,
            client.describe_key(DescribeKeyRequest {
                key: Some(key.clone()),
            }),
        )
        .await;
        match answer {
            Ok(Ok(response)) => return Ok(why(id, address, response.into_inner())),
            Ok(Err(status)) if status.code() == Code::FailedPrecondition => {
                // Not this replica's shard (it moved): go where it says, once or twice.
                let owner = NotShardOwner::decode(status.details())
                    .map(|d| d.owner_address)
                    .unwrap_or_default();
                if !owner.is_empty() && redirects < 2 {
                    redirects += 1;
                    candidates.insert(index, (owner.clone(), owner));
                }
                last_error = Some(refused("queue replica", &address, "DescribeKey", &status));
            }
            Ok(Err(status)) => {
                return Err(refused("queue replica", &address, "DescribeKey", &status));
            }
            Err(_) => {
                last_error = Some(Error::Unreachable {
                    what: "queue replica",
                    address,
                    reason: format!("no answer to DescribeKey within {:?}", connections.timeout),
                })
            }
        }
    }
    Err(last_error.unwrap_or_else(|| Error::NotFound("no queue replica answered".into())))
}

/// The controllers the queue serves, from the first replica that answers.
async fn controllers(
    connections: &Connections,
    replicas: &[(String, String)],
) -> Result<Vec<String>> {
    let mut last = None;
    for (_, address) in replicas {
        let stats = async {
            let mut client = connections.queue(address).await?;
            call(
                "queue replica",
                address,
                "Stats",
                connections.timeout,
                async { client.stats(StatsRequest::default()).await },
            )
            .await
        };
        match stats.await {
            Ok(stats) => {
                let mut names: Vec<String> =
                    stats.shards.into_iter().map(|s| s.controller).collect();
                names.sort();
                names.dedup();
                if !names.is_empty() {
                    return Ok(names);
                }
            }
            Err(error) => last = Some(error),
        }
    }
    Err(last.unwrap_or_else(|| {
        Error::NotFound("no queue replica serves a shard yet: no controller to match".into())
    }))
}

fn time(ts: Option<prost_types::Timestamp>) -> Option<String> {
    let ts = ts?;
    let at = SystemTime::try_from(ts).ok()?;
    Some(humantime::format_rfc3339_millis(at).to_string())
}

fn why(queue_replica: String, address: String, r: DescribeKeyResponse) -> Why {
    let key = r.key.clone().unwrap_or_default();
    let state = match r.phase() {
        KeyPhase::Queued => "queued",
        KeyPhase::Delayed => "delayed",
        KeyPhase::Leased => "leased",
        KeyPhase::Absent | KeyPhase::Unspecified => "absent",
    };
    Why {
        controller: key.controller,
        namespace: key.namespace,
        name: key.name,
        shard: r.shard,
        queue_replica,
        address,
        epoch: r.epoch,
        state: state.into(),
        ready_since: time(r.ready_since),
        ready_at: time(r.ready_at),
        worker: (!r.worker_id.is_empty()).then(|| r.worker_id.clone()),
        lease_deadline: time(r.lease_deadline),
        readd_pending: r.readd_pending,
        retries: r.failures,
        last_outcome: r.last_outcome.map(|last| Last {
            result: match last.kind() {
                OutcomeKind::Done => "done",
                OutcomeKind::RequeueAfter => "requeue-after",
                OutcomeKind::Failed => "failed",
                OutcomeKind::Forget => "forget",
                OutcomeKind::LeaseExpired => "lease-expired",
                OutcomeKind::Unspecified => "unknown",
            }
            .into(),
            finished_at: time(last.finished_at),
            attempt: last.attempt,
            error: last.error,
            trace_id: last.trace_id,
            worker: last.worker_id,
            duration_seconds: last
                .duration
                .and_then(|d| Duration::try_from(d).ok())
                .unwrap_or_default()
                .as_secs_f64(),
        }),
    }
}

pub fn table(why: &Why, style: Style) -> String {
    let mut t = Table::new(&["FIELD", "VALUE"]);
    let key = if why.namespace.is_empty() {
        format!("{} {}", why.controller, why.name)
    } else {
        format!("{} {}/{}", why.controller, why.namespace, why.name)
    };
    t.row(vec!["key".into(), key.into()]);
    t.row(vec![
        "shard".into(),
        format!("{} (epoch {})", why.shard, why.epoch).into(),
    ]);
    t.row(vec![
        "queue replica".into(),
        format!("{} ({})", why.queue_replica, why.address).into(),
    ]);
    let state = match why.state.as_str() {
        "queued" => format!("queued since {}", why.ready_since.as_deref().unwrap_or("?")),
        "delayed" if why.retries > 0 => format!(
            "backing off until {}",
            why.ready_at.as_deref().unwrap_or("?")
        ),
        "delayed" => format!("waiting until {}", why.ready_at.as_deref().unwrap_or("?")),
        "leased" => format!(
            "leased by {} until {}{}",
            why.worker.as_deref().unwrap_or("?"),
            why.lease_deadline.as_deref().unwrap_or("?"),
            if why.readd_pending {
                " (changed again meanwhile: queued again after)"
            } else {
                ""
            }
        ),
        _ => "not queued (reconciled, nothing pending)".into(),
    };
    let colour = match why.state.as_str() {
        "delayed" if why.retries > 0 => Colour::Yellow,
        "absent" => Colour::Dim,
        _ => Colour::Green,
    };
    t.row(vec!["state".into(), coloured(state, colour)]);
    t.row(vec!["retries".into(), why.retries.into()]);
    match &why.last_outcome {
        None => t.row(vec![
            "last reconcile".into(),
            coloured("none remembered by this replica", Colour::Dim),
        ]),
        Some(last) => {
            let colour = match last.result.as_str() {
                "failed" | "lease-expired" => Colour::Red,
                _ => Colour::Green,
            };
            t.row(vec![
                "last reconcile".into(),
                coloured(
                    format!(
                        "{} at {} (attempt {}, took {}, worker {})",
                        last.result,
                        last.finished_at.as_deref().unwrap_or("?"),
                        last.attempt,
                        human(last.duration_seconds),
                        if last.worker.is_empty() {
                            "?"
                        } else {
                            &last.worker
                        },
                    ),
                    colour,
                ),
            ]);
            if !last.error.is_empty() {
                t.row(vec![
                    "last error".into(),
                    coloured(&last.error, Colour::Red),
                ]);
            }
            t.row(vec![
                "trace id".into(),
                if last.trace_id.is_empty() {
                    "-"
                } else {
                    &last.trace_id
                }
                .into(),
            ]);
        }
    }
    t.render(style)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_resolve_to_the_controller_that_reconciles_them() {
        let controllers: Vec<String> = [
            "apps/v1/ReplicaSet",
            "apps/v1/Deployment",
            "garbage-collector",
            "v1/Namespace",
        ]
        .map(String::from)
        .to_vec();
        for (resource, controller) in [
            ("replicaset", "apps/v1/ReplicaSet"),
            ("ReplicaSets", "apps/v1/ReplicaSet"),
            ("rs", "apps/v1/ReplicaSet"),
            ("replicasets.apps", "apps/v1/ReplicaSet"),
            ("deploy", "apps/v1/Deployment"),
            ("ns", "v1/Namespace"),
            ("namespace", "v1/Namespace"),
            ("garbage-collector", "garbage-collector"),
            ("apps/v1/Deployment", "apps/v1/Deployment"),
        ] {
            assert_eq!(
                resolve(resource, &controllers).unwrap(),
                controller,
                "{resource}"
            );
        }
        let error = resolve("pod", &controllers).unwrap_err().to_string();
        assert!(
            error.contains("it serves: apps/v1/ReplicaSet, apps/v1/Deployment"),
            "{error}"
        );
    }
}
