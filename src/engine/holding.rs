//! How a claimed key is held while its operation runs: under a lease, a
//! record the store keeps (claimed by a conditional write, extended by the
//! heartbeat, completed or released by fenced writes); or inside one of the
//! store's transactions (the key locked by it, the operation bounded by its
//! time limit, the completion committed with it, a rollback releasing it).
//!
//! The run loop ([`run`](super::run)) is the same for both: the cache, the
//! duplicates of this process, the claim's answers, the operation's errors
//! and panics, the completion and the refusals. Each step where the two
//! differ asks the holding here.

use super::{
    claim::{ClaimError, Claimed},
    claim_handle::ClaimHandle,
    in_transaction::{Completing, InTransaction},
    lease::run_unclaimed,
    outcome::{Outcome, OutcomeKind},
    state::Engine,
};
use crate::{
    store::{Claim, Store},
    Error, StoreError, StoreErrorKind,
};
use futures_util::{future::Either, FutureExt};
use std::{future::Future, panic::AssertUnwindSafe, time::Duration};
use tracing::debug;

/// What an operation returns: its value and its writes, or its error.
pub(super) type Returned<T, W, E> = Result<(T, Vec<W>), E>;

/// How the key a run claims is held while its operation runs.
pub(super) enum Holding<'t, W> {
    /// A record in the store under a lease.
    Lease,
    /// A transaction of the store's (boxed: the lease's runs, every
    /// request's, keep their futures small).
    Transaction(Box<InTransaction<'t, W>>),
}

impl<W: 'static> Holding<'_, W> {
    /// How long a duplicate of a run of this process waits on it in memory
    /// by default: as the attempt says; in a transaction, as long as it
    /// would wait on the transaction's lock otherwise.
    pub(super) fn wait_in_process(&self, asked: Option<Duration>) -> Option<Duration> {
        match self {
            Holding::Lease => asked,
            Holding::Transaction(held) => Some(asked.unwrap_or(held.claim_wait())),
        }
    }

    /// Whether a claim answered late may have lost its key: a lease may
    /// have passed; a transaction's lock holds as long as it does.
    pub(super) fn has_lease(&self) -> bool {
        matches!(self, Holding::Lease)
    }
}

impl<St: Store> Engine<St> {
    /// Claims the key: a conditional write, or a claim inside a new
    /// transaction (which a claim that is not this attempt's rolls back).
    //
    // Not an `async fn`, nor are the other steps every run takes: the
    // lease's future is returned as it is, and every request's future
    // holds no second copy of what it captures.
    pub(super) fn claim_held<'a, 't>(
        &'a self,
        holding: &'a mut Holding<'t, St::Write>,
        claim: &'a mut Claim,
    ) -> impl Future<Output = Result<Claimed, ClaimError>> + use<'a, 't, St> {
        match holding {
            Holding::Lease => Either::Left(self.claim(claim)),
            Holding::Transaction(held) => Either::Right(Box::pin(held.claim(claim))),
        }
    }

    /// The operation's handle to its claim.
    pub(super) fn handle_held(
        &self,
        holding: &Holding<'_, St::Write>,
        claim: &Claim,
    ) -> ClaimHandle {
        match holding {
            Holding::Lease => self.handle(claim),
            Holding::Transaction(held) => held.handle(claim),
        }
    }

    /// Runs the operation while the key is held: beside the heartbeat
    /// under a lease; within the time limit in a transaction, whose
    /// statements it is handed. Its panic is caught; past the time limit
    /// the answer is the error, the transaction ended.
    pub(super) fn run_held<'a, 't, E, Fut: Future + 'a>(
        &'a self,
        holding: &'a Holding<'t, St::Write>,
        handle: &'a ClaimHandle,
        operation: Fut,
    ) -> impl Future<Output = Result<std::thread::Result<Fut::Output>, Error<E>>> + use<'a, 't, St, E, Fut>
    {
        match holding {
            Holding::Lease => Either::Left(
                AssertUnwindSafe(self.run_claimed(handle, operation))
                    .catch_unwind()
                    .map(Ok),
            ),
            Holding::Transaction(held) => Either::Right(Box::pin(held.bounded(operation))),
        }
    }

    /// Gives the key back so that a retry can run: the claim released (a
    /// takeover's lapsed), or the transaction rolled back.
    pub(super) async fn give_back(&self, holding: &Holding<'_, St::Write>, claim: &Claim) {
        match holding {
            Holding::Lease => self.release(claim).await,
            Holding::Transaction(held) => held.roll_back(claim).await,
        }
    }

    /// Completes the record with the operation's response and writes; a
    /// refused write keeps the key held when the caller answers refusals
    /// (`refusable`), for [`complete_refused`](Engine::complete_refused).
    pub(super) fn complete_held<'a, 't, E>(
        &'a self,
        holding: &'a Holding<'t, St::Write>,
        claim: &'a Claim,
        response: Vec<u8>,
        writes: Vec<St::Write>,
        transactional: bool,
        refusable: bool,
    ) -> impl Future<Output = Result<OutcomeKind, Error<E>>> + use<'a, 't, St, E> {
        match holding {
            Holding::Lease => {
                Either::Left(self.complete(claim, response, writes, transactional, refusable))
            }
            Holding::Transaction(held) => Either::Right(Box::pin(self.complete_in_transaction(
                held,
                claim,
                response,
                Completing::Operation(writes),
            ))),
        }
    }

    /// Completes the record with a refusal's answer, without the writes
    /// that were refused (in a transaction, rolled back to its claim).
    pub(super) async fn complete_refused<E>(
        &self,
        holding: &Holding<'_, St::Write>,
        claim: &Claim,
        response: Vec<u8>,
    ) -> Result<OutcomeKind, Error<E>> {
        match holding {
            Holding::Lease => {
                self.complete(claim, response, Vec::new(), true, false)
                    .await
            }
            Holding::Transaction(held) => {
                Box::pin(self.complete_in_transaction(
                    held,
                    claim,
                    response,
                    Completing::RefusalAnswer,
                ))
                .await
            }
        }
    }

    /// Idempotency is off: the operation runs, and nothing is recorded; in
    /// a transaction, its writes are still committed.
    pub(super) async fn run_disabled<T, E, F, Fut>(
        &self,
        holding: Holding<'_, St::Write>,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Returned<T, St::Write, E>>,
    {
        if let Holding::Transaction(held) = holding {
            return Box::pin(held.run_disabled(operation)).await;
        }
        let (value, writes) = run_unclaimed(operation, None).await?;
        if !writes.is_empty() {
            return Err(Error::WritesNotCommitted(StoreError::new(
                StoreErrorKind::Misconfigured,
                "idempotency is disabled (IDEMPOTENCY_DISABLED=true): the operation ran, and none of its writes was committed",
            )));
        }
        debug!(outcome = "disabled", "idempotency");
        Ok(Outcome::new(value, OutcomeKind::Disabled))
    }
}
