//! `--controller-rate-limit NAME=QPS:BURST`: one controller's retry rate and burst, instead
//! of `--retry-qps`/`--retry-burst`.

use switchyard_queue_core::RateLimit;

/// One controller's limit, as given on the command line.
#[derive(Clone, Debug, PartialEq)]
pub struct ControllerRateLimit {
    pub controller: String,
    pub limit: RateLimit,
}

impl std::str::FromStr for ControllerRateLimit {
    type Err = String;

    fn from_str(flag: &str) -> Result<Self, Self::Err> {
        let (controller, limit) = flag
            .rsplit_once('=')
            .ok_or_else(|| format!("{flag:?}: expected CONTROLLER=QPS:BURST"))?;
        let (qps, burst) = limit
            .split_once(':')
            .ok_or_else(|| format!("{flag:?}: expected CONTROLLER=QPS:BURST"))?;
        let qps: f64 = qps
            .parse()
            .ok()
            .filter(|q: &f64| *q >= 0.0 && q.is_finite())
            .ok_or_else(|| format!("{flag:?}: QPS must be a non-negative number"))?;
        let burst: u32 = burst
            .parse()
            .map_err(|_| format!("{flag:?}: BURST must be a whole number"))?;
        if controller.trim().is_empty() {
            return Err(format!("{flag:?}: the controller name is empty"));
        }
        Ok(Self {
            controller: controller.to_owned(),
            limit: RateLimit { qps, burst },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_limit_and_names_what_is_wrong() {
        assert_eq!(
            "apps/v1/ReplicaSet=20:200".parse::<ControllerRateLimit>(),
            Ok(ControllerRateLimit {
                controller: "apps/v1/ReplicaSet".into(),
                limit: RateLimit {
                    qps: 20.0,
                    burst: 200
                },
            })
        );
        for (flag, says) in [
            ("apps/v1/ReplicaSet", "expected CONTROLLER=QPS:BURST"),
            ("apps/v1/ReplicaSet=20", "expected CONTROLLER=QPS:BURST"),
            (
                "apps/v1/ReplicaSet=-1:5",
                "QPS must be a non-negative number",
            ),
            ("apps/v1/ReplicaSet=1:x", "BURST must be a whole number"),
            ("=1:1", "the controller name is empty"),
        ] {
            let error = flag.parse::<ControllerRateLimit>().unwrap_err();
            assert!(error.contains(says), "{flag}: {error}");
        }
    }
}
