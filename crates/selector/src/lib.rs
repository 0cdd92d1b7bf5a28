//! Kubernetes label selectors, one implementation for every Switchyard service: the watcher's
//! Cache API, the reconcilers' workload specs and the queue's external metrics API.
//!
//! ```text
//!  "app=web,tier in (a,b),!legacy"  ── Selector::parse ─────────────┐
//!  matchLabels + matchExpressions   ── Selector::from_label_selector ┼─► Selector ── matches(labels) ─► bool
//!  an object's own labels           ── Selector::from_labels ───────┘      │
//!                                                                          └─ Display ─► the string form
//! ```
//!
//! A selector is a list of requirements that must all hold; the empty selector matches
//! everything. Keys and values are checked as the apiserver checks them ([`label`]), and
//! every error names what is wrong. The crate knows no Kubernetes client types: callers pass
//! plain strings and implement [`Labels`] for their own label sets.

pub mod label;
mod label_selector;
pub mod names;
mod parse;
pub mod placement;

use std::{borrow::Borrow, collections::BTreeMap, fmt, str::FromStr};

pub use label::{LabelError, validate_key, validate_value};
pub use label_selector::{Expression, LabelSelectorError};
pub use parse::{ParseError, Problem};

/// A set of labels that selectors are matched against.
pub trait Labels {
    /// The value of the label `key`, when the set has it.
    fn label(&self, key: &str) -> Option<&str>;
}

impl<K: Borrow<str> + Ord, V: AsRef<str>> Labels for BTreeMap<K, V> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(AsRef::as_ref)
    }
}

impl<T: Labels + ?Sized> Labels for &T {
    fn label(&self, key: &str) -> Option<&str> {
        (**self).label(key)
    }
}

/// No set at all (an object without `metadata.labels`) has no labels.
impl<T: Labels> Labels for Option<T> {
    fn label(&self, key: &str) -> Option<&str> {
        self.as_ref().and_then(|labels| labels.label(key))
    }
}

/// A label selector: every requirement must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

/// One requirement, as the apiserver's `labels.Requirement` with its `selection.Operator`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    /// `key=value` or `key==value`.
    Equals(String, String),
    /// `key!=value`; also holds when the key is absent.
    NotEquals(String, String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)`; also holds when the key is absent.
    NotIn(String, Vec<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    DoesNotExist(String),
}

impl Selector {
    /// Parses the string form (the `labelSelector` of a list or watch) as the apiserver's
    /// `labels.Parse` does: requirements separated by commas, each one of
    ///
    /// ```text
    ///  key=value  key==value  key!=value  key in (v1,v2)  key notin (v1,v2)  key  !key
    /// ```
    ///
    /// with spaces allowed around keys, operators and values. A value may be empty
    /// (`key=`, `key in ()`). Only the apiserver's `key>n` and `key<n`, which no
    /// `metav1.LabelSelector` can express, are refused.
    pub fn parse(input: &str) -> Result<Self, ParseError> {
        parse::parse(input).map(|requirements| Self { requirements })
    }

    /// A selector that each of `labels` must equal (`labels.SelectorFromSet`). The set is
    /// not checked: it is an object's own labels, which the apiserver checked.
    pub fn from_labels<K: Into<String>, V: Into<String>>(
        labels: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self {
            requirements: labels
                .into_iter()
                .map(|(k, v)| Requirement::Equals(k.into(), v.into()))
                .collect(),
        }
    }

    /// The `key=value` pairs every matching set has (its `key=value` and single-value
    /// `key in (value)` requirements): what an index by label can look candidates up by.
    pub fn equalities(&self) -> impl Iterator<Item = (&str, &str)> {
        self.requirements.iter().filter_map(|r| match r {
            Requirement::Equals(k, v) => Some((k.as_str(), v.as_str())),
            Requirement::In(k, vs) if vs.len() == 1 => Some((k.as_str(), vs[0].as_str())),
            _ => None,
        })
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: impl Labels) -> bool {
        self.requirements.iter().all(|r| r.matches(&labels))
    }

    /// The requirements that all of `selectors` have (the first's, in its order, that each
    /// of the others has too): every label set that matches one of them matches this, so one
    /// read with it, filtered by each, finds what a read with each would. Empty when they
    /// share none, or when there are none.
    pub fn common<'a>(selectors: impl IntoIterator<Item = &'a Self>) -> Self {
        let mut selectors = selectors.into_iter();
        let Some(first) = selectors.next() else {
            return Self::default();
        };
        let mut requirements = first.requirements.clone();
        for other in selectors {
            requirements.retain(|r| other.requirements.contains(r));
        }
        Self { requirements }
    }

    /// Whether it has no requirement, and so matches every label set.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

impl Requirement {
    fn matches(&self, labels: &impl Labels) -> bool {
        match self {
            Self::Equals(k, v) => labels.label(k) == Some(v.as_str()),
            Self::NotEquals(k, v) => labels.label(k) != Some(v.as_str()),
            Self::In(k, vs) => labels.label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Self::NotIn(k, vs) => labels.label(k).is_none_or(|l| vs.iter().all(|v| v != l)),
            Self::Exists(k) => labels.label(k).is_some(),
            Self::DoesNotExist(k) => labels.label(k).is_none(),
        }
    }
}

impl FromStr for Selector {
    type Err = ParseError;

    fn from_str(input: &str) -> Result<Self, ParseError> {
        Self::parse(input)
    }
}

/// The string form, which [`Selector::parse`] reads back to an equal selector.
impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, requirement) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match requirement {
                Requirement::Equals(k, v) => write!(f, "{k}={v}")?,
                Requirement::NotEquals(k, v) => write!(f, "{k}!={v}")?,
                Requirement::In(k, vs) => write!(f, "{k} in ({})", vs.join(","))?,
                Requirement::NotIn(k, vs) => write!(f, "{k} notin ({})", vs.join(","))?,
                Requirement::Exists(k) => f.write_str(k)?,
                Requirement::DoesNotExist(k) => write!(f, "!{k}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&'static str, &'static str)]) -> BTreeMap<&'static str, &'static str> {
        pairs.iter().copied().collect()
    }

    fn matches(selector: &str, on: &BTreeMap<&str, &str>) -> bool {
        Selector::parse(selector).expect(selector).matches(on)
    }

    #[test]
    fn every_operator_matches_as_the_apiserver_does() {
        let on = labels(&[("app", "web"), ("tier", "front"), ("example.com/x", "1")]);
        for (selector, expected) in [
            ("", true),
            ("   ", true),
            ("app=web", true),
            ("app==web", true),
            ("app = web", true),
            ("app=db", false),
            ("missing=", false),
            ("app!=db", true),
            ("app!=web", false),
            ("missing!=db", true),
            ("tier in (front, back)", true),
            ("tier in (back)", false),
            ("missing in (front)", false),
            ("tier notin (front,back)", false),
            ("tier notin (back)", true),
            ("missing notin (a)", true),
            ("example.com/x", true),
            ("missing", false),
            ("!missing", true),
            ("! missing", true),
            ("!app", false),
            ("app=web,tier in (front),!missing", true),
            ("app=web,tier=back", false),
            ("app,example.com/tier=x", false),
            ("example.com/tier!=x", true),
        ] {
            assert_eq!(matches(selector, &on), expected, "{selector:?} on {on:?}");
        }
    }

    #[test]
    fn an_empty_value_is_a_value() {
        let empty = labels(&[("flag", "")]);
        assert!(matches("flag=", &empty));
        assert!(matches("flag", &empty));
        assert!(matches("flag in ()", &empty));
        assert!(!matches("flag in (a)", &empty));
        assert!(!matches("flag!=", &empty));
        assert!(!matches("flag=", &labels(&[])));
    }

    #[test]
    fn label_sets_without_labels_and_by_reference() {
        let selector = Selector::parse("app=web,!legacy").unwrap();
        let owned: BTreeMap<String, String> = [("app".to_owned(), "web".to_owned())].into();
        assert!(selector.matches(&owned));
        assert!(selector.matches(Some(&owned)));
        assert!(!selector.matches(None::<&BTreeMap<String, String>>));
        assert!(
            Selector::parse("!app")
                .unwrap()
                .matches(None::<&BTreeMap<String, String>>)
        );
        assert!(Selector::default().matches(None::<&BTreeMap<String, String>>));
    }

    #[test]
    fn from_labels_requires_each_label() {
        let template = labels(&[("app", "web"), ("tier", "front")]);
        let selector = Selector::from_labels(template.iter().map(|(k, v)| (*k, *v)));
        assert!(selector.matches(&template));
        assert!(selector.matches(labels(&[("app", "web"), ("tier", "front"), ("x", "y")])));
        assert!(!selector.matches(labels(&[("app", "web")])));
        assert_eq!(selector.to_string(), "app=web,tier=front");
        assert!(Selector::from_labels(labels(&[])).matches(labels(&[])));
    }

    #[test]
    fn the_common_part_matches_whatever_one_of_them_matches() {
        let parse = |text: &str| Selector::parse(text).unwrap();
        let siblings = [
            parse("app=web,pod-template-hash=a"),
            parse("pod-template-hash=b,app=web"),
            parse("app=web,pod-template-hash=c,!legacy"),
        ];
        let common = Selector::common(&siblings);
        assert_eq!(common.to_string(), "app=web");
        for set in [
            labels(&[("app", "web"), ("pod-template-hash", "a")]),
            labels(&[("app", "web"), ("pod-template-hash", "b"), ("legacy", "")]),
            labels(&[("app", "web"), ("pod-template-hash", "c")]),
            labels(&[("app", "db"), ("pod-template-hash", "a")]),
            labels(&[]),
        ] {
            if siblings.iter().any(|s| s.matches(&set)) {
                assert!(common.matches(&set), "{set:?}");
            }
        }
        assert!(!common.matches(labels(&[("app", "db")])));
        assert!(Selector::common(&[parse("app=web"), parse("app=db")]).is_empty());
        assert!(Selector::common([]).is_empty());
        assert_eq!(
            Selector::common(&[parse("app=web,tier in (a,b)")]).to_string(),
            "app=web,tier in (a,b)"
        );
    }

    #[test]
    fn equalities_are_the_values_every_match_has() {
        let pairs = |text: &str| -> Vec<(String, String)> {
            Selector::parse(text)
                .unwrap()
                .equalities()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        };
        let owned = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        assert_eq!(
            pairs("app=web,tier in (front),x in (a,b),y!=z,w,!v,flag="),
            [
                owned("app", "web"),
                owned("tier", "front"),
                owned("flag", "")
            ]
        );
        assert!(pairs("").is_empty());
        assert!(pairs("x notin (a)").is_empty());
    }

    #[test]
    fn round_trips_through_display() {
        for text in [
            "",
            "app=web,tier!=db,env in (a,b),x notin (c),has,!gone",
            "flag=,x in (),y notin (,a)",
            "example.com/tier=front",
        ] {
            let selector: Selector = text.parse().unwrap();
            assert_eq!(selector.to_string(), text);
            assert_eq!(Selector::parse(&selector.to_string()).unwrap(), selector);
        }
        assert_eq!(
            Selector::parse(" app == web , tier  in ( a , b ) , ! gone ")
                .unwrap()
                .to_string(),
            "app=web,tier in (a,b),!gone"
        );
    }
}
