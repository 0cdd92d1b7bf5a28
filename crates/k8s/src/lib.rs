//! The Kubernetes types and client Switchyard uses, re-exported from one place so that the
//! API version (`v1_35`, set on k8s-openapi in the workspace manifest) is chosen once.

pub use k8s_openapi::{
    self, Metadata, Resource,
    api::{
        apps::v1::{Deployment, ReplicaSet},
        coordination::v1::Lease,
        core::v1::{Namespace, Node, Pod},
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
pub use kube::{
    self, Api, Client, Config,
    api::{DeleteParams, ListParams, PostParams},
    runtime::{wait::await_condition, watcher},
};

pub mod args;
pub mod discovery;

pub use args::{KubeArgs, KubeError, await_apiserver};
