//! The Deployment as the controller reads it: its fields checked and defaulted, and the
//! strategy's `maxSurge`/`maxUnavailable` resolved against `replicas`
//! (`deploymentutil.ResolveFenceposts`, `MaxSurge`, `MaxUnavailable`).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentStatus},
        core::v1::PodTemplateSpec,
    },
    apimachinery::pkg::{apis::meta::v1::OwnerReference, util::intstr::IntOrString},
};

use crate::selector::{Selector, SelectorError};

/// `progressDeadlineSeconds` of `MaxInt32` means no deadline (the API's convention).
const NO_DEADLINE: i32 = i32::MAX;

/// How Pods are replaced, with `maxSurge`/`maxUnavailable` resolved against `replicas`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    Recreate,
    RollingUpdate {
        max_surge: i32,
        max_unavailable: i32,
    },
}

/// A Deployment as the controller needs it.
#[derive(Debug, Clone)]
pub struct Spec<'a> {
    pub d: &'a Deployment,
    pub uid: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    pub replicas: i32,
    pub selector: Selector,
    pub strategy: Strategy,
    pub min_ready_seconds: i32,
    pub revision_history_limit: Option<i32>,
    pub progress_deadline_seconds: Option<i32>,
    pub paused: bool,
    pub deleting: bool,
    pub template: PodTemplateSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("metadata.uid: empty")]
    NoUid,
    #[error("metadata.name: empty")]
    NoName,
    #[error("spec.{0}")]
    Selector(#[from] SelectorError),
    #[error("spec.selector: empty, it would select every ReplicaSet of the namespace")]
    EmptySelector,
    #[error("spec.replicas: negative ({0})")]
    NegativeReplicas(i32),
    #[error(
        "spec.strategy.rollingUpdate.{field}: {value:?} is neither an integer nor a percentage"
    )]
    IntOrPercent { field: &'static str, value: String },
    #[error("spec.strategy.type: unknown strategy {0:?} (expected RollingUpdate or Recreate)")]
    Strategy(String),
}

impl<'a> Spec<'a> {
    pub fn new(d: &'a Deployment) -> Result<Self, SpecError> {
        let uid = d
            .metadata
            .uid
            .as_deref()
            .filter(|u| !u.is_empty())
            .ok_or(SpecError::NoUid)?;
        let name = d
            .metadata
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or(SpecError::NoName)?;
        let spec = d.spec.clone().unwrap_or_default();
        if spec
            .selector
            .match_labels
            .as_ref()
            .is_none_or(BTreeMap::is_empty)
            && spec
                .selector
                .match_expressions
                .as_ref()
                .is_none_or(Vec::is_empty)
        {
            return Err(SpecError::EmptySelector);
        }
        let replicas = spec.replicas.unwrap_or(1);
        if replicas < 0 {
            return Err(SpecError::NegativeReplicas(replicas));
        }
        let strategy_spec = spec.strategy.unwrap_or_default();
        let strategy = match strategy_spec.type_.as_deref() {
            Some("Recreate") => Strategy::Recreate,
            None | Some("RollingUpdate") => {
                let rolling = strategy_spec.rolling_update.unwrap_or_default();
                let (max_surge, max_unavailable) = resolve_fenceposts(
                    rolling.max_surge.as_ref(),
                    rolling.max_unavailable.as_ref(),
                    replicas,
                )?;
                Strategy::RollingUpdate {
                    max_surge,
                    max_unavailable,
                }
            }
            Some(other) => return Err(SpecError::Strategy(other.to_owned())),
        };
        Ok(Self {
            d,
            uid,
            name,
            namespace: d.metadata.namespace.as_deref().unwrap_or_default(),
            replicas,
            selector: Selector::new(&spec.selector)?,
            strategy,
            min_ready_seconds: spec.min_ready_seconds.unwrap_or(0),
            revision_history_limit: spec.revision_history_limit,
            progress_deadline_seconds: spec.progress_deadline_seconds.filter(|s| *s != NO_DEADLINE),
            paused: spec.paused.unwrap_or(false),
            deleting: d.metadata.deletion_timestamp.is_some(),
            template: spec.template,
        })
    }

    /// `deploymentutil.MaxSurge`.
    pub fn max_surge(&self) -> i32 {
        match self.strategy {
            Strategy::RollingUpdate { max_surge, .. } => max_surge,
            Strategy::Recreate => 0,
        }
    }

    /// `deploymentutil.MaxUnavailable`: never more than `replicas`.
    pub fn max_unavailable(&self) -> i32 {
        match self.strategy {
            Strategy::RollingUpdate {
                max_unavailable, ..
            } if self.replicas > 0 => max_unavailable.min(self.replicas),
            _ => 0,
        }
    }

    pub fn has_progress_deadline(&self) -> bool {
        self.progress_deadline_seconds.is_some()
    }

    pub(super) fn status(&self) -> DeploymentStatus {
        self.d.status.clone().unwrap_or_default()
    }

    /// The controller reference each of the Deployment's ReplicaSets carries.
    pub fn controller_ref(&self) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: self.name.to_owned(),
            uid: self.uid.to_owned(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }
}

/// `intstr.GetScaledValueFromIntOrPercent`: a percentage of `total`, rounded up or down.
pub fn scaled_value(
    value: &IntOrString,
    total: i32,
    round_up: bool,
    field: &'static str,
) -> Result<i32, SpecError> {
    match value {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(s) => {
            let bad = || SpecError::IntOrPercent {
                field,
                value: s.clone(),
            };
            let percent: i64 = s
                .strip_suffix('%')
                .ok_or_else(bad)?
                .parse()
                .map_err(|_| bad())?;
            let product = percent * i64::from(total);
            let scaled = if round_up {
                product.div_euclid(100) + i64::from(product.rem_euclid(100) != 0)
            } else {
                product.div_euclid(100)
            };
            i32::try_from(scaled).map_err(|_| bad())
        }
    }
}

/// `deploymentutil.ResolveFenceposts`: surge rounds up, unavailable rounds down, and both
/// zero would deadlock a rollout, so unavailable becomes 1.
pub fn resolve_fenceposts(
    max_surge: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    desired: i32,
) -> Result<(i32, i32), SpecError> {
    let default = IntOrString::String("25%".into());
    let surge = scaled_value(max_surge.unwrap_or(&default), desired, true, "maxSurge")?;
    let unavailable = scaled_value(
        max_unavailable.unwrap_or(&default),
        desired,
        false,
        "maxUnavailable",
    )?;
    if surge == 0 && unavailable == 0 {
        return Ok((0, 1));
    }
    Ok((surge, unavailable))
}
