//! gRPC over the layer: which requests and responses are gRPC, the status a
//! response carries (in its trailers, or in its headers when it has no
//! body), which statuses are stored, and the layer's own answers as gRPC
//! clients read them (trailers-only: the status in the headers, no body).

use super::{grpc_wire::code, problem::Problem, stored_body::StoredBody};
use http::{header, HeaderMap, HeaderValue, Response};

/// The header a gRPC status travels in (a trailer, or a header of a
/// trailers-only response).
const GRPC_STATUS: &str = "grpc-status";
const GRPC_MESSAGE: &str = "grpc-message";
/// The metadata that names the layer's problem `type` in its gRPC answers.
const PROBLEM_TYPE: &str = "idempotency-problem-type";
/// The metadata that carries a withheld response's digest to a gRPC
/// client, as the problem body's `response_digest` member does to others.
const RESPONSE_DIGEST: &str = "idempotency-response-digest";

/// The status of a gRPC response: from its trailers, else its headers (a
/// trailers-only response); `UNKNOWN` when neither has a valid one, as a
/// gRPC client takes it.
pub(crate) fn status_of(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> u32 {
    trailers
        .and_then(|trailers| trailers.get(GRPC_STATUS))
        .or_else(|| headers.get(GRPC_STATUS))
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
        .unwrap_or(code::UNKNOWN)
}

/// The default outcome policy for gRPC responses, by their `grpc-status`
/// (a gRPC error travels on an HTTP 200): the gRPC reading of
/// [`default_store_policy`](super::default_store_policy).
///
/// | code | stored | as HTTP's |
/// |---|---|---|
/// | `OK` (0) | yes | 2xx |
/// | `INVALID_ARGUMENT` (3), `OUT_OF_RANGE` (11) | yes: the answer to that message, every time | 400 |
/// | `NOT_FOUND` (5) | yes | 404 |
/// | `ALREADY_EXISTS` (6) | yes | 409 as a create's answer, decided by the request |
/// | `FAILED_PRECONDITION` (9) | yes: gRPC says not to retry it until the state is fixed, and a fixed state is a new request (a new key) | 422 |
/// | `CANCELLED` (1), `DEADLINE_EXCEEDED` (4) | no: the call was cut short, its outcome unknown | 408 |
/// | `ABORTED` (10) | no: gRPC says to retry it (a concurrency conflict) | 409 |
/// | `RESOURCE_EXHAUSTED` (8) | no: a quota or rate limit, retry later | 429 |
/// | `UNAUTHENTICATED` (16), `PERMISSION_DENIED` (7) | no: credentials are not in the fingerprint, so a retry with fresh ones runs | 401, 403 |
/// | `UNIMPLEMENTED` (12) | no: nothing ran, and a deployment may add the method | 405 |
/// | `UNKNOWN` (2), `INTERNAL` (13), `UNAVAILABLE` (14), `DATA_LOSS` (15) | no | 5xx |
/// | any other code, or none | no | |
///
/// Set another with [`grpc_store_when`](super::IdempotencyLayer::grpc_store_when).
pub fn default_grpc_store_policy(grpc_status: u32) -> bool {
    matches!(
        grpc_status,
        code::OK
            | code::INVALID_ARGUMENT
            | code::NOT_FOUND
            | code::ALREADY_EXISTS
            | code::FAILED_PRECONDITION
            | code::OUT_OF_RANGE
    )
}

/// The length of the first gRPC message of `head` (the first bytes of a
/// response body: a compressed flag, a big-endian `u32` length, the
/// message), once its five-byte prefix is there.
pub(crate) fn first_message_len(head: &[u8]) -> Option<u64> {
    let prefix: [u8; 4] = head.get(1..5)?.try_into().ok()?;
    Some(5 + u64::from(u32::from_be_bytes(prefix)))
}

/// The problem as a gRPC client reads it: a trailers-only response (HTTP
/// 200, `application/grpc`, the status and its percent-encoded message in
/// the headers, no body), with the problem `type` as metadata and
/// `retry-after` where the HTTP answer has it.
pub(crate) fn problem_response(problem: &Problem, base: &str) -> Response<StoredBody> {
    let http = problem.to_response(base);
    let mut response = Response::new(StoredBody::Empty);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(GRPC_STATUS, HeaderValue::from(problem.grpc_code()));
    if let Ok(message) = HeaderValue::from_str(&percent_encode(&problem.detail())) {
        headers.insert(GRPC_MESSAGE, message);
    }
    if let Ok(kind) = HeaderValue::from_str(&format!("{base}{}", problem.slug())) {
        headers.insert(PROBLEM_TYPE, kind);
    }
    if let Some(retry_after) = http.headers().get(header::RETRY_AFTER) {
        headers.insert(header::RETRY_AFTER, retry_after.clone());
    }
    if let Some(digest) = problem.response_digest() {
        if let Ok(digest) = HeaderValue::from_str(&digest) {
            headers.insert(RESPONSE_DIGEST, digest);
        }
    }
    response
}

/// `message` percent-encoded as the gRPC spec asks of `grpc-message`: every
/// byte outside printable ASCII, and `%`, as `%XX`.
pub(crate) fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_status_comes_from_the_trailers_else_the_headers() {
        let mut headers = HeaderMap::new();
        assert_eq!(status_of(&headers, None), code::UNKNOWN);
        headers.insert(GRPC_STATUS, HeaderValue::from_static("5"));
        assert_eq!(status_of(&headers, None), code::NOT_FOUND);
        let mut trailers = HeaderMap::new();
        trailers.insert(GRPC_STATUS, HeaderValue::from_static("14"));
        assert_eq!(status_of(&headers, Some(&trailers)), code::UNAVAILABLE);
        trailers.insert(GRPC_STATUS, HeaderValue::from_static("x"));
        assert_eq!(status_of(&HeaderMap::new(), Some(&trailers)), code::UNKNOWN);
    }

    #[test]
    fn the_policy_stores_deterministic_codes_only() {
        for stored in [0, 3, 5, 6, 9, 11] {
            assert!(default_grpc_store_policy(stored), "{stored}");
        }
        for released in [1, 2, 4, 7, 8, 10, 12, 13, 14, 15, 16, 17, 99] {
            assert!(!default_grpc_store_policy(released), "{released}");
        }
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("a b%c"), "a b%25c");
        assert_eq!(percent_encode("é\n"), "%C3%A9%0A");
    }

    /// A withheld response's digest reaches a gRPC client as metadata, as
    /// the problem body's `response_digest` does an HTTP one.
    #[test]
    fn a_withheld_response_s_digest_is_metadata() {
        let problem = Problem::ResponseNotStored {
            status: http::StatusCode::OK,
            why: crate::http::stored::WhyNotStored::Withheld,
            digest: Some([0xff; 32]),
        };
        let response = problem_response(&problem, "urn:x:");
        assert_eq!(response.headers()[GRPC_STATUS], "6", "ALREADY_EXISTS");
        assert_eq!(
            response.headers()[RESPONSE_DIGEST],
            "sha-256=://////////////////////////////////////////8=:"
        );
        let http = problem.to_response("urn:x:");
        let StoredBody::Text(body) = http.body() else {
            panic!("a text body");
        };
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            body["response_digest"],
            response.headers()[RESPONSE_DIGEST].to_str().unwrap()
        );
    }

    #[test]
    fn problems_are_trailers_only_answers() {
        let response = problem_response(
            &Problem::InProgress {
                retry_after: Duration::from_secs(2),
            },
            "urn:p:",
        );
        assert_eq!(response.status(), 200);
        assert_eq!(response.body(), &StoredBody::Empty);
        let headers = response.headers();
        assert_eq!(headers[header::CONTENT_TYPE], "application/grpc");
        assert_eq!(headers[GRPC_STATUS], "10");
        assert_eq!(headers[PROBLEM_TYPE], "urn:p:idempotency-key-in-use");
        assert_eq!(headers[header::RETRY_AFTER], "2");
        assert!(headers[GRPC_MESSAGE]
            .to_str()
            .unwrap()
            .contains("after 2 seconds"));
    }

    #[test]
    fn first_message_lengths() {
        assert_eq!(first_message_len(&[0, 0, 0]), None);
        assert_eq!(first_message_len(&[0, 0, 0, 1, 2]), Some(5 + 258));
    }
}
