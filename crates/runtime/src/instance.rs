//! Who this process is among the replicas of its service, when no flag says.
//!
//! In Kubernetes `HOSTNAME` is the pod name: unique among the replicas and stable for the
//! life of the pod. Outside a pod the process id stands in for it.

/// How unique a default id must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceScope {
    /// One id per pod: the host name, else `<prefix>-<pid>`. For ids that name a replica
    /// (a queue member, an elector candidate).
    Host,
    /// One id per process: `<host name, else prefix>-<pid>`. For ids of which one host may
    /// run several (reconciler workers).
    Process,
}

/// `explicit` (the flag) if given, else the default id of `scope` built from the host name
/// (`HOSTNAME`), `prefix` and this process's id.
pub fn instance_id(explicit: Option<String>, prefix: &str, scope: InstanceScope) -> String {
    explicit.unwrap_or_else(|| {
        default_id(
            std::env::var("HOSTNAME").ok(),
            prefix,
            std::process::id(),
            scope,
        )
    })
}

fn default_id(host: Option<String>, prefix: &str, pid: u32, scope: InstanceScope) -> String {
    match (scope, host) {
        (InstanceScope::Host, Some(host)) => host,
        (InstanceScope::Host, None) => format!("{prefix}-{pid}"),
        (InstanceScope::Process, host) => {
            format!("{}-{pid}", host.as_deref().unwrap_or(prefix))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_over_the_host_name() {
        for scope in [InstanceScope::Host, InstanceScope::Process] {
            assert_eq!(instance_id(Some("q7".into()), "queue", scope), "q7");
        }
    }

    #[test]
    fn defaults_name_the_pod_and_fall_back_to_the_process() {
        let pod = || Some("pod-0".to_owned());
        assert_eq!(default_id(pod(), "queue", 42, InstanceScope::Host), "pod-0");
        assert_eq!(
            default_id(None, "queue", 42, InstanceScope::Host),
            "queue-42"
        );
        assert_eq!(
            default_id(pod(), "reconciler", 42, InstanceScope::Process),
            "pod-0-42"
        );
        assert_eq!(
            default_id(None, "reconciler", 42, InstanceScope::Process),
            "reconciler-42"
        );
    }
}
