//! Kubernetes label selectors in their string form: `app=web,tier!=db,env in (a,b),!legacy`.

use std::fmt;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid label selector {selector:?}: {problem}")]
pub struct SelectorError {
    pub selector: String,
    pub problem: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector(Vec<Requirement>);

impl Selector {
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let fail = |problem: String| SelectorError {
            selector: text.to_owned(),
            problem,
        };
        let mut requirements = Vec::new();
        for part in split_top_level(text).map_err(&fail)? {
            let part = part.trim();
            if part.is_empty() {
                if text.trim().is_empty() {
                    continue;
                }
                return Err(fail("empty requirement between commas".into()));
            }
            requirements.push(parse_requirement(part).map_err(&fail)?);
        }
        Ok(Self(requirements))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether an object with these labels matches.
    pub fn matches<'a>(&self, labels: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => labels(k) != Some(v.as_str()),
            Requirement::In(k, vs) => labels(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => !labels(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::Exists(k) => labels(k).is_some(),
            Requirement::NotExists(k) => labels(k).is_none(),
        })
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|r| match r {
                Requirement::Equals(k, v) => format!("{k}={v}"),
                Requirement::NotEquals(k, v) => format!("{k}!={v}"),
                Requirement::In(k, vs) => format!("{k} in ({})", vs.join(",")),
                Requirement::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
                Requirement::Exists(k) => k.clone(),
                Requirement::NotExists(k) => format!("!{k}"),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("unbalanced ')' at offset {i}"))?;
            }
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unclosed '('".into());
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::NotExists(label_key(key.trim())?));
    }
    if let Some((key, value)) = part.split_once("!=") {
        return Ok(Requirement::NotEquals(
            label_key(key.trim())?,
            label_value(value.trim())?,
        ));
    }
    if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
        return Ok(Requirement::Equals(
            label_key(key.trim())?,
            label_value(value.trim())?,
        ));
    }
    let mut words = part.splitn(2, char::is_whitespace);
    let key = words.next().unwrap_or_default();
    let Some(rest) = words.next().map(str::trim) else {
        return Ok(Requirement::Exists(label_key(key)?));
    };
    let (op, set) = rest
        .split_once(char::is_whitespace)
        .map(|(op, set)| (op, set.trim()))
        .or_else(|| rest.find('(').map(|i| (rest[..i].trim(), &rest[i..])))
        .ok_or_else(|| format!("{part:?}: expected an operator (=, ==, !=, in, notin)"))?;
    let values = set
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("{part:?}: the values of {op} must be in parentheses"))?;
    let values = values
        .split(',')
        .map(|v| label_value(v.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    if values.iter().all(String::is_empty) {
        return Err(format!("{part:?}: {op} needs at least one value"));
    }
    let key = label_key(key)?;
    match op {
        "in" => Ok(Requirement::In(key, values)),
        "notin" => Ok(Requirement::NotIn(key, values)),
        other => Err(format!(
            "{part:?}: unknown operator {other:?} (expected in or notin)"
        )),
    }
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters of alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
fn label_key(key: &str) -> Result<String, String> {
    let name = match key.rsplit_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() || prefix.len() > 253 {
                return Err(format!("label key {key:?} has an invalid prefix"));
            }
            name
        }
        None => key,
    };
    if !is_label_name(name) {
        return Err(format!(
            "label key {key:?} is not valid (alphanumerics, '-', '_', '.'; at most 63; starting and ending alphanumeric)"
        ));
    }
    Ok(key.to_owned())
}

fn label_value(value: &str) -> Result<String, String> {
    if value.is_empty() || is_label_name(value) {
        Ok(value.to_owned())
    } else {
        Err(format!("label value {value:?} is not valid"))
    }
}

fn is_label_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(selector: &str, labels: &[(&str, &str)]) -> bool {
        let selector = Selector::parse(selector).unwrap();
        selector.matches(|k| labels.iter().find(|(l, _)| *l == k).map(|(_, v)| *v))
    }

    #[test]
    fn every_operator() {
        let labels = [("app", "web"), ("tier", "front"), ("example.com/x", "1")];
        assert!(matches("", &labels));
        assert!(matches("app=web", &labels));
        assert!(matches("app==web", &labels));
        assert!(!matches("app=db", &labels));
        assert!(matches("app!=db", &labels));
        assert!(matches("missing!=db", &labels));
        assert!(matches("tier in (front, back)", &labels));
        assert!(!matches("tier notin (front,back)", &labels));
        assert!(matches("missing notin (a)", &labels));
        assert!(matches("example.com/x", &labels));
        assert!(matches("!missing", &labels));
        assert!(!matches("!app", &labels));
        assert!(matches("app=web,tier in (front),!missing", &labels));
        assert!(!matches("app=web,tier=back", &labels));
    }

    #[test]
    fn round_trips_through_display() {
        let text = "app=web,tier!=db,env in (a,b),x notin (c),has,!gone";
        let selector = Selector::parse(text).unwrap();
        assert_eq!(selector.to_string(), text);
        assert_eq!(Selector::parse(&selector.to_string()).unwrap(), selector);
    }

    #[test]
    fn malformed_selectors_name_the_problem() {
        let problem = |s: &str| Selector::parse(s).unwrap_err().problem;
        assert!(problem("app=web,,tier=x").contains("empty requirement"));
        assert!(problem("env in (a,b").contains("unclosed"));
        assert!(problem("env in a").contains("parentheses"));
        assert!(problem("env within (a)").contains("unknown operator \"within\""));
        assert!(problem("bad key!=x").contains("label key \"bad key\""));
        assert!(problem("app=we b").contains("label value \"we b\""));
        assert!(problem("env in ()").contains("at least one value"));
    }
}
