//! The claim loop: claim the key, take over a lapsed claim, and decide what
//! a refusal means.

use super::{
    codec::Codec,
    conflicts::Contention,
    fence::{fence, takeover_of, Fence},
    outcome::Outcome,
    sealing::not_a_sealed_completion,
    state::{Engine, MIN_LEASE_MS},
};
use crate::{
    clock::duration_ms,
    observe::Event,
    store::{Claim, Conditional, OwnerToken, Record, RecordId, Status, Store},
    Attempt, Error, StoreError, StoreErrorKind,
};
use tracing::{debug, warn};

/// How far from its expiry a completed record read before the claim must be
/// to answer without the claim: more than clocks disagree (Amazon Time
/// Sync keeps Lambda hosts well within a second) plus how long a stale read
/// may lag, so that no process can have found it expired and replaced it.
pub(crate) const READ_EXPIRY_MARGIN_S: u64 = 5;

impl<St: Store> Engine<St> {
    /// Claims the key, and decides what a refusal means: a record under
    /// this claim's own token is its own write that landed (an SDK retry of
    /// a claim whose first answer was lost); a live record holds the key; a
    /// lapsed claim is taken over, as the next attempt (`claim` becomes the
    /// takeover); a record gone or no longer live by the time it was read is
    /// claimed again.
    pub(crate) async fn claim(&self, claim: &mut Claim) -> Result<Claimed, ClaimError> {
        let store = &self.inner.store;
        if let Some(record) = self.completed_before_claim(&claim.id, claim.now_ms).await {
            return Ok(Claimed::Held(record));
        }
        let mut contention = Contention::default();
        while contention.may_try() {
            let found = match self.claim_once(claim).await {
                Ok(Conditional::Applied) => None,
                Ok(Conditional::Refused(found)) => Some(found),
                // A concurrent write won: the winner's record decides, once
                // it is there to read.
                Err(error) if error.kind() == StoreErrorKind::Conflict => {
                    self.observe(|| Event::ConflictRetried);
                    tokio::time::sleep(contention.conflicted(&error)).await;
                    continue;
                }
                Err(error) if error.kind().is_outage() => {
                    return self.confirm_outage(claim, error).await
                }
                Err(error) => return Err(ClaimError::Failed(error)),
            };
            if let Some(found) = found {
                match Claimed::by_record(claim, found) {
                    Some(Claimed::Ours) => {
                        debug!(record = %claim.id, "the claim had landed before its retry")
                    }
                    Some(held) => return Ok(held),
                    None => {
                        contention.refused();
                        continue;
                    }
                }
            }
            if claim.attempt > 1 {
                warn!(record = %claim.id, outcome = "takeover", attempt = claim.attempt,
                    "took over a claim whose lease passed: the previous attempt may have acted");
                self.observe(|| Event::TookOver {
                    attempt: claim.attempt,
                });
            }
            return Ok(Claimed::Ours);
        }
        // Still contended: whatever is there now says what happened.
        match store.get(&claim.id, claim.now_ms).await {
            Ok(found) => Claimed::by_record(claim, found).ok_or_else(|| {
                ClaimError::Failed(StoreError::new(
                    StoreErrorKind::Conflict,
                    format!(
                        "record {} kept changing during {} claim attempts",
                        claim.id,
                        contention.tries()
                    ),
                ))
            }),
            Err(error) => Err(ClaimError::Failed(error)),
        }
    }

    /// With [`read_before_claim`](crate::EngineBuilder::read_before_claim),
    /// the completed record a read finds before the claim, which answers
    /// the attempt without it: a completed record does not change until it
    /// expires, so a stale read can only miss it, unless it has expired by
    /// another process's clock and been replaced: a record within
    /// [`READ_EXPIRY_MARGIN_S`] of its expiry is left to the claim too.
    /// Anything else, and a read that fails, is left to the claim.
    pub(super) async fn completed_before_claim(
        &self,
        id: &RecordId,
        now_ms: u64,
    ) -> Option<Record> {
        if !self.inner.read_before_claim {
            return None;
        }
        match self.inner.store.peek(id, now_ms).await {
            // Completed, and far enough from its expiry that no process,
            // whatever its clock, can have replaced it yet.
            Ok(Some(record))
                if record.status == Status::Completed
                    && record.expiration_s
                        > (now_ms / 1000).saturating_add(READ_EXPIRY_MARGIN_S) =>
            {
                Some(record)
            }
            Ok(_) => None,
            // A missing permission (`dynamodb:GetItem`) fails every read:
            // said, since each request pays its round trip for nothing.
            Err(error) if error.kind() == StoreErrorKind::Misconfigured => {
                warn!(record = %id, %error, "the read before the claim failed (read_before_claim): check the store's permissions; the claim decides");
                None
            }
            Err(error) => {
                debug!(record = %id, %error, "the read before the claim failed; the claim decides");
                None
            }
        }
    }

    /// A claim failed as an outage; a read tells whether the store is down.
    /// A statement can time out waiting on a duplicate's lock, and a writer
    /// demoted by a failover still answers reads: then the record found
    /// decides (this claim's own, landed before its answer was lost; a
    /// live record to replay or wait for), and the failure is not an
    /// outage that fail-open may run through. Only a store that cannot be
    /// read either is down.
    pub(super) async fn confirm_outage(
        &self,
        claim: &mut Claim,
        error: StoreError,
    ) -> Result<Claimed, ClaimError> {
        match self.inner.store.get(&claim.id, claim.now_ms).await {
            Ok(found) => {
                debug!(record = %claim.id, %error, "the claim failed, but the store answers reads");
                Claimed::by_record(claim, found).ok_or(ClaimError::Failed(error))
            }
            Err(_) => Err(ClaimError::Outage(error)),
        }
    }

    /// One claim: a fresh claim, and the takeover of the lapsed claim it
    /// found, if that is what it found (`claim` then becomes the takeover).
    pub(super) async fn claim_once(&self, claim: &mut Claim) -> Result<Conditional, StoreError> {
        let store = &self.inner.store;
        let found = store.claim(claim).await?;
        let Conditional::Refused(Some(lapsed)) = &found else {
            return Ok(found);
        };
        if fence(Some(lapsed), &claim.owner, claim.now_ms) != Fence::Lapsed {
            return Ok(found);
        }
        not_a_sealed_completion(lapsed)?;
        let takeover = takeover_of(claim, lapsed);
        let found = store.take_over(&takeover, &lapsed.owner).await?;
        *claim = takeover;
        Ok(found)
    }

    /// The claim the attempt makes, unless this process's cache answers it
    /// first (a replay, a mismatch). Without a fencing token nothing may
    /// run, even failing open: failing to make one is the answer.
    pub(crate) fn claim_unless_cached<T, E, C: Codec<T>>(
        &self,
        attempt: &Attempt<'_>,
        codec: &C,
    ) -> Result<Claim, Result<Outcome<T>, Error<E>>> {
        let id = self.record_id(attempt.scope, attempt.key);
        let now_ms = self.inner.clock.now_ms();
        if let Some(replay) = self.cached_replay(&id, attempt, codec, now_ms) {
            return Err(replay);
        }
        self.claim_for(id, attempt, now_ms)
            .map_err(|error| Err(Error::Store(error)))
    }

    pub(crate) fn claim_for(
        &self,
        id: RecordId,
        attempt: &Attempt<'_>,
        now_ms: u64,
    ) -> Result<Claim, StoreError> {
        let inner = &*self.inner;
        let capped = now_ms.saturating_add(duration_ms(inner.max_lease));
        let lease_until_ms = attempt
            .deadline_ms
            .map_or_else(
                || now_ms.saturating_add(duration_ms(inner.default_lease)),
                |deadline| deadline.min(capped),
            )
            .max(now_ms.saturating_add(MIN_LEASE_MS));
        // With the heartbeat the lease follows the work, not the deadline:
        // it starts at the heartbeat's floor, so that a store that fails
        // or answers slowly for a moment does not let it lapse under a run
        // that goes on (under Lambda Managed Instances, past its deadline).
        let lease_until_ms = if inner.heartbeat {
            let floor =
                super::lease::heartbeat_extension(std::time::Duration::ZERO, inner.max_lease);
            lease_until_ms.max(now_ms.saturating_add(duration_ms(floor)))
        } else {
            lease_until_ms
        };
        // The record must outlive its lease, or it would count as absent (and
        // be taken over) while its owner still runs.
        let expiration_s = self.expiration_s(now_ms).max(lease_until_ms / 1000 + 1);
        Ok(Claim {
            id,
            owner: OwnerToken::generate()?,
            fingerprint: attempt.fingerprint.clone(),
            now_ms,
            lease_until_ms,
            expiration_s,
            // After an attempt outside this crate's records (a Powertools
            // record found abandoned), this claim is its takeover.
            attempt: attempt.taking_over.map_or(1, |t| t.attempt.max(2)),
            first_started_ms: attempt
                .taking_over
                .map_or(now_ms, |t| t.first_started_at_ms),
        })
    }
}

/// Why a claim failed.
pub(crate) enum ClaimError {
    /// The store could neither claim nor be read: an outage, which
    /// fail-open may run through.
    Outage(StoreError),
    /// Anything else, an outage the store's reads contradict included.
    Failed(StoreError),
}

/// What a claim decided.
pub(crate) enum Claimed {
    /// The key is this attempt's.
    Ours,
    /// A live record holds the key.
    Held(Record),
}

impl Claimed {
    /// What a record found under the claim's id decides (refusing the
    /// claim, or read after its answer was lost): this claim's own write,
    /// landed (`claim` becomes what landed, a takeover included); a live
    /// record that holds the key (a completed one under the claim's own
    /// token too: a durable execution's token is the same in every
    /// invocation, and its completed key replays); nothing when neither is
    /// there, and the claim is tried again.
    pub(super) fn by_record(claim: &mut Claim, found: Option<Record>) -> Option<Self> {
        let record = found?;
        match fence(Some(&record), &claim.owner, claim.now_ms) {
            Fence::OwnClaim => {
                recognise(claim, &record);
                Some(Claimed::Ours)
            }
            Fence::OwnCompletion | Fence::Held => Some(Claimed::Held(record)),
            Fence::Free | Fence::Lapsed => None,
        }
    }
}

/// An in-progress record under the claim's own token is what the claim
/// wrote: its fresh claim, or its takeover of a lapsed claim, landed while
/// its answer was lost. What landed says which attempt this is, so that a
/// takeover recognised this way is told that it took over.
fn recognise(claim: &mut Claim, own: &Record) {
    if own.attempt > claim.attempt {
        claim.attempt = own.attempt;
        claim.first_started_ms = own
            .first_started_ms
            .or(own.created_at_ms)
            .unwrap_or(claim.first_started_ms);
    }
}
