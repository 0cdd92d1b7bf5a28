//! A registration as it arrives, validated: names, kinds and how each is mapped, the error
//! naming the field; and whether its registrant may watch what it names.

use std::collections::BTreeMap;

use super::{
    Controller, ControllerWatches, Keying, MAX_CONTROLLERS, MAX_LABEL, MAX_NAME, MAX_WATCHES,
    Mapping, Result, Rules, Target, Watch, add_rule, invalid,
};
use crate::{
    Config, Gvk, Objects,
    config::{MAX_BATCH_PERIOD, is_kind},
};

/// A validated registration: one registrant's controllers and the kinds they need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub(super) registrant: String,
    pub(super) controllers: Vec<Controller>,
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
            by_namespace,
            by_selector,
            by_placement,
            by_name,
            namespaces,
        } = declared;
        let at = format!("controllers[{c}]");
        check_name(&format!("{at}.name"), &name)?;
        let namespaces = crate::config::checked_namespaces(&namespaces)
            .map_err(|(i, problem)| invalid(format!("{at}.namespaces[{i}]"), problem))?;
        let lists = [
            ("owns", &owns),
            ("by_label", &by_label),
            ("by_namespace", &by_namespace),
            ("by_selector", &by_selector),
            ("by_placement", &by_placement),
            ("by_name", &by_name),
        ];
        for (list, watches) in lists {
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
                selector: selector(&field, &reconciles)?,
                fields: fields(&field, &reconciles)?,
                namespaces: namespaces.clone(),
            },
            Keying::of(
                &reconciles.predicates,
                reconciles.batch_period,
                reconciles.batch_status_only,
            ),
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
                    selector: selector(&field, watch)?,
                    fields: fields(&field, watch)?,
                    namespaces: namespaces.clone(),
                },
                Keying::of(
                    &watch.predicates,
                    watch.batch_period,
                    watch.batch_status_only,
                ),
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
                    selector: selector(&field, watch)?,
                    fields: fields(&field, watch)?,
                    namespaces: namespaces.clone(),
                },
                Keying::of(
                    &watch.predicates,
                    watch.batch_period,
                    watch.batch_status_only,
                ),
            );
        }
        for (i, watch) in by_namespace.iter().enumerate() {
            let field = format!("{at}.by_namespace[{i}]");
            let gvk = self.kind(&field, watch)?;
            only_in(&field, watch, false, false)?;
            if !owner.is_namespace() {
                return Err(invalid(
                    field,
                    format!(
                        "maps to the object's Namespace, so the reconciled kind must be v1/Namespace, not {owner}"
                    ),
                ));
            }
            controller.need(&gvk, watch.metadata_only);
            add_rule(
                &mut controller.rules,
                Target {
                    gvk,
                    mapping: Mapping::ByNamespace,
                    selector: selector(&field, watch)?,
                    fields: fields(&field, watch)?,
                    namespaces: namespaces.clone(),
                },
                Keying::of(
                    &watch.predicates,
                    watch.batch_period,
                    watch.batch_status_only,
                ),
            );
        }
        for (i, watch) in by_name.iter().enumerate() {
            let field = format!("{at}.by_name[{i}]");
            let gvk = self.kind(&field, watch)?;
            only_in(&field, watch, false, false)?;
            controller.need(&gvk, watch.metadata_only);
            add_rule(
                &mut controller.rules,
                Target {
                    gvk,
                    mapping: Mapping::ByName,
                    selector: selector(&field, watch)?,
                    fields: fields(&field, watch)?,
                    namespaces: namespaces.clone(),
                },
                Keying::of(
                    &watch.predicates,
                    watch.batch_period,
                    watch.batch_status_only,
                ),
            );
        }
        let by_owner = by_selector
            .iter()
            .enumerate()
            .map(|(i, w)| {
                (
                    "by_selector",
                    i,
                    w,
                    Mapping::BySelector {
                        owner: owner.clone(),
                    },
                )
            })
            .chain(by_placement.iter().enumerate().map(|(i, w)| {
                (
                    "by_placement",
                    i,
                    w,
                    Mapping::ByPlacement {
                        owner: owner.clone(),
                    },
                )
            }));
        for (list, i, watch, mapping) in by_owner {
            let field = format!("{at}.{list}[{i}]");
            let gvk = self.kind(&field, watch)?;
            only_in(&field, watch, false, false)?;
            if matches!(mapping, Mapping::ByPlacement { .. }) && watch.metadata_only {
                return Err(invalid(
                    format!("{field}.metadata_only"),
                    "a by_placement watch reads the object's labels and taints, so it must be cached in full",
                ));
            }
            controller.need(&gvk, watch.metadata_only);
            add_rule(
                &mut controller.rules,
                Target {
                    gvk,
                    mapping,
                    selector: selector(&field, watch)?,
                    fields: fields(&field, watch)?,
                    namespaces: namespaces.clone(),
                },
                Keying::of(
                    &watch.predicates,
                    watch.batch_period,
                    watch.batch_status_only,
                ),
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
/// The watch's label selector, checked (`None`: every object keys).
fn selector(field: &str, watch: &Watch) -> Result<Option<String>> {
    crate::config::checked_label_selector(&watch.label_selector)
        .map_err(|problem| invalid(format!("{field}.label_selector"), problem))
}

/// A watch's field selector, checked: `None` when empty.
fn fields(field: &str, watch: &Watch) -> Result<Option<String>> {
    crate::fields::checked_field_selector(&watch.field_selector)
        .map_err(|problem| invalid(format!("{field}.field_selector"), problem))
}

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
