//! The configuration file and the registrations, merged into the one configuration the
//! watcher serves; what each registration or its end changes.

use std::collections::BTreeMap;

use super::{
    Keying, Mapping, Result, Rules, Target, WatchesError, add_rule, missing, validate::Registration,
};
use crate::{
    Config, Gvk, ResourceConfig,
    config::{Rule, RuleKind},
};

/// Names one registration while it lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RegistrationId(u64);

/// What a registration or its end changed in the effective configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// Kinds newly watched.
    pub added: Vec<Gvk>,
    /// Kinds no one needs any more.
    pub removed: Vec<Gvk>,
    /// Kinds still watched whose mode changed (metadata-only or whole objects).
    pub replaced: Vec<Gvk>,
    /// Controllers with rules they did not have before: objects already cached must be
    /// keyed for them.
    pub rekeyed: Vec<String>,
}

/// The configuration file and the registrations, and the configuration they make together.
#[derive(Clone, Debug)]
pub struct Watches {
    file: Config,
    /// How errors name the file (`the configuration file /etc/switchyard/watcher.yaml`).
    source: String,
    /// The file's controllers by name: their place in the file and their rules.
    file_controllers: BTreeMap<String, (usize, Rules)>,
    registrations: BTreeMap<RegistrationId, Registration>,
    next_id: u64,
    effective: Config,
}

impl Watches {
    /// The file alone; `source` names it in errors.
    pub fn new(file: Config, source: impl Into<String>) -> Self {
        let mut file_controllers: BTreeMap<String, (usize, Rules)> = BTreeMap::new();
        for rule in &file.rules {
            let position = file_controllers.len();
            let (_, rules) = file_controllers
                .entry(rule.controller.clone())
                .or_insert_with(|| (position, Rules::new()));
            let gvk = file.resources[rule.resource].gvk.clone();
            let mapping = match &rule.kind {
                RuleKind::For => Mapping::For,
                RuleKind::Owns { owner, through } => Mapping::Owns {
                    owner: owner.clone(),
                    through: through.map(|i| file.resources[i].gvk.clone()),
                },
                RuleKind::ByLabel { label } => Mapping::ByLabel {
                    label: label.clone(),
                },
                RuleKind::ByNamespace => Mapping::ByNamespace,
                RuleKind::BySelector { owner } => Mapping::BySelector {
                    owner: owner.clone(),
                },
                RuleKind::ByPlacement { owner } => Mapping::ByPlacement {
                    owner: owner.clone(),
                },
                RuleKind::ByName => Mapping::ByName,
            };
            let keying = Keying::of(&rule.predicates, rule.batch_period, rule.batch_status_only);
            let selector = rule.label_selector.clone();
            add_rule(
                rules,
                Target {
                    gvk,
                    mapping,
                    selector,
                    fields: rule.field_selector.clone(),
                    namespaces: rule.namespaces.clone(),
                },
                keying,
            );
        }
        Self {
            effective: file.clone(),
            file,
            source: source.into(),
            file_controllers,
            registrations: BTreeMap::new(),
            next_id: 0,
        }
    }

    /// The configuration the watcher serves now: the file's and every registration's.
    pub fn effective(&self) -> &Config {
        &self.effective
    }

    /// The file's configuration alone.
    pub fn file(&self) -> &Config {
        &self.file
    }

    /// Registrations open now.
    pub fn registrations(&self) -> usize {
        self.registrations.len()
    }

    /// Whether `registration` agrees with the configuration file: a controller the file
    /// names must declare exactly the file's watches, and none may take the garbage
    /// collector's name.
    pub fn check(&self, registration: &Registration) -> Result<()> {
        let source = &self.source;
        for (c, controller) in registration.controllers.iter().enumerate() {
            let name = &controller.name;
            if let Some(collector) = &self.file.collector
                && collector.controller == *name
            {
                return Err(WatchesError::Conflict {
                    field: format!("controllers[{c}].name"),
                    problem: format!(
                        "{name:?} is the garbage collector's (garbageCollector.controller of {source})"
                    ),
                });
            }
            if let Some((position, rules)) = self.file_controllers.get(name)
                && *rules != controller.rules
            {
                return Err(WatchesError::Conflict {
                    field: format!("controllers[{c}]"),
                    problem: format!(
                        "{name:?} of registrant {:?} declares other watches than controllers[{position}] of {source}: only in the file: {}; only in the registration: {}",
                        registration.registrant,
                        missing(rules, &controller.rules),
                        missing(&controller.rules, rules),
                    ),
                });
            }
        }
        Ok(())
    }

    /// Adds `registration` (after [`Self::check`]); returns its id and what changed.
    pub fn register(&mut self, registration: Registration) -> Result<(RegistrationId, Change)> {
        self.check(&registration)?;
        let id = RegistrationId(self.next_id);
        self.next_id += 1;
        let before = self.merged_owned();
        self.registrations.insert(id, registration);
        Ok((id, self.rebuild(&before)))
    }

    /// Removes a registration; nothing changes for an id already removed.
    pub fn unregister(&mut self, id: RegistrationId) -> Change {
        let before = self.merged_owned();
        match self.registrations.remove(&id) {
            Some(_) => self.rebuild(&before),
            None => Change::default(),
        }
    }

    /// The rules of every registered controller the file does not name, merged across
    /// registrants.
    fn merged(&self) -> BTreeMap<&str, Rules> {
        let mut merged: BTreeMap<&str, Rules> = BTreeMap::new();
        for controller in self.registrations.values().flat_map(|r| &r.controllers) {
            if self.file_controllers.contains_key(&controller.name) {
                continue;
            }
            let rules = merged.entry(&controller.name).or_default();
            for (target, keying) in &controller.rules {
                add_rule(rules, target.clone(), keying.clone());
            }
        }
        merged
    }

    /// Makes the effective configuration anew; `before` is the merged rules it replaces.
    fn rebuild(&mut self, before: &BTreeMap<String, Rules>) -> Change {
        let config = self.build();
        let after = self.merged_owned();
        let mode = |config: &Config| -> BTreeMap<Gvk, bool> {
            config
                .resources
                .iter()
                .map(|r| (r.gvk.clone(), r.metadata_only))
                .collect()
        };
        let (old, new) = (mode(&self.effective), mode(&config));
        let change = Change {
            added: new
                .keys()
                .filter(|g| !old.contains_key(*g))
                .cloned()
                .collect(),
            removed: old
                .keys()
                .filter(|g| !new.contains_key(*g))
                .cloned()
                .collect(),
            replaced: new
                .iter()
                .filter(|(g, m)| old.get(*g).is_some_and(|o| o != *m))
                .map(|(g, _)| g.clone())
                .collect(),
            rekeyed: after
                .iter()
                .filter(|(name, rules)| {
                    let old = before.get(*name);
                    rules
                        .iter()
                        .any(|(target, keying)| old.and_then(|o| o.get(target)) != Some(keying))
                })
                .map(|(name, _)| name.clone())
                .collect(),
        };
        self.effective = config;
        change
    }

    fn merged_owned(&self) -> BTreeMap<String, Rules> {
        self.merged()
            .into_iter()
            .map(|(name, rules)| (name.to_owned(), rules))
            .collect()
    }

    /// The file's resources and rules, at their own indices, then what registrations add.
    fn build(&self) -> Config {
        let mut needs: BTreeMap<&Gvk, bool> = BTreeMap::new();
        for controller in self.registrations.values().flat_map(|r| &r.controllers) {
            for (gvk, metadata_only) in &controller.needs {
                needs
                    .entry(gvk)
                    .and_modify(|m| *m &= *metadata_only)
                    .or_insert(*metadata_only);
            }
        }
        let mut config = self.file.clone();
        for resource in &mut config.resources {
            if let Some(metadata_only) = needs.remove(&resource.gvk) {
                resource.metadata_only &= metadata_only;
            }
        }
        config.resources.extend(
            needs
                .into_iter()
                .map(|(gvk, metadata_only)| ResourceConfig {
                    gvk: gvk.clone(),
                    metadata_only,
                }),
        );
        let index = |gvk: &Gvk| {
            config
                .resources
                .iter()
                .position(|r| r.gvk == *gvk)
                .expect("every kind a rule names is needed")
        };
        let mut rules = Vec::new();
        for (name, merged) in self.merged() {
            for (target, keying) in merged {
                rules.push(Rule {
                    resource: index(&target.gvk),
                    controller: name.to_owned(),
                    kind: match target.mapping {
                        Mapping::For => RuleKind::For,
                        Mapping::Owns { owner, through } => RuleKind::Owns {
                            owner,
                            through: through.as_ref().map(index),
                        },
                        Mapping::ByLabel { label } => RuleKind::ByLabel { label },
                        Mapping::ByNamespace => RuleKind::ByNamespace,
                        Mapping::BySelector { owner } => RuleKind::BySelector { owner },
                        Mapping::ByPlacement { owner } => RuleKind::ByPlacement { owner },
                        Mapping::ByName => RuleKind::ByName,
                    },
                    predicates: keying.filter.predicates(),
                    batch_period: keying.batch_period,
                    batch_status_only: keying.batch_status_only,
                    label_selector: target.selector,
                    field_selector: target.fields,
                    namespaces: target.namespaces,
                });
            }
        }
        config.rules.extend(rules);
        config
    }
}
