//! The warm-process cache of completed records.

use crate::{store::RecordId, Fingerprint};
use lru::LruCache;
use std::{
    num::NonZeroUsize,
    sync::{Arc, Mutex, MutexGuard},
};

/// A completed record as cached: only what a replay needs.
#[derive(Debug, Clone)]
pub(crate) struct CachedRecord {
    pub(crate) fingerprint: Fingerprint,
    pub(crate) expiration_s: u64,
    pub(crate) response: Arc<[u8]>,
    pub(crate) completed_at_ms: Option<u64>,
    pub(crate) attempt: u32,
}

/// An LRU of completed records. `IN_PROGRESS` records are never put here:
/// they change under other invocations' hands.
#[derive(Debug)]
pub(crate) struct RecordCache {
    entries: Mutex<LruCache<RecordId, CachedRecord>>,
}

impl RecordCache {
    pub(crate) fn new(capacity: NonZeroUsize) -> Self {
        Self {
            entries: Mutex::new(LruCache::new(capacity)),
        }
    }

    /// The cached record for `id`, unless it has expired (then it is evicted).
    pub(crate) fn get(&self, id: &RecordId, now_ms: u64) -> Option<CachedRecord> {
        let mut entries = self.lock();
        let hit = entries.get(id)?;
        if hit.expiration_s < now_ms / 1000 {
            entries.pop(id);
            return None;
        }
        Some(hit.clone())
    }

    pub(crate) fn put(&self, id: RecordId, record: CachedRecord) {
        self.lock().put(id, record);
    }

    pub(crate) fn remove(&self, id: &RecordId) {
        self.lock().pop(id);
    }

    fn lock(&self) -> MutexGuard<'_, LruCache<RecordId, CachedRecord>> {
        // Every cache operation is a single LRU call: a panic elsewhere while
        // the lock was held cannot leave an entry half-written.
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(expiration_s: u64) -> CachedRecord {
        CachedRecord {
            fingerprint: Fingerprint::of_bytes(b"p"),
            expiration_s,
            response: Arc::from(&b"r"[..]),
            completed_at_ms: None,
            attempt: 1,
        }
    }

    #[test]
    fn expired_entries_are_evicted_on_read() {
        let cache = RecordCache::new(NonZeroUsize::new(2).unwrap());
        let id = RecordId::new("p", "s", "k");
        cache.put(id.clone(), record(100));
        assert!(cache.get(&id, 100_999).is_some());
        assert!(cache.get(&id, 101_000).is_none());
        assert!(cache.get(&id, 0).is_none(), "evicted, not just hidden");
    }

    #[test]
    fn least_recently_used_entry_goes_first() {
        let cache = RecordCache::new(NonZeroUsize::new(2).unwrap());
        let [a, b, c] = ["a", "b", "c"].map(|k| RecordId::new("p", "s", k));
        cache.put(a.clone(), record(100));
        cache.put(b.clone(), record(100));
        assert!(cache.get(&a, 0).is_some());
        cache.put(c.clone(), record(100));
        assert!(cache.get(&b, 0).is_none());
        assert!(cache.get(&a, 0).is_some());
        assert!(cache.get(&c, 0).is_some());
    }
}
