//! A local mirror of every key under an etcd prefix: listed, then kept current by a watch
//! from the listed revision; after a broken watch (for example a compaction) it lists again,
//! so no change is missed.
//!
//! A watch can also go quiet without breaking: after a network stall, a connection can stay
//! open while nothing arrives on it. So the mirror asks etcd for a progress report every
//! [`PROGRESS_EVERY`]; when nothing at all has arrived for [`SILENT_AFTER`], it drops the
//! connection and lists again.

use std::{collections::BTreeMap, time::Duration};

use etcd_client::{EventType, GetOptions, WatchOptions};
use switchyard_runtime::{Backoff, Drain};
use switchyard_shards::Etcd;
use tokio::sync::watch;
use tracing::warn;

/// Key (without the prefix) -> (value, mod revision).
pub type Entries = BTreeMap<String, (Vec<u8>, i64)>;

const RETRY: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));
/// How often the watch asks for a progress report: one small message each way.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// A watch that has heard nothing (no event, no progress report) for this long is dropped.
/// Three missed reports: a loaded etcd answers well within that.
const SILENT_AFTER: Duration = Duration::from_secs(3);

/// Mirrors `prefix` until `drain`. The receiver holds `None` until the first list.
pub fn mirror(
    etcd: Etcd,
    prefix: &'static str,
    drain: Drain,
) -> (
    watch::Receiver<Option<Entries>>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = watch::channel(None);
    let task = tokio::spawn(async move {
        let mut backoff = Backoff::new(RETRY.0, RETRY.1);
        loop {
            tokio::select! {
                error = follow(&etcd, prefix, &tx) => {
                    warn!(%error, prefix, retry_in = ?backoff.current(), "etcd watch failed");
                }
                _ = drain.clone().signaled() => return,
            }
            if !backoff.wait(&drain).await {
                return;
            }
        }
    });
    (rx, task)
}

async fn follow(
    etcd: &Etcd,
    prefix: &str,
    tx: &watch::Sender<Option<Entries>>,
) -> etcd_client::Error {
    let mut client = match etcd.connect().await {
        Ok(client) => client,
        Err(error) => return error,
    };
    let response = match client
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
    {
        Ok(response) => response,
        Err(error) => return error,
    };
    let revision = response.header().map_or(0, |h| h.revision());
    let mut entries: Entries = response
        .kvs()
        .iter()
        .filter_map(|kv| {
            let key = kv.key_str().ok()?.strip_prefix(prefix)?.to_owned();
            Some((key, (kv.value().to_vec(), kv.mod_revision())))
        })
        .collect();
    tx.send_replace(Some(entries.clone()));
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revision + 1);
    let mut events = match client.watch(prefix, Some(options)).await {
        Ok(events) => events,
        Err(error) => return error,
    };
    let mut progress = tokio::time::interval(PROGRESS_EVERY);
    let mut heard = tokio::time::Instant::now();
    loop {
        let message = tokio::select! {
            message = events.message() => message,
            _ = progress.tick() => {
                if heard.elapsed() >= SILENT_AFTER {
                    return etcd_client::Error::InvalidArgs(format!(
                        "watch silent for {:?}", heard.elapsed()
                    ));
                }
                // A request that cannot even be sent shows up as silence.
                let _ = tokio::time::timeout(PROGRESS_EVERY, events.request_progress()).await;
                continue;
            }
        };
        heard = tokio::time::Instant::now();
        let response = match message {
            Ok(Some(response)) if !response.canceled() => response,
            Ok(_) => return etcd_client::Error::InvalidArgs("watch ended".into()),
            Err(error) => return error,
        };
        if response.events().is_empty() {
            continue;
        }
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let Some(key) = kv.key_str().ok().and_then(|k| k.strip_prefix(prefix)) else {
                continue;
            };
            match event.event_type() {
                EventType::Put => {
                    entries.insert(key.to_owned(), (kv.value().to_vec(), kv.mod_revision()));
                }
                EventType::Delete => {
                    entries.remove(key);
                }
            }
        }
        tx.send_replace(Some(entries.clone()));
    }
}
