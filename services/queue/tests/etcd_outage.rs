//! etcd lost under three real queue replicas, seen from the queue.
//!
//! - etcd stopped for longer than the member TTL, then restarted: the replicas stop serving
//!   (Stats, a refused enqueue, the ownership metrics), keep refusing while etcd is away, then
//!   serve every shard again at new epochs (the watcher's cue to resync) and lease work end
//!   to end. A shard its member renewed in place kept its keys; every other shard starts
//!   empty.
//! - etcd silent (a proxy between the replicas and etcd holds every byte, connections stay
//!   open): nothing tells the replicas, so each gives up at its own deadline, and every one has
//!   stopped serving before etcd expires its lease (seen from a watch straight on etcd).
//!
//! Every replica's serve intervals show no shard served twice at once.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::HashMap,
    time::{Duration, Instant, SystemTime},
};

use prost::Message;
use switchyard_proto::{
    common::v1::{NotShardOwner, WorkKey},
    queue::v1::{
        Credit, DescribeKeyRequest, Done, EnqueueItem, EnqueueRequest, KeyPhase, Outcome,
        StatsRequest, WorkRequest, WorkerHello, outcome, queue_client::QueueClient, work_request,
        work_response,
    },
};
use switchyard_queue_core::shard::shard_of;
use switchyard_testenv::ServiceProcess;
use tonic::Code;

use support::{
    RS, assert_no_two_owners, cluster, cluster_on, metric, metrics, queue_client, served,
    until_all_served,
};
use switchyard_elector::membership::watch_members;
use switchyard_runtime::{Role, drain_channel};
use switchyard_testenv::Etcd;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpListener, TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::watch,
};

const SHARDS: u32 = 16;
/// The member TTL the replicas run with (the default).
const TTL: Duration = Duration::from_secs(2);
/// How long etcd stays down: twice the TTL, so every lease would have expired.
const OUTAGE: Duration = Duration::from_secs(4);
/// A member gives up at `sent + TTL - TTL/10`, where `sent` (when its last acknowledged
/// renewal was sent) is before the kill: at most 1.8 s after it. Polling every replica's
/// Stats adds a few milliseconds, so 2 s (the TTL, when etcd could first expire the lease)
/// bounds it with 200 ms to spare.
const STOP_BOUND: Duration = TTL;

fn request(name: &str) -> EnqueueRequest {
    EnqueueRequest {
        batch_id: 1,
        shard: shard_of(RS, "default", name, SHARDS),
        items: vec![EnqueueItem {
            key: Some(WorkKey {
                controller: RS.into(),
                namespace: "default".into(),
                name: name.into(),
            }),
            ..Default::default()
        }],
    }
}

async fn client(role: Role, replica: &ServiceProcess) -> QueueClient<tonic::transport::Channel> {
    queue_client(role, replica.grpc_addr()).await.unwrap()
}

/// Epoch of every shard the replicas serve.
async fn epochs(replicas: &[&ServiceProcess]) -> HashMap<u32, u64> {
    let mut epochs = HashMap::new();
    for replica in replicas {
        let stats = client(Role::Observer, replica)
            .await
            .stats(StatsRequest::default())
            .await
            .unwrap()
            .into_inner();
        for s in stats.shards {
            epochs.insert(s.shard, s.epoch);
        }
    }
    epochs
}

/// Enqueues `name` at `replica`, which must refuse it as not the owner.
async fn assert_refused(replica: &ServiceProcess, name: &str) {
    let status = client(Role::Watcher, replica)
        .await
        .enqueue(request(name))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    NotShardOwner::decode(status.details()).expect("a NotShardOwner detail");
}

/// A key name of every shard.
fn before_keys() -> HashMap<u32, String> {
    let mut keys = HashMap::new();
    for n in 0.. {
        let name = format!("before-{n}");
        keys.entry(shard_of(RS, "default", &name, SHARDS))
            .or_insert(name);
        if keys.len() == SHARDS as usize {
            return keys;
        }
    }
    unreachable!()
}

/// Leases items at `replica`, reporting each done, until `wanted` comes; returns its key
/// name and epoch.
async fn lease_and_complete(replica: &ServiceProcess, wanted: &str) -> (String, u64) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let send = |request| WorkRequest {
        request: Some(request),
    };
    tx.send(send(work_request::Request::Hello(WorkerHello {
        worker_id: "outage-test".into(),
        controllers: vec![RS.into()],
    })))
    .await
    .unwrap();
    tx.send(send(work_request::Request::Credit(Credit { items: 1 })))
        .await
        .unwrap();
    let mut responses = client(Role::Reconciler, replica)
        .await
        .work(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    // Keys kept across the outage may come first: each is done, and one more credited.
    loop {
        let item = match responses.message().await.unwrap().unwrap().response {
            Some(work_response::Response::Item(item)) => item,
            other => panic!("expected an item, got {other:?}"),
        };
        tx.send(send(work_request::Request::Outcome(Outcome {
            shard: item.shard,
            epoch: item.epoch,
            lease_id: item.lease_id.clone(),
            result: Some(outcome::Result::Done(Done {})),
            duration: None,
            observed: Default::default(),
            namespace_observed: Default::default(),
        })))
        .await
        .unwrap();
        match responses.message().await.unwrap().unwrap().response {
            Some(work_response::Response::OutcomeAck(ack)) => assert!(ack.applied, "{ack:?}"),
            other => panic!("expected an outcome ack, got {other:?}"),
        }
        let name = item.key.unwrap().name;
        if name == wanted {
            return (name, item.epoch);
        }
        tx.send(send(work_request::Request::Credit(Credit { items: 1 })))
            .await
            .unwrap();
    }
}

/// Waits until the joins' handovers are over: every shard served once, and each replica's
/// metrics (lease held, shards served, the epoch of each) agree with its Stats, twice in a
/// row 200 ms apart. Returns who serves each shard, and at which epoch.
async fn settled(
    cluster: &support::Cluster,
    within: Duration,
) -> (HashMap<u32, usize>, HashMap<u32, u64>) {
    let deadline = Instant::now() + within;
    let mut last = None;
    loop {
        let (_, owners) = until_all_served(cluster, Duration::from_secs(15)).await;
        let replicas: Vec<&ServiceProcess> = cluster.replicas.iter().flatten().collect();
        let epochs = epochs(&replicas).await;
        let mut agree = true;
        for replica in &replicas {
            let text = metrics(replica).await;
            let shards = served(replica).await;
            agree &= metric(&text, "switchyard_queue_member_lease_held") == Some(1.0)
                && metric(&text, "switchyard_queue_shards_served") == Some(shards.len() as f64)
                && shards.iter().all(|shard| {
                    metric(
                        &text,
                        &format!("switchyard_queue_shard_epoch{{shard=\"{shard}\"}}"),
                    ) == epochs.get(shard).map(|epoch| *epoch as f64)
                });
        }
        let now = (owners, epochs);
        if agree && last.as_ref() == Some(&now) {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "the metrics never settled in step with Stats"
        );
        last = agree.then_some(now);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_stop_serving_while_etcd_is_down_and_serve_again_at_new_epochs() {
    let mut cluster = cluster(SHARDS).await;
    let (owners, epochs_before) = settled(&cluster, Duration::from_secs(20)).await;
    let replicas: Vec<&ServiceProcess> = cluster.replicas.iter().flatten().collect();
    // One key in every shard, at its owner.
    let before = before_keys();
    for (shard, name) in &before {
        let owner = replicas[owners[shard]];
        assert_eq!(
            client(Role::Watcher, owner)
                .await
                .enqueue(request(name))
                .await
                .unwrap()
                .into_inner()
                .added,
            1
        );
    }

    cluster.etcd.kill();
    let killed = Instant::now();
    loop {
        let mut serving = 0;
        for replica in &replicas {
            serving += served(replica).await.len();
        }
        if serving == 0 {
            break;
        }
        assert!(
            killed.elapsed() <= STOP_BOUND,
            "{serving} shards still served {:?} after etcd went away",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stopped = killed.elapsed();
    println!("every replica stopped serving {stopped:?} after etcd went away");

    // etcd stays away for longer than the TTL: nobody serves, every enqueue is refused, and
    // the metrics say why.
    while killed.elapsed() < OUTAGE {
        for replica in &replicas {
            assert!(served(replica).await.is_empty());
            assert_refused(replica, "during").await;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for replica in &replicas {
        let text = metrics(replica).await;
        let had = epochs_before
            .keys()
            .filter(|s| replicas[owners[s]].grpc_addr() == replica.grpc_addr())
            .count();
        assert_eq!(
            metric(&text, "switchyard_queue_member_lease_held"),
            Some(0.0),
            "{text}"
        );
        assert_eq!(
            metric(&text, "switchyard_queue_member_lease_lost_total"),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            metric(&text, "switchyard_queue_shards_served"),
            Some(0.0),
            "{text}"
        );
        assert_eq!(
            metric(
                &text,
                "switchyard_queue_shard_releases_total{reason=\"lease_lost\"}"
            ),
            Some(had as f64),
            "{text}"
        );
        assert!(
            !text.contains("switchyard_queue_shard_epoch{"),
            "no shard has an epoch here: {text}"
        );
    }

    cluster.etcd.restart().await.unwrap();
    let restarted = Instant::now();
    until_all_served(&cluster, Duration::from_secs(30)).await;
    println!(
        "every shard served again {:?} after etcd came back",
        restarted.elapsed()
    );
    // A member retries etcd with jittered backoff (up to 10 s after a long outage), so the
    // others may take every shard before it is back; wait until all are in and stable.
    let (owners, after) = settled(&cluster, Duration::from_secs(40)).await;
    println!(
        "every member registered again and the shard map settled {:?} after etcd came back",
        restarted.elapsed()
    );
    let replicas: Vec<&ServiceProcess> = cluster.replicas.iter().flatten().collect();
    for (shard, epoch) in &after {
        assert!(
            *epoch > epochs_before[shard],
            "shard {shard} serves at epoch {epoch}, not newer than {} before the outage: \
             the watcher would not know to resync it",
            epochs_before[shard]
        );
    }
    let (mut held, mut renewed) = (0.0, 0.0);
    for replica in &replicas {
        let text = metrics(replica).await;
        renewed += metric(&text, "switchyard_queue_shard_epoch_renewals_total").unwrap_or(0.0);
        assert_eq!(
            metric(&text, "switchyard_queue_member_lease_held"),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            metric(&text, "switchyard_queue_member_lease_lost_total"),
            Some(1.0),
            "{text}"
        );
        held += metric(&text, "switchyard_queue_shards_served").unwrap();
    }
    assert_eq!(
        held,
        f64::from(SHARDS),
        "the metrics count every shard once"
    );
    // Shards that stayed with their member were renewed in place; the others moved when a
    // member's old lease expired before it registered again.
    println!("{renewed} shards renewed their epoch in place");

    // A shard its member renewed in place (no other member was given it meanwhile) kept its
    // key; a shard that moved starts empty (the watcher resends its keys on the new epoch).
    let mut kept = 0;
    for (shard, name) in &before {
        let owner = replicas[owners[shard]];
        // How its owner last started serving it: resumed with its keys, or empty.
        let resumed = owner
            .log()
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .rfind(|line| line["message"] == "serving shard" && line["shard"] == *shard)
            .is_some_and(|line| line["keys"] == "kept");
        let phase = client(Role::Operator, owner)
            .await
            .describe_key(DescribeKeyRequest {
                key: request(name).items[0].key.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .phase();
        if resumed {
            kept += 1;
            assert_eq!(phase, KeyPhase::Queued, "shard {shard} was resumed: {name}");
        } else {
            assert_eq!(
                phase,
                KeyPhase::Absent,
                "shard {shard} started empty: {name}"
            );
        }
    }
    println!("{kept} shards kept their keys across the outage");
    // etcd keeps the members' registrations across its restart, so the leader moves few
    // shards, if any: most are renewed in place by their member.
    assert!(
        kept > 0 && f64::from(kept) <= renewed,
        "{kept} shards resumed, {renewed} renewed in place"
    );

    // A new key flows end to end.
    let owner = replicas[owners[&shard_of(RS, "default", "after", SHARDS)]];
    assert_eq!(
        client(Role::Watcher, owner)
            .await
            .enqueue(request("after"))
            .await
            .unwrap()
            .into_inner()
            .added,
        1
    );
    let (name, epoch) = lease_and_complete(owner, "after").await;
    assert_eq!(name, "after");
    assert_eq!(epoch, after[&shard_of(RS, "default", "after", SHARDS)]);

    let mut logs = Vec::new();
    for replica in cluster.replicas.iter_mut() {
        let (status, log) = replica.take().unwrap().terminate().await.unwrap();
        assert!(status.success(), "{status}: {log}");
        logs.push((log, SystemTime::now()));
    }
    assert!(
        logs.iter()
            .all(|(log, _)| log.contains("member lease may have expired")),
        "every replica logged that it stopped serving"
    );
    assert_eq!(assert_no_two_owners(&logs), SHARDS as usize);
}

/// Copies `from` to `to`, holding each chunk while `silent` is set.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut silent: watch::Receiver<bool>) {
    let mut buf = vec![0; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if silent.wait_for(|s| !s).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// A TCP proxy to `upstream` on a free loopback port. While `silent` is set it accepts and
/// keeps connections but forwards nothing: a peer that answers nothing, as a partitioned or
/// stalled etcd does.
async fn proxy(upstream: String, silent: watch::Receiver<bool>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let (upstream, silent) = (upstream.clone(), silent.clone());
            tokio::spawn(async move {
                let Ok(outbound) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                tokio::join!(pipe(ri, wo, silent.clone()), pipe(ro, wi, silent));
            });
        }
    });
    format!("https://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_etcd_stops_every_replica_before_etcd_expires_its_lease() {
    let etcd = Etcd::start().await.unwrap();
    let (silence, silent) = watch::channel(false);
    // The proxy passes TLS through: the replicas still check etcd's certificate.
    let upstream = etcd.endpoint().trim_start_matches("https://").to_owned();
    let straight = etcd.connection(Role::Elector);
    let via_proxy = proxy(upstream, silent).await;
    let mut cluster = cluster_on(etcd, via_proxy, SHARDS).await;
    let (_, before) = settled(&cluster, Duration::from_secs(20)).await;
    let replicas: Vec<&ServiceProcess> = cluster.replicas.iter().flatten().collect();
    // The members as etcd itself sees them, not through the proxy.
    let (_stop_watch, drain) = drain_channel();
    let (mut members, _) = watch_members(straight, drain);
    members
        .wait_for(|m| m.as_ref().is_some_and(|m| m.len() == 3))
        .await
        .unwrap();

    silence.send_replace(true);
    let silenced = Instant::now();
    // When etcd removes each member (its lease expired), as etcd itself reports it.
    let expiries = tokio::spawn(async move {
        let mut expired: HashMap<String, Duration> = HashMap::new();
        while expired.len() < 3 {
            let current: Vec<String> = members
                .borrow_and_update()
                .iter()
                .flatten()
                .map(|m| m.id.clone())
                .collect();
            for id in ["q0", "q1", "q2"] {
                if !current.iter().any(|c| c == id) {
                    expired.entry(id.to_owned()).or_insert(silenced.elapsed());
                }
            }
            if expired.len() < 3 && members.changed().await.is_err() {
                break;
            }
        }
        expired
    });
    // When each replica stopped serving (replica i is member q<i>).
    let mut stopped: Vec<Option<Duration>> = vec![None; replicas.len()];
    while stopped.iter().any(Option::is_none) {
        for (i, replica) in replicas.iter().enumerate() {
            if stopped[i].is_none() && served(replica).await.is_empty() {
                stopped[i] = Some(silenced.elapsed());
            }
        }
        assert!(
            silenced.elapsed() <= STOP_BOUND,
            "replicas still serving {:?} after etcd went silent: {stopped:?}",
            silenced.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let expired = tokio::time::timeout(Duration::from_secs(10), expiries)
        .await
        .expect("etcd expires the silent members' leases")
        .unwrap();
    println!(
        "silent etcd: replicas stopped serving after {stopped:?}; etcd expired q0..q2 after {expired:?}"
    );
    for (i, stop) in stopped.iter().enumerate() {
        let stop = stop.unwrap();
        // Nothing told the replica: it gave up at its deadline, `sent + TTL - TTL/10` of its
        // last acknowledged renewal (sent at most TTL/3 before the silence, or 2 × TTL/3 when
        // the silence held back the answer to the next one): at least about 0.47 s after it.
        assert!(
            stop >= Duration::from_millis(450),
            "q{i} stopped after {stop:?}: not at its lease deadline"
        );
        // Safety before liveness: the replica stopped before etcd expired its lease. The stop
        // is seen up to one Stats poll late (which only makes this stricter) and the expiry
        // a watch delivery late (milliseconds, against a margin of TTL/10 = 200 ms at least).
        let expiry = expired[&format!("q{i}")];
        assert!(
            stop < expiry,
            "q{i} stopped serving {stop:?} after the silence; etcd expired its lease after {expiry:?}"
        );
    }
    for replica in &replicas {
        let text = metrics(replica).await;
        assert_eq!(
            metric(&text, "switchyard_queue_member_lease_held"),
            Some(0.0),
            "{text}"
        );
        assert_eq!(
            metric(&text, "switchyard_queue_member_lease_lost_total"),
            Some(1.0),
            "{text}"
        );
        assert_refused(replica, "during").await;
    }

    silence.send_replace(false);
    until_all_served(&cluster, Duration::from_secs(30)).await;
    let replicas: Vec<&ServiceProcess> = cluster.replicas.iter().flatten().collect();
    for (shard, epoch) in epochs(&replicas).await {
        assert!(epoch > before[&shard], "shard {shard} at a new epoch");
    }

    let mut logs = Vec::new();
    for replica in cluster.replicas.iter_mut() {
        let (status, log) = replica.take().unwrap().terminate().await.unwrap();
        assert!(status.success(), "{status}: {log}");
        logs.push((log, SystemTime::now()));
    }
    assert_eq!(assert_no_two_owners(&logs), SHARDS as usize);
}
