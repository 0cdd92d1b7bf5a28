//! Workloads the tests and benchmarks create: Pods labelled `app=<name>`, selected by it, with
//! one container of [`IMAGE`].

use serde_json::{Value, json};
use switchyard_k8s::{Deployment, ReplicaSet};

pub const IMAGE: &str = "registry.example/app:1";

/// An `apps/v1` `kind` (Deployment or ReplicaSet) of `replicas`, with the entries of
/// `extra_spec` (an object, or null) added to its spec or replacing what is there.
pub fn workload(kind: &str, name: &str, replicas: i32, extra_spec: Value) -> Value {
    let mut value = json!({
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": IMAGE}]}
            }
        }
    });
    if let Value::Object(extra) = extra_spec {
        for (key, entry) in extra {
            value["spec"][key] = entry;
        }
    }
    value
}

/// A Deployment (see [`workload`]).
pub fn deployment(name: &str, replicas: i32, extra_spec: Value) -> Deployment {
    serde_json::from_value(workload("Deployment", name, replicas, extra_spec))
        .expect("a valid Deployment")
}

/// A ReplicaSet (see [`workload`]).
pub fn replica_set(name: &str, replicas: i32) -> ReplicaSet {
    serde_json::from_value(workload("ReplicaSet", name, replicas, Value::Null))
        .expect("a valid ReplicaSet")
}
