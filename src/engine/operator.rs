//! What operators call: read, list and delete records, outside any request.

use super::state::Engine;
use crate::{
    store::{Conditional, Record, Removal, Store},
    StoreError,
};
use tracing::warn;

impl<St: Store> Engine<St> {
    /// Deletes the record of `key` inside `scope`, so that the next request
    /// with the key runs instead of being replayed: for an operator who
    /// must evict a stored outcome (a response that should not be
    /// replayed). Keeps an `IN_PROGRESS` record, whose operation may be
    /// running ([`Forgotten::InProgress`]).
    ///
    /// Only this process's local cache is cleared; other warm instances
    /// may replay from theirs until it expires (keep the cache off, the
    /// default, where that matters).
    pub async fn forget(&self, scope: &str, key: &str) -> Result<Forgotten, StoreError> {
        self.remove(scope, key, Removal::UnlessInProgress).await
    }

    /// Like [`forget`](Engine::forget), but also deletes an `IN_PROGRESS`
    /// record: a stuck claim, or one whose operation is known to be dead.
    /// If it is still running, its completion will be refused and a retry
    /// can run it a second time.
    pub async fn forget_even_in_progress(
        &self,
        scope: &str,
        key: &str,
    ) -> Result<Forgotten, StoreError> {
        self.remove(scope, key, Removal::Any).await
    }

    async fn remove(
        &self,
        scope: &str,
        key: &str,
        removal: Removal,
    ) -> Result<Forgotten, StoreError> {
        let id = self.record_id(scope, key);
        self.evict(&id);
        let forgotten = match self.inner.store.remove(&id, removal).await? {
            Conditional::Applied => Forgotten::Removed,
            Conditional::Refused(None) => Forgotten::Absent,
            Conditional::Refused(Some(record)) => Forgotten::InProgress(record),
        };
        warn!(record = %id, outcome = "forgotten", result = forgotten.kind(), "idempotency record removed by an operator");
        Ok(forgotten)
    }

    /// Up to `limit` records of this engine's prefix that are
    /// `IN_PROGRESS`: live claims, and stuck ones whose lease passed
    /// ([`Record::is_lapsed`]; the next request with their key takes them
    /// over). For operators: it scans the store.
    pub async fn list_in_progress(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        let prefix = format!("{}#", self.inner.key_prefix);
        self.inner.store.list_in_progress(&prefix, limit).await
    }

    /// The clock the engine measures leases and expirations with, in epoch
    /// milliseconds (for operators telling live claims from stuck ones).
    pub fn now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// The record of `key` inside `scope`, read with strong consistency, or
    /// `None` when there is none or it has expired: for operators and
    /// tests. It bypasses the local cache.
    pub async fn inspect(&self, scope: &str, key: &str) -> Result<Option<Record>, StoreError> {
        let id = self.record_id(scope, key);
        self.inner.store.get(&id, self.inner.clock.now_ms()).await
    }
}

/// What [`Engine::forget`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Forgotten {
    /// The record was deleted: the next request with the key runs.
    Removed,
    /// There was no record.
    Absent,
    /// The record is `IN_PROGRESS` and was kept: its operation may be
    /// running. [`Engine::forget_even_in_progress`] removes it anyway.
    InProgress(Record),
}

impl Forgotten {
    fn kind(&self) -> &'static str {
        match self {
            Forgotten::Removed => "removed",
            Forgotten::Absent => "absent",
            Forgotten::InProgress(_) => "in_progress",
        }
    }
}
