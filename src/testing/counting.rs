//! A store wrapper that counts calls.

use crate::{
    store::{
        Claim, Commit, Completion, Conditional, Extension, OwnerToken, Record, RecordId,
        RecordedStep, Removal, StepWrite, Store,
    },
    StoreError,
};
use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

/// Counts the calls made to the store it wraps; clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct CountingStore<St> {
    inner: St,
    counts: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    claim: AtomicU64,
    take_over: AtomicU64,
    commit: AtomicU64,
    extend: AtomicU64,
    remove: AtomicU64,
    complete: AtomicU64,
    release: AtomicU64,
    get: AtomicU64,
    peek: AtomicU64,
    record_step: AtomicU64,
    steps: AtomicU64,
}

/// How many calls of each kind a [`CountingStore`] has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Calls {
    /// [`Store::claim`] calls.
    pub claim: u64,
    /// [`Store::take_over`] calls.
    pub take_over: u64,
    /// [`Store::commit`] calls.
    pub commit: u64,
    /// [`Store::extend`] calls.
    pub extend: u64,
    /// [`Store::remove`] calls.
    pub remove: u64,
    /// [`Store::complete`] calls.
    pub complete: u64,
    /// [`Store::release`] calls.
    pub release: u64,
    /// [`Store::get`] calls.
    pub get: u64,
    /// [`Store::peek`] calls.
    pub peek: u64,
    /// [`Store::record_step`] calls.
    pub record_step: u64,
    /// [`Store::steps`] calls.
    pub steps: u64,
}

impl Calls {
    /// Every call, whatever its kind.
    pub fn total(&self) -> u64 {
        self.claim
            + self.take_over
            + self.commit
            + self.extend
            + self.complete
            + self.release
            + self.remove
            + self.get
            + self.peek
            + self.record_step
            + self.steps
    }
}

impl<St> CountingStore<St> {
    /// Counts the calls made to `inner`.
    pub fn new(inner: St) -> Self {
        Self {
            inner,
            counts: Arc::default(),
        }
    }

    /// The store being counted.
    pub fn inner(&self) -> &St {
        &self.inner
    }

    /// The calls so far.
    pub fn calls(&self) -> Calls {
        let load = |counter: &AtomicU64| counter.load(Ordering::SeqCst);
        Calls {
            claim: load(&self.counts.claim),
            take_over: load(&self.counts.take_over),
            commit: load(&self.counts.commit),
            extend: load(&self.counts.extend),
            remove: load(&self.counts.remove),
            complete: load(&self.counts.complete),
            release: load(&self.counts.release),
            get: load(&self.counts.get),
            peek: load(&self.counts.peek),
            record_step: load(&self.counts.record_step),
            steps: load(&self.counts.steps),
        }
    }
}

fn count(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::SeqCst);
}

impl<St: Store> Store for CountingStore<St> {
    type Write = St::Write;

    const SINGLE_WRITE: bool = St::SINGLE_WRITE;
    const DB_SYSTEM: &'static str = St::DB_SYSTEM;
    const STEPS: bool = St::STEPS;

    async fn record_step(&self, step: &StepWrite) -> Result<Conditional, StoreError> {
        count(&self.counts.record_step);
        self.inner.record_step(step).await
    }

    async fn steps(&self, id: &RecordId, now_ms: u64) -> Result<Vec<RecordedStep>, StoreError> {
        count(&self.counts.steps);
        self.inner.steps(id, now_ms).await
    }

    async fn commit(&self, commit: Commit<St::Write>) -> Result<Conditional, StoreError> {
        count(&self.counts.commit);
        self.inner.commit(commit).await
    }

    async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
        count(&self.counts.claim);
        self.inner.claim(claim).await
    }

    async fn take_over(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        count(&self.counts.take_over);
        self.inner.take_over(claim, lapsed).await
    }

    async fn extend(&self, extension: &Extension) -> Result<Conditional, StoreError> {
        count(&self.counts.extend);
        self.inner.extend(extension).await
    }

    async fn remove(&self, id: &RecordId, removal: Removal) -> Result<Conditional, StoreError> {
        count(&self.counts.remove);
        self.inner.remove(id, removal).await
    }

    async fn complete(&self, completion: Completion<St::Write>) -> Result<Conditional, StoreError> {
        count(&self.counts.complete);
        self.inner.complete(completion).await
    }

    async fn release(&self, id: &RecordId, owner: &OwnerToken) -> Result<Conditional, StoreError> {
        count(&self.counts.release);
        self.inner.release(id, owner).await
    }

    async fn list_in_progress(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.inner.list_in_progress(prefix, limit).await
    }

    async fn list_abandoned(
        &self,
        query: &crate::store::AbandonedQuery,
    ) -> Result<crate::store::AbandonedPage, StoreError> {
        self.inner.list_abandoned(query).await
    }

    async fn get(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        count(&self.counts.get);
        self.inner.get(id, now_ms).await
    }

    async fn peek(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        count(&self.counts.peek);
        self.inner.peek(id, now_ms).await
    }

    async fn table_size(&self, now_ms: u64) -> Result<Option<crate::store::TableSize>, StoreError> {
        self.inner.table_size(now_ms).await
    }
}
