//! The run loop behind every entry point: claim, run under the claim,
//! then complete or release; the same whether the key is held under a
//! lease or inside a store transaction ([`holding`](super::holding)).

use super::{
    attempt::Attempt,
    claim::{ClaimError, Claimed},
    claim_handle::ClaimHandle,
    codec::{self, Codec},
    holding::{Holding, Returned},
    lease::run_unclaimed,
    local_runs::{Ended, LocalRun},
    mode::Mode,
    outcome::{Outcome, OutcomeKind},
    panic::panic_message,
    state::{Engine, MIN_LEASE_MS},
};
use crate::{
    store::{Claim, Extension, Store},
    Error, StoreError, StoreErrorKind,
};
use std::{
    future::Future,
    panic::{catch_unwind, AssertUnwindSafe},
    time::Duration,
};
use tracing::{debug, warn};

/// An operation starts only with at least this much of its lease left (its
/// claim's `now`, plus how long the claim took): a claim answered later than
/// that is given back and answered [`Error::LeaseLost`] (the caller
/// retries).
pub(super) const START_MARGIN_MS: u64 = MIN_LEASE_MS / 10;

/// What the claim step decided.
enum ClaimStep<T, E> {
    /// The key is this attempt's: run.
    Ours,
    /// The attempt is answered without running (a replay, a mismatch, in
    /// progress, a store error).
    Answered(Result<Outcome<T>, Error<E>>),
    /// The store is down and the engine fails open: run unprotected.
    Unprotected(StoreError),
}

/// What running the operation under its claim gave: its value, its writes
/// and the value encoded for the store.
type Settled<T, W> = (T, Vec<W>, Result<Vec<u8>, crate::error::BoxError>);

impl<St: Store> Engine<St> {
    pub(super) async fn run_unreported<T, E, C, R, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        mode: Mode,
        codec: &C,
        refusal: R,
        mut holding: Holding<'_, St::Write>,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        R: FnOnce(&crate::WriteRefusal) -> Option<Result<T, E>>,
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        // Paths taken rarely (an error, a panic, a late claim, a refused
        // write) are awaited boxed: this future, which every request
        // allocates and moves, then holds no room for them. (An operation
        // run without a claim, idempotency off or failing open, is boxed
        // where it is made, in `run_unclaimed`.)
        if self.inner.disabled {
            return Box::pin(self.run_disabled(holding, operation)).await;
        }
        let mut claim = match self.claim_unless_cached(attempt, codec) {
            Ok(claim) => claim,
            Err(answer) => return answer,
        };
        let waits_until = holding
            .wait_in_process(attempt.wait_in_process)
            .map(|budget| tokio::time::Instant::now() + budget);
        let began = loop {
            // A run of the key under way in this process answers a
            // duplicate here, without a store call (or after waiting on
            // it, in memory). One that ended without completing here
            // leaves the key to be claimed, from now.
            if let Some(run) = self.local_runs().get(&claim.id) {
                let answered =
                    Box::pin(self.after_local_run(&run, attempt, waits_until, codec)).await;
                if let Some(answer) = answered {
                    return answer;
                }
                claim = match self.claim_unless_cached(attempt, codec) {
                    Ok(claim) => claim,
                    Err(answer) => return answer,
                };
            }
            // How long the claim takes, measured apart from `clock`, which
            // gives the wall-clock instants that leases are written in.
            let began = tokio::time::Instant::now();
            let claimed = self.claim_held(&mut holding, &mut claim).await;
            // A record that holds the key, its response opened.
            // Not boxed: opening with a key at hand allocates nothing, and
            // its future is a small part of this one.
            let claimed = if self.encrypts() {
                self.opened_claim(claimed, &attempt.fingerprint).await
            } else {
                claimed
            };
            match self.claim_step(&claim, claimed, attempt, mode, codec) {
                ClaimStep::Ours => break began,
                // Another duplicate of this process took the key as the run
                // this one waited on ended: wait on that one in turn.
                // Only a run whose lease stands: one past it has just sent
                // this attempt to the store, and would again at once.
                ClaimStep::Answered(Err(Error::InProgress { .. }))
                    if waits_until.is_some_and(|until| tokio::time::Instant::now() < until)
                        && self
                            .local_runs()
                            .get(&claim.id)
                            .is_some_and(|run| run.lease_until_ms() > self.now_ms()) =>
                {
                    continue
                }
                ClaimStep::Answered(answer) => return answer,
                ClaimStep::Unprotected(error) => {
                    return self
                        .run_unprotected(&claim, attempt, error, operation)
                        .await
                }
            }
        };
        if holding.has_lease() {
            self.started_in_time(&claim, began).await?;
        }
        // The operation runs here, not in a function of its own, whose
        // level every operation's future would nest one deeper, against
        // the compiler's recursion limit. The closure is called inside the
        // same guard as its future: one that panics before it returns its
        // future is that future's panic. It is boxed where it is made: an
        // operation's future (an HTTP handler's and the reading of its
        // response, some kilobytes) would otherwise be copied whole at each
        // of the moves below, and this future would hold room for it.
        let handle = self.handle_held(&holding, &claim);
        // Until this returns: its duplicates in this process wait on it.
        let _running = self.local_runs().start(&claim, &handle);
        let started = catch_unwind(AssertUnwindSafe(|| {
            Box::pin(handle.clone().scope(operation(handle.clone())))
        }));
        let ran = match started {
            Ok(operation) => self.run_held(&holding, &handle, operation).await?,
            Err(panic) => Err(panic),
        };
        let (value, writes, response) = self.settle(&holding, &claim, attempt, codec, ran).await?;
        // Stored with its writes; awaited here too, as the deepest store
        // calls (a refusal's completion or release) would nest under a
        // function of its own.
        let transactional = mode == Mode::Transactional || !writes.is_empty();
        let response = match response {
            Ok(response) => response,
            Err(error) if transactional => {
                Box::pin(self.give_back(&holding, &claim)).await;
                return Err(Error::Store(codec::unserialisable(error)));
            }
            Err(error) => {
                warn!(record = %claim.id, outcome = "not_recorded", %error,
                    "the operation's value could not be serialised; it is returned but not stored, and its claim holds the key until the record expires (retries are told it is in progress)");
                Box::pin(self.hold_until_expiry(&claim)).await;
                return Ok(Outcome::new(value, OutcomeKind::NotRecorded));
            }
        };
        let refusable = !writes.is_empty();
        match self
            .complete_held(&holding, &claim, response, writes, transactional, refusable)
            .await
        {
            Ok(kind) => Ok(Outcome::new(value, kind)),
            Err(Error::Store(error)) if refusable && error.write_refusal().is_some() => {
                Box::pin(self.answer_refusal(&holding, claim, codec, refusal, error)).await
            }
            Err(error) => Err(error),
        }
    }

    /// A duplicate of a run under way in this process: answered as the
    /// store would answer its claim (a mismatch, in progress) without
    /// asking it; when it may wait `until` then, once the run has ended
    /// (its replay), or when the wait is spent (in progress). `None` when the
    /// store must decide: the run ended without completing here (the key
    /// may be free), or its lease has passed (the key may be taken over, as
    /// from a run elsewhere that outlived its lease).
    pub(crate) async fn after_local_run<T, E, C: Codec<T>>(
        &self,
        run: &LocalRun,
        attempt: &Attempt<'_>,
        until: Option<tokio::time::Instant>,
        codec: &C,
    ) -> Option<Result<Outcome<T>, Error<E>>> {
        let until = until.filter(|_| *run.fingerprint() == attempt.fingerprint);
        loop {
            // Past its lease (as last extended), the store decides.
            let lease_left_ms = run
                .lease_until_ms()
                .checked_sub(self.now_ms())
                .filter(|left| *left > 0)?;
            let budget = until
                .map(|until| until.saturating_duration_since(tokio::time::Instant::now()))
                .filter(|left| !left.is_zero());
            let Some(budget) = budget else {
                return Some(self.existing(run.in_progress(), codec, attempt, self.now_ms()));
            };
            // Within the lease as it stands: the heartbeat may extend it,
            // and the wait goes on as long as it does, within the budget.
            let budget = budget.min(Duration::from_millis(lease_left_ms));
            match run.wait(self.local_runs(), budget).await {
                Some(Ended::Completed(record)) => {
                    return Some(self.existing(record, codec, attempt, self.now_ms()))
                }
                Some(Ended::Other) => return None,
                None => {}
            }
        }
    }

    /// What the claim decided for the attempt: run; an answer without
    /// running (a live record, or a failure that leaves no claim); or run
    /// unprotected, failing open. (The claim is awaited by the caller, as
    /// it nests the deepest store calls.)
    fn claim_step<T, E, C: Codec<T>>(
        &self,
        claim: &Claim,
        claimed: Result<Claimed, ClaimError>,
        attempt: &Attempt<'_>,
        mode: Mode,
        codec: &C,
    ) -> ClaimStep<T, E> {
        let now_ms = claim.now_ms;
        match claimed {
            Ok(Claimed::Ours) => ClaimStep::Ours,
            Ok(Claimed::Held(record)) => {
                ClaimStep::Answered(self.existing(record, codec, attempt, now_ms))
            }
            Err(ClaimError::Outage(error))
                if self.inner.fail_open
                    && mode != Mode::Transactional
                    && !attempt.caution.fail_closed =>
            {
                ClaimStep::Unprotected(error)
            }
            // Duplicates raced for the key and none of them could tell
            // who holds it: the caller retries, as for a claim in progress.
            Err(ClaimError::Failed(error)) if error.kind() == StoreErrorKind::Conflict => {
                debug!(record = %claim.id, outcome = "in_progress", %error, "idempotency");
                ClaimStep::Answered(Err(Error::InProgress {
                    retry_after: Duration::from_secs(1),
                }))
            }
            Err(ClaimError::Outage(error) | ClaimError::Failed(error)) => {
                warn!(record = %claim.id, outcome = "store_error", kind = error.kind().as_str(), %error, "idempotency claim failed");
                ClaimStep::Answered(Err(Error::Store(error)))
            }
        }
    }

    /// Fail-open through a store outage: the operation runs without a claim.
    async fn run_unprotected<T, E, F, Fut>(
        &self,
        claim: &Claim,
        attempt: &Attempt<'_>,
        error: StoreError,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        warn!(record = %claim.id, outcome = "unprotected", %error,
            "idempotency store unavailable; running WITHOUT idempotency (fail-open)");
        let (value, writes) = run_unclaimed(operation, attempt.taking_over).await?;
        if !writes.is_empty() {
            // Its writes need the store that just failed: they are not
            // committed, so the value must not be reported.
            warn!(record = %claim.id, outcome = "writes_not_committed",
                "an operation with writes ran during a store outage (fail-open); none of its writes was committed; declare it transactional");
            return Err(Error::WritesNotCommitted(error));
        }
        Ok(Outcome::new(value, OutcomeKind::Unprotected))
    }

    /// A claim answered late (a slow network, an SDK's retries) may hold a
    /// lease that has passed, or is about to: its operation would run as a
    /// zombie from its first instant, beside whichever attempt takes the
    /// key over. It does not run; the claim is given back (fenced, so
    /// nothing another attempt now owns is touched), and the caller
    /// retries. The time is the claim's `now` plus how long the claim took
    /// by a monotonic clock (tokio's, which paused tests move), so a wall
    /// clock stepped meanwhile, or a test clock that moves on every read,
    /// does not decide it.
    pub(super) async fn started_in_time<E>(
        &self,
        claim: &Claim,
        began: tokio::time::Instant,
    ) -> Result<(), Error<E>> {
        let took_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
        let started_ms = claim.now_ms.saturating_add(took_ms);
        if claim.lease_until_ms >= started_ms.saturating_add(START_MARGIN_MS) {
            return Ok(());
        }
        warn!(record = %claim.id, outcome = "lease_lost", lease_until_ms = claim.lease_until_ms, now_ms = started_ms,
            "the claim was answered after its lease had passed (or with too little of it left); the operation did not run");
        Box::pin(self.release(claim)).await;
        Err(Error::LeaseLost)
    }

    /// What the operation's run under its claim came to: its value, with
    /// its writes and its encoding (guarded too: a `Serialize` that panics
    /// must not keep the claim either); or its error, and the claim
    /// released; or its panic, raised again, the claim released (or kept,
    /// if the attempt asked to).
    /// Holds `claim` until its record expires: the operation ran and its
    /// value cannot be stored, so no retry may run it again within the
    /// retention (as after any run). A claim lost meanwhile, or an
    /// extension that fails, leaves it to lapse at its lease.
    async fn hold_until_expiry(&self, claim: &Claim) {
        let extension = Extension {
            id: claim.id.clone(),
            owner: claim.owner.clone(),
            lease_until_ms: claim.expiration_s.saturating_mul(1000),
            expiration_s: claim.expiration_s,
            now_ms: self.inner.clock.now_ms(),
        };
        let held = super::conflicts::retry_conflicts(|| self.inner.store.extend(&extension)).await;
        if !matches!(held, Ok(crate::store::Conditional::Applied)) {
            warn!(record = %claim.id, answer = ?held,
                "the claim of a value that could not be stored was not held until its expiry; it lapses at its lease");
        }
    }

    async fn settle<T, E, C: Codec<T>>(
        &self,
        holding: &Holding<'_, St::Write>,
        claim: &Claim,
        attempt: &Attempt<'_>,
        codec: &C,
        ran: std::thread::Result<Returned<T, St::Write, E>>,
    ) -> Result<Settled<T, St::Write>, Error<E>> {
        let ran = ran.map(|ran| match ran {
            // A codec that panics (a redaction's function) did not run the
            // operation: its value cannot be stored, as one that does not
            // encode, and the claim is kept (releasing it would let a retry
            // run the operation again).
            Ok((value, writes)) => {
                let response = catch_unwind(AssertUnwindSafe(|| codec.encode(&value)))
                    .unwrap_or_else(|panic| {
                        Err(format!("the codec panicked: {}", panic_message(&*panic)).into())
                    });
                Ok((value, writes, response))
            }
            Err(error) => Err(error),
        });
        match ran {
            Ok(Ok(ran)) => Ok(ran),
            Ok(Err(error)) => {
                Box::pin(self.give_back(holding, claim)).await;
                debug!(record = %claim.id, outcome = "operation_error", "idempotency");
                Err(Error::Operation(error))
            }
            // A transaction cannot keep its claim: it rolls back as the
            // invocation dies.
            Err(panic) if attempt.caution.keep_claim_on_panic && holding.has_lease() => {
                warn!(record = %claim.id, outcome = "panicked", panic = panic_message(&*panic),
                    "the operation panicked and may have acted; its claim is kept until its lease passes, and the next attempt is a takeover");
                std::panic::resume_unwind(panic);
            }
            Err(panic) => {
                // The invocation is dying, but a retry need not wait for
                // its lease: Powertools deletes the claim on any exception.
                warn!(record = %claim.id, outcome = "panicked", panic = panic_message(&*panic),
                    "the operation panicked; its claim is released so that a retry can run it");
                Box::pin(self.give_back(holding, claim)).await;
                std::panic::resume_unwind(panic);
            }
        }
    }

    /// A refused write, its claim still held: answered as `refusal`
    /// decides (the answer completed without writes, or the claim
    /// released).
    async fn answer_refusal<T, E, C, R>(
        &self,
        holding: &Holding<'_, St::Write>,
        claim: Claim,
        codec: &C,
        refusal: R,
        error: StoreError,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        R: FnOnce(&crate::WriteRefusal) -> Option<Result<T, E>>,
    {
        let answer = error.write_refusal().and_then(refusal);
        match answer {
            Some(Ok(answer)) => match codec.encode(&answer) {
                Ok(response) => {
                    debug!(record = %claim.id, outcome = "refused", "a write was refused: its answer is stored");
                    self.complete_refused(holding, &claim, response)
                        .await
                        .map(|kind| Outcome::new(answer, kind))
                }
                Err(encoding) => {
                    Box::pin(self.give_back(holding, &claim)).await;
                    Err(Error::Store(codec::unserialisable(encoding)))
                }
            },
            Some(Err(answer)) => {
                Box::pin(self.give_back(holding, &claim)).await;
                Err(Error::Operation(answer))
            }
            None => {
                warn!(record = %claim.id, outcome = "store_error", %error,
                    "transactional completion failed; releasing the claim");
                Box::pin(self.give_back(holding, &claim)).await;
                Err(Error::Store(error))
            }
        }
    }
}
