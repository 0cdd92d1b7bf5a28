//! Where a Pod may run: its `nodeName`, `nodeSelector`, required node affinity and
//! tolerations against a Node's name, labels and taints, as the scheduler's `NodeName`,
//! `NodeAffinity` and `TaintToleration` filters decide, which kube-controller-manager's
//! DaemonSet controller runs to choose its Nodes (`NodeShouldRunDaemonPod`).
//!
//! ```text
//!  a Pod spec (JSON) ── Placement::from_pod_spec ──┐
//!                                                  ├─► Placement::for_daemon ─► daemon_fit(node) ─► Fit
//!  a Node (JSON)     ── Node::from_json ───────────┘    (+ the tolerations every DaemonSet Pod gets)
//! ```
//!
//! The watcher uses it to key only the DaemonSets a Node change concerns, the reconciler to
//! decide where a DaemonSet's Pods go: one implementation, so both agree.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::label::{validate_key, validate_value};

/// The taint effects the scheduler knows.
pub const NO_SCHEDULE: &str = "NoSchedule";
pub const PREFER_NO_SCHEDULE: &str = "PreferNoSchedule";
pub const NO_EXECUTE: &str = "NoExecute";

/// The field `matchFields` may name: the Node's name.
const NAME_FIELD: &str = "metadata.name";

/// A Node as placement sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
}

/// One of a Node's `spec.taints`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: String,
}

/// One of a Pod's `spec.tolerations`; an empty operator means `Equal`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Toleration {
    pub key: String,
    pub operator: String,
    pub value: String,
    pub effect: String,
    pub toleration_seconds: Option<i64>,
}

/// A `NodeSelectorRequirement`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: String,
    pub values: Vec<String>,
}

/// A `NodeSelectorTerm`: every requirement must hold; a term with none selects nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Term {
    pub match_expressions: Vec<Requirement>,
    pub match_fields: Vec<Requirement>,
}

/// What a Pod spec says about where it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// `spec.nodeName`, empty for none.
    pub node_name: String,
    pub node_selector: BTreeMap<String, String>,
    /// `affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`,
    /// `None` when the Pod has no required node affinity (any term then matches).
    pub required_terms: Option<Vec<Term>>,
    pub tolerations: Vec<Toleration>,
    pub host_network: bool,
}

/// Whether a DaemonSet's Pod belongs on a Node (`NodeShouldRunDaemonPod`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fit {
    /// A Pod should be created there.
    pub should_run: bool,
    /// A Pod there may stay (it tolerates every `NoExecute` taint, even if it would not be
    /// scheduled there now).
    pub should_continue_running: bool,
}

impl Node {
    /// A Node from its JSON; what is missing or malformed counts as absent.
    pub fn from_json(node: &Value) -> Self {
        Self {
            name: str_at(node, &["metadata", "name"]).to_owned(),
            labels: string_map(node.pointer("/metadata/labels")),
            taints: array(node.pointer("/spec/taints"))
                .map(|t| Taint {
                    key: str_at(t, &["key"]).to_owned(),
                    value: str_at(t, &["value"]).to_owned(),
                    effect: str_at(t, &["effect"]).to_owned(),
                })
                .collect(),
        }
    }

    /// Whether the two Nodes are the same to placement (`shouldIgnoreNodeUpdate`: labels and
    /// taints).
    pub fn same_placement(&self, other: &Self) -> bool {
        self.labels == other.labels && self.taints == other.taints
    }
}

impl Placement {
    /// A Pod spec's placement from its JSON (`spec` of a Pod, `spec.template.spec` of a
    /// workload); what is missing or malformed counts as absent.
    pub fn from_pod_spec(spec: &Value) -> Self {
        let requirements = |value: Option<&Value>| -> Vec<Requirement> {
            array(value)
                .map(|r| Requirement {
                    key: str_at(r, &["key"]).to_owned(),
                    operator: str_at(r, &["operator"]).to_owned(),
                    values: array(r.get("values"))
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect(),
                })
                .collect()
        };
        let required =
            spec.pointer("/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution");
        Self {
            node_name: str_at(spec, &["nodeName"]).to_owned(),
            node_selector: string_map(spec.get("nodeSelector")),
            required_terms: required.filter(|r| r.is_object()).map(|r| {
                array(r.get("nodeSelectorTerms"))
                    .map(|t| Term {
                        match_expressions: requirements(t.get("matchExpressions")),
                        match_fields: requirements(t.get("matchFields")),
                    })
                    .collect()
            }),
            tolerations: array(spec.get("tolerations"))
                .map(|t| Toleration {
                    key: str_at(t, &["key"]).to_owned(),
                    operator: str_at(t, &["operator"]).to_owned(),
                    value: str_at(t, &["value"]).to_owned(),
                    effect: str_at(t, &["effect"]).to_owned(),
                    toleration_seconds: t.get("tolerationSeconds").and_then(Value::as_i64),
                })
                .collect(),
            host_network: spec
                .get("hostNetwork")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        }
    }

    /// With the tolerations kube-controller-manager adds to every DaemonSet Pod
    /// (`AddOrUpdateDaemonPodTolerations`): it stays through `not-ready` and `unreachable`
    /// Nodes and is scheduled despite the conditions' taints.
    pub fn for_daemon(mut self) -> Self {
        for toleration in daemon_tolerations(self.host_network) {
            add_or_update(&mut self.tolerations, toleration);
        }
        self
    }

    /// The required node affinity (`GetRequiredNodeAffinity(pod).Match(node)`): the
    /// `nodeSelector`'s labels, and one of the required terms. A term that cannot be parsed
    /// (an unknown operator, a bad key or value) matches nothing.
    pub fn affinity_matches(&self, node: &Node) -> bool {
        let labels_match = self
            .node_selector
            .iter()
            .all(|(k, v)| node.labels.get(k) == Some(v));
        labels_match
            && self.required_terms.as_ref().is_none_or(|terms| {
                terms
                    .iter()
                    .filter(|t| !t.match_expressions.is_empty() || !t.match_fields.is_empty())
                    .any(|t| t.matches(node))
            })
    }

    /// The first of `taints` whose effect `effect` accepts and that no toleration tolerates
    /// (`FindMatchingUntoleratedTaint`).
    pub fn untolerated<'t>(
        &self,
        taints: &'t [Taint],
        effect: impl Fn(&str) -> bool,
    ) -> Option<&'t Taint> {
        taints
            .iter()
            .filter(|t| effect(&t.effect))
            .find(|t| !self.tolerations.iter().any(|tol| tol.tolerates(t)))
    }

    /// Where a DaemonSet Pod with this placement (already [`Self::for_daemon`]) belongs:
    /// the Node its `nodeName` names, if any, matching its node affinity, and tolerating the
    /// Node's `NoSchedule` and `NoExecute` taints; one that tolerates only the `NoExecute`
    /// ones may stay where it is.
    pub fn daemon_fit(&self, node: &Node) -> Fit {
        let named = self.node_name.is_empty() || self.node_name == node.name;
        if !named || !self.affinity_matches(node) {
            return Fit::default();
        }
        if self
            .untolerated(&node.taints, |e| e == NO_SCHEDULE || e == NO_EXECUTE)
            .is_none()
        {
            return Fit {
                should_run: true,
                should_continue_running: true,
            };
        }
        Fit {
            should_run: false,
            should_continue_running: self
                .untolerated(&node.taints, |e| e == NO_EXECUTE)
                .is_none(),
        }
    }
}

/// The tolerations every DaemonSet Pod gets, the last only with `hostNetwork`.
pub fn daemon_tolerations(host_network: bool) -> Vec<Toleration> {
    let exists = |key: &str, effect: &str| Toleration {
        key: key.to_owned(),
        operator: "Exists".to_owned(),
        effect: effect.to_owned(),
        ..Toleration::default()
    };
    let mut all = vec![
        exists("node.kubernetes.io/not-ready", NO_EXECUTE),
        exists("node.kubernetes.io/unreachable", NO_EXECUTE),
        exists("node.kubernetes.io/disk-pressure", NO_SCHEDULE),
        exists("node.kubernetes.io/memory-pressure", NO_SCHEDULE),
        exists("node.kubernetes.io/pid-pressure", NO_SCHEDULE),
        exists("node.kubernetes.io/unschedulable", NO_SCHEDULE),
    ];
    if host_network {
        all.push(exists(
            "node.kubernetes.io/network-unavailable",
            NO_SCHEDULE,
        ));
    }
    all
}

/// `AddOrUpdateTolerationInPodSpec`: one with the same key, operator, value and effect is
/// replaced (its `tolerationSeconds` dropped), else it is appended.
pub fn add_or_update(tolerations: &mut Vec<Toleration>, toleration: Toleration) {
    let same = |t: &Toleration| {
        t.key == toleration.key
            && t.operator == toleration.operator
            && t.value == toleration.value
            && t.effect == toleration.effect
    };
    match tolerations.iter_mut().find(|t| same(t)) {
        Some(existing) => *existing = toleration,
        None => tolerations.push(toleration),
    }
}

impl Toleration {
    /// `ToleratesTaint`: an empty effect or key matches any; `Exists` any value, `Equal`
    /// (or no operator) the same value. The alpha comparison operators are off, as in
    /// kube-controller-manager by default.
    pub fn tolerates(&self, taint: &Taint) -> bool {
        if !self.effect.is_empty() && self.effect != taint.effect {
            return false;
        }
        if !self.key.is_empty() && self.key != taint.key {
            return false;
        }
        match self.operator.as_str() {
            "" | "Equal" => self.value == taint.value,
            "Exists" => true,
            _ => false,
        }
    }
}

impl Term {
    /// Every expression over the Node's labels and every field (only `metadata.name` has a
    /// value) holds; a malformed requirement fails the term.
    fn matches(&self, node: &Node) -> bool {
        let fields_hold = self.match_fields.iter().all(|r| {
            let value = (r.key == NAME_FIELD).then_some(node.name.as_str());
            match (r.operator.as_str(), r.values.as_slice()) {
                ("In", [one]) => value == Some(one.as_str()) || (value.is_none() && one.is_empty()),
                ("NotIn", [one]) => value.unwrap_or_default() != one,
                _ => false,
            }
        });
        fields_hold
            && self
                .match_expressions
                .iter()
                .all(|r| r.matches(|k| node.labels.get(k).map(String::as_str)))
    }
}

impl Requirement {
    /// As `labels.Requirement.Matches` for the node selector operators; one the apiserver
    /// would refuse (a bad key or value, a wrong number of values) matches nothing.
    fn matches<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        if validate_key(&self.key).is_err()
            || self.values.iter().any(|v| validate_value(v).is_err())
        {
            return false;
        }
        let value = label(&self.key);
        let integer = |s: &str| s.parse::<i64>().ok();
        match (self.operator.as_str(), self.values.as_slice()) {
            ("In", values) if !values.is_empty() => {
                value.is_some_and(|v| values.iter().any(|x| x == v))
            }
            ("NotIn", values) if !values.is_empty() => {
                value.is_none_or(|v| values.iter().all(|x| x != v))
            }
            ("Exists", []) => value.is_some(),
            ("DoesNotExist", []) => value.is_none(),
            ("Gt", [bound]) => match (value.and_then(integer), integer(bound)) {
                (Some(v), Some(b)) => v > b,
                _ => false,
            },
            ("Lt", [bound]) => match (value.and_then(integer), integer(bound)) {
                (Some(v), Some(b)) => v < b,
                _ => false,
            },
            _ => false,
        }
    }
}

fn str_at<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(value, |v, k| v.get(k))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn array(value: Option<&Value>) -> impl Iterator<Item = &Value> {
    value.and_then(Value::as_array).into_iter().flatten()
}

fn string_map(value: Option<&Value>) -> BTreeMap<String, String> {
    value
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(value: Value) -> Node {
        Node::from_json(&value)
    }

    fn daemon(spec: Value) -> Placement {
        Placement::from_pod_spec(&spec).for_daemon()
    }

    const RUN: Fit = Fit {
        should_run: true,
        should_continue_running: true,
    };
    const STAY: Fit = Fit {
        should_run: false,
        should_continue_running: true,
    };
    const NONE: Fit = Fit {
        should_run: false,
        should_continue_running: false,
    };

    #[test]
    fn a_plain_pod_runs_on_a_plain_node() {
        let n = node(json!({"metadata": {"name": "n1"}}));
        assert_eq!(daemon(json!({})).daemon_fit(&n), RUN);
    }

    #[test]
    fn node_name_and_node_selector_narrow_the_nodes() {
        let n = node(json!({"metadata": {"name": "n1", "labels": {"disk": "ssd"}}}));
        assert_eq!(daemon(json!({"nodeName": "n2"})).daemon_fit(&n), NONE);
        assert_eq!(daemon(json!({"nodeName": "n1"})).daemon_fit(&n), RUN);
        assert_eq!(
            daemon(json!({"nodeSelector": {"disk": "hdd"}})).daemon_fit(&n),
            NONE
        );
        assert_eq!(
            daemon(json!({"nodeSelector": {"disk": "ssd"}})).daemon_fit(&n),
            RUN
        );
    }

    fn required(terms: Value) -> Value {
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}})
    }

    #[test]
    fn required_terms_are_ored_and_their_requirements_anded() {
        let n = node(json!({"metadata": {"name": "n1", "labels": {"zone": "a", "cpus": "8"}}}));
        let fits = |terms: Value| daemon(required(terms)).daemon_fit(&n) == RUN;
        assert!(fits(
            json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}])
        ));
        assert!(!fits(
            json!([{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}])
        ));
        assert!(fits(
            json!([{"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}])
        ));
        assert!(fits(
            json!([{"matchExpressions": [{"key": "cpus", "operator": "Gt", "values": ["4"]}]}])
        ));
        assert!(!fits(
            json!([{"matchExpressions": [{"key": "cpus", "operator": "Lt", "values": ["4"]}]}])
        ));
        assert!(!fits(json!([{"matchExpressions": [
            {"key": "zone", "operator": "Exists"},
            {"key": "gpu", "operator": "Exists"}
        ]}])));
        // One of two terms.
        assert!(fits(json!([
            {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        ])));
        assert!(!fits(
            json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}])
        ));
        assert!(fits(
            json!([{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n2"]}]}])
        ));
        // No terms, or only empty ones, select nothing.
        assert!(!fits(json!([])));
        assert!(!fits(json!([{}])));
        // A malformed requirement fails its term, not the other terms.
        assert!(!fits(
            json!([{"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["a"]}]}])
        ));
        assert!(!fits(
            json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": []}]}])
        ));
        assert!(!fits(
            json!([{"matchExpressions": [{"key": "cpus", "operator": "Gt", "values": ["x"]}]}])
        ));
        assert!(fits(json!([
            {"matchExpressions": [{"key": "zone", "operator": "Exists", "values": ["a"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}
        ])));
    }

    #[test]
    fn taints_decide_between_run_stay_and_neither() {
        let tainted = |effect: &str| {
            node(
                json!({"metadata": {"name": "n1"}, "spec": {"taints": [{"key": "dedicated", "value": "db", "effect": effect}]}}),
            )
        };
        let plain = daemon(json!({}));
        assert_eq!(plain.daemon_fit(&tainted(NO_SCHEDULE)), STAY);
        assert_eq!(plain.daemon_fit(&tainted(NO_EXECUTE)), NONE);
        assert_eq!(plain.daemon_fit(&tainted(PREFER_NO_SCHEDULE)), RUN);
        let tolerant = |toleration: Value| daemon(json!({"tolerations": [toleration]}));
        assert_eq!(
            tolerant(json!({"key": "dedicated", "operator": "Equal", "value": "db"}))
                .daemon_fit(&tainted(NO_EXECUTE)),
            RUN
        );
        assert_eq!(
            tolerant(json!({"key": "dedicated", "value": "web"})).daemon_fit(&tainted(NO_EXECUTE)),
            NONE
        );
        assert_eq!(
            tolerant(json!({"operator": "Exists"})).daemon_fit(&tainted(NO_EXECUTE)),
            RUN
        );
        assert_eq!(
            tolerant(json!({"key": "dedicated", "operator": "Exists", "effect": NO_SCHEDULE}))
                .daemon_fit(&tainted(NO_EXECUTE)),
            NONE
        );
    }

    #[test]
    fn daemon_pods_tolerate_the_node_condition_taints() {
        let with = |key: &str, effect: &str| {
            node(
                json!({"metadata": {"name": "n1"}, "spec": {"taints": [{"key": key, "effect": effect}]}}),
            )
        };
        let plain = daemon(json!({}));
        for (key, effect) in [
            ("node.kubernetes.io/not-ready", NO_EXECUTE),
            ("node.kubernetes.io/unreachable", NO_EXECUTE),
            ("node.kubernetes.io/unschedulable", NO_SCHEDULE),
            ("node.kubernetes.io/memory-pressure", NO_SCHEDULE),
        ] {
            assert_eq!(plain.daemon_fit(&with(key, effect)), RUN, "{key}");
        }
        let unavailable = with("node.kubernetes.io/network-unavailable", NO_SCHEDULE);
        assert_eq!(plain.daemon_fit(&unavailable), STAY);
        assert_eq!(
            daemon(json!({"hostNetwork": true})).daemon_fit(&unavailable),
            RUN
        );
    }

    #[test]
    fn a_users_own_condition_toleration_is_replaced_by_the_unbounded_one() {
        let placement = daemon(json!({"tolerations": [{
            "key": "node.kubernetes.io/not-ready", "operator": "Exists",
            "effect": NO_EXECUTE, "tolerationSeconds": 300
        }]}));
        let not_ready: Vec<_> = placement
            .tolerations
            .iter()
            .filter(|t| t.key == "node.kubernetes.io/not-ready")
            .collect();
        assert_eq!(not_ready.len(), 1);
        assert_eq!(not_ready[0].toleration_seconds, None);
        assert_eq!(placement.tolerations.len(), 6);
    }

    #[test]
    fn only_labels_and_taints_matter_to_placement() {
        let a = node(
            json!({"metadata": {"name": "n1", "labels": {"a": "1"}}, "status": {"phase": "Running"}}),
        );
        let b = node(
            json!({"metadata": {"name": "n1", "labels": {"a": "1"}}, "status": {"phase": "Pending"}}),
        );
        let c = node(json!({"metadata": {"name": "n1", "labels": {"a": "2"}}}));
        assert!(a.same_placement(&b));
        assert!(!a.same_placement(&c));
    }
}
