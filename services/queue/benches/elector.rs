//! `make bench-elector`: shard failover and handover between real queue replicas, each printed
//! as `bench elector.<figure> <value> <unit>`.
//!
//! - `failover_median` / `failover_max`: kill -9 of a replica until every shard is served
//!   again (20 runs, 256 shards, 3 replicas, default 2 s member TTL);
//! - `handover_median`: SIGTERM of an idle replica until its shards are served elsewhere;
//! - `moved_3to4` / `ideal_3to4`: shards that change owner going from 3 to 4 members and back,
//!   against the ideal S/4 each way.

#![allow(clippy::unwrap_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use switchyard_elector_core::assign;

const SHARDS: u32 = 256;
const FAILOVERS: usize = 20;
const HANDOVERS: usize = 10;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

async fn failover_and_handover() {
    let mut cluster = support::cluster(SHARDS).await;
    support::until_all_served(&cluster, Duration::from_secs(30)).await;
    let mut failovers = Vec::new();
    for run in 0..FAILOVERS {
        let victim = cluster.replicas.iter().position(Option::is_some).unwrap();
        // Timed from the signal: `kill` returns once the process has exited, and the elector
        // in this process may have moved its shards by then.
        let killed_at = std::time::Instant::now();
        let _ = cluster.replicas[victim].take().unwrap().kill();
        support::until_all_served(&cluster, Duration::from_secs(30)).await;
        let took = killed_at.elapsed();
        eprintln!("failover {run}: {took:?}");
        failovers.push(took);
        cluster.add_replica().await;
        support::until_all_served(&cluster, Duration::from_secs(30)).await;
    }
    let mut handovers = Vec::new();
    for run in 0..HANDOVERS {
        // Let the newest replica's joins settle, then stop the oldest one.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let victim = cluster.replicas.iter().position(Option::is_some).unwrap();
        let stopping = cluster.replicas[victim].take().unwrap();
        // From the signal, like a failover: the shards move while the replica shuts down.
        let signalled_at = std::time::Instant::now();
        let (status, _) = stopping.terminate().await.unwrap();
        assert!(status.success());
        support::until_all_served(&cluster, Duration::from_secs(30)).await;
        let took = signalled_at.elapsed();
        eprintln!("handover {run}: {took:?}");
        handovers.push(took);
        cluster.add_replica().await;
        support::until_all_served(&cluster, Duration::from_secs(30)).await;
    }
    let max = *failovers.iter().max().unwrap();
    println!(
        "bench elector.failover_median {:.3} s",
        median(failovers).as_secs_f64()
    );
    println!("bench elector.failover_max {:.3} s", max.as_secs_f64());
    println!(
        "bench elector.handover_median {:.1} ms",
        median(handovers).as_secs_f64() * 1e3
    );
}

fn moved_3_to_4() {
    let three: Vec<String> = (0..3).map(|i| format!("queue-{i}")).collect();
    let mut four = three.clone();
    four.push("queue-3".into());
    let a = assign(SHARDS, &three, 1).unwrap();
    let b = assign(SHARDS, &four, 1).unwrap();
    let moved = |x: &[String], y: &[String]| x.iter().zip(y).filter(|(p, q)| p != q).count();
    println!("bench elector.moved_3to4 {} shards", moved(&a, &b));
    println!("bench elector.moved_4to3 {} shards", moved(&b, &a));
    println!("bench elector.ideal_3to4 {} shards", SHARDS / 4);
}

fn main() {
    moved_3_to_4();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(failover_and_handover());
}
