//! The crate's errors: what the engine returns, and what a store reports.

use std::{error::Error as StdError, fmt, time::Duration};

/// `Result` with this crate's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Any error, boxed: a source kept for `Error::source`, a codec's failure.
pub(crate) type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Why an idempotent execution did not produce a value.
///
/// `E` is the operation's own error type, handed back untouched in
/// [`Error::Operation`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Error<E = std::convert::Infallible> {
    /// Another invocation holds a live claim on this key and has not
    /// completed yet. Retry after `retry_after`: whole seconds, at least
    /// one, never more than the time left on its lease rounded up (from
    /// [`Engine::execute`](crate::Engine::execute) and its kin, that time
    /// left; the HTTP layer asks for less where it knows how long the
    /// route's requests take: see its `in_progress_retry_after`).
    InProgress {
        /// How long to wait before retrying.
        retry_after: Duration,
    },
    /// The key was used before with a different payload. The stored outcome
    /// belongs to that other request and is never served for this one.
    KeyReused,
    /// The store could not be used (unreachable, throttled, misconfigured, or
    /// holding a record it cannot decode): its
    /// [`StoreErrorKind`] says which. The operation did not run, unless
    /// the error comes from a transactional completion (see
    /// [`Engine::execute_transactional`](crate::Engine::execute_transactional)).
    Store(StoreError),
    /// A transactional completion was fenced out: this invocation's lease had
    /// passed and another invocation took the key over. Neither the record
    /// nor the operation's writes were committed.
    ///
    /// Also the answer when the claim itself came back only after its lease
    /// had passed (or with less than 100 ms of it left): the operation did
    /// not run, and the claim was given back. Either way, retry.
    LeaseLost,
    /// The operation ran without a claim (the store was unreachable and the
    /// engine [fails open](crate::EngineBuilder::fail_open)) and returned
    /// writes that need the store: none of them was committed, and its value
    /// was dropped with them. Declare such operations transactional so that
    /// they never run without the store.
    WritesNotCommitted(StoreError),
    /// The operation ran inside a database transaction past the time limit
    /// its caller set (for PostgreSQL, `Engine::run_in_transaction`'s
    /// `TransactionLimits::time_limit`): it was stopped and everything it
    /// did in the transaction, its claim included, was rolled back, so the
    /// key is free and a retry runs it again.
    TimeLimitExceeded {
        /// The limit that was exceeded.
        limit: Duration,
    },
    /// The operation ran and failed; its claim was released so that a retry
    /// can run it again.
    Operation(E),
}

impl<E> Error<E> {
    /// The kind of error, for logs, metrics and mapping to responses.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InProgress { .. } => ErrorKind::InProgress,
            Error::KeyReused => ErrorKind::KeyReused,
            Error::Store(e) => ErrorKind::of_store(e.kind()),
            Error::LeaseLost => ErrorKind::LeaseLost,
            Error::WritesNotCommitted(_) => ErrorKind::WritesNotCommitted,
            Error::TimeLimitExceeded { .. } => ErrorKind::TimeLimitExceeded,
            Error::Operation(_) => ErrorKind::Operation,
        }
    }

    /// This error with the operation's own error made by `f`, which may
    /// turn it into another kind.
    pub(crate) fn map_operation<F>(self, f: impl FnOnce(E) -> Error<F>) -> Error<F> {
        match self {
            Error::InProgress { retry_after } => Error::InProgress { retry_after },
            Error::KeyReused => Error::KeyReused,
            Error::Store(error) => Error::Store(error),
            Error::LeaseLost => Error::LeaseLost,
            Error::WritesNotCommitted(error) => Error::WritesNotCommitted(error),
            Error::TimeLimitExceeded { limit } => Error::TimeLimitExceeded { limit },
            Error::Operation(error) => f(error),
        }
    }

    /// The operation's own error, if that is what this is.
    pub fn into_operation_error(self) -> Option<E> {
        match self {
            Error::Operation(e) => Some(e),
            _ => None,
        }
    }

    /// How long a client should wait before retrying, for the errors where a
    /// retry can succeed.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::InProgress { retry_after } => Some(*retry_after),
            Error::Store(e) | Error::WritesNotCommitted(e) if e.kind().is_transient() => {
                Some(Duration::from_secs(1))
            }
            Error::LeaseLost | Error::TimeLimitExceeded { .. } => Some(Duration::from_secs(1)),
            _ => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InProgress { retry_after } => write!(
                f,
                "a request with this idempotency key is still in progress; retry after {} s",
                retry_after.as_secs()
            ),
            Error::KeyReused => {
                f.write_str("this idempotency key was already used with a different payload")
            }
            Error::Store(e) => write!(f, "idempotency store: {e}"),
            Error::LeaseLost => f.write_str(
                "the claim on this idempotency key expired and was taken over before completion; nothing was committed",
            ),
            Error::WritesNotCommitted(e) => write!(
                f,
                "the operation ran without idempotency (fail-open) but its writes could not be committed: {e}"
            ),
            Error::TimeLimitExceeded { limit } => write!(
                f,
                "the operation ran past its time limit of {} ms; everything it did in the transaction was rolled back and the key is free",
                limit.as_millis()
            ),
            Error::Operation(e) => write!(f, "operation failed: {e}"),
        }
    }
}

impl<E: StdError + 'static> StdError for Error<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::Store(e) | Error::WritesNotCommitted(e) => Some(e),
            Error::Operation(e) => Some(e),
            _ => None,
        }
    }
}

impl<E> From<StoreError> for Error<E> {
    fn from(e: StoreError) -> Self {
        Error::Store(e)
    }
}

/// The kind of an [`Error`], without its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// See [`Error::InProgress`].
    InProgress,
    /// See [`Error::KeyReused`].
    KeyReused,
    /// See [`Error::Store`]: the store could not be used for now (an
    /// outage); a retry later can succeed.
    StoreUnavailable,
    /// See [`Error::Store`]: the store refused in a way a retry will not
    /// fix (misconfigured, a value out of range); an operator must act.
    StoreFailed,
    /// See [`Error::Store`]: a stored record could not be decoded.
    CorruptRecord,
    /// See [`Error::Store`]: a stored response failed to open (see
    /// [`StoreErrorKind::Unauthentic`]).
    UnauthenticRecord,
    /// See [`Error::LeaseLost`].
    LeaseLost,
    /// See [`Error::WritesNotCommitted`].
    WritesNotCommitted,
    /// See [`Error::TimeLimitExceeded`].
    TimeLimitExceeded,
    /// See [`Error::Operation`].
    Operation,
}

impl ErrorKind {
    /// The kind of an [`Error::Store`] whose store error is of `kind`.
    pub(crate) fn of_store(kind: StoreErrorKind) -> Self {
        match kind {
            StoreErrorKind::CorruptRecord => ErrorKind::CorruptRecord,
            StoreErrorKind::Unauthentic => ErrorKind::UnauthenticRecord,
            kind if kind.is_transient() => ErrorKind::StoreUnavailable,
            _ => ErrorKind::StoreFailed,
        }
    }

    /// A stable snake_case name, for log fields and metric dimensions.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InProgress => "in_progress",
            ErrorKind::KeyReused => "key_reused",
            ErrorKind::StoreUnavailable => "store_unavailable",
            ErrorKind::StoreFailed => "store_failed",
            ErrorKind::CorruptRecord => "corrupt_record",
            ErrorKind::UnauthenticRecord => "unauthentic_record",
            ErrorKind::LeaseLost => "lease_lost",
            ErrorKind::WritesNotCommitted => "writes_not_committed",
            ErrorKind::TimeLimitExceeded => "time_limit_exceeded",
            ErrorKind::Operation => "operation_error",
        }
    }
}

/// An error reported by a [`Store`](crate::store::Store), in the crate's own terms:
/// nothing above the store sees the AWS SDK.
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    message: String,
    source: Option<BoxError>,
    refusal: Option<Box<WriteRefusal>>,
}

/// What the store said when it refused one of the operation's own
/// transactional writes (a [`WriteRejected`](StoreErrorKind::WriteRejected)
/// error): for the application to tell the business-rule refusals it
/// expects (a constraint, a condition on a business item) from faults, and
/// answer them as it chooses (the HTTP layer's `on_write_refusal`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteRefusal {
    /// Which of the operation's writes failed, from 0.
    pub index: usize,
    /// The store's code: PostgreSQL's SQLSTATE (`23514`, `23505`,
    /// `P0001`), DynamoDB's cancellation reason (`ConditionalCheckFailed`).
    pub code: String,
    /// The constraint that refused, when the store names one (PostgreSQL).
    pub constraint: Option<String>,
    /// The store's message.
    pub message: String,
}

impl WriteRefusal {
    /// A refusal of write `index`, with the store's `code` and `message`.
    pub fn new(index: usize, code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            index,
            code: code.into(),
            constraint: None,
            message: message.into(),
        }
    }

    /// The constraint that refused.
    #[must_use]
    pub fn with_constraint(mut self, constraint: impl Into<String>) -> Self {
        self.constraint = Some(constraint.into());
        self
    }
}

impl StoreError {
    /// A new error of `kind`, described by `message`.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
            refusal: None,
        }
    }

    /// Attaches what the store said when it refused one of the operation's
    /// writes (for a [`WriteRejected`](StoreErrorKind::WriteRejected) error).
    pub fn with_write_refusal(mut self, refusal: WriteRefusal) -> Self {
        self.refusal = Some(Box::new(refusal));
        self
    }

    /// What the store said when it refused one of the operation's writes,
    /// if this is such a refusal.
    pub fn write_refusal(&self) -> Option<&WriteRefusal> {
        self.refusal.as_deref()
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    pub(crate) fn corrupt(message: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::CorruptRecord, message)
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.kind.as_str())?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

/// The kind of a [`StoreError`]: what the failure means for the request,
/// decided by the store in one place (its `errors` module) and acted on by
/// the engine and the adapters alike.
///
/// | kind | what it means | the engine | HTTP |
/// |---|---|---|---|
/// | [`Unavailable`](StoreErrorKind::Unavailable), [`Throttled`](StoreErrorKind::Throttled) | an outage: the store cannot be reached, timed out, is failing over, or is out of capacity | the only kinds [fail-open](crate::EngineBuilder::fail_open) may run through | 503 with `Retry-After` |
/// | [`Conflict`](StoreErrorKind::Conflict) | the write lost a race with a concurrent one | claims again; ends as in progress, a replay or a 422 | never seen |
/// | [`Misconfigured`](StoreErrorKind::Misconfigured) | the store is not set up as the crate needs (no table, no permission, a bad name or URL, data that is not a record) | fails closed, never retried | 500 |
/// | [`Rejected`](StoreErrorKind::Rejected) | a value out of the store's range, refused before any write | fails closed | 500 |
/// | [`CorruptRecord`](StoreErrorKind::CorruptRecord) | a stored record that does not decode | fails closed, never replayed | 500 |
/// | [`Unauthentic`](StoreErrorKind::Unauthentic) | a stored response that fails to open: changed, copied from another record or context, sealed under a key no longer configured, malformed, or plaintext where it is refused (the engine's [encryption](https://docs.rs/lambda-idempotency/latest/lambda_idempotency/encryption/index.html), feature `encryption`) | fails closed: never replayed, never overwritten, never run again | 500 |
/// | [`WriteRejected`](StoreErrorKind::WriteRejected) | the operation's own transactional writes were refused | releases the claim | 500 |
/// | [`Unsupported`](StoreErrorKind::Unsupported) | an optional capability the store does not offer (recovery points) | fails closed | 500 |
/// | [`Other`](StoreErrorKind::Other) | anything no store could classify | fails closed | 500 |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// An outage: the store could not be reached, did not answer in time,
    /// or is failing over (a read-only or loading node).
    Unavailable,
    /// An outage of capacity: the store refused the request for capacity
    /// reasons (throttling, out of memory).
    Throttled,
    /// The store is not set up as the crate expects (a missing table, a
    /// missing permission, a wrong key schema, a URL that cannot work, a key
    /// holding data that is not a record).
    Misconfigured,
    /// A value the store cannot represent (a duration or a time beyond its
    /// integer types), refused before anything was written.
    Rejected,
    /// A stored record has missing attributes, wrong attribute types or an
    /// unknown status. It is never replayed.
    CorruptRecord,
    /// A stored response that fails to open where the engine encrypts
    /// responses (its
    /// [`encryption`](https://docs.rs/lambda-idempotency/latest/lambda_idempotency/encryption/index.html)): it fails
    /// authentication (a byte changed, a response copied from another
    /// record, a record copied from another context, its expiry or
    /// fingerprint changed), names a key no longer configured, is not a
    /// well-formed envelope, or is plaintext where plaintext is refused.
    /// Reported by the engine, never by a store. The record is never
    /// replayed, never overwritten, and the operation is not run again: an
    /// operator inspects it and forgets it.
    Unauthentic,
    /// The store rejected one of the operation's own transactional writes
    /// (their condition failed, or the transaction is invalid).
    WriteRejected,
    /// A concurrent write to the same record won (a DynamoDB
    /// `TransactionConflict`, a PostgreSQL serialization failure or
    /// deadlock); trying again resolves it.
    Conflict,
    /// The store does not offer what was asked of it: an optional
    /// capability it has not implemented (recovery points,
    /// [`Store::record_step`](crate::store::Store::record_step), on a store
    /// written before them). Refused before anything was written; fails
    /// closed, never retried.
    Unsupported,
    /// Anything else the store reported.
    Other,
}

impl StoreErrorKind {
    /// Whether this is an outage: the store could not serve the call at
    /// all. The only kinds [fail-open](crate::EngineBuilder::fail_open) runs
    /// an operation through without a claim.
    pub fn is_outage(self) -> bool {
        matches!(
            self,
            StoreErrorKind::Unavailable | StoreErrorKind::Throttled
        )
    }

    /// Whether retrying the same call later can succeed: an outage, or a
    /// lost race.
    pub fn is_transient(self) -> bool {
        self.is_outage() || self == StoreErrorKind::Conflict
    }

    /// A stable snake_case name, for log fields and metric dimensions.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Throttled => "throttled",
            StoreErrorKind::Misconfigured => "misconfigured",
            StoreErrorKind::Rejected => "rejected",
            StoreErrorKind::CorruptRecord => "corrupt_record",
            StoreErrorKind::Unauthentic => "unauthentic",
            StoreErrorKind::WriteRejected => "write_rejected",
            StoreErrorKind::Conflict => "conflict",
            StoreErrorKind::Unsupported => "unsupported",
            StoreErrorKind::Other => "other",
        }
    }
}
