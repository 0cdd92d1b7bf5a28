//! A status's conditions (`metav1.Condition`), as apimachinery's `meta.SetStatusCondition`,
//! `FindStatusCondition`, `RemoveStatusCondition` and `IsStatusConditionTrue` keep them.
//!
//! ```text
//!  set(&mut conditions, Ready / True / reason / message / observedGeneration, now)
//!     absent           ─► appended, lastTransitionTime now
//!     status changed   ─► replaced, lastTransitionTime now
//!     same status      ─► reason, message, observedGeneration updated; the time kept
//!     ─► whether anything changed (write the status only then)
//! ```

use std::fmt;

use switchyard_k8s::k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};

/// A condition's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// It cannot be told whether the condition holds.
    Unknown,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        })
    }
}

/// A condition to set: its type (`Ready`, `Available`), status, reason (CamelCase),
/// message, and the generation of the object it was worked out from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCondition<'a> {
    /// The condition's type, `Ready`, `Available`, ...
    pub type_: &'a str,
    /// Whether it holds.
    pub status: Status,
    /// Why, in one CamelCase word.
    pub reason: &'a str,
    /// Why, for a human.
    pub message: &'a str,
    /// The `metadata.generation` the condition was worked out from.
    pub observed_generation: Option<i64>,
}

/// Sets `new` among `conditions` (`meta.SetStatusCondition`): added if absent; otherwise
/// updated, its `lastTransitionTime` moved to `now` only when its status changes. Returns
/// whether anything changed.
pub fn set(conditions: &mut Vec<Condition>, new: NewCondition<'_>, now: Timestamp) -> bool {
    let status = new.status.to_string();
    let Some(existing) = conditions.iter_mut().find(|c| c.type_ == new.type_) else {
        conditions.push(Condition {
            type_: new.type_.to_owned(),
            status,
            reason: new.reason.to_owned(),
            message: new.message.to_owned(),
            observed_generation: new.observed_generation,
            last_transition_time: Time(now),
        });
        return true;
    };
    let mut changed = false;
    if existing.status != status {
        existing.status = status;
        existing.last_transition_time = Time(now);
        changed = true;
    }
    if existing.reason != new.reason {
        new.reason.clone_into(&mut existing.reason);
        changed = true;
    }
    if existing.message != new.message {
        new.message.clone_into(&mut existing.message);
        changed = true;
    }
    if existing.observed_generation != new.observed_generation {
        existing.observed_generation = new.observed_generation;
        changed = true;
    }
    changed
}

/// The condition of `type_`, if set (`meta.FindStatusCondition`).
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Removes the condition of `type_`; returns whether there was one
/// (`meta.RemoveStatusCondition`).
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

/// Whether the condition of `type_` is set with `status` (`meta.IsStatusConditionPresentAndEqual`).
pub fn is(conditions: &[Condition], type_: &str, status: Status) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == status.to_string())
}

/// Whether the condition of `type_` is `True` (`meta.IsStatusConditionTrue`).
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    is(conditions, type_, Status::True)
}

/// Whether the condition of `type_` is set, is `True`, and was worked out from
/// `generation`: what a reader waiting for the controller to have seen a change checks.
pub fn is_true_for(conditions: &[Condition], type_: &str, generation: Option<i64>) -> bool {
    find(conditions, type_)
        .is_some_and(|c| c.status == "True" && c.observed_generation == generation)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap_or_default()
    }

    fn ready(status: Status, reason: &str, generation: i64) -> NewCondition<'_> {
        NewCondition {
            type_: "Ready",
            status,
            reason,
            message: "",
            observed_generation: Some(generation),
        }
    }

    #[test]
    fn set_adds_updates_and_moves_the_time_only_when_the_status_changes() {
        let mut conditions = Vec::new();
        assert!(set(
            &mut conditions,
            ready(Status::False, "Pending", 1),
            at(0)
        ));
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, Time(at(0)));
        // The same again: nothing changes.
        assert!(!set(
            &mut conditions,
            ready(Status::False, "Pending", 1),
            at(5)
        ));
        // A new reason and generation, same status: the time stays.
        assert!(set(
            &mut conditions,
            ready(Status::False, "Waiting", 2),
            at(10)
        ));
        assert_eq!(conditions[0].last_transition_time, Time(at(0)));
        assert_eq!(
            (
                conditions[0].reason.as_str(),
                conditions[0].observed_generation
            ),
            ("Waiting", Some(2))
        );
        // The status turns: the time moves.
        assert!(set(&mut conditions, ready(Status::True, "Done", 2), at(20)));
        assert_eq!(conditions[0].last_transition_time, Time(at(20)));
        assert!(is_true(&conditions, "Ready"));
        assert!(is_true_for(&conditions, "Ready", Some(2)));
        assert!(!is_true_for(&conditions, "Ready", Some(3)));
        assert!(is(&conditions, "Ready", Status::True));
        assert!(!is(&conditions, "Available", Status::True));
        // Another type is a condition of its own.
        let mut available = ready(Status::Unknown, "Starting", 2);
        available.type_ = "Available";
        assert!(set(&mut conditions, available, at(30)));
        assert_eq!(conditions.len(), 2);
        assert_eq!(
            find(&conditions, "Available").map(|c| c.status.as_str()),
            Some("Unknown")
        );
        assert!(remove(&mut conditions, "Ready"));
        assert!(!remove(&mut conditions, "Ready"));
        assert_eq!(conditions.len(), 1);
    }
}
