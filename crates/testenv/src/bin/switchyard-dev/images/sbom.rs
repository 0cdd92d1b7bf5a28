//! Each image's software bill of materials, as an SPDX 2.3 JSON document: the Rust crates
//! compiled into its binaries (the package's normal dependencies for this platform, from
//! `cargo metadata`) and the Debian packages of its base.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Command,
};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::base::Deb;

/// The crates a workspace package's binaries are built from: (name, version, source, license)
/// for the package itself and every normal dependency reachable from it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Crate {
    pub(crate) name: String,
    pub(crate) version: String,
    pub(crate) registry: bool,
    pub(crate) license: Option<String>,
}

/// `cargo metadata` for the workspace at `dir`, filtered to the host platform.
pub(crate) fn metadata(dir: &Path) -> anyhow::Result<Value> {
    let host = Command::new("rustc").arg("-vV").output()?;
    let host = String::from_utf8_lossy(&host.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .context("rustc -vV names no host")?;
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "metadata",
            "--format-version=1",
            "--locked",
            "--filter-platform",
        ])
        .arg(&host)
        .current_dir(dir)
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The crates of `package` (a workspace member's name) in `metadata`.
pub(crate) fn crates(metadata: &Value, package: &str) -> anyhow::Result<BTreeSet<Crate>> {
    let packages: BTreeMap<&str, &Value> = metadata["packages"]
        .as_array()
        .context("cargo metadata: no packages")?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let root = metadata["workspace_members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find(|id| packages.get(id).and_then(|p| p["name"].as_str()) == Some(package))
        .with_context(|| format!("{package} is not a workspace member"))?;
    let nodes: BTreeMap<&str, &Value> = metadata["resolve"]["nodes"]
        .as_array()
        .context("cargo metadata: no resolve graph")?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let mut seen = BTreeSet::new();
    let mut pending = vec![root];
    while let Some(id) = pending.pop() {
        if !seen.insert(id) {
            continue;
        }
        for dep in nodes
            .get(id)
            .and_then(|n| n["deps"].as_array())
            .into_iter()
            .flatten()
        {
            // Normal dependencies only: build scripts' and tests' do not end up in the binary.
            let normal = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null());
            if let (true, Some(dep)) = (normal, dep["pkg"].as_str()) {
                pending.push(dep);
            }
        }
    }
    seen.into_iter()
        .map(|id| {
            let p = packages
                .get(id)
                .with_context(|| format!("cargo metadata: no package {id}"))?;
            Ok(Crate {
                name: p["name"].as_str().unwrap_or_default().to_owned(),
                version: p["version"].as_str().unwrap_or_default().to_owned(),
                registry: p["source"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("registry+")),
                license: p["license"].as_str().map(spdx_expression),
            })
        })
        .collect()
}

/// Cargo's older `MIT/Apache-2.0` form as the SPDX expression it means.
fn spdx_expression(license: &str) -> String {
    license.replace('/', " OR ")
}

/// What the document says about the image it describes.
pub(crate) struct Subject<'a> {
    pub(crate) image: &'a str,
    pub(crate) version: &'a str,
    pub(crate) revision: &'a str,
    pub(crate) source: &'a str,
    /// The commit's time, RFC 3339: the document is reproducible.
    pub(crate) created: &'a str,
}

/// The SPDX document for one image.
pub(crate) fn document(subject: &Subject<'_>, crates: &BTreeSet<Crate>, debs: &[Deb]) -> Value {
    let image_id = "SPDXRef-Image";
    let mut packages = vec![json!({
        "SPDXID": image_id,
        "name": subject.image,
        "versionInfo": subject.version,
        "downloadLocation": subject.source,
        "sourceInfo": format!("built from revision {}", subject.revision),
        "primaryPackagePurpose": "CONTAINER",
        "filesAnalyzed": false,
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "NOASSERTION",
        "copyrightText": "NOASSERTION",
    })];
    let mut relationships = vec![json!({
        "spdxElementId": "SPDXRef-DOCUMENT",
        "relationshipType": "DESCRIBES",
        "relatedSpdxElement": image_id,
    })];
    let mut contains = |id: String, package: Value| {
        relationships.push(json!({
            "spdxElementId": image_id,
            "relationshipType": "CONTAINS",
            "relatedSpdxElement": id,
        }));
        packages.push(package);
    };
    for c in crates {
        let id = spdx_id("crate", &c.name, &c.version);
        contains(
            id.clone(),
            json!({
                "SPDXID": id,
                "name": c.name,
                "versionInfo": c.version,
                "downloadLocation": if c.registry {
                    format!("https://crates.io/api/v1/crates/{}/{}/download", c.name, c.version)
                } else {
                    subject.source.to_owned()
                },
                "filesAnalyzed": false,
                "licenseConcluded": "NOASSERTION",
                "licenseDeclared": c.license.as_deref().unwrap_or("NOASSERTION"),
                "copyrightText": "NOASSERTION",
                "externalRefs": [{
                    "referenceCategory": "PACKAGE-MANAGER",
                    "referenceType": "purl",
                    "referenceLocator": format!("pkg:cargo/{}@{}", c.name, c.version),
                }],
            }),
        );
    }
    for deb in debs {
        let id = spdx_id("deb", &deb.name, &deb.version);
        contains(
            id.clone(),
            json!({
                "SPDXID": id,
                "name": deb.name,
                "versionInfo": deb.version,
                "supplier": "Organization: Debian",
                "downloadLocation": "NOASSERTION",
                "filesAnalyzed": false,
                "licenseConcluded": "NOASSERTION",
                "licenseDeclared": "NOASSERTION",
                "copyrightText": "NOASSERTION",
                "comment": format!("its copyright: /usr/share/doc/{}/copyright", deb.name),
                "externalRefs": [{
                    "referenceCategory": "PACKAGE-MANAGER",
                    "referenceType": "purl",
                    "referenceLocator": format!(
                        "pkg:deb/debian/{}@{}?arch={}",
                        deb.name,
                        purl_escape(&deb.version),
                        deb.arch
                    ),
                }],
            }),
        );
    }
    json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": format!("{}-{}", subject.image, subject.version),
        "documentNamespace": format!(
            "{}/spdx/{}-{}-{}",
            subject.source, subject.image, subject.version, subject.revision
        ),
        "creationInfo": {
            "created": subject.created,
            "creators": ["Tool: switchyard-dev images"],
        },
        "packages": packages,
        "relationships": relationships,
    })
}

/// An SPDX identifier: letters, digits, `.` and `-` only.
fn spdx_id(kind: &str, name: &str, version: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    };
    format!("SPDXRef-{kind}-{}-{}", clean(name), clean(version))
}

/// A purl version: anything but unreserved characters percent-encoded (`+` in Debian's).
fn purl_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'-' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata() -> Value {
        json!({
            "packages": [
                {"id": "app", "name": "app", "version": "0.1.0", "source": null, "license": "Apache-2.0"},
                {"id": "tokio", "name": "tokio", "version": "1.0.0",
                 "source": "registry+https://github.com/rust-lang/crates.io-index", "license": "MIT"},
                {"id": "cc", "name": "cc", "version": "1.2.0",
                 "source": "registry+https://github.com/rust-lang/crates.io-index", "license": "MIT/Apache-2.0"},
                {"id": "mio", "name": "mio", "version": "1.0.0",
                 "source": "registry+https://github.com/rust-lang/crates.io-index", "license": "MIT"}
            ],
            "workspace_members": ["app"],
            "resolve": {"nodes": [
                {"id": "app", "deps": [
                    {"pkg": "tokio", "dep_kinds": [{"kind": null, "target": null}]},
                    {"pkg": "cc", "dep_kinds": [{"kind": "build", "target": null}]}
                ]},
                {"id": "tokio", "deps": [{"pkg": "mio", "dep_kinds": [{"kind": null, "target": null}]}]},
                {"id": "cc", "deps": []},
                {"id": "mio", "deps": []}
            ]}
        })
    }

    #[test]
    fn the_crates_are_the_normal_dependency_closure() {
        let crates = super::crates(&metadata(), "app").unwrap();
        let names: Vec<&str> = crates.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["app", "mio", "tokio"],
            "build dependencies are left out"
        );
        assert!(crates.iter().any(|c| c.name == "tokio" && c.registry));
        assert!(super::crates(&metadata(), "nope").is_err());
    }

    #[test]
    fn the_document_describes_the_image_and_contains_crates_and_packages() {
        let crates = super::crates(&metadata(), "app").unwrap();
        let debs = [Deb {
            name: "libc6".into(),
            version: "2.36-9+deb12u14".into(),
            arch: "amd64".into(),
            path: "/x.deb".into(),
        }];
        let subject = Subject {
            image: "ghcr.io/switchyard/queue",
            version: "0.1.0",
            revision: "abc",
            source: "https://github.com/switchyard/switchyard",
            created: "2026-11-29T00:00:00Z",
        };
        let doc = document(&subject, &crates, &debs);
        assert_eq!(doc["spdxVersion"], "SPDX-2.3");
        let packages = doc["packages"].as_array().unwrap();
        assert_eq!(packages.len(), 1 + 3 + 1);
        let libc = packages.iter().find(|p| p["name"] == "libc6").unwrap();
        assert_eq!(
            libc["externalRefs"][0]["referenceLocator"],
            "pkg:deb/debian/libc6@2.36-9%2Bdeb12u14?arch=amd64"
        );
        assert_eq!(libc["SPDXID"], "SPDXRef-deb-libc6-2.36-9-deb12u14");
        let contains = doc["relationships"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["relationshipType"] == "CONTAINS")
            .count();
        assert_eq!(contains, 4);
        assert_eq!(
            super::crates(&metadata(), "app")
                .unwrap()
                .iter()
                .find(|c| c.name == "mio")
                .unwrap()
                .license
                .as_deref(),
            Some("MIT")
        );
        assert_eq!(spdx_expression("MIT/Apache-2.0"), "MIT OR Apache-2.0");
    }
}
