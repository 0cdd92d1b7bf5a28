//! The crate boundaries of docs/architecture.md, checked on the workspace's own metadata:
//! a service's crates depend (outside tests) only on their own service's crates, on pure
//! `core` crates, and on the shared crates under `crates/` and `proto/`. Services talk over
//! the contracts, never through each other's code.

#![allow(clippy::unwrap_used)]

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

/// Where a workspace crate sits: the service it belongs to (`services/<service>/...`), and
/// whether it is a pure core crate.
#[derive(Debug)]
struct Place {
    service: Option<String>,
    core: bool,
}

fn place(root: &Path, manifest: &Path) -> Place {
    let dir = manifest.parent().unwrap().strip_prefix(root).unwrap();
    let parts: Vec<&str> = dir.iter().map(|p| p.to_str().unwrap()).collect();
    Place {
        service: (parts.first() == Some(&"services")).then(|| parts[1].to_owned()),
        core: parts.last() == Some(&"core"),
    }
}

#[test]
fn services_depend_on_contracts_never_on_each_other() {
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version=1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let root = PathBuf::from(metadata["workspace_root"].as_str().unwrap());
    let packages = metadata["packages"].as_array().unwrap();
    let places: BTreeMap<&str, Place> = packages
        .iter()
        .map(|p| {
            let manifest = Path::new(p["manifest_path"].as_str().unwrap());
            (p["name"].as_str().unwrap(), place(&root, manifest))
        })
        .collect();
    assert!(
        places.values().filter(|p| p.service.is_some()).count() >= 8,
        "the four services and their cores are found: {places:?}"
    );

    let mut crossings = Vec::new();
    for package in packages {
        let name = package["name"].as_str().unwrap();
        let Some(service) = &places[name].service else {
            continue;
        };
        for dependency in package["dependencies"].as_array().unwrap() {
            // `kind` is null for normal dependencies, "dev" or "build" otherwise.
            if !dependency["kind"].is_null() {
                continue;
            }
            let Some(target) = places.get(dependency["name"].as_str().unwrap()) else {
                continue;
            };
            if let Some(other) = &target.service
                && other != service
                && !target.core
            {
                crossings.push(format!("{name} -> {}", dependency["name"]));
            }
        }
    }
    assert!(
        crossings.is_empty(),
        "service crates depending on another service's crate: {crossings:?}"
    );
}

/// Every method of every Switchyard service in the contracts has a row in the authorization
/// table (a method without one is refused to everyone at run time), and every Switchyard row
/// of the table names a method or a service of the contracts (a row for a removed method
/// would open it again if the name came back).
#[test]
fn every_contract_method_has_an_authorization_row_and_every_row_a_method() {
    use prost::Message;
    use switchyard_runtime::authz::{TABLE, access};

    let set =
        prost_types::FileDescriptorSet::decode(switchyard_proto::FILE_DESCRIPTOR_SET).unwrap();
    let mut methods = Vec::new();
    for file in &set.file {
        for service in &file.service {
            let prefix = format!("/{}.{}/", file.package(), service.name());
            for method in &service.method {
                methods.push(format!("{prefix}{}", method.name()));
            }
        }
    }
    assert!(methods.len() > 10, "{methods:?}");
    let missing: Vec<&String> = methods.iter().filter(|m| access(m).is_none()).collect();
    assert!(missing.is_empty(), "methods without a row: {missing:?}");
    let stale: Vec<&str> = TABLE
        .iter()
        .map(|(path, _)| *path)
        .filter(|path| path.starts_with("/switchyard."))
        .filter(|path| {
            !methods
                .iter()
                .any(|m| m == path || (path.ends_with('/') && m.starts_with(path)))
        })
        .collect();
    assert!(stale.is_empty(), "rows naming no method: {stale:?}");
}
