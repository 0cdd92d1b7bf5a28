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
