//! Stored responses sealed on every completion and opened on every read
//! that can replay, and steps' outputs sealed when recorded and opened
//! when a takeover resumes, when the engine encrypts
//! ([`EngineBuilder::encryption`](crate::EngineBuilder::encryption)): the
//! one place the engine meets [`crate::encryption`], so that every
//! completion path, every step and every store gets the same envelope.
//! Without the `encryption` feature, or without encryption configured,
//! responses and outputs are stored and read as they are.
//!
//! What the process keeps in memory (the local cache, a duplicate waiting
//! on a run of this process) is the plaintext: only the store's copy is
//! sealed.

use super::{
    claim::{ClaimError, Claimed},
    state::{Engine, Inner},
};
use crate::{
    store::{Record, RecordId, Store},
    Fingerprint, StoreError,
};

/// A response sealed for the store, or `None` to store it as it is:
/// zero-sized without the `encryption` feature, so that a completion's
/// future holds no room for it then.
#[cfg(feature = "encryption")]
pub(super) type Sealed = Option<Vec<u8>>;
/// A response sealed for the store: never, without the `encryption`
/// feature.
#[cfg(not(feature = "encryption"))]
pub(super) type Sealed = Option<std::convert::Infallible>;

/// The bytes a completion stores: `sealed`, or a copy of `response`.
pub(super) fn stored_form(sealed: Sealed, response: &[u8]) -> Vec<u8> {
    match sealed {
        #[cfg(feature = "encryption")]
        Some(sealed) => sealed,
        #[cfg(not(feature = "encryption"))]
        Some(never) => match never {},
        None => response.to_vec(),
    }
}

/// `Ok` unless `lapsed`, a claim whose lease passed, carries a sealed
/// response: then it is a completed record turned back into a claim in
/// the table, and taking it over would run its operation again
/// ([`crate::encryption`]'s refusal, an
/// [`Unauthentic`](crate::StoreErrorKind::Unauthentic) error). Checked
/// with or without encryption configured: an engine that does not seal
/// still recognises the envelope.
pub(super) fn not_a_sealed_completion(lapsed: &Record) -> Result<(), StoreError> {
    #[cfg(feature = "encryption")]
    if let Some(refused) = crate::encryption::sealed_claim(lapsed) {
        return Err(refused);
    }
    let _ = lapsed;
    Ok(())
}

/// The error for a lapsed claim that holds a response, which a
/// single-write commit refused to replace ([`Store::commit`](crate::store::Store::commit)):
/// a completed record whose status was changed in the table. A sealed one
/// is [`Unauthentic`](crate::StoreErrorKind::Unauthentic), as a claim
/// finds it; a plaintext one is a
/// [`CorruptRecord`](crate::StoreErrorKind::CorruptRecord): the crate never
/// writes either, and overwriting it would lose the response of an
/// operation that may have run.
pub(super) fn changed_completion(lapsed: &Record) -> StoreError {
    match not_a_sealed_completion(lapsed) {
        Err(unauthentic) => unauthentic,
        Ok(()) => StoreError::corrupt(format!(
            "record {}: IN_PROGRESS with a stored response, a completed record whose status \
             was changed; not replaced (the operator CLI's `forget` removes it)",
            lapsed.id
        )),
    }
}

impl<St: Store> Engine<St> {
    /// The bytes to store for a completion of the record `id` (claimed
    /// for `fingerprint`, expiring at `expiration_s`) with `response`:
    /// sealed, or `None` to store `response` as it is.
    pub(super) async fn sealed(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        expiration_s: u64,
        response: &[u8],
    ) -> Result<Sealed, StoreError> {
        #[cfg(feature = "encryption")]
        if let Some(encryption) = &self.inner.encryption {
            let binding = crate::encryption::Binding {
                context: encryption.context(),
                id,
                fingerprint,
                holds: crate::encryption::Holds::Response {
                    status: crate::store::Status::Completed,
                    expiration_s,
                },
            };
            // Not boxed: `seal`'s future holds only a key lookup still
            // pending, and a key at hand needs no allocation at all.
            return encryption.seal(&binding, response).await;
        }
        let _ = (id, fingerprint, expiration_s, response);
        Ok(None)
    }

    /// The bytes to store for a completion of `claim` tried again: sealed
    /// again, or a copy of `response`.
    pub(super) async fn stored_again(
        &self,
        claim: &crate::store::Claim,
        expiration_s: u64,
        response: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        let sealed = if self.encrypts() {
            // Boxed: rare, and its future would otherwise be every
            // completion's.
            Box::pin(self.sealed(&claim.id, &claim.fingerprint, expiration_s, response)).await?
        } else {
            None
        };
        Ok(stored_form(sealed, response))
    }

    /// `record`, read from the store, with its response opened: only a
    /// completed record found for this `fingerprint` (another payload's
    /// is a mismatch, answered without opening it: it learns nothing), so
    /// that [`existing`](Engine::existing) replays the plaintext. A
    /// response that fails to open is an error, and the record is left as
    /// it is.
    pub(super) async fn opened(
        &self,
        record: Record,
        fingerprint: &Fingerprint,
    ) -> Result<Record, StoreError> {
        #[cfg(feature = "encryption")]
        if let Some(encryption) = &self.inner.encryption {
            let mut record = record;
            if record.status == crate::store::Status::Completed
                && record.fingerprint == *fingerprint
            {
                if let Some(stored) = record.response.take() {
                    let binding = crate::encryption::Binding {
                        context: encryption.context(),
                        id: &record.id,
                        fingerprint: &record.fingerprint,
                        holds: crate::encryption::Holds::Response {
                            status: record.status,
                            expiration_s: record.expiration_s,
                        },
                    };
                    // Not boxed, as in `sealed`.
                    let opened = encryption.open(&binding, stored).await?;
                    record.response = Some(opened);
                }
            }
            return Ok(record);
        }
        let _ = fingerprint;
        Ok(record)
    }

    /// What a claim decided, with a record that holds the key opened
    /// ([`opened`](Engine::opened)). One that fails to open fails the
    /// claim, never as an outage: fail-open must not run an operation whose
    /// record says it ran.
    pub(super) async fn opened_claim(
        &self,
        claimed: Result<Claimed, ClaimError>,
        fingerprint: &Fingerprint,
    ) -> Result<Claimed, ClaimError> {
        match claimed {
            Ok(Claimed::Held(record)) if self.encrypts() => self
                .opened(record, fingerprint)
                .await
                .map(Claimed::Held)
                .map_err(ClaimError::Failed),
            claimed => claimed,
        }
    }

    /// Whether stored responses are sealed or opened at all.
    pub(super) fn encrypts(&self) -> bool {
        #[cfg(feature = "encryption")]
        return self.inner.encryption.is_some();
        #[cfg(not(feature = "encryption"))]
        false
    }
}

/// A step's output as the engine binds it when it seals or opens it: its
/// record, the request's fingerprint, the step's name and its index among
/// the record's steps ([`ClaimHandle::step`](crate::ClaimHandle::step)).
#[derive(Debug, Clone, Copy)]
// Read only to seal: without the `encryption` feature, outputs are stored
// as they are.
#[cfg_attr(not(feature = "encryption"), allow(dead_code))]
pub(super) struct StepBinding<'a> {
    pub(super) id: &'a RecordId,
    pub(super) fingerprint: &'a Fingerprint,
    pub(super) name: &'a str,
    pub(super) index: u32,
}

impl<St: Store> Inner<St> {
    /// The bytes to record for a step's encoded `output`: sealed, or
    /// `output` itself without encryption (or when only opening).
    pub(super) async fn seal_step(
        &self,
        step: StepBinding<'_>,
        output: Vec<u8>,
    ) -> Result<Vec<u8>, StoreError> {
        #[cfg(feature = "encryption")]
        if let Some(encryption) = &self.encryption {
            return Ok(encryption
                .seal(&step_binding(encryption, step), &output)
                .await?
                .unwrap_or(output));
        }
        let _ = step;
        Ok(output)
    }

    /// The encoded output a step recorded, from its `stored` bytes: opened
    /// when sealed; as it is when plaintext (recorded before encryption
    /// was on), unless plaintext is refused. One that fails to open is an
    /// [`Unauthentic`](crate::StoreErrorKind::Unauthentic) error, logged
    /// with the record, the step and the key id.
    pub(super) async fn open_step(
        &self,
        step: StepBinding<'_>,
        stored: Vec<u8>,
    ) -> Result<Vec<u8>, StoreError> {
        #[cfg(feature = "encryption")]
        if let Some(encryption) = &self.encryption {
            return encryption
                .open(&step_binding(encryption, step), stored)
                .await;
        }
        let _ = step;
        Ok(stored)
    }
}

#[cfg(feature = "encryption")]
fn step_binding<'a>(
    encryption: &'a crate::encryption::Encryption,
    step: StepBinding<'a>,
) -> crate::encryption::Binding<'a> {
    crate::encryption::Binding {
        context: encryption.context(),
        id: step.id,
        fingerprint: step.fingerprint,
        holds: crate::encryption::Holds::Step {
            name: step.name,
            index: step.index,
        },
    }
}
