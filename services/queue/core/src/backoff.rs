//! client-go's default controller rate limiter: the maximum of a per-key exponential backoff
//! and a token bucket per controller (client-go keeps one per controller's work queue).

use std::time::{Duration, Instant};

#[derive(Clone, Debug, PartialEq)]
pub struct BackoffConfig {
    /// First retry delay of a key (client-go: 5 ms).
    pub base: Duration,
    /// Longest retry delay of a key (client-go: 1000 s).
    pub max: Duration,
    /// Retries per second of one controller's keys, cluster-wide; 0 turns the bucket off
    /// (client-go: 10 per controller).
    pub qps: f64,
    /// Retries of one controller allowed at once before its bucket paces them (client-go:
    /// 100).
    pub burst: u32,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(5),
            max: Duration::from_secs(1000),
            qps: 10.0,
            burst: 100,
        }
    }
}

/// A token bucket's rate and burst.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    /// Tokens per second; 0 turns the bucket off.
    pub qps: f64,
    /// Tokens held at most.
    pub burst: u32,
}

/// One controller's bucket, as client-go keeps one per controller's queue.
#[derive(Clone, Debug)]
struct Bucket {
    limit: RateLimit,
    tokens: f64,
    refilled_at: Option<Instant>,
}

/// The retry delays of one replica: per key exponential, per controller a token bucket.
///
/// The configured rate is cluster-wide, as client-go's is for the one active
/// kube-controller-manager: each replica applies the share of it that its shards are of all
/// shards ([`Self::set_share`]), so that the replicas together allow the configured rate and
/// burst whatever their number.
#[derive(Clone, Debug)]
pub struct Backoff {
    config: BackoffConfig,
    buckets: Vec<Bucket>,
    share: f64,
}

impl Backoff {
    /// Every one of `controllers` gets the configured rate and burst, at a share of 1.
    pub fn new(config: BackoffConfig, controllers: usize) -> Self {
        let limit = RateLimit {
            qps: config.qps,
            burst: config.burst,
        };
        Self {
            buckets: vec![
                Bucket {
                    limit,
                    tokens: f64::from(limit.burst),
                    refilled_at: None,
                };
                controllers
            ],
            config,
            share: 1.0,
        }
    }

    /// Gives controllers up to `controllers` (exclusive) the configured rate and burst, at
    /// this replica's share; those it has keep theirs.
    pub fn grow(&mut self, controllers: usize) {
        let limit = RateLimit {
            qps: self.config.qps,
            burst: self.config.burst,
        };
        let tokens = f64::from(limit.burst) * self.share;
        self.buckets.resize(
            controllers.max(self.buckets.len()),
            Bucket {
                limit,
                tokens,
                refilled_at: None,
            },
        );
    }

    /// `controller`'s own rate and burst, cluster-wide.
    pub fn set_limit(&mut self, controller: usize, limit: RateLimit) {
        if let Some(bucket) = self.buckets.get_mut(controller) {
            bucket.limit = limit;
            bucket.tokens = bucket.tokens.min(f64::from(limit.burst) * self.share);
        }
    }

    /// The part of all shards this replica serves (0 to 1): its part of every bucket's rate
    /// and burst. A replica serving nothing keeps its last share (it has no key to delay).
    pub fn set_share(&mut self, share: f64) {
        if share > 0.0 && share.is_finite() {
            self.share = share.min(1.0);
            for bucket in &mut self.buckets {
                bucket.tokens = bucket
                    .tokens
                    .min(f64::from(bucket.limit.burst) * self.share);
            }
        }
    }

    /// `controller`'s rate and burst on this replica: its share of the cluster-wide ones.
    pub fn effective(&self, controller: usize) -> Option<RateLimit> {
        self.buckets.get(controller).map(|b| RateLimit {
            qps: b.limit.qps * self.share,
            burst: (f64::from(b.limit.burst) * self.share).ceil() as u32,
        })
    }

    /// The delay before retry number `failures` (1 for the first failure) of one key of
    /// `controller`: the larger of `base * 2^(failures-1)` (capped at `max`) and the
    /// controller's bucket's wait. Like `rate.Limiter.Reserve`, taking a token may leave the
    /// bucket in debt.
    pub fn delay(&mut self, controller: usize, failures: u32, now: Instant) -> Duration {
        // Below 2^64 ns shifted by at most 63 bits: fits in u128.
        let exponent = failures.saturating_sub(1).min(63);
        let nanos = self.config.base.as_nanos() << exponent;
        let per_key = if nanos >= self.config.max.as_nanos() {
            self.config.max
        } else {
            Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
        };
        per_key.max(self.bucket_wait(controller, now))
    }

    fn bucket_wait(&mut self, controller: usize, now: Instant) -> Duration {
        let share = self.share;
        let Some(bucket) = self.buckets.get_mut(controller) else {
            return Duration::ZERO;
        };
        let qps = bucket.limit.qps * share;
        if qps <= 0.0 {
            return Duration::ZERO;
        }
        // At least one token, so that a replica with a small share can retry at all.
        let burst = (f64::from(bucket.limit.burst) * share).max(1.0);
        let elapsed = bucket
            .refilled_at
            .map_or(0.0, |at| now.saturating_duration_since(at).as_secs_f64());
        bucket.refilled_at = Some(now);
        bucket.tokens = (bucket.tokens + elapsed * qps).min(burst);
        bucket.tokens -= 1.0;
        if bucket.tokens >= 0.0 {
            Duration::ZERO
        } else {
            // A rate too slow for `Duration` waits as long as it can hold; the queue cuts
            // every delay to a week anyway.
            Duration::try_from_secs_f64(-bucket.tokens / qps).unwrap_or(Duration::MAX)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_key_backoff_doubles_from_5ms_to_1000s() {
        let mut b = Backoff::new(
            BackoffConfig {
                qps: 0.0,
                ..Default::default()
            },
            1,
        );
        let now = Instant::now();
        assert_eq!(b.delay(0, 1, now), Duration::from_millis(5));
        assert_eq!(b.delay(0, 2, now), Duration::from_millis(10));
        assert_eq!(b.delay(0, 11, now), Duration::from_millis(5 * 1024));
        assert_eq!(b.delay(0, 30, now), Duration::from_secs(1000));
        assert_eq!(b.delay(0, 200, now), Duration::from_secs(1000));
    }

    #[test]
    fn the_bucket_paces_retries_after_the_burst() {
        let mut b = Backoff::new(
            BackoffConfig {
                base: Duration::ZERO,
                burst: 2,
                qps: 10.0,
                ..Default::default()
            },
            1,
        );
        let now = Instant::now();
        assert_eq!(b.delay(0, 1, now), Duration::ZERO);
        assert_eq!(b.delay(0, 1, now), Duration::ZERO);
        assert_eq!(b.delay(0, 1, now), Duration::from_millis(100));
        assert_eq!(b.delay(0, 1, now), Duration::from_millis(200));
        // A second later the debt is paid and eight tokens are back (capped at the burst).
        assert_eq!(b.delay(0, 1, now + Duration::from_secs(1)), Duration::ZERO);
    }

    fn bucket_only(burst: u32, qps: f64, controllers: usize) -> Backoff {
        Backoff::new(
            BackoffConfig {
                base: Duration::ZERO,
                burst,
                qps,
                ..Default::default()
            },
            controllers,
        )
    }

    #[test]
    fn a_bucket_too_slow_for_any_clock_asks_for_the_longest_wait_without_panicking() {
        // 10^-300 retries a second is a valid --retry-qps: its wait is past `Duration`'s.
        let mut b = bucket_only(1, 1e-300, 1);
        let now = Instant::now();
        assert_eq!(b.delay(0, 1, now), Duration::ZERO);
        assert_eq!(b.delay(0, 1, now), Duration::MAX);
    }

    #[test]
    fn a_failing_controller_does_not_slow_the_others() {
        let mut b = bucket_only(2, 10.0, 2);
        let now = Instant::now();
        for _ in 0..2 {
            assert_eq!(b.delay(0, 1, now), Duration::ZERO);
        }
        assert_eq!(b.delay(0, 1, now), Duration::from_millis(100));
        // Controller 0 is in debt; controller 1 still has its whole burst.
        assert_eq!(b.delay(1, 1, now), Duration::ZERO);
        assert_eq!(b.delay(1, 1, now), Duration::ZERO);
        // Each controller's own limit.
        b.set_limit(
            1,
            RateLimit {
                qps: 100.0,
                burst: 2,
            },
        );
        assert_eq!(b.delay(1, 1, now), Duration::from_millis(10));
    }

    /// Replicas serving shares of the shards that add up to one allow, together, what one
    /// replica serving every shard allows: the cluster-wide rate of client-go.
    #[test]
    fn replicas_share_the_rate_by_the_shards_they_serve() {
        let retries_within = |shares: &[f64], window: Duration| {
            let now = Instant::now();
            shares
                .iter()
                .map(|&share| {
                    let mut b = bucket_only(100, 10.0, 1);
                    b.set_share(share);
                    (0..10_000)
                        .take_while(|_| b.delay(0, 1, now) < window)
                        .count()
                })
                .sum::<usize>()
        };
        let window = Duration::from_secs(10);
        // One replica: burst 100, then 10/s for 10 s (the 100th paced retry falls just
        // short of the window's end).
        let alone = retries_within(&[1.0], window);
        assert!((199..=201).contains(&alone), "{alone}");
        for shares in [&[0.5, 0.5][..], &[0.25, 0.25, 0.25, 0.25], &[0.75, 0.25]] {
            let together = retries_within(shares, window);
            assert!(
                together.abs_diff(alone) <= shares.len(),
                "{shares:?}: {together} retries against {alone} for one replica"
            );
        }
        let mut b = bucket_only(100, 10.0, 1);
        b.set_share(0.25);
        assert_eq!(
            b.effective(0),
            Some(RateLimit {
                qps: 2.5,
                burst: 25
            })
        );
    }
}
