//! The layer's own error responses: RFC 9457 `application/problem+json`,
//! with a stable `type` per error.

use super::idempotency_key::KeyError;
use super::{stored::WhyNotStored, stored_body::StoredBody};
use crate::{Error, StoreErrorKind};
use base64::Engine as _;
use http::{header, HeaderValue, Response, StatusCode};
use serde::Serialize;
use std::time::Duration;

/// The default prefix of every problem `type`.
pub const DEFAULT_PROBLEM_BASE: &str = "urn:lambda-idempotency:problem:";

/// Where a key that was rejected came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyPlace {
    /// A header, by name.
    Header(String),
    /// Anywhere else, as [`KeySource::place`](super::KeySource) says it.
    Other(String),
}

/// An error the layer answers itself. None of these responses is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    /// `place` says where the key goes: ``an `idempotency-key` header``.
    KeyMissing {
        place: String,
    },
    /// `header` is the header's name for a header source; `place` says
    /// where the key goes for the others.
    KeyInvalid {
        place: KeyPlace,
        error: KeyError,
    },
    BodyTooLarge {
        limit: usize,
    },
    BodyUnreadable,
    ResponseUnreadable,
    InProgress {
        retry_after: Duration,
    },
    KeyReused,
    StoreUnavailable {
        retry_after: Duration,
    },
    StoreFailed,
    CorruptRecord,
    /// A stored response that fails to open (the engine encrypts).
    UnauthenticRecord,
    ResponseNotStored {
        status: StatusCode,
        why: WhyNotStored,
        /// The SHA-256 of the body, when the record keeps it (a body
        /// withheld by the layer's settings).
        digest: Option<[u8; 32]>,
    },
    LeaseLost,
    WriteRejected,
    WritesNotCommitted {
        retry_after: Duration,
    },
    Internal,
    /// The handler ran past its transaction's time limit; all it did was
    /// rolled back.
    TimeLimitExceeded,
    /// Outside Lambda, with nothing configured to name the caller.
    ScopeUnset,
    /// `max_in_flight` requests were running; this one claimed nothing.
    Overloaded,
    /// The completer closed the key's abandoned claim as failed
    /// ([`AbandonedPolicy::Fail`](crate::AbandonedPolicy::Fail)): the one
    /// layer answer that is stored, by the completer, not the layer.
    Abandoned,
}

impl<E> From<&Error<E>> for Problem {
    /// The problem that answers an engine error. The operation's own errors
    /// are the handler's to answer; the service never asks for them.
    fn from(error: &Error<E>) -> Self {
        match error {
            Error::InProgress { retry_after } => Problem::InProgress {
                retry_after: *retry_after,
            },
            Error::KeyReused => Problem::KeyReused,
            Error::Store(error) if error.kind() == StoreErrorKind::CorruptRecord => {
                Problem::CorruptRecord
            }
            Error::Store(error) if error.kind() == StoreErrorKind::Unauthentic => {
                Problem::UnauthenticRecord
            }
            Error::Store(error) if error.kind() == StoreErrorKind::WriteRejected => {
                Problem::WriteRejected
            }
            Error::Store(error) if !error.kind().is_transient() => Problem::StoreFailed,
            Error::Store(_) => Problem::StoreUnavailable {
                retry_after: error.retry_after().unwrap_or(Duration::from_secs(1)),
            },
            Error::LeaseLost => Problem::LeaseLost,
            Error::WritesNotCommitted(_) => Problem::WritesNotCommitted {
                retry_after: error.retry_after().unwrap_or(Duration::from_secs(1)),
            },
            Error::TimeLimitExceeded { .. } => Problem::TimeLimitExceeded,
            Error::Operation(_) => Problem::Internal,
        }
    }
}

#[derive(Serialize)]
struct Body9457<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'a str,
    status: u16,
    detail: String,
    /// The original body's digest, in the form of RFC 9530's
    /// `Repr-Digest` (`sha-256=:<base64>:`), when its body was withheld.
    #[serde(skip_serializing_if = "Option::is_none")]
    response_digest: Option<String>,
}

impl Problem {
    /// The last part of the problem's `type`.
    pub(crate) fn slug(&self) -> &'static str {
        match self {
            Problem::KeyMissing { .. } => "idempotency-key-missing",
            Problem::BodyTooLarge { .. } => "idempotency-body-too-large",
            Problem::BodyUnreadable => "idempotency-body-unreadable",
            Problem::ResponseUnreadable => "idempotency-response-unreadable",
            Problem::KeyInvalid { .. } => "idempotency-key-invalid",
            Problem::InProgress { .. } => "idempotency-key-in-use",
            Problem::KeyReused => "idempotency-key-reused",
            Problem::StoreUnavailable { .. } => "idempotency-store-unavailable",
            Problem::StoreFailed => "idempotency-store-failed",
            Problem::CorruptRecord => "idempotency-record-corrupt",
            Problem::UnauthenticRecord => "idempotency-record-unauthentic",
            Problem::ResponseNotStored { .. } => "idempotency-response-not-stored",
            Problem::LeaseLost => "idempotency-lease-lost",
            Problem::WriteRejected => "idempotency-write-rejected",
            Problem::WritesNotCommitted { .. } => "idempotency-writes-not-committed",
            Problem::Internal => "idempotency-internal-error",
            Problem::TimeLimitExceeded => "idempotency-time-limit-exceeded",
            Problem::ScopeUnset => "idempotency-scope-unset",
            Problem::Overloaded => "idempotency-overloaded",
            Problem::Abandoned => "idempotency-abandoned",
        }
    }

    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Problem::KeyMissing { .. } | Problem::KeyInvalid { .. } => StatusCode::BAD_REQUEST,
            Problem::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::BodyUnreadable => StatusCode::BAD_REQUEST,
            Problem::ResponseUnreadable => StatusCode::INTERNAL_SERVER_ERROR,
            Problem::InProgress { .. } => StatusCode::CONFLICT,
            Problem::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::StoreUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Problem::StoreFailed => StatusCode::INTERNAL_SERVER_ERROR,
            Problem::CorruptRecord | Problem::UnauthenticRecord => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            Problem::ResponseNotStored { status, .. } => *status,
            Problem::LeaseLost => StatusCode::CONFLICT,
            Problem::WriteRejected => StatusCode::INTERNAL_SERVER_ERROR,
            Problem::WritesNotCommitted { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Problem::Internal | Problem::ScopeUnset => StatusCode::INTERNAL_SERVER_ERROR,
            Problem::Overloaded | Problem::TimeLimitExceeded => StatusCode::SERVICE_UNAVAILABLE,
            // Final, the server's: never a status a client retries (409,
            // 429, 503); the key's outcome is the operator's to settle.
            Problem::Abandoned => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The gRPC status of this problem's answer to a gRPC request, with the
    /// meaning of its HTTP status: the client's fault and final
    /// (`INVALID_ARGUMENT`, `FAILED_PRECONDITION` for a key reused with
    /// another message, `ALREADY_EXISTS` for a request processed whose
    /// response cannot be replayed), retry later (`ABORTED` while the key is
    /// in use, `UNAVAILABLE` while the store is or the layer's bound on work
    /// in flight is reached), or the operator's to fix
    /// (`INTERNAL`, `DATA_LOSS` for a record that cannot be read).
    pub(crate) fn grpc_code(&self) -> u32 {
        use super::grpc_wire::code;
        match self {
            Problem::KeyMissing { .. } | Problem::KeyInvalid { .. } => code::INVALID_ARGUMENT,
            Problem::BodyTooLarge { .. } => code::RESOURCE_EXHAUSTED,
            Problem::BodyUnreadable => code::UNAVAILABLE,
            Problem::ResponseUnreadable => code::INTERNAL,
            Problem::InProgress { .. } | Problem::LeaseLost => code::ABORTED,
            Problem::KeyReused => code::FAILED_PRECONDITION,
            Problem::StoreUnavailable { .. }
            | Problem::WritesNotCommitted { .. }
            | Problem::Overloaded
            | Problem::TimeLimitExceeded => code::UNAVAILABLE,
            Problem::StoreFailed | Problem::WriteRejected => code::INTERNAL,
            Problem::CorruptRecord | Problem::UnauthenticRecord => code::DATA_LOSS,
            Problem::ResponseNotStored { .. } => code::ALREADY_EXISTS,
            Problem::Internal | Problem::ScopeUnset | Problem::Abandoned => code::INTERNAL,
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Problem::KeyMissing { .. } => "Idempotency key missing",
            Problem::BodyTooLarge { .. } => "Request body too large",
            Problem::BodyUnreadable => "Request body unreadable",
            Problem::ResponseUnreadable => "Response body unreadable",
            Problem::KeyInvalid { .. } => "Idempotency key invalid",
            Problem::InProgress { .. } => "Request with this idempotency key in progress",
            Problem::KeyReused => "Idempotency key reused with a different request",
            Problem::StoreUnavailable { .. } => "Idempotency store unavailable",
            Problem::StoreFailed => "Idempotency store misconfigured",
            Problem::CorruptRecord => "Idempotency record unreadable",
            Problem::UnauthenticRecord => "Idempotency record failed authentication",
            Problem::ResponseNotStored { .. } => "Original response not stored",
            Problem::LeaseLost => "Request taken over by a retry",
            Problem::WriteRejected => "Request's writes rejected",
            Problem::WritesNotCommitted { .. } => "Request's writes not committed",
            Problem::Internal => "Internal error",
            Problem::TimeLimitExceeded => "Request ran past its time limit",
            Problem::ScopeUnset => "Idempotency scope not configured",
            Problem::Overloaded => "Too many requests in progress",
            Problem::Abandoned => "Request abandoned",
        }
    }

    pub(crate) fn detail(&self) -> String {
        match self {
            Problem::KeyMissing { place } => format!(
                "This request requires {place}: a unique value (a UUID is recommended) \
                 that you reuse when you retry the same request."
            ),
            Problem::KeyInvalid {
                place: KeyPlace::Header(header),
                error,
            } => format!(
                "The `{header}` header is invalid: {error}. Send 1 to 255 visible ASCII characters, \
                 bare or as a quoted string."
            ),
            Problem::KeyInvalid {
                place: KeyPlace::Other(place),
                error,
            } => format!(
                "The idempotency key ({place}) is invalid: {error}. Send 1 to 255 characters of \
                 visible ASCII or spaces."
            ),
            Problem::BodyTooLarge { limit } => format!(
                "The request body is longer than the {limit} bytes this service reads to make a \
                 request idempotent. The request was not processed."
            ),
            Problem::BodyUnreadable => "The request body could not be read to the end. The \
                 request was not processed; retry it with the same key."
                .to_owned(),
            Problem::ResponseUnreadable => "The request was processed, but its response failed \
                 while it was read, so it was not stored. A retry with the same key processes it \
                 again."
                .to_owned(),
            Problem::InProgress { retry_after } => format!(
                "A request with this idempotency key is still being processed. Retry after {} \
                 to get its result.",
                seconds(*retry_after)
            ),
            Problem::KeyReused => "This idempotency key was already used with a different \
                 request (method, path or body). Use a new key for a new request."
                .to_owned(),
            Problem::StoreUnavailable { retry_after } => format!(
                "The request was not processed because its idempotency could not be guaranteed. \
                 Retry with the same key after {}.",
                seconds(*retry_after)
            ),
            Problem::StoreFailed => "The request was not processed: the idempotency store \
                 refused it in a way that retrying will not fix (it is not set up as this service \
                 needs). Contact the API operator."
                .to_owned(),
            Problem::CorruptRecord => "The stored record for this idempotency key cannot be read, so \
                 the request was not processed again. Contact the API operator."
                .to_owned(),
            Problem::UnauthenticRecord => "The request with this idempotency key was processed, \
                 but its stored response failed authentication (it was altered, copied from \
                 another record, or sealed under a key this service no longer has), so it is \
                 not replayed and the request is not processed again. Contact the API operator."
                .to_owned(),
            Problem::ResponseNotStored {
                status,
                why: WhyNotStored::Withheld,
                ..
            } => format!(
                "The request with this idempotency key was processed (status {}). This service \
                 does not keep its responses' bodies, so it cannot be replayed; the SHA-256 of \
                 the body first returned comes with this answer (`response_digest`). It will not \
                 be processed again; fetch the resource instead.",
                status.as_u16()
            ),
            Problem::ResponseNotStored { status, why, .. } => format!(
                "The request with this idempotency key was processed (status {}), but its response \
                 was not stored ({}) and cannot be replayed. It will not be processed again; fetch \
                 the resource instead.",
                status.as_u16(),
                not_stored_because(*why)
            ),
            Problem::LeaseLost => "This request took longer than its lease and a retry with the \
                 same key took over; nothing this request did was committed. Retry with the same \
                 key to get the result."
                .to_owned(),
            Problem::WriteRejected => "The request's writes were rejected by the database, so \
                 nothing was committed. Contact the API operator if this persists."
                .to_owned(),
            Problem::WritesNotCommitted { retry_after } => format!(
                "The request ran, but the database that records its idempotency was unavailable, \
                 so none of its changes were saved. Retry with the same key after {}.",
                seconds(*retry_after)
            ),
            Problem::Internal => "The idempotency layer failed in a way it should not; the \
                 request's outcome is unknown. Contact the API operator."
                .to_owned(),
            Problem::TimeLimitExceeded => "The request ran longer than this service allows, so \
                 it was stopped and everything it did was rolled back: nothing was saved. Its \
                 idempotency key is free; retry with the same key after 1 second."
                .to_owned(),
            Problem::ScopeUnset => "The request was not processed: this service cannot tell \
                 its callers apart, and it will not share one caller's results with another. \
                 The operator must name the caller (IdempotencyLayer::caller or ::scope) or \
                 declare a single-tenant service (IdempotencyLayer::shared_scope)."
                .to_owned(),
            Problem::Overloaded => "The request was not processed: this service is running as many \
                 requests as it allows. Its idempotency key was not used; retry with the same key \
                 after 1 second."
                .to_owned(),
            Problem::Abandoned => "The request with this idempotency key began, and its \
                 processing stopped before it finished; the service's operator closed it as \
                 failed. It will not be processed again, and what it did before it stopped was \
                 not undone. Check what was done (fetch the resource) before sending a new \
                 request with a new key."
                .to_owned(),
        }
    }

    /// The withheld body's digest, as the problem body and the gRPC
    /// message say it.
    pub(crate) fn response_digest(&self) -> Option<String> {
        match self {
            Problem::ResponseNotStored {
                digest: Some(digest),
                ..
            } => Some(format!(
                "sha-256=:{}:",
                base64::engine::general_purpose::STANDARD.encode(digest)
            )),
            _ => None,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Problem::InProgress { retry_after }
            | Problem::StoreUnavailable { retry_after }
            | Problem::WritesNotCommitted { retry_after } => Some(*retry_after),
            Problem::LeaseLost | Problem::Overloaded | Problem::TimeLimitExceeded => {
                Some(Duration::from_secs(1))
            }
            _ => None,
        }
    }

    /// The response, with `base` as the prefix of the problem `type`.
    pub(crate) fn to_response(&self, base: &str) -> Response<StoredBody> {
        let status = self.status();
        let body = Body9457 {
            kind: format!("{base}{}", self.slug()),
            title: self.title(),
            status: status.as_u16(),
            detail: self.detail(),
            response_digest: self.response_digest(),
        };
        // Serialising a struct of strings and a number cannot fail.
        let json = serde_json::to_string(&body).unwrap_or_default();
        let mut response = Response::new(StoredBody::Text(json));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(retry_after) = self.retry_after() {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(retry_after_secs(retry_after)),
            );
        }
        response
    }
}

/// Why a response was not stored, as the not-stored answer says it.
pub(crate) fn not_stored_because(why: WhyNotStored) -> &'static str {
    match why {
        WhyNotStored::Unsaid => "it was streamed, or too large to store",
        WhyNotStored::TooLarge => "it was too large to store",
        WhyNotStored::Stream => "it was a stream, sent on as it was made",
        WhyNotStored::StreamTooLong => {
            "it was streamed as it was made, and was longer than can be stored"
        }
        WhyNotStored::StreamFailed => {
            "it was streamed as it was made, and its stream failed part-way"
        }
        WhyNotStored::StreamOutlivedLease => {
            "it was streamed as it was made, and was still streaming when its claim's lease \
             was near its end"
        }
        WhyNotStored::Withheld => "this service does not keep response bodies",
    }
}

/// The whole seconds of a `Retry-After`: at least one, since `0` asks for
/// a retry at once.
fn retry_after_secs(retry_after: Duration) -> u64 {
    retry_after.as_secs().max(1)
}

/// A `Retry-After` as the detail of a problem says it, as the header does.
fn seconds(retry_after: Duration) -> String {
    match retry_after_secs(retry_after) {
        1 => "1 second".to_owned(),
        n => format!("{n} seconds"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_say_the_seconds_the_header_says() {
        for (retry_after, header, said) in [
            (Duration::from_millis(300), "1", "after 1 second "),
            (Duration::from_secs(1), "1", "after 1 second "),
            (Duration::from_secs(7), "7", "after 7 seconds "),
        ] {
            let response = Problem::InProgress { retry_after }.to_response("");
            assert_eq!(response.headers()[header::RETRY_AFTER], header);
            let StoredBody::Text(json) = response.body() else {
                panic!("a text body")
            };
            assert!(json.contains(said), "{json}");
        }
    }

    /// One of each problem; the match fails to compile when a problem is
    /// added without being listed here.
    fn every_problem() -> Vec<Problem> {
        let second = Duration::from_secs(1);
        let all = vec![
            Problem::KeyMissing { place: "h".into() },
            Problem::KeyInvalid {
                place: KeyPlace::Other("h".into()),
                error: KeyError::Empty,
            },
            Problem::BodyTooLarge { limit: 1 },
            Problem::BodyUnreadable,
            Problem::ResponseUnreadable,
            Problem::InProgress {
                retry_after: second,
            },
            Problem::KeyReused,
            Problem::StoreUnavailable {
                retry_after: second,
            },
            Problem::StoreFailed,
            Problem::CorruptRecord,
            Problem::UnauthenticRecord,
            Problem::ResponseNotStored {
                status: StatusCode::OK,
                why: WhyNotStored::StreamTooLong,
                digest: None,
            },
            Problem::LeaseLost,
            Problem::WriteRejected,
            Problem::WritesNotCommitted {
                retry_after: second,
            },
            Problem::Internal,
            Problem::TimeLimitExceeded,
            Problem::ScopeUnset,
            Problem::Overloaded,
            Problem::Abandoned,
        ];
        for problem in &all {
            match problem {
                Problem::KeyMissing { .. }
                | Problem::KeyInvalid { .. }
                | Problem::BodyTooLarge { .. }
                | Problem::BodyUnreadable
                | Problem::ResponseUnreadable
                | Problem::InProgress { .. }
                | Problem::KeyReused
                | Problem::StoreUnavailable { .. }
                | Problem::StoreFailed
                | Problem::CorruptRecord
                | Problem::UnauthenticRecord
                | Problem::ResponseNotStored { .. }
                | Problem::LeaseLost
                | Problem::WriteRejected
                | Problem::WritesNotCommitted { .. }
                | Problem::Internal
                | Problem::TimeLimitExceeded
                | Problem::ScopeUnset
                | Problem::Overloaded
                | Problem::Abandoned => {}
            }
        }
        all
    }

    #[test]
    fn the_module_docs_list_every_problem_type() {
        let docs = include_str!("mod.rs");
        for problem in every_problem() {
            let slug = problem.slug();
            assert!(
                docs.contains(&format!("`{slug}`")),
                "{slug} is missing from the list of problem types in http/mod.rs"
            );
        }
    }

    #[test]
    fn problems_are_rfc9457_with_stable_types() {
        let response = Problem::InProgress {
            retry_after: Duration::from_secs(7),
        }
        .to_response(DEFAULT_PROBLEM_BASE);
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        assert_eq!(response.headers()[header::RETRY_AFTER], "7");
        let StoredBody::Text(text) = response.body() else {
            panic!("text body")
        };
        let json: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(
            json["type"],
            "urn:lambda-idempotency:problem:idempotency-key-in-use"
        );
        assert_eq!(json["status"], 409);
        assert!(
            json["title"].is_string() && json["detail"].as_str().unwrap().contains("7 seconds")
        );

        let response = Problem::KeyReused.to_response("https://api.example.com/problems/");
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn every_engine_error_has_its_problem() {
        use crate::StoreError;
        let secs = Duration::from_secs;
        let cases: Vec<(Error<()>, &str, u16, Option<&str>)> = vec![
            (
                Error::InProgress {
                    retry_after: secs(3),
                },
                "idempotency-key-in-use",
                409,
                Some("3"),
            ),
            (Error::KeyReused, "idempotency-key-reused", 422, None),
            (
                Error::Store(StoreError::new(StoreErrorKind::Unavailable, "down")),
                "idempotency-store-unavailable",
                503,
                Some("1"),
            ),
            (
                Error::Store(StoreError::new(StoreErrorKind::CorruptRecord, "bad")),
                "idempotency-record-corrupt",
                500,
                None,
            ),
            (
                Error::Store(StoreError::new(StoreErrorKind::Unauthentic, "tampered")),
                "idempotency-record-unauthentic",
                500,
                None,
            ),
            (
                Error::Store(StoreError::new(StoreErrorKind::WriteRejected, "invalid")),
                "idempotency-write-rejected",
                500,
                None,
            ),
            (Error::LeaseLost, "idempotency-lease-lost", 409, Some("1")),
            (
                Error::WritesNotCommitted(StoreError::new(StoreErrorKind::Unavailable, "down")),
                "idempotency-writes-not-committed",
                503,
                Some("1"),
            ),
        ];
        for (error, slug, status, retry_after) in cases {
            let response = Problem::from(&error).to_response(DEFAULT_PROBLEM_BASE);
            assert_eq!(response.status().as_u16(), status, "{slug}");
            let StoredBody::Text(text) = response.body() else {
                panic!("text body")
            };
            assert!(text.contains(slug), "{text}");
            assert_eq!(
                response
                    .headers()
                    .get(header::RETRY_AFTER)
                    .map(|v| v.to_str().unwrap()),
                retry_after,
                "{slug}"
            );
        }
    }
}
