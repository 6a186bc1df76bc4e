//! The engine's store, each call timed for the observers and traced in a
//! span of its own: every call the engine makes goes through here, so a
//! new step cannot forget to report one.
//!
//! The span is OpenTelemetry's database client span, through `tracing`
//! (`tracing-opentelemetry` exports it): named `idempotency <operation>`,
//! of kind client, with the semantic conventions' `db.system.name` (the
//! store's [`Store::DB_SYSTEM`]) and `db.operation.name` (the
//! [`StoreOperation`]'s name), and `error.type` (the
//! [`StoreErrorKind`](crate::StoreErrorKind)'s name) with an error status
//! when the call fails. No key, record id or value is an attribute.

use crate::{
    observe::{Event, Observers, StoreOperation},
    store::{
        AbandonedPage, AbandonedQuery, Claim, Commit, Completion, Conditional, Extension,
        OwnerToken, Record, RecordId, RecordedStep, Removal, StepWrite, Store, TableSize,
    },
    StoreError,
};
use std::{
    future::Future,
    pin::Pin,
    task::{ready, Context, Poll},
    time::Instant,
};
use tracing::field;

/// A store whose calls are reported as [`Event::StoreCalled`] and traced;
/// with no observer and no subscriber, a branch and a disabled span a call.
#[derive(Debug)]
pub(super) struct ObservedStore<St> {
    pub(super) store: St,
    observers: Observers,
}

pin_project_lite::pin_project! {
    /// A store call, in its span, timed for the observers: one future
    /// around the store's (an `async fn` in an `Instrumented` would be
    /// two, and the engine's futures are deep enough that the compiler's
    /// layout queries reach their limit in applications that nest them).
    pub(super) struct ObservedCall<'a, F> {
        #[pin]
        call: F,
        span: tracing::Span,
        operation: StoreOperation,
        started: Option<Instant>,
        observers: &'a Observers,
    }
}

impl<T, F: Future<Output = Result<T, StoreError>>> Future for ObservedCall<'_, F> {
    type Output = Result<T, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = {
            let _entered = this.span.enter();
            ready!(this.call.poll(cx))
        };
        if let Err(error) = &result {
            this.span.record("error.type", error.kind().as_str());
            this.span.record("otel.status_code", "ERROR");
        }
        if let Some(started) = this.started {
            this.observers.tell(Event::StoreCalled {
                operation: *this.operation,
                elapsed: started.elapsed(),
                failed: result.as_ref().err().map(StoreError::kind),
            });
        }
        Poll::Ready(result)
    }
}

impl<St: Store> ObservedStore<St> {
    pub(super) fn new(store: St, observers: Observers) -> Self {
        Self { store, observers }
    }

    fn observed<F>(&self, operation: StoreOperation, call: F) -> ObservedCall<'_, F> {
        let span = tracing::info_span!(
            "idempotency.store",
            otel.name = operation.span_name(),
            otel.kind = "client",
            db.system.name = St::DB_SYSTEM,
            db.operation.name = operation.as_str(),
            error.r#type = field::Empty,
            otel.status_code = field::Empty,
        );
        ObservedCall {
            call,
            span,
            operation,
            started: self.observers.any().then(Instant::now),
            observers: &self.observers,
        }
    }

    pub(super) fn claim<'a>(
        &'a self,
        claim: &'a Claim,
    ) -> ObservedCall<'a, impl Future<Output = Result<Conditional, StoreError>> + Send + 'a> {
        self.observed(StoreOperation::Claim, self.store.claim(claim))
    }

    pub(super) fn take_over<'a>(
        &'a self,
        claim: &'a Claim,
        lapsed: &'a OwnerToken,
    ) -> ObservedCall<'a, impl Future<Output = Result<Conditional, StoreError>> + Send + 'a> {
        self.observed(
            StoreOperation::TakeOver,
            self.store.take_over(claim, lapsed),
        )
    }

    pub(super) fn extend<'a>(
        &'a self,
        extension: &'a Extension,
    ) -> ObservedCall<'a, impl Future<Output = Result<Conditional, StoreError>> + Send + 'a> {
        self.observed(StoreOperation::Extend, self.store.extend(extension))
    }

    pub(super) fn complete(
        &self,
        completion: Completion<St::Write>,
    ) -> ObservedCall<'_, impl Future<Output = Result<Conditional, StoreError>> + Send + '_> {
        self.observed(StoreOperation::Complete, self.store.complete(completion))
    }

    pub(super) fn release<'a>(
        &'a self,
        id: &'a RecordId,
        owner: &'a OwnerToken,
    ) -> ObservedCall<'a, impl Future<Output = Result<Conditional, StoreError>> + Send + 'a> {
        self.observed(StoreOperation::Release, self.store.release(id, owner))
    }

    pub(super) fn commit(
        &self,
        commit: Commit<St::Write>,
    ) -> ObservedCall<'_, impl Future<Output = Result<Conditional, StoreError>> + Send + '_> {
        self.observed(StoreOperation::Commit, self.store.commit(commit))
    }

    pub(super) fn remove<'a>(
        &'a self,
        id: &'a RecordId,
        removal: Removal,
    ) -> ObservedCall<'a, impl Future<Output = Result<Conditional, StoreError>> + Send + 'a> {
        self.observed(StoreOperation::Remove, self.store.remove(id, removal))
    }

    pub(super) fn list_in_progress<'a>(
        &'a self,
        prefix: &'a str,
        limit: usize,
    ) -> ObservedCall<'a, impl Future<Output = Result<Vec<Record>, StoreError>> + Send + 'a> {
        self.observed(
            StoreOperation::ListInProgress,
            self.store.list_in_progress(prefix, limit),
        )
    }

    pub(super) fn list_abandoned<'a>(
        &'a self,
        query: &'a AbandonedQuery,
    ) -> ObservedCall<'a, impl Future<Output = Result<AbandonedPage, StoreError>> + Send + 'a> {
        self.observed(
            StoreOperation::ListAbandoned,
            self.store.list_abandoned(query),
        )
    }

    pub(super) fn record_step<'a>(
        &'a self,
        step: &'a StepWrite,
    ) -> ObservedCall<'a, impl Future<Output = Result<Conditional, StoreError>> + Send + 'a> {
        self.observed(StoreOperation::RecordStep, self.store.record_step(step))
    }

    pub(super) fn steps<'a>(
        &'a self,
        id: &'a RecordId,
        now_ms: u64,
    ) -> ObservedCall<'a, impl Future<Output = Result<Vec<RecordedStep>, StoreError>> + Send + 'a>
    {
        self.observed(StoreOperation::Steps, self.store.steps(id, now_ms))
    }

    pub(super) fn table_size(
        &self,
        now_ms: u64,
    ) -> ObservedCall<'_, impl Future<Output = Result<Option<TableSize>, StoreError>> + Send + '_>
    {
        self.observed(StoreOperation::TableSize, self.store.table_size(now_ms))
    }

    pub(super) fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now_ms: u64,
    ) -> ObservedCall<'a, impl Future<Output = Result<Option<Record>, StoreError>> + Send + 'a>
    {
        self.observed(StoreOperation::Get, self.store.get(id, now_ms))
    }

    pub(super) fn peek<'a>(
        &'a self,
        id: &'a RecordId,
        now_ms: u64,
    ) -> ObservedCall<'a, impl Future<Output = Result<Option<Record>, StoreError>> + Send + 'a>
    {
        self.observed(StoreOperation::Peek, self.store.peek(id, now_ms))
    }
}
