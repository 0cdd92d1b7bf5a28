//! Kubernetes label selectors (`metav1.LabelSelector`): matching a label set, and the string
//! form the watcher's Cache API takes.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("selector.matchExpressions[{index}]: unknown operator {operator:?}")]
    Operator { index: usize, operator: String },
    #[error("selector.matchExpressions[{index}]: operator {operator} needs {needs}")]
    Values {
        index: usize,
        operator: String,
        needs: &'static str,
    },
}

/// A validated selector: every requirement must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Selector {
    /// As `metav1.LabelSelectorAsSelector`: an empty selector matches everything.
    pub fn new(selector: &LabelSelector) -> Result<Self, SelectorError> {
        let mut requirements: Vec<Requirement> = selector
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| Requirement::Equals(k.clone(), v.clone()))
            .collect();
        for (index, expr) in selector.match_expressions.iter().flatten().enumerate() {
            let values = expr.values.clone().unwrap_or_default();
            let needs = |needs| SelectorError::Values {
                index,
                operator: expr.operator.clone(),
                needs,
            };
            let key = expr.key.clone();
            requirements.push(match expr.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => return Err(needs("values")),
                "Exists" | "DoesNotExist" if !values.is_empty() => return Err(needs("no values")),
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                other => {
                    return Err(SelectorError::Operator {
                        index,
                        operator: other.to_owned(),
                    });
                }
            });
        }
        Ok(Self { requirements })
    }

    /// A selector that matches a label set exactly on its keys (`labels.Set.AsSelector`).
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Self {
        Self {
            requirements: labels
                .iter()
                .map(|(k, v)| Requirement::Equals(k.clone(), v.clone()))
                .collect(),
        }
    }

    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k));
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v),
            Requirement::In(k, vs) => get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
        })
    }

    /// The string form (`app=web,tier in (a,b),!legacy`).
    pub fn to_query(&self) -> String {
        let parts: Vec<String> = self
            .requirements
            .iter()
            .map(|r| match r {
                Requirement::Equals(k, v) => format!("{k}={v}"),
                Requirement::In(k, vs) => format!("{k} in ({})", vs.join(",")),
                Requirement::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
                Requirement::Exists(k) => k.clone(),
                Requirement::DoesNotExist(k) => format!("!{k}"),
            })
            .collect();
        parts.join(",")
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
    fn bad_expressions_name_their_index() {
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
            "selector.matchExpressions[1]: unknown operator \"Near\""
        );
        assert_eq!(
            bad(expr("k", "In", &[])),
            "selector.matchExpressions[1]: operator In needs values"
        );
    }

    #[test]
    fn empty_selector_matches_everything() {
        let selector = Selector::new(&LabelSelector::default()).unwrap();
        assert!(selector.matches(None));
        assert_eq!(selector.to_query(), "");
    }
}
