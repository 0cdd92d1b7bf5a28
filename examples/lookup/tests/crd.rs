//! `crd.yaml` is what the Lookup type generates, so the two cannot drift. After changing the
//! type, write it again with
//! `SWITCHYARD_WRITE_CRD=1 cargo test -p switchyard-example-lookup --test crd`.

#![allow(clippy::unwrap_used)]

use switchyard_example_lookup::Lookup;
use switchyard_k8s::{
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    kube::CustomResourceExt,
};

const HEADER: &str = "# The Lookup custom resource of the example controller, generated from its type\n# (src/lookup.rs) by tests/crd.rs.\n";

#[test]
fn the_checked_in_crd_is_the_generated_one() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/crd.yaml");
    let generated = Lookup::crd();
    if std::env::var_os("SWITCHYARD_WRITE_CRD").is_some() {
        let yaml = serde_norway::to_string(&generated).unwrap();
        std::fs::write(path, format!("{HEADER}{yaml}")).unwrap();
    }
    let checked_in: CustomResourceDefinition =
        serde_norway::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(
        checked_in == generated,
        "crd.yaml differs from the CRD the Lookup type generates; write it again with \
         SWITCHYARD_WRITE_CRD=1 cargo test -p switchyard-example-lookup --test crd"
    );
}
