//! The engine's entry points: an operation run at most once per key, in
//! each of the forms callers need (plain, detached from its caller, with a
//! codec, transactional, and the general form adapters call).

use super::{
    alert,
    attempt::{Attempt, OwnedAttempt},
    claim_handle::ClaimHandle,
    codec::{Codec, Json},
    detach::detached,
    holding::Holding,
    mode::Mode,
    outcome::Outcome,
    state::Engine,
};
use crate::{store::Store, Error, StoreError, StoreErrorKind};
use futures_util::FutureExt;
use serde::{de::DeserializeOwned, Serialize};
use std::future::Future;

impl<St: Store> Engine<St> {
    /// Runs `operation` at most once for the attempt's scoped key.
    ///
    /// - The first attempt claims the key, runs the operation, stores its
    ///   value (serialised as JSON) and returns it as
    ///   [`OutcomeKind::Fresh`](crate::OutcomeKind::Fresh).
    /// - Later attempts with the same payload get the stored value as a
    ///   [`OutcomeKind::Replay`](crate::OutcomeKind::Replay) without running anything; with another
    ///   payload, [`Error::KeyReused`].
    /// - While another attempt holds the claim: [`Error::InProgress`], with
    ///   the time left on its lease.
    /// - If the operation fails, its claim is released and its error comes
    ///   back as [`Error::Operation`]; the next attempt runs it again.
    /// - If the store cannot be reached, the operation does not run:
    ///   [`Error::Store`] (unless the engine fails open).
    /// - If the claim is answered only after its lease has passed (or with
    ///   less than 100 ms of it left), the operation does not run: the
    ///   claim is given back and the caller gets [`Error::LeaseLost`], to
    ///   retry.
    ///
    /// # When this future is dropped
    ///
    /// The operation runs inside this future: dropped (a client that
    /// disconnects from a server, a `tokio::time::timeout`, a `select!`
    /// that another branch won), it stops where it was, and its claim stays
    /// in progress until its lease lapses; then a retry runs it again, after
    /// whatever the first run did. The claim is not released on drop, since
    /// an operation that had acted would then run again at once. Where the
    /// caller may give up, call [`execute_detached`](Engine::execute_detached):
    /// the operation runs to its end whatever happens to the caller. (In
    /// Lambda nothing drops an invocation's future.)
    pub async fn execute<T, E, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.execute_with(attempt, &Json, operation).await
    }

    /// Like [`execute`](Engine::execute), detached from the caller from the
    /// claim to the completion: dropping this future (a client that left, a
    /// timeout) neither stops the operation nor leaves its claim in
    /// progress, so a retry gets its outcome rather than running it again
    /// once the lease lapses. The work is polled once in place and, if it
    /// waits for anything, moved to a task of its own in that same poll (a
    /// replay costs no task). Task-locals of the caller are therefore set
    /// in the operation until it first waits, and not after: pass values in
    /// its closure instead. A panic in the operation releases its claim and
    /// is raised again here. Needs a tokio runtime (without one it runs in
    /// place, as `execute` does).
    ///
    /// ```
    /// use lambda_idempotency::{Attempt, Engine, Fingerprint, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let engine = Engine::builder(MemoryStore::new()).build();
    /// let attempt = Attempt::new("tenant-1", "order-42", Fingerprint::of_json(&1250)?);
    /// let charge = engine
    ///     .execute_detached(&attempt, || async { Ok::<_, std::io::Error>("ch_1".to_owned()) })
    ///     .await?;
    /// assert_eq!(charge.into_value(), "ch_1");
    /// # Ok(()) }
    /// ```
    pub async fn execute_detached<T, E, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        E: Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        self.execute_detached_with(attempt, Json, operation).await
    }

    /// Like [`execute_detached`](Engine::execute_detached), with values
    /// stored by `codec` rather than as JSON (a [`Redact`](crate::Redact)
    /// or [`RedactedJson`](crate::RedactedJson) that keeps a secret out of
    /// the record): the codec moves into the detached work.
    pub async fn execute_detached_with<T, E, C, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        codec: C,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        T: Send + 'static,
        E: Send + 'static,
        C: Codec<T> + Send + Sync + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let engine = self.clone();
        let owned = OwnedAttempt::from(attempt);
        let work = async move {
            engine
                .execute_with(&owned.attempt(), &codec, operation)
                .await
        };
        detached(Box::pin(work))
            .await
            .unwrap_or_else(|| {
                Err(Error::Store(StoreError::new(
                    StoreErrorKind::Other,
                    "the runtime shut down while the operation ran; its claim stays in progress until its lease lapses",
                )))
            })
    }

    /// Like [`execute`](Engine::execute), with values stored by `codec`
    /// rather than as JSON.
    pub async fn execute_with<T, E, C, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        codec: &C,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run(attempt, Mode::Plain, codec, |_| async {
            operation().await.map(|value| (value, Vec::new()))
        })
        .await
    }

    /// Like [`execute`](Engine::execute), but the operation also returns
    /// writes (for the DynamoDB store, `TransactWriteItem`s)
    /// that commit in one transaction with the fenced completion: the
    /// business effect and the completed record become visible together or
    /// not at all.
    ///
    /// So, unlike [`execute`](Engine::execute), an outcome that cannot be
    /// stored is an error, because its writes did not happen either:
    /// [`Error::LeaseLost`] when the lease passed and another attempt
    /// took the key over, [`Error::Store`] when the store failed or rejected
    /// one of the writes (then the claim is released, so a retry can run).
    /// This is [`run`](Engine::run) in [`Mode::Transactional`].
    pub async fn execute_transactional<T, E, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        self.run(attempt, Mode::Transactional, &Json, |_| operation())
            .await
    }

    /// The single entry point the other `execute` methods and the adapters
    /// (the HTTP layer, the event consumers) call; use it to write an
    /// adapter of your own.
    ///
    /// `operation` gets a [`ClaimHandle`] (is this a [`Takeover`](crate::Takeover) of a
    /// lapsed claim, whose attempt may have acted? extend the lease, learn
    /// that it was lost) and returns its value and the writes to commit with
    /// the completion (an empty `Vec` for none); `codec` stores the value.
    /// The mode says what happens when the outcome cannot be stored (see
    /// [`Mode`]); an operation that returns writes is run as
    /// [`Mode::Transactional`] whatever the mode says, since its writes
    /// exist only if the completion commits.
    pub async fn run<T, E, C, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        mode: Mode,
        codec: &C,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        self.run_with_refusals(attempt, mode, codec, |_| None, operation)
            .await
    }

    /// Like [`run`](Engine::run), with business-rule refusals of the
    /// operation's writes answered rather than failed: when the store
    /// refuses one of the writes committed with the completion (a
    /// PostgreSQL constraint or SQLSTATE, a DynamoDB condition on a
    /// business item: a [`WriteRefusal`](crate::WriteRefusal)), `refusal`
    /// decides. `Some(Ok(value))`: `value` is the outcome, stored (without
    /// any write) and replayed like any other; `Some(Err(error))`: the claim
    /// is released and the caller gets [`Error::Operation`]; `None`: a
    /// fault, as with `run` ([`Error::Store`], claim released).
    //
    // A plain function: the run's future, with the alert as it resolves,
    // is what it returns, not a level of its own that every request's
    // future would nest (and copy the run's whole into as it awaits it).
    pub fn run_with_refusals<'a, T, E, C, R, F, Fut>(
        &'a self,
        attempt: &'a Attempt<'_>,
        mode: Mode,
        codec: &'a C,
        refusal: R,
        operation: F,
    ) -> impl Future<Output = Result<Outcome<T>, Error<E>>> + 'a
    where
        T: 'a,
        E: 'a,
        C: Codec<T>,
        R: FnOnce(&crate::WriteRefusal) -> Option<Result<T, E>> + 'a,
        F: FnOnce(ClaimHandle) -> Fut + 'a,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>> + 'a,
    {
        let started = self.observed_start();
        self.run_unreported(attempt, mode, codec, refusal, Holding::Lease, operation)
            .inspect(move |result| {
                alert::operator_must_act(result);
                self.report_answer(attempt, started, result);
            })
    }
}
