//! Which Pods a controller keeps, adopts and releases (`PodControllerRefManager.ClaimPods`),
//! for the controllers that claim every Pod they match, finished or not: StatefulSets and
//! DaemonSets. (The ReplicaSet controller claims only active Pods: `replicaset::claim`.)

use std::borrow::Borrow;

use k8s_openapi::api::core::v1::Pod;

use crate::replicaset::controller_of;

/// The owner's Pods after a claim.
#[derive(Debug, Default, PartialEq)]
pub struct Claim<'p> {
    /// Controlled by the owner and still its members.
    pub owned: Vec<&'p Pod>,
    /// Orphans that are members and not being deleted: to be given a controller reference.
    pub adopt: Vec<&'p Pod>,
    /// Controlled but no longer members: the controller reference is to be removed.
    pub release: Vec<&'p Pod>,
}

/// Claims the Pods of `namespace` for the owner `uid`: `member` says whether a Pod belongs
/// (its selector, and for a StatefulSet its name). An owner being deleted (`deleting`)
/// neither adopts nor releases. The Pods may be shared (`Arc<Pod>`, as the cache lists them).
pub fn claim<'p>(
    namespace: &str,
    uid: &str,
    deleting: bool,
    pods: &'p [impl Borrow<Pod>],
    member: impl Fn(&Pod) -> bool,
) -> Claim<'p> {
    let mut claim = Claim::default();
    for pod in pods {
        let pod = pod.borrow();
        if pod.metadata.namespace.as_deref() != Some(namespace) {
            continue;
        }
        match controller_of(pod) {
            Some(r) if r.uid == uid => {
                if member(pod) {
                    claim.owned.push(pod);
                } else if !deleting {
                    claim.release.push(pod);
                }
            }
            Some(_) => {}
            None => {
                if !deleting && pod.metadata.deletion_timestamp.is_none() && member(pod) {
                    claim.adopt.push(pod);
                }
            }
        }
    }
    claim
}
