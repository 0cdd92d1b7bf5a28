//! Watches that reconcilers register for their controllers while the watcher runs, merged
//! with the configuration file's into the one [`Config`] the watcher serves.
//!
//! ```text
//!  configuration file ──────────────┐  a controller the file names: a registration must
//!  registration 1 (registrant a) ───┼─ declare the file's watches exactly (else a conflict
//!  registration 2 (registrant b) ───┘  naming both sources)
//!             │ Watches::register / unregister
//!             ▼
//!  effective Config: the file's resources and rules first, at their own indices; then each
//!  kind only registrations need, once; the rules of a controller merged across its
//!  registrants: one rule per kind and mapping, their predicates OR-ed and the shorter batch
//!  period kept, so that replicas registering the same watches add no second key per change
//!             │ Change
//!             ▼
//!  kinds added, removed, or replaced (a kind is metadata-only iff every user asks for
//!  metadata only: a change of mode needs a new informer), and controllers rekeyed (rules
//!  gained: the objects already cached must be keyed for them)
//! ```
//!
//! Mapping semantics are the file's ([`crate::mapping`]): `reconciles` is `for`, `owns`
//! (with `through`) and `by_label` are `owns` and `mapByLabel`. The kind an `owns` watch
//! maps `through` is cached metadata-only for the registration: only its owner reference
//! is read.
//!
//! Errors name the field, in the proto's words: `controllers[0].owns[1].gvk.kind: ...`.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    time::Duration,
};

use crate::{
    Config, Gvk, Objects, Predicate, ResourceConfig,
    config::{MAX_BATCH_PERIOD, Rule, RuleKind, is_kind},
};

/// Longest registrant and controller name: a controller name travels in every work key,
/// and both are Kubernetes object names at most.
const MAX_NAME: usize = 253;
/// Controllers in one registration at most: far more than one reconciler process runs;
/// it bounds the work one request can ask for.
const MAX_CONTROLLERS: usize = 100;
/// Watches of one kind of mapping per controller at most, for the same reason.
const MAX_WATCHES: usize = 100;
/// A label key: a DNS-subdomain prefix (253), a slash and a name (63).
const MAX_LABEL: usize = 317;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatchesError {
    /// The registration is malformed.
    #[error("{field}: {problem}")]
    Invalid { field: String, problem: String },
    /// The registration disagrees with the configuration file.
    #[error("{field}: {problem}")]
    Conflict { field: String, problem: String },
}

pub type Result<T, E = WatchesError> = std::result::Result<T, E>;

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> WatchesError {
    WatchesError::Invalid {
        field: field.into(),
        problem: problem.into(),
    }
}

/// One controller's watches as a registrant declares them, not yet validated (the proto's
/// `ControllerWatches`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControllerWatches {
    pub name: String,
    pub reconciles: Option<Watch>,
    pub owns: Vec<Watch>,
    pub by_label: Vec<Watch>,
}

/// One declared watch (the proto's `Watch`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Watch {
    pub gvk: Option<Gvk>,
    pub predicates: Vec<Predicate>,
    pub metadata_only: bool,
    pub through: Option<Gvk>,
    pub label: String,
    /// Keys of live events wait this long (the file's `batchPeriod`).
    pub batch_period: Option<Duration>,
}

/// How a change of one kind becomes one controller's key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mapping {
    For,
    Owns { owner: Gvk, through: Option<Gvk> },
    ByLabel { label: String },
}

/// What a rule maps: a kind, and how.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Target {
    gvk: Gvk,
    mapping: Mapping,
}

/// Which updates a rule keys.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Filter {
    Every,
    AnyOf(BTreeSet<Predicate>),
}

impl Filter {
    fn of(predicates: &[Predicate]) -> Self {
        match predicates {
            [] => Self::Every,
            some => Self::AnyOf(some.iter().copied().collect()),
        }
    }

    fn merge(&mut self, other: &Filter) {
        match (&mut *self, other) {
            (Self::Every, _) => {}
            (_, Self::Every) => *self = Self::Every,
            (Self::AnyOf(mine), Self::AnyOf(theirs)) => mine.extend(theirs),
        }
    }

    fn predicates(&self) -> Vec<Predicate> {
        match self {
            Self::Every => Vec::new(),
            Self::AnyOf(some) => some.iter().copied().collect(),
        }
    }
}

/// Which updates a rule keys and how long its keys wait. Two rules that differ only here are
/// one rule: its filter passes what either passes, and its keys wait the shorter period (none
/// if either has none).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Keying {
    filter: Filter,
    batch_period: Option<Duration>,
}

impl Keying {
    fn of(predicates: &[Predicate], batch_period: Option<Duration>) -> Self {
        Self {
            filter: Filter::of(predicates),
            batch_period,
        }
    }

    fn merge(&mut self, other: &Keying) {
        self.filter.merge(&other.filter);
        self.batch_period = self.batch_period.min(other.batch_period);
    }
}

/// A controller's rules, one per target.
type Rules = BTreeMap<Target, Keying>;

fn add_rule(rules: &mut Rules, target: Target, keying: Keying) {
    rules
        .entry(target)
        .and_modify(|k| k.merge(&keying))
        .or_insert(keying);
}

/// Rules as the file and errors write them: `owns v1/Pod through apps/v1/ReplicaSet
/// [labelsChanged] batched 250ms`.
struct Described<'a>(&'a Target, &'a Keying);

impl fmt::Display for Described<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Described(
            target,
            Keying {
                filter,
                batch_period,
            },
        ) = self;
        match &target.mapping {
            Mapping::For => write!(f, "for {}", target.gvk)?,
            Mapping::Owns { through, .. } => {
                write!(f, "owns {}", target.gvk)?;
                if let Some(through) = through {
                    write!(f, " through {through}")?;
                }
            }
            Mapping::ByLabel { label } => write!(f, "by label {label} on {}", target.gvk)?,
        }
        if let Filter::AnyOf(predicates) = filter {
            write!(f, " {:?}", predicates.iter().collect::<Vec<_>>())?;
        }
        if let Some(period) = batch_period {
            write!(f, " batched {}", humantime::format_duration(*period))?;
        }
        Ok(())
    }
}

/// The rules of `mine` that `theirs` lacks (or filters otherwise), described.
fn missing(mine: &Rules, theirs: &Rules) -> String {
    let listed: Vec<String> = mine
        .iter()
        .filter(|(target, keying)| theirs.get(*target) != Some(*keying))
        .map(|(target, keying)| Described(target, keying).to_string())
        .collect();
    match listed.is_empty() {
        true => "nothing".to_owned(),
        false => listed.join(", "),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Controller {
    name: String,
    rules: Rules,
    /// Every kind it needs cached, and whether metadata is enough.
    needs: BTreeMap<Gvk, bool>,
}

impl Controller {
    fn need(&mut self, gvk: &Gvk, metadata_only: bool) {
        self.needs
            .entry(gvk.clone())
            .and_modify(|m| *m &= metadata_only)
            .or_insert(metadata_only);
    }
}

/// A validated registration: one registrant's controllers and the kinds they need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    registrant: String,
    controllers: Vec<Controller>,
    /// Every kind named, with the field that names it first (for errors about the kind).
    kinds: BTreeMap<Gvk, String>,
}

impl Registration {
    /// Validates `controllers` as `registrant` declared them; the error names the field.
    pub fn new(registrant: String, controllers: Vec<ControllerWatches>) -> Result<Self> {
        check_name("registrant", &registrant)?;
        if controllers.is_empty() {
            return Err(invalid("controllers", "at least one is required"));
        }
        if controllers.len() > MAX_CONTROLLERS {
            return Err(invalid(
                "controllers",
                format!("{} given; at most {MAX_CONTROLLERS}", controllers.len()),
            ));
        }
        let mut registration = Self {
            registrant,
            controllers: Vec::new(),
            kinds: BTreeMap::new(),
        };
        for (c, declared) in controllers.into_iter().enumerate() {
            let controller = registration.controller(c, declared)?;
            if let Some(first) = registration
                .controllers
                .iter()
                .position(|other| other.name == controller.name)
            {
                return Err(invalid(
                    format!("controllers[{c}].name"),
                    format!(
                        "{:?} is already used by controllers[{first}]",
                        controller.name
                    ),
                ));
            }
            registration.controllers.push(controller);
        }
        Ok(registration)
    }

    fn controller(&mut self, c: usize, declared: ControllerWatches) -> Result<Controller> {
        let ControllerWatches {
            name,
            reconciles,
            owns,
            by_label,
        } = declared;
        let at = format!("controllers[{c}]");
        check_name(&format!("{at}.name"), &name)?;
        for (list, watches) in [("owns", &owns), ("by_label", &by_label)] {
            if watches.len() > MAX_WATCHES {
                return Err(invalid(
                    format!("{at}.{list}"),
                    format!("{} given; at most {MAX_WATCHES}", watches.len()),
                ));
            }
        }
        let mut controller = Controller {
            name,
            rules: Rules::new(),
            needs: BTreeMap::new(),
        };
        let field = format!("{at}.reconciles");
        let Some(reconciles) = reconciles else {
            return Err(invalid(
                field,
                "required: the kind this controller reconciles",
            ));
        };
        let owner = self.kind(&field, &reconciles)?;
        only_in(&field, &reconciles, false, false)?;
        controller.need(&owner, reconciles.metadata_only);
        add_rule(
            &mut controller.rules,
            Target {
                gvk: owner.clone(),
                mapping: Mapping::For,
            },
            Keying::of(&reconciles.predicates, reconciles.batch_period),
        );
        for (i, watch) in owns.iter().enumerate() {
            let field = format!("{at}.owns[{i}]");
            let gvk = self.kind(&field, watch)?;
            only_in(&field, watch, true, false)?;
            let through = match &watch.through {
                None => None,
                Some(via) => {
                    let at = format!("{field}.through");
                    check_gvk(&at, via)?;
                    if *via == gvk {
                        return Err(invalid(
                            at,
                            format!(
                                "{via} is the owned kind itself; name the kind between it and {owner}"
                            ),
                        ));
                    }
                    if *via == owner {
                        return Err(invalid(
                            at,
                            format!(
                                "{via} is the reconciled kind; an owns watch without through maps to it"
                            ),
                        ));
                    }
                    self.kinds.entry(via.clone()).or_insert(at);
                    controller.need(via, true);
                    Some(via.clone())
                }
            };
            controller.need(&gvk, watch.metadata_only);
            add_rule(
                &mut controller.rules,
                Target {
                    gvk,
                    mapping: Mapping::Owns {
                        owner: owner.clone(),
                        through,
                    },
                },
                Keying::of(&watch.predicates, watch.batch_period),
            );
        }
        for (i, watch) in by_label.iter().enumerate() {
            let field = format!("{at}.by_label[{i}]");
            let gvk = self.kind(&field, watch)?;
            only_in(&field, watch, false, true)?;
            let label = watch.label.trim();
            if label.is_empty() {
                return Err(invalid(
                    format!("{field}.label"),
                    "required: the label whose value names the object to key",
                ));
            }
            if label.len() > MAX_LABEL || label.contains(char::is_whitespace) {
                return Err(invalid(
                    format!("{field}.label"),
                    format!(
                        "{label:?} is not a label key (at most {MAX_LABEL} characters, no spaces)"
                    ),
                ));
            }
            controller.need(&gvk, watch.metadata_only);
            add_rule(
                &mut controller.rules,
                Target {
                    gvk,
                    mapping: Mapping::ByLabel {
                        label: label.to_owned(),
                    },
                },
                Keying::of(&watch.predicates, watch.batch_period),
            );
        }
        Ok(controller)
    }

    /// The watch's kind, checked, and remembered with the field that names it; its batch
    /// period checked too.
    fn kind(&mut self, field: &str, watch: &Watch) -> Result<Gvk> {
        if let Some(period) = watch.batch_period
            && period > MAX_BATCH_PERIOD
        {
            return Err(invalid(
                format!("{field}.batch_period"),
                format!(
                    "{} is longer than {}",
                    humantime::format_duration(period),
                    humantime::format_duration(MAX_BATCH_PERIOD)
                ),
            ));
        }
        let at = format!("{field}.gvk");
        let Some(gvk) = &watch.gvk else {
            return Err(invalid(at, "required"));
        };
        check_gvk(&at, gvk)?;
        self.kinds.entry(gvk.clone()).or_insert(at);
        Ok(gvk.clone())
    }

    pub fn registrant(&self) -> &str {
        &self.registrant
    }

    /// The names of its controllers, in the order declared.
    pub fn controllers(&self) -> impl Iterator<Item = &str> {
        self.controllers.iter().map(|c| c.name.as_str())
    }

    /// Every kind it needs listed and cached, with the field that names it first.
    pub fn kinds(&self) -> impl Iterator<Item = (&Gvk, &str)> {
        self.kinds.iter().map(|(gvk, field)| (gvk, field.as_str()))
    }

    /// Whether the registration may be made by `account` under `config`'s grants: each kind
    /// it names must be the file's or granted to the account, in full where a watch wants
    /// whole objects. The error names the field, the kind and the account.
    pub fn check_access(&self, config: &Config, account: &str) -> Result<(), AccessDenied> {
        for (gvk, field) in &self.kinds {
            let metadata_only = self
                .controllers
                .iter()
                .filter_map(|c| c.needs.get(gvk))
                .all(|m| *m);
            match config.access(account, gvk) {
                None => {
                    return Err(AccessDenied(format!(
                        "{field}: {gvk} is not granted to service account {account:?} (the \
                         watcher configuration's registrations)"
                    )));
                }
                Some(Objects::Metadata) if !metadata_only => {
                    return Err(AccessDenied(format!(
                        "{field}: {gvk} is granted to service account {account:?} as metadata \
                         only; watch it with metadata_only, or grant it objects: full"
                    )));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// A registration of a kind its registrant may not have, naming the field and the kind.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AccessDenied(pub String);

fn check_name(field: &str, name: &str) -> Result<()> {
    if name.trim().is_empty() {
        return Err(invalid(field, "required"));
    }
    if name.len() > MAX_NAME {
        return Err(invalid(
            field,
            format!("is {} characters; at most {MAX_NAME}", name.len()),
        ));
    }
    Ok(())
}

/// `through` belongs to `owns` watches, `label` to `by_label` watches.
fn only_in(field: &str, watch: &Watch, through: bool, label: bool) -> Result<()> {
    if !through && watch.through.is_some() {
        return Err(invalid(
            format!("{field}.through"),
            "only an owns watch maps through an owner",
        ));
    }
    if !label && !watch.label.is_empty() {
        return Err(invalid(
            format!("{field}.label"),
            "only a by_label watch names a label",
        ));
    }
    Ok(())
}

fn check_gvk(field: &str, gvk: &Gvk) -> Result<()> {
    let Gvk {
        group,
        version,
        kind,
    } = gvk;
    if !group.is_empty() && !switchyard_selector::names::is_dns_subdomain(group) {
        return Err(invalid(
            format!("{field}.group"),
            format!("{group:?} is not an API group such as apps or example.com"),
        ));
    }
    if version.is_empty() {
        return Err(invalid(format!("{field}.version"), "required"));
    }
    if !version.starts_with(|c: char| c.is_ascii_lowercase())
        || !version
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        || version.len() > 63
    {
        return Err(invalid(
            format!("{field}.version"),
            format!("{version:?} is not a version such as v1 or v1beta1"),
        ));
    }
    if kind.is_empty() {
        return Err(invalid(format!("{field}.kind"), "required"));
    }
    if !is_kind(kind) {
        return Err(invalid(
            format!("{field}.kind"),
            format!("{kind:?} must be a CamelCase name such as ReplicaSet"),
        ));
    }
    Ok(())
}

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
            };
            let keying = Keying::of(&rule.predicates, rule.batch_period);
            add_rule(rules, Target { gvk, mapping }, keying);
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
                    },
                    predicates: keying.filter.predicates(),
                    batch_period: keying.batch_period,
                });
            }
        }
        config.rules.extend(rules);
        config
    }
}

#[cfg(test)]
mod tests;
