//! Where a client of the queue (the watcher, the reconciler) finds it.

/// One queue replica for every shard, or each shard's owner in the elector's map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// `--queue-addr`: one queue replica serves every shard (at [`crate::STATIC_EPOCH`]).
    Queue(String),
    /// `--elector-addr`: the elector's `WatchShardMap` names each shard's owner.
    Elector(String),
}

/// Neither address was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "--queue-addr or --elector-addr: one is required (--queue-addr when one queue serves \
     every shard)"
)]
pub struct NoRoute;

impl Route {
    /// The route the `--queue-addr` and `--elector-addr` flags name; the queue's address wins
    /// when both are given.
    pub fn from_flags(
        queue_addr: Option<&str>,
        elector_addr: Option<&str>,
    ) -> Result<Self, NoRoute> {
        match (queue_addr, elector_addr) {
            (Some(queue), _) => Ok(Self::Queue(queue.to_owned())),
            (None, Some(elector)) => Ok(Self::Elector(elector.to_owned())),
            (None, None) => Err(NoRoute),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_address_wins_and_one_is_required() {
        assert_eq!(
            Route::from_flags(Some("q:1"), Some("e:1")),
            Ok(Route::Queue("q:1".into()))
        );
        assert_eq!(
            Route::from_flags(None, Some("e:1")),
            Ok(Route::Elector("e:1".into()))
        );
        assert!(
            Route::from_flags(None, None)
                .unwrap_err()
                .to_string()
                .starts_with("--queue-addr or --elector-addr: one is required")
        );
    }
}
