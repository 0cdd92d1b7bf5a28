use std::time::Duration;

use crate::Drain;

/// The delay between attempts to reach a dependency (apiserver, etcd): doubles from a first
/// delay up to a cap, and gives way to shutdown.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Self {
        Self { next: first, max }
    }

    /// The delay the next [`Self::wait`] sleeps.
    pub fn current(&self) -> Duration {
        self.next
    }

    /// Sleeps for the current delay, then doubles it. False when shutdown began instead.
    pub async fn wait(&mut self, drain: &Drain) -> bool {
        let slept = tokio::select! {
            _ = tokio::time::sleep(self.next) => true,
            _ = drain.clone().signaled() => false,
        };
        self.next = (self.next * 2).min(self.max);
        slept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn doubles_up_to_the_cap_and_yields_to_shutdown() {
        let (shutdown, drain) = crate::drain_channel();
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(1));
        let mut delays = Vec::new();
        for _ in 0..5 {
            delays.push(backoff.current());
            assert!(backoff.wait(&drain).await);
        }
        assert_eq!(
            delays,
            [200, 400, 800, 1000, 1000].map(Duration::from_millis)
        );
        shutdown.trigger();
        assert!(!backoff.wait(&drain).await);
    }
}
