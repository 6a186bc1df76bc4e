//! A store wrapper that loses the answer of every write and retries it.

use crate::{
    store::{
        Claim, Commit, Completion, Conditional, Extension, OwnerToken, Record, RecordId,
        RecordedStep, Removal, StepWrite, Store,
    },
    StoreError,
};

/// Sends every write to the store it wraps twice and answers with the
/// second answer, as an SDK does when a write lands but its answer is lost
/// (a timeout, a reset connection) and it retries.
///
/// The retried write finds the first one's effect: the claim its own
/// record, the completion its own completed record, the release no record.
/// The store must report what it found ([`Conditional::Refused`]) and the
/// engine must recognise its own write; the scenario
/// [`own_landed_writes_are_recognised`](super::scenarios::own_landed_writes_are_recognised)
/// runs an engine over this wrapper.
#[derive(Debug, Clone, Default)]
pub struct LostAnswers<St>(pub St);

impl<St: Store> Store for LostAnswers<St> {
    type Write = St::Write;

    const SINGLE_WRITE: bool = St::SINGLE_WRITE;
    const DB_SYSTEM: &'static str = St::DB_SYSTEM;
    const STEPS: bool = St::STEPS;

    async fn record_step(&self, step: &StepWrite) -> Result<Conditional, StoreError> {
        self.0.record_step(step).await?;
        self.0.record_step(step).await
    }

    async fn steps(&self, id: &RecordId, now_ms: u64) -> Result<Vec<RecordedStep>, StoreError> {
        self.0.steps(id, now_ms).await
    }

    async fn commit(&self, commit: Commit<St::Write>) -> Result<Conditional, StoreError> {
        self.0.commit(commit.clone()).await?;
        self.0.commit(commit).await
    }

    async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
        self.0.claim(claim).await?;
        self.0.claim(claim).await
    }

    async fn take_over(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        self.0.take_over(claim, lapsed).await?;
        self.0.take_over(claim, lapsed).await
    }

    async fn extend(&self, extension: &Extension) -> Result<Conditional, StoreError> {
        self.0.extend(extension).await?;
        self.0.extend(extension).await
    }

    /// Sent once: an operator's removal is not part of the protocol.
    async fn remove(&self, id: &RecordId, removal: Removal) -> Result<Conditional, StoreError> {
        self.0.remove(id, removal).await
    }

    async fn complete(&self, completion: Completion<St::Write>) -> Result<Conditional, StoreError> {
        self.0.complete(completion.clone()).await?;
        self.0.complete(completion).await
    }

    async fn release(&self, id: &RecordId, owner: &OwnerToken) -> Result<Conditional, StoreError> {
        self.0.release(id, owner).await?;
        self.0.release(id, owner).await
    }

    async fn list_in_progress(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.0.list_in_progress(prefix, limit).await
    }

    async fn list_abandoned(
        &self,
        query: &crate::store::AbandonedQuery,
    ) -> Result<crate::store::AbandonedPage, StoreError> {
        self.0.list_abandoned(query).await
    }

    async fn get(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        self.0.get(id, now_ms).await
    }

    async fn peek(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        self.0.peek(id, now_ms).await
    }

    async fn table_size(&self, now_ms: u64) -> Result<Option<crate::store::TableSize>, StoreError> {
        self.0.table_size(now_ms).await
    }
}
