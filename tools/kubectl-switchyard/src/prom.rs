//! The few series the plugin reads from an admin port's `/metrics`, parsed from the
//! Prometheus text format.

use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name).map(String::as_str)
    }
}

/// Every sample of `text`; comments and lines that do not parse are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            let close = line.rfind('}')?;
            (
                &line[..open],
                parse_labels(&line[open + 1..close])?,
                &line[close + 1..],
            )
        }
        None => {
            let space = line.find(' ')?;
            (&line[..space], BTreeMap::new(), &line[space..])
        }
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

fn parse_labels(text: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let eq = rest.find('=')?;
        let name = rest[..eq].trim().to_owned();
        rest = rest[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.insert(name, value);
        rest = rest[end + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    Some(labels)
}

/// The `q` quantile of a cumulative histogram's buckets (upper bound, count), by linear
/// interpolation within the bucket, as Prometheus' `histogram_quantile` does; `None`
/// without observations.
pub fn quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let mut buckets = buckets.to_vec();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(bound, count) in &buckets {
        if count >= rank {
            if bound.is_infinite() {
                return Some(lower.0);
            }
            let within = count - lower.1;
            let fraction = if within > 0.0 {
                (rank - lower.1) / within
            } else {
                1.0
            };
            return Some(lower.0 + (bound - lower.0) * fraction);
        }
        lower = (bound, count);
    }
    Some(lower.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_and_their_labels_parse() {
        let text = "# HELP x y\n\
                    switchyard_build_info{service=\"switchyard-queue\",version=\"0.1.0\"} 1\n\
                    workqueue_adds_total{name=\"apps/v1/ReplicaSet\",shard=\"3\"} 42\n\
                    process_start_time_seconds 1.7e9\n\
                    h_bucket{le=\"+Inf\"} 5\n";
        let samples = parse(text);
        assert_eq!(samples.len(), 4);
        assert_eq!(samples[0].label("version"), Some("0.1.0"));
        assert_eq!(samples[1].label("name"), Some("apps/v1/ReplicaSet"));
        assert_eq!(samples[1].value, 42.0);
        assert_eq!(samples[2].value, 1.7e9);
        assert_eq!(samples[3].label("le"), Some("+Inf"));
    }

    #[test]
    fn quantiles_interpolate_within_the_bucket() {
        // 100 observations: 90 up to 0.1, 10 more up to 1.
        let buckets = [
            (0.01, 0.0),
            (0.1, 90.0),
            (1.0, 100.0),
            (f64::INFINITY, 100.0),
        ];
        let p50 = quantile(0.5, &buckets).unwrap();
        assert!((p50 - (0.01 + 0.09 * 50.0 / 90.0)).abs() < 1e-9, "{p50}");
        let p99 = quantile(0.99, &buckets).unwrap();
        assert!((p99 - (0.1 + 0.9 * 0.9)).abs() < 1e-9, "{p99}");
        assert_eq!(quantile(0.99, &[(1.0, 0.0), (f64::INFINITY, 0.0)]), None);
    }
}
