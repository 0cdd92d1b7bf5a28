//! ControllerRevision history, as kube-controller-manager's `pkg/controller/history` keeps it
//! for StatefulSets (and DaemonSets): a revision holds a patch that restores the owner's
//! template; it is named `<owner>-<hash>` with the hash of that patch's bytes, so that
//! `kubectl rollout history` and `undo` work on ours as on kube-controller-manager's.
//!
//! ```text
//!  owner ─► data (Go's JSON bytes) ─► equal to the newest revision?  that one
//!                                     equal to an older one?         it, renumbered newest
//!                                     none?                          a new one, named by hash
//!                                                                    (+ collisionCount on a clash)
//!  revisions no Pod, current or update revision uses, oldest first, past revisionHistoryLimit ─► deleted
//! ```

use std::{cmp::Ordering, collections::BTreeSet};

use k8s_openapi::api::{apps::v1::ControllerRevision, core::v1::PodTemplateSpec};
use serde_json::{Value, json};

use crate::{
    hash::{FNV32_OFFSET_BASIS, fnv32, safe_encode},
    selector::Selector,
};

/// The label a revision carries its hash in.
pub const HASH_LABEL: &str = "controller.kubernetes.io/hash";

/// `<prefix>-<hash>`, the prefix cut to 223 bytes so that the name fits 253
/// (`ControllerRevisionName`).
pub fn revision_name(prefix: &str, hash: &str) -> String {
    let mut end = prefix.len().min(223);
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}-{hash}", &prefix[..end])
}

/// `HashControllerRevision`: FNV-1 over the data's bytes and then the decimal collision
/// count, printed in decimal and safely encoded.
pub fn revision_hash(data: &[u8], collision_count: Option<i32>) -> String {
    let mut hash = fnv32(data, FNV32_OFFSET_BASIS);
    if let Some(count) = collision_count {
        hash = fnv32(count.to_string().as_bytes(), hash);
    }
    safe_encode(&hash.to_string())
}

/// `value` as Go's `encoding/json` writes a decoded `map[string]interface{}`: object keys in
/// byte order, no spaces, `<`, `>`, `&`, U+2028 and U+2029 escaped, numbers as `float64`
/// prints them. kube-controller-manager hashes these bytes, so ours must be the same.
pub fn go_json(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_go_json(value, &mut out);
    out
}

fn write_go_json(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Number(n) => out.extend_from_slice(go_number(n).as_bytes()),
        Value::String(s) => write_go_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_go_json(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_go_string(key, out);
                out.push(b':');
                write_go_json(&map[key], out);
            }
            out.push(b'}');
        }
    }
}

/// A number decoded into a `float64` and encoded again: integers as they are (below 1e21),
/// fractions in the shortest form, exponents outside [1e-6, 1e21) as Go writes them.
fn go_number(n: &serde_json::Number) -> String {
    let Some(f) = n.as_f64() else {
        return n.to_string();
    };
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        // Rust writes 1e21 and 1e-7; Go writes 1e+21 and 1e-07 cleaned to 1e-7.
        let text = format!("{f:e}");
        return match text.split_once('e') {
            Some((mantissa, exp)) if !exp.starts_with('-') => format!("{mantissa}e+{exp}"),
            _ => text,
        };
    }
    // Display writes the shortest form, whole floats without a fraction, as Go does.
    f.to_string()
}

fn write_go_string(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            '<' | '>' | '&' | '\u{0}'..='\u{1f}' => {
                let b = c as u8;
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
            '\u{2028}' => out.extend_from_slice(b"\\u2028"),
            '\u{2029}' => out.extend_from_slice(b"\\u2029"),
            c => {
                let mut buf = [0; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// The revision data of an owner's Pod template (StatefulSet's and DaemonSet's `getPatch`):
/// a patch that replaces the template, `{"spec":{"template":{…,"$patch":"replace"}}}`, with
/// the template as Go writes it (a `metadata` and every container's `resources`, even when
/// empty).
pub fn template_patch(template: Option<&PodTemplateSpec>) -> Value {
    let mut template =
        serde_json::to_value(template.cloned().unwrap_or_default()).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut template {
        map.entry("metadata").or_insert_with(|| json!({}));
        let spec = map.entry("spec").or_insert_with(|| json!({}));
        for field in ["containers", "initContainers", "ephemeralContainers"] {
            if let Some(Value::Array(containers)) = spec.get_mut(field) {
                for container in containers.iter_mut().filter_map(Value::as_object_mut) {
                    container.entry("resources").or_insert_with(|| json!({}));
                }
            }
        }
        map.insert("$patch".into(), json!("replace"));
    }
    json!({"spec": {"template": template}})
}

/// The template a revision restores (`ApplyRevision`: its patch replaces the template).
pub fn patched_template(revision: &ControllerRevision) -> Result<PodTemplateSpec, String> {
    let mut template = data(revision)
        .pointer("/spec/template")
        .cloned()
        .ok_or_else(|| "data has no spec.template".to_owned())?;
    if let Value::Object(map) = &mut template {
        map.remove("$patch");
    }
    serde_json::from_value(template).map_err(|e| format!("data.spec.template: {e}"))
}

/// The revision's data, `null` when it has none.
pub fn data(revision: &ControllerRevision) -> &Value {
    revision.data.as_ref().map_or(&Value::Null, |d| &d.0)
}

/// Whether two revisions' data restore the same object (`EqualRevision`, by meaning rather
/// than bytes, as `StatefulSetSemanticRevisionComparison` does): keys with `null` values
/// count as absent, so a revision written before the apiserver's types dropped a `null`
/// (`creationTimestamp` in 1.34) still equals its successor.
pub fn same_data(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let present = |m: &serde_json::Map<String, Value>| {
                m.iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, _)| k.clone())
                    .collect::<BTreeSet<_>>()
            };
            present(a) == present(b)
                && a.iter()
                    .filter(|(_, v)| !v.is_null())
                    .all(|(k, v)| same_data(v, &b[k]))
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_data(x, y))
        }
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (a, b) => a == b,
    }
}

/// The revisions an owner may use (`ListControllerRevisions` and the claim): those of
/// `namespace` its selector matches that it controls, and the orphans, to be adopted.
pub fn own<'r>(
    namespace: &str,
    uid: &str,
    selector: &Selector,
    revisions: &'r [ControllerRevision],
) -> (Vec<&'r ControllerRevision>, Vec<&'r ControllerRevision>) {
    let mut owned = Vec::new();
    let mut orphans = Vec::new();
    for revision in revisions {
        let meta = &revision.metadata;
        if meta.namespace.as_deref() != Some(namespace) || !selector.matches(meta.labels.as_ref()) {
            continue;
        }
        let controller = meta
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true));
        match controller {
            None => orphans.push(revision),
            Some(r) if r.uid == uid => owned.push(revision),
            Some(_) => {}
        }
    }
    (owned, orphans)
}

/// Oldest first: by revision number, then creation time, then name (`SortControllerRevisions`).
pub fn sort(revisions: &mut [ControllerRevision]) {
    revisions.sort_by(order);
}

fn order(a: &ControllerRevision, b: &ControllerRevision) -> Ordering {
    let created = |r: &ControllerRevision| r.metadata.creation_timestamp.as_ref().map(|t| t.0);
    a.revision
        .cmp(&b.revision)
        .then_with(|| created(a).cmp(&created(b)))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// The number the next revision takes: one past the newest of `sorted` (1 for none).
pub fn next_revision(sorted: &[ControllerRevision]) -> i64 {
    sorted.last().map_or(1, |r| r.revision + 1)
}

/// Where the owner's current data stands among its `sorted` revisions (`getStatefulSetRevisions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateRevision {
    /// The newest revision holds it: nothing to write.
    Newest(usize),
    /// An older one holds it (a rollback): renumber it to [`next_revision`].
    Renumber(usize),
    /// None does: create one.
    Create,
}

pub fn find_update_revision(sorted: &[ControllerRevision], data: &Value) -> UpdateRevision {
    let Some(last) = sorted.iter().rposition(|r| same_data(self::data(r), data)) else {
        return UpdateRevision::Create;
    };
    if last + 1 == sorted.len() {
        UpdateRevision::Newest(last)
    } else {
        UpdateRevision::Renumber(last)
    }
}

/// The revisions to delete (`truncateHistory`): those not `live` (named by the current or
/// update revision or a Pod's label), oldest first, beyond the newest `limit` of them. A
/// negative limit keeps every one.
pub fn to_truncate<'r>(
    sorted: &'r [ControllerRevision],
    live: &BTreeSet<&str>,
    limit: i32,
) -> Vec<&'r ControllerRevision> {
    let history: Vec<&ControllerRevision> = sorted
        .iter()
        .filter(|r| !live.contains(r.metadata.name.as_deref().unwrap_or_default()))
        .collect();
    let Ok(limit) = usize::try_from(limit) else {
        return Vec::new();
    };
    let excess = history.len().saturating_sub(limit);
    history.into_iter().take(excess).collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        apimachinery::pkg::{apis::meta::v1::ObjectMeta, runtime::RawExtension},
        jiff::Timestamp,
    };
    use serde_json::json;

    use super::*;

    fn revision(name: &str, number: i64, data: Value) -> ControllerRevision {
        ControllerRevision {
            metadata: ObjectMeta {
                name: Some(name.into()),
                creation_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    Timestamp::UNIX_EPOCH,
                )),
                ..ObjectMeta::default()
            },
            data: Some(RawExtension(data)),
            revision: number,
        }
    }

    #[test]
    fn json_is_written_as_go_writes_it() {
        let value = json!({
            "spec": {"template": {"b": [1, 2.5, 1e21, 0.0000001], "a": "<x&y>\u{2028}\n\"\u{1}"}},
            "$patch": "replace",
        });
        assert_eq!(
            String::from_utf8(go_json(&value)).unwrap(),
            r#"{"$patch":"replace","spec":{"template":{"a":"\u003cx\u0026y\u003e\u2028\n\"\u0001","b":[1,2.5,1e+21,1e-7]}}}"#
        );
    }

    #[test]
    fn names_and_hashes_are_kube_controller_managers() {
        // Go: fnv.New32() over `{"a":1}`, then "2"; fmt.Sprint of the sum, SafeEncodeString.
        let data = br#"{"a":1}"#;
        let plain = fnv32(data, FNV32_OFFSET_BASIS);
        assert_eq!(revision_hash(data, None), safe_encode(&plain.to_string()));
        let probed = fnv32(b"2", plain);
        assert_eq!(
            revision_hash(data, Some(2)),
            safe_encode(&probed.to_string())
        );
        assert_ne!(revision_hash(data, Some(0)), revision_hash(data, None));
        assert_eq!(revision_name("web", "abc"), "web-abc");
        assert_eq!(revision_name(&"x".repeat(300), "h").len(), 225);
    }

    #[test]
    fn equal_data_ignores_nulls_and_number_forms() {
        let a = json!({"spec": {"template": {"metadata": {"creationTimestamp": null, "labels": {"a": "b"}}, "n": 30}}});
        let b = json!({"spec": {"template": {"metadata": {"labels": {"a": "b"}}, "n": 30.0}}});
        assert!(same_data(&a, &b));
        let c = json!({"spec": {"template": {"metadata": {"labels": {"a": "c"}}, "n": 30}}});
        assert!(!same_data(&a, &c));
    }

    #[test]
    fn the_update_revision_is_the_newest_equal_one_or_a_new_one() {
        let mut revisions = vec![
            revision("web-2", 2, json!({"v": 2})),
            revision("web-1", 1, json!({"v": 1})),
        ];
        sort(&mut revisions);
        assert_eq!(revisions[0].metadata.name.as_deref(), Some("web-1"));
        assert_eq!(next_revision(&revisions), 3);
        assert_eq!(
            find_update_revision(&revisions, &json!({"v": 2})),
            UpdateRevision::Newest(1)
        );
        assert_eq!(
            find_update_revision(&revisions, &json!({"v": 1})),
            UpdateRevision::Renumber(0)
        );
        assert_eq!(
            find_update_revision(&revisions, &json!({"v": 3})),
            UpdateRevision::Create
        );
    }

    #[test]
    fn history_past_the_limit_goes_oldest_first_and_live_revisions_stay() {
        let revisions: Vec<ControllerRevision> = (1..=5)
            .map(|n| revision(&format!("web-{n}"), n, json!({"v": n})))
            .collect();
        let live: BTreeSet<&str> = ["web-1", "web-5"].into();
        let names = |limit| {
            to_truncate(&revisions, &live, limit)
                .iter()
                .map(|r| r.metadata.name.clone().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(1), ["web-2", "web-3"]);
        assert_eq!(names(3), Vec::<String>::new());
        assert_eq!(names(0), ["web-2", "web-3", "web-4"]);
        assert_eq!(names(-1), Vec::<String>::new());
    }
}
