//! The causes of a key's adds (trace contexts, and when the earliest event behind them was
//! observed), kept beside the key and handed out with its next lease.

use std::{sync::Arc, time::SystemTime};

use switchyard_work::{MAX_CAUSES, earliest};

/// What caused an add, opaque to the queue (the service keeps a W3C trace context in it).
pub type Cause = Arc<[(String, String)]>;

/// Where an add came from: the trace context of the event that caused it, and when the
/// sender observed that event (wall-clock time: the sender's clock, not this process's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    pub cause: Option<Cause>,
    pub observed_at: Option<SystemTime>,
}

impl Origin {
    /// An add caused by the event whose trace context is `cause`.
    pub fn traced(cause: Cause) -> Self {
        Self {
            cause: Some(cause),
            observed_at: None,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.cause.is_none() && self.observed_at.is_none()
    }
}

/// The causes of a key's adds: the latest [`MAX_CAUSES`], how many older ones went, and the
/// earliest time any of them was observed.
#[derive(Clone, Debug, Default)]
pub(super) struct Causes {
    pub(super) kept: Vec<Cause>,
    pub(super) dropped: u32,
    pub(super) observed_at: Option<SystemTime>,
}

impl Causes {
    pub(super) fn add(&mut self, origin: Origin) {
        if let Some(cause) = origin.cause {
            self.push(cause);
        }
        self.observed_at = earliest(self.observed_at, origin.observed_at);
    }

    pub(super) fn push(&mut self, cause: Cause) {
        if self.kept.len() == MAX_CAUSES {
            self.kept.remove(0);
            self.dropped = self.dropped.saturating_add(1);
        }
        self.kept.push(cause);
    }

    /// Puts the causes of an unfinished lease back before the ones added since.
    pub(super) fn restore(&mut self, older: Causes) {
        let newer = std::mem::replace(self, older);
        self.dropped = self.dropped.saturating_add(newer.dropped);
        self.observed_at = earliest(self.observed_at, newer.observed_at);
        for cause in newer.kept {
            self.push(cause);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.kept.is_empty() && self.dropped == 0 && self.observed_at.is_none()
    }
}
