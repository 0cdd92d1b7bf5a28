//! Field selectors of watches, in the apiserver's syntax (`spec.nodeName=node-1`,
//! `status.phase!=Running`, `a==b`, requirements joined by commas, all of which must hold).
//! The watcher's cache is shared by every watch of a kind, so the apiserver cannot narrow
//! the watch: the watcher evaluates the selector on each event, from the hashes it keeps of
//! the named fields of each cached object ([`Summary::with_fields`]).
//!
//! A field absent or null reads as the empty string, as the apiserver reads it; a number or
//! a boolean matches its JSON text (`spec.replicas=3`, `spec.suspend=true`).
//!
//! Beyond the apiserver's fields, a segment may pick an element of a list keyed by one of
//! its fields, as conditions are: `status.conditions[type=Ready].status=True` holds for an
//! object whose `Ready` condition is `True`.

use std::sync::Arc;

use crate::store::{Summary, resolve, value_hash};

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
            requirement.holds(resolve(object, &requirement.pointer).map(value_hash))
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
        let Some((field, equals, value)) = split_requirement(text) else {
            return Err(format!(
                "{text:?} is no requirement: a field, '=', '==' or '!=', and a value"
            ));
        };
        let (field, value) = (field.trim(), value.trim());
        let pointer = pointer_of(field).ok_or_else(|| {
            format!(
                "{field:?} is no field: names of letters, digits, '_' and '-' joined by '.', as \
                 spec.nodeName, each name perhaps picking a list's element by one of its \
                 fields, as status.conditions[type=Ready].status"
            )
        })?;
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
            pointer: Arc::from(pointer),
            equals,
            matching,
            empty: value.is_empty(),
        })
    }
}

/// `field`, the operator (`true` for `=` and `==`) and the value of a requirement: the
/// first operator outside brackets (a list's element is picked with `=` inside them).
fn split_requirement(text: &str) -> Option<(&str, bool, &str)> {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            '!' if depth == 0 && text[i..].starts_with("!=") => {
                return Some((&text[..i], false, &text[i + 2..]));
            }
            '=' if depth == 0 => {
                let skip = if text[i..].starts_with("==") { 2 } else { 1 };
                return Some((&text[..i], true, &text[i + skip..]));
            }
            _ => {}
        }
    }
    None
}

/// The JSON pointer of a field in the selector's syntax (`spec.nodeName` is
/// `/spec/nodeName`, `status.conditions[type=Ready].status` is
/// `/status/conditions[type=Ready]/status`), if it is one.
fn pointer_of(field: &str) -> Option<String> {
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    // A condition type may be a qualified name (`example.com/Ready`).
    let value_ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
    };
    if field.is_empty() {
        return None;
    }
    let mut pointer = String::new();
    let mut rest = field;
    while !rest.is_empty() {
        let end = rest.find(['.', '[']).unwrap_or(rest.len());
        let name = &rest[..end];
        if !name_ok(name) {
            return None;
        }
        pointer.push('/');
        pointer.push_str(name);
        rest = &rest[end..];
        if let Some(selection) = rest.strip_prefix('[') {
            let (inside, after) = selection.split_once(']')?;
            let (key, value) = inside.split_once('=')?;
            if !name_ok(key) || !value_ok(value) {
                return None;
            }
            pointer.push_str(&format!("[{key}={}]", value.replace('/', "~1")));
            rest = after;
        }
        if !rest.is_empty() {
            rest = rest.strip_prefix('.').filter(|r| !r.is_empty())?;
        }
    }
    Some(pointer)
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
    fn a_segment_picks_a_list_element_by_one_of_its_fields() {
        let selector = FieldSelector::parse(
            "status.conditions[type=DisruptionTarget].status=True,metadata.deletionTimestamp=",
        )
        .unwrap();
        let pod = |conditions: serde_json::Value| json!({"metadata": {}, "status": {"conditions": conditions}});
        let target = |status: &str| {
            pod(json!([
                {"type": "Ready", "status": "True"},
                {"type": "DisruptionTarget", "status": status},
            ]))
        };
        for (object, matches) in [
            (target("True"), true),
            (target("False"), false),
            (pod(json!([{"type": "Ready", "status": "True"}])), false),
            (json!({"metadata": {}}), false),
        ] {
            assert_eq!(selector.matches_object(&object), matches, "{object}");
            assert_eq!(
                selector.matches(&summary(&selector, object.clone())),
                matches,
                "{object}"
            );
        }
        let mut deleting = target("True");
        deleting["metadata"]["deletionTimestamp"] = json!("2026-11-30T00:00:00Z");
        assert!(!selector.matches_object(&deleting));
        // A qualified condition type, and `==` after brackets.
        let custom =
            FieldSelector::parse("status.conditions[type=example.com/Ready].status==True").unwrap();
        assert!(custom.matches_object(&pod(
            json!([{"type": "example.com/Ready", "status": "True"}])
        )));
        assert!(!custom.matches_object(&pod(
            json!([{"type": "example.com/Other", "status": "True"}])
        )));
    }

    #[test]
    fn a_malformed_selector_says_what_is_wrong() {
        for (text, says) in [
            ("spec.nodeName", "is no requirement"),
            ("spec..nodeName=a", "is no field"),
            ("spec/nodeName=a", "is no field"),
            ("a=b=c", "may hold no '='"),
            ("=a", "is no field"),
            ("spec.=a", "is no field"),
            ("status.conditions[type].status=a", "is no field"),
            ("status.conditions[type=].status=a", "is no field"),
            ("status.conditions[type=Ready]status=a", "is no field"),
            ("status.conditions[type=Ready=x].status=a", "is no field"),
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
