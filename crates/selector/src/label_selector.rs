//! `metav1.LabelSelector` (`matchLabels` and `matchExpressions`), as the apiserver's
//! `metav1.LabelSelectorAsSelector` turns it into a selector, from plain strings so that this
//! crate needs no Kubernetes types.

use crate::{
    Requirement, Selector,
    label::{LabelError, validate_key, validate_value},
};

/// One `matchExpressions` entry.
#[derive(Clone, Copy, Debug)]
pub struct Expression<'a> {
    pub key: &'a str,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: &'a str,
    pub values: &'a [String],
}

/// What is wrong with a `metav1.LabelSelector`, named by its field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LabelSelectorError {
    #[error("matchLabels: {0}")]
    MatchLabels(LabelError),
    #[error(
        "matchExpressions[{index}].operator: unknown operator {operator:?} (expected In, \
         NotIn, Exists or DoesNotExist)"
    )]
    Operator { index: usize, operator: String },
    #[error("matchExpressions[{index}].values: operator {operator} needs {needs}")]
    Values {
        index: usize,
        operator: &'static str,
        needs: &'static str,
    },
    #[error("matchExpressions[{index}]: {source}")]
    Expression { index: usize, source: LabelError },
}

impl Selector {
    /// `matchLabels` then `matchExpressions`, every one to hold; empty, the selector
    /// matches everything. (A selector that is absent altogether, which the apiserver reads
    /// as matching nothing, is the caller's to handle.)
    pub fn from_label_selector<'a>(
        match_labels: impl IntoIterator<Item = (&'a str, &'a str)>,
        match_expressions: impl IntoIterator<Item = Expression<'a>>,
    ) -> Result<Self, LabelSelectorError> {
        let mut requirements = Vec::new();
        for (key, value) in match_labels {
            validate_key(key)
                .and_then(|()| validate_value(value))
                .map_err(LabelSelectorError::MatchLabels)?;
            requirements.push(Requirement::Equals(key.to_owned(), value.to_owned()));
        }
        for (index, expression) in match_expressions.into_iter().enumerate() {
            requirements.push(expression.requirement(index)?);
        }
        Ok(Self { requirements })
    }
}

impl Expression<'_> {
    fn requirement(&self, index: usize) -> Result<Requirement, LabelSelectorError> {
        let Self {
            key,
            operator,
            values,
        } = *self;
        type Make = fn(String, Vec<String>) -> Requirement;
        let (operator, make, set): (&'static str, Make, bool) = match operator {
            "In" => ("In", Requirement::In, true),
            "NotIn" => ("NotIn", Requirement::NotIn, true),
            "Exists" => ("Exists", |key, _| Requirement::Exists(key), false),
            "DoesNotExist" => (
                "DoesNotExist",
                |key, _| Requirement::DoesNotExist(key),
                false,
            ),
            other => {
                return Err(LabelSelectorError::Operator {
                    index,
                    operator: other.to_owned(),
                });
            }
        };
        if set == values.is_empty() {
            return Err(LabelSelectorError::Values {
                index,
                operator,
                needs: if set {
                    "at least one value"
                } else {
                    "no values"
                },
            });
        }
        let invalid = |source| LabelSelectorError::Expression { index, source };
        validate_key(key).map_err(invalid)?;
        for value in values {
            validate_value(value).map_err(invalid)?;
        }
        Ok(make(key.to_owned(), values.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::label::Reason;

    fn owned(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| (*v).to_owned()).collect()
    }

    fn selector(
        labels: &[(&str, &str)],
        expressions: &[(&str, &str, Vec<String>)],
    ) -> Result<Selector, LabelSelectorError> {
        Selector::from_label_selector(
            labels.iter().copied(),
            expressions
                .iter()
                .map(|(key, operator, values)| Expression {
                    key,
                    operator,
                    values,
                }),
        )
    }

    fn labels(pairs: &[(&'static str, &'static str)]) -> BTreeMap<&'static str, &'static str> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn labels_and_expressions_all_hold() {
        let selector = selector(
            &[("app", "web")],
            &[
                ("tier", "In", owned(&["a", "b"])),
                ("env", "NotIn", owned(&["prod"])),
                ("team", "Exists", vec![]),
                ("legacy", "DoesNotExist", vec![]),
            ],
        )
        .unwrap();
        assert!(selector.matches(labels(&[("app", "web"), ("tier", "a"), ("team", "x")])));
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
            assert!(!selector.matches(&no), "{no:?}");
        }
        assert!(!selector.matches(None::<&BTreeMap<String, String>>));
        assert_eq!(
            selector.to_string(),
            "app=web,tier in (a,b),env notin (prod),team,!legacy"
        );
        assert_eq!(Selector::parse(&selector.to_string()), Ok(selector));
    }

    #[test]
    fn an_empty_label_selector_matches_everything() {
        let selector = selector(&[], &[]).unwrap();
        assert!(selector.matches(None::<&BTreeMap<String, String>>));
        assert_eq!(selector.to_string(), "");
    }

    #[test]
    fn bad_expressions_name_their_field() {
        let bad = |e: (&str, &str, Vec<String>)| {
            selector(&[("app", "web")], &[("a", "Exists", vec![]), e]).unwrap_err()
        };
        assert_eq!(
            bad(("k", "Near", vec![])).to_string(),
            "matchExpressions[1].operator: unknown operator \"Near\" (expected In, NotIn, \
             Exists or DoesNotExist)"
        );
        assert_eq!(
            bad(("k", "In", vec![])).to_string(),
            "matchExpressions[1].values: operator In needs at least one value"
        );
        assert_eq!(
            bad(("k", "NotIn", vec![])),
            LabelSelectorError::Values {
                index: 1,
                operator: "NotIn",
                needs: "at least one value"
            }
        );
        assert_eq!(
            bad(("k", "DoesNotExist", owned(&["x"]))).to_string(),
            "matchExpressions[1].values: operator DoesNotExist needs no values"
        );
        assert_eq!(
            bad(("bad key", "Exists", vec![])),
            LabelSelectorError::Expression {
                index: 1,
                source: LabelError::Key {
                    key: "bad key".into(),
                    reason: Reason::Character(' ')
                }
            }
        );
        assert_eq!(
            bad(("k", "In", owned(&["ok", "-no"]))).to_string(),
            "matchExpressions[1]: label value \"-no\": must begin and end with a letter or digit"
        );
    }

    #[test]
    fn bad_match_labels_are_named() {
        assert_eq!(
            selector(&[("app", "we b")], &[]).unwrap_err().to_string(),
            "matchLabels: label value \"we b\": character ' ' not allowed (letters, digits, \
             '-', '_' and '.')"
        );
        assert!(matches!(
            selector(&[("a/b/c", "x")], &[]),
            Err(LabelSelectorError::MatchLabels(LabelError::Key {
                reason: Reason::Slashes,
                ..
            }))
        ));
    }
}
