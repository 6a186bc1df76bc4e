//! SDK errors translated into the crate's [`StoreError`]s: nothing above the
//! store sees the SDK.

use super::codec::Item;
use crate::{StoreError, StoreErrorKind};
use aws_sdk_dynamodb::{
    config::http::HttpResponse,
    error::{DisplayErrorContext, ProvideErrorMetadata, SdkError},
    operation::{
        delete_item::DeleteItemError, put_item::PutItemError, update_item::UpdateItemError,
    },
};
use std::{error::Error as StdError, fmt::Debug};

/// What a conditional single-item write answered.
#[derive(Debug)]
pub(super) enum Answer {
    /// The write applied.
    Applied,
    /// The condition failed; the old item, if DynamoDB returned it
    /// (`ReturnValuesOnConditionCheckFailure=ALL_OLD`).
    ConditionFailed(Option<Item>),
}

/// The error of an operation that can fail its condition, and return the
/// old item when it does.
pub(super) trait ConditionalError:
    ProvideErrorMetadata + StdError + Send + Sync + Sized + 'static
{
    /// The old item, if `self` is a conditional check failure.
    fn old_item(self) -> Option<Option<Item>>;

    /// Whether `self` is a conditional check failure.
    fn is_condition_failure(&self) -> bool;
}

macro_rules! conditional_error {
    ($($error:ident),*) => {$(
        impl ConditionalError for $error {
            fn old_item(self) -> Option<Option<Item>> {
                match self {
                    $error::ConditionalCheckFailedException(failed) => Some(failed.item),
                    _ => None,
                }
            }

            fn is_condition_failure(&self) -> bool {
                matches!(self, $error::ConditionalCheckFailedException(_))
            }
        }
    )*};
}

conditional_error!(PutItemError, UpdateItemError, DeleteItemError);

/// Reads a conditional write's result: applied, the condition failed (with
/// the old item), or any other failure as a [`StoreError`].
pub(super) fn conditional<O, E>(
    result: Result<O, SdkError<E, HttpResponse>>,
    operation: &'static str,
) -> Result<Answer, StoreError>
where
    E: ConditionalError,
{
    match result {
        Ok(_) => Ok(Answer::Applied),
        Err(SdkError::ServiceError(service)) if service.err().is_condition_failure() => Ok(
            Answer::ConditionFailed(service.into_err().old_item().flatten()),
        ),
        Err(error) => Err(from_sdk(operation, error)),
    }
}

/// Maps a failed SDK call that is not one of the protocol's expected
/// conditional failures.
pub(super) fn from_sdk<E>(operation: &'static str, error: SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
{
    let kind = match &error {
        SdkError::ServiceError(service) => match kind_of_code(service.err().code()) {
            // A 5xx without an error code of DynamoDB's (a proxy, a load
            // balancer in front of it): the service did not answer.
            StoreErrorKind::Other if service.raw().status().is_server_error() => {
                StoreErrorKind::Unavailable
            }
            kind => kind,
        },
        SdkError::ConstructionFailure(_) => StoreErrorKind::Misconfigured,
        // Failing before anything was sent: no region or endpoint, no
        // credentials (the SDK reports both as dispatch failures of kind
        // "other" or "user"). No retry makes them appear.
        SdkError::DispatchFailure(failure) if !failure.is_io() && !failure.is_timeout() => {
            StoreErrorKind::Misconfigured
        }
        // Timeouts, connection failures and unparseable answers: the store
        // could not be reached or did not answer in time.
        _ => StoreErrorKind::Unavailable,
    };
    let message = format!(
        "DynamoDB {operation} failed: {}",
        DisplayErrorContext(&error)
    );
    StoreError::new(kind, message).with_source(error)
}

/// Maps a failed `TransactWriteItems` that carries the operation's own
/// writes. The completion update is built here and always valid, so a
/// request DynamoDB rejects as invalid (`ValidationException`: an item
/// without its key, two actions on one item, too many items) or that the SDK
/// could not even build is about those writes: rejected, not retryable.
pub(super) fn from_transaction_sdk<E>(
    operation: &'static str,
    error: SdkError<E, HttpResponse>,
) -> StoreError
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
{
    let rejected = match &error {
        SdkError::ServiceError(service) => service.err().code() == Some("ValidationException"),
        SdkError::ConstructionFailure(_) => true,
        _ => false,
    };
    let mapped = from_sdk(operation, error);
    if rejected {
        StoreError::new(StoreErrorKind::WriteRejected, mapped.to_string()).with_source(mapped)
    } else {
        mapped
    }
}

/// The kind of a DynamoDB error code (also the codes of transaction
/// cancellation reasons).
pub(super) fn kind_of_code(code: Option<&str>) -> StoreErrorKind {
    match code {
        Some(
            "ProvisionedThroughputExceededException"
            | "ProvisionedThroughputExceeded"
            | "ThrottlingException"
            | "ThrottlingError"
            | "RequestLimitExceeded",
        ) => StoreErrorKind::Throttled,
        Some(
            "TransactionConflict"
            | "TransactionConflictException"
            | "TransactionInProgressException",
        ) => StoreErrorKind::Conflict,
        Some("InternalServerError" | "ServiceUnavailable") => StoreErrorKind::Unavailable,
        // A global table's write raced one in another region.
        Some("ReplicatedWriteConflictException") => StoreErrorKind::Conflict,
        Some(
            "ResourceNotFoundException"
            | "AccessDeniedException"
            | "UnrecognizedClientException"
            | "MissingAuthenticationTokenException"
            | "InvalidSignatureException"
            | "ExpiredTokenException"
            | "ValidationException",
        ) => StoreErrorKind::Misconfigured,
        Some("ConditionalCheckFailed" | "ValidationError" | "ItemCollectionSizeLimitExceeded") => {
            StoreErrorKind::WriteRejected
        }
        _ => StoreErrorKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttling_and_outages_are_transient_but_misconfiguration_is_not() {
        for code in [
            "ProvisionedThroughputExceededException",
            "ThrottlingException",
            "InternalServerError",
        ] {
            assert!(kind_of_code(Some(code)).is_transient(), "{code}");
        }
        for code in [
            "ResourceNotFoundException",
            "AccessDeniedException",
            "ExpiredTokenException",
            "UnrecognizedClientException",
        ] {
            assert_eq!(
                kind_of_code(Some(code)),
                StoreErrorKind::Misconfigured,
                "{code}"
            );
            assert!(!kind_of_code(Some(code)).is_transient());
        }
        for code in [
            "TransactionConflict",
            "TransactionConflictException",
            "ReplicatedWriteConflictException",
        ] {
            assert_eq!(kind_of_code(Some(code)), StoreErrorKind::Conflict, "{code}");
        }
        assert_eq!(kind_of_code(None), StoreErrorKind::Other);
    }
}
