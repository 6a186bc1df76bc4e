//! Data keys from AWS KMS: [`KmsKeys`], a [`KeyProvider`] that seals with
//! data keys from `GenerateDataKey` and opens with `Decrypt`, without a KMS
//! call on most requests.
//!
//! ```no_run
//! use lambda_idempotency::{encryption::KmsKeys, Engine, MemoryStore};
//! use std::time::Duration;
//! # async fn example() -> Result<(), lambda_idempotency::encryption::KeyError> {
//! let config = aws_config::load_from_env().await;
//! let keys = KmsKeys::builder(
//!     aws_sdk_kms::Client::new(&config),
//!     "arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab",
//!     "prod/idempotency-table",
//! )
//! .max_age(Duration::from_secs(300))
//! .max_records(1_000)
//! .build()?;
//! let engine = Engine::builder(MemoryStore::new())
//!     .encryption(keys.encryption())
//!     .build();
//! # Ok(()) }
//! ```
//!
//! # Sealing: one data key for many records
//!
//! The first response to seal asks KMS for a data key
//! (`GenerateDataKey`, `AES_256`, under the primary KMS key); the next ones
//! reuse it until it is [`max_age`](KmsKeysBuilder::max_age) old (5
//! minutes by default) or has sealed
//! [`max_records`](KmsKeysBuilder::max_records) responses (10,000 by
//! default), whichever comes first. So N requests in a warm process make
//! ⌈N / max_records⌉ calls when they come faster than `max_records` per
//! `max_age`, and one call per `max_age` otherwise. Requests that need a
//! fresh key at the same moment (a cold start under load, the key just
//! used up) make one call between them, not one each: the first starts it
//! and the others wait for its answer. A replaced data key is dropped: its
//! plaintext lives in aws-lc's key schedule, which aws-lc clears when it
//! frees it, and the copy KMS's answer arrived in is zeroed once the key
//! is built (the SDK's own buffers of the HTTP answer are beyond reach).
//!
//! The envelope of every record carries the data key wrapped by KMS (the
//! `CiphertextBlob`, about 180 bytes with real KMS) and, as its key id, the
//! ARN of the KMS key that wrapped it, as `GenerateDataKey` reports it.
//!
//! # Opening: cached, bound, and only under configured keys
//!
//! A record names a KMS key ARN and carries its wrapped data key. It is
//! opened only if that ARN is one this provider was given (the primary, or
//! one added with [`with_key`](KmsKeysBuilder::with_key)), or the key the
//! primary alias currently names (learned from `GenerateDataKey`'s answer;
//! a process that has not sealed yet learns it with one `GenerateDataKey`
//! when it first meets a record it cannot place). A record naming any other
//! key is refused without a call: a writer to the table cannot make the
//! function use a KMS key it was not configured with.
//!
//! Then `Decrypt` is called with that `KeyId`, so that KMS refuses a wrapped
//! key of another KMS key, and with the encryption context below. The
//! unwrapped key is cached, by its wrapped bytes, for `max_age` and up to
//! [`cache_capacity`](KmsKeysBuilder::cache_capacity) keys (1,000 by
//! default, least recently used out first): replays of records sealed under
//! one data key pay one `Decrypt` per process and `max_age`. Concurrent
//! replays needing the same data key make one call. The data key this
//! process sealed with is in the cache from the start. A KMS key disabled
//! or scheduled for deletion stops opening records here within `max_age`.
//!
//! # The encryption context
//!
//! Every `GenerateDataKey` and `Decrypt` carries the encryption context
//! `{"lambda-idempotency": <context>}`, with the context given to
//! [`KmsKeys::builder`]: KMS binds the wrapped key to it, so a wrapped
//! data key copied from another table or environment is refused by KMS
//! itself (`InvalidCiphertextException`), before the envelope's own check.
//! It also appears in CloudTrail, and a key policy can allow a function
//! its own context only (`kms:EncryptionContext:lambda-idempotency`).
//! The engine's [`Encryption`] context is not visible to a key provider:
//! [`KmsKeys::encryption`] builds the [`Encryption`] with the same string,
//! so the two cannot differ.
//!
//! # Keys, and rotating them
//!
//! The primary is any KMS key identifier (a key ARN, a key id, an alias
//! name or an alias ARN); the records name the key ARN KMS reports. KMS's
//! own automatic rotation of key material changes nothing here (the key
//! ARN stays, and KMS opens what older material wrapped). To move to
//! another KMS key, make it the primary and add the old key's ARN with
//! [`with_key`](KmsKeysBuilder::with_key) for the engine's retention
//! (24 hours by default). Repointing an alias is such a move: the records
//! sealed through it name the old key's ARN, which must be added. A record
//! whose KMS key is no longer configured is refused, as one that fails to
//! open (never replayed, never run again).
//!
//! # Errors: refused or an outage
//!
//! The engine answers a key provider's [`KeyErrorKind::Unavailable`] as a
//! store outage (503, nothing run) and every other kind as final: a record
//! that cannot be opened is refused
//! ([`StoreErrorKind::Unauthentic`](crate::StoreErrorKind::Unauthentic),
//! never replayed, never run again), a response that cannot be sealed is not
//! stored ([`StoreErrorKind::Misconfigured`](crate::StoreErrorKind::Misconfigured)).
//! KMS's answers map so:
//!
//! | KMS answers | kind | a replay | a completion |
//! |---|---|---|---|
//! | a timeout, no connection, an answer that does not parse, a 5xx, `KMSInternalException`, `DependencyTimeoutException`, `KeyUnavailableException`, `ThrottlingException` (after the SDK's retries), `ExpiredTokenException` | [`Unavailable`](KeyErrorKind::Unavailable) | 503, not run | not stored |
//! | `InvalidCiphertextException`, `IncorrectKeyException`, a plaintext that is not 32 bytes, a key other than the one named | [`Invalid`](KeyErrorKind::Invalid) | refused | not stored |
//! | `NotFoundException`, `DisabledException`, `KMSInvalidStateException` (pending deletion), `AccessDeniedException`, `InvalidKeyUsageException`; a key not configured here | [`UnknownKey`](KeyErrorKind::UnknownKey) | refused | not stored |
//! | anything else: another 4xx, no region or credentials, a request the SDK cannot build | [`Other`](KeyErrorKind::Other) | refused | not stored |
//!
//! A key that is disabled, deleted or denied is refused rather than an
//! outage: the records under it do not open, whatever the retry, until an
//! operator acts; retrying clients would only repeat the call. Throttling is
//! an outage: the SDK has retried it already, and the next request may get
//! through. Nothing panics on any answer. A refusal for a key that cannot
//! be used (every kind but `Invalid`) says so in its error and its ERROR
//! log: nothing shows the record was changed, so the operator restores
//! the key or its access rather than forgetting records that are good.
//!
//! # When KMS cannot be reached
//!
//! As `tests/kms.rs` shows against a KMS cut off mid-test:
//!
//! - **a claim** of a new key needs no key: it is written as always, and
//!   the operation runs;
//! - **a completion** needs a data key to seal with: within the bounds the
//!   cached one serves and nothing changes; past them, the response cannot
//!   be sealed and is not stored. The first caller still gets it
//!   ([`OutcomeKind::NotRecorded`](crate::OutcomeKind::NotRecorded)), the
//!   claim stays until its lease passes, and a retry after that runs the
//!   operation again, as after any completion the store refused; a
//!   transactional completion commits nothing and answers an outage;
//! - **a replay** needs the data key of its record: a cached one serves;
//!   otherwise the request is answered as a store outage (503,
//!   `Retry-After`), the operation is not run, the record is untouched and
//!   replays once KMS answers again. Fail-open does not apply: the record
//!   says the operation ran.
//!
//! So set the KMS client's timeouts (`aws_config::timeout::TimeoutConfig`:
//! an operation timeout of a second or so) to well under the function's
//! own: the SDK's defaults wait longer than a Lambda invocation may.
//!
//! # Cost
//!
//! KMS charges $0.03 per 10,000 requests. At 100 requests a second, with
//! the defaults, a warm process makes one `GenerateDataKey` per 5 minutes
//! (30,000 requests, under `max_records`), about 12 an hour; with
//! `max_records` 1,000, 30 in 5 minutes. Replays cost one `Decrypt` per data
//! key, process and `max_age`. BENCHMARKS.md has the table.

mod errors;
#[cfg(test)]
mod tests;

use super::{
    keys::{DataKey, KeyError, KeyErrorKind, KeyLookup, KeyProvider, KEY_LEN, MAX_KEY_ID_LEN},
    Encryption,
};
use aws_sdk_kms::{primitives::Blob, types::DataKeySpec, Client};
use futures_util::future::{BoxFuture, FutureExt, Shared};
use lru::LruCache;
use std::{
    collections::HashMap,
    fmt,
    num::NonZeroUsize,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};
use zeroize::Zeroize;

/// How long a data key seals, and an unwrapped one is kept, by default.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(300);

/// How many responses a data key seals, by default.
pub const DEFAULT_MAX_RECORDS: u64 = 10_000;

/// The most responses a data key may seal: past 2^32 random 96-bit nonces
/// the chance of a repeated one passes NIST's bound.
pub const MAX_RECORDS_LIMIT: u64 = 1 << 32;

/// How many unwrapped data keys are kept, by default.
pub const DEFAULT_CACHE_CAPACITY: usize = 1_000;

/// The key of the KMS encryption context; its value is the context given
/// to [`KmsKeys::builder`].
pub const ENCRYPTION_CONTEXT_KEY: &str = "lambda-idempotency";

/// Data keys from AWS KMS: `GenerateDataKey` under the primary KMS key to
/// seal (one data key for many records, within the bounds set), `Decrypt`
/// to open (cached), every call bound to an encryption context. See the
/// [module docs](self).
///
/// Cheap to clone: clones share the data keys and the cache.
#[derive(Clone)]
pub struct KmsKeys {
    inner: Arc<Inner>,
}

/// Builds [`KmsKeys`]: [`KmsKeys::builder`].
#[must_use]
pub struct KmsKeysBuilder {
    client: Client,
    primary: String,
    others: Vec<String>,
    context: String,
    max_age: Duration,
    max_records: u64,
    cache_capacity: usize,
}

impl KmsKeys {
    /// Keys that seal under the KMS key `primary` (a key ARN, key id, alias
    /// name or alias ARN), through `client`, bound to `context`: a name for
    /// where the records live, the same string the engine's [`Encryption`]
    /// is given ([`KmsKeys::encryption`] does so).
    pub fn builder(
        client: Client,
        primary: impl Into<String>,
        context: impl Into<String>,
    ) -> KmsKeysBuilder {
        KmsKeysBuilder {
            client,
            primary: primary.into(),
            others: Vec::new(),
            context: context.into(),
            max_age: DEFAULT_MAX_AGE,
            max_records: DEFAULT_MAX_RECORDS,
            cache_capacity: DEFAULT_CACHE_CAPACITY,
        }
    }

    /// The engine's encryption with these keys, bound to the same context.
    pub fn encryption(&self) -> Encryption {
        Encryption::new(self.clone(), self.context())
    }

    /// The context records and wrapped keys are bound to.
    pub fn context(&self) -> &str {
        &self.inner.context
    }

    /// The KMS key new responses are sealed under, as given.
    pub fn primary(&self) -> &str {
        &self.inner.primary
    }
}

impl KmsKeysBuilder {
    /// Also opens records sealed under the KMS key `key_arn`: an older
    /// primary, during a rotation, given by its key ARN (the records name
    /// it so).
    pub fn with_key(mut self, key_arn: impl Into<String>) -> Self {
        self.others.push(key_arn.into());
        self
    }

    /// How long a data key seals new responses, and an unwrapped data key
    /// is kept without asking KMS again (default [`DEFAULT_MAX_AGE`]).
    pub fn max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }

    /// How many responses a data key seals before the next is asked for
    /// (default [`DEFAULT_MAX_RECORDS`]; 1 to [`MAX_RECORDS_LIMIT`]).
    pub fn max_records(mut self, max_records: u64) -> Self {
        self.max_records = max_records;
        self
    }

    /// How many unwrapped data keys are kept for replays (default
    /// [`DEFAULT_CACHE_CAPACITY`]; at least 1).
    pub fn cache_capacity(mut self, capacity: usize) -> Self {
        self.cache_capacity = capacity;
        self
    }

    /// The keys, or why these settings cannot work
    /// ([`KeyErrorKind::Invalid`]).
    pub fn build(self) -> Result<KmsKeys, KeyError> {
        let invalid = |message: String| Err(KeyError::new(KeyErrorKind::Invalid, message));
        if self.primary.is_empty() || self.primary.len() > MAX_KEY_ID_LEN {
            return invalid(format!(
                "the primary KMS key must be 1 to {MAX_KEY_ID_LEN} bytes; `{}` is {}",
                self.primary.escape_debug(),
                self.primary.len()
            ));
        }
        for other in &self.others {
            if !is_key_arn(other) || other.len() > MAX_KEY_ID_LEN {
                return invalid(format!(
                    "`{}` is not a KMS key ARN (arn:aws:kms:<region>:<account>:key/<id>): records \
                     name the key ARN that sealed them, so an older key is given by its ARN \
                     (aws kms describe-key --key-id <alias>)",
                    other.escape_debug()
                ));
            }
        }
        if self.context.is_empty() {
            return invalid("the context must not be empty".to_owned());
        }
        if self.max_records == 0 || self.max_records > MAX_RECORDS_LIMIT {
            return invalid(format!(
                "max_records must be 1 to {MAX_RECORDS_LIMIT}; it is {}",
                self.max_records
            ));
        }
        if self.max_age.is_zero() {
            return invalid("max_age must be more than zero".to_owned());
        }
        let Some(capacity) = NonZeroUsize::new(self.cache_capacity) else {
            return invalid("the cache capacity must be at least 1".to_owned());
        };
        let mut configured: Vec<Arc<str>> = vec![self.primary.as_str().into()];
        for other in self.others {
            if !configured.iter().any(|known| **known == *other) {
                configured.push(other.into());
            }
        }
        Ok(KmsKeys {
            inner: Arc::new(Inner {
                client: self.client,
                primary: self.primary.into(),
                configured,
                context: self.context.into(),
                max_age: self.max_age,
                max_records: self.max_records,
                sealing: Mutex::new(Sealing::default()),
                opening: Mutex::new(Opening {
                    keys: LruCache::new(capacity),
                    flights: HashMap::new(),
                }),
            }),
        })
    }
}

/// Whether `id` is a KMS key ARN (not an alias's).
fn is_key_arn(id: &str) -> bool {
    let mut parts = id.splitn(6, ':');
    matches!(
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next(), parts.next()),
        (Some("arn"), Some(partition), Some("kms"), Some(_region), Some(_account), Some(resource))
            if !partition.is_empty()
                && resource.strip_prefix("key/").is_some_and(|key| !key.is_empty())
    )
}

/// One call to KMS that concurrent requests share, and its answer.
type Flight = Shared<BoxFuture<'static, Result<DataKey, FlightError>>>;

/// A KMS failure, shared by every request that waited on the call.
#[derive(Debug, Clone)]
struct FlightError {
    kind: KeyErrorKind,
    message: Arc<str>,
}

impl From<KeyError> for FlightError {
    fn from(error: KeyError) -> Self {
        Self {
            kind: error.kind(),
            message: error.to_string().into(),
        }
    }
}

impl FlightError {
    fn to_key_error(&self) -> KeyError {
        KeyError::new(self.kind, self.message.to_string())
    }
}

struct Inner {
    client: Client,
    /// As given: what `GenerateDataKey` is called with.
    primary: Arc<str>,
    /// The primary and the older keys, as given: the key ids a record may
    /// name.
    configured: Vec<Arc<str>>,
    context: Arc<str>,
    max_age: Duration,
    max_records: u64,
    sealing: Mutex<Sealing>,
    opening: Mutex<Opening>,
}

#[derive(Default)]
struct Sealing {
    current: Option<Current>,
    /// The `GenerateDataKey` under way, if one is.
    flight: Option<Flight>,
    /// The key ARN the primary named at the last `GenerateDataKey`.
    primary_arn: Option<Arc<str>>,
}

/// The data key that seals, and how much it has.
struct Current {
    key: DataKey,
    since: Instant,
    sealed: u64,
}

struct Opening {
    /// Unwrapped data keys by their wrapped bytes, with when they were
    /// unwrapped.
    keys: LruCache<Arc<[u8]>, (DataKey, Instant)>,
    /// The `Decrypt` calls under way, by wrapped bytes.
    flights: HashMap<Arc<[u8]>, Flight>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Inner {
    /// The current data key, counted as one more response sealed, if it is
    /// within its bounds.
    fn take_current(&self, sealing: &mut Sealing) -> Option<DataKey> {
        let current = sealing.current.as_mut()?;
        if current.sealed < self.max_records && current.since.elapsed() < self.max_age {
            current.sealed += 1;
            return Some(current.key.clone());
        }
        // Used up: dropped now rather than when the next one arrives.
        sealing.current = None;
        None
    }

    /// The data key to seal the next response with: the current one, or
    /// a fresh one from the `GenerateDataKey` that every request needing
    /// one waits on.
    async fn sealing_key(&self) -> Result<DataKey, KeyError> {
        loop {
            let flight = {
                let mut sealing = lock(&self.sealing);
                if let Some(key) = self.take_current(&mut sealing) {
                    return Ok(key);
                }
                match &sealing.flight {
                    Some(flight) => flight.clone(),
                    None => {
                        let flight = generate(
                            self.client.clone(),
                            Arc::clone(&self.primary),
                            Arc::clone(&self.context),
                        )
                        .boxed()
                        .shared();
                        sealing.flight = Some(flight.clone());
                        flight
                    }
                }
            };
            let answer = flight.clone().await;
            {
                let mut sealing = lock(&self.sealing);
                // The first waiter to wake installs the answer.
                if sealing
                    .flight
                    .as_ref()
                    .is_some_and(|current| current.ptr_eq(&flight))
                {
                    sealing.flight = None;
                    if let Ok(key) = &answer {
                        sealing.primary_arn = Some(key.id().into());
                        sealing.current = Some(Current {
                            key: key.clone(),
                            since: Instant::now(),
                            sealed: 0,
                        });
                        drop(sealing);
                        self.remember(key.clone());
                    }
                }
            }
            if let Err(failed) = answer {
                return Err(failed.to_key_error());
            }
            // Take a use of the new key like any other request (it may be
            // used up already, by as many waiters as it seals).
        }
    }

    /// Keeps an unwrapped (or freshly generated) key for replays.
    fn remember(&self, key: DataKey) {
        let wrapped: Arc<[u8]> = key.wrapped().into();
        lock(&self.opening).keys.put(wrapped, (key, Instant::now()));
    }

    /// The cached key for `wrapped` named `key_id`, if it is within
    /// `max_age`.
    fn cached(&self, key_id: &str, wrapped: &[u8]) -> Option<DataKey> {
        let mut opening = lock(&self.opening);
        let (key, since) = opening.keys.get(wrapped)?;
        if since.elapsed() >= self.max_age {
            opening.keys.pop(wrapped);
            return None;
        }
        // The key id is bound into the envelope's associated data too; a
        // record naming another key than the one this blob was unwrapped
        // under goes to KMS, which refuses it.
        (key.id() == key_id).then(|| key.clone())
    }

    /// Whether a record naming `key_id` may be opened: a configured key, or
    /// the key the primary named at the last `GenerateDataKey`.
    fn is_known(&self, key_id: &str) -> bool {
        self.configured.iter().any(|known| **known == *key_id)
            || lock(&self.sealing)
                .primary_arn
                .as_deref()
                .is_some_and(|arn| arn == key_id)
    }

    /// The data key `wrapped`, unwrapped by KMS under `key_id`.
    async fn opening_key(&self, key_id: &str, wrapped: &[u8]) -> Result<DataKey, KeyError> {
        if !self.is_known(key_id) {
            // The primary given as an alias (or a key id) and not resolved
            // yet in this process: one GenerateDataKey says which key ARN it
            // names, and gives the next completion its key.
            let unresolved =
                !is_key_arn(&self.primary) && lock(&self.sealing).primary_arn.is_none();
            if unresolved {
                self.sealing_key().await?;
            }
            if !self.is_known(key_id) {
                return Err(KeyError::new(
                    KeyErrorKind::UnknownKey,
                    format!(
                        "the record names the KMS key `{}`, which is not configured (primary `{}`; \
                         add an older key with KmsKeysBuilder::with_key)",
                        key_id.escape_debug(),
                        self.primary
                    ),
                ));
            }
        }
        let flight = {
            let mut opening = lock(&self.opening);
            match opening.flights.get(wrapped) {
                Some(flight) => flight.clone(),
                None => {
                    let wrapped: Arc<[u8]> = wrapped.into();
                    let flight = unwrap(
                        self.client.clone(),
                        key_id.into(),
                        Arc::clone(&wrapped),
                        Arc::clone(&self.context),
                    )
                    .boxed()
                    .shared();
                    opening.flights.insert(wrapped, flight.clone());
                    flight
                }
            }
        };
        let answer = flight.clone().await;
        {
            let mut opening = lock(&self.opening);
            if opening
                .flights
                .get(wrapped)
                .is_some_and(|current| current.ptr_eq(&flight))
            {
                opening.flights.remove(wrapped);
                if let Ok(key) = &answer {
                    opening
                        .keys
                        .put(key.wrapped().into(), (key.clone(), Instant::now()));
                }
            }
        }
        let key = answer.map_err(|failed| failed.to_key_error())?;
        if key.id() == key_id {
            return Ok(key);
        }
        // Joined a call for the same wrapped bytes under another key id:
        // asked again, under this record's.
        unwrap(
            self.client.clone(),
            key_id.into(),
            wrapped.into(),
            Arc::clone(&self.context),
        )
        .await
        .map_err(|failed| failed.to_key_error())
    }
}

impl KeyProvider for KmsKeys {
    fn sealing_key(&self) -> KeyLookup<'_> {
        // Most requests: the current key, without an allocation.
        if let Some(key) = self.inner.take_current(&mut lock(&self.inner.sealing)) {
            return KeyLookup::Ready(Ok(key));
        }
        KeyLookup::Pending(Box::pin(self.inner.sealing_key()))
    }

    fn opening_key<'a>(&'a self, key_id: &'a str, wrapped: &'a [u8]) -> KeyLookup<'a> {
        if let Some(key) = self.inner.cached(key_id, wrapped) {
            return KeyLookup::Ready(Ok(key));
        }
        KeyLookup::Pending(Box::pin(self.inner.opening_key(key_id, wrapped)))
    }
}

/// A fresh data key from `GenerateDataKey` under `primary`.
async fn generate(
    client: Client,
    primary: Arc<str>,
    context: Arc<str>,
) -> Result<DataKey, FlightError> {
    let answer = client
        .generate_data_key()
        .key_id(&*primary)
        .key_spec(DataKeySpec::Aes256)
        .encryption_context(ENCRYPTION_CONTEXT_KEY, &*context)
        .send()
        .await
        .map_err(|error| errors::from_sdk("GenerateDataKey", &primary, error))?;
    let mut answer = answer;
    let wrapped = answer.ciphertext_blob.take().map(Blob::into_inner);
    let plaintext = answer.plaintext.take();
    // The key ARN KMS used: what records name, whatever the primary was
    // given as.
    let key_id = answer.key_id.take().unwrap_or_else(|| primary.to_string());
    let (Some(wrapped), Some(plaintext)) = (wrapped, plaintext) else {
        return Err(KeyError::new(
            KeyErrorKind::Invalid,
            format!("KMS GenerateDataKey with key `{primary}` answered without a data key"),
        )
        .into());
    };
    data_key(key_id, wrapped, plaintext, "GenerateDataKey").map_err(Into::into)
}

/// The data key `wrapped`, from `Decrypt` under `key_id`.
async fn unwrap(
    client: Client,
    key_id: Arc<str>,
    wrapped: Arc<[u8]>,
    context: Arc<str>,
) -> Result<DataKey, FlightError> {
    let answer = client
        .decrypt()
        .key_id(&*key_id)
        .ciphertext_blob(Blob::new(wrapped.to_vec()))
        .encryption_context(ENCRYPTION_CONTEXT_KEY, &*context)
        .send()
        .await
        .map_err(|error| errors::from_sdk("Decrypt", &key_id, error))?;
    let mut answer = answer;
    let plaintext = answer.plaintext.take();
    // KMS refuses a KeyId that did not wrap the blob; checked here too.
    if let Some(used) = answer.key_id.as_deref() {
        if is_key_arn(&key_id) && used != &*key_id {
            return Err(KeyError::new(
                KeyErrorKind::Invalid,
                format!("KMS Decrypt was asked for key `{key_id}` and used `{used}`"),
            )
            .into());
        }
    }
    let Some(plaintext) = plaintext else {
        return Err(KeyError::new(
            KeyErrorKind::Invalid,
            format!("KMS Decrypt with key `{key_id}` answered without a plaintext"),
        )
        .into());
    };
    data_key(key_id.to_string(), wrapped.to_vec(), plaintext, "Decrypt").map_err(Into::into)
}

/// A data key from KMS's plaintext, the copies of it zeroed.
fn data_key(
    key_id: String,
    wrapped: Vec<u8>,
    plaintext: Blob,
    operation: &str,
) -> Result<DataKey, KeyError> {
    let mut plaintext = plaintext.into_inner();
    let mut key = [0u8; KEY_LEN];
    let built = if plaintext.len() == KEY_LEN {
        key.copy_from_slice(&plaintext);
        DataKey::new(key_id, wrapped, &key)
    } else {
        Err(KeyError::new(
            KeyErrorKind::Invalid,
            format!(
                "KMS {operation} with key `{key_id}` answered a {}-byte data key, not {KEY_LEN}",
                plaintext.len()
            ),
        ))
    };
    plaintext.zeroize();
    key.zeroize();
    built
}

impl fmt::Debug for KmsKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KmsKeys")
            .field("primary", &self.inner.primary)
            .field("keys", &self.inner.configured)
            .field("context", &self.inner.context)
            .field("max_age", &self.inner.max_age)
            .field("max_records", &self.inner.max_records)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for KmsKeysBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KmsKeysBuilder")
            .field("primary", &self.primary)
            .field("keys", &self.others)
            .field("context", &self.context)
            .field("max_age", &self.max_age)
            .field("max_records", &self.max_records)
            .field("cache_capacity", &self.cache_capacity)
            .finish_non_exhaustive()
    }
}
