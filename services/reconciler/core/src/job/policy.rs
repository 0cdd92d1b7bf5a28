//! A Job's `podFailurePolicy` and `successPolicy` (`pod_failure_policy.go`,
//! `success_policy.go`).

use k8s_openapi::api::{
    batch::v1::{
        PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
        PodFailurePolicyOnPodConditionsPattern, SuccessPolicy,
    },
    core::v1::{ContainerStatus, Pod},
};

use super::indexes::Intervals;

/// What a Pod failure policy rule does with a failed Pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureAction {
    /// The whole Job fails.
    FailJob,
    /// The Pod's index fails (Jobs with `backoffLimitPerIndex`).
    FailIndex,
    /// The failure is not counted against the backoff limit.
    Ignore,
    /// The failure counts, as without a rule.
    Count,
}

impl FailureAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailJob => "FailJob",
            Self::FailIndex => "FailIndex",
            Self::Ignore => "Ignore",
            Self::Count => "Count",
        }
    }
}

/// What the policy says about one failed Pod (`matchPodFailurePolicy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureMatch {
    /// The rule's action; `None` when no rule matched (or without a policy).
    pub action: Option<FailureAction>,
    /// Whether the failure counts against the backoff limit.
    pub counts: bool,
    /// For `FailJob`: the message the Job's condition carries.
    pub message: Option<String>,
}

impl FailureMatch {
    /// No rule matched: the failure counts.
    pub const UNMATCHED: Self = Self {
        action: None,
        counts: true,
        message: None,
    };
}

fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The first rule that matches the failed Pod decides; none matching counts the failure.
pub fn match_failure(policy: Option<&PodFailurePolicy>, pod: &Pod) -> FailureMatch {
    let Some(policy) = policy else {
        return FailureMatch::UNMATCHED;
    };
    let status = pod.status.clone().unwrap_or_default();
    for (index, rule) in policy.rules.iter().enumerate() {
        let message = if let Some(codes) = &rule.on_exit_codes {
            let Some(container) = matching_container(&status.container_statuses, codes)
                .or_else(|| matching_container(&status.init_container_statuses, codes))
            else {
                continue;
            };
            let code = container
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .map_or(0, |t| t.exit_code);
            format!(
                "Container {} for pod {} failed with exit code {code} matching {} rule at index {index}",
                container.name,
                pod_name(pod),
                rule.action
            )
        } else if let Some(patterns) = &rule.on_pod_conditions {
            let Some(condition) = matching_condition(pod, patterns) else {
                continue;
            };
            format!(
                "Pod {} has condition {condition} matching {} rule at index {index}",
                pod_name(pod),
                rule.action
            )
        } else {
            continue;
        };
        match rule.action.as_str() {
            "Ignore" => {
                return FailureMatch {
                    action: Some(FailureAction::Ignore),
                    counts: false,
                    message: None,
                };
            }
            "FailIndex" => {
                return FailureMatch {
                    action: Some(FailureAction::FailIndex),
                    counts: true,
                    message: None,
                };
            }
            "Count" => {
                return FailureMatch {
                    action: Some(FailureAction::Count),
                    counts: true,
                    message: None,
                };
            }
            "FailJob" => {
                return FailureMatch {
                    action: Some(FailureAction::FailJob),
                    counts: true,
                    message: Some(message),
                };
            }
            // An action this version does not know: the rule is passed over, as
            // kube-controller-manager's switch falls through.
            _ => {}
        }
    }
    FailureMatch::UNMATCHED
}

/// The first terminated container (of `statuses`) the requirement names, with a non-zero
/// exit code the operator matches.
fn matching_container<'s>(
    statuses: &'s Option<Vec<ContainerStatus>>,
    codes: &PodFailurePolicyOnExitCodesRequirement,
) -> Option<&'s ContainerStatus> {
    statuses.iter().flatten().find(|c| {
        let Some(terminated) = c.state.as_ref().and_then(|s| s.terminated.as_ref()) else {
            return false;
        };
        codes.container_name.as_ref().is_none_or(|n| *n == c.name)
            && terminated.exit_code != 0
            && match codes.operator.as_str() {
                "In" => codes.values.contains(&terminated.exit_code),
                "NotIn" => !codes.values.contains(&terminated.exit_code),
                _ => false,
            }
    })
}

/// The type of the first Pod condition a pattern matches (an unset pattern status is
/// `True`, as the apiserver defaults it).
fn matching_condition(
    pod: &Pod,
    patterns: &[PodFailurePolicyOnPodConditionsPattern],
) -> Option<String> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .find(|c| {
            patterns
                .iter()
                .any(|p| p.type_ == c.type_ && p.status.as_deref().unwrap_or("True") == c.status)
        })
        .map(|c| c.type_.clone())
}

/// The message of the first rule of the success policy the succeeded indexes meet
/// ("Matched rules at index N"), if any (`matchSuccessPolicy`).
pub fn match_success(
    policy: Option<&SuccessPolicy>,
    completions: u32,
    succeeded: &Intervals,
) -> Option<String> {
    let policy = policy?;
    if succeeded.is_empty() {
        return None;
    }
    let count = |c: Option<i32>| c.and_then(|c| u32::try_from(c).ok());
    policy.rules.iter().enumerate().find_map(|(index, rule)| {
        let met = match &rule.succeeded_indexes {
            Some(indexes) => {
                let required = Intervals::parse(indexes, completions);
                !required.is_empty() && succeeded.covers(&required, count(rule.succeeded_count))
            }
            None => rule
                .succeeded_count
                .is_some_and(|c| i64::from(succeeded.total()) >= i64::from(c)),
        };
        met.then(|| format!("Matched rules at index {index}"))
    })
}
