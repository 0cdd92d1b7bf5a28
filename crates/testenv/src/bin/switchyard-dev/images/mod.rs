//! `switchyard-dev images`: one OCI image archive per service and one for the plugin, from the
//! release build, with no container engine (docs/deploy.md, "Images").
//!
//! Each image is two layers: the base (what [`base`] assembles from Debian packages) and the
//! image's binaries with its SBOM ([`sbom`]). The layers are tar files written with fixed
//! owners, modes and times (the commit's), in name order; go-containerregistry's `crane`
//! (built from its Go module by `scripts/testenv.sh`) makes them an image in a registry it
//! serves on loopback for the duration, sets the configuration (entrypoint, non-root user,
//! labels), and writes it out as an OCI image layout, which is archived the same fixed way.
//! So the same binaries and packages give the same digests. Beside the archives:
//! `images.json` (each image's reference and digest), `release/kustomization.yaml` (the
//! kustomize base with every image pinned by digest) and the plugin's krew archive and
//! manifest ([`krew`]).

mod base;
mod krew;
mod sbom;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};
use serde_json::json;
use switchyard_testenv::crane::Registry;

/// The user the images run as (distroless's `nonroot`; the kustomize base's `runAsUser`).
pub(crate) const NONROOT: u32 = 65532;

/// One image: where its binaries come from and the name kustomize knows it by.
struct Spec {
    /// The image's name under the repository (`ghcr.io/switchyard/<name>`).
    name: &'static str,
    /// The workspace package whose binaries it holds.
    package: &'static str,
    /// Its binaries, the first of them the entrypoint.
    binaries: &'static [&'static str],
    /// The image name the kustomize base uses, for the services.
    kustomize: Option<&'static str>,
    description: &'static str,
}

const IMAGES: &[Spec] = &[
    Spec {
        name: "watcher",
        package: "switchyard-watcher",
        binaries: &["switchyard-watcher"],
        kustomize: Some("switchyard-watcher"),
        description: "Switchyard's watcher: informers as a service",
    },
    Spec {
        name: "queue",
        package: "switchyard-queue",
        binaries: &["switchyard-queue"],
        kustomize: Some("switchyard-queue"),
        description: "Switchyard's queue: the sharded, fenced work queue",
    },
    Spec {
        name: "reconciler",
        package: "switchyard-reconciler",
        binaries: &["switchyard-reconciler"],
        kustomize: Some("switchyard-reconciler"),
        description: "Switchyard's reconciler: the built-in controllers",
    },
    Spec {
        name: "elector",
        package: "switchyard-elector",
        binaries: &["switchyard-elector", "switchyard-etcd-access"],
        kustomize: Some("switchyard-elector"),
        description: "Switchyard's elector: membership and shard leases in etcd",
    },
    Spec {
        name: "kubectl-switchyard",
        package: "kubectl-switchyard",
        binaries: &["kubectl-switchyard"],
        kustomize: None,
        description: "kubectl switchyard: Switchyard's kubectl plugin",
    },
];

/// Where the binaries go inside an image.
const BIN_DIR: &str = "usr/local/bin";

pub(crate) struct Options {
    pub(crate) workspace: PathBuf,
    pub(crate) out: PathBuf,
    pub(crate) binaries: PathBuf,
    pub(crate) repository: String,
    pub(crate) crane: PathBuf,
    pub(crate) cache: PathBuf,
}

/// Builds every image; prints each one's reference and digest.
pub(crate) fn images(options: &Options) -> anyhow::Result<()> {
    let Options {
        workspace,
        out,
        binaries,
        repository,
        crane,
        cache,
    } = options;
    let mut missing = Vec::new();
    for spec in IMAGES {
        for binary in spec.binaries {
            if !binaries.join(binary).is_file() {
                missing.push(binaries.join(binary).display().to_string());
            }
        }
    }
    if !missing.is_empty() {
        bail!(
            "missing release binaries ({}): `make images` builds them with cargo build --release",
            missing.join(", ")
        );
    }
    if !crane.is_file() {
        bail!(
            "{} is missing: scripts/testenv.sh build builds crane from its Go module",
            crane.display()
        );
    }
    let version = env!("CARGO_PKG_VERSION");
    let source = env!("CARGO_PKG_REPOSITORY");
    let git = |args: &[&str]| -> anyhow::Result<String> {
        let out = Command::new("git")
            .args(args)
            .current_dir(workspace)
            .output()?;
        if !out.status.success() {
            bail!(
                "git {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let revision = git(&["rev-parse", "HEAD"])?;
    // Every time in the images is the commit's (or SOURCE_DATE_EPOCH's), never the clock's.
    let epoch: i64 = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(epoch) => epoch.parse().context("SOURCE_DATE_EPOCH is not a number")?,
        Err(_) => git(&["log", "-1", "--format=%ct"])?.parse()?,
    };
    let created = rfc3339(epoch);

    let work = out.join("work");
    std::fs::create_dir_all(&work)?;
    let all_binaries: Vec<PathBuf> = IMAGES
        .iter()
        .flat_map(|s| s.binaries.iter().map(|b| binaries.join(b)))
        .collect();
    let base = base::assemble(&work, cache, &all_binaries)?;
    let base_tar = work.join("base.tar");
    tar(&base.root, &base_tar, epoch)?;
    let metadata = sbom::metadata(workspace)?;

    let registry = Registry::serve(crane)?;
    let address = registry.address();
    let mut built = Vec::new();
    for spec in IMAGES {
        let reference = format!("{repository}/{}", spec.name);
        let crates = sbom::crates(&metadata, spec.package)?;
        let document = sbom::document(
            &sbom::Subject {
                image: &reference,
                version,
                revision: &revision,
                source,
                created: &created,
            },
            &crates,
            &base.debs,
        );
        let document = serde_json::to_string_pretty(&document)? + "\n";
        std::fs::write(out.join(format!("{}.spdx.json", spec.name)), &document)?;

        let app = work.join(spec.name);
        if app.exists() {
            std::fs::remove_dir_all(&app)?;
        }
        let bin_dir = app.join(BIN_DIR);
        std::fs::create_dir_all(&bin_dir)?;
        for binary in spec.binaries {
            std::fs::copy(binaries.join(binary), bin_dir.join(binary))?;
        }
        let doc_dir = app.join("usr/share/doc/switchyard");
        std::fs::create_dir_all(&doc_dir)?;
        std::fs::write(doc_dir.join("sbom.spdx.json"), &document)?;
        std::fs::copy(workspace.join("LICENSE"), doc_dir.join("LICENSE"))?;
        let app_tar = work.join(format!("{}.tar", spec.name));
        tar(&app, &app_tar, epoch)?;

        let staged = format!("{address}/switchyard/{}:{version}", spec.name);
        registry.crane(&[
            "append",
            "--oci-empty-base",
            "-f",
            path_str(&base_tar)?,
            "-f",
            path_str(&app_tar)?,
            "-t",
            &staged,
        ])?;
        let mut mutate: Vec<String> = [
            "mutate",
            &staged,
            "--entrypoint",
            &format!("/{BIN_DIR}/{}", spec.binaries[0]),
            "--user",
            &format!("{NONROOT}:{NONROOT}"),
            "--workdir",
            "/",
            "--env",
            &format!("PATH=/{BIN_DIR}"),
            "--env",
            "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
            "--set-platform",
            &platform()?,
            "-t",
            &staged,
        ]
        .map(str::to_owned)
        .into();
        for (key, value) in labels(spec, version, &revision, source, &created) {
            mutate.extend(["--label".to_owned(), format!("{key}={value}")]);
        }
        let mutate: Vec<&str> = mutate.iter().map(String::as_str).collect();
        let pushed = registry.crane(&mutate)?;
        let digest = pushed
            .trim()
            .rsplit_once('@')
            .map(|(_, d)| d.to_owned())
            .with_context(|| format!("crane mutate printed no digest: {pushed}"))?;

        let layout = work.join(format!("{}.oci", spec.name));
        if layout.exists() {
            std::fs::remove_dir_all(&layout)?;
        }
        registry.crane(&["pull", "--format", "oci", &staged, path_str(&layout)?])?;
        let archive = out.join(format!("{}.oci.tar", spec.name));
        tar(&layout, &archive, epoch)?;
        println!("{reference}:{version}@{digest}  {}", archive.display());
        built.push(json!({
            "name": spec.name,
            "reference": reference,
            "tag": version,
            "digest": digest,
            "archive": archive.file_name().and_then(|n| n.to_str()),
            "sbom": format!("{}.spdx.json", spec.name),
            "binaries": spec.binaries,
            "entrypoint": format!("/{BIN_DIR}/{}", spec.binaries[0]),
            "kustomize": spec.kustomize,
        }));
    }
    drop(registry);
    let krew_archive = krew::archive_name(version)?;
    let krew_sha256 = krew::write(
        out,
        &work,
        &binaries.join("kubectl-switchyard"),
        &workspace.join("LICENSE"),
        version,
        source,
        epoch,
    )?;
    println!(
        "{}  krew/switchyard.yaml",
        out.join(&krew_archive).display()
    );

    let manifest = json!({
        "version": version,
        "revision": revision,
        "created": created,
        "base": base.debs.iter().map(|d| json!({"name": d.name, "version": d.version, "arch": d.arch})).collect::<Vec<_>>(),
        "images": built,
        "krew": {"archive": krew_archive, "sha256": krew_sha256, "manifest": "krew/switchyard.yaml"},
    });
    std::fs::write(
        out.join("images.json"),
        serde_json::to_string_pretty(&manifest)? + "\n",
    )?;
    let release = out.join("release");
    std::fs::create_dir_all(&release)?;
    let base_dir = workspace.join("deploy/kustomize/base").canonicalize()?;
    std::fs::write(
        release.join("kustomization.yaml"),
        release_overlay(
            &relative(&release.canonicalize()?, &base_dir),
            version,
            &revision,
            &manifest["images"],
        ),
    )?;
    std::fs::remove_dir_all(&work)?;
    println!(
        "wrote {} image archives, their SBOMs, images.json, release/kustomization.yaml and the krew plugin to {}",
        IMAGES.len(),
        out.display()
    );
    Ok(())
}

/// The OCI labels of an image.
fn labels(
    spec: &Spec,
    version: &str,
    revision: &str,
    source: &str,
    created: &str,
) -> Vec<(&'static str, String)> {
    vec![
        ("org.opencontainers.image.title", spec.name.to_owned()),
        (
            "org.opencontainers.image.description",
            spec.description.to_owned(),
        ),
        ("org.opencontainers.image.source", source.to_owned()),
        ("org.opencontainers.image.revision", revision.to_owned()),
        ("org.opencontainers.image.version", version.to_owned()),
        ("org.opencontainers.image.created", created.to_owned()),
        (
            "org.opencontainers.image.licenses",
            env!("CARGO_PKG_LICENSE").to_owned(),
        ),
        (
            "org.opencontainers.image.base.name",
            format!("debian packages: {}", base::PACKAGES.join(" ")),
        ),
    ]
}

/// The release overlay: the base, every service's image pinned by digest, and the version as
/// the workloads' `app.kubernetes.io/version` label (their Pods' too, not their selectors).
/// The images are named by their full names, as an overlay above it names them to move to
/// other digests (`kustomize edit set image ghcr.io/switchyard/queue@sha256:…`).
fn release_overlay(
    base: &Path,
    version: &str,
    revision: &str,
    images: &serde_json::Value,
) -> String {
    let mut text = format!(
        "# Switchyard {version}, written by `make images` at {revision}:\n\
         # the kustomize base with every image pinned by its digest. Apply it, or name it in\n\
         # your overlay's resources.\n\
         apiVersion: kustomize.config.k8s.io/v1beta1\n\
         kind: Kustomization\n\
         resources:\n  - {}\n\
         labels:\n  - pairs: {{app.kubernetes.io/version: \"{version}\"}}\n    includeTemplates: true\n\
         images:\n",
        base.display()
    );
    for image in images.as_array().into_iter().flatten() {
        if image["kustomize"].is_null() {
            continue;
        }
        text.push_str(&format!(
            "  - name: {}\n    digest: {}\n",
            image["reference"].as_str().unwrap_or_default(),
            image["digest"].as_str().unwrap_or_default()
        ));
    }
    text
}

/// `to` relative to the directory `from` (both absolute and canonical): kustomize takes other
/// kustomizations by relative path.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to_parts: Vec<_> = to.components().collect();
    let common = from
        .iter()
        .zip(&to_parts)
        .take_while(|(a, b)| a == b)
        .count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for part in &to_parts[common..] {
        path.push(part);
    }
    path
}

/// A tar of `dir`'s contents, the same bytes for the same files: names sorted, owner root,
/// every time `epoch`.
fn tar(dir: &Path, file: &Path, epoch: i64) -> anyhow::Result<()> {
    run(Command::new("tar")
        .args([
            "--create",
            "--format=gnu",
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
        ])
        .arg(format!("--mtime=@{epoch}"))
        .arg("--file")
        .arg(file)
        .arg("--directory")
        .arg(dir)
        .arg("."))
}

/// `linux/<arch>` for this machine, in OCI's words.
fn platform() -> anyhow::Result<String> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => bail!("no OCI architecture name known for {other}"),
    };
    Ok(format!("linux/{arch}"))
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

/// Runs a command, failing with its stderr.
pub(crate) fn run(command: &mut Command) -> anyhow::Result<()> {
    let out = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{command:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// RFC 3339 in UTC for seconds since the epoch.
fn rfc3339(epoch: i64) -> String {
    let days = epoch.div_euclid(86_400);
    let secs = epoch.rem_euclid(86_400);
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_in_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_824_000), "2026-11-28T00:00:00Z");
        assert_eq!(rfc3339(951_827_696), "2000-02-29T12:34:56Z");
    }

    #[test]
    fn the_release_overlay_pins_every_service_by_digest() {
        let images = json!([
            {"kustomize": "switchyard-queue", "reference": "ghcr.io/switchyard/queue", "digest": "sha256:aa"},
            {"kustomize": null, "reference": "ghcr.io/switchyard/kubectl-switchyard", "digest": "sha256:bb"}
        ]);
        let text = release_overlay(
            Path::new("../../deploy/kustomize/base"),
            "0.1.0",
            "abc",
            &images,
        );
        assert!(
            text.contains("resources:\n  - ../../deploy/kustomize/base\n"),
            "{text}"
        );
        assert!(
            text.contains("  - name: ghcr.io/switchyard/queue\n    digest: sha256:aa\n"),
            "{text}"
        );
        assert!(
            text.contains("app.kubernetes.io/version: \"0.1.0\""),
            "{text}"
        );
        assert!(
            !text.contains("kubectl-switchyard"),
            "the plugin is not deployed"
        );
    }

    #[test]
    fn relative_paths_climb_to_the_common_ancestor() {
        assert_eq!(
            relative(
                Path::new("/w/target/images/release"),
                Path::new("/w/deploy/kustomize/base")
            ),
            Path::new("../../../deploy/kustomize/base")
        );
    }

    #[test]
    fn every_service_of_the_kustomize_base_has_an_image() {
        let names: Vec<_> = IMAGES.iter().filter_map(|s| s.kustomize).collect();
        assert_eq!(
            names,
            [
                "switchyard-watcher",
                "switchyard-queue",
                "switchyard-reconciler",
                "switchyard-elector"
            ]
        );
    }
}
