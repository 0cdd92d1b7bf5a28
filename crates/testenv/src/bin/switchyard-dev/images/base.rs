//! The images' base root filesystem, assembled from Debian packages: the shared libraries the
//! binaries link (found from their ELF `NEEDED` entries and interpreter, and those libraries'
//! own), the CA certificate bundle, the time-zone database, each package's copyright, and a
//! passwd and group naming the non-root user. No shell, no package manager.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    path::{Component, Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

use super::{NONROOT, run};

/// What the base is made of. `libc6` and `libgcc-s1` hold what Rust binaries link
/// (`libc.so.6`, `libm.so.6`, the dynamic loader, `libgcc_s.so.1`); the other two are data.
pub(crate) const PACKAGES: &[&str] = &["libc6", "libgcc-s1", "ca-certificates", "tzdata"];

/// One Debian package, downloaded.
#[derive(Debug, Clone)]
pub(crate) struct Deb {
    pub(crate) name: String,
    pub(crate) version: String,
    pub(crate) arch: String,
    pub(crate) path: PathBuf,
}

/// The assembled base: its root directory and the packages it came from.
#[derive(Debug)]
pub(crate) struct Base {
    pub(crate) root: PathBuf,
    pub(crate) debs: Vec<Deb>,
}

/// Downloads the packages (into `cache`, once per version) and assembles the base under
/// `work/base` for `binaries`.
pub(crate) fn assemble(work: &Path, cache: &Path, binaries: &[PathBuf]) -> anyhow::Result<Base> {
    let mut debs: Vec<Deb> = Vec::new();
    let mut trees = BTreeMap::new();
    let mut wanted: VecDeque<String> = PACKAGES.iter().map(|p| (*p).to_owned()).collect();
    while let Some(name) = wanted.pop_front() {
        if trees.contains_key(&name) {
            continue;
        }
        let deb = fetch(cache, &name)?;
        let tree = work.join("debs").join(&name);
        extract(&deb.path, &tree)?;
        // A package whose documentation directory is a link to another's (libgcc-s1's is
        // gcc-12-base's) has its copyright there: that package comes too, for it.
        if let Some(other) = doc_link(&tree, &name) {
            wanted.push_back(other);
        }
        trees.insert(name, tree);
        debs.push(deb);
    }

    let root = work.join("base");
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    std::fs::create_dir_all(&root)?;
    let mut libraries = Libraries::new(&trees)?;
    for binary in binaries {
        libraries.add_needs_of(binary, &root)?;
    }
    libraries.copy_closure(&root)?;
    certificates(&trees["ca-certificates"], &root)?;
    copy_tree(
        &trees["tzdata"].join("usr/share/zoneinfo"),
        &root.join("usr/share/zoneinfo"),
    )?;
    for (name, tree) in &trees {
        let copyright = tree.join("usr/share/doc").join(name).join("copyright");
        if std::fs::symlink_metadata(&copyright).is_ok_and(|m| m.is_file()) {
            let to = root.join("usr/share/doc").join(name).join("copyright");
            std::fs::create_dir_all(to.parent().unwrap_or(&root))?;
            std::fs::copy(&copyright, &to)?;
        }
    }
    users(&root)?;
    debs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Base { root, debs })
}

/// The package `name` at the version apt would install, from `cache/<name>/<version>/` or
/// downloaded there with `apt-get download` (which needs no root and installs nothing).
fn fetch(cache: &Path, name: &str) -> anyhow::Result<Deb> {
    let show = match apt_show(name) {
        Ok(show) => show,
        Err(first) => {
            // A fresh machine may have no package lists yet.
            if !nix_root() || !Command::new("apt-get").arg("update").status()?.success() {
                return Err(first);
            }
            apt_show(name)?
        }
    };
    let field = |key: &str| {
        show.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}: ")))
            .map(str::to_owned)
            .with_context(|| format!("apt-cache show {name} names no {key}"))
    };
    let (version, arch) = (field("Version")?, field("Architecture")?);
    let dir = cache.join(name).join(&version);
    let existing = |dir: &Path| -> Option<PathBuf> {
        std::fs::read_dir(dir)
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
    };
    let path = match existing(&dir) {
        Some(path) => path,
        None => {
            std::fs::create_dir_all(&dir)?;
            let mut download = Command::new("apt-get");
            download.args(["download", "-qq"]);
            if nix_root() {
                // As root apt hands the download to its `_apt` user, who cannot write here.
                download.args(["-o", "APT::Sandbox::User=root"]);
            }
            let status = download
                .arg(format!("{name}={version}"))
                .current_dir(&dir)
                .status()
                .context("running apt-get download")?;
            if !status.success() {
                bail!("apt-get download {name}={version} failed ({status})");
            }
            existing(&dir).with_context(|| format!("apt-get download {name} wrote no .deb"))?
        }
    };
    Ok(Deb {
        name: name.to_owned(),
        version,
        arch,
        path,
    })
}

fn apt_show(name: &str) -> anyhow::Result<String> {
    let out = Command::new("apt-cache")
        .args(["show", "--no-all-versions", name])
        .output()
        .context("running apt-cache: the images' base is assembled from Debian packages")?;
    if !out.status.success() || out.stdout.is_empty() {
        bail!(
            "apt-cache show {name}: no such package in the package lists ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn nix_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid() == 0
    })
}

fn extract(deb: &Path, tree: &Path) -> anyhow::Result<()> {
    if tree.exists() {
        std::fs::remove_dir_all(tree)?;
    }
    std::fs::create_dir_all(tree)?;
    run(Command::new("dpkg-deb").arg("--extract").arg(deb).arg(tree))
}

/// The package `usr/share/doc/<name>` links to, when it is a link.
fn doc_link(tree: &Path, name: &str) -> Option<String> {
    let target = std::fs::read_link(tree.join("usr/share/doc").join(name)).ok()?;
    let other = target.file_name()?.to_str()?.to_owned();
    (other != name).then_some(other)
}

/// The shared libraries of the extracted packages, by file name, and those the binaries need.
struct Libraries<'a> {
    trees: &'a BTreeMap<String, PathBuf>,
    /// File name (a soname) → (tree, path inside it).
    by_name: BTreeMap<String, (PathBuf, PathBuf)>,
    /// Paths inside the image, with the tree each comes from.
    chosen: BTreeMap<PathBuf, PathBuf>,
    needed: VecDeque<String>,
    seen: BTreeSet<String>,
}

impl<'a> Libraries<'a> {
    fn new(trees: &'a BTreeMap<String, PathBuf>) -> anyhow::Result<Self> {
        let mut by_name = BTreeMap::new();
        for tree in trees.values() {
            for dir in ["lib", "usr/lib", "lib64"] {
                for path in walk(&tree.join(dir))? {
                    let relative = path.strip_prefix(tree)?.to_owned();
                    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                        continue;
                    };
                    if name.contains(".so") {
                        // A file over a link to it (lib64's link to the loader).
                        let file = std::fs::symlink_metadata(&path)?.is_file();
                        match by_name.get(name) {
                            Some((_, _, true)) => {}
                            Some(_) if !file => {}
                            _ => {
                                by_name.insert(name.to_owned(), (tree.clone(), relative, file));
                            }
                        }
                    }
                }
            }
        }
        let by_name = by_name
            .into_iter()
            .map(|(name, (tree, path, _))| (name, (tree, path)))
            .collect();
        Ok(Self {
            trees,
            by_name,
            chosen: BTreeMap::new(),
            needed: VecDeque::new(),
            seen: BTreeSet::new(),
        })
    }

    /// Queues what `elf` needs: its interpreter (at the path it names) and its `NEEDED`
    /// libraries.
    fn add_needs_of(&mut self, elf: &Path, root: &Path) -> anyhow::Result<()> {
        let (interpreter, needed) = elf_needs(elf)?;
        if let Some(interpreter) = interpreter {
            let inside = Path::new(&interpreter)
                .strip_prefix("/")
                .unwrap_or(Path::new(&interpreter))
                .to_owned();
            let tree = self
                .trees
                .values()
                .find(|t| std::fs::symlink_metadata(t.join(&inside)).is_ok())
                .with_context(|| {
                    format!(
                        "{} asks for the loader {interpreter}, which no package of the base ships",
                        elf.display()
                    )
                })?
                .clone();
            self.include(&tree, &inside, root)?;
        }
        for name in needed {
            if self.seen.insert(name.clone()) {
                self.needed.push_back(name);
            }
        }
        Ok(())
    }

    /// Resolves the queue: every needed library, and what it needs in turn.
    fn copy_closure(&mut self, root: &Path) -> anyhow::Result<()> {
        while let Some(name) = self.needed.pop_front() {
            let (tree, inside) = self.by_name.get(&name).cloned().with_context(|| {
                format!(
                    "the binaries need {name}, which none of the base's packages ({}) ships",
                    PACKAGES.join(", ")
                )
            })?;
            let file = self.include(&tree, &inside, root)?;
            self.add_needs_of(&tree.join(file), root)?;
        }
        Ok(())
    }

    /// Copies `inside` from `tree` into `root`; a symbolic link is kept as one and its target
    /// copied too. Returns the path of the regular file it ends at.
    fn include(&mut self, tree: &Path, inside: &Path, root: &Path) -> anyhow::Result<PathBuf> {
        let mut at = inside.to_owned();
        for _ in 0..16 {
            let source = tree.join(&at);
            let meta = std::fs::symlink_metadata(&source)
                .with_context(|| format!("{} is missing", source.display()))?;
            let to = root.join(&at);
            std::fs::create_dir_all(to.parent().unwrap_or(root))?;
            if self.chosen.insert(at.clone(), tree.to_owned()).is_none() {
                if meta.is_symlink() {
                    std::os::unix::fs::symlink(std::fs::read_link(&source)?, &to)?;
                } else {
                    std::fs::copy(&source, &to)?;
                }
            }
            if !meta.is_symlink() {
                return Ok(at);
            }
            at = link_target(&at, &std::fs::read_link(&source)?);
        }
        bail!("{}: too many symbolic links", inside.display())
    }
}

/// Where the link at `at` (a path inside the image) points, as a path inside the image.
fn link_target(at: &Path, target: &Path) -> PathBuf {
    let joined = if target.is_absolute() {
        target.to_owned()
    } else {
        Path::new("/")
            .join(at.parent().unwrap_or(Path::new("")))
            .join(target)
    };
    let mut out = PathBuf::new();
    for part in joined.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(p) => out.push(p),
            _ => {}
        }
    }
    out
}

/// The interpreter and `NEEDED` libraries of an ELF file, from `readelf`.
fn elf_needs(elf: &Path) -> anyhow::Result<(Option<String>, Vec<String>)> {
    let out = Command::new("readelf")
        .args(["--program-headers", "--dynamic", "--wide"])
        .arg(elf)
        .output()
        .context("running readelf (binutils)")?;
    if !out.status.success() {
        bail!(
            "readelf {}: {}",
            elf.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(parse_readelf(&String::from_utf8_lossy(&out.stdout)))
}

fn parse_readelf(text: &str) -> (Option<String>, Vec<String>) {
    let bracketed = |line: &str, marker: &str| {
        let rest = &line[line.find(marker)? + marker.len()..];
        Some(rest[..rest.find(']')?].to_owned())
    };
    let interpreter = text
        .lines()
        .find_map(|l| bracketed(l, "Requesting program interpreter: "));
    let needed = text
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| bracketed(l, "Shared library: ["))
        .collect();
    (interpreter, needed)
}

/// `/etc/ssl/certs/ca-certificates.crt`, as `update-ca-certificates` writes it from the
/// package's certificates.
fn certificates(tree: &Path, root: &Path) -> anyhow::Result<()> {
    let mut files: Vec<PathBuf> = walk(&tree.join("usr/share/ca-certificates"))?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "crt"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("the ca-certificates package holds no certificates");
    }
    let mut bundle = String::new();
    for file in files {
        let pem = std::fs::read_to_string(&file)?;
        bundle.push_str(pem.trim_end());
        bundle.push('\n');
    }
    let to = root.join("etc/ssl/certs");
    std::fs::create_dir_all(&to)?;
    std::fs::write(to.join("ca-certificates.crt"), bundle)?;
    Ok(())
}

fn users(root: &Path) -> anyhow::Result<()> {
    let etc = root.join("etc");
    std::fs::create_dir_all(&etc)?;
    std::fs::write(
        etc.join("passwd"),
        format!(
            "root:x:0:0:root:/root:/usr/sbin/nologin\nnonroot:x:{NONROOT}:{NONROOT}:nonroot:/home/nonroot:/usr/sbin/nologin\n"
        ),
    )?;
    std::fs::write(
        etc.join("group"),
        format!("root:x:0:\nnonroot:x:{NONROOT}:\n"),
    )?;
    let tmp = root.join("tmp");
    std::fs::create_dir_all(&tmp)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777))?;
    Ok(())
}

/// Copies a directory tree, keeping symbolic links as links.
fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    if !from.is_dir() {
        bail!("{} is missing", from.display());
    }
    for path in walk(from)? {
        let dest = to.join(path.strip_prefix(from)?);
        std::fs::create_dir_all(dest.parent().unwrap_or(to))?;
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&path)?, &dest)?;
        } else {
            std::fs::copy(&path, &dest)?;
        }
    }
    Ok(())
}

/// Every file and link under `dir` (not directories), in no particular order; nothing if
/// `dir` does not exist.
fn walk(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                pending.push(entry.path());
            } else {
                out.push(entry.path());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interpreter_and_needed_libraries_are_read_from_readelf() {
        let text = "
Program Headers:
  INTERP         0x000318 0x0000000000000318 0x0000000000000318 0x00001c 0x00001c R   0x1
      [Requesting program interpreter: /lib64/ld-linux-x86-64.so.2]
Dynamic section at offset 0x5a0b8 contains 29 entries:
 0x0000000000000001 (NEEDED)             Shared library: [libgcc_s.so.1]
 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]
 0x000000000000000e (SONAME)             Library soname: [libfoo.so.1]
";
        let (interpreter, needed) = parse_readelf(text);
        assert_eq!(interpreter.as_deref(), Some("/lib64/ld-linux-x86-64.so.2"));
        assert_eq!(needed, ["libgcc_s.so.1", "libc.so.6"]);
    }

    #[test]
    fn links_resolve_inside_the_image() {
        assert_eq!(
            link_target(
                Path::new("lib64/ld-linux-x86-64.so.2"),
                Path::new("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
            ),
            Path::new("lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
        );
        assert_eq!(
            link_target(
                Path::new("usr/share/zoneinfo/posix/UTC"),
                Path::new("../Etc/UTC")
            ),
            Path::new("usr/share/zoneinfo/Etc/UTC")
        );
    }
}
