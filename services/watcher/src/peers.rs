//! The handover check: which controllers another controller manager also runs, read from the
//! changes the informers take in (`switchyard_watcher_core::peer`), and, under
//! `--on-peer-writes=stand-down`, their keys held back while it does.
//!
//! ```text
//!  change of a kind a controller reconciles (`for`) ─► managedFields: newest status write
//!      a peer's, recent?
//!  change of an object a controller here writes (peer::WRITES: slices, Endpoints, by their
//!      managed-by label) ─► managedFields: newest write to it a peer's, recent?
//!                         ─► switchyard_watcher_peer_status_writes_total{controller, manager}
//!                           warn log (once per episode)
//!                           stand-down: that controller's keys are not sent until `window`
//!                           after the peer's last write (switchyard_watcher_standing_down)
//! ```

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant, SystemTime},
};

use switchyard_k8s::ObjectMeta;
use switchyard_watcher_core::{
    Gvk, WorkKey,
    peer::{FieldsEntry, OnPeer, Part, last_writer},
};
use tracing::warn;

use crate::metrics::{ControllerLabels, PeerLabels, WatcherMetrics};

/// How long after a peer's last status write its controllers count as contested.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(300);

#[derive(Debug)]
pub struct Peers {
    on_peer: OnPeer,
    window: Duration,
    /// The watcher's start, in Unix seconds: a status written before it is history.
    since: i64,
    /// Per controller, when a peer's write to one of its objects was last seen.
    seen: Mutex<HashMap<String, Instant>>,
    metrics: WatcherMetrics,
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl Peers {
    pub fn new(on_peer: OnPeer, window: Duration, metrics: WatcherMetrics) -> Self {
        Self {
            on_peer,
            window,
            since: unix_now(),
            seen: Mutex::default(),
            metrics,
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads a change to an object of `resource`, which `controllers` reconcile (`part`
    /// status) or write (`part` object): a recent write of that part by a peer counts
    /// against each of them.
    pub fn observe<'a>(
        &self,
        resource: &Gvk,
        meta: &ObjectMeta,
        part: Part,
        controllers: impl IntoIterator<Item = &'a str>,
    ) {
        let entries = meta.managed_fields.iter().flatten().map(|e| FieldsEntry {
            manager: e.manager.as_deref().unwrap_or_default(),
            subresource: e.subresource.as_deref().unwrap_or_default(),
            time: e.time.as_ref().map(|t| t.0.as_second()),
        });
        let Some(manager) = last_writer(entries, part, self.since, unix_now(), self.window) else {
            return;
        };
        let now = Instant::now();
        let mut seen = self.seen();
        for controller in controllers {
            self.metrics
                .peer_writes
                .get_or_create(&PeerLabels {
                    controller: controller.to_owned(),
                    manager,
                })
                .inc();
            let again = seen
                .insert(controller.to_owned(), now)
                .is_some_and(|last| now.duration_since(last) < self.window);
            if !again {
                warn!(
                    controller,
                    peer = manager,
                    %resource,
                    namespace = meta.namespace.as_deref().unwrap_or_default(),
                    name = meta.name.as_deref().unwrap_or_default(),
                    on_peer_writes = ?self.on_peer,
                    "another controller manager writes the status of objects this controller \
                     reconciles, or the objects it writes: it runs the same controller (see \
                     docs/deploy.md, handing over from kube-controller-manager)"
                );
            }
            if self.on_peer == OnPeer::StandDown {
                self.metrics
                    .standing_down
                    .get_or_create(&ControllerLabels {
                        controller: controller.to_owned(),
                    })
                    .set(1);
            }
        }
    }

    /// Drops the keys of controllers standing down (`--on-peer-writes=stand-down` and a peer's
    /// write within the window), counting them.
    pub fn hold_back<T>(&self, keys: &mut Vec<T>, key: impl Fn(&T) -> &WorkKey) {
        if self.on_peer != OnPeer::StandDown {
            return;
        }
        let mut seen = self.seen();
        if seen.is_empty() {
            return;
        }
        let now = Instant::now();
        seen.retain(|controller, last| {
            let standing = now.duration_since(*last) < self.window;
            if !standing {
                self.metrics
                    .standing_down
                    .get_or_create(&ControllerLabels {
                        controller: controller.clone(),
                    })
                    .set(0);
            }
            standing
        });
        keys.retain(|k| {
            let controller = &*key(k).controller;
            let held = seen.contains_key(controller);
            if held {
                self.metrics
                    .stood_down_keys
                    .get_or_create(&ControllerLabels {
                        controller: controller.to_owned(),
                    })
                    .inc();
            }
            !held
        });
    }
}
