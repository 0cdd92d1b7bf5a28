//! The token bucket that bounds a worker's apiserver calls (client-go's `--kube-api-qps` and
//! `--kube-api-burst`). Pure: the caller passes `now` and sleeps for the wait it is given.

use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens refilled at `qps` per second. `qps` must be positive
    /// and `burst` at least 1 (the service validates its flags).
    pub fn new(qps: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes a token if one is available; otherwise how long until one is.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.last = now.max(self.last);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_qps() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(10.0, 3, start);
        for _ in 0..3 {
            assert_eq!(bucket.try_take(start), Ok(()));
        }
        let wait = bucket.try_take(start).unwrap_err();
        assert!(wait > Duration::from_millis(99) && wait <= Duration::from_millis(100));
        assert_eq!(bucket.try_take(start + Duration::from_millis(100)), Ok(()));
        assert!(bucket.try_take(start + Duration::from_millis(150)).is_err());
        // A long idle time refills to the burst, not beyond.
        let later = start + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(bucket.try_take(later), Ok(()));
        }
        assert!(bucket.try_take(later).is_err());
    }

    #[test]
    fn over_one_second_at_most_burst_plus_qps_calls_pass() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(20.0, 5, start);
        let passed = (0..1000)
            .filter(|i| bucket.try_take(start + Duration::from_millis(*i)).is_ok())
            .count();
        assert!((24..=25).contains(&passed), "{passed}");
    }
}
