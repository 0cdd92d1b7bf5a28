//! Decoded objects kept by their JSON, shared by every reconcile of the process: a list that
//! returns objects an earlier list returned unchanged decodes none of them again, and hands
//! out the same `Arc`s, which nothing frees until the objects change.
//!
//! At a thousand Nodes a DaemonSet's reconcile reads every Node and each of its thousand
//! Pods, and decoding them (and freeing them after) was most of its work, as
//! kube-controller-manager's informers hand out pointers into their store and decode nothing.
//!
//! An object is found by its exact bytes (hashed to look it up, compared whole), so a
//! changed object, whatever changed, is decoded afresh: nothing here can hand out a stale
//! object. Objects no list returned for [`KEPT_UNUSED`] are dropped, and a kind past
//! [`MAX_PER_KIND`] objects is emptied, so what is kept is bounded by what reconciles read.

use std::{
    any::{Any, TypeId},
    collections::HashMap,
    hash::{BuildHasher, RandomState},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

/// How long an object no list returned is kept.
pub const KEPT_UNUSED: Duration = Duration::from_secs(60);

/// Objects kept per decoded type; past it the type's objects are all dropped.
pub const MAX_PER_KIND: usize = 200_000;

/// The decoded objects, per decoded type.
#[derive(Debug, Default)]
pub struct Decoded {
    shelves: Mutex<HashMap<TypeId, Box<dyn Any + Send>>>,
    hasher: RandomState,
}

/// The objects of one decoded type, by the hash of their JSON.
struct Shelf<K> {
    entries: HashMap<u64, Vec<Entry<K>>>,
    len: usize,
    swept: Instant,
}

struct Entry<K> {
    json: Vec<u8>,
    object: Arc<K>,
    used: Instant,
}

impl<K> Shelf<K> {
    fn new(now: Instant) -> Self {
        Self {
            entries: HashMap::new(),
            len: 0,
            swept: now,
        }
    }

    fn find(&mut self, hash: u64, json: &[u8], now: Instant) -> Option<Arc<K>> {
        let entry = self
            .entries
            .get_mut(&hash)?
            .iter_mut()
            .find(|entry| entry.json == json)?;
        entry.used = now;
        Some(entry.object.clone())
    }

    fn insert(&mut self, hash: u64, json: Vec<u8>, object: Arc<K>, now: Instant) {
        let bucket = self.entries.entry(hash).or_default();
        if bucket.iter().any(|entry| entry.json == json) {
            // Decoded at once by two lists: the first kept.
            return;
        }
        bucket.push(Entry {
            json,
            object,
            used: now,
        });
        self.len += 1;
    }

    /// Drops what no list returned for [`KEPT_UNUSED`], at most once per that period unless
    /// the shelf is over [`MAX_PER_KIND`], and everything if it still is.
    fn sweep(&mut self, now: Instant) {
        let full = self.len > MAX_PER_KIND;
        if !full && now.duration_since(self.swept) < KEPT_UNUSED {
            return;
        }
        self.swept = now;
        self.entries.retain(|_, bucket| {
            bucket.retain(|entry| now.duration_since(entry.used) < KEPT_UNUSED);
            !bucket.is_empty()
        });
        self.len = self.entries.values().map(Vec::len).sum();
        if self.len > MAX_PER_KIND {
            self.entries.clear();
            self.len = 0;
        }
    }
}

impl Decoded {
    /// `jsons` decoded by `decode`, in order: each found kept is shared, the others decoded
    /// (outside the lock) and kept. With them, how many objects of `K` are kept now.
    pub fn decode_all<K, E>(
        &self,
        jsons: Vec<Vec<u8>>,
        decode: impl Fn(&[u8]) -> Result<K, E>,
    ) -> Result<(Vec<Arc<K>>, usize), E>
    where
        K: Send + Sync + 'static,
    {
        self.decode_all_at(jsons, decode, Instant::now())
    }

    fn decode_all_at<K, E>(
        &self,
        jsons: Vec<Vec<u8>>,
        decode: impl Fn(&[u8]) -> Result<K, E>,
        now: Instant,
    ) -> Result<(Vec<Arc<K>>, usize), E>
    where
        K: Send + Sync + 'static,
    {
        let hashes: Vec<u64> = jsons
            .iter()
            .map(|json| self.hasher.hash_one(json))
            .collect();
        let (mut found, mut kept): (Vec<Option<Arc<K>>>, usize) = {
            let mut shelves = self.lock();
            let shelf = shelf::<K>(&mut shelves, now);
            let found = hashes
                .iter()
                .zip(&jsons)
                .map(|(&hash, json)| shelf.find(hash, json, now))
                .collect();
            (found, shelf.len)
        };
        let mut decoded = Vec::new();
        for (i, json) in jsons.iter().enumerate() {
            if found[i].is_none() {
                let object = Arc::new(decode(json)?);
                found[i] = Some(object.clone());
                decoded.push((i, object));
            }
        }
        if !decoded.is_empty() {
            let mut jsons: Vec<Option<Vec<u8>>> = jsons.into_iter().map(Some).collect();
            let mut shelves = self.lock();
            let shelf = shelf::<K>(&mut shelves, now);
            for (i, object) in decoded {
                if let Some(json) = jsons[i].take() {
                    shelf.insert(hashes[i], json, object, now);
                }
            }
            shelf.sweep(now);
            kept = shelf.len;
        }
        Ok((found.into_iter().flatten().collect(), kept))
    }

    /// Objects kept of the decoded type `K`.
    #[cfg(test)]
    fn kept<K: Send + Sync + 'static>(&self) -> usize {
        shelf::<K>(&mut self.lock(), Instant::now()).len
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TypeId, Box<dyn Any + Send>>> {
        self.shelves.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn shelf<K: Send + Sync + 'static>(
    shelves: &mut HashMap<TypeId, Box<dyn Any + Send>>,
    now: Instant,
) -> &mut Shelf<K> {
    shelves
        .entry(TypeId::of::<K>())
        .or_insert_with(|| Box::new(Shelf::<K>::new(now)))
        .downcast_mut::<Shelf<K>>()
        .unwrap_or_else(|| unreachable!("a shelf is kept under its own type's id"))
}

impl<K> std::fmt::Debug for Shelf<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shelf").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Named {
        name: String,
        version: u32,
    }

    fn json(name: &str, version: u32) -> Vec<u8> {
        format!(r#"{{"name":"{name}","version":{version}}}"#).into_bytes()
    }

    fn decode(json: &[u8]) -> Result<Named, serde_json::Error> {
        serde_json::from_slice(json)
    }

    #[test]
    fn an_unchanged_object_is_shared_and_a_changed_one_decoded_afresh() {
        let decoded = Decoded::default();
        let now = Instant::now();
        let (first, _) = decoded
            .decode_all_at(vec![json("a", 1), json("b", 1)], decode, now)
            .unwrap();
        let (second, _) = decoded
            .decode_all_at(vec![json("b", 1), json("a", 2)], decode, now)
            .unwrap();
        assert!(Arc::ptr_eq(&first[1], &second[0]), "b unchanged: shared");
        assert_eq!(
            *second[1],
            Named {
                name: "a".into(),
                version: 2
            }
        );
        assert_eq!(first[0].version, 1, "what was handed out stays as it was");
        assert_eq!(decoded.kept::<Named>(), 3);
    }

    #[test]
    fn a_type_decoded_otherwise_is_kept_apart() {
        #[derive(Debug, serde::Deserialize)]
        struct NameOnly {
            name: String,
        }
        let decoded = Decoded::default();
        decoded.decode_all(vec![json("a", 1)], decode).unwrap();
        let (names, kept) = decoded
            .decode_all(vec![json("a", 1)], |json| {
                serde_json::from_slice::<NameOnly>(json)
            })
            .unwrap();
        assert_eq!(kept, 1);
        assert_eq!(names[0].name, "a");
        assert_eq!(decoded.kept::<Named>(), 1);
        assert_eq!(decoded.kept::<NameOnly>(), 1);
    }

    #[test]
    fn an_undecodable_object_fails_the_read_and_keeps_nothing() {
        let decoded = Decoded::default();
        let error = decoded.decode_all(vec![json("a", 1), b"{".to_vec()], decode);
        assert!(error.is_err());
        assert_eq!(decoded.kept::<Named>(), 0);
    }

    #[test]
    fn what_no_list_returned_for_a_while_is_dropped() {
        let decoded = Decoded::default();
        let start = Instant::now();
        decoded
            .decode_all_at(vec![json("old", 1), json("kept", 1)], decode, start)
            .unwrap();
        let later = start + KEPT_UNUSED / 2;
        decoded
            .decode_all_at(vec![json("kept", 1), json("new", 1)], decode, later)
            .unwrap();
        assert_eq!(decoded.kept::<Named>(), 3, "not yet swept");
        let past = start + KEPT_UNUSED + Duration::from_secs(1);
        decoded
            .decode_all_at(vec![json("newer", 1)], decode, past)
            .unwrap();
        assert_eq!(
            decoded.kept::<Named>(),
            3,
            "old dropped; kept, new and newer left"
        );
    }
}
