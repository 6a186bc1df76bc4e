//! Stored responses encrypted and bound to their record, on every store.
//!
//! A stored response is what the first caller got: a charge, a card's last
//! digits, an address, sometimes a token. Without encryption it sits in
//! the table as written, readable by whoever reads the table, its backups,
//! its stream or a Redis snapshot, and a record edited there is replayed
//! as it is. With [`EngineBuilder::encryption`](crate::EngineBuilder::encryption)
//! the engine seals every response before it writes it, and opens it
//! before it replays it:
//!
//! ```
//! use lambda_idempotency::{encryption::{Encryption, RawKeys}, Engine, MemoryStore};
//! # fn secret() -> [u8; 32] { [7; 32] }
//! let keys = RawKeys::new("2026-11", &secret())?;
//! let engine = Engine::builder(MemoryStore::new())
//!     .encryption(Encryption::new(keys, "prod/idempotency-table"))
//!     .build();
//! # Ok::<(), lambda_idempotency::encryption::KeyError>(())
//! ```
//!
//! # At the engine, for every store and adapter alike
//!
//! The engine seals the encoded response (the HTTP layer's frame with its
//! status, stored headers, body and trailers; a consumer's or
//! [`Engine::execute`](crate::Engine::execute)'s JSON value; a durable
//! execution's output) on every completion: the plain one, the single
//! write, the completion inside a store transaction (`PgWrite`, the
//! in-transaction form), a refused write's stored answer, and the
//! completion of a claim split across invocations. It opens it on every
//! read that can replay: a refused claim, the read before a claim, a single
//! write that lost, a split claim. The stores are unaware: they keep bytes
//! as they always did, so DynamoDB, PostgreSQL, MySQL, Redis, the memory
//! store and the single-table layout all hold the same sealed bytes.
//!
//! What is not sealed is what the protocol reads in the clear: the record
//! id (a hash of the scope and key), the status, the owner token, the
//! fingerprint (a hash of the request), the times and the attempt count.
//!
//! The process's own copies stay in memory in the clear: the local cache
//! ([`EngineBuilder::cache`](crate::EngineBuilder::cache)) keeps a
//! response opened once, and a duplicate waiting on a run in the same
//! process gets its response without a store read.
//!
//! # The cipher, and why this one
//!
//! AES-256-GCM from [aws-lc-rs](https://docs.rs/aws-lc-rs), AWS's
//! maintained, FIPS-validated library: the AWS SDK's TLS (rustls) already
//! builds it, with the same features, so turning this on compiles nothing
//! new in a function that talks to AWS. Each response gets a fresh random
//! 96-bit nonce, drawn from AWS-LC's generator at each seal: it notices a
//! fork and a restored VM snapshot (SnapStart), which would duplicate any
//! nonce drawn ahead and kept in memory. That draw is about 0.3 µs of a
//! seal's 0.45 µs; drawing ahead would save most of it, and is not done
//! for that reason. A key seals at most 2^32 responses before the chance of a
//! repeated nonce passes NIST's bound (1 in 2^32): rotate a raw key well
//! before that many records (a million requests a day is 11,000 years of
//! them).
//!
//! # The envelope
//!
//! Versioned bytes: a magic prefix (`0xFF 'L' 'I' 'E'`) no plaintext
//! response the crate writes can start with, the version, flags, the key
//! id, the wrapped data key (empty for a raw key), the nonce, and the
//! ciphertext with its tag. A stored response without the prefix is
//! plaintext (written before encryption was on, or while only opening).
//! A [`Codec`](crate::Codec) of your own must not write a value that starts
//! with the prefix: it would be refused as a record that fails to open.
//!
//! A response longer than [`Encryption::compress_above`] (4 KiB by default)
//! is deflated before it is sealed, when that makes it smaller (ciphertext
//! does not compress). The HTTP layer deflates bodies above 4 KiB in its
//! own frame already. The DynamoDB store's own compression
//! (`DynamoDbStore::compress_responses_above`) gains nothing on a sealed
//! response and stores it as it is (it keeps the deflated form only when
//! smaller), at the cost of a deflate attempt: leave it off with
//! encryption on.
//!
//! # Bound to its record
//!
//! The associated data is the envelope's header (key id, wrapped key,
//! flags) and the record's id, the request's fingerprint, the status
//! (`COMPLETED`), the expiry (`expiration_s`) and the context named in
//! [`Encryption::new`] (the table, the environment: a record copied from
//! another table, or from staging to production, does not open). So a
//! response copied onto another key, a record's fingerprint or expiry
//! changed, a record copied from another context, or any byte of the
//! response changed, fails authentication.
//!
//! # Steps' outputs (recovery points)
//!
//! With encryption on, [`ClaimHandle::step`](crate::ClaimHandle::step)
//! seals each step's output before it records it, in the same envelope
//! under the same keys (the key id travels with the output, a KMS data key
//! is the cached one), and opens it before a takeover uses it. Its
//! associated data binds it to the context, the record id, the request's
//! fingerprint, the step's name and its index among the record's steps
//! (not to the expiry or owner, which a takeover changes), and says it is
//! a step's (`STEP` where a response has its status): an output flipped,
//! moved to another step's name, to another index, or copied from another
//! record or context does not open, nor does a response moved into a step
//! or a step into the response. One that fails to open is never used and
//! the step is not run again: the step answers
//! [`StoreErrorKind::Unauthentic`] and logs an ERROR naming the record,
//! the step and the key id; the operation should stop there (its key is
//! given back keeping the record, so every retry is refused the same way
//! until an operator forgets the record). Outputs recorded in the clear
//! before encryption was on are used as they are, unless
//! [`refuse_plaintext`](Encryption::refuse_plaintext); with
//! [`open_only`](Encryption::open_only) new ones are recorded in the
//! clear. A writer who deletes a step, or all of them, is not detected:
//! the step runs again, as after deleting the record. The step bounds
//! ([`StepLimits`](crate::store::StepLimits)) count the output before it
//! is sealed; the envelope adds its 37 bytes, the key id and the wrapped
//! key to each.
//!
//! # A record that fails to open
//!
//! It is never replayed, never overwritten and the operation is not run
//! again (it ran once: its record says so). The request gets an error of
//! its own, [`StoreErrorKind::Unauthentic`]
//! ([`ErrorKind::UnauthenticRecord`](crate::ErrorKind::UnauthenticRecord)):
//! the HTTP layer answers a 500 `problem+json` of type
//! `idempotency-record-unauthentic` (gRPC: `DATA_LOSS`), a batch consumer
//! reports the item as failed, and an ERROR log names the record id and
//! the key id. Failing to open covers: a tag that does not match (the
//! record was changed or copied), a key id no key provider knows (a key
//! removed too early after a rotation), a malformed envelope (truncated,
//! an unknown version or flag), and, with
//! [`refuse_plaintext`](Encryption::refuse_plaintext), a plaintext
//! response. An operator inspects it and forgets it (the CLI's `inspect`
//! shows the key id it names, and, given the key files and the context,
//! opens it or says why it does not open; `forget` deletes it), and the
//! next request with the key runs.
//!
//! A completed record turned back into a claim in the table (the status
//! set to `IN_PROGRESS`, its sealed response left in place) is refused the
//! same way once its lease has passed, rather than taken over: the
//! protocol never writes a claim with a response. While its lease runs it
//! is a claim in progress (a 409), as any.
//!
//! A key provider that cannot be reached (a KMS outage) is an outage
//! ([`KeyErrorKind::Unavailable`]): a replay that needs its key is answered
//! as a store outage is (503, retry), never as a run; a completion that
//! cannot be sealed is not stored, as a completion the store refused.
//!
//! # Keys, and rotating them
//!
//! A [`KeyProvider`] gives the key to seal with and finds the key a record
//! names. [`RawKeys`] holds keys by id: the primary seals, every one
//! opens. To rotate, add a new primary and keep the old key beside it for
//! the engine's retention (24 hours by default); records sealed under it
//! then expire, and it can go. A provider that wraps data keys under a
//! master key (AWS KMS) is the same trait: its sealing key carries the
//! wrapped form, which every envelope stores, and its opening key unwraps
//! it.
//!
//! # AWS KMS
//!
//! With the `kms` feature,
//! [`KmsKeys`](https://docs.rs/lambda-idempotency/latest/lambda_idempotency/encryption/kms/struct.KmsKeys.html)
//! seals with data keys from `GenerateDataKey`, each reused within the
//! bounds you set (`max_records`, `max_age`: 10,000 and 5 minutes by
//! default) and fetched once by concurrent requests, and opens with
//! `Decrypt`, cached per data key. Every call carries the encryption
//! context `{"lambda-idempotency": <context>}`, and only the configured KMS
//! keys are asked to open. When KMS cannot be reached, a claim is
//! unaffected, a completion without a cached data key is not stored, and a
//! replay without its key is an outage (503), never a run. The
//! [`kms`](https://docs.rs/lambda-idempotency/latest/lambda_idempotency/encryption/kms/index.html)
//! module docs have the error mapping, rotation, and the calls a million
//! requests make.
//!
//! # Turning it on and off on a live table
//!
//! - **On**: records already in the table are plaintext and keep replaying
//!   (a record an attacker with write access wrote in the clear would
//!   replay too: once they have expired, after the retention, turn on
//!   [`refuse_plaintext`](Encryption::refuse_plaintext)).
//! - **Off**: first [`open_only`](Encryption::open_only): new responses are
//!   stored in the clear and sealed ones keep opening. Once the sealed
//!   records have expired, remove the encryption.
//! - A rolling deployment has old and new instances side by side: an
//!   instance without encryption finds a sealed record it cannot decode
//!   (a corrupt record, never replayed, never run again). Deploy
//!   `open_only` first, then sealing, so every instance can open before any
//!   seals.
//!
//! # Threat model
//!
//! **Protects against**: anyone who reads the table, its backups and
//! exports, its stream (DynamoDB Streams, a change feed) or a Redis
//! snapshot, without the key: they see sizes and the clear fields above,
//! not responses. Anyone who writes to the table without the key: a
//! response edited, truncated, swapped with another record's, moved to
//! another key or another table, or a record's expiry extended, is
//! refused, never replayed as genuine.
//!
//! **Does not protect against**: someone with the key (or the rights to
//! use it, for KMS) or control of the running process, which holds
//! responses in the clear; traffic analysis of sizes (a ciphertext is as
//! long as its plaintext plus 37 bytes, the key id and the wrapped key, unless
//! it was deflated);
//! the record id, fingerprint, key id and times, which stay in the clear;
//! a writer who deletes a record, or moves its expiry into the past, or
//! turns a completed record into a claim and removes its response: the key
//! is then free (or in progress) as if it had expired, and a retry may run
//! the operation again, as it would after the retention; a plaintext
//! record written by such a writer, unless
//! plaintext is refused. Powertools' records, read in the
//! compatibility mode
//! ([`powertools`](https://docs.rs/lambda-idempotency/latest/lambda_idempotency/powertools/index.html)), are
//! Powertools' own plaintext and stay so: they are read, never sealed or
//! opened.
//!
//! # Cost
//!
//! Sealing or opening a 1 KB response costs about a microsecond of CPU
//! (`benches/encryption.rs`); the envelope adds 37 bytes, the key id and
//! the wrapped key (none for a raw key) to each stored response.

mod envelope;
mod keys;
#[cfg(feature = "kms")]
#[cfg_attr(docsrs, doc(cfg(feature = "kms")))]
pub mod kms;

pub use envelope::key_id_of;
pub(crate) use envelope::{Binding, Holds};
pub use keys::{
    DataKey, KeyError, KeyErrorKind, KeyLookup, KeyProvider, RawKeys, KEY_LEN, MAX_KEY_ID_LEN,
    MAX_WRAPPED_LEN,
};

#[cfg(feature = "kms")]
pub use kms::{KmsKeys, KmsKeysBuilder};

use crate::{
    store::{Record, RecordId, Status},
    Fingerprint, StoreError, StoreErrorKind,
};
use envelope::NotOpened;
use std::{fmt, sync::Arc};
use tracing::{error, warn};

/// Responses above this many bytes are deflated before they are sealed,
/// by default.
pub const DEFAULT_COMPRESS_ABOVE: usize = 4 * 1024;

/// How an engine encrypts stored responses: its keys, the context records
/// are bound to, and whether it seals new responses, opens only, or
/// refuses plaintext. Given to
/// [`EngineBuilder::encryption`](crate::EngineBuilder::encryption).
#[derive(Clone)]
pub struct Encryption {
    keys: Arc<dyn KeyProvider>,
    context: Arc<str>,
    seal: bool,
    refuse_plaintext: bool,
    compress_above: usize,
}

impl Encryption {
    /// Seals every new response under `keys`' sealing key, bound to
    /// `context`: a name for where the records live (the table, the
    /// environment, the key prefix) that stays the same for as long as
    /// records are kept; a record sealed under another context does not
    /// open. Plaintext records already stored keep replaying.
    pub fn new(keys: impl KeyProvider, context: impl Into<String>) -> Self {
        Self {
            keys: Arc::new(keys),
            context: context.into().into(),
            seal: true,
            refuse_plaintext: false,
            compress_above: DEFAULT_COMPRESS_ABOVE,
        }
    }

    /// Opens sealed responses but stores new ones in the clear: the first
    /// step of turning encryption off (until the sealed records have
    /// expired), and of a rolling deployment that turns it on (so that
    /// every instance can open before any seals).
    #[must_use]
    pub fn open_only(mut self) -> Self {
        self.seal = false;
        self
    }

    /// Refuses a stored response that is not sealed, as one that fails to
    /// open: once every plaintext record has expired, so that a record
    /// written in the clear by someone with write access to the table is
    /// never replayed. Cannot be combined with
    /// [`open_only`](Encryption::open_only) (the engine would refuse its
    /// own records): [`EngineBuilder::try_build`](crate::EngineBuilder::try_build)
    /// says so.
    #[must_use]
    pub fn refuse_plaintext(mut self) -> Self {
        self.refuse_plaintext = true;
        self
    }

    /// Deflates responses longer than `bytes` before sealing them, when
    /// that makes them smaller (default [`DEFAULT_COMPRESS_ABOVE`];
    /// `usize::MAX` never does).
    #[must_use]
    pub fn compress_above(mut self, bytes: usize) -> Self {
        self.compress_above = bytes;
        self
    }

    /// Whether new responses are sealed (not [`open_only`](Encryption::open_only)).
    pub fn seals(&self) -> bool {
        self.seal
    }

    /// The context records are bound to.
    pub fn context(&self) -> &str {
        &self.context
    }

    /// The bytes the engine stores for `response`, the completion of the
    /// record `id` claimed for `fingerprint` and expiring at
    /// `expiration_s`: sealed, or `None` when only opening (stored as it
    /// is). For tools and benchmarks; the engine calls it on every
    /// completion.
    pub async fn seal_response(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        expiration_s: u64,
        response: &[u8],
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let binding = Binding {
            context: &self.context,
            id,
            fingerprint,
            holds: Holds::Response {
                status: Status::Completed,
                expiration_s,
            },
        };
        self.seal(&binding, response).await
    }

    /// The plaintext of a completed `record`'s response, as the engine
    /// opens it before a replay: for operators' tools (reading a record
    /// with the keys) and benchmarks. `None` for a record without a
    /// response; a response that fails to open is an
    /// [`Unauthentic`](crate::StoreErrorKind::Unauthentic) error (and an
    /// ERROR log).
    pub async fn open_response(&self, record: &Record) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(stored) = &record.response else {
            return Ok(None);
        };
        let binding = Binding {
            context: &self.context,
            id: &record.id,
            fingerprint: &record.fingerprint,
            holds: Holds::Response {
                status: record.status,
                expiration_s: record.expiration_s,
            },
        };
        self.open(&binding, stored.clone()).await.map(Some)
    }

    /// Why this configuration cannot work, if it cannot.
    pub(crate) fn invalid(&self) -> Option<&'static str> {
        (!self.seal && self.refuse_plaintext).then_some(
            "encryption is open_only and refuse_plaintext: the engine would refuse every \
             response it stores",
        )
    }

    /// The bytes to store for `plaintext`, bound to `binding`: sealed, or
    /// `None` when only opening (stored as it is).
    pub(crate) async fn seal(
        &self,
        binding: &Binding<'_>,
        plaintext: &[u8],
    ) -> Result<Option<Vec<u8>>, StoreError> {
        if !self.seal {
            return Ok(None);
        }
        // Matched here rather than through `KeyLookup::resolve`: a key at
        // hand (a raw key, a cached data key) seals without another future
        // around this one, and this future holds only the pending lookup.
        let key = match self.keys.sealing_key() {
            KeyLookup::Ready(key) => key,
            KeyLookup::Pending(key) => key.await,
        };
        let key = key.map_err(|key_error| {
            warn!(record = %binding.id, step = binding.step_name(), kind = ?key_error.kind(),
                error = %key_error, "no key to seal the {} with; it is not stored", binding.what());
            let kind = match key_error.kind() {
                KeyErrorKind::Unavailable => StoreErrorKind::Unavailable,
                _ => StoreErrorKind::Misconfigured,
            };
            StoreError::new(
                kind,
                format!(
                    "record {}: no key to seal its {}",
                    binding.id,
                    binding.what()
                ),
            )
            .with_source(key_error)
        })?;
        envelope::seal(&key, binding, plaintext, self.compress_above)
            .map(Some)
            .map_err(|failed| {
                StoreError::new(
                    StoreErrorKind::Other,
                    format!(
                        "record {}: its {} could not be sealed",
                        binding.id,
                        binding.what()
                    ),
                )
                .with_source(failed)
            })
    }

    /// The plaintext of `stored`, the response of the record `binding`
    /// describes; or why it must not be replayed (logged as an ERROR with
    /// the record id and key id).
    pub(crate) async fn open(
        &self,
        binding: &Binding<'_>,
        stored: Vec<u8>,
    ) -> Result<Vec<u8>, StoreError> {
        if !envelope::is_sealed(&stored) {
            if self.refuse_plaintext {
                return Err(unauthentic(
                    binding,
                    None,
                    "it is not sealed, and plaintext is refused",
                ));
            }
            return Ok(stored);
        }
        let parsed = match envelope::parse(&stored) {
            Ok(parsed) => parsed,
            Err(malformed) => return Err(unauthentic(binding, None, &malformed.to_string())),
        };
        let key_id = parsed.key_id;
        // As in `seal`: no future around a key at hand.
        let key = match self.keys.opening_key(key_id, parsed.wrapped) {
            KeyLookup::Ready(key) => key,
            KeyLookup::Pending(key) => key.await,
        };
        let key = match key {
            Ok(key) => key,
            Err(key_error) if key_error.kind() == KeyErrorKind::Unavailable => {
                warn!(record = %binding.id, step = binding.step_name(), key_id,
                    error = %key_error,
                    "the key that sealed this record's {} cannot be had for now; it is not used", binding.what());
                return Err(StoreError::new(
                    StoreErrorKind::Unavailable,
                    format!(
                        "record {}: the key that sealed its {} is unavailable",
                        binding.id,
                        binding.what()
                    ),
                )
                .with_source(key_error));
            }
            // A key that cannot be had (not configured here, disabled,
            // deleted, denied) says nothing of the record itself: the
            // operator is told so, lest a good record be forgotten for a
            // key that can be restored. It is refused all the same.
            Err(key_error) if key_error.kind() != KeyErrorKind::Invalid => {
                let why = format!(
                    "its key cannot be used here ({key_error}): the key is not configured, or \
                     was disabled, deleted or denied, which says nothing of the record itself; \
                     restore the key before forgetting the record"
                );
                return Err(unauthentic(binding, Some(key_id), &why));
            }
            Err(key_error) => {
                let why = key_error.to_string();
                return Err(unauthentic(binding, Some(key_id), &why));
            }
        };
        let layout = parsed.layout;
        envelope::open(&key, binding, layout, stored).map_err(|not_opened| match not_opened {
            NotOpened::Unauthentic => unauthentic(
                binding,
                Some(key.id()),
                "it fails authentication: changed, copied from another record or context, or sealed under another key with this id",
            ),
            NotOpened::Inflate(error) => {
                error!(record = %binding.id, step = binding.step_name(), key_id = key.id(), %error,
                    "a sealed {} authenticated but does not inflate; it is not used", binding.what());
                StoreError::corrupt(format!(
                    "record {}: its sealed {} does not inflate",
                    binding.id,
                    binding.what()
                ))
                .with_source(error)
            }
        })
    }
}

/// The refusal of a claim whose lease passed but which carries a sealed
/// response, logged; `None` for any other record. The protocol never
/// writes one: a completion writes `COMPLETED` with the response, a claim
/// or a takeover writes no response. So it is a completed record whose
/// status was changed in the table (the sealed response is bound to
/// `COMPLETED`), and taking it over would run again an operation that ran:
/// it is refused as a record that fails to open, never taken over.
pub(crate) fn sealed_claim(record: &Record) -> Option<StoreError> {
    let stored = record.response.as_deref()?;
    if record.status != Status::InProgress || !envelope::is_sealed(stored) {
        return None;
    }
    Some(unauthentic_response(
        &record.id,
        Some(key_id_of(stored).unwrap_or("malformed")),
        "it is IN_PROGRESS with a sealed response: a completed record whose status was changed",
    ))
}

/// The error for a record whose response (or a step's output) fails to
/// open, logged.
fn unauthentic(binding: &Binding<'_>, key_id: Option<&str>, why: &str) -> StoreError {
    let Some(step) = binding.step_name() else {
        return unauthentic_response(binding.id, key_id, why);
    };
    let key_id = key_id.unwrap_or("none");
    error!(record = %binding.id, step, key_id, why,
        "a recorded step's output failed to open; it is not used, and the step is not run again");
    StoreError::new(
        StoreErrorKind::Unauthentic,
        format!(
            "record {}: step {step:?}'s recorded output does not open (key id {key_id}): {why}",
            binding.id
        ),
    )
}

/// The error for a record whose response fails to open, logged.
fn unauthentic_response(id: &RecordId, key_id: Option<&str>, why: &str) -> StoreError {
    error!(record = %id, key_id = key_id.unwrap_or("none"), why,
        "a stored response failed to open; it is not replayed, not overwritten and not run again");
    StoreError::new(
        StoreErrorKind::Unauthentic,
        format!(
            "record {id}: the stored response does not open (key id {}): {why}",
            key_id.unwrap_or("none")
        ),
    )
}

impl fmt::Debug for Encryption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Encryption")
            .field("keys", &self.keys)
            .field("context", &self.context)
            .field("seal", &self.seal)
            .field("refuse_plaintext", &self.refuse_plaintext)
            .field("compress_above", &self.compress_above)
            .finish()
    }
}
