//! An in-memory store with the DynamoDB store's semantics, for unit tests
//! and examples.

mod arena;
mod packed;
mod records;
mod transaction;

use super::{
    AbandonedPage, AbandonedQuery, Accuracy, Claim, Commit, Completion, Conditional, Extension,
    OwnerToken, PageCursor, Record, RecordId, RecordedStep, Removal, SizeSource, Status, StepWrite,
    Store, TableSize,
};
use crate::{StoreError, StoreErrorKind};
use packed::{monotonic_ms, Packed};
use records::Records;
use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, MutexGuard,
    },
};
pub use transaction::MemoryTransaction;

/// A business write committed by [`MemoryStore`] together with a
/// completion: an item stored under a key in a side table that tests can
/// read with [`MemoryStore::item`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryWrite {
    /// The item's key.
    pub key: String,
    /// The item's value.
    pub value: Vec<u8>,
    /// Reject the whole transaction if an item already exists under `key`,
    /// like a DynamoDB `attribute_not_exists` condition.
    pub if_absent: bool,
}

impl MemoryWrite {
    /// Puts `value` under `key`, replacing any item there.
    pub fn put(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
            if_absent: false,
        }
    }

    /// Puts `value` under `key` only if no item is there.
    pub fn put_if_absent(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Self {
            if_absent: true,
            ..Self::put(key, value)
        }
    }
}

/// A [`Store`] in process memory.
///
/// It evaluates the same conditions as the DynamoDB store, and (feature
/// `testing`) can be told to fail, so the engine's behaviour can be tested
/// without DynamoDB. Clones share the same records.
///
/// An expired record counts as absent, as DynamoDB's does, and stays in
/// memory (and in `records()`, feature `testing`) until the store holds
/// 1,024 records or more and a new one would grow its table. Its table is
/// rebuilt then, without the records that have expired both by the clock
/// of the write that finds the table full and by this process's monotonic
/// clock, measured from the completion, extension or single write that set
/// the record's expiry (a claim's record is not dropped before one of
/// those sets it). A wall clock stepped ahead, or one engine's clock ahead
/// of another's, so drops nothing live, and no key runs again. It is
/// rebuilt with room for twice its live records, so it grows under load
/// and shrinks after a peak; a peak's records stay until the table has
/// filled again.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    state: Mutex<State>,
    failures: AtomicUsize,
    failure_kind: Mutex<Option<StoreErrorKind>>,
    key_locks: transaction::KeyLocks,
}

#[derive(Debug, Default)]
struct State {
    records: Records,
    items: HashMap<String, Vec<u8>>,
    /// The keys transactions hold ([`MemoryTransaction`]): a write outside
    /// them is a conflict.
    held: HashSet<String>,
    /// The steps recorded on each `IN_PROGRESS` record
    /// ([`Store::record_step`]), beside the packed records (whose layout is
    /// tuned for the claim path). Cleared with every write that starts or
    /// ends a record, so a record never shows another's; the steps of a
    /// record dropped as expired stay until its key is claimed again.
    steps: HashMap<String, Vec<RecordedStep>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The business item committed under `key` by a transactional completion.
    pub fn item(&self, key: &str) -> Option<Vec<u8>> {
        self.state().items.get(key).cloned()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a record half-written
        // (every update is a single insert or remove), so a poisoned lock is
        // safe to keep using.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn enter(&self) -> Result<MutexGuard<'_, State>, StoreError> {
        let injected = self
            .inner
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if injected.is_ok() {
            let kind = *self
                .inner
                .failure_kind
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            return Err(StoreError::new(
                kind.unwrap_or(StoreErrorKind::Unavailable),
                "memory store: injected failure",
            ));
        }
        Ok(self.state())
    }

    /// [`enter`](Self::enter) for a write to `id`'s record outside a
    /// transaction: a conflict while a transaction holds the key (as a
    /// database's write would wait on the transaction's row lock).
    fn enter_key(&self, id: &str) -> Result<MutexGuard<'_, State>, StoreError> {
        let state = self.enter()?;
        if !state.held.is_empty() && state.held.contains(id) {
            return Err(StoreError::new(
                StoreErrorKind::Conflict,
                "memory store: a transaction holds the key",
            ));
        }
        Ok(state)
    }
}

/// The fault hooks and record access of the conformance kit.
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
impl MemoryStore {
    /// Makes the next `n` calls fail with [`StoreErrorKind::Unavailable`].
    pub fn fail_next(&self, n: usize) {
        self.fail_next_with(n, StoreErrorKind::Unavailable);
    }

    /// Makes the next `n` calls fail with an error of `kind`.
    pub fn fail_next_with(&self, n: usize, kind: StoreErrorKind) {
        *self
            .inner
            .failure_kind
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(kind);
        self.inner.failures.store(n, Ordering::SeqCst);
    }

    /// The record stored under `id`, expired or not (an expired one may
    /// have been dropped: see [`MemoryStore`]).
    pub fn record(&self, id: &RecordId) -> Option<Record> {
        self.state()
            .records
            .get(id.as_str())
            .map(|record| record.record())
    }

    /// Every record, expired or not (expired ones may have been dropped:
    /// see [`MemoryStore`]).
    pub fn records(&self) -> Vec<Record> {
        self.state()
            .records
            .iter()
            .map(|record| record.record())
            .collect()
    }

    /// Replaces or inserts a record as it is, bypassing every condition: for
    /// tests that need a record in a given state. It has no time of its
    /// own, so it is never dropped, expired or not.
    pub fn insert_record(&self, record: Record) {
        self.state().records.put(Packed::new(record));
    }
}

/// Rejects the whole transaction if one of its writes' conditions fails.
pub(super) fn check_writes(
    items: &HashMap<String, Vec<u8>>,
    writes: &[MemoryWrite],
) -> Result<(), StoreError> {
    match writes
        .iter()
        .enumerate()
        .find(|(_, w)| w.if_absent && items.contains_key(&w.key))
    {
        // Refused as DynamoDB refuses a condition: a refusal the
        // application can answer (`run_with_refusals`).
        Some((index, taken)) => {
            let message = format!("memory store: an item already exists under {:?}", taken.key);
            Err(
                StoreError::new(StoreErrorKind::WriteRejected, message.clone()).with_write_refusal(
                    crate::WriteRefusal::new(index, "ConditionalCheckFailed", message),
                ),
            )
        }
        None => Ok(()),
    }
}

impl Store for MemoryStore {
    type Write = MemoryWrite;

    const SINGLE_WRITE: bool = true;
    const DB_SYSTEM: &'static str = "memory";
    const STEPS: bool = true;

    async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
        let mut state = self.enter_key(claim.id.as_str())?;
        state.records.make_room(claim.now_ms, monotonic_ms);
        let slot = state.records.slot(claim.id.as_str());
        if let Some(existing) = slot.get() {
            if !existing.is_expired(claim.now_ms) {
                return Ok(Conditional::Refused(Some(existing.record())));
            }
        }
        slot.put(Packed::claimed_from(claim));
        state.steps.remove(claim.id.as_str());
        Ok(Conditional::Applied)
    }

    async fn take_over(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        let mut state = self.enter_key(claim.id.as_str())?;
        match state.records.get(claim.id.as_str()) {
            Some(existing)
                if existing.held_by(lapsed)
                    && existing
                        .lease_until_ms()
                        .is_some_and(|lease| lease < claim.now_ms) =>
            {
                state.records.put(Packed::claimed_from(claim));
                Ok(Conditional::Applied)
            }
            found => Ok(Conditional::Refused(found.map(|found| found.record()))),
        }
    }

    async fn extend(&self, extension: &Extension) -> Result<Conditional, StoreError> {
        let mut state = self.enter_key(extension.id.as_str())?;
        let Some(mut found) = state.records.found(extension.id.as_str()) else {
            return Ok(Conditional::Refused(None));
        };
        if !found.get().held_by(&extension.owner) {
            return Ok(Conditional::Refused(Some(found.get().record())));
        }
        found.get_mut().extend(
            extension.lease_until_ms,
            extension.expiration_s,
            extension.now_ms,
        );
        Ok(Conditional::Applied)
    }

    async fn complete(
        &self,
        completion: Completion<MemoryWrite>,
    ) -> Result<Conditional, StoreError> {
        let mut state = self.enter_key(completion.id.as_str())?;
        let state = &mut *state;
        let Some(found) = state.records.found(completion.id.as_str()) else {
            return Ok(Conditional::Refused(None));
        };
        if !found.get().held_by(&completion.owner) {
            return Ok(Conditional::Refused(Some(found.get().record())));
        }
        check_writes(&state.items, &completion.writes)?;
        found.complete(
            &completion.response,
            completion.now_ms,
            completion.expiration_s,
        );
        for write in completion.writes {
            state.items.insert(write.key, write.value);
        }
        // A completed record replays its response; its steps are never
        // read again.
        state.steps.remove(completion.id.as_str());
        Ok(Conditional::Applied)
    }

    async fn release(&self, id: &RecordId, owner: &OwnerToken) -> Result<Conditional, StoreError> {
        let mut state = self.enter_key(id.as_str())?;
        match state.records.found(id.as_str()) {
            Some(found) if found.get().held_by(owner) => {
                found.remove();
                state.steps.remove(id.as_str());
                Ok(Conditional::Applied)
            }
            found => Ok(Conditional::Refused(
                found.map(|found| found.get().record()),
            )),
        }
    }

    async fn commit(&self, commit: Commit<MemoryWrite>) -> Result<Conditional, StoreError> {
        let mut state = self.enter_key(commit.id.as_str())?;
        if let Some(existing) = state.records.get(commit.id.as_str()) {
            let existing = existing.record();
            // A claim holding a response is a completed record whose status
            // was changed: never replaced (Store::commit).
            let changed = existing.is_lapsed(commit.now_ms) && existing.response.is_some();
            if existing.is_live(commit.now_ms) || changed {
                return Ok(Conditional::Refused(Some(existing)));
            }
        }
        check_writes(&state.items, &commit.writes)?;
        for write in commit.writes {
            state.items.insert(write.key, write.value);
        }
        state.records.make_room(commit.now_ms, monotonic_ms);
        let mut committed = Packed::new(Record {
            id: commit.id,
            status: Status::Completed,
            owner: commit.owner,
            fingerprint: commit.fingerprint,
            expiration_s: commit.expiration_s,
            lease_until_ms: None,
            response: Some(commit.response),
            created_at_ms: Some(commit.now_ms),
            attempt: 1,
            first_started_ms: Some(commit.now_ms),
            completed_at_ms: Some(commit.now_ms),
        });
        committed.expire_at(commit.expiration_s, commit.now_ms, monotonic_ms());
        state.steps.remove(committed.id());
        state.records.put(committed);
        Ok(Conditional::Applied)
    }

    async fn remove(&self, id: &RecordId, removal: Removal) -> Result<Conditional, StoreError> {
        let mut state = self.enter_key(id.as_str())?;
        match state.records.get(id.as_str()) {
            Some(record)
                if removal == Removal::UnlessInProgress
                    && record.status() == Status::InProgress =>
            {
                Ok(Conditional::Refused(Some(record.record())))
            }
            Some(_) => {
                state.records.remove(id.as_str());
                state.steps.remove(id.as_str());
                Ok(Conditional::Applied)
            }
            None => Ok(Conditional::Refused(None)),
        }
    }

    async fn list_in_progress(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let state = self.enter()?;
        let mut records: Vec<Record> = state
            .records
            .iter()
            .filter(|r| r.status() == Status::InProgress && r.id().starts_with(prefix))
            .map(|record| record.record())
            .collect();
        records.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        records.truncate(limit);
        Ok(records)
    }

    /// Every record is looked at under the store's lock (the memory store
    /// is for tests and one process): a page is the abandoned records
    /// after the cursor's id, in id order.
    async fn list_abandoned(&self, query: &AbandonedQuery) -> Result<AbandonedPage, StoreError> {
        let state = self.enter()?;
        let after = query.cursor.as_ref().map(PageCursor::as_str);
        let mut records: Vec<Record> = state
            .records
            .iter()
            .filter(|r| {
                r.status() == Status::InProgress && after.is_none_or(|after| r.id() > after)
            })
            .map(|record| record.record())
            .filter(|record| query.matches(record))
            .collect();
        records.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        let next = (records.len() > query.limit)
            .then(|| PageCursor::from_stored(records[query.limit - 1].id.as_str()));
        records.truncate(query.limit);
        Ok(AbandonedPage::new(records, next))
    }

    async fn get(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        let state = self.enter()?;
        Ok(state
            .records
            .get(id.as_str())
            .filter(|r| !r.is_expired(now_ms))
            .map(|record| record.record()))
    }

    /// Counts the records not expired at `now_ms`, those in progress and
    /// their packed bytes: exact (what a read would find, not what waits
    /// in memory to be dropped), by a pass over every record under the
    /// store's lock, which every call waits for meanwhile (under 1 ms for
    /// 4,000 records in the dashboard's run, a debug build): sample it
    /// every few seconds at most.
    async fn table_size(&self, now_ms: u64) -> Result<Option<TableSize>, StoreError> {
        let state = self.enter()?;
        let (mut records, mut in_progress, mut bytes) = (0u64, 0u64, 0u64);
        for record in state.records.iter().filter(|r| !r.is_expired(now_ms)) {
            records += 1;
            in_progress += u64::from(record.status() == Status::InProgress);
            bytes += record.bytes().len() as u64;
        }
        Ok(Some(
            TableSize::new(records, Accuracy::Exact, SizeSource::Memory)
                .in_progress(in_progress)
                .bytes(bytes),
        ))
    }

    async fn record_step(&self, step: &StepWrite) -> Result<Conditional, StoreError> {
        let mut state = self.enter_key(step.id.as_str())?;
        let state = &mut *state;
        let Some(found) = state.records.get(step.id.as_str()) else {
            return Ok(Conditional::Refused(None));
        };
        let recorded = state.steps.get(step.id.as_str()).map_or(0, Vec::len);
        // The completion's fence (`held_by`: IN_PROGRESS under this owner),
        // and the count that makes a retried write land once.
        if !found.held_by(&step.owner) || recorded != step.index as usize {
            return Ok(Conditional::Refused(Some(found.record())));
        }
        state
            .steps
            .entry(step.id.as_str().to_owned())
            .or_default()
            .push(RecordedStep::new(step.name.clone(), step.output.clone()));
        Ok(Conditional::Applied)
    }

    async fn steps(&self, id: &RecordId, now_ms: u64) -> Result<Vec<RecordedStep>, StoreError> {
        let state = self.enter()?;
        let in_progress = state
            .records
            .get(id.as_str())
            .is_some_and(|r| !r.is_expired(now_ms) && r.status() == Status::InProgress);
        Ok(match state.steps.get(id.as_str()) {
            Some(steps) if in_progress => steps.clone(),
            _ => Vec::new(),
        })
    }

    fn transactions(&self) -> Option<&dyn super::Transactions<MemoryWrite>> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{store::OwnerToken, Fingerprint};
    use records::SWEPT_FROM;

    fn claim(i: usize, now_ms: u64, expiration_s: u64) -> Claim {
        Claim {
            id: RecordId::from_stored(format!("charges#{i}")),
            owner: OwnerToken::from_stored("o"),
            fingerprint: Fingerprint::from_stored("f"),
            now_ms,
            lease_until_ms: now_ms + 1,
            expiration_s,
            attempt: 1,
            first_started_ms: now_ms,
        }
    }

    /// Claims and completes `id`'s record at `now_ms`, to expire at
    /// `expiration_s`.
    async fn run(store: &MemoryStore, id: usize, now_ms: u64, expiration_s: u64) {
        let claimed = store.claim(&claim(id, now_ms, expiration_s)).await;
        assert!(matches!(claimed, Ok(Conditional::Applied)), "{claimed:?}");
        let completion = Completion {
            id: RecordId::from_stored(format!("charges#{id}")),
            owner: OwnerToken::from_stored("o"),
            response: b"{}".to_vec(),
            now_ms,
            expiration_s,
            writes: Vec::new(),
        };
        let completed = store.complete(completion).await;
        assert!(
            matches!(completed, Ok(Conditional::Applied)),
            "{completed:?}"
        );
    }

    /// The table size is exact: every record a read would find, those in
    /// progress among them, and no expired one (still in memory).
    #[tokio::test]
    async fn the_table_size_counts_what_a_read_finds() {
        let store = MemoryStore::new();
        let now_ms = 1_700_000_000_000;
        let live_s = now_ms / 1000 + 60;
        for id in 0..7 {
            run(&store, id, now_ms, live_s).await;
        }
        for id in 7..10 {
            let claimed = store.claim(&claim(id, now_ms, live_s)).await;
            assert!(matches!(claimed, Ok(Conditional::Applied)));
        }
        run(&store, 10, now_ms, now_ms / 1000 - 1).await;
        assert_eq!(store.records().len(), 11, "the expired one is kept");
        let size = store.table_size(now_ms).await.unwrap().unwrap();
        assert_eq!(
            (size.records, size.in_progress, size.accuracy, size.source),
            (10, Some(3), Accuracy::Exact, SizeSource::Memory)
        );
        let packed: u64 = store
            .state()
            .records
            .iter()
            .filter(|r| !r.is_expired(now_ms))
            .map(|r| r.bytes().len() as u64)
            .sum();
        assert_eq!(size.bytes, Some(packed));
        assert!(packed > 10 * 20, "{packed} bytes");
        // An hour later every record has expired.
        let later = store.table_size(now_ms + 3_600_000).await.unwrap().unwrap();
        assert_eq!((later.records, later.in_progress), (0, Some(0)));
    }

    #[tokio::test]
    async fn records_expired_when_written_are_dropped_as_new_ones_come() {
        // Each record has expired by its writer's clock already, so both
        // clocks agree at once: the store keeps at most a table's worth,
        // not all 20,000.
        let store = MemoryStore::new();
        for id in 0..20_000 {
            run(&store, id, 100_000, 50).await;
        }
        let kept = store.records().len();
        assert!(
            kept < 4 * SWEPT_FROM,
            "{kept} records kept of 20,000, none live"
        );
    }

    #[tokio::test]
    async fn a_claim_s_record_is_not_dropped_before_its_expiry_is_set_again() {
        // In progress and expired by its writer's clock, never completed:
        // held by its claim, whatever the clocks say.
        let store = MemoryStore::new();
        for id in 0..5000 {
            let claimed = store.claim(&claim(id, 100_000, 50)).await;
            assert!(matches!(claimed, Ok(Conditional::Applied)));
        }
        assert_eq!(store.records().len(), 5000);
    }

    #[tokio::test]
    async fn a_claim_with_its_clock_ahead_drops_no_live_record() {
        // A table filled by records completed at t0, live for an hour; then
        // one claim
        // whose clock reads two hours later (stepped ahead, or another
        // engine's), then a retry of the first key at t0 + 1 s.
        let store = MemoryStore::new();
        let t0 = 1_700_000_000_000;
        let live_until_s = t0 / 1000 + 3600;
        let full = || {
            let state = store.state();
            state.records.len() >= SWEPT_FROM && state.records.len() == state.records.capacity()
        };
        let mut id = 0;
        while !full() {
            run(&store, id, t0, live_until_s).await;
            id += 1;
        }
        let ahead = Claim {
            id: RecordId::from_stored("ahead"),
            ..claim(0, t0 + 7_200_000, live_until_s + 7200)
        };
        assert!(matches!(
            store.claim(&ahead).await,
            Ok(Conditional::Applied)
        ));
        assert_eq!(store.records().len(), id + 1, "no record dropped");
        let retry = store.claim(&claim(0, t0 + 1000, live_until_s)).await;
        assert!(
            matches!(retry, Ok(Conditional::Refused(Some(_)))),
            "the first key's record is live: {retry:?}"
        );
    }
}
