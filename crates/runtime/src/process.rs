//! The process's CPU time, memory and file descriptors, read from `/proc/self` at every
//! scrape, under the names every Prometheus client library gives them
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`), so that the
//! dashboard's CPU and memory panels and any existing ones work unchanged. Where `/proc` is
//! not Linux's, a figure that cannot be read is left out.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    registry::Unit,
};

/// The ticks per second of `/proc/<pid>/stat`'s CPU times: `USER_HZ`, which Linux fixes at
/// 100 for what it reports to user space (Prometheus' Go procfs assumes the same).
const USER_HZ: f64 = 100.0;

#[derive(Debug)]
pub(crate) struct ProcessCollector;

/// User plus system CPU seconds, from `/proc/self/stat` (fields 14 and 15, counted after the
/// command name, which may hold spaces and parentheses).
fn cpu_seconds(stat: &str) -> Option<f64> {
    let (_, after_name) = stat.rsplit_once(')')?;
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((user + system) as f64 / USER_HZ)
}

/// A `/proc/self/status` line's size in bytes (`VmRSS:   1234 kB`).
fn status_bytes(status: &str, key: &str) -> Option<i64> {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?;
    let mut parts = line.split_whitespace();
    let value: i64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// The soft limit on open files, from `/proc/self/limits`.
fn max_fds(limits: &str) -> Option<i64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn encode_gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: Option<i64>,
) -> Result<(), std::fmt::Error> {
    let Some(value) = value else {
        return Ok(());
    };
    let gauge = ConstGauge::new(value);
    let metric = encoder.encode_descriptor(name, help, unit, gauge.metric_type())?;
    gauge.encode(metric)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let read = |path| std::fs::read_to_string(path).ok();
        if let Some(seconds) = read("/proc/self/stat").as_deref().and_then(cpu_seconds) {
            let counter = ConstCounter::new(seconds);
            let metric = encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent",
                Some(&Unit::Seconds),
                counter.metric_type(),
            )?;
            counter.encode(metric)?;
        }
        let status = read("/proc/self/status").unwrap_or_default();
        encode_gauge(
            &mut encoder,
            "process_resident_memory",
            "Resident memory size",
            Some(&Unit::Bytes),
            status_bytes(&status, "VmRSS"),
        )?;
        encode_gauge(
            &mut encoder,
            "process_virtual_memory",
            "Virtual memory size",
            Some(&Unit::Bytes),
            status_bytes(&status, "VmSize"),
        )?;
        let open = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| i64::try_from(d.count()).unwrap_or(i64::MAX));
        encode_gauge(
            &mut encoder,
            "process_open_fds",
            "Open file descriptors",
            None,
            open,
        )?;
        encode_gauge(
            &mut encoder,
            "process_max_fds",
            "The limit on open file descriptors",
            None,
            read("/proc/self/limits").as_deref().and_then(max_fds),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_are_read_as_linux_writes_them() {
        // A command name with a space and a parenthesis; utime 250, stime 50 ticks.
        let stat = "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 2000 0 0 0 250 50 0 0 20 0 9 0 100 2000000 500";
        assert_eq!(cpu_seconds(stat), Some(3.0));
        assert_eq!(cpu_seconds("garbage"), None);
        let status = "Name:\tswitchyard\nVmSize:\t  204800 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(status_bytes(status, "VmRSS"), Some(10_485_760));
        assert_eq!(status_bytes(status, "VmSize"), Some(209_715_200));
        assert_eq!(status_bytes(status, "VmSwap"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax cpu time              unlimited            unlimited            seconds\nMax open files            1024                 524288               files\n";
        assert_eq!(max_fds(limits), Some(1024));
    }

    #[test]
    fn this_process_reports_its_figures() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for series in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
        ] {
            assert!(text.contains(series), "{series}missing from:\n{text}");
        }
    }
}
