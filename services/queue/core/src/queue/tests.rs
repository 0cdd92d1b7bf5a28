use std::{sync::Arc, time::SystemTime};

use switchyard_work::{MAX_CAUSES, MAX_LEASE_EXTENSION};

use super::*;

const RS: &str = "apps/v1/ReplicaSet";

const CONTROLLERS: [&str; 2] = [RS, "apps/v1/Deployment"];

/// The worker [`lease`] leases to.
const W: WorkerId = 1;

fn key(name: &str) -> ValidKey {
    KeySpace::new(&CONTROLLERS, 4)
        .validate_parts(RS, "default", name)
        .unwrap()
}

fn queue() -> (Queue, Instant) {
    let mut q = Queue::new(
        QueueConfig {
            shard_count: 4,
            lease_timeout: Duration::from_secs(10),
            capacity: 100,
            max_controllers: 4,
            backoff: BackoffConfig {
                qps: 0.0,
                ..Default::default()
            },
        },
        &CONTROLLERS,
        SequentialLeaseIds::default(),
    );
    let now = Instant::now();
    for shard in 0..4 {
        q.acquire(shard, 7, now);
    }
    (q, now)
}

fn lease(q: &mut Queue, now: Instant) -> Option<Lease> {
    q.advance(now);
    q.lease(W, &[], now)
}

fn cause(n: usize) -> Cause {
    Arc::from(vec![("traceparent".to_owned(), n.to_string())])
}

fn caused(q: &mut Queue, name: &str, n: usize, now: Instant) -> AddOutcome {
    q.add_caused(
        &key(name),
        Priority::Normal,
        Duration::ZERO,
        Origin::traced(cause(n)),
        now,
    )
    .unwrap()
}

#[test]
fn coalesced_adds_keep_their_causes_and_the_lease_carries_them() {
    let (mut q, now) = queue();
    assert_eq!(caused(&mut q, "a", 1, now), AddOutcome::Added);
    assert_eq!(caused(&mut q, "a", 2, now), AddOutcome::Coalesced);
    q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
        .unwrap();
    let l = lease(&mut q, now).unwrap();
    assert_eq!(l.causes, vec![cause(1), cause(2)]);
    assert_eq!(l.causes_dropped, 0);
    // Adds while leased are the next lease's causes, not this one's.
    caused(&mut q, "a", 3, now);
    q.complete(W, l.shard(), l.epoch, l.id, Outcome::Done, now)
        .unwrap();
    let l = lease(&mut q, now).unwrap();
    assert_eq!(l.causes, vec![cause(3)]);
}

#[test]
fn causes_are_bounded_keeping_the_latest() {
    let (mut q, now) = queue();
    for n in 0..MAX_CAUSES + 5 {
        caused(&mut q, "a", n, now);
    }
    let l = lease(&mut q, now).unwrap();
    assert_eq!(l.causes.len(), MAX_CAUSES);
    assert_eq!(l.causes.first(), Some(&cause(5)));
    assert_eq!(l.causes.last(), Some(&cause(MAX_CAUSES + 4)));
    assert_eq!(l.causes_dropped, 5);
}

#[test]
fn a_failed_lease_puts_its_causes_back_for_the_retry() {
    let (mut q, now) = queue();
    caused(&mut q, "a", 1, now);
    let l = lease(&mut q, now).unwrap();
    caused(&mut q, "a", 2, now);
    q.complete(W, l.shard(), l.epoch, l.id, Outcome::Failed, now)
        .unwrap();
    let later = now + Duration::from_secs(60);
    let l = lease(&mut q, later).unwrap();
    assert_eq!(l.causes, vec![cause(1), cause(2)]);
    q.complete(W, l.shard(), l.epoch, l.id, Outcome::Done, later)
        .unwrap();
    q.add(&key("a"), Priority::Normal, Duration::ZERO, later)
        .unwrap();
    assert!(lease(&mut q, later).unwrap().causes.is_empty());
}

fn observed(q: &mut Queue, name: &str, at: SystemTime, now: Instant) {
    let origin = Origin {
        cause: None,
        observed_at: Some(at),
    };
    q.add_caused(&key(name), Priority::Normal, Duration::ZERO, origin, now)
        .unwrap();
}

#[test]
fn a_lease_carries_the_earliest_observation_of_the_adds_it_covers() {
    let (mut q, now) = queue();
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    observed(&mut q, "a", t + Duration::from_millis(5), now);
    observed(&mut q, "a", t, now);
    observed(&mut q, "a", t + Duration::from_millis(9), now);
    let l = lease(&mut q, now).unwrap();
    assert_eq!(l.observed_at, Some(t));
    assert!(l.causes.is_empty());
    // Observed while leased: the next lease's, not this one's; a failed lease hands its own
    // (earlier) one to the retry.
    observed(&mut q, "a", t + Duration::from_millis(20), now);
    q.complete(W, l.shard(), l.epoch, l.id, Outcome::Failed, now)
        .unwrap();
    let later = now + Duration::from_secs(60);
    let l = lease(&mut q, later).unwrap();
    assert_eq!(l.observed_at, Some(t));
    q.complete(W, l.shard(), l.epoch, l.id, Outcome::Done, later)
        .unwrap();
    // An add that names no event leaves the lease without one.
    q.add(&key("a"), Priority::Normal, Duration::ZERO, later)
        .unwrap();
    assert_eq!(lease(&mut q, later).unwrap().observed_at, None);
    assert!(q.controllers.iter().all(|c| c.causes.is_empty()));
}

#[test]
fn causes_go_with_their_key_when_a_shard_is_dropped() {
    let (mut q, now) = queue();
    caused(&mut q, "a", 1, now);
    let shard = key("a").shard();
    q.drain(shard);
    q.release(shard);
    q.acquire(shard, 8, now);
    q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
        .unwrap();
    assert!(lease(&mut q, now).unwrap().causes.is_empty());
    assert!(q.controllers.iter().all(|c| c.causes.is_empty()));
}

#[test]
fn adds_while_queued_coalesce() {
    let (mut q, now) = queue();
    assert_eq!(
        q.add(&key("a"), Priority::Normal, Duration::ZERO, now),
        Ok(AddOutcome::Added)
    );
    assert_eq!(
        q.add(&key("a"), Priority::Normal, Duration::ZERO, now),
        Ok(AddOutcome::Coalesced)
    );
    assert_eq!(q.len(), 1);
    assert!(lease(&mut q, now).is_some());
    assert!(lease(&mut q, now).is_none(), "queued once, leased once");
}

#[test]
fn live_adds_beat_low_priority_ones_and_upgrade_them() {
    let (mut q, now) = queue();
    q.add(&key("resync-1"), Priority::Low, Duration::ZERO, now)
        .unwrap();
    q.add(&key("resync-2"), Priority::Low, Duration::ZERO, now)
        .unwrap();
    q.add(&key("live"), Priority::Normal, Duration::ZERO, now)
        .unwrap();
    q.add(&key("resync-2"), Priority::Normal, Duration::ZERO, now)
        .unwrap();
    let order: Vec<_> = std::iter::from_fn(|| lease(&mut q, now))
        .map(|l| l.key.name().to_owned())
        .collect();
    assert_eq!(order, ["live", "resync-2", "resync-1"]);
}

#[test]
fn a_delayed_add_keeps_the_earliest_ready_time() {
    let (mut q, t0) = queue();
    q.add(&key("a"), Priority::Normal, Duration::from_secs(10), t0)
        .unwrap();
    q.add(&key("a"), Priority::Normal, Duration::from_secs(3), t0)
        .unwrap();
    q.add(&key("a"), Priority::Normal, Duration::from_secs(20), t0)
        .unwrap();
    assert!(lease(&mut q, t0 + Duration::from_millis(2999)).is_none());
    assert!(lease(&mut q, t0 + Duration::from_secs(3)).is_some());
    // An add without delay makes a delayed key ready at once.
    q.add(&key("b"), Priority::Normal, Duration::from_secs(10), t0)
        .unwrap();
    q.add(&key("b"), Priority::Normal, Duration::ZERO, t0)
        .unwrap();
    assert!(lease(&mut q, t0).is_some());
}

#[test]
fn a_key_added_while_leased_is_queued_again_when_the_lease_ends() {
    let (mut q, now) = queue();
    q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
        .unwrap();
    let l = lease(&mut q, now).unwrap();
    q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
        .unwrap();
    assert!(lease(&mut q, now).is_none(), "never two leases of one key");
    q.complete(W, l.shard(), l.epoch, l.id, Outcome::Done, now)
        .unwrap();
    let again = lease(&mut q, now).expect("dirty key requeued");
    assert_eq!(again.key, l.key);
    q.complete(W, again.shard(), again.epoch, again.id, Outcome::Done, now)
        .unwrap();
    assert!(q.is_empty(), "done without a new add forgets the key");
}

#[test]
fn failures_back_off_exponentially_and_done_forgets_them() {
    let (mut q, t0) = queue();
    q.add(&key("a"), Priority::Normal, Duration::ZERO, t0)
        .unwrap();
    let mut now = t0;
    for (attempt, backoff_ms) in [(1, 5), (2, 10), (3, 20)] {
        let l = lease(&mut q, now).unwrap();
        assert_eq!(l.attempt, attempt);
        q.complete(W, l.shard(), l.epoch, l.id, Outcome::Failed, now)
            .unwrap();
        assert!(lease(&mut q, now + Duration::from_millis(backoff_ms - 1)).is_none());
        now += Duration::from_millis(backoff_ms);
    }
    let l = lease(&mut q, now).unwrap();
    assert_eq!(l.attempt, 4);
    q.complete(
        W,
        l.shard(),
        l.epoch,
        l.id,
        Outcome::RequeueAfter(Duration::from_secs(1)),
        now,
    )
    .unwrap();
    let l = lease(&mut q, now + Duration::from_secs(1)).unwrap();
    assert_eq!(l.attempt, 1, "requeue-after forgets the failures");
    assert_eq!(q.totals().retries, 3);
}

#[test]
fn delays_past_the_clock_s_end_wait_a_week_at_most() {
    let (mut q, t0) = queue();
    // An add's delay, and a RequeueAfter's: neither overflows the clock.
    q.add(&key("a"), Priority::Normal, Duration::MAX, t0)
        .unwrap();
    q.add(&key("b"), Priority::Normal, Duration::ZERO, t0)
        .unwrap();
    let l = lease(&mut q, t0).unwrap();
    q.complete(
        W,
        l.shard(),
        l.epoch,
        l.id,
        Outcome::RequeueAfter(Duration::MAX),
        t0,
    )
    .unwrap();
    let almost = t0 + MAX_DELAY - Duration::from_millis(1);
    assert!(lease(&mut q, almost).is_none());
    let week = t0 + MAX_DELAY;
    let mut leased = vec![lease(&mut q, week).unwrap().key.name().to_owned()];
    leased.push(lease(&mut q, week).unwrap().key.name().to_owned());
    leased.sort();
    assert_eq!(leased, ["a", "b"]);
}

/// Within a second of the last instant `from`'s clock can hold.
fn clock_end(from: Instant) -> Instant {
    let (mut fits, mut overflows) = (0u64, u64::MAX);
    while overflows - fits > 1 {
        let mid = fits + (overflows - fits) / 2;
        if from.checked_add(Duration::from_secs(mid)).is_some() {
            fits = mid;
        } else {
            overflows = mid;
        }
    }
    from + Duration::from_secs(fits)
}

#[test]
fn at_the_clock_s_end_nothing_overflows_and_no_key_is_lost() {
    // The core takes `now` from its caller: whatever it is, no delay, lease deadline,
    // extension or backoff may panic; what cannot be represented comes due at once.
    let (mut q, t0) = queue();
    let end = clock_end(t0);
    q.add(&key("a"), Priority::Normal, MAX_DELAY, end).unwrap();
    let l = lease(&mut q, end).expect("a delay past the clock's end is due at once");
    q.extend(W, l.shard(), l.epoch, l.id, MAX_LEASE_EXTENSION, end)
        .unwrap();
    q.complete(
        W,
        l.shard(),
        l.epoch,
        l.id,
        Outcome::RequeueAfter(MAX_DELAY),
        end,
    )
    .unwrap();
    let l = lease(&mut q, end).unwrap();
    q.complete(W, l.shard(), l.epoch, l.id, Outcome::Failed, end)
        .unwrap();
    // Its backoff may still fit before the clock's end: held, due then or at once.
    q.advance(end);
    assert_eq!(q.len(), 1);
    assert!(q.describe(&key("a")).is_some());
}

#[test]
fn an_expired_lease_requeues_with_backoff_and_refuses_the_late_outcome() {
    let (mut q, t0) = queue();
    q.add(&key("a"), Priority::Normal, Duration::ZERO, t0)
        .unwrap();
    let l = lease(&mut q, t0).unwrap();
    let expiry = t0 + Duration::from_secs(10);
    assert_eq!(q.advance(expiry).len(), 1);
    assert!(lease(&mut q, expiry).is_none(), "backoff after expiry");
    let again = lease(&mut q, expiry + Duration::from_millis(5)).unwrap();
    assert_eq!(again.attempt, 2);
    assert_eq!(
        q.complete(W, l.shard(), l.epoch, l.id, Outcome::Done, expiry),
        Err(Refused::UnknownLease)
    );
    assert_eq!(q.totals().lease_expirations, 1);
    assert_eq!(q.totals().refused_unknown_lease, 1);
}

#[test]
fn an_extended_lease_outlives_its_first_deadline() {
    let (mut q, t0) = queue();
    q.add(&key("a"), Priority::Normal, Duration::ZERO, t0)
        .unwrap();
    let l = lease(&mut q, t0).unwrap();
    let t1 = t0 + Duration::from_secs(8);
    let deadline = q
        .extend(W, l.shard(), l.epoch, l.id, Duration::from_secs(30), t1)
        .unwrap();
    assert_eq!(deadline, t1 + Duration::from_secs(30));
    assert!(q.advance(t0 + Duration::from_secs(20)).is_empty());
    assert_eq!(q.advance(deadline).len(), 1);
}

#[test]
fn a_lease_is_answered_and_extended_only_by_the_worker_that_holds_it() {
    const OTHER: WorkerId = 2;
    let (mut q, t0) = queue();
    q.add(&key("a"), Priority::Normal, Duration::ZERO, t0)
        .unwrap();
    q.add(&key("b"), Priority::Normal, Duration::ZERO, t0)
        .unwrap();
    let a = lease(&mut q, t0).unwrap();
    let b = lease(&mut q, t0).unwrap();
    assert_eq!(
        q.complete(OTHER, a.shard(), a.epoch, a.id, Outcome::Forget, t0),
        Err(Refused::ForeignLease)
    );
    assert_eq!(
        q.extend(
            OTHER,
            b.shard(),
            b.epoch,
            b.id,
            Duration::from_secs(600),
            t0
        ),
        Err(Refused::ForeignLease)
    );
    assert_eq!(q.totals().refused_foreign_lease, 2);
    assert_eq!(q.in_flight(), 2, "both leases are still held");
    assert_eq!(q.worker_leases(W), 2);
    // The holder's outcome still applies, and the refused extension moved no deadline.
    q.complete(W, a.shard(), a.epoch, a.id, Outcome::Done, t0)
        .unwrap();
    assert!(!q.contains(&a.key), "done");
    assert!(q.advance(b.deadline - Duration::from_millis(1)).is_empty());
    assert_eq!(
        q.advance(b.deadline).len(),
        1,
        "b expires when it always would"
    );
}

#[test]
fn lease_ids_are_32_lowercase_hex_digits_and_parse_back() {
    let id = LeaseId::from_u128(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
    assert_eq!(id.to_string(), "0123456789abcdef0011223344556677");
    assert_eq!(id.to_string().parse(), Ok(id));
    assert_eq!(LeaseId::NONE.to_string(), "0".repeat(32));
    for bad in [
        "",
        "424242",
        "0123456789ABCDEF0011223344556677",
        "+123456789abcdef0011223344556677",
        "0123456789abcdef00112233445566770",
    ] {
        assert_eq!(bad.parse::<LeaseId>(), Err(InvalidLeaseId), "{bad:?}");
    }
}

/// Hands out the ids it is given, in order.
#[derive(Debug)]
struct Scripted(VecDeque<u128>);

impl LeaseIds for Scripted {
    fn next_id(&mut self) -> LeaseId {
        LeaseId::from_u128(self.0.pop_front().expect("an id left"))
    }
}

#[test]
fn a_drawn_id_that_names_no_lease_or_a_live_one_is_drawn_again() {
    let (q, now) = queue();
    let mut q = Queue {
        lease_ids: Box::new(Scripted([0, 5, 5, 6].into())),
        ..q
    };
    q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
        .unwrap();
    q.add(&key("b"), Priority::Normal, Duration::ZERO, now)
        .unwrap();
    let ids: Vec<_> = std::iter::from_fn(|| lease(&mut q, now))
        .map(|l| l.id)
        .collect();
    assert_eq!(ids, [LeaseId::from_u128(5), LeaseId::from_u128(6)]);
}

#[test]
fn outcomes_with_a_stale_epoch_are_refused_and_change_nothing() {
    let (mut q, now) = queue();
    q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
        .unwrap();
    let l = lease(&mut q, now).unwrap();
    assert_eq!(
        q.complete(W, l.shard(), l.epoch - 1, l.id, Outcome::Done, now),
        Err(Refused::StaleEpoch)
    );
    assert_eq!(q.in_flight(), 1);
    // The shard changes owner and comes back at a new epoch: old leases are gone.
    q.acquire(l.shard(), l.epoch + 1, now);
    assert_eq!(
        q.complete(W, l.shard(), l.epoch, l.id, Outcome::Done, now),
        Err(Refused::StaleEpoch)
    );
    assert_eq!(q.totals().refused_stale_epoch, 2);
    assert!(q.is_empty(), "a new epoch starts empty");
}

/// Keys of `shard`, other than `a`.
fn keys_in(shard: u32, n: usize) -> Vec<ValidKey> {
    (0..10_000)
        .map(|i| key(&format!("k{i}")))
        .filter(|k| k.shard() == shard)
        .take(n)
        .collect()
}

#[test]
fn a_shard_renewed_by_its_own_member_keeps_its_keys_delays_and_leases() {
    let (mut q, now) = queue();
    let shard = key("a").shard();
    let [waiting, delayed, failing, new] = keys_in(shard, 4).try_into().unwrap();
    q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
        .unwrap();
    let leased = lease(&mut q, now).unwrap();
    q.add(&failing, Priority::Normal, Duration::ZERO, now)
        .unwrap();
    let l = lease(&mut q, now).unwrap();
    q.complete(W, shard, l.epoch, l.id, Outcome::Failed, now)
        .unwrap();
    q.add(&waiting, Priority::Normal, Duration::ZERO, now)
        .unwrap();
    q.add(&delayed, Priority::Normal, Duration::from_secs(300), now)
        .unwrap();

    // The member's lease may have expired: nothing is leased or added, nothing is dropped.
    q.suspend(shard);
    assert_eq!(lease(&mut q, now + Duration::from_secs(1)), None);
    assert_eq!(
        q.add(&new, Priority::Normal, Duration::ZERO, now)
            .map(|_| ()),
        Err(Error::NotOwner { shard })
    );
    assert!(q.owned_shards().iter().all(|(s, _)| *s != shard));
    assert_eq!(q.len(), 4);

    // Renewed from the epoch it held: the same keys, the same delay, the same failures, and
    // the lease given before still answers.
    assert_eq!(q.renew(shard, leased.epoch, 9, now), Some(4));
    assert_eq!(q.shard_epoch(shard), Some(9));
    q.complete(W, shard, leased.epoch, leased.id, Outcome::Done, now)
        .unwrap();
    let later = now + Duration::from_secs(1);
    let mut names: Vec<String> = std::iter::from_fn(|| lease(&mut q, later))
        .map(|l| {
            assert_eq!(l.epoch, 9);
            l.key.name().to_owned()
        })
        .collect();
    names.sort();
    let mut expected = vec![waiting.name().to_owned(), failing.name().to_owned()];
    expected.sort();
    assert_eq!(names, expected, "the failing key's backoff is over by then");
    assert_eq!(
        q.describe(&failing).map(|d| d.failures),
        Some(1),
        "its failure count is kept"
    );
    assert!(
        q.describe(&delayed).is_some(),
        "the delayed key still waits"
    );
}

#[test]
fn a_shard_renewed_from_another_epoch_or_acquired_starts_empty() {
    let (mut q, now) = queue();
    let shard = key("a").shard();
    q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
        .unwrap();
    q.suspend(shard);
    // The map gave the shard at an epoch this member did not hold it at.
    assert_eq!(q.renew(shard, 6, 9, now), None);
    assert!(q.is_empty());
    assert_eq!(q.shard_epoch(shard), Some(9));
    // Suspended, then acquired afresh (another owner held it meanwhile): empty too.
    q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
        .unwrap();
    q.suspend(shard);
    q.acquire(shard, 12, now);
    assert!(q.is_empty());
    // And a suspended shard released is gone.
    q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
        .unwrap();
    q.suspend(shard);
    q.release(shard);
    assert!(q.is_empty());
    assert_eq!(q.shard_epoch(shard), None);
}

#[test]
fn a_draining_shard_leases_nothing_new_but_accepts_outcomes() {
    let (mut q, now) = queue();
    q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
        .unwrap();
    let l = lease(&mut q, now).unwrap();
    let same_shard = (0..1000)
        .map(|i| key(&format!("k{i}")))
        .find(|k| k.shard() == l.shard())
        .unwrap();
    q.add(&same_shard, Priority::Normal, Duration::ZERO, now)
        .unwrap();
    q.drain(l.shard());
    assert_eq!(
        q.add(&key("a"), Priority::Normal, Duration::ZERO, now),
        Err(Error::NotOwner { shard: l.shard() })
    );
    assert!(lease(&mut q, now).is_none());
    assert_eq!(q.shard_in_flight(l.shard()), 1);
    q.complete(W, l.shard(), l.epoch, l.id, Outcome::Done, now)
        .unwrap();
    assert_eq!(q.shard_in_flight(l.shard()), 0);
    q.release(l.shard());
    assert!(q.is_empty());
}

#[test]
fn a_cleanly_closed_worker_returns_its_leases_at_once() {
    let (mut q, now) = queue();
    q.add(&key("a"), Priority::Normal, Duration::ZERO, now)
        .unwrap();
    q.advance(now);
    let l = q.lease(42, &[], now).unwrap();
    assert_eq!(q.release_worker(42, now), 1);
    let again = q.lease(43, &[], now).unwrap();
    assert_eq!((again.key, again.attempt), (l.key, 1));
}

#[test]
fn a_full_queue_refuses_new_keys_but_coalesces_known_ones() {
    let (mut q, now) = queue();
    for i in 0..100 {
        q.add(
            &key(&format!("k{i}")),
            Priority::Normal,
            Duration::ZERO,
            now,
        )
        .unwrap();
    }
    assert_eq!(
        q.add(&key("one-more"), Priority::Normal, Duration::ZERO, now),
        Err(Error::Full { capacity: 100 })
    );
    assert_eq!(
        q.add(&key("k5"), Priority::Normal, Duration::ZERO, now),
        Ok(AddOutcome::Coalesced)
    );
}

#[test]
fn stats_count_depth_in_flight_retries_and_age() {
    let (mut q, t0) = queue();
    q.add(&key("a"), Priority::Normal, Duration::ZERO, t0)
        .unwrap();
    q.add(&key("b"), Priority::Normal, Duration::ZERO, t0)
        .unwrap();
    let l = lease(&mut q, t0).unwrap();
    q.complete(W, l.shard(), l.epoch, l.id, Outcome::Failed, t0)
        .unwrap();
    let stats = q.stats(t0 + Duration::from_secs(2));
    let total = |f: fn(&ShardStats) -> u64| stats.iter().map(f).sum::<u64>();
    assert_eq!(stats.len(), 8, "2 controllers x 4 shards");
    assert_eq!(total(|s| s.depth), 2);
    assert_eq!(total(|s| s.retrying), 1);
    assert_eq!(
        stats.iter().map(|s| s.oldest_ready).max(),
        Some(Duration::from_secs(2))
    );
}

#[test]
fn each_controller_retries_at_the_share_of_its_rate_that_the_served_shards_are() {
    let mut q = Queue::new(
        QueueConfig {
            shard_count: 4,
            ..QueueConfig::default()
        },
        &CONTROLLERS,
        SequentialLeaseIds::default(),
    );
    let full = RateLimit {
        qps: 10.0,
        burst: 100,
    };
    q.set_rate_limit(
        CONTROLLERS[1],
        RateLimit {
            qps: 40.0,
            burst: 8,
        },
    )
    .unwrap();
    // A limit for a name not known yet makes it known, with its own limit.
    q.set_rate_limit("example.com/v1/Later", RateLimit { qps: 8.0, burst: 4 })
        .unwrap();
    q.acquire(0, 1, Instant::now());
    assert_eq!(
        q.rate_limit("example.com/v1/Later"),
        Some(RateLimit { qps: 2.0, burst: 1 })
    );
    assert_eq!(q.rate_limit("example.com/v1/Unknown"), None);
    let quarter = |limit: RateLimit| RateLimit {
        qps: limit.qps / 4.0,
        burst: limit.burst / 4,
    };
    assert_eq!(q.rate_limit(CONTROLLERS[0]), Some(quarter(full)));
    assert_eq!(
        q.rate_limit(CONTROLLERS[1]),
        Some(RateLimit {
            qps: 10.0,
            burst: 2
        })
    );
    for shard in 1..4 {
        q.acquire(shard, 1, Instant::now());
    }
    assert_eq!(q.rate_limit(CONTROLLERS[0]), Some(full));
    q.drain(3);
    q.release(2);
    assert_eq!(
        q.rate_limit(CONTROLLERS[0]),
        Some(RateLimit {
            qps: 5.0,
            burst: 50
        })
    );
}

#[test]
fn a_lease_carries_its_shards_read_floor_until_the_shard_moves() {
    let (mut q, now) = queue();
    let a = key("a");
    q.add(&a, Priority::Normal, Duration::ZERO, now).unwrap();
    let first = lease(&mut q, now).unwrap();
    assert!(first.read_floor.is_empty());
    assert_eq!(q.lease_key(first.id), Some(&a));
    q.complete(W, first.shard(), 7, first.id, Outcome::Done, now)
        .unwrap();
    q.raise_floor(
        first.shard(),
        "default",
        &ReadFloor::from_pairs(&[("v1/Pod", 40), (RS, 12)], &[("v1/Pod", 40)]),
    );

    // Another key of the same shard reads at least there too; one of another namespace
    // reads at the kinds' floor only.
    let spaces = KeySpace::new(&CONTROLLERS, 4);
    let b = (0..)
        .map(|i| key(&format!("b{i}")))
        .find(|k| k.shard() == a.shard())
        .unwrap();
    let c = (0..)
        .map(|i| {
            spaces
                .validate_parts(RS, "other", &format!("c{i}"))
                .unwrap()
        })
        .find(|k| k.shard() == a.shard())
        .unwrap();
    for (key, namespace) in [(&b, &[("v1/Pod", 40)][..]), (&c, &[])] {
        q.add(key, Priority::Normal, Duration::ZERO, now).unwrap();
        let leased = lease(&mut q, now).unwrap();
        assert_eq!(
            leased.read_floor,
            ReadFloor::from_pairs(&[(RS, 12), ("v1/Pod", 40)], namespace)
        );
        q.complete(W, leased.shard(), 7, leased.id, Outcome::Done, now)
            .unwrap();
    }

    // A shard taken at a new epoch starts without a floor; a shard not served takes none.
    q.acquire(a.shard(), 8, now);
    q.add(&a, Priority::Normal, Duration::ZERO, now).unwrap();
    assert!(lease(&mut q, now).unwrap().read_floor.is_empty());
    q.release(a.shard());
    q.raise_floor(
        a.shard(),
        "default",
        &ReadFloor::from_pairs(&[("v1/Pod", 50)], &[]),
    );
    q.acquire(a.shard(), 9, now);
    q.add(&a, Priority::Normal, Duration::ZERO, now).unwrap();
    assert!(lease(&mut q, now).unwrap().read_floor.is_empty());
}

/// A lease says how long its shard has been served at its epoch, counted from the take; a
/// shard taken again at a new epoch counts from then, the same epoch again changes nothing.
#[test]
fn a_lease_says_how_long_its_shard_has_been_held() {
    let (mut q, start) = queue();
    let a = key("a");
    let leased_at = |q: &mut Queue, at: Instant| {
        q.add(&a, Priority::Normal, Duration::ZERO, at).unwrap();
        let leased = lease(q, at).unwrap();
        q.complete(
            W,
            leased.shard(),
            leased.epoch,
            leased.id,
            Outcome::Done,
            at,
        )
        .unwrap();
        leased.shard_held_for
    };
    assert_eq!(leased_at(&mut q, start), Duration::ZERO);
    let later = start + Duration::from_secs(3);
    assert_eq!(leased_at(&mut q, later), Duration::from_secs(3));
    q.acquire(a.shard(), 7, later);
    let after = later + Duration::from_secs(1);
    assert_eq!(leased_at(&mut q, after), Duration::from_secs(4));
    q.drain(a.shard());
    q.release(a.shard());
    q.acquire(a.shard(), 8, later);
    assert_eq!(leased_at(&mut q, after), Duration::from_secs(1));
}

#[test]
fn a_controller_named_after_start_is_queued_leased_and_counted() {
    let (mut q, now) = queue();
    let later = "example.com/v1/Later";
    // The edge validates with a clone of the key space, which makes the name known.
    let key = q
        .key_space()
        .clone()
        .validate_parts(later, "default", "a")
        .unwrap();
    assert_eq!(key.controller(), 2);
    assert_eq!(
        q.add(&key, Priority::Normal, Duration::ZERO, now),
        Ok(AddOutcome::Added)
    );
    assert!(q.contains(&key));
    let stats = q.stats(now);
    assert_eq!(
        stats
            .iter()
            .filter(|s| s.controller == 2)
            .map(|s| s.depth)
            .sum::<u64>(),
        1
    );
    // A worker of the new controller only gets its key; it retries with the default limit.
    let leased = q.lease(W, &[2], now).unwrap();
    assert_eq!(leased.key, key);
    q.complete(W, leased.shard(), 7, leased.id, Outcome::Failed, now)
        .unwrap();
    assert!(q.rate_limit(later).is_some());
    // A name known but without keys yet shows in the figures, empty.
    q.key_space().intern("example.com/v1/Idle").unwrap();
    let idle: Vec<_> = q
        .stats(now)
        .into_iter()
        .filter(|s| s.controller == 3)
        .collect();
    assert_eq!(idle.len(), 4, "one entry per served shard");
    assert!(idle.iter().all(|s| s.depth == 0 && s.in_flight == 0));
}

#[test]
fn leases_expire_on_time_when_the_deadline_heap_sheds_stale_deadlines() {
    let mut q = Queue::new(
        QueueConfig {
            shard_count: 4,
            lease_timeout: Duration::from_secs(10),
            capacity: 4 * lease::STALE_DEADLINES,
            max_controllers: 4,
            backoff: BackoffConfig {
                qps: 0.0,
                ..Default::default()
            },
        },
        &CONTROLLERS,
        SequentialLeaseIds::default(),
    );
    let now = Instant::now();
    for shard in 0..4 {
        q.acquire(shard, 7, now);
    }
    q.add(&key("kept"), Priority::Normal, Duration::ZERO, now)
        .unwrap();
    let kept = lease(&mut q, now).unwrap();
    q.add(&key("extended"), Priority::Normal, Duration::ZERO, now)
        .unwrap();
    let extended = lease(&mut q, now).unwrap();
    q.extend(
        W,
        extended.shard(),
        extended.epoch,
        extended.id,
        Duration::from_secs(30),
        now,
    )
    .unwrap();
    // Leases answered at once leave only stale deadlines behind.
    for i in 0..3 * lease::STALE_DEADLINES {
        q.add(
            &key(&format!("k{i}")),
            Priority::Normal,
            Duration::ZERO,
            now,
        )
        .unwrap();
        let l = lease(&mut q, now).unwrap();
        q.complete(W, l.shard(), l.epoch, l.id, Outcome::Done, now)
            .unwrap();
    }
    assert!(q.lease_deadlines.len() <= 2 * q.in_flight() + lease::STALE_DEADLINES + 1);
    // The two live leases still expire, each at its own deadline and not before.
    assert!(
        q.advance(kept.deadline - Duration::from_millis(1))
            .is_empty()
    );
    assert_eq!(
        q.advance(kept.deadline),
        vec![(kept.controller(), kept.shard())]
    );
    assert!(q.advance(now + Duration::from_secs(29)).is_empty());
    assert_eq!(
        q.advance(now + Duration::from_secs(30)),
        vec![(extended.controller(), extended.shard())]
    );
    assert_eq!(q.in_flight(), 0);
}
