//! An Event a controller's decision asks its adapter to record on the object it decided
//! about, in kube-controller-manager's reasons and words.

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub warning: bool,
    pub reason: String,
    pub message: String,
}

impl Event {
    pub fn normal(reason: &str, message: impl Into<String>) -> Self {
        Self {
            warning: false,
            reason: reason.into(),
            message: message.into(),
        }
    }

    pub fn warning(reason: &str, message: impl Into<String>) -> Self {
        Self {
            warning: true,
            reason: reason.into(),
            message: message.into(),
        }
    }
}
