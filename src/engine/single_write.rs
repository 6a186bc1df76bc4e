//! The single write: the operation runs first, then its value and writes
//! commit in one store write conditioned as a claim is.

use super::{
    alert,
    claim_handle::ClaimHandle,
    codec::{self, Codec},
    conflicts::Contention,
    fence::{fence, Fence},
    holding::Holding,
    lease::run_unclaimed,
    outcome::{Outcome, OutcomeKind},
    sealing::{changed_completion, stored_form},
    state::Engine,
};
use crate::{
    store::{Commit, Conditional, OwnerToken, RecordId, Store},
    Attempt, Error, StoreErrorKind,
};
use std::{future::Future, time::Duration};
use tracing::{debug, warn};

impl<St: Store> Engine<St> {
    /// Runs `operation` and commits its value and writes in **one** store
    /// write (for DynamoDB, one `TransactWriteItems`, or one `PutItem`
    /// without writes), conditioned as a claim is: no claim before it, so a
    /// first call costs one round trip instead of two.
    ///
    /// **Only for operations whose sole effect is the writes they return.**
    /// Concurrent duplicates may each run the operation; one commits, and
    /// the others get its stored value as a replay (or a 422 for another
    /// payload). Even a retry of a completed request runs the operation
    /// before learning that it is a replay (unless the engine reads first,
    /// [`read_before_claim`](crate::EngineBuilder::read_before_claim), and
    /// the read sees the completion). So an operation that calls a
    /// payment provider, sends a message or writes outside its returned
    /// writes must use [`run`](Engine::run) instead.
    ///
    /// A record in progress under a claim (made by another entry point)
    /// answers [`Error::InProgress`]; a lapsed claim is replaced. A
    /// transaction conflict with a concurrent duplicate is tried again, a
    /// few times with jitter, then settled by a consistent read. A commit
    /// that fails is an error ([`Error::Store`]): nothing was written,
    /// unless the store's answer was lost after the commit landed (an
    /// outage's kind: [`StoreErrorKind::is_outage`]), and then the retry
    /// replays it. The
    /// operation gets a [`ClaimHandle`] without a claim (no lease to
    /// extend; a takeover only of an attempt outside this crate's records,
    /// [`Attempt::taking_over`]).
    ///
    /// Only stores whose [`Store::SINGLE_WRITE`] is `true` have it: using it
    /// with another store does not compile.
    pub async fn run_single_write<T, E, C, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        codec: &C,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        const {
            assert!(
                St::SINGLE_WRITE,
                "this store cannot commit in a single write: use Engine::run"
            )
        };
        let result = self.single_write(attempt, codec, operation).await;
        alert::operator_must_act(&result);
        result
    }

    /// The single-write protocol; callers have checked
    /// [`Store::SINGLE_WRITE`] at compile time. Its answer is reported to
    /// the observers.
    pub(crate) async fn single_write<T, E, C, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        codec: &C,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        let started = self.observed_start();
        let result = self
            .single_write_unreported(attempt, codec, operation)
            .await;
        self.report_answer(attempt, started, &result);
        result
    }

    async fn single_write_unreported<T, E, C, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        codec: &C,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        let inner = &*self.inner;
        if inner.disabled {
            return self.run_disabled(Holding::Lease, operation).await;
        }
        let id = self.record_id(attempt.scope, attempt.key);
        if let Some(replay) = self.cached_replay(&id, attempt, codec, inner.clock.now_ms()) {
            return replay;
        }
        // A completed record read first answers without running the
        // operation at all.
        let now_ms = inner.clock.now_ms();
        // A record to open is awaited boxed, and outside the match that
        // found it, as every open below: this future then holds a pointer
        // for it, not the record.
        let opening = match self.completed_before_claim(&id, now_ms).await {
            Some(record) if self.encrypts() => {
                Some(Box::pin(self.opened(record, &attempt.fingerprint)))
            }
            Some(record) => return self.existing(record, codec, attempt, now_ms),
            None => None,
        };
        if let Some(opening) = opening {
            return self.existing(opening.await?, codec, attempt, now_ms);
        }
        let (value, writes) = run_unclaimed(operation, attempt.taking_over).await?;
        let response = codec
            .encode(&value)
            .map_err(|error| Error::Store(codec::unserialisable(error)))?;
        let mut contention = Contention::default();
        // The last try's token: a read after the tries may find its commit.
        let mut owner = OwnerToken::generate().map_err(Error::Store)?;
        while contention.may_try() {
            let now_ms = inner.clock.now_ms();
            // A fresh token per try: a retried transaction with other
            // parameters must not reuse one.
            owner = OwnerToken::generate().map_err(Error::Store)?;
            let expiration_s = self.expiration_s(now_ms);
            // Sealed for this try's expiry, which it is bound to.
            #[cfg(feature = "encryption")]
            let sealed = if self.encrypts() {
                Box::pin(self.sealed(&id, &attempt.fingerprint, expiration_s, &response))
                    .await
                    .map_err(Error::Store)?
            } else {
                None
            };
            #[cfg(not(feature = "encryption"))]
            let sealed: super::sealing::Sealed = None;
            let commit = Commit {
                id: id.clone(),
                owner: owner.clone(),
                fingerprint: attempt.fingerprint.clone(),
                response: stored_form(sealed, &response),
                now_ms,
                expiration_s,
                writes: writes.clone(),
            };
            let expiration_s = commit.expiration_s;
            let opening = {
                let found = match inner.store.commit(commit).await {
                    Ok(Conditional::Applied) => None,
                    Ok(Conditional::Refused(found)) => Some(found),
                    Err(error) if error.kind() == StoreErrorKind::Conflict => {
                        tokio::time::sleep(contention.conflicted(&error)).await;
                        continue;
                    }
                    Err(error) => {
                        warn!(record = %id, outcome = "store_error", %error,
                            "single-write commit failed; nothing was written, unless the commit landed and its answer was lost (a retry then replays it)");
                        return Err(Error::Store(error));
                    }
                };
                match found.map(|found| (fence(found.as_ref(), &owner, now_ms), found)) {
                    // Applied; or this very commit, landed before its retry.
                    None | Some((Fence::OwnCompletion | Fence::OwnClaim, _)) => None,
                    Some((Fence::Held, Some(record))) if self.encrypts() => {
                        Some(Box::pin(self.opened(record, &attempt.fingerprint)))
                    }
                    Some((Fence::Held, Some(record))) => {
                        return self.existing(record, codec, attempt, now_ms)
                    }
                    // Refused although lapsed: it holds a response.
                    Some((Fence::Lapsed, Some(record))) if record.response.is_some() => {
                        return Err(Error::Store(changed_completion(&record)));
                    }
                    // Gone or lapsed by the time it was read: commit again.
                    Some(_) => {
                        contention.refused();
                        continue;
                    }
                }
            };
            if let Some(opening) = opening {
                return self.existing(opening.await?, codec, attempt, now_ms);
            }
            self.remember(
                &id,
                &attempt.fingerprint,
                &response,
                expiration_s,
                Some(now_ms),
                1,
            );
            debug!(record = %id, outcome = "fresh", single_write = true, "idempotency");
            return Ok(Outcome::new(value, OutcomeKind::Fresh));
        }
        // Still contended: whoever won, its record says what happened.
        let now_ms = inner.clock.now_ms();
        let opening = match inner.store.get(&id, now_ms).await.map_err(Error::Store)? {
            Some(record) if self.encrypts() => {
                Err(Box::pin(self.opened(record, &attempt.fingerprint)))
            }
            found => Ok(found),
        };
        let found = match opening {
            Ok(found) => found,
            Err(opening) => Some(opening.await?),
        };
        self.after_contention(&id, found, &owner, codec, attempt, now_ms)
    }

    /// What a read after the commit's tries found decides: a live record
    /// answers (a replay, a mismatch, in progress); none, or a lapsed
    /// claim, is still contended, and the caller retries, as for a request
    /// in progress (never a 5xx).
    fn after_contention<T, E, C: Codec<T>>(
        &self,
        id: &RecordId,
        found: Option<crate::store::Record>,
        owner: &OwnerToken,
        codec: &C,
        attempt: &Attempt<'_>,
        now_ms: u64,
    ) -> Result<Outcome<T>, Error<E>> {
        match (fence(found.as_ref(), owner, now_ms), found) {
            (Fence::Held | Fence::OwnCompletion, Some(record)) => {
                self.existing(record, codec, attempt, now_ms)
            }
            _ => {
                debug!(record = %id, outcome = "in_progress", "single-write commits stayed contended");
                Err(Error::InProgress {
                    retry_after: Duration::from_secs(1),
                })
            }
        }
    }
}
