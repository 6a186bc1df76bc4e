//! The end of a claimed run: complete the record with the outcome, or
//! release the claim so that a retry can run.

use super::{
    conflicts::retry_conflicts,
    fence::{fence, Fence},
    outcome::OutcomeKind,
    sealing::stored_form,
    state::Engine,
};
use crate::{
    store::{Claim, Completion, Conditional, Extension, OwnerToken, RecordId, Store},
    Error, StoreError,
};
use tracing::{debug, warn};

impl<St: Store> Engine<St> {
    /// A completion that landed, told to this process: its cache replays
    /// it, and the duplicates waiting on its run get it.
    pub(super) fn completed(&self, claim: &Claim, response: &[u8], expiration_s: u64, now_ms: u64) {
        self.remember(
            &claim.id,
            &claim.fingerprint,
            response,
            expiration_s,
            Some(now_ms),
            claim.attempt,
        );
        self.local_runs()
            .completed(claim, response, expiration_s, now_ms);
    }

    pub(crate) async fn complete<E>(
        &self,
        claim: &Claim,
        response: Vec<u8>,
        writes: Vec<St::Write>,
        transactional: bool,
        keep_refused_claim: bool,
    ) -> Result<OutcomeKind, Error<E>> {
        let inner = &*self.inner;
        let now_ms = inner.clock.now_ms();
        let expiration_s = self.expiration_s(now_ms);
        // What the store keeps: the response sealed, when the engine
        // encrypts; the process keeps `response` itself.
        // Not boxed: sealing with a key at hand allocates nothing but the
        // sealed bytes, and its future is a small part of this one.
        #[cfg(feature = "encryption")]
        let sealed = if self.encrypts() {
            self.sealed(&claim.id, &claim.fingerprint, expiration_s, &response)
                .await
        } else {
            Ok(None)
        };
        #[cfg(not(feature = "encryption"))]
        let sealed: Result<super::sealing::Sealed, StoreError> = Ok(None);
        let completed = match sealed {
            Ok(sealed) => {
                // A completion is fenced, so one that lost a race (at
                // SERIALIZABLE, a duplicate's claim reading the row) is
                // safely tried again: the first try sends this completion
                // as it is, a later one a copy, its response sealed again
                // (a fresh nonce, the same binding) rather than a copy of
                // every sealed response kept for a retry that rarely comes.
                let kept_writes = writes.clone();
                let mut first = Some(Completion {
                    id: claim.id.clone(),
                    owner: claim.owner.clone(),
                    response: stored_form(sealed, &response),
                    now_ms,
                    expiration_s,
                    writes,
                });
                let (response, kept_writes) = (&response, &kept_writes);
                retry_conflicts(|| {
                    let first = first.take();
                    async move {
                        let completion = match first {
                            Some(first) => first,
                            None => Completion {
                                id: claim.id.clone(),
                                owner: claim.owner.clone(),
                                response: self.stored_again(claim, expiration_s, response).await?,
                                now_ms,
                                expiration_s,
                                writes: kept_writes.clone(),
                            },
                        };
                        inner.store.complete(completion).await
                    }
                })
                .await
            }
            Err(error) => Err(error),
        };
        let applied = completed.map(|found| landed(found, &claim.owner, now_ms));
        match applied {
            Ok(true) => {
                self.completed(claim, &response, expiration_s, now_ms);
                debug!(record = %claim.id, outcome = "fresh", "idempotency");
                Ok(OutcomeKind::Fresh)
            }
            Ok(false) => {
                if inner.heartbeat {
                    warn!(record = %claim.id, outcome = "lease_lost", transactional,
                        "the key was taken over before completion although the heartbeat ran \
                         (its extensions failed, or the process was paused past the lease); \
                         this outcome is not stored");
                } else {
                    warn!(record = %claim.id, outcome = "lease_lost", transactional,
                        "the operation outlived its claim's lease and the key was taken over \
                         before completion; this outcome is not stored and a retry may have \
                         run beside it: turn the heartbeat on (EngineBuilder::heartbeat(true), \
                         the default under Lambda Managed Instances), or raise the lease \
                         (max_lease, default_lease) above the longest the operation takes");
                }
                if transactional {
                    Err(Error::LeaseLost)
                } else {
                    Ok(OutcomeKind::LeaseLost)
                }
            }
            // The caller answers the refusal, with the claim still held.
            Err(error) if keep_refused_claim && error.write_refusal().is_some() => {
                debug!(record = %claim.id, %error, "a write of the operation's was refused");
                Err(Error::Store(error))
            }
            Err(error) if transactional => {
                warn!(record = %claim.id, outcome = "store_error", %error,
                    "transactional completion failed; releasing the claim");
                // Boxed: every completion's future would hold room for it.
                Box::pin(self.release(claim)).await;
                Err(Error::Store(error))
            }
            Err(error) => {
                warn!(record = %claim.id, outcome = "not_recorded", %error,
                    "the outcome could not be stored; the claim stays until its lease passes");
                Ok(OutcomeKind::NotRecorded)
            }
        }
    }

    /// Releases a claim so a retry can run; best effort, since a claim that
    /// cannot be released still expires with its lease.
    ///
    /// A takeover's claim is not deleted: the attempt it took over may
    /// still be running, or have acted, and a fresh claim after a delete
    /// would be attempt 1, not told. Its lease is ended instead (a fenced
    /// extension to the past), so the retry runs at once, as the next
    /// takeover, told that earlier attempts may have acted.
    ///
    /// A claim whose record holds steps (recovery points) is not deleted
    /// either, whatever its attempt: the steps would go with it, and the
    /// retry would run them again. It lapses the same way, and the retry
    /// takes it over and resumes after them.
    pub(crate) async fn release(&self, claim: &Claim) {
        let now_ms = self.inner.clock.now_ms();
        let stepped = self.inner.stepped_claims.contains(&claim.owner);
        // One await for both ways, rather than a function for each: this
        // future nests inside every caller's (see `lapse`).
        let (given, done) = if claim.attempt > 1 || stepped {
            let ended = self.lapse(Lapsing::of_claim(claim), now_ms);
            let lapsed = retry_conflicts(|| self.inner.store.extend(&ended)).await;
            (lapsed, "the takeover's claim was given back; its record stays, lapsed, for the next attempt to take over")
        } else {
            let released =
                retry_conflicts(|| self.inner.store.release(&claim.id, &claim.owner)).await;
            (released, "the claim was given back")
        };
        given_back(claim, given, now_ms, done);
    }

    /// The extension that ends a takeover's lease, fenced on its token,
    /// keeping its record (attempt count, first start) for the next
    /// claimant to take over.
    pub(super) fn lapse(&self, claim: Lapsing<'_>, now_ms: u64) -> Extension {
        Extension {
            id: claim.id.clone(),
            owner: claim.owner.clone(),
            // Already passed by this clock: the record is lapsed at once.
            lease_until_ms: now_ms.saturating_sub(1).min(claim.lease_until_ms),
            // Kept as long as a claim's record is, never shortened.
            expiration_s: claim.expiration_s.max(self.expiration_s(now_ms)),
            now_ms,
        }
    }
}

/// The claim whose lease [`Engine::lapse`] ends: a claim this process
/// made, or a durable execution's record, read back.
pub(super) struct Lapsing<'a> {
    pub(super) id: &'a RecordId,
    pub(super) owner: &'a OwnerToken,
    pub(super) lease_until_ms: u64,
    pub(super) expiration_s: u64,
}

impl<'a> Lapsing<'a> {
    fn of_claim(claim: &'a Claim) -> Self {
        Self {
            id: &claim.id,
            owner: &claim.owner,
            lease_until_ms: claim.lease_until_ms,
            expiration_s: claim.expiration_s,
        }
    }
}

/// Whether a fenced completion landed: applied now, or found already
/// completed under its token (this very completion, landed before a retry
/// whose answer was lost).
pub(super) fn landed(found: Conditional, owner: &OwnerToken, now_ms: u64) -> bool {
    match found {
        Conditional::Applied => true,
        Conditional::Refused(found) => fence(found.as_ref(), owner, now_ms) == Fence::OwnCompletion,
    }
}

/// What a fenced release (or lapse) of `claim` found: given back; nothing
/// of its owner's left (released already by a retry whose answer was lost,
/// or expired); or another owner's record, which took the key over.
fn given_back(claim: &Claim, released: Result<Conditional, StoreError>, now_ms: u64, done: &str) {
    match released {
        Ok(Conditional::Applied) => {
            debug!(record = %claim.id, outcome = "released", attempt = claim.attempt, "{done}")
        }
        Ok(Conditional::Refused(found)) => match fence(found.as_ref(), &claim.owner, now_ms) {
            Fence::Free | Fence::OwnClaim | Fence::OwnCompletion => {}
            Fence::Held | Fence::Lapsed => {
                warn!(record = %claim.id, outcome = "lease_lost", "the claim was taken over before it could be released")
            }
        },
        Err(error) => {
            warn!(record = %claim.id, %error, "the claim could not be released; it stays until its lease passes")
        }
    }
}
