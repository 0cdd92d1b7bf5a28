//! What the handler fuzz tests share: a seed that replays a run, and a count of every panic
//! in the process (a handler's panic kills only its connection, which the calls would not
//! notice).

use std::sync::{
    Arc, Mutex, PoisonError,
    atomic::{AtomicUsize, Ordering},
};

/// The seed of this run: `SWITCHYARD_FUZZ_SEED` when set (to replay a failure), otherwise a
/// random one. Printed either way, so that a failure can be replayed.
pub fn seed() -> u64 {
    let seed = std::env::var("SWITCHYARD_FUZZ_SEED")
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u64>()
                .unwrap_or_else(|_| panic!("SWITCHYARD_FUZZ_SEED={s:?} is not a number"))
        })
        .unwrap_or_else(rand::random);
    eprintln!("replay with SWITCHYARD_FUZZ_SEED={seed}");
    seed
}

/// Counts every panic of the process from now on, in whatever task or thread, keeping the
/// first message; the panic is still reported as before.
#[derive(Clone, Debug)]
pub struct Panics {
    count: Arc<AtomicUsize>,
    first: Arc<Mutex<Option<String>>>,
}

impl Panics {
    pub fn count() -> Self {
        let panics = Self {
            count: Arc::default(),
            first: Arc::default(),
        };
        let (count, first) = (Arc::clone(&panics.count), Arc::clone(&panics.first));
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            count.fetch_add(1, Ordering::SeqCst);
            first
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert_with(|| info.to_string());
            default(info);
        }));
        panics
    }

    /// How many panics there were, and the first one's message.
    pub fn so_far(&self) -> (usize, Option<String>) {
        (
            self.count.load(Ordering::SeqCst),
            self.first
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}
