//! Whether two queue replicas served one shard at once, from the serve intervals in their
//! JSON logs ("serving shard", "stopped serving shard", "shards released").

use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use switchyard_testenv::serve_intervals;

/// Log timestamps are taken just after a shard is acquired and just after it is released.
pub(crate) const CLOCK_MARGIN: Duration = Duration::from_millis(5);

/// A queue replica's log once it ended, with the windows in which it was frozen (a frozen
/// process runs no code, so it serves nothing whatever its log says).
pub(crate) struct ServeLog {
    pub(crate) log: String,
    pub(crate) end: SystemTime,
    pub(crate) frozen: Vec<(SystemTime, SystemTime)>,
}

/// A replica's serve intervals per shard, from its JSON log, with the frozen windows taken
/// out; a shard still served is open until `end`.
pub(crate) fn intervals(log: &ServeLog) -> HashMap<u32, Vec<(SystemTime, SystemTime)>> {
    let mut done = serve_intervals(&log.log, log.end);
    for spans in done.values_mut() {
        for &(from, to) in &log.frozen {
            *spans = spans
                .iter()
                .flat_map(|&(start, end)| {
                    let before = (start, end.min(from));
                    let after = (start.max(to), end);
                    [before, after].into_iter().filter(|(s, e)| s < e)
                })
                .collect();
        }
    }
    done
}

/// How long, summed over shards, two replicas served one shard at once (overlaps within the
/// log clock margin aside), and the first overlaps seen.
pub(crate) fn double_served(logs: &[ServeLog]) -> Overlaps {
    let mut by_shard: HashMap<u32, Vec<(SystemTime, SystemTime)>> = HashMap::new();
    for log in logs {
        for (shard, spans) in intervals(log) {
            by_shard.entry(shard).or_default().extend(spans);
        }
    }
    let resumed: Vec<SystemTime> = logs
        .iter()
        .flat_map(|l| l.frozen.iter().map(|(_, to)| *to))
        .collect();
    let mut overlaps = Overlaps::default();
    for (shard, spans) in &mut by_shard {
        spans.sort();
        let mut reach = SystemTime::UNIX_EPOCH;
        for &(start, end) in spans.iter() {
            let overlap = end.min(reach).duration_since(start).unwrap_or_default();
            if resumed.contains(&start) {
                overlaps.after_resume = overlaps.after_resume.max(overlap);
            } else if overlap > CLOCK_MARGIN {
                overlaps.total += overlap;
                if overlaps.first.len() < 10 {
                    overlaps
                        .first
                        .push(format!("shard {shard}: {overlap:?} from {start:?}"));
                }
            } else {
                overlaps.within_margin = overlaps.within_margin.max(overlap);
            }
            reach = reach.max(end);
        }
    }
    overlaps
}

#[derive(Default)]
pub(crate) struct Overlaps {
    /// Two replicas serving one shard at once, summed over shards.
    pub(crate) total: Duration,
    /// The longest overlap no longer than the log clock margin (not counted).
    pub(crate) within_margin: Duration,
    /// The longest a replica, just woken from SIGSTOP, logged a shard as still served while
    /// another served it: an upper bound (the log line is written once the woken process
    /// gets to it), counted apart.
    pub(crate) after_resume: Duration,
    pub(crate) first: Vec<String>,
}
