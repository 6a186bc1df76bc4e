//! The engine's side of the protocol split across invocations
//! ([`crate::split`], which durable executions are built on): the claim is
//! made in one invocation and completed in a later one, by the same owner,
//! which a replay proves by its execution rather than by a token it would
//! have had to keep.

use super::{
    builder::MAX_DURATION,
    claim::{ClaimError, Claimed},
    codec::Codec,
    completion::{landed, Lapsing},
    conflicts::retry_conflicts,
    fence::{fence, Fence},
    outcome::OutcomeKind,
    retry_after::RetryHint,
    sealing::stored_form,
    state::{Engine, MIN_LEASE_MS},
};
use crate::{
    clock::duration_ms,
    observe::{Answer, Port},
    split::{SplitAttempt, SplitClaim},
    store::{Claim, Completion, Store},
    Attempt, Error, StoreError,
};
use std::convert::Infallible;
use tracing::warn;

impl<St: Store> Engine<St> {
    /// Claims the key for the execution. The execution's own record (its
    /// claim, landed in an invocation that crashed before the claim was
    /// checkpointed) is its to run; a completed one replays; a live one of
    /// another execution is [`Error::InProgress`]; a claim answered after
    /// its lease passed is given back, [`Error::LeaseLost`].
    pub(crate) async fn claim_split<T>(
        &self,
        attempt: &SplitAttempt,
        codec: &impl Codec<T>,
    ) -> Result<SplitClaim<T>, Error<Infallible>> {
        let started = self.observed_start();
        let claimed = self.claim_split_unreported(attempt, codec).await;
        // The execution's answer, unless the key is its own: then it is
        // answered when it completes.
        if let Some(started) = started {
            let answer = match &claimed {
                Ok(SplitClaim::Ours) => None,
                Ok(SplitClaim::Replay(_)) => Some(Answer::Outcome(OutcomeKind::Replay)),
                Ok(SplitClaim::Disabled) => Some(Answer::Outcome(OutcomeKind::Disabled)),
                Err(error) => Some(Answer::Error(error.kind())),
            };
            if let Some(answer) = answer {
                self.report(Port::Durable, started, answer);
            }
        }
        claimed
    }

    async fn claim_split_unreported<T>(
        &self,
        attempt: &SplitAttempt,
        codec: &impl Codec<T>,
    ) -> Result<SplitClaim<T>, Error<Infallible>> {
        let inner = &*self.inner;
        if inner.disabled {
            return Ok(SplitClaim::Disabled);
        }
        let mut claim = self.split_claim(attempt).map_err(Error::Store)?;
        let began = tokio::time::Instant::now();
        match self.claim(&mut claim).await {
            // Answered after its lease passed (or with too little left), as
            // a run's claim: given back, and the caller claims again.
            Ok(Claimed::Ours) => self
                .started_in_time(&claim, began)
                .await
                .map(|()| SplitClaim::Ours),
            Ok(Claimed::Held(record)) => {
                let record = if self.encrypts() {
                    Box::pin(self.opened(record, &attempt.fingerprint))
                        .await
                        .map_err(Error::Store)?
                } else {
                    record
                };
                self.existing_with(
                    record,
                    codec,
                    &attempt.fingerprint,
                    RetryHint::Lease,
                    claim.now_ms,
                )
                .map(|outcome| SplitClaim::Replay(outcome.into_value()))
            }
            Err(ClaimError::Outage(error) | ClaimError::Failed(error)) => Err(Error::Store(error)),
        }
    }

    /// Completes the execution's claim with its value. A completion that
    /// finds the record completed by this execution already (its answer
    /// was lost) is done; one that finds the claim taken over is
    /// [`OutcomeKind::LeaseLost`]; a store failure is returned, for the
    /// durable step to try again.
    pub(crate) async fn complete_split(
        &self,
        attempt: &SplitAttempt,
        response: Vec<u8>,
    ) -> Result<OutcomeKind, StoreError> {
        let started = self.observed_start();
        let completed = self.complete_split_unreported(attempt, response).await;
        if let Some(started) = started {
            let answer = match &completed {
                Ok(kind) => Answer::Outcome(*kind),
                Err(error) => Answer::Error(crate::ErrorKind::of_store(error.kind())),
            };
            self.report(Port::Durable, started, answer);
        }
        completed
    }

    async fn complete_split_unreported(
        &self,
        attempt: &SplitAttempt,
        response: Vec<u8>,
    ) -> Result<OutcomeKind, StoreError> {
        let id = self.record_id(&attempt.scope, &attempt.key);
        let now_ms = self.inner.clock.now_ms();
        let expiration_s = self.expiration_s(now_ms);
        let sealed = if self.encrypts() {
            Box::pin(self.sealed(&id, &attempt.fingerprint, expiration_s, &response)).await?
        } else {
            None
        };
        let completion = Completion {
            id: id.clone(),
            owner: attempt.owner.clone(),
            response: match sealed {
                None => response,
                sealed => stored_form(sealed, &response),
            },
            now_ms,
            expiration_s,
            writes: Vec::new(),
        };
        let found = retry_conflicts(|| self.inner.store.complete(completion.clone())).await?;
        if landed(found, &completion.owner, completion.now_ms) {
            return Ok(OutcomeKind::Fresh);
        }
        warn!(record = %id, outcome = "lease_lost",
            "the durable execution outlived its claim (execution_timeout) and the key was taken over; its output is not stored");
        Ok(OutcomeKind::LeaseLost)
    }

    /// Releases the execution's claim: it failed, and a new execution may
    /// run the key. A claim that is gone, or another's, is left alone.
    ///
    /// A takeover's claim is not deleted, as [`release`](Engine::release)
    /// does not delete one: its record is read (the execution keeps no
    /// attempt count across invocations), and a takeover's lease is ended
    /// instead, so that the next execution runs at once, told that earlier
    /// attempts may have acted.
    pub(crate) async fn release_split(&self, attempt: &SplitAttempt) -> Result<(), StoreError> {
        let id = self.record_id(&attempt.scope, &attempt.key);
        let now_ms = self.inner.clock.now_ms();
        let found = self.inner.store.get(&id, now_ms).await?;
        match found {
            // The execution's own takeover, its lease passed or not.
            Some(record)
                if record.attempt > 1
                    && record.owner == attempt.owner
                    && matches!(
                        fence(Some(&record), &attempt.owner, now_ms),
                        Fence::OwnClaim | Fence::Lapsed
                    ) =>
            {
                let claim = Lapsing {
                    id: &record.id,
                    owner: &record.owner,
                    lease_until_ms: record.lease_until_ms.unwrap_or(now_ms),
                    expiration_s: record.expiration_s,
                };
                let lapse = self.lapse(claim, now_ms);
                retry_conflicts(|| self.inner.store.extend(&lapse))
                    .await
                    .map(|_| ())
            }
            _ => retry_conflicts(|| self.inner.store.release(&id, &attempt.owner))
                .await
                .map(|_| ()),
        }
    }

    fn split_claim(&self, attempt: &SplitAttempt) -> Result<Claim, StoreError> {
        let now_ms = self.inner.clock.now_ms();
        let id = self.record_id(&attempt.scope, &attempt.key);
        let generic = Attempt::new(&attempt.scope, &attempt.key, attempt.fingerprint.clone());
        let mut claim = self.claim_for(id, &generic, now_ms)?;
        claim.owner = attempt.owner.clone();
        // Not capped by max_lease: no heartbeat can run while the
        // execution is suspended.
        claim.lease_until_ms = now_ms
            .saturating_add(duration_ms(attempt.lease.min(MAX_DURATION)))
            .max(now_ms.saturating_add(MIN_LEASE_MS));
        claim.expiration_s = claim.expiration_s.max(claim.lease_until_ms / 1000 + 1);
        Ok(claim)
    }
}
