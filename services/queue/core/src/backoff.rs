//! client-go's default controller rate limiter: the maximum of a per-key exponential backoff
//! and an overall token bucket.

use std::time::{Duration, Instant};

#[derive(Clone, Debug, PartialEq)]
pub struct BackoffConfig {
    /// First retry delay of a key (client-go: 5 ms).
    pub base: Duration,
    /// Longest retry delay of a key (client-go: 1000 s).
    pub max: Duration,
    /// Overall retries per second across every key; 0 turns the bucket off (client-go: 10).
    pub qps: f64,
    /// Retries allowed at once before the bucket paces them (client-go: 100).
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

/// The overall bucket: the state that is shared by every key of the queue.
#[derive(Clone, Debug)]
pub struct Backoff {
    config: BackoffConfig,
    tokens: f64,
    refilled_at: Option<Instant>,
}

impl Backoff {
    pub fn new(config: BackoffConfig) -> Self {
        Self {
            tokens: f64::from(config.burst),
            config,
            refilled_at: None,
        }
    }

    /// The delay before retry number `failures` (1 for the first failure) of one key: the
    /// larger of `base * 2^(failures-1)` (capped at `max`) and the bucket's wait. Like
    /// `rate.Limiter.Reserve`, taking a token may leave the bucket in debt.
    pub fn delay(&mut self, failures: u32, now: Instant) -> Duration {
        // Below 2^64 ns shifted by at most 63 bits: fits in u128.
        let exponent = failures.saturating_sub(1).min(63);
        let nanos = self.config.base.as_nanos() << exponent;
        let per_key = if nanos >= self.config.max.as_nanos() {
            self.config.max
        } else {
            Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
        };
        per_key.max(self.bucket_wait(now))
    }

    fn bucket_wait(&mut self, now: Instant) -> Duration {
        let qps = self.config.qps;
        if qps <= 0.0 {
            return Duration::ZERO;
        }
        let elapsed = self
            .refilled_at
            .map_or(0.0, |at| now.saturating_duration_since(at).as_secs_f64());
        self.refilled_at = Some(now);
        self.tokens = (self.tokens + elapsed * qps).min(f64::from(self.config.burst));
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / qps)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_key_backoff_doubles_from_5ms_to_1000s() {
        let mut b = Backoff::new(BackoffConfig {
            qps: 0.0,
            ..Default::default()
        });
        let now = Instant::now();
        assert_eq!(b.delay(1, now), Duration::from_millis(5));
        assert_eq!(b.delay(2, now), Duration::from_millis(10));
        assert_eq!(b.delay(11, now), Duration::from_millis(5 * 1024));
        assert_eq!(b.delay(30, now), Duration::from_secs(1000));
        assert_eq!(b.delay(200, now), Duration::from_secs(1000));
    }

    #[test]
    fn the_bucket_paces_retries_after_the_burst() {
        let mut b = Backoff::new(BackoffConfig {
            base: Duration::ZERO,
            burst: 2,
            qps: 10.0,
            ..Default::default()
        });
        let now = Instant::now();
        assert_eq!(b.delay(1, now), Duration::ZERO);
        assert_eq!(b.delay(1, now), Duration::ZERO);
        assert_eq!(b.delay(1, now), Duration::from_millis(100));
        assert_eq!(b.delay(1, now), Duration::from_millis(200));
        // A second later the debt is paid and eight tokens are back (capped at the burst).
        assert_eq!(b.delay(1, now + Duration::from_secs(1)), Duration::ZERO);
    }
}
