//! Every Switchyard service of the soak as a process, by name: started, killed and started
//! again, with what the queues leave behind (their logs, their adds).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Duration, SystemTime},
};

use switchyard_proto::queue::v1::{StatsRequest, queue_client::QueueClient};
use switchyard_runtime::Role;
use switchyard_testenv::{NetNs, Pki, ServiceProcess};
pub(crate) use switchyard_tests::fleet::Spec;

use super::{SHARDS, serving::ServeLog};

/// Every service process, by name, and what the queues left behind.
pub(crate) struct Fleet {
    pub(crate) specs: BTreeMap<String, Spec>,
    pub(crate) running: BTreeMap<String, ServiceProcess>,
    pub(crate) netns: NetNs,
    pub(crate) serve_logs: Vec<ServeLog>,
    pub(crate) frozen: HashMap<String, Vec<(SystemTime, SystemTime)>>,
    /// `workqueue_adds_total` of each running queue at its last scrape, and of ended ones.
    pub(crate) adds: HashMap<String, f64>,
    pub(crate) adds_ended: f64,
}

impl Fleet {
    pub(crate) async fn start(&mut self, name: &str) {
        let process = self.specs[name].start_in(Some(&self.netns)).await;
        self.running.insert(name.to_owned(), process);
    }

    pub(crate) fn names(&self, prefix: &str) -> Vec<String> {
        self.specs
            .keys()
            .filter(|n| n.starts_with(prefix))
            .cloned()
            .collect()
    }

    pub(crate) async fn scrape_adds(&mut self, name: &str) {
        let Some(process) = self.running.get(name) else {
            return;
        };
        if let Ok((200, text)) = process.admin_get("/metrics").await {
            let adds = sum_of(&text, "workqueue_adds_total");
            self.adds.insert(name.to_owned(), adds);
        }
    }

    /// SIGKILL; a queue's log is kept for the double-serving check.
    pub(crate) async fn kill(&mut self, name: &str) {
        if name.starts_with("queue") {
            self.scrape_adds(name).await;
        }
        let process = self.running.remove(name).unwrap();
        // The signal goes out first thing: a process killed serves nothing after it, and
        // waiting for its exit would stretch its intervals past the others' takeover.
        let end = SystemTime::now();
        let log = process.kill();
        self.ended(name, log, end);
    }

    pub(crate) fn ended(&mut self, name: &str, log: String, end: SystemTime) {
        if name.starts_with("queue") {
            self.adds_ended += self.adds.remove(name).unwrap_or(0.0);
            self.serve_logs.push(ServeLog {
                log,
                end,
                frozen: self.frozen.remove(name).unwrap_or_default(),
            });
        }
    }

    /// The last warnings and errors in every running process's log.
    pub(crate) fn warnings(&self) -> String {
        let mut out = String::new();
        for (name, process) in &self.running {
            let log = process.log();
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .collect();
            let tail = &lines[lines.len().saturating_sub(8)..];
            out += &format!("--- {name}\n{}\n", tail.join("\n"));
        }
        out
    }

    /// Whether the queue replicas (but `skip`) together serve every shard exactly once.
    pub(crate) async fn all_served(&self, skip: Option<&str>) -> bool {
        let mut owners: HashMap<u32, usize> = HashMap::new();
        for (name, process) in &self.running {
            if !name.starts_with("queue") || Some(name.as_str()) == skip {
                continue;
            }
            let Some(shards) = served(process).await else {
                return false;
            };
            for shard in shards {
                *owners.entry(shard).or_default() += 1;
            }
        }
        owners.len() == SHARDS as usize && owners.values().all(|n| *n == 1)
    }

    pub(crate) async fn an_elector_leads(&self) -> bool {
        for (name, process) in &self.running {
            if name.starts_with("elector")
                && let Ok((200, text)) = process.admin_get("/metrics").await
                && sum_of(&text, "switchyard_elector_leader") == 1.0
            {
                return true;
            }
        }
        false
    }
}

/// The shards a queue replica serves, from its Stats; `None` if it does not answer at once.
pub(crate) async fn served(process: &ServiceProcess) -> Option<BTreeSet<u32>> {
    let ask = async {
        let channel = Pki::shared()
            .channel(Role::Observer, Role::Queue, process.grpc_addr())
            .await
            .ok()?;
        let stats = QueueClient::new(channel)
            .stats(StatsRequest::default())
            .await
            .ok()?
            .into_inner();
        // One entry per shard and controller.
        let shards: BTreeSet<u32> = stats.shards.iter().map(|s| s.shard).collect();
        Some(shards)
    };
    tokio::time::timeout(Duration::from_secs(1), ask)
        .await
        .ok()
        .flatten()
}

/// The sum of every sample of `family` in an exposition.
pub(crate) fn sum_of(exposition: &str, family: &str) -> f64 {
    exposition
        .lines()
        .filter(|l| {
            l.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}
