//! The causes of a key's adds (trace contexts), kept beside the key and handed out with its
//! next lease.

use std::sync::Arc;

/// Causes kept per key: a key added a thousand times while leased is reconciled once, and
/// its trace links to the latest adds only. 16 links are what a trace view still shows.
pub const MAX_CAUSES: usize = 16;

/// What caused an add, opaque to the queue (the service keeps a W3C trace context in it).
pub type Cause = Arc<[(String, String)]>;

/// The causes of a key's adds: the latest [`MAX_CAUSES`], and how many older ones went.
#[derive(Clone, Debug, Default)]
pub(super) struct Causes {
    pub(super) kept: Vec<Cause>,
    pub(super) dropped: u32,
}

impl Causes {
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
        for cause in newer.kept {
            self.push(cause);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.kept.is_empty() && self.dropped == 0
    }
}
