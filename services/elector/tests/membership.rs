//! Membership against a real etcd: registration, a clean leave, a crashed member's expiry,
//! safety when etcd goes away (stop serving before the lease can have expired) and recovery.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use switchyard_elector::membership::{members, watch_members};
use switchyard_runtime::{Role, drain_channel};
use switchyard_shards::member::{LeaseState, LeaseTiming, Member, join};
use switchyard_testenv::{Etcd, Pki};
use tokio::{sync::watch, time::Instant};

fn member(id: &str) -> Member {
    Member {
        id: id.into(),
        address: format!("{id}.queue:8443"),
    }
}

async fn until<T: Clone>(
    rx: &mut watch::Receiver<T>,
    within: Duration,
    pred: impl Fn(&T) -> bool,
) -> T {
    tokio::time::timeout(within, async {
        loop {
            let value = rx.borrow_and_update().clone();
            if pred(&value) {
                return value;
            }
            rx.changed().await.unwrap();
        }
    })
    .await
    .expect("condition reached in time")
}

fn ids(set: &Option<Vec<Member>>) -> Vec<String> {
    set.iter().flatten().map(|m| m.id.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_register_leave_cleanly_and_expire_when_they_crash() {
    let etcd = Etcd::start().await.unwrap();
    let (_stop_watch, watch_drain) = drain_channel();
    let (mut set, _) = watch_members(etcd.connection(Role::Elector), watch_drain);

    let (leave_a, drain_a) = drain_channel();
    let (mut a, task_a) = join(
        etcd.connection(Role::Queue),
        member("a"),
        LeaseTiming::default(),
        drain_a,
    )
    .unwrap();
    let (_keep_b, drain_b) = drain_channel();
    let (mut b, task_b) = join(
        etcd.connection(Role::Queue),
        member("b"),
        LeaseTiming::default(),
        drain_b,
    )
    .unwrap();
    until(&mut a, Duration::from_secs(10), |s| {
        matches!(s, LeaseState::Held { .. })
    })
    .await;
    until(&mut b, Duration::from_secs(10), |s| {
        matches!(s, LeaseState::Held { .. })
    })
    .await;
    until(&mut set, Duration::from_secs(10), |s| ids(s) == ["a", "b"]).await;
    let mut client = etcd.client().await.unwrap();
    let (listed, _) = members(&mut client).await.unwrap();
    assert_eq!(listed, [member("a"), member("b")]);

    // A clean leave revokes the lease: gone at once, not after the TTL.
    let left = Instant::now();
    leave_a.trigger();
    task_a.await.unwrap();
    until(&mut set, Duration::from_secs(10), |s| ids(s) == ["b"]).await;
    assert!(
        left.elapsed() < Duration::from_secs(1),
        "{:?}",
        left.elapsed()
    );

    // A crash stops the renewals: etcd expires the lease after the TTL.
    let crashed = Instant::now();
    task_b.abort();
    until(&mut set, Duration::from_secs(10), |s| ids(s).is_empty()).await;
    let gone = crashed.elapsed();
    assert!(
        gone >= Duration::from_secs(1) && gone <= Duration::from_secs(4),
        "expired after {gone:?} with a 2 s TTL"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_stops_serving_before_its_lease_can_expire_and_comes_back_with_etcd() {
    let mut etcd = Etcd::start().await.unwrap();
    let timing = LeaseTiming::default();
    let (_keep, drain) = drain_channel();
    let (mut state, _task) =
        join(etcd.connection(Role::Queue), member("c"), timing, drain).unwrap();
    let held = until(&mut state, Duration::from_secs(10), |s| {
        matches!(s, LeaseState::Held { .. })
    })
    .await;

    etcd.kill();
    let killed = Instant::now();
    until(&mut state, Duration::from_secs(10), |s| {
        *s == LeaseState::Lost
    })
    .await;
    let stopped = killed.elapsed();
    // The last acknowledged renewal was sent at most ttl/3 before the kill; the member gives
    // up at sent + ttl - margin, strictly before etcd could expire the lease (sent + ttl).
    assert!(
        stopped <= timing.ttl - timing.margin,
        "stopped serving {stopped:?} after etcd went away"
    );

    etcd.restart().await.unwrap();
    let back = until(&mut state, Duration::from_secs(15), |s| {
        matches!(s, LeaseState::Held { .. })
    })
    .await;
    assert_ne!(back, held, "a new lease after recovery");
    let mut client = etcd.client().await.unwrap();
    let (listed, _) = members(&mut client).await.unwrap();
    assert_eq!(listed, [member("c")]);
}

#[tokio::test]
async fn an_unreachable_etcd_is_retried_not_fatal_and_bad_members_are_refused() {
    // Port 1 on loopback: nothing listens there.
    let files = Pki::shared().files(Role::Queue);
    let unreachable = switchyard_shards::Etcd::with_tls(
        vec!["https://127.0.0.1:1".into()],
        &files.cert,
        &files.key,
        &files.ca,
    );
    let (_keep, drain) = drain_channel();
    let (mut state, task) = join(
        unreachable.clone(),
        member("d"),
        LeaseTiming::default(),
        drain,
    )
    .unwrap();
    assert!(
        tokio::time::timeout(
            Duration::from_secs(1),
            state.wait_for(|s| *s != LeaseState::Lost)
        )
        .await
        .is_err(),
        "never held"
    );
    assert!(!task.is_finished(), "still retrying");
    task.abort();

    let (_keep, drain) = drain_channel();
    let error = join(
        unreachable,
        Member {
            id: "a/b".into(),
            address: "x:1".into(),
        },
        LeaseTiming::default(),
        drain,
    )
    .unwrap_err();
    assert_eq!(error.to_string(), "invalid member id: must not contain '/'");
}
