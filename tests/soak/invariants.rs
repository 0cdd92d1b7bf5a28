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
    k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
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
    /// When the allowance last dropped as the Deployment settled: the resourceVersion of
    /// the Deployment that showed it, and the allowance before. A view of the ReplicaSets
    /// older than that version is held to the allowance before: this test's watches are
    /// separate streams, and its ReplicaSet watch may be seconds behind its Deployment
    /// watch (relisting after the apiserver restarted).
    pub(crate) settled_at: Option<(u64, i32)>,
    /// The resourceVersion of the Deployment that armed the maxUnavailable bound: a view of
    /// the Pods older than it is not held to the bound (the Pod watch may be behind, as the
    /// ReplicaSet watch may).
    pub(crate) armed_at: u64,
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
    /// The newest resourceVersion of the Pod view in `pods` (and of the one being listed
    /// into `relist`).
    pub(crate) pods_at: u64,
    pub(crate) pods_relist_at: u64,
    /// `spec.replicas` of every ReplicaSet, by uid, with its Deployment's name.
    pub(crate) sets: HashMap<String, (String, i32)>,
    pub(crate) sets_relist: Option<HashMap<String, (String, i32)>>,
    /// The newest resourceVersion of the ReplicaSet view in `sets` (and of the one being
    /// listed into `sets_relist`).
    pub(crate) sets_at: u64,
    pub(crate) sets_relist_at: u64,
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
    pub(crate) fn new(begin: Instant) -> Self {
        Invariants {
            begin,
            deployments: HashMap::new(),
            pods: HashMap::new(),
            relist: None,
            pods_at: 0,
            pods_relist_at: 0,
            sets: HashMap::new(),
            sets_relist: None,
            sets_at: 0,
            sets_relist_at: 0,
            samples: 0,
            surge_violations: 0,
            pod_surge_samples: 0,
            unavailable_violations: 0,
            first_violations: Vec::new(),
            history: HashMap::new(),
        }
    }

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
            settled_at: None,
            armed_at: 0,
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
        let rv = version(&pod.metadata);
        match self.relist {
            Some(_) => self.pods_relist_at = self.pods_relist_at.max(rv),
            None => self.pods_at = self.pods_at.max(rv),
        }
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
            let rv = version(&deployment.metadata);
            if !tracked.armed {
                tracked.armed_at = rv;
            }
            tracked.armed = true;
            if tracked.allowance > tracked.replicas {
                tracked.settled_at = Some(match tracked.settled_at {
                    Some((at, before)) => (at.max(rv), before.max(tracked.allowance)),
                    None => (rv, tracked.allowance),
                });
            }
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
        let sets_allowance = match tracked.settled_at {
            Some((at, before)) if self.sets_at < at => tracked.allowance.max(before),
            _ => {
                tracked.settled_at = None;
                tracked.allowance
            }
        };
        let mut violation = None;
        if sized > sets_allowance + MAX_SURGE {
            self.surge_violations += 1;
            violation = Some("surge");
        }
        if active > tracked.allowance + MAX_SURGE {
            self.pod_surge_samples += 1;
            violation = violation.or(Some("pod surge"));
        }
        if tracked.armed
            && self.pods_at >= tracked.armed_at
            && ready < tracked.replicas - MAX_UNAVAILABLE
        {
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
        let rv = version(&rs.metadata);
        match self.sets_relist {
            Some(_) => self.sets_relist_at = self.sets_relist_at.max(rv),
            None => self.sets_at = self.sets_at.max(rv),
        }
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

/// An object's resourceVersion as a number (etcd's revision, which the apiserver gives out
/// in order across kinds); 0 if it has none.
fn version(meta: &ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

pub(crate) fn watch_invariants(
    client: Client,
    namespace: &str,
    begin: Instant,
) -> Arc<Mutex<Invariants>> {
    let invariants = Arc::new(Mutex::new(Invariants::new(begin)));
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
                Seen::ReplicaSet(watcher::Event::Init) => {
                    seen.sets_relist = Some(HashMap::new());
                    seen.sets_relist_at = 0;
                }
                Seen::ReplicaSet(watcher::Event::InitApply(rs) | watcher::Event::Apply(rs)) => {
                    seen.replica_set(&rs);
                }
                Seen::ReplicaSet(watcher::Event::InitDone) => {
                    if let Some(sets) = seen.sets_relist.take() {
                        seen.sets = sets;
                        seen.sets_at = seen.sets_at.max(seen.sets_relist_at);
                    }
                    seen.check_all();
                }
                Seen::ReplicaSet(watcher::Event::Delete(rs)) => {
                    seen.sets
                        .remove(&rs.metadata.uid.clone().unwrap_or_default());
                    seen.sets_at = seen.sets_at.max(version(&rs.metadata));
                }
                Seen::Pod(watcher::Event::Init) => {
                    seen.relist = Some(HashMap::new());
                    seen.pods_relist_at = 0;
                }
                Seen::Pod(watcher::Event::InitApply(pod)) => seen.apply(&pod),
                Seen::Pod(watcher::Event::InitDone) => {
                    if let Some(pods) = seen.relist.take() {
                        seen.pods = pods;
                        seen.pods_at = seen.pods_at.max(seen.pods_relist_at);
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
                    seen.pods_at = seen.pods_at.max(version(&pod.metadata));
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn replica_set(name: &str, replicas: i32, rv: u64) -> ReplicaSet {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": name, "resourceVersion": rv.to_string(),
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "d",
                    "uid": "d-uid", "controller": true}]},
            "spec": {"replicas": replicas, "selector": {}},
        }))
        .unwrap()
    }

    /// The Deployment at `replicas`, done, its status written at `rv`.
    fn settled(replicas: i32, rv: u64) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "d", "generation": 3, "resourceVersion": rv.to_string()},
            "spec": {"replicas": replicas, "selector": {}, "template": {}},
            "status": {"observedGeneration": 3, "replicas": replicas,
                "updatedReplicas": replicas, "availableReplicas": replicas},
        }))
        .unwrap()
    }

    #[test]
    fn replica_sets_seen_before_a_deployment_settled_are_held_to_the_bound_before_it() {
        let mut seen = Invariants::new(Instant::now());
        seen.scaling("d", 3);
        seen.replica_set(&replica_set("old", 2, 100));
        seen.replica_set(&replica_set("new", 2, 110));
        assert_eq!(seen.surge_violations, 0);
        // Scaled to 1: the controller sizes the sets down to 1 in all (RVs 120, 130) and the
        // Deployment settles (RV 140). This test's ReplicaSet watch is behind (a relist after
        // the apiserver restarted): its view is still that of RV 110 when the Deployment
        // watch shows the Deployment done, and a Pod event checks the sets.
        seen.scaling("d", 1);
        seen.deployment(&settled(1, 140));
        seen.check("d");
        assert_eq!(
            seen.surge_violations, 0,
            "a view of the sets older than the settled Deployment: {:?}",
            seen.first_violations
        );
        // The watch catches up.
        seen.replica_set(&replica_set("old", 0, 120));
        seen.replica_set(&replica_set("new", 1, 130));
        assert_eq!(seen.surge_violations, 0, "{:?}", seen.first_violations);
        // A set sized up after the Deployment settled is a violation.
        seen.replica_set(&replica_set("new", 3, 150));
        assert_eq!(seen.surge_violations, 1);
    }

    fn pod(name: &str, ready: bool, rv: u64) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": name, "resourceVersion": rv.to_string(),
                "labels": {"app": "d"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "new",
                    "uid": "new", "controller": true}]},
            "spec": {"containers": []},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }))
        .unwrap()
    }

    #[test]
    fn pods_seen_before_a_deployment_settled_are_not_held_to_the_unavailable_bound() {
        let mut seen = Invariants::new(Instant::now());
        seen.scaling("d", 3);
        // The Pods come up (RVs 100-150), the Deployment settles with all three available
        // (RV 160). This test's Pod watch is behind: its view is still that of RV 120, where
        // one of three is ready.
        seen.apply(&pod("a", true, 100));
        seen.apply(&pod("b", false, 110));
        seen.apply(&pod("c", false, 120));
        seen.deployment(&settled(3, 160));
        seen.check("d");
        assert_eq!(
            seen.unavailable_violations, 0,
            "a view of the Pods older than the settled Deployment: {:?}",
            seen.first_violations
        );
        // The watch catches up.
        seen.apply(&pod("b", true, 130));
        seen.apply(&pod("c", true, 150));
        seen.check("d");
        assert_eq!(
            seen.unavailable_violations, 0,
            "{:?}",
            seen.first_violations
        );
        // Two Pods turning unready after the Deployment settled is a violation.
        seen.apply(&pod("b", false, 170));
        seen.apply(&pod("c", false, 180));
        seen.check("d");
        assert_eq!(seen.unavailable_violations, 1);
    }
}
