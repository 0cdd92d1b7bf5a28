//! The delay between attempts to reach a dependency (apiserver, etcd, another service):
//! exponential from a first delay up to a cap, each delay with random jitter (backon's
//! exponential backoff), so that replicas cut off by one outage do not all come back in
//! step.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

use crate::Drain;

/// Doubles from `first` up to `max`; each delay is stretched by a random part of itself
/// (a delay `d` sleeps somewhere in `[d, 2d)`).
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
    next: Duration,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Self {
        let builder = ExponentialBuilder::default()
            .with_min_delay(first)
            .with_max_delay(max)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        let mut delays = builder.build();
        let next = delays.next().unwrap_or(max);
        Self {
            builder,
            delays,
            next,
        }
    }

    /// The delay the next [`Self::wait`] sleeps.
    pub fn current(&self) -> Duration {
        self.next
    }

    /// Returns the current delay and moves on to the next, for a caller that sleeps itself.
    pub fn advance(&mut self) -> Duration {
        let delay = self.next;
        self.next = self.delays.next().unwrap_or(delay);
        delay
    }

    /// Back to the first delay, after a success.
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
        self.next = self.delays.next().unwrap_or(self.next);
    }

    /// Sleeps for the current delay, then moves on to the next. False when shutdown began
    /// instead.
    pub async fn wait(&mut self, drain: &Drain) -> bool {
        let delay = self.advance();
        tokio::select! {
            _ = tokio::time::sleep(delay) => true,
            _ = drain.clone().signaled() => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn doubles_up_to_the_cap_with_jitter_and_yields_to_shutdown() {
        let (shutdown, drain) = crate::drain_channel();
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(1));
        let mut delays = Vec::new();
        for _ in 0..6 {
            delays.push(backoff.current());
            assert!(backoff.wait(&drain).await);
        }
        for (delay, base) in delays.iter().zip([200, 400, 800, 1000, 1000, 1000]) {
            let base = Duration::from_millis(base);
            assert!(
                *delay >= base && *delay < base * 2,
                "{delay:?} is {base:?} plus less than itself"
            );
        }
        backoff.reset();
        assert!(backoff.current() < Duration::from_millis(400));
        shutdown.trigger();
        assert!(!backoff.wait(&drain).await);
    }

    #[test]
    fn replicas_do_not_retry_in_step() {
        let sequence = || {
            let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
            (0..8).map(|_| backoff.advance()).collect::<Vec<_>>()
        };
        // Ten replicas cut off at the same moment: their retries spread out.
        let first: Vec<Vec<Duration>> = (0..10).map(|_| sequence()).collect();
        let distinct = first
            .iter()
            .map(|s| s[0])
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        assert!(distinct >= 9, "first retries of ten replicas: {first:?}");
    }
}
