//! The Greeting custom resource: its type, and its CRD generated from it.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The finalizer that deletes the ConfigMap before the Greeting goes.
pub const FINALIZER: &str = "example.switchyard.io/cleanup";

/// The ConfigMap a Greeting named `name` controls.
pub fn config_map_name(name: &str) -> String {
    format!("greeting-{name}")
}

#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "example.switchyard.io",
    version = "v1",
    kind = "Greeting",
    namespaced
)]
#[kube(status = "GreetingStatus")]
#[kube(printcolumn = r#"{"name":"Message","type":"string","jsonPath":".spec.message"}"#)]
#[kube(printcolumn = r#"{"name":"ConfigMap","type":"string","jsonPath":".status.configMap"}"#)]
pub struct GreetingSpec {
    #[schemars(length(max = 1024))]
    pub message: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GreetingStatus {
    pub observed_generation: Option<i64>,
    pub config_map: Option<String>,
}
