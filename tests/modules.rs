//! No module cycles: within every library and binary of the workspace, no module depends on a
//! sibling that depends back on it, directly or through others. A module depends on another
//! when it names it (or something in it) with a `crate::`, `super::` or `self::` path, in a
//! `use` or anywhere in its code, its tests included. A dependency between two modules
//! counts between the two siblings that contain them (`a::x` naming `b::y` is `a` depending
//! on `b`); a module naming its own ancestor or descendant is not a cycle.
//!
//! `cargo test -p switchyard-tests --test modules` runs the check; it prints every cycle with
//! the files whose paths make it.

#![allow(clippy::unwrap_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use syn::visit::Visit;

/// A module's path inside its crate (`["sdk", "builder"]`); the crate root is empty.
type Module = Vec<String>;

/// One library or binary: its modules and, for each dependency between two of them, the
/// files that make it.
#[derive(Default)]
struct Target {
    modules: BTreeSet<Module>,
    edges: BTreeMap<(Module, Module), BTreeSet<PathBuf>>,
}

impl Target {
    fn load(root_file: &Path) -> Self {
        let mut target = Target::default();
        let mut files = Vec::new();
        target.walk(root_file, Vec::new(), true, &mut files);
        for (file, module, syntax) in &files {
            let mut visitor = Paths {
                stack: module.clone(),
                found: Vec::new(),
            };
            visitor.visit_file(syntax);
            for (from, path) in visitor.found {
                if let Some(to) = target.resolve(&from, &path) {
                    target
                        .edges
                        .entry((from, to))
                        .or_default()
                        .insert(file.clone());
                }
            }
        }
        target
    }

    /// Reads `file` (module `module`) and every file module it declares.
    fn walk(
        &mut self,
        file: &Path,
        module: Module,
        owns_dir: bool,
        files: &mut Vec<(PathBuf, Module, syn::File)>,
    ) {
        let text = std::fs::read_to_string(file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let syntax =
            syn::parse_file(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", file.display()));
        // The directory its child modules' files live in.
        let dir = if owns_dir {
            file.parent().unwrap().to_owned()
        } else {
            file.with_extension("")
        };
        self.declare(&syntax.items, &module, &dir, files);
        self.modules.insert(module.clone());
        files.push((file.to_owned(), module, syntax));
    }

    fn declare(
        &mut self,
        items: &[syn::Item],
        module: &Module,
        dir: &Path,
        files: &mut Vec<(PathBuf, Module, syn::File)>,
    ) {
        for item in items {
            let syn::Item::Mod(item) = item else { continue };
            let mut child = module.clone();
            child.push(item.ident.to_string());
            if let Some((_, inline)) = &item.content {
                self.modules.insert(child.clone());
                self.declare(inline, &child, &dir.join(item.ident.to_string()), files);
                continue;
            }
            let explicit = item.attrs.iter().find_map(|a| {
                let syn::Meta::NameValue(nv) = &a.meta else {
                    return None;
                };
                if !nv.path.is_ident("path") {
                    return None;
                }
                let syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) = &nv.value
                else {
                    return None;
                };
                Some(dir.join(s.value()))
            });
            let name = item.ident.to_string();
            let (file, owns_dir) = match explicit {
                Some(file) => (file, true),
                None if dir.join(format!("{name}.rs")).exists() => {
                    (dir.join(format!("{name}.rs")), false)
                }
                None => (dir.join(&name).join("mod.rs"), true),
            };
            self.walk(&file, child, owns_dir, files);
        }
    }

    /// The module a path written in `from` names: the longest module prefix of the path.
    fn resolve(&self, from: &Module, path: &[String]) -> Option<Module> {
        let (mut at, rest) = match path.first().map(String::as_str) {
            Some("crate") => (Vec::new(), &path[1..]),
            Some("self") => (from.clone(), &path[1..]),
            Some("super") => {
                let mut at = from.clone();
                let mut rest = path;
                while rest.first().map(String::as_str) == Some("super") {
                    at.pop()?;
                    rest = &rest[1..];
                }
                (at, rest)
            }
            _ => return None,
        };
        for segment in rest {
            let mut next = at.clone();
            next.push(segment.clone());
            if !self.modules.contains(&next) {
                break;
            }
            at = next;
        }
        Some(at)
    }

    /// Every dependency lifted to the two siblings under the modules' common ancestor.
    fn sibling_edges(&self) -> BTreeMap<(Module, Module), BTreeSet<PathBuf>> {
        let mut lifted: BTreeMap<_, BTreeSet<PathBuf>> = BTreeMap::new();
        for ((from, to), files) in &self.edges {
            let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                continue;
            }
            let key = (from[..=common].to_vec(), to[..=common].to_vec());
            lifted.entry(key).or_default().extend(files.iter().cloned());
        }
        lifted
    }

    /// The strongly connected components of more than one module (Tarjan's algorithm).
    fn cycles(&self) -> Vec<Vec<Module>> {
        let edges = self.sibling_edges();
        let nodes: Vec<&Module> = edges
            .keys()
            .flat_map(|(a, b)| [a, b])
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let index_of: BTreeMap<&Module, usize> =
            nodes.iter().enumerate().map(|(i, m)| (*m, i)).collect();
        let mut next: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
        for (a, b) in edges.keys() {
            next[index_of[a]].push(index_of[b]);
        }
        let mut tarjan = Tarjan {
            next: &next,
            index: vec![None; nodes.len()],
            low: vec![0; nodes.len()],
            on_stack: vec![false; nodes.len()],
            stack: Vec::new(),
            counter: 0,
            components: Vec::new(),
        };
        for v in 0..nodes.len() {
            if tarjan.index[v].is_none() {
                tarjan.connect(v);
            }
        }
        tarjan
            .components
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|c| {
                let mut modules: Vec<Module> = c.into_iter().map(|i| nodes[i].clone()).collect();
                modules.sort();
                modules
            })
            .collect()
    }
}

struct Tarjan<'a> {
    next: &'a [Vec<usize>],
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    counter: usize,
    components: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    fn connect(&mut self, v: usize) {
        self.index[v] = Some(self.counter);
        self.low[v] = self.counter;
        self.counter += 1;
        self.stack.push(v);
        self.on_stack[v] = true;
        for &w in &self.next[v] {
            match self.index[w] {
                None => {
                    self.connect(w);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(i) if self.on_stack[w] => self.low[v] = self.low[v].min(i),
                Some(_) => {}
            }
        }
        if Some(self.low[v]) == self.index[v] {
            let mut component = Vec::new();
            loop {
                let w = self.stack.pop().unwrap();
                self.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            self.components.push(component);
        }
    }
}

/// Collects every `crate::`, `self::` and `super::` path with the module it is written in.
struct Paths {
    stack: Module,
    found: Vec<(Module, Vec<String>)>,
}

impl Paths {
    fn uses(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.uses(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.record(prefix, Some(n.ident.to_string())),
            syn::UseTree::Rename(r) => self.record(prefix, Some(r.ident.to_string())),
            syn::UseTree::Glob(_) => self.record(prefix, None),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.uses(prefix, tree);
                }
            }
        }
    }

    fn record(&mut self, prefix: &[String], last: Option<String>) {
        let mut path = prefix.to_vec();
        // `use super::{self, x}` names the module itself.
        if let Some(last) = last.filter(|l| l != "self") {
            path.push(last);
        }
        if path
            .first()
            .is_some_and(|s| s == "crate" || s == "self" || s == "super")
        {
            self.found.push((self.stack.clone(), path));
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        self.stack.push(item.ident.to_string());
        syn::visit::visit_item_mod(self, item);
        self.stack.pop();
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.uses(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.record(&segments, None);
        syn::visit::visit_path(self, path);
    }
}

/// The source files of every library and binary target of the workspace.
fn targets() -> Vec<(String, PathBuf)> {
    let metadata = switchyard_tests::cargo_metadata(true);
    let mut targets = Vec::new();
    for package in metadata["packages"].as_array().unwrap() {
        for target in package["targets"].as_array().unwrap() {
            let kinds = target["kind"].as_array().unwrap();
            if kinds.iter().any(|k| k == "lib" || k == "bin") {
                targets.push((
                    format!("{} {}", package["name"], target["name"]),
                    PathBuf::from(target["src_path"].as_str().unwrap()),
                ));
            }
        }
    }
    targets
}

fn show(module: &[String]) -> String {
    if module.is_empty() {
        "crate".to_owned()
    } else {
        module.join("::")
    }
}

#[test]
fn no_module_depends_on_a_sibling_that_depends_back_on_it() {
    let targets = targets();
    assert!(targets.len() >= 10, "the workspace's targets: {targets:?}");
    let mut report = String::new();
    for (name, root) in &targets {
        let target = Target::load(root);
        let edges = target.sibling_edges();
        for cycle in target.cycles() {
            report += &format!(
                "{name}: {}\n",
                cycle.iter().map(|m| show(m)).collect::<Vec<_>>().join(", ")
            );
            for ((a, b), files) in &edges {
                if cycle.contains(a) && cycle.contains(b) {
                    let files: Vec<_> = files.iter().map(|f| f.display().to_string()).collect();
                    report += &format!("  {} -> {}: {}\n", show(a), show(b), files.join(", "));
                }
            }
        }
    }
    assert!(report.is_empty(), "module cycles:\n{report}");
}

/// The check itself, on a crate written for it: it finds a cycle through three siblings, a
/// `super::` path from an inline test module, and none where a module names its parent.
#[test]
fn the_check_finds_a_cycle_and_only_a_cycle() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "lib.rs",
        "mod a; mod b; mod c; mod d; pub use a::A;\nfn f() -> crate::d::D { todo!() }\n",
    );
    write("a.rs", "use crate::{b::B, d};\npub struct A(B);\n");
    write("b/mod.rs", "mod inner;\npub use inner::B;\n");
    write("b/inner.rs", "pub struct B(super::super::c::C);\n");
    write(
        "c.rs",
        "pub struct C;\n#[cfg(test)] mod tests { use super::*; fn g() { let _ = crate::a::A; } }\n",
    );
    write("d.rs", "pub struct D;\nfn h() -> crate::D2 { todo!() }\n");

    let target = Target::load(&dir.path().join("lib.rs"));
    let module = |path: &str| -> Module { path.split("::").map(str::to_owned).collect() };
    assert_eq!(
        target.cycles(),
        [vec![module("a"), module("b"), module("c")]]
    );
    assert!(
        target
            .sibling_edges()
            .contains_key(&(module("a"), module("d")))
    );
    assert!(
        !target
            .sibling_edges()
            .keys()
            .any(|(from, _)| from == &module("d"))
    );
}
