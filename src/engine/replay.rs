//! Replay decisions: what a live record, or the local cache, answers an
//! attempt.

use super::{
    cache::CachedRecord,
    codec::Codec,
    outcome::{Outcome, Replayed},
    retry_after::{in_progress_retry_after, RetryHint},
    state::Engine,
};
use crate::observe::Event;
use crate::{
    store::{Record, RecordId, Status, Store},
    Attempt, Error, Fingerprint, StoreError,
};
use std::{sync::Arc, time::Duration};
use tracing::debug;

impl<St: Store> Engine<St> {
    /// Decides what a live record found at claim time means for this
    /// attempt: mismatch first (a different payload never learns anything
    /// about the other request), then replay, then in progress.
    pub(crate) fn existing<T, E>(
        &self,
        record: Record,
        codec: &impl Codec<T>,
        attempt: &Attempt<'_>,
        now_ms: u64,
    ) -> Result<Outcome<T>, Error<E>> {
        let hint = attempt.retry_hint;
        self.existing_with(record, codec, &attempt.fingerprint, hint, now_ms)
    }

    /// As [`existing`](Self::existing), for a payload's `fingerprint`,
    /// telling a duplicate of a request in progress to wait as `hint` says.
    pub(crate) fn existing_with<T, E>(
        &self,
        record: Record,
        codec: &impl Codec<T>,
        fingerprint: &Fingerprint,
        hint: RetryHint,
        now_ms: u64,
    ) -> Result<Outcome<T>, Error<E>> {
        if &record.fingerprint != fingerprint {
            debug!(record = %record.id, outcome = "key_reused", "idempotency");
            return Err(Error::KeyReused);
        }
        match record.status {
            Status::Completed => {
                let Some(response) = record.response else {
                    return Err(Error::Store(StoreError::corrupt(format!(
                        "record {} is COMPLETED but holds no response",
                        record.id
                    ))));
                };
                let value = codec.decode(&response).map_err(|error| {
                    Error::Store(
                        StoreError::corrupt(format!(
                            "the response stored in record {} does not decode",
                            record.id
                        ))
                        .with_source(error),
                    )
                })?;
                debug!(record = %record.id, outcome = "replay", "idempotency");
                self.remember(
                    &record.id,
                    &record.fingerprint,
                    &response,
                    record.expiration_s,
                    record.completed_at_ms,
                    record.attempt,
                );
                Ok(Outcome::replay(
                    value,
                    Replayed {
                        completed_at_ms: record.completed_at_ms,
                        expiration_s: record.expiration_s,
                        attempt: record.attempt,
                        cached: false,
                    },
                ))
            }
            Status::InProgress => {
                self.observe(|| Event::FoundInProgress {
                    age: Duration::from_millis(
                        now_ms.saturating_sub(
                            record
                                .first_started_ms
                                .or(record.created_at_ms)
                                .unwrap_or(now_ms),
                        ),
                    ),
                });
                let retry_after = in_progress_retry_after(&record, now_ms, hint);
                debug!(record = %record.id, outcome = "in_progress", retry_after_s = retry_after.as_secs(), "idempotency");
                Err(Error::InProgress { retry_after })
            }
        }
    }

    /// A replay (or a rejection) from the local cache, if it holds the key.
    pub(crate) fn cached_replay<T, E>(
        &self,
        id: &RecordId,
        attempt: &Attempt<'_>,
        codec: &impl Codec<T>,
        now_ms: u64,
    ) -> Option<Result<Outcome<T>, Error<E>>> {
        let cached = self.cached(id, now_ms)?;
        if cached.fingerprint != attempt.fingerprint {
            debug!(record = %id, outcome = "key_reused", cached = true, "idempotency");
            return Some(Err(Error::KeyReused));
        }
        match codec.decode(&cached.response) {
            Ok(value) => {
                debug!(record = %id, outcome = "cached_replay", "idempotency");
                Some(Ok(Outcome::replay(
                    value,
                    Replayed {
                        completed_at_ms: cached.completed_at_ms,
                        expiration_s: cached.expiration_s,
                        attempt: cached.attempt,
                        cached: true,
                    },
                )))
            }
            // A value that no longer decodes (the type changed across a
            // deployment) is left to the store path, which reports it.
            Err(_) => {
                self.evict(id);
                None
            }
        }
    }

    /// Whether the compatibility mode's read of Powertools' record is
    /// skipped: idempotency is off, or the local cache holds `key` inside
    /// `scope` (the next call is answered from it, without a store call).
    #[cfg(all(feature = "powertools", any(feature = "http", feature = "consumers")))]
    pub(crate) fn skips_powertools(&self, scope: &str, key: Option<&str>) -> bool {
        self.inner.disabled
            || key.is_some_and(|key| {
                let id = self.record_id(scope, key);
                self.cached(&id, self.inner.clock.now_ms()).is_some()
            })
    }

    /// Keeps a completed record in the local cache, when there is one, for
    /// the next retry this process serves: the one place a cached record is
    /// built, after its completion was written or read back.
    pub(crate) fn remember(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        response: &[u8],
        expiration_s: u64,
        completed_at_ms: Option<u64>,
        attempt: u32,
    ) {
        if let Some(cache) = &self.inner.cache {
            cache.put(
                id.clone(),
                CachedRecord {
                    fingerprint: fingerprint.clone(),
                    expiration_s,
                    response: Arc::from(response),
                    completed_at_ms,
                    attempt,
                },
            );
        }
    }

    pub(super) fn cached(&self, id: &RecordId, now_ms: u64) -> Option<CachedRecord> {
        self.inner.cache.as_ref()?.get(id, now_ms)
    }

    pub(super) fn evict(&self, id: &RecordId) {
        if let Some(cache) = &self.inner.cache {
            cache.remove(id);
        }
    }
}
