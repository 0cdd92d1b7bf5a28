//! The soak's invariants on the Deployments, from watches on Pods, ReplicaSets and
//! Deployments: surge (ReplicaSets sized, and Pods active, above replicas + maxSurge) and
//! unavailability (fewer ready Pods than replicas - maxUnavailable once settled).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Instant,
};

use futures::StreamExt;
use switchyard_k8s::{
    Api, Deployment, Pod, ReplicaSet,
    kube::{
        Client,
        runtime::{WatchStreamExt, watcher},
    },
};

use switchyard_tests::fleet::{controller_name, is_active};

use super::{MAX_SURGE, MAX_UNAVAILABLE};

/// What the workload last asked of one Deployment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tracked {
    pub(crate) replicas: i32,
    /// Replicas the surge bound allows for: after a scale-down, the old count until the
    /// Deployment settles at the new one (Pods of the old size may still be made meanwhile,
    /// before the controllers see the write).
    pub(crate) allowance: i32,
    /// Whether the Deployment settled at its size since the last scale (a scale-down in
    /// flight may take a Deployment scaled up again below the bound: that is no rollout).
    pub(crate) armed: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct PodState {
    pub(crate) app: String,
    /// Its controller ReplicaSet.
    pub(crate) owner: String,
    pub(crate) ready: bool,
}

pub(crate) struct Invariants {
    pub(crate) begin: Instant,
    pub(crate) deployments: HashMap<String, Tracked>,
    /// Active Pods (not terminating, not finished) by uid.
    pub(crate) pods: HashMap<String, PodState>,
    pub(crate) relist: Option<HashMap<String, PodState>>,
    /// `spec.replicas` of every ReplicaSet, by uid, with its Deployment's name.
    pub(crate) sets: HashMap<String, (String, i32)>,
    pub(crate) sets_relist: Option<HashMap<String, (String, i32)>>,
    pub(crate) samples: u64,
    /// ReplicaSets of one Deployment sized above its replicas + maxSurge together: what the
    /// Deployment controller promises (kube-controller-manager sizes them so).
    pub(crate) surge_violations: u64,
    /// Active Pods of one Deployment above its replicas + maxSurge: transient under
    /// kube-controller-manager too (a scaled-down ReplicaSet's Pods go after the other's
    /// are made), so counted, not asserted.
    pub(crate) pod_surge_samples: u64,
    pub(crate) unavailable_violations: u64,
    pub(crate) first_violations: Vec<String>,
    /// What the workload did to each Deployment, and when: printed beside a violation.
    pub(crate) history: HashMap<String, Vec<String>>,
}

impl Invariants {
    pub(crate) fn note(&mut self, name: &str, what: &str) {
        let at = self.begin.elapsed().as_secs_f64();
        self.history
            .entry(name.to_owned())
            .or_default()
            .push(format!("{at:.2}s {what}"));
    }

    /// The workload is about to set `name`'s replicas (a new Deployment too).
    pub(crate) fn scaling(&mut self, name: &str, replicas: i32) {
        let tracked = self.deployments.entry(name.to_owned()).or_insert(Tracked {
            replicas,
            allowance: replicas,
            armed: false,
        });
        tracked.armed = false;
        tracked.allowance = tracked.allowance.max(replicas);
        tracked.replicas = replicas;
    }

    pub(crate) fn forget(&mut self, name: &str) {
        self.deployments.remove(name);
    }

    pub(crate) fn apply(&mut self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let app = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app"))
            .cloned()
            .unwrap_or_default();
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let owner = controller_name(&pod.metadata).unwrap_or_default();
        let pods = self.relist.as_mut().unwrap_or(&mut self.pods);
        if is_active(pod) {
            pods.insert(uid, PodState { app, owner, ready });
        } else {
            pods.remove(&uid);
        }
    }

    /// A Deployment whose status shows it done at its current size arms the maxUnavailable
    /// bound and drops the surge allowance to its size.
    pub(crate) fn deployment(&mut self, deployment: &Deployment) {
        let Some(tracked) = deployment
            .metadata
            .name
            .as_ref()
            .and_then(|n| self.deployments.get_mut(n))
        else {
            return;
        };
        let want = deployment.spec.as_ref().and_then(|s| s.replicas);
        let status = deployment.status.clone().unwrap_or_default();
        if want == Some(tracked.replicas)
            && status.observed_generation >= deployment.metadata.generation
            && status.updated_replicas == want
            && status.available_replicas == want
            && status.replicas == want
        {
            tracked.armed = true;
            tracked.allowance = tracked.replicas;
        }
    }

    pub(crate) fn check(&mut self, app: &str) {
        let Some(tracked) = self.deployments.get_mut(app) else {
            return;
        };
        let (mut active, mut ready) = (0, 0);
        for pod in self.pods.values().filter(|p| p.app == app) {
            active += 1;
            ready += i32::from(pod.ready);
        }
        self.samples += 1;
        let sized: i32 = self
            .sets
            .values()
            .filter(|(owner, _)| owner == app)
            .map(|(_, replicas)| replicas)
            .sum();
        let mut violation = None;
        if sized > tracked.allowance + MAX_SURGE {
            self.surge_violations += 1;
            violation = Some("surge");
        }
        if active > tracked.allowance + MAX_SURGE {
            self.pod_surge_samples += 1;
            violation = violation.or(Some("pod surge"));
        }
        if tracked.armed && ready < tracked.replicas - MAX_UNAVAILABLE {
            self.unavailable_violations += 1;
            violation = Some("unavailable");
        }
        if let Some(kind) = violation
            && self.first_violations.len() < 10
        {
            let mut owners: BTreeMap<&str, usize> = BTreeMap::new();
            for pod in self.pods.values().filter(|p| p.app == app) {
                *owners.entry(pod.owner.as_str()).or_default() += 1;
            }
            self.first_violations.push(format!(
                "{:.2}s {kind}: {app} had ReplicaSets of {sized}, {active} active, {ready} ready Pods {owners:?} with {tracked:?}; {:?}",
                self.begin.elapsed().as_secs_f64(),
                self.history.get(app)
            ));
        }
    }

    pub(crate) fn replica_set(&mut self, rs: &ReplicaSet) {
        let owner = controller_name(&rs.metadata).unwrap_or_default();
        let replicas = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let sets = self.sets_relist.as_mut().unwrap_or(&mut self.sets);
        sets.insert(
            rs.metadata.uid.clone().unwrap_or_default(),
            (owner.clone(), replicas),
        );
        if self.sets_relist.is_none() {
            self.check(&owner);
        }
    }

    pub(crate) fn check_all(&mut self) {
        let apps: Vec<String> = self.deployments.keys().cloned().collect();
        for app in apps {
            self.check(&app);
        }
    }
}

pub(crate) fn watch_invariants(
    client: Client,
    namespace: &str,
    begin: Instant,
) -> Arc<Mutex<Invariants>> {
    let invariants = Arc::new(Mutex::new(Invariants {
        begin,
        deployments: HashMap::new(),
        pods: HashMap::new(),
        relist: None,
        sets: HashMap::new(),
        sets_relist: None,
        samples: 0,
        surge_violations: 0,
        pod_surge_samples: 0,
        unavailable_violations: 0,
        first_violations: Vec::new(),
        history: HashMap::new(),
    }));
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
    let deployments: Api<Deployment> = Api::namespaced(client, namespace);
    let seen = invariants.clone();
    tokio::spawn(async move {
        // Errors (the apiserver restarting) are retried with backoff; the streams never end.
        let pods = watcher(pods, watcher::Config::default())
            .default_backoff()
            .map(|e| e.map(Seen::Pod));
        let deployments = watcher(deployments, watcher::Config::default())
            .default_backoff()
            .map(|e| e.map(Seen::Deployment));
        let sets = watcher(sets, watcher::Config::default())
            .default_backoff()
            .map(|e| e.map(Seen::ReplicaSet));
        let mut events =
            futures::stream::select(pods, futures::stream::select(deployments, sets)).boxed();
        while let Some(event) = events.next().await {
            let Ok(event) = event else { continue };
            let mut seen = seen.lock().unwrap();
            match event {
                Seen::Deployment(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) => {
                    seen.deployment(&d)
                }
                Seen::Deployment(_) => {}
                Seen::ReplicaSet(watcher::Event::Init) => seen.sets_relist = Some(HashMap::new()),
                Seen::ReplicaSet(watcher::Event::InitApply(rs) | watcher::Event::Apply(rs)) => {
                    seen.replica_set(&rs);
                }
                Seen::ReplicaSet(watcher::Event::InitDone) => {
                    if let Some(sets) = seen.sets_relist.take() {
                        seen.sets = sets;
                    }
                    seen.check_all();
                }
                Seen::ReplicaSet(watcher::Event::Delete(rs)) => {
                    seen.sets
                        .remove(&rs.metadata.uid.clone().unwrap_or_default());
                }
                Seen::Pod(watcher::Event::Init) => seen.relist = Some(HashMap::new()),
                Seen::Pod(watcher::Event::InitApply(pod)) => seen.apply(&pod),
                Seen::Pod(watcher::Event::InitDone) => {
                    if let Some(pods) = seen.relist.take() {
                        seen.pods = pods;
                    }
                    seen.check_all();
                }
                Seen::Pod(watcher::Event::Apply(pod)) => {
                    seen.apply(&pod);
                    if let Some(app) = pod.metadata.labels.as_ref().and_then(|l| l.get("app")) {
                        seen.check(&app.clone());
                    }
                }
                Seen::Pod(watcher::Event::Delete(pod)) => {
                    seen.pods
                        .remove(&pod.metadata.uid.clone().unwrap_or_default());
                    if let Some(app) = pod.metadata.labels.as_ref().and_then(|l| l.get("app")) {
                        seen.check(&app.clone());
                    }
                }
            }
        }
    });
    invariants
}

pub(crate) enum Seen {
    Pod(watcher::Event<Pod>),
    Deployment(watcher::Event<Deployment>),
    ReplicaSet(watcher::Event<ReplicaSet>),
}
