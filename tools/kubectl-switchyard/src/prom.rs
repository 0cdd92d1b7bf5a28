//! The samples the plugin reads from an admin port's `/metrics` (parsed by the runtime's
//! OpenMetrics reader), and the histogram arithmetic over them.

pub use switchyard_runtime::exposition::Sample;

/// Every sample of an admin port's `/metrics` (OpenMetrics, read strictly: a body that is
/// not is an error naming its first bad line).
pub fn parse(text: &str) -> Result<Vec<Sample>, String> {
    switchyard_runtime::exposition::parse(text).map(|exposition| exposition.samples)
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
    fn samples_and_their_labels_parse_and_a_body_that_is_not_openmetrics_is_refused() {
        let text = "# TYPE switchyard_build info\n\
                    switchyard_build_info{service=\"switchyard-queue\",version=\"0.1.0\"} 1\n\
                    # TYPE workqueue_adds counter\n\
                    workqueue_adds_total{name=\"apps/v1/ReplicaSet\",shard=\"3\"} 42\n\
                    # TYPE process_start_time_seconds gauge\n\
                    process_start_time_seconds 1.7e9\n\
                    # TYPE h histogram\n\
                    h_bucket{le=\"+Inf\"} 5\n\
                    # EOF\n";
        let samples = parse(text).unwrap();
        assert_eq!(samples.len(), 4);
        assert_eq!(samples[0].label("version"), Some("0.1.0"));
        assert_eq!(samples[1].label("name"), Some("apps/v1/ReplicaSet"));
        assert_eq!(samples[1].value, 42.0);
        assert_eq!(samples[2].value, 1.7e9);
        assert_eq!(samples[3].label("le"), Some("+Inf"));
        let refused = parse("<html>not metrics</html>\n").unwrap_err();
        assert!(refused.starts_with("line 1:"), "{refused}");
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
