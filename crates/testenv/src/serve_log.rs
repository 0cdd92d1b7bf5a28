//! What a queue replica's JSON log says it served: the lines "serving shard", "stopped
//! serving shard" and "shards released", read back as intervals per shard, for the tests
//! that check no two replicas served one shard at once.

use std::{collections::HashMap, time::SystemTime};

/// A replica's serve intervals per shard, from its JSON log; a shard still served is open
/// until `end`.
pub fn serve_intervals(log: &str, end: SystemTime) -> HashMap<u32, Vec<(SystemTime, SystemTime)>> {
    let mut open: HashMap<u32, SystemTime> = HashMap::new();
    let mut done: HashMap<u32, Vec<(SystemTime, SystemTime)>> = HashMap::new();
    for line in log.lines() {
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let Some(at) = entry["timestamp"]
            .as_str()
            .and_then(|t| humantime::parse_rfc3339(t).ok())
        else {
            continue;
        };
        let shard = entry["shard"].as_u64().map(|s| s as u32);
        match (entry["message"].as_str(), shard) {
            (Some("serving shard"), Some(shard)) => {
                open.entry(shard).or_insert(at);
            }
            (Some("stopped serving shard"), Some(shard)) => {
                if let Some(start) = open.remove(&shard) {
                    done.entry(shard).or_default().push((start, at));
                }
            }
            // Shutdown hands every shard back at once.
            (Some("shards released"), None) => {
                for (shard, start) in open.drain() {
                    done.entry(shard).or_default().push((start, at));
                }
            }
            _ => {}
        }
    }
    for (shard, start) in open {
        done.entry(shard).or_default().push((start, end));
    }
    done
}
