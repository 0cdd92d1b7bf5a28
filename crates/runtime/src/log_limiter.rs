//! Log lines about callers, at most one a minute per caller, for a bounded number of callers.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

/// How often one caller's refusals are logged.
const LOG_EVERY: Duration = Duration::from_secs(60);
/// Callers remembered for that: far more than the Switchyard peers and probes that call a
/// service, few enough (a few hundred KiB) that callers without a certificate, known only by
/// their address, cannot grow a service's memory by using many addresses.
const LOG_MEMORY: usize = 4096;

/// Remembers when each caller was last logged, so that a caller retrying in a loop fills
/// the log with one line a minute, not one per call. It holds at most [`LOG_MEMORY`]
/// callers: when full, it forgets those logged over a minute ago, and if it is still full,
/// all of them (they may then be logged again sooner than once a minute).
#[derive(Debug, Default)]
pub(crate) struct LogLimiter(Mutex<HashMap<String, Instant>>);

impl LogLimiter {
    /// Whether `who` is due a log line now (and, if so, that it was logged).
    pub(crate) fn due(&self, who: String) -> bool {
        let now = Instant::now();
        let mut logged = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if logged.len() >= LOG_MEMORY && !logged.contains_key(&who) {
            logged.retain(|_, at| now.duration_since(*at) < LOG_EVERY);
            if logged.len() >= LOG_MEMORY {
                logged.clear();
            }
        }
        let due = logged
            .get(&who)
            .is_none_or(|at| now.duration_since(*at) >= LOG_EVERY);
        if due {
            logged.insert(who, now);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_limiter_remembers_a_bounded_number_of_callers() {
        let limiter = LogLimiter::default();
        // Callers without a certificate are remembered by address, which a client with many
        // addresses (an IPv6 prefix) chooses; within one minute none of them is stale.
        for i in 0..10 * LOG_MEMORY {
            assert!(
                limiter.due(format!("2001:db8::{i:x}")),
                "a new caller is logged"
            );
        }
        let remembered = limiter
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        assert!(
            remembered <= LOG_MEMORY,
            "{remembered} callers remembered, at most {LOG_MEMORY}"
        );
        // A caller just logged is not logged again at once.
        let last = format!("2001:db8::{:x}", 10 * LOG_MEMORY - 1);
        assert!(!limiter.due(last));
    }
}
