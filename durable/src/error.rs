//! Why an idempotent durable execution did not run, as the SDK reports it.

use aws_durable_execution_sdk::{BoxError, TypedError};
use lambda_idempotency::{Error, StoreError, StoreErrorKind};
use std::time::Duration;

/// Why an idempotent durable execution, or a step's body, did not run.
///
/// Returned boxed in an `aws_durable_execution_sdk::TypedError`, so that
/// the execution's `ErrorType` names it:
/// [`error_type`](DurableError::error_type).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DurableError {
    /// The key function found no key in the input event.
    #[error("the input event holds no idempotency key")]
    KeyMissing,
    /// Another execution (or, for a step, another run of it) holds the key
    /// and has not completed.
    #[error(
        "another execution (or another run of this step) holds this idempotency key; it may be retried after {retry_after:?}"
    )]
    InProgress {
        /// The time left on the other execution's claim.
        retry_after: Duration,
    },
    /// The key was used before with another input.
    #[error("this idempotency key was used with another input")]
    KeyReused,
    /// The input event does not serialise, so it has no fingerprint.
    #[error("the input event does not serialise: {0}")]
    Event(#[source] serde_json::Error),
    /// The store failed (its kind says how).
    #[error("the idempotency store failed: {0}")]
    Store(#[source] StoreError),
    /// A stored completion was fenced out: the claim's lease passed.
    #[error("the claim's lease passed and the key was taken over")]
    LeaseLost,
}

impl DurableError {
    /// The `ErrorType` the execution fails with: `IdempotencyKeyMissing`,
    /// `IdempotencyAlreadyInProgress` (Powertools' name),
    /// `IdempotencyKeyReused`, `IdempotencyInvalidEvent`,
    /// `IdempotencyStoreError`, `IdempotencyLeaseLost`.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::KeyMissing => "IdempotencyKeyMissing",
            Self::InProgress { .. } => "IdempotencyAlreadyInProgress",
            Self::KeyReused => "IdempotencyKeyReused",
            Self::Event(_) => "IdempotencyInvalidEvent",
            Self::Store(_) => "IdempotencyStoreError",
            Self::LeaseLost => "IdempotencyLeaseLost",
        }
    }

    /// The `DurableError` in an error's chain of sources, if any: in a
    /// `StepError` given to a retry strategy, say.
    pub fn find<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a DurableError> {
        let mut source = Some(error);
        while let Some(current) = source {
            if let Some(found) = current.downcast_ref::<DurableError>() {
                return Some(found);
            }
            source = current.source();
        }
        None
    }

    pub(super) fn into_boxed(self) -> BoxError {
        Box::new(TypedError::with_type(self.error_type(), self))
    }

    pub(super) fn from_engine<E>(error: Error<E>) -> Self {
        match error {
            Error::InProgress { retry_after } => Self::InProgress { retry_after },
            Error::KeyReused => Self::KeyReused,
            Error::Store(error) | Error::WritesNotCommitted(error) => Self::Store(error),
            Error::LeaseLost => Self::LeaseLost,
            Error::TimeLimitExceeded { limit } => Self::Store(StoreError::new(
                StoreErrorKind::Unavailable,
                format!(
                    "the operation ran past its time limit of {} ms and was rolled back",
                    limit.as_millis()
                ),
            )),
            // The callers take the operation's own errors out first.
            Error::Operation(_) => Self::Store(StoreError::new(
                StoreErrorKind::Other,
                "the operation failed",
            )),
            // The engine's error is non-exhaustive from this crate: one
            // added after this release fails the step as the store's.
            _ => Self::Store(StoreError::new(
                StoreErrorKind::Other,
                "the idempotency engine failed",
            )),
        }
    }
}
