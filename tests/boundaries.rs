//! The crate boundaries of docs/architecture.md, checked on the workspace's own metadata:
//! a service's crates depend (outside tests) only on their own service's crates and on the
//! shared crates under `crates/` and `proto/`, which depend on no service's crate. Services
//! talk over the contracts, never through each other's code. A pure crate (a service's
//! `core`, and the shared vocabulary) does no I/O: no async runtime, gRPC, Kubernetes, etcd
//! or HTTP client among its dependencies.

#![allow(clippy::unwrap_used)]

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::Deserialize;
use switchyard_tests::cargo_metadata;

/// The shared crates that are pure as the cores are: the vocabulary services share.
const PURE_SHARED: [&str; 3] = [
    "switchyard-work",
    "switchyard-ownership",
    "switchyard-selector",
];

/// What a pure crate may not depend on, directly or through another crate.
const IO_CRATES: [&str; 6] = [
    "tokio",
    "tonic",
    "kube",
    "kube-client",
    "etcd-client",
    "reqwest",
];

/// Where a workspace crate sits: the service it belongs to (`services/<service>/...`),
/// whether it is shared (`crates/`, `proto/`), and whether it is pure.
#[derive(Debug)]
struct Place {
    service: Option<String>,
    shared: bool,
    pure: bool,
}

fn place(root: &Path, manifest: &Path, name: &str) -> Place {
    let dir = manifest.parent().unwrap().strip_prefix(root).unwrap();
    let parts: Vec<&str> = dir.iter().map(|p| p.to_str().unwrap()).collect();
    Place {
        service: (parts.first() == Some(&"services")).then(|| parts[1].to_owned()),
        shared: matches!(parts.first(), Some(&"crates" | &"proto")),
        pure: parts.last() == Some(&"core") || PURE_SHARED.contains(&name),
    }
}

fn places(metadata: &serde_json::Value) -> BTreeMap<String, Place> {
    let root = PathBuf::from(metadata["workspace_root"].as_str().unwrap());
    metadata["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| {
            let package = metadata["packages"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["id"] == *id)
                .unwrap();
            let name = package["name"].as_str().unwrap();
            let manifest = Path::new(package["manifest_path"].as_str().unwrap());
            (name.to_owned(), place(&root, manifest, name))
        })
        .collect()
}

#[test]
fn services_depend_on_contracts_never_on_each_other() {
    let metadata = cargo_metadata(true);
    let places = places(&metadata);
    assert!(
        places.values().filter(|p| p.service.is_some()).count() >= 8,
        "the four services and their cores are found: {places:?}"
    );
    assert!(
        PURE_SHARED
            .iter()
            .all(|name| places.get(*name).is_some_and(|p| p.shared)),
        "the pure shared crates live under crates/: {places:?}"
    );

    let mut crossings = Vec::new();
    for package in metadata["packages"].as_array().unwrap() {
        let name = package["name"].as_str().unwrap();
        let from = &places[name];
        if from.service.is_none() && !from.shared {
            // Tools, examples and tests use whatever they exercise.
            continue;
        }
        for dependency in package["dependencies"].as_array().unwrap() {
            // `kind` is null for normal dependencies, "dev" or "build" otherwise.
            if !dependency["kind"].is_null() {
                continue;
            }
            let Some(target) = places.get(dependency["name"].as_str().unwrap()) else {
                continue;
            };
            if let Some(other) = &target.service
                && from.service.as_ref() != Some(other)
            {
                crossings.push(format!("{name} -> {}", dependency["name"]));
            }
        }
    }
    assert!(
        crossings.is_empty(),
        "crates depending on another service's crate: {crossings:?}"
    );
}

/// Every pure crate's normal dependencies, followed through the whole graph, include none of
/// [`IO_CRATES`].
#[test]
fn pure_crates_pull_in_no_io() {
    let metadata = cargo_metadata(false);
    let places = places(&metadata);
    let nodes = metadata["resolve"]["nodes"].as_array().unwrap();
    let package_name = |id: &serde_json::Value| -> String {
        metadata["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == *id)
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .unwrap()
    };
    let mut found = Vec::new();
    for (name, place) in &places {
        if !place.pure {
            continue;
        }
        let start = metadata["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name.as_str() && p["source"].is_null())
            .map(|p| p["id"].clone())
            .unwrap();
        // Normal dependencies only, transitively.
        let mut seen = vec![start.clone()];
        let mut stack = vec![(start, vec![name.clone()])];
        while let Some((id, path)) = stack.pop() {
            let node = nodes.iter().find(|n| n["id"] == id).unwrap();
            for dep in node["deps"].as_array().unwrap() {
                let normal = dep["dep_kinds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k["kind"].is_null());
                if !normal || seen.contains(&dep["pkg"]) {
                    continue;
                }
                seen.push(dep["pkg"].clone());
                let dep_name = package_name(&dep["pkg"]);
                let mut path = path.clone();
                path.push(dep_name.clone());
                if IO_CRATES.contains(&dep_name.as_str()) {
                    found.push(path.join(" -> "));
                    continue;
                }
                stack.push((dep["pkg"].clone(), path));
            }
        }
    }
    assert!(found.is_empty(), "pure crates depending on I/O: {found:#?}");
}

/// `make package-sdk` packages the SDK with every workspace crate it is built from (its
/// normal dependencies, followed through), and each of them can be packaged: none is kept
/// from publishing, and each workspace dependency names its version.
#[test]
fn the_sdk_is_packaged_with_every_crate_it_is_built_from() {
    let makefile =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Makefile")).unwrap();
    let listed: std::collections::BTreeSet<&str> = makefile
        .lines()
        .find_map(|line| line.strip_prefix("SDK_PACKAGES := "))
        .unwrap()
        .split_whitespace()
        .collect();
    let metadata = cargo_metadata(true);
    let packages = metadata["packages"].as_array().unwrap();
    let package = |name: &str| packages.iter().find(|p| p["name"] == name).unwrap();
    let mut closure = std::collections::BTreeSet::new();
    let mut stack = vec!["switchyard-sdk".to_owned()];
    while let Some(name) = stack.pop() {
        if !closure.insert(name.clone()) {
            continue;
        }
        let package = package(&name);
        assert!(
            package["publish"].is_null(),
            "{name} is kept from publishing: {}",
            package["publish"]
        );
        for dependency in package["dependencies"].as_array().unwrap() {
            if !dependency["kind"].is_null() || dependency["path"].is_null() {
                continue;
            }
            let dep = dependency["name"].as_str().unwrap();
            assert_ne!(
                dependency["req"], "*",
                "{name}'s dependency {dep} names no version"
            );
            stack.push(dep.to_owned());
        }
    }
    let closure: std::collections::BTreeSet<&str> = closure.iter().map(String::as_str).collect();
    assert_eq!(listed, closure, "SDK_PACKAGES in the Makefile");
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

/// `(group, resource, verb)` triples, one per verb on a resource of a group.
type Grants = std::collections::BTreeSet<(String, String, String)>;

/// The kustomize base's ClusterRoles, by name, as the triples their rules grant.
fn base_cluster_roles() -> BTreeMap<String, Grants> {
    let text = include_str!("../deploy/kustomize/base/rbac.yaml");
    let mut roles = BTreeMap::new();
    for document in serde_norway::Deserializer::from_str(text) {
        let value = serde_norway::Value::deserialize(document).unwrap();
        if value["kind"].as_str() != Some("ClusterRole") {
            continue;
        }
        let name = value["metadata"]["name"].as_str().unwrap().to_owned();
        let mut grants = Grants::new();
        for rule in value["rules"].as_sequence().unwrap() {
            let list = |field: &str| -> Vec<String> {
                rule[field]
                    .as_sequence()
                    .map(|s| s.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
                    .unwrap_or_default()
            };
            assert!(
                rule.get("resourceNames").is_none(),
                "{name}: a rule with resourceNames is not a grant this check reads"
            );
            for group in list("apiGroups") {
                for resource in list("resources") {
                    for verb in list("verbs") {
                        grants.insert((group.clone(), resource.clone(), verb));
                    }
                }
            }
        }
        roles.insert(name, grants);
    }
    roles
}

fn expand(permissions: &[switchyard_reconciler::Permission]) -> Grants {
    let mut grants = Grants::new();
    for permission in permissions {
        for resource in permission.resources {
            for verb in permission.verbs {
                grants.insert((
                    permission.group.to_owned(),
                    (*resource).to_owned(),
                    (*verb).to_owned(),
                ));
            }
        }
    }
    grants
}

fn differences(role: &str, granted: &Grants, declared: &Grants) -> Vec<String> {
    let mut out: Vec<String> = granted
        .difference(declared)
        .map(|g| format!("{role} grants {g:?}, which nothing declares"))
        .collect();
    out.extend(
        declared
            .difference(granted)
            .map(|g| format!("{role} lacks {g:?}, which is declared")),
    );
    out
}

/// Each built-in controller's account holds exactly what the controller declares
/// (`PERMISSIONS` beside it), and the watcher's account exactly get, list and watch on the
/// kinds the built-in controllers' watches name: a new controller, kind or verb fails here
/// until its RBAC rule says the same, and a rule left behind fails too.
#[test]
fn every_built_in_controller_s_role_grants_what_it_declares_and_nothing_more() {
    use switchyard_k8s::kube::{api::ApiResource, core::GroupVersionKind};

    let roles = base_cluster_roles();
    let mut problems = Vec::new();
    for builtin in switchyard_reconciler::BUILTINS {
        let account = builtin.service_account;
        let Some(granted) = roles.get(account) else {
            problems.push(format!("no ClusterRole {account} for {}", builtin.name));
            continue;
        };
        problems.extend(differences(account, granted, &expand(builtin.permissions)));
    }

    // The watcher: what the built-in controllers register, read and watched, nothing else;
    // and the reconciler's identity granted those kinds in full, nothing else.
    // (group, version, kind) -> whether a built-in caches it in full.
    let mut kinds = BTreeMap::new();
    for (_, watches) in switchyard_reconciler::builtin_controllers().watches() {
        for watch in watches.all() {
            let full = !watch.options.metadata_only;
            let gvk = &watch.gvk;
            let kind = (gvk.group.clone(), gvk.version.clone(), gvk.kind.clone());
            *kinds.entry(kind).or_insert(false) |= full;
            // The kind between is read for its owner reference alone.
            if let Some(via) = &watch.through {
                let kind = (via.group.clone(), via.version.clone(), via.kind.clone());
                kinds.entry(kind).or_insert(false);
            }
        }
    }
    let mut watched = Grants::new();
    let mut declared_kinds = std::collections::BTreeSet::new();
    for ((group, version, kind), full) in &kinds {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        for verb in ["get", "list", "watch"] {
            watched.insert((group.clone(), resource.plural.clone(), verb.to_owned()));
        }
        declared_kinds.insert((resource.api_version.clone(), kind.clone(), *full));
    }
    problems.extend(differences(
        "switchyard-watcher",
        &roles["switchyard-watcher"],
        &watched,
    ));
    let config: serde_norway::Value =
        serde_norway::from_str(include_str!("../deploy/kustomize/base/watcher-config.yaml"))
            .unwrap();
    let grant = config["registrations"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|g| g["serviceAccount"] == "switchyard-reconciler")
        .expect("watcher-config.yaml grants switchyard-reconciler");
    let mut granted_kinds = std::collections::BTreeSet::new();
    for kind in grant["kinds"].as_sequence().unwrap() {
        granted_kinds.insert((
            kind["apiVersion"].as_str().unwrap().to_owned(),
            kind["kind"].as_str().unwrap().to_owned(),
            kind["objects"].as_str() == Some("full"),
        ));
    }
    for kind in granted_kinds.difference(&declared_kinds) {
        problems.push(format!(
            "watcher-config.yaml grants switchyard-reconciler {kind:?} (apiVersion, kind, in \
             full), which no built-in controller watches so"
        ));
    }
    for kind in declared_kinds.difference(&granted_kinds) {
        problems.push(format!(
            "a built-in controller watches {kind:?} (apiVersion, kind, in full), which \
             watcher-config.yaml does not grant switchyard-reconciler so"
        ));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}
