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
//! (with `through`), `by_label`, `by_namespace`, `by_selector`, `by_placement` and `by_name` are
//! `owns`, `mapByLabel`, `mapByNamespace`, `mapBySelector`, `mapByPlacement` and `mapByName`. The kind an `owns` watch
//! maps `through` is cached metadata-only for the registration: only its owner reference
//! is read.
//!
//! Errors name the field, in the proto's words: `controllers[0].owns[1].gvk.kind: ...`.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    time::Duration,
};

use crate::{Gvk, Predicate};

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
    pub by_namespace: Vec<Watch>,
    pub by_selector: Vec<Watch>,
    pub by_placement: Vec<Watch>,
    pub by_name: Vec<Watch>,
    /// The namespaces it works in; empty: every one.
    pub namespaces: Vec<String>,
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
    /// Only updates that keep `metadata.generation` wait (`batchStatusUpdatesOnly`).
    pub batch_status_only: bool,
    /// Only objects whose labels match key through it (`labelSelector`); empty: every one.
    pub label_selector: String,
    /// Only objects whose fields match key through it (`fieldSelector`, the apiserver's
    /// syntax); empty: every one.
    pub field_selector: String,
}

/// How a change of one kind becomes one controller's key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mapping {
    For,
    Owns { owner: Gvk, through: Option<Gvk> },
    ByLabel { label: String },
    ByNamespace,
    BySelector { owner: Gvk },
    ByPlacement { owner: Gvk },
    ByName,
}

/// What a rule maps: a kind, and how.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Target {
    gvk: Gvk,
    mapping: Mapping,
    /// Only objects this label selector matches key through the rule.
    selector: Option<String>,
    /// Only objects this field selector matches key through the rule.
    fields: Option<String>,
    /// The controller's namespaces, sorted; empty: every one.
    namespaces: Vec<String>,
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
            some => Self::AnyOf(some.iter().cloned().collect()),
        }
    }

    fn merge(&mut self, other: &Filter) {
        match (&mut *self, other) {
            (Self::Every, _) => {}
            (_, Self::Every) => *self = Self::Every,
            (Self::AnyOf(mine), Self::AnyOf(theirs)) => mine.extend(theirs.iter().cloned()),
        }
    }

    fn predicates(&self) -> Vec<Predicate> {
        match self {
            Self::Every => Vec::new(),
            Self::AnyOf(some) => some.iter().cloned().collect(),
        }
    }
}

/// Which updates a rule keys and how long its keys wait. Two rules that differ only here are
/// one rule: its filter passes what either passes, and its keys wait the shorter period (none
/// if either has none), for the fewer events (status updates only if either says so).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Keying {
    filter: Filter,
    batch_period: Option<Duration>,
    batch_status_only: bool,
}

impl Keying {
    fn of(predicates: &[Predicate], batch_period: Option<Duration>, status_only: bool) -> Self {
        Self {
            filter: Filter::of(predicates),
            batch_period,
            batch_status_only: batch_period.is_some() && status_only,
        }
    }

    fn merge(&mut self, other: &Keying) {
        self.filter.merge(&other.filter);
        self.batch_period = self.batch_period.min(other.batch_period);
        self.batch_status_only =
            self.batch_period.is_some() && (self.batch_status_only || other.batch_status_only);
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
                batch_status_only,
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
            Mapping::ByNamespace => write!(f, "by namespace on {}", target.gvk)?,
            Mapping::BySelector { .. } => write!(f, "by selector on {}", target.gvk)?,
            Mapping::ByPlacement { .. } => write!(f, "by placement on {}", target.gvk)?,
            Mapping::ByName => write!(f, "by name on {}", target.gvk)?,
        }
        if let Some(selector) = &target.selector {
            write!(f, " selecting {selector:?}")?;
        }
        if let Some(fields) = &target.fields {
            write!(f, " with fields {fields:?}")?;
        }
        if !target.namespaces.is_empty() {
            write!(f, " in namespaces {:?}", target.namespaces)?;
        }
        if let Filter::AnyOf(predicates) = filter {
            write!(f, " {:?}", predicates.iter().collect::<Vec<_>>())?;
        }
        if let Some(period) = batch_period {
            write!(f, " batched {}", humantime::format_duration(*period))?;
            if *batch_status_only {
                write!(f, " (status updates only)")?;
            }
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

mod merge;
mod validate;

pub use merge::{Change, RegistrationId, Watches};
pub use validate::{AccessDenied, Registration};

#[cfg(test)]
mod tests;
