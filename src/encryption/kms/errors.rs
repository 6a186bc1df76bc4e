//! KMS's failures as the engine reads them: an outage
//! ([`KeyErrorKind::Unavailable`]: 503, nothing run) or final (a record
//! refused, a response not stored). The table is in the module docs of
//! [`kms`](super).

use crate::encryption::{KeyError, KeyErrorKind};
use aws_sdk_kms::{
    error::{DisplayErrorContext, ProvideErrorMetadata, SdkError},
    operation::{decrypt::DecryptError, generate_data_key::GenerateDataKeyError},
};
use std::error::Error as StdError;

/// An operation's error, classified by its modelled variant first (a
/// variant is what the SDK matched the code to), then by its code.
pub(super) trait KmsError: ProvideErrorMetadata + StdError + Send + Sync + 'static {
    /// The kind of a modelled error, if this is one the crate knows.
    fn modelled_kind(&self) -> Option<KeyErrorKind>;
}

impl KmsError for GenerateDataKeyError {
    fn modelled_kind(&self) -> Option<KeyErrorKind> {
        use GenerateDataKeyError as E;
        Some(match self {
            E::KmsInternalException(_)
            | E::DependencyTimeoutException(_)
            | E::KeyUnavailableException(_) => KeyErrorKind::Unavailable,
            E::NotFoundException(_)
            | E::DisabledException(_)
            | E::KmsInvalidStateException(_)
            | E::InvalidKeyUsageException(_) => KeyErrorKind::UnknownKey,
            _ => return None,
        })
    }
}

impl KmsError for DecryptError {
    fn modelled_kind(&self) -> Option<KeyErrorKind> {
        use DecryptError as E;
        Some(match self {
            E::KmsInternalException(_)
            | E::DependencyTimeoutException(_)
            | E::KeyUnavailableException(_) => KeyErrorKind::Unavailable,
            E::InvalidCiphertextException(_) | E::IncorrectKeyException(_) => KeyErrorKind::Invalid,
            E::NotFoundException(_)
            | E::DisabledException(_)
            | E::KmsInvalidStateException(_)
            | E::InvalidKeyUsageException(_) => KeyErrorKind::UnknownKey,
            _ => return None,
        })
    }
}

/// Maps a failed KMS call of `operation` with `key`.
pub(super) fn from_sdk<E: KmsError>(
    operation: &'static str,
    key: &str,
    error: SdkError<E>,
) -> KeyError {
    let kind = match &error {
        SdkError::ServiceError(service) => match service
            .err()
            .modelled_kind()
            .or_else(|| kind_of_code(service.err().code()))
        {
            Some(kind) => kind,
            // A 5xx without a code of KMS's (a proxy, a load balancer, an
            // endpoint in trouble): KMS did not answer.
            None if service.raw().status().is_server_error() => KeyErrorKind::Unavailable,
            None => KeyErrorKind::Other,
        },
        // Failing before anything was sent: no region or endpoint, no
        // credentials (dispatch failures of kind "other" or "user"), a
        // request the SDK cannot build. No retry makes them go away.
        SdkError::ConstructionFailure(_) => KeyErrorKind::Other,
        SdkError::DispatchFailure(failure) if !failure.is_io() && !failure.is_timeout() => {
            KeyErrorKind::Other
        }
        // Timeouts, connection failures and answers that do not parse: KMS
        // could not be reached or did not answer in time.
        _ => KeyErrorKind::Unavailable,
    };
    KeyError::new(
        kind,
        format!(
            "KMS {operation} with key `{}` failed: {}",
            key.escape_debug(),
            DisplayErrorContext(&error)
        ),
    )
}

/// The kind of a KMS error code, if it is one this crate knows.
pub(super) fn kind_of_code(code: Option<&str>) -> Option<KeyErrorKind> {
    Some(match code? {
        // KMS in trouble, or asking to slow down (after the SDK's own
        // retries): the next request may get through.
        "KMSInternalException"
        | "KMSInternal"
        | "DependencyTimeoutException"
        | "KeyUnavailableException"
        | "ThrottlingException"
        | "Throttling"
        | "TooManyRequestsException"
        | "RequestLimitExceeded"
        | "ServiceUnavailable"
        | "ServiceUnavailableException"
        | "InternalFailure"
        | "RequestTimeout"
        | "RequestTimeoutException"
        // The SDK's identity cache refreshes credentials that expired.
        | "ExpiredTokenException" => KeyErrorKind::Unavailable,
        // The wrapped key does not open under the key named, or with this
        // context: changed, or copied from elsewhere.
        "InvalidCiphertextException" | "IncorrectKeyException" => KeyErrorKind::Invalid,
        // The key cannot be used, whatever the retry, until an operator
        // acts: deleted, disabled, pending deletion, not ours to use.
        "NotFoundException"
        | "DisabledException"
        | "KMSInvalidStateException"
        | "AccessDeniedException"
        | "InvalidKeyUsageException" => KeyErrorKind::UnknownKey,
        _ => return None,
    })
}
