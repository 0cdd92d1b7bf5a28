//! The images `make images` writes (docs/deploy.md, "Images"), as a user meets them: each
//! archive loads into a registry (`crane registry serve` on loopback) under the digest
//! images.json names, runs its entrypoint from its unpacked root filesystem as the non-root
//! user with nothing of this machine's (`--version` and `--help`), and holds only what it
//! should; assembling them again from the same binaries gives the same digests; the release
//! overlay pins every service by digest, and an upgrade as docs/deploy.md writes it moves every
//! workload on the control plane to the next release's digests.
//!
//! They need `make images` first: `make test-images` runs both (`.ci/run` does, after
//! `make test`), so `make test` skips them. The version check runs in `make test`.

#![allow(clippy::unwrap_used)]

#[path = "deploy_support.rs"]
mod support;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde_json::Value;
use support::{apply_cleanly, kubectl, kustomize_build, relative_to};
use switchyard_testenv::{Binaries, ControlPlane};

const NEEDS_IMAGES: &str = "needs `make images`: make test-images runs it";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// What `make images` wrote: `$SWITCHYARD_IMAGES`, or target/images.
fn images_dir() -> PathBuf {
    std::env::var_os("SWITCHYARD_IMAGES")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/images"))
}

fn manifest() -> Value {
    let path = images_dir().join("images.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run `make images` first", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn images(manifest: &Value) -> &Vec<Value> {
    manifest["images"].as_array().unwrap()
}

fn crane() -> PathBuf {
    Binaries::locate().unwrap().path("crane")
}

fn run(command: &mut Command) -> String {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A registry on loopback (`crane registry serve`), stopped on drop.
struct Registry(switchyard_testenv::crane::Registry);

impl Registry {
    fn serve() -> Self {
        Self(switchyard_testenv::crane::Registry::serve(&crane()).unwrap())
    }

    fn address(&self) -> &str {
        self.0.address()
    }

    fn crane(&self, args: &[&str]) -> String {
        self.0.crane(args).unwrap()
    }

    /// Unpacks an archive (an OCI image layout in a tar) and pushes it; returns the digest
    /// the registry gives it.
    fn load(&self, archive: &Path, reference: &str, scratch: &Path) -> String {
        let layout = scratch.join("layout");
        std::fs::create_dir_all(&layout).unwrap();
        run(Command::new("tar")
            .arg("--extract")
            .arg("--file")
            .arg(archive)
            .arg("--directory")
            .arg(&layout));
        let pushed = self.crane(&["push", layout.to_str().unwrap(), reference]);
        pushed.trim().rsplit_once('@').unwrap().1.to_owned()
    }
}

/// Runs `path` with `args` inside `root` as the images' user: chroot as root, otherwise in
/// a user namespace of its own (as the mapped root: there is no other user to become).
fn run_inside(root: &Path, path: &str, args: &[&str]) -> std::process::Output {
    let root_user = run(Command::new("id").arg("-u")).trim() == "0";
    let mut command = if root_user {
        let mut c = Command::new(on_path("chroot"));
        c.arg("--userspec=65532:65532").arg(root);
        c
    } else {
        let mut c = Command::new(on_path("unshare"));
        c.args(["--user", "--map-root-user", "chroot"]).arg(root);
        c
    };
    // Nothing of this process's environment: the image's own PATH.
    command
        .arg(path)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin")
        .output()
        .unwrap()
}

/// `program` on this process's PATH (the child's environment is the image's).
fn on_path(program: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("{program} is not on PATH"))
}

#[test]
#[ignore = "needs make images: make test-images runs it"]
fn every_archive_loads_into_a_registry_and_its_entrypoint_runs_from_its_root_filesystem() {
    let manifest = manifest();
    let version = manifest["version"].as_str().unwrap();
    assert_eq!(
        version,
        env!("CARGO_PKG_VERSION"),
        "images of another version: {NEEDS_IMAGES}"
    );
    let registry = Registry::serve();
    let scratch = tempfile::tempdir().unwrap();
    let names: Vec<&str> = images(&manifest)
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "watcher",
            "queue",
            "reconciler",
            "elector",
            "kubectl-switchyard"
        ]
    );
    for image in images(&manifest) {
        let name = image["name"].as_str().unwrap();
        let dir = scratch.path().join(name);
        let reference = format!("{}/switchyard/{name}:{version}", registry.address());
        let archive = images_dir().join(image["archive"].as_str().unwrap());
        let digest = registry.load(&archive, &reference, &dir);
        assert_eq!(
            digest, image["digest"],
            "{name}: the digest images.json names"
        );

        // An OCI image for this platform, run as the non-root user, labelled.
        let manifest: Value =
            serde_json::from_str(&registry.crane(&["manifest", &reference])).unwrap();
        assert_eq!(
            manifest["mediaType"], "application/vnd.oci.image.manifest.v1+json",
            "{name}: {manifest}"
        );
        assert_eq!(
            manifest["layers"].as_array().unwrap().len(),
            2,
            "{name}: base and binaries"
        );
        let config: Value = serde_json::from_str(&registry.crane(&["config", &reference])).unwrap();
        assert_eq!(config["os"], "linux", "{name}");
        assert_eq!(config["config"]["User"], "65532:65532", "{name}");
        let entrypoint = image["entrypoint"].as_str().unwrap();
        assert_eq!(
            config["config"]["Entrypoint"],
            serde_json::json!([entrypoint])
        );
        let labels = &config["config"]["Labels"];
        assert_eq!(
            labels["org.opencontainers.image.version"], version,
            "{name}"
        );
        assert_eq!(
            labels["org.opencontainers.image.revision"],
            manifest_revision(),
            "{name}"
        );
        assert_eq!(
            labels["org.opencontainers.image.source"],
            env!("CARGO_PKG_REPOSITORY")
        );

        // Its root filesystem, as a runtime unpacks it.
        let root = dir.join("root");
        std::fs::create_dir_all(&root).unwrap();
        let exported = dir.join("rootfs.tar");
        registry.crane(&["export", &reference, exported.to_str().unwrap()]);
        run(Command::new("tar")
            .arg("--extract")
            .arg("--file")
            .arg(&exported)
            .arg("--directory")
            .arg(&root));
        for binary in image["binaries"].as_array().unwrap() {
            let path = format!("/usr/local/bin/{}", binary.as_str().unwrap());
            for args in [&["--version"][..], &["--help"]] {
                let out = run_inside(&root, &path, args);
                assert!(
                    out.status.success(),
                    "{name}: {path} {args:?} inside the image: {}\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
                if args == ["--version"] {
                    let text = String::from_utf8_lossy(&out.stdout);
                    assert!(text.contains(version), "{name}: {path} --version: {text}");
                }
            }
        }
        // Minimal: no shell, no package manager; what the binaries link, certificates, zones.
        for absent in ["bin/sh", "usr/bin/apt", "usr/bin/dpkg"] {
            assert!(
                !root.join(absent).exists(),
                "{name}: /{absent} is in the image"
            );
        }
        for present in [
            "etc/ssl/certs/ca-certificates.crt",
            "usr/share/zoneinfo/Europe/Berlin",
            "lib/x86_64-linux-gnu/libc.so.6",
            "usr/share/doc/libc6/copyright",
            "etc/passwd",
        ] {
            assert!(root.join(present).exists(), "{name}: /{present} is missing");
        }
        assert!(
            std::fs::read_to_string(root.join("etc/passwd"))
                .unwrap()
                .contains(":65532:65532:")
        );
        // The SBOM, in the image and beside the archive alike: the crates and the packages.
        let inside =
            std::fs::read_to_string(root.join("usr/share/doc/switchyard/sbom.spdx.json")).unwrap();
        let beside =
            std::fs::read_to_string(images_dir().join(image["sbom"].as_str().unwrap())).unwrap();
        assert_eq!(
            inside, beside,
            "{name}: the SBOM beside the archive is the image's"
        );
        let sbom: Value = serde_json::from_str(&inside).unwrap();
        assert_eq!(sbom["spdxVersion"], "SPDX-2.3");
        let packages: Vec<&str> = sbom["packages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        for package in ["libc6", "ca-certificates", "tzdata", "tokio", "rustls"] {
            assert!(
                packages.contains(&package),
                "{name}: the SBOM lists {package}"
            );
        }
    }
}

fn manifest_revision() -> String {
    run(Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(workspace()))
    .trim()
    .to_owned()
}

#[test]
#[ignore = "needs make images: make test-images runs it"]
fn assembling_the_images_again_from_the_same_binaries_gives_the_same_digests() {
    let first = manifest();
    let again = tempfile::tempdir().unwrap();
    let dev = workspace().join("target/debug/switchyard-dev");
    run(Command::new(&dev)
        .args(["images", "--out"])
        .arg(again.path())
        .current_dir(workspace()));
    let second: Value =
        serde_json::from_str(&std::fs::read_to_string(again.path().join("images.json")).unwrap())
            .unwrap();
    let digests = |m: &Value| -> BTreeMap<String, String> {
        images(m)
            .iter()
            .map(|i| {
                (
                    i["name"].as_str().unwrap().to_owned(),
                    i["digest"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    assert_eq!(digests(&first), digests(&second));
    for image in images(&first) {
        let archive = image["archive"].as_str().unwrap();
        assert_eq!(
            std::fs::read(images_dir().join(archive)).unwrap(),
            std::fs::read(again.path().join(archive)).unwrap(),
            "{archive}: the same bytes"
        );
    }
}

/// The images a workload's Pods run, by `kind/name/container`.
async fn workload_images(plane: &ControlPlane) -> BTreeMap<String, String> {
    let out = kubectl(
        plane,
        &[
            "get",
            "deployments,statefulsets,jobs",
            "-n",
            "switchyard",
            "-o",
            "json",
        ],
        None,
    )
    .await;
    assert!(out.success, "{}", out.stderr);
    let list: Value = serde_json::from_str(&out.stdout).unwrap();
    let mut images = BTreeMap::new();
    for item in list["items"].as_array().unwrap() {
        let spec = &item["spec"]["template"]["spec"];
        for container in spec["containers"]
            .as_array()
            .into_iter()
            .chain(spec["initContainers"].as_array())
            .flatten()
        {
            images.insert(
                format!(
                    "{}/{}/{}",
                    item["kind"].as_str().unwrap(),
                    item["metadata"]["name"].as_str().unwrap(),
                    container["name"].as_str().unwrap()
                ),
                container["image"].as_str().unwrap().to_owned(),
            );
        }
    }
    images
}

/// Builds `overlay` and applies it cleanly (the base registers no aggregated API, so kubectl
/// has nothing to warn about).
async fn apply(plane: &ControlPlane, overlay: &Path, what: &str) {
    let manifests = kustomize_build(plane, overlay).await;
    apply_cleanly(plane, what, &manifests).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs make images: make test-images runs it"]
async fn the_release_overlay_pins_every_service_and_an_upgrade_moves_every_workload() {
    let manifest = manifest();
    let plane = ControlPlane::shared().expect("control plane");
    let services: Vec<&Value> = images(&manifest)
        .iter()
        .filter(|i| !i["kustomize"].is_null())
        .collect();
    let pinned = |image: &Value| {
        format!(
            "{}@{}",
            image["reference"].as_str().unwrap(),
            image["digest"].as_str().unwrap()
        )
    };

    // Release N: a user's overlay over the release overlay, as docs/deploy.md writes it.
    let release = images_dir().join("release");
    let overlay = plane.dir().join("my-switchyard");
    std::fs::create_dir_all(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\n",
            relative_to(&overlay, &release.canonicalize().unwrap()).display()
        ),
    )
    .unwrap();
    apply(plane, &overlay, "release N").await;
    let running = workload_images(plane).await;
    assert_eq!(running.len(), 4, "{running:?}");
    for (workload, image) in &running {
        assert!(
            services.iter().any(|s| &pinned(s) == image),
            "{workload} runs {image}, not an image of release N pinned by digest"
        );
    }
    let out = kubectl(
        plane,
        &[
            "get",
            "statefulset/switchyard-queue",
            "-n",
            "switchyard",
            "-o",
            "jsonpath={.spec.template.metadata.labels.app\\.kubernetes\\.io/version}",
        ],
        None,
    )
    .await;
    assert_eq!(out.stdout, env!("CARGO_PKG_VERSION"), "{}", out.stderr);

    // Release N+1: every image rebuilt (here: relabelled, so every digest changes), pushed,
    // and the overlay moved to the new digests with `kustomize edit set image`.
    let registry = Registry::serve();
    let scratch = tempfile::tempdir().unwrap();
    let next_version = format!("{}-next", env!("CARGO_PKG_VERSION"));
    let mut next = BTreeMap::new();
    for image in &services {
        let name = image["name"].as_str().unwrap();
        let staged = format!("{}/switchyard/{name}", registry.address());
        registry.load(
            &images_dir().join(image["archive"].as_str().unwrap()),
            &format!("{staged}:{}", manifest["version"].as_str().unwrap()),
            &scratch.path().join(name),
        );
        let pushed = registry.crane(&[
            "mutate",
            &format!("{staged}:{}", manifest["version"].as_str().unwrap()),
            "--label",
            &format!("org.opencontainers.image.version={next_version}"),
            "-t",
            &format!("{staged}:{next_version}"),
        ]);
        let digest = pushed.trim().rsplit_once('@').unwrap().1.to_owned();
        assert_ne!(digest, image["digest"].as_str().unwrap());
        next.insert(
            image["reference"].as_str().unwrap().to_owned(),
            format!("{}@{digest}", image["reference"].as_str().unwrap()),
        );
    }
    // The exact command docs/deploy.md gives.
    let docs = std::fs::read_to_string(workspace().join("docs/deploy.md")).unwrap();
    let mut edit = vec!["edit".to_owned(), "set".to_owned(), "image".to_owned()];
    edit.extend(next.values().cloned());
    for reference in next.keys() {
        assert!(
            docs.contains(&format!("{reference}@sha256:")),
            "docs/deploy.md's upgrade names {reference}@sha256:…"
        );
    }
    assert!(
        docs.contains("kustomize edit set image \\\n"),
        "docs/deploy.md's upgrade command"
    );
    let out = Command::new(plane.binaries().path("kustomize"))
        .args(&edit)
        .current_dir(&overlay)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kustomize {edit:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    apply(plane, &overlay, "release N+1").await;
    let upgraded = workload_images(plane).await;
    assert_eq!(upgraded.len(), 4);
    for (workload, image) in &upgraded {
        assert!(
            next.values().any(|n| n == image),
            "{workload} runs {image}, not the next release's digest ({next:?})"
        );
        assert_ne!(Some(image), running.get(workload), "{workload} moved");
    }
}

#[test]
fn the_version_lives_in_the_workspace_manifest_only() {
    // The kustomize files name the images and never a version; the release overlay that
    // `make images` writes pins them.
    for file in [
        "deploy/kustomize/base/kustomization.yaml",
        "deploy/kustomize/components/etcd/kustomization.yaml",
    ] {
        let text = std::fs::read_to_string(workspace().join(file)).unwrap();
        let images = text.split("\nimages:\n").nth(1).unwrap_or_default();
        let pinned: Vec<&str> = images
            .split("  - name: ")
            .filter(|entry| entry.starts_with("switchyard-"))
            .filter(|entry| entry.contains("newTag") || entry.contains("digest"))
            .collect();
        assert!(
            pinned.is_empty(),
            "{file} pins a Switchyard version: {pinned:?}"
        );
    }
}

#[test]
#[ignore = "needs make images: make test-images runs it"]
fn krew_installs_the_plugin_from_its_archive_and_manifest() {
    let manifest = manifest();
    let krew = &manifest["krew"];
    let binaries = Binaries::locate().unwrap();
    let plugin = images_dir().join(krew["manifest"].as_str().unwrap());
    let archive = images_dir().join(krew["archive"].as_str().unwrap());
    run(Command::new(binaries.path("validate-krew-manifest"))
        .arg("-manifest")
        .arg(&plugin)
        .arg("-skip-install"));
    // krew checks the archive against the manifest's sha256 before it installs anything.
    let root = tempfile::tempdir().unwrap();
    run(Command::new(binaries.path("krew"))
        .args(["install", "--manifest"])
        .arg(&plugin)
        .arg("--archive")
        .arg(&archive)
        .env("KREW_ROOT", root.path())
        .env("KREW_NO_UPGRADE_CHECK", "1")
        .stdin(Stdio::null()));
    let installed = root.path().join("bin/kubectl-switchyard");
    let version = run(Command::new(&installed).arg("--version"));
    assert_eq!(
        version.trim(),
        format!("kubectl-switchyard {}", env!("CARGO_PKG_VERSION"))
    );
    let license = root.path().join(format!(
        "store/switchyard/v{}/LICENSE",
        env!("CARGO_PKG_VERSION")
    ));
    assert!(license.exists(), "{} is missing", license.display());
}
