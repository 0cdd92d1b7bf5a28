//! The garbage collector's object graph: every object of every deletable resource, by UID,
//! with its owner references and an index of dependents by owner UID, as
//! kube-controller-manager's `GraphBuilder` keeps it, but metadata only and without a
//! virtual node per missing owner (an owner that is not in the graph is simply absent).
//!
//! The graph decides which objects need the collector's attention and keys them
//! ([`Graph::keys_for`]); the collector (a reconciler) reads a node with its owners and
//! dependents and confirms with the apiserver before it deletes anything.
//!
//! ```text
//!  metadata watch event ─► Node ─► Graph::apply / delete      (nodes by UID, dependents by owner)
//!                                     │ old, new
//!                                     ▼
//!                              Graph::keys_for ─► WorkKey (collector, namespace, uid)
//! ```
//!
//! A key is `(controller, namespace, uid)`: a UID names one object of any kind, fits the
//! queue's name limit and survives renames of nothing (names are immutable, UIDs unique).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use crate::WorkKey;

/// The finalizer that holds an owner until its blocking dependents are gone.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
/// The finalizer that holds an owner until its dependents no longer reference it.
pub const ORPHAN_FINALIZER: &str = "orphan";

pub type Uid = Arc<str>;

/// Which resource a node belongs to: an index the watcher hands out per watched resource.
pub type ResourceId = u32;

/// One owner reference of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub api_version: Box<str>,
    pub kind: Box<str>,
    pub name: Box<str>,
    pub uid: Uid,
    pub controller: bool,
    pub block_owner_deletion: bool,
}

/// One object, as the collector sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub resource: ResourceId,
    /// Empty for a cluster-scoped object.
    pub namespace: Arc<str>,
    pub name: Box<str>,
    pub uid: Uid,
    pub resource_version: u64,
    pub owners: Box<[Owner]>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Holds the `foregroundDeletion` finalizer.
    pub foreground: bool,
    /// Holds the `orphan` finalizer.
    pub orphan: bool,
}

impl Node {
    /// Being deleted, and waiting for the collector (foreground or orphan).
    pub fn waits_for_collector(&self) -> bool {
        self.deleting && (self.foreground || self.orphan)
    }

    /// Being deleted in the foreground: its blocking dependents go first.
    pub fn deleting_dependents(&self) -> bool {
        self.deleting && self.foreground
    }

    fn same_state(&self, other: &Node) -> bool {
        self.owners == other.owners
            && self.deleting == other.deleting
            && self.foreground == other.foreground
            && self.orphan == other.orphan
    }
}

/// Every node, with the indexes the collector needs.
#[derive(Debug, Default)]
pub struct Graph {
    nodes: HashMap<Uid, Node>,
    /// Owner UID to the UIDs of the nodes that reference it (the owner may be absent).
    dependents: HashMap<Uid, Vec<Uid>>,
    /// The nodes of each resource, for relists and for resources that go away.
    members: HashMap<ResourceId, HashSet<Uid>>,
    /// The nodes listed so far by each relist under way.
    relisting: HashMap<ResourceId, HashSet<Uid>>,
    /// Interned namespace names.
    namespaces: HashSet<Arc<str>>,
}

impl Graph {
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn node(&self, uid: &str) -> Option<&Node> {
        self.nodes.get(uid)
    }

    /// The nodes that reference `uid` as an owner.
    pub fn dependents<'a>(&'a self, uid: &str) -> impl Iterator<Item = &'a Node> + 'a {
        self.dependents
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|d| self.nodes.get(d))
    }

    /// Interns a namespace name, so that many nodes share one allocation per namespace.
    pub fn namespace(&mut self, namespace: &str) -> Arc<str> {
        match self.namespaces.get(namespace) {
            Some(ns) => ns.clone(),
            None => {
                let ns: Arc<str> = namespace.into();
                self.namespaces.insert(ns.clone());
                ns
            }
        }
    }

    /// Stores a node; returns the one it replaced (`None` when new). A relist of the node's
    /// resource marks it listed.
    pub fn apply(&mut self, node: Node) -> Option<Node> {
        if let Some(listed) = self.relisting.get_mut(&node.resource) {
            listed.insert(node.uid.clone());
        }
        self.members
            .entry(node.resource)
            .or_default()
            .insert(node.uid.clone());
        let uid = node.uid.clone();
        let owners: Vec<Uid> = node.owners.iter().map(|o| o.uid.clone()).collect();
        let old = self.nodes.insert(uid.clone(), node);
        if let Some(old) = &old {
            for owner in old.owners.iter().filter(|o| !owners.contains(&o.uid)) {
                self.unindex(&owner.uid, &uid);
            }
        }
        for owner in owners {
            let dependents = self.dependents.entry(owner).or_default();
            if !dependents.contains(&uid) {
                dependents.push(uid.clone());
            }
        }
        old
    }

    /// Removes a node; returns it when it was there.
    pub fn delete(&mut self, uid: &str) -> Option<Node> {
        let node = self.nodes.remove(uid)?;
        for owner in node.owners.iter() {
            self.unindex(&owner.uid, &node.uid);
        }
        if let Some(members) = self.members.get_mut(&node.resource) {
            members.remove(uid);
        }
        Some(node)
    }

    fn unindex(&mut self, owner: &str, dependent: &str) {
        if let Some(dependents) = self.dependents.get_mut(owner) {
            dependents.retain(|d| **d != *dependent);
            if dependents.is_empty() {
                self.dependents.remove(owner);
            }
        }
    }

    /// Starts a relist of `resource`: its nodes not applied before [`Graph::finish_relist`]
    /// are removed then.
    pub fn begin_relist(&mut self, resource: ResourceId) {
        self.relisting.insert(resource, HashSet::new());
    }

    /// Ends a relist; removes and returns the nodes it did not list (deleted while the
    /// watch was away).
    pub fn finish_relist(&mut self, resource: ResourceId) -> Vec<Node> {
        let Some(listed) = self.relisting.remove(&resource) else {
            return Vec::new();
        };
        let gone: Vec<Uid> = self
            .members
            .get(&resource)
            .into_iter()
            .flatten()
            .filter(|uid| !listed.contains(*uid))
            .cloned()
            .collect();
        gone.iter().filter_map(|uid| self.delete(uid)).collect()
    }

    /// Removes every node of a resource the apiserver no longer serves (a CRD deleted);
    /// returns them.
    pub fn drop_resource(&mut self, resource: ResourceId) -> Vec<Node> {
        self.relisting.remove(&resource);
        let uids: Vec<Uid> = self
            .members
            .remove(&resource)
            .into_iter()
            .flatten()
            .collect();
        uids.iter().filter_map(|uid| self.delete(uid)).collect()
    }

    /// Whether the collector has something to decide about `node`: it waits for the
    /// collector itself, or one of its owners is not in the graph (gone, or not yet listed),
    /// is in another namespace (an invalid reference), or is deleting its dependents in the
    /// foreground and this reference blocks it.
    pub fn needs_collector(&self, node: &Node) -> bool {
        node.waits_for_collector()
            || node
                .owners
                .iter()
                .any(|owner| match self.nodes.get(&owner.uid) {
                    None => true,
                    Some(found) => {
                        !(found.namespace.is_empty() || found.namespace == node.namespace)
                            || (owner.block_owner_deletion && found.deleting_dependents())
                    }
                })
    }

    /// The keys a change causes: `old` is what the graph held before (`None` for a new
    /// node), `new` what it holds now (`None` for a deletion). Call after the graph was
    /// changed.
    pub fn keys_for(
        &self,
        controller: &Arc<str>,
        old: Option<&Node>,
        new: Option<&Node>,
        keys: &mut Vec<WorkKey>,
    ) {
        let key = |node: &Node| {
            WorkKey::new(controller.clone(), node.namespace.clone(), node.uid.clone())
        };
        match (old, new) {
            (_, Some(new)) => {
                let changed = old.is_none_or(|old| !old.same_state(new));
                if changed && self.needs_collector(new) {
                    keys.push(key(new));
                }
                // An owner that starts deleting in the foreground: its dependents decide
                // whether they go first.
                if new.deleting_dependents() && !old.is_some_and(Node::deleting_dependents) {
                    keys.extend(self.dependents(&new.uid).map(key));
                }
                // A reference dropped, or one that stopped blocking, may have been the last
                // thing its owner waited for.
                if let Some(old) = old {
                    let released = old.owners.iter().filter(|o| {
                        match new.owners.iter().find(|n| n.uid == o.uid) {
                            None => true,
                            Some(n) => o.block_owner_deletion && !n.block_owner_deletion,
                        }
                    });
                    keys.extend(self.waiting_owners(released).map(key));
                }
            }
            (Some(old), None) => {
                // Its dependents may have lost their last owner; an owner deleting in the
                // foreground may have lost its last blocking dependent.
                keys.extend(self.dependents(&old.uid).map(key));
                keys.extend(self.waiting_owners(old.owners.iter()).map(key));
            }
            (None, None) => {}
        }
    }

    fn waiting_owners<'a>(
        &'a self,
        owners: impl Iterator<Item = &'a Owner> + 'a,
    ) -> impl Iterator<Item = &'a Node> + 'a {
        owners
            .filter_map(|o| self.nodes.get(&o.uid))
            .filter(|owner| owner.waits_for_collector())
    }

    /// Every key a resync sends: each node the collector has something to decide about,
    /// in the shards `keep` accepts.
    pub fn resync_keys(
        &self,
        controller: &Arc<str>,
        mut keep: impl FnMut(&WorkKey) -> bool,
    ) -> Vec<WorkKey> {
        self.nodes
            .values()
            .filter(|node| self.needs_collector(node))
            .map(|node| WorkKey::new(controller.clone(), node.namespace.clone(), node.uid.clone()))
            .filter(|key| keep(key))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RS: ResourceId = 1;
    const POD: ResourceId = 2;

    fn owner(uid: &str, block: bool) -> Owner {
        Owner {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: format!("rs-{uid}").into(),
            uid: uid.into(),
            controller: true,
            block_owner_deletion: block,
        }
    }

    fn node(resource: ResourceId, namespace: &str, uid: &str, owners: &[Owner]) -> Node {
        Node {
            resource,
            namespace: namespace.into(),
            name: format!("n-{uid}").into(),
            uid: uid.into(),
            resource_version: 1,
            owners: owners.into(),
            deleting: false,
            foreground: false,
            orphan: false,
        }
    }

    fn keyed(graph: &Graph, old: Option<&Node>, new: Option<&Node>) -> Vec<String> {
        let mut keys = Vec::new();
        graph.keys_for(&Arc::from("gc"), old, new, &mut keys);
        let mut uids: Vec<String> = keys.iter().map(|k| k.name.to_string()).collect();
        uids.sort();
        uids
    }

    #[test]
    fn dependents_are_indexed_by_owner_and_follow_changes_of_references() {
        let mut graph = Graph::default();
        graph.apply(node(RS, "ns", "rs1", &[]));
        graph.apply(node(POD, "ns", "p1", &[owner("rs1", true)]));
        graph.apply(node(POD, "ns", "p2", &[owner("rs1", true)]));
        let uids = |g: &Graph, o: &str| {
            let mut u: Vec<String> = g.dependents(o).map(|n| n.uid.to_string()).collect();
            u.sort();
            u
        };
        assert_eq!(uids(&graph, "rs1"), ["p1", "p2"]);
        // p2 is orphaned by an update, then re-owned by another owner.
        graph.apply(node(POD, "ns", "p2", &[]));
        assert_eq!(uids(&graph, "rs1"), ["p1"]);
        graph.apply(node(POD, "ns", "p2", &[owner("rs2", true)]));
        // Indexed although rs2 itself is not in the graph.
        assert_eq!(uids(&graph, "rs2"), ["p2"]);
        graph.delete("p1");
        assert!(!graph.dependents.contains_key("rs1"));
        assert_eq!(graph.len(), 2);
    }

    #[test]
    fn an_object_whose_owners_are_all_present_needs_nothing() {
        let mut graph = Graph::default();
        let rs = node(RS, "ns", "rs1", &[]);
        graph.apply(rs.clone());
        assert_eq!(keyed(&graph, None, Some(&rs)), Vec::<String>::new());
        let pod = node(POD, "ns", "p1", &[owner("rs1", true)]);
        graph.apply(pod.clone());
        assert_eq!(keyed(&graph, None, Some(&pod)), Vec::<String>::new());
        // An owner not (yet) in the graph: the collector looks.
        let stray = node(POD, "ns", "p2", &[owner("gone", true)]);
        graph.apply(stray.clone());
        assert_eq!(keyed(&graph, None, Some(&stray)), ["p2"]);
        // An owner of that UID in another namespace is not this reference's owner.
        let elsewhere = node(POD, "other", "p3", &[owner("rs1", false)]);
        graph.apply(elsewhere.clone());
        assert_eq!(keyed(&graph, None, Some(&elsewhere)), ["p3"]);
        // A cluster-scoped owner serves every namespace.
        graph.apply(node(RS, "", "cluster", &[]));
        let ok = node(POD, "other", "p4", &[owner("cluster", false)]);
        graph.apply(ok.clone());
        assert_eq!(keyed(&graph, None, Some(&ok)), Vec::<String>::new());
    }

    #[test]
    fn a_deleted_owner_keys_its_dependents() {
        let mut graph = Graph::default();
        graph.apply(node(RS, "ns", "rs1", &[]));
        graph.apply(node(POD, "ns", "p1", &[owner("rs1", true)]));
        graph.apply(node(POD, "ns", "p2", &[owner("rs1", false)]));
        let old = graph.delete("rs1").unwrap();
        assert_eq!(keyed(&graph, Some(&old), None), ["p1", "p2"]);
        // Now both need the collector: their owner is absent.
        assert_eq!(graph.resync_keys(&Arc::from("gc"), |_| true).len(), 2);
    }

    #[test]
    fn foreground_deletion_keys_the_owner_and_its_dependents_then_the_owner_again() {
        let mut graph = Graph::default();
        let rs = node(RS, "ns", "rs1", &[]);
        graph.apply(rs.clone());
        graph.apply(node(POD, "ns", "p1", &[owner("rs1", true)]));
        graph.apply(node(POD, "ns", "p2", &[owner("rs1", false)]));
        let mut deleting = rs.clone();
        deleting.deleting = true;
        deleting.foreground = true;
        let old = graph.apply(deleting.clone());
        assert_eq!(
            keyed(&graph, old.as_ref(), Some(&deleting)),
            ["p1", "p2", "rs1"]
        );
        // p1 blocks it, so p1 needs the collector; p2 does not.
        assert!(graph.needs_collector(graph.node("p1").unwrap()));
        assert!(!graph.needs_collector(graph.node("p2").unwrap()));
        // A repeat of the same state keys nothing.
        let old = graph.apply(deleting.clone());
        assert_eq!(
            keyed(&graph, old.as_ref(), Some(&deleting)),
            Vec::<String>::new()
        );
        // p1 gone: the owner waiting for it is keyed.
        let p1 = graph.delete("p1").unwrap();
        assert_eq!(keyed(&graph, Some(&p1), None), ["rs1"]);
        // p2 drops its reference: the owner is keyed too.
        let p2 = node(POD, "ns", "p2", &[]);
        let old = graph.apply(p2.clone());
        assert_eq!(keyed(&graph, old.as_ref(), Some(&p2)), ["rs1"]);
    }

    #[test]
    fn a_reference_that_stops_blocking_keys_the_owner_waiting_for_it() {
        let mut graph = Graph::default();
        let mut rs = node(RS, "ns", "rs1", &[]);
        rs.deleting = true;
        rs.foreground = true;
        graph.apply(rs);
        graph.apply(node(POD, "ns", "p1", &[owner("rs1", true)]));
        // The collector unblocks p1 (a circle through it): rs1 has nothing left to wait for.
        let unblocked = node(POD, "ns", "p1", &[owner("rs1", false)]);
        let old = graph.apply(unblocked.clone());
        assert_eq!(keyed(&graph, old.as_ref(), Some(&unblocked)), ["rs1"]);
        // Blocking again keys no owner: it was not waiting for anything new to go.
        let blocking = node(POD, "ns", "p1", &[owner("rs1", true)]);
        let old = graph.apply(blocking.clone());
        assert_eq!(keyed(&graph, old.as_ref(), Some(&blocking)), ["p1"]);
    }

    #[test]
    fn orphaning_keys_the_owner_only() {
        let mut graph = Graph::default();
        let mut rs = node(RS, "ns", "rs1", &[]);
        graph.apply(rs.clone());
        graph.apply(node(POD, "ns", "p1", &[owner("rs1", true)]));
        rs.deleting = true;
        rs.orphan = true;
        let old = graph.apply(rs.clone());
        assert_eq!(keyed(&graph, old.as_ref(), Some(&rs)), ["rs1"]);
    }

    #[test]
    fn a_relist_removes_what_it_did_not_list_and_a_dropped_resource_takes_its_nodes() {
        let mut graph = Graph::default();
        graph.apply(node(POD, "ns", "p1", &[]));
        graph.apply(node(POD, "ns", "p2", &[]));
        graph.apply(node(RS, "ns", "rs1", &[]));
        graph.begin_relist(POD);
        graph.apply(node(POD, "ns", "p2", &[]));
        let gone: Vec<String> = graph
            .finish_relist(POD)
            .iter()
            .map(|n| n.uid.to_string())
            .collect();
        assert_eq!(gone, ["p1"]);
        assert_eq!(graph.len(), 2);
        let dropped = graph.drop_resource(RS);
        assert_eq!(dropped.len(), 1);
        assert_eq!(graph.len(), 1);
        assert!(graph.node("rs1").is_none());
    }
}
