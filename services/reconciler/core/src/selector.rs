//! A workload's `spec.selector` (`metav1.LabelSelector`) as the project's one label selector
//! (`switchyard-selector`): this module only hands it the Kubernetes fields.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use switchyard_selector::{Expression, LabelSelectorError};

/// What is wrong with `selector`, named by its field (`selector.matchExpressions[1]...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("selector.{0}")]
pub struct SelectorError(#[from] pub LabelSelectorError);

/// A validated selector: every requirement must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector(switchyard_selector::Selector);

impl Selector {
    /// As `metav1.LabelSelectorAsSelector`: an empty selector matches everything.
    pub fn new(selector: &LabelSelector) -> Result<Self, SelectorError> {
        let match_labels = selector
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.as_str()));
        let match_expressions = selector
            .match_expressions
            .iter()
            .flatten()
            .map(|e| Expression {
                key: &e.key,
                operator: &e.operator,
                values: e.values.as_deref().unwrap_or_default(),
            });
        Ok(Self(switchyard_selector::Selector::from_label_selector(
            match_labels,
            match_expressions,
        )?))
    }

    /// A selector that matches a label set exactly on its keys (`labels.Set.AsSelector`).
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Self {
        Self(switchyard_selector::Selector::from_labels(labels))
    }

    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.0.matches(labels)
    }

    /// The requirements all of `selectors` share: it matches whatever one of them matches
    /// (empty when they share none).
    pub fn common<'a>(selectors: impl IntoIterator<Item = &'a Self>) -> Self {
        Self(switchyard_selector::Selector::common(
            selectors.into_iter().map(|s| &s.0),
        ))
    }

    /// Whether it matches every label set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The string form for the Cache API (`app=web,tier in (a,b),!legacy`).
    pub fn to_query(&self) -> String {
        self.0.to_string()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn expr(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    #[test]
    fn labels_and_expressions_all_hold() {
        let selector = Selector::new(&LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![
                expr("tier", "In", &["a", "b"]),
                expr("env", "NotIn", &["prod"]),
                expr("team", "Exists", &[]),
                expr("legacy", "DoesNotExist", &[]),
            ]),
        })
        .unwrap();
        let yes = labels(&[("app", "web"), ("tier", "a"), ("team", "x")]);
        assert!(selector.matches(Some(&yes)));
        for no in [
            labels(&[("app", "db"), ("tier", "a"), ("team", "x")]),
            labels(&[("app", "web"), ("tier", "c"), ("team", "x")]),
            labels(&[
                ("app", "web"),
                ("tier", "a"),
                ("team", "x"),
                ("env", "prod"),
            ]),
            labels(&[("app", "web"), ("tier", "a")]),
            labels(&[("app", "web"), ("tier", "a"), ("team", "x"), ("legacy", "")]),
        ] {
            assert!(!selector.matches(Some(&no)), "{no:?}");
        }
        assert!(!selector.matches(None));
        assert_eq!(
            selector.to_query(),
            "app=web,tier in (a,b),env notin (prod),team,!legacy"
        );
    }

    #[test]
    fn bad_fields_are_named_under_selector() {
        let bad = |e| {
            Selector::new(&LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![expr("a", "Exists", &[]), e]),
            })
            .unwrap_err()
            .to_string()
        };
        assert_eq!(
            bad(expr("k", "Near", &[])),
            "selector.matchExpressions[1].operator: unknown operator \"Near\" (expected In, \
             NotIn, Exists or DoesNotExist)"
        );
        assert_eq!(
            bad(expr("k", "In", &[])),
            "selector.matchExpressions[1].values: operator In needs at least one value"
        );
        let bad_label = Selector::new(&LabelSelector {
            match_labels: Some(labels(&[("app", "-web")])),
            match_expressions: None,
        })
        .unwrap_err();
        assert_eq!(
            bad_label.to_string(),
            "selector.matchLabels: label value \"-web\": must begin and end with a letter or digit"
        );
    }

    #[test]
    fn a_label_set_matches_on_its_keys() {
        let template = labels(&[("app", "web"), ("pod-template-hash", "abc")]);
        let selector = Selector::from_labels(&template);
        assert!(selector.matches(Some(&template)));
        assert!(!selector.matches(Some(&labels(&[("app", "web")]))));
        assert_eq!(selector.to_query(), "app=web,pod-template-hash=abc");
    }

    #[test]
    fn empty_selector_matches_everything() {
        let selector = Selector::new(&LabelSelector::default()).unwrap();
        assert!(selector.matches(None));
        assert_eq!(selector.to_query(), "");
    }
}
