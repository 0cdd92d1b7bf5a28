//! A strict reader of the OpenMetrics text format (what every admin port's `/metrics`
//! serves; Prometheus reads it too): the one parser of it in the project, for the plugin
//! that reads the services' figures and for the tests that check an endpoint parses and read
//! its samples.
//!
//! Checked: `# TYPE`/`# HELP`/`# UNIT` lines name a family once, before its samples; every
//! sample belongs to a declared family with a suffix its type allows; label names and quoted,
//! escaped values; values as floats; counters and histogram counts never negative; a final
//! `# EOF`.

use std::collections::{BTreeMap, HashMap};

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    /// Whether this sample is the series `series`, written as it is exposed
    /// (`name{a="x",b="y"}`, labels in any order, or `name`): same name, same labels.
    pub fn is(&self, series: &str) -> bool {
        parse_sample(&format!("{series} 0")).is_ok_and(|wanted| self.same_series(&wanted))
    }

    fn same_series(&self, other: &Sample) -> bool {
        self.name == other.name && self.labels == other.labels
    }

    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name).map(String::as_str)
    }
}

/// The samples of a parsed exposition.
#[derive(Clone, Debug, Default)]
pub struct Exposition {
    pub samples: Vec<Sample>,
    /// Family name to its type.
    pub types: HashMap<String, String>,
}

impl Exposition {
    /// The value of the series `series`, written as it is exposed (see [`Sample::is`]).
    pub fn series(&self, series: &str) -> Option<f64> {
        let wanted = parse_sample(&format!("{series} 0")).ok()?;
        self.samples
            .iter()
            .find(|sample| sample.same_series(&wanted))
            .map(|sample| sample.value)
    }

    /// The value of the sample `name` whose labels include `labels`; summed when several
    /// match (for example over a label not given).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
            })
            .map(|s| s.value)
            .collect();
        (!matching.is_empty()).then(|| matching.iter().sum())
    }
}

const TYPES: &[&str] = &[
    "counter",
    "gauge",
    "histogram",
    "gaugehistogram",
    "summary",
    "info",
    "stateset",
    "unknown",
];

/// Parses `text`, naming the first line that is not valid.
pub fn parse(text: &str) -> Result<Exposition, String> {
    let mut out = Exposition::default();
    let mut seen_samples_of: std::collections::HashSet<String> = Default::default();
    let mut eof = false;
    for (number, line) in text.lines().enumerate() {
        let at = |why: String| format!("line {}: {why}: {line:?}", number + 1);
        if eof {
            return Err(at("text after # EOF".into()));
        }
        if line == "# EOF" {
            eof = true;
            continue;
        }
        if let Some(meta) = line.strip_prefix("# ") {
            let mut parts = meta.splitn(3, ' ');
            let (kind, family) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            check_name(family).map_err(at)?;
            if seen_samples_of.contains(family) {
                return Err(at(format!("metadata of {family} after its samples")));
            }
            match kind {
                "TYPE" => {
                    let ty = parts.next().unwrap_or("");
                    if !TYPES.contains(&ty) {
                        return Err(at(format!("unknown type {ty:?}")));
                    }
                    if out.types.insert(family.to_owned(), ty.to_owned()).is_some() {
                        return Err(at(format!("{family} declared twice")));
                    }
                }
                "HELP" | "UNIT" => {}
                _ => return Err(at(format!("unknown metadata {kind:?}"))),
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            return Err(at("not a sample, metadata or # EOF".into()));
        }
        let sample = parse_sample(line).map_err(at)?;
        let (family, ty) = family_of(&sample.name, &out.types)
            .ok_or_else(|| at(format!("{} belongs to no declared family", sample.name)))?;
        let monotonic = ty == "counter"
            || (matches!(ty, "histogram" | "summary")
                && (sample.name.ends_with("_count") || sample.name.ends_with("_bucket")));
        if monotonic && (sample.value.is_nan() || sample.value < 0.0) {
            return Err(at(format!(
                "{ty} sample {} is negative or NaN",
                sample.name
            )));
        }
        seen_samples_of.insert(family);
        out.samples.push(sample);
    }
    if !eof {
        return Err("no # EOF at the end".into());
    }
    Ok(out)
}

/// The declared family a sample name belongs to, with its type.
fn family_of<'a>(name: &str, types: &'a HashMap<String, String>) -> Option<(String, &'a str)> {
    let suffixes: &[&str] = &[
        "", "_total", "_created", "_bucket", "_count", "_sum", "_info", "_gcount", "_gsum",
    ];
    suffixes.iter().find_map(|suffix| {
        let family = name.strip_suffix(suffix)?;
        let ty = types.get(family)?;
        let allowed = match ty.as_str() {
            "counter" => matches!(*suffix, "_total" | "_created"),
            "gauge" | "unknown" | "stateset" => suffix.is_empty(),
            "info" => *suffix == "_info",
            "histogram" => matches!(*suffix, "_bucket" | "_count" | "_sum" | "_created"),
            "gaugehistogram" => matches!(*suffix, "_bucket" | "_gcount" | "_gsum"),
            "summary" => matches!(*suffix, "" | "_count" | "_sum" | "_created"),
            _ => false,
        };
        allowed.then(|| (family.to_owned(), ty.as_str()))
    })
}

fn check_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':');
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
        Ok(())
    } else {
        Err(format!("invalid metric name {name:?}"))
    }
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(['{', ' '])
        .ok_or_else(|| "a sample needs a value".to_owned())?;
    let name = &line[..name_end];
    check_name(name)?;
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices().peekable();
        let end;
        loop {
            // label name
            let start = chars.peek().map(|(i, _)| *i).ok_or("unterminated labels")?;
            if after[start..].starts_with('}') {
                end = start + 1;
                break;
            }
            let eq = after[start..].find('=').ok_or("a label needs =")? + start;
            let key = &after[start..eq];
            if key.is_empty()
                || key.starts_with(|c: char| c.is_ascii_digit())
                || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                return Err(format!("invalid label name {key:?}"));
            }
            while chars.peek().is_some_and(|(i, _)| *i <= eq) {
                chars.next();
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err("a label value must be quoted".into());
            }
            let mut value = String::new();
            loop {
                match chars.next().map(|(_, c)| c) {
                    None => return Err("unterminated label value".into()),
                    Some('"') => break,
                    Some('\\') => match chars.next().map(|(_, c)| c) {
                        Some('n') => value.push('\n'),
                        Some('"') => value.push('"'),
                        Some('\\') => value.push('\\'),
                        other => return Err(format!("invalid escape {other:?}")),
                    },
                    Some(c) => value.push(c),
                }
            }
            if labels.insert(key.to_owned(), value).is_some() {
                return Err(format!("label {key} repeated"));
            }
            match chars.next() {
                Some((_, ',')) => continue,
                Some((i, '}')) => {
                    end = i + 1;
                    break;
                }
                _ => return Err("expected , or } after a label".into()),
            }
        }
        rest = &after[end..];
    }
    let mut fields = rest
        .strip_prefix(' ')
        .ok_or("expected a space before the value")?
        .split(' ');
    let value = fields.next().unwrap_or("");
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().map_err(|_| format!("invalid value {v:?}"))?,
    };
    if let Some(timestamp) = fields.next() {
        timestamp
            .parse::<f64>()
            .map_err(|_| format!("invalid timestamp {timestamp:?}"))?;
    }
    if fields.next().is_some() {
        return Err("trailing text after the timestamp".into());
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_exposition_parses_and_sums_over_labels() {
        let text = "# HELP a_requests Requests.\n# TYPE a_requests counter\n\
            a_requests_total{verb=\"get\",code=\"200\"} 3\n\
            a_requests_total{verb=\"get\",code=\"404\"} 1\n\
            # TYPE a_seconds histogram\n# UNIT a_seconds seconds\n\
            a_seconds_sum 0.5\na_seconds_count 2\na_seconds_bucket{le=\"+Inf\"} 2\n\
            # TYPE b info\nb_info{v=\"a \\\"q\\\"\"} 1\n# EOF\n";
        let parsed = parse(text).unwrap();
        assert_eq!(
            parsed.value("a_requests_total", &[("verb", "get")]),
            Some(4.0)
        );
        assert_eq!(
            parsed.value("a_requests_total", &[("code", "404")]),
            Some(1.0)
        );
        assert_eq!(parsed.value("b_info", &[("v", "a \"q\"")]), Some(1.0));
        assert_eq!(parsed.value("a_seconds_count", &[]), Some(2.0));

        let sample = &parsed.samples[0];
        assert!(sample.is(r#"a_requests_total{verb="get",code="200"}"#));
        assert!(sample.is(r#"a_requests_total{code="200",verb="get"}"#));
        assert!(!sample.is(r#"a_requests_total{verb="get"}"#));
        assert!(!sample.is("a_requests_total"));
        assert!(parsed.samples[2].is("a_seconds_sum"));
        assert_eq!(sample.label("code"), Some("200"));
    }

    #[test]
    fn invalid_expositions_name_the_line() {
        for (text, why) in [
            ("x 1\n# EOF\n", "no declared family"),
            ("# TYPE x counter\nx 1\n# EOF\n", "no declared family"),
            ("# TYPE x gauge\nx{a=b} 1\n# EOF\n", "quoted"),
            ("# TYPE x gauge\nx one\n# EOF\n", "invalid value"),
            ("# TYPE x counter\nx_total -1\n# EOF\n", "negative"),
            ("# TYPE x gauge\nx 1\n", "no # EOF"),
            (
                "# TYPE x gauge\nx 1\n# TYPE x gauge\n# EOF\n",
                "after its samples",
            ),
        ] {
            let error = parse(text).unwrap_err();
            assert!(error.contains(why), "{text:?}: {error}");
        }
    }
}
