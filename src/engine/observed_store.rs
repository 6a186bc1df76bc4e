//! The engine's store, each call timed for the observers: every call the
//! engine makes goes through here, so a new step cannot forget to report
//! one.

use crate::{
    observe::{Event, Observers, StoreOperation},
    store::{
        Claim, Commit, Completion, Conditional, Extension, OwnerToken, Record, RecordId, Removal,
        Store,
    },
    StoreError,
};
use std::{future::Future, time::Instant};

/// A store whose calls are reported as [`Event::StoreCalled`]; with no
/// observer, a branch a call.
#[derive(Debug)]
pub(super) struct ObservedStore<St> {
    pub(super) store: St,
    observers: Observers,
}

impl<St: Store> ObservedStore<St> {
    pub(super) fn new(store: St, observers: Observers) -> Self {
        Self { store, observers }
    }

    async fn timed<T>(
        &self,
        operation: StoreOperation,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if !self.observers.any() {
            return call.await;
        }
        let started = Instant::now();
        let result = call.await;
        self.observers.tell(Event::StoreCalled {
            operation,
            elapsed: started.elapsed(),
            failed: result.as_ref().err().map(StoreError::kind),
        });
        result
    }

    pub(super) async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
        self.timed(StoreOperation::Claim, self.store.claim(claim))
            .await
    }

    pub(super) async fn take_over(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        self.timed(
            StoreOperation::TakeOver,
            self.store.take_over(claim, lapsed),
        )
        .await
    }

    pub(super) async fn extend(&self, extension: &Extension) -> Result<Conditional, StoreError> {
        self.timed(StoreOperation::Extend, self.store.extend(extension))
            .await
    }

    pub(super) async fn complete(
        &self,
        completion: Completion<St::Write>,
    ) -> Result<Conditional, StoreError> {
        self.timed(StoreOperation::Complete, self.store.complete(completion))
            .await
    }

    pub(super) async fn release(
        &self,
        id: &RecordId,
        owner: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        self.timed(StoreOperation::Release, self.store.release(id, owner))
            .await
    }

    pub(super) async fn commit(
        &self,
        commit: Commit<St::Write>,
    ) -> Result<Conditional, StoreError> {
        self.timed(StoreOperation::Commit, self.store.commit(commit))
            .await
    }

    pub(super) async fn remove(
        &self,
        id: &RecordId,
        removal: Removal,
    ) -> Result<Conditional, StoreError> {
        self.timed(StoreOperation::Remove, self.store.remove(id, removal))
            .await
    }

    pub(super) async fn list_in_progress(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.timed(
            StoreOperation::ListInProgress,
            self.store.list_in_progress(prefix, limit),
        )
        .await
    }

    pub(super) async fn get(
        &self,
        id: &RecordId,
        now_ms: u64,
    ) -> Result<Option<Record>, StoreError> {
        self.timed(StoreOperation::Get, self.store.get(id, now_ms))
            .await
    }

    pub(super) async fn peek(
        &self,
        id: &RecordId,
        now_ms: u64,
    ) -> Result<Option<Record>, StoreError> {
        self.timed(StoreOperation::Peek, self.store.peek(id, now_ms))
            .await
    }
}
