//! Field selectors of watches, in the apiserver's syntax (`spec.nodeName=node-1`,
//! `status.phase!=Running`, `a==b`, requirements joined by commas, all of which must hold).
//! The watcher's cache is shared by every watch of a kind, so the apiserver cannot narrow
//! the watch: the watcher evaluates the selector on each event, from the hashes it keeps of
//! the named fields of each cached object ([`Summary::with_fields`]).
//!
//! A field absent or null reads as the empty string, as the apiserver reads it; a number or
//! a boolean matches its JSON text (`spec.replicas=3`, `spec.suspend=true`).

use std::sync::Arc;

use crate::store::{Summary, value_hash};

/// The longest field selector a watch may have.
pub const MAX_FIELD_SELECTOR: usize = 1024;
/// Requirements in one field selector, at most.
pub const MAX_FIELD_REQUIREMENTS: usize = 16;

/// A parsed field selector: every requirement must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Requirement {
    /// The field as a JSON pointer (`spec.nodeName` is `/spec/nodeName`).
    pointer: Arc<str>,
    /// `=` or `==` (true), `!=` (false).
    equals: bool,
    /// The hashes a value matching the literal has: as a string, and as the number or
    /// boolean the literal spells, if it spells one.
    matching: Vec<u64>,
    /// The literal is empty: an absent or null field matches it.
    empty: bool,
}

impl FieldSelector {
    /// Parses `text`, or says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.len() > MAX_FIELD_SELECTOR {
            return Err(format!(
                "is {} characters; at most {MAX_FIELD_SELECTOR}",
                text.len()
            ));
        }
        let requirements = text
            .split(',')
            .map(str::trim)
            .map(Requirement::parse)
            .collect::<Result<Vec<_>, _>>()?;
        if requirements.len() > MAX_FIELD_REQUIREMENTS {
            return Err(format!(
                "has {} requirements; at most {MAX_FIELD_REQUIREMENTS}",
                requirements.len()
            ));
        }
        Ok(Self { requirements })
    }

    /// The JSON pointers of the fields it reads, for [`Summary::with_fields`].
    pub fn pointers(&self) -> impl Iterator<Item = &Arc<str>> {
        self.requirements.iter().map(|r| &r.pointer)
    }

    /// Whether `summary`'s object matches. A field whose hash was not taken (the object was
    /// cached before the selector came) cannot be told: the object matches, so that a key is
    /// never lost (its next change is told).
    pub fn matches(&self, summary: &Summary) -> bool {
        self.requirements.iter().all(|requirement| {
            summary
                .field(&requirement.pointer)
                .is_none_or(|hash| requirement.holds(hash))
        })
    }

    /// Whether `object` (its JSON, parsed) matches.
    pub fn matches_object(&self, object: &serde_json::Value) -> bool {
        self.requirements.iter().all(|requirement| {
            requirement.holds(object.pointer(&requirement.pointer).map(value_hash))
        })
    }
}

impl Requirement {
    /// Whether a field whose value hashes to `hash` (`None`: absent) meets it.
    fn holds(&self, hash: Option<u64>) -> bool {
        let equal = match hash {
            None => self.empty,
            Some(hash) => {
                self.matching.contains(&hash)
                    || (self.empty && hash == value_hash(&serde_json::Value::Null))
            }
        };
        equal == self.equals
    }

    fn parse(text: &str) -> Result<Self, String> {
        let (field, equals, value) = if let Some((field, value)) = text.split_once("!=") {
            (field, false, value)
        } else if let Some((field, value)) = text.split_once("==") {
            (field, true, value)
        } else if let Some((field, value)) = text.split_once('=') {
            (field, true, value)
        } else {
            return Err(format!(
                "{text:?} is no requirement: a field, '=', '==' or '!=', and a value"
            ));
        };
        let (field, value) = (field.trim(), value.trim());
        let segment_ok = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        if !field.split('.').all(segment_ok) {
            return Err(format!(
                "{field:?} is no field: names of letters, digits, '_' and '-' joined by '.', as spec.nodeName"
            ));
        }
        if value.contains(['=', '!']) {
            return Err(format!("the value {value:?} may hold no '=' or '!'"));
        }
        let mut matching = vec![value_hash(&serde_json::Value::String(value.to_owned()))];
        if let Ok(literal @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) =
            serde_json::from_str::<serde_json::Value>(value)
        {
            matching.push(value_hash(&literal));
        }
        Ok(Self {
            pointer: Arc::from(format!("/{}", field.replace('.', "/"))),
            equals,
            matching,
            empty: value.is_empty(),
        })
    }
}

/// A watch's field selector, trimmed: `None` when empty; otherwise what is wrong with it.
pub fn checked_field_selector(text: &str) -> Result<Option<String>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    FieldSelector::parse(text)?;
    Ok(Some(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn bare() -> Summary {
        Summary::new("ns", "o", "1", Some(1), [], [], None)
    }

    fn summary(selector: &FieldSelector, object: serde_json::Value) -> Summary {
        let pointers: Vec<Arc<str>> = selector.pointers().cloned().collect();
        bare().with_fields(&pointers, &object)
    }

    #[test]
    fn requirements_all_hold_on_strings_numbers_and_absent_fields() {
        let selector =
            FieldSelector::parse("spec.nodeName=node-1, status.phase!=Running,spec.replicas==3")
                .unwrap();
        let pod = |node: &str, phase: &str, replicas: serde_json::Value| {
            summary(
                &selector,
                json!({"spec": {"nodeName": node, "replicas": replicas}, "status": {"phase": phase}}),
            )
        };
        assert!(selector.matches(&pod("node-1", "Pending", json!(3))));
        assert!(!selector.matches(&pod("node-2", "Pending", json!(3))));
        assert!(!selector.matches(&pod("node-1", "Running", json!(3))));
        assert!(!selector.matches(&pod("node-1", "Pending", json!(4))));
        assert!(selector.matches(&pod("node-1", "Pending", json!("3"))));

        // Unscheduled: an absent nodeName reads as "".
        let unscheduled = FieldSelector::parse("spec.nodeName=").unwrap();
        assert!(unscheduled.matches(&summary(&unscheduled, json!({"spec": {}}))));
        assert!(unscheduled.matches(&summary(&unscheduled, json!({"spec": {"nodeName": null}}))));
        assert!(!unscheduled.matches(&summary(&unscheduled, json!({"spec": {"nodeName": "n"}}))));
        let scheduled = FieldSelector::parse("spec.nodeName!=").unwrap();
        assert!(scheduled.matches(&summary(&scheduled, json!({"spec": {"nodeName": "n"}}))));
        assert!(!scheduled.matches(&summary(&scheduled, json!({}))));
        // A boolean spelt as JSON.
        let suspended = FieldSelector::parse("spec.suspend=true").unwrap();
        assert!(suspended.matches(&summary(&suspended, json!({"spec": {"suspend": true}}))));
        assert!(suspended.matches_object(&json!({"spec": {"suspend": true}})));
        assert!(!suspended.matches_object(&json!({"spec": {}})));
        assert!(!suspended.matches(&summary(&suspended, json!({"spec": {"suspend": false}}))));

        // Cached before the selector came: no hash taken, so it matches.
        assert!(selector.matches(&bare()));
    }

    #[test]
    fn a_malformed_selector_says_what_is_wrong() {
        for (text, says) in [
            ("spec.nodeName", "is no requirement"),
            ("spec..nodeName=a", "is no field"),
            ("spec/nodeName=a", "is no field"),
            ("a=b=c", "may hold no '='"),
            (&"a=b,".repeat(9), "is no requirement"),
        ] {
            let error = FieldSelector::parse(text).unwrap_err();
            assert!(error.contains(says), "{text:?}: {error}");
        }
        let many = vec!["a=b"; MAX_FIELD_REQUIREMENTS + 1].join(",");
        assert!(
            FieldSelector::parse(&many)
                .unwrap_err()
                .contains("at most 16")
        );
        let long = format!("a={}", "x".repeat(MAX_FIELD_SELECTOR));
        assert!(
            FieldSelector::parse(&long)
                .unwrap_err()
                .contains("at most 1024")
        );
        assert_eq!(checked_field_selector("  "), Ok(None));
        assert_eq!(
            checked_field_selector(" metadata.name=web "),
            Ok(Some("metadata.name=web".into()))
        );
    }
}
