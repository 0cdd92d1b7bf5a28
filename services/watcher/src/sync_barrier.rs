//! The readiness gate of a watcher: open once every informer (and the garbage collector
//! graph) has finished its initial list.

use std::sync::{
    Arc, Mutex, PoisonError,
    atomic::{AtomicUsize, Ordering},
};

use switchyard_runtime::Gate;
use tracing::info;

/// Opens the readiness gate once every resource has finished its initial list.
#[derive(Debug)]
pub struct SyncBarrier {
    remaining: AtomicUsize,
    gate: Mutex<Option<Gate>>,
}

impl SyncBarrier {
    pub fn new(count: usize, gate: Gate) -> Arc<Self> {
        let barrier = Arc::new(Self {
            remaining: AtomicUsize::new(count),
            gate: Mutex::new(Some(gate)),
        });
        if count == 0 {
            barrier.open();
        }
        barrier
    }

    pub fn done(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.open();
        }
    }

    fn open(&self) {
        let gate = self
            .gate
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(gate) = gate {
            info!("every initial list is done");
            gate.ready();
        }
    }
}
