//! The Lookup custom resource: a query whose answer an external service knows.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "example.switchyard.io",
    version = "v1",
    kind = "Lookup",
    namespaced
)]
#[kube(status = "LookupStatus")]
#[kube(printcolumn = r#"{"name":"Query","type":"string","jsonPath":".spec.query"}"#)]
#[kube(printcolumn = r#"{"name":"Answer","type":"string","jsonPath":".status.answer"}"#)]
pub struct LookupSpec {
    #[schemars(length(min = 1, max = 256))]
    pub query: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LookupStatus {
    /// The generation whose query was answered.
    pub observed_generation: Option<i64>,
    pub answer: Option<String>,
}
