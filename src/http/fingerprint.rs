//! The fingerprint of an HTTP request: method, path, query and body, each
//! in a normal form so that one request always gives one fingerprint and two
//! requests a handler can tell apart never share one.

use super::lambda_context::{event_query_pairs, raw_path};
use crate::{fingerprint::selection, Fingerprint, InvalidJsonPointer, JsonPointer};
use bytes::Bytes;
use http::Request;
use sha2::Digest;
use std::{fmt, sync::Arc};

/// The fingerprint of `request`.
///
/// - The method, and the path as the event carries it (`lambda_http`'s raw
///   path); outside Lambda the path the client sent (with the `axum`
///   feature, axum's `OriginalUri`, which `Router::nest` does not strip;
///   else the URI's path).
/// - The query as its decoded `name=value` pairs (`lambda_http`'s query
///   parameters; the URI's query, form-decoded, for a request built by hand),
///   sorted by name, the values of a repeated name kept in their order
///   (sorted too for ALB events, whose decoding in `lambda_http` does not
///   keep it reliably).
///   `lambda_http` rebuilds the URI of REST API (v1) and ALB events from a
///   hash map, in an order that changes from one parse of the same event to
///   the next, and from a `Host` header that may hold anything: the URI is
///   not what identifies the request.
/// - A body that parses as JSON, whatever its `Content-Type` says, in
///   canonical form: keys sorted, whitespace dropped, strings unescaped,
///   numbers by their exact text (`1.0` is not `1`, and no number is
///   rounded). So a retry that adds, drops or changes `Content-Type` on the
///   same JSON is the same request. A body that is not JSON, or that holds
///   a duplicate key (which parsers disagree on): its raw bytes.
///
/// No header is part of it.
pub fn request_fingerprint<B: AsRef<[u8]>>(request: &Request<B>) -> Fingerprint {
    let head = Head::of(request);
    let body: &[u8] = request.body().as_ref();
    if let Some(fingerprint) = Fingerprint::of_parts_and_json(head.parts([&b"json"[..]]), body) {
        return fingerprint;
    }
    Fingerprint::of_parts(head.parts([&b"raw"[..], body]))
}

/// What must match for a retry to count as the same request
/// ([`IdempotencyLayer::fingerprint_source`](super::IdempotencyLayer::fingerprint_source)):
/// the whole request by default.
///
/// The whole request is the safe default: a key reused for another request
/// is answered `422`, never with the other request's response. Narrow it
/// only for clients that change a part of the body between honest retries
/// (a `sent_at` timestamp, a nonce, a trace id generated on each send),
/// which would otherwise get `422` for a retry; and keep every field that
/// decides what the handler does, or a retry that changed one of them
/// gets the first request's response replayed.
///
/// ```
/// use lambda_idempotency::{http::{FingerprintSource, IdempotencyLayer}, Engine, MemoryStore};
///
/// let layer = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build())
///     .shared_scope()
///     // The charge is its amount, currency and customer; `sent_at` is not.
///     .fingerprint_source(FingerprintSource::json_pointers(["/amount", "/currency", "/customer"]));
/// # let _ = layer;
/// ```
#[derive(Clone, Default)]
pub struct FingerprintSource(Selection);

type FingerprintFn = Arc<dyn Fn(&Request<Bytes>) -> Fingerprint + Send + Sync>;

#[derive(Clone, Default)]
enum Selection {
    #[default]
    WholeRequest,
    JsonPointers(Arc<[JsonPointer]>),
    Custom(FingerprintFn),
}

impl FingerprintSource {
    /// The whole request: [`request_fingerprint`] (the default).
    pub fn whole_request() -> Self {
        Self(Selection::WholeRequest)
    }

    /// The method, the path and the query as in [`request_fingerprint`],
    /// and of a JSON body only the values at `pointers`
    /// ([`Fingerprint::of_json_pointers`]: each in canonical form, an absent
    /// one unlike a `null`; a body that is not JSON counts whole).
    ///
    /// # Panics
    ///
    /// When a pointer is not one (`"amount"` without its `/`), where the
    /// layer is built; [`try_json_pointers`](FingerprintSource::try_json_pointers)
    /// returns the error instead.
    #[track_caller]
    pub fn json_pointers<P: Into<String>>(pointers: impl IntoIterator<Item = P>) -> Self {
        match Self::try_json_pointers(pointers) {
            Ok(source) => source,
            Err(error) => panic!("{error}"),
        }
    }

    /// Like [`json_pointers`](FingerprintSource::json_pointers), with an
    /// error for a pointer that is not one.
    pub fn try_json_pointers<P: Into<String>>(
        pointers: impl IntoIterator<Item = P>,
    ) -> Result<Self, InvalidJsonPointer> {
        let pointers = pointers
            .into_iter()
            .map(JsonPointer::new)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self(Selection::JsonPointers(pointers.into())))
    }

    /// What `fingerprint` makes of the request (its head and whole body).
    /// It decides alone: include the method and path if they count.
    pub fn from_fn(
        fingerprint: impl Fn(&Request<Bytes>) -> Fingerprint + Send + Sync + 'static,
    ) -> Self {
        Self(Selection::Custom(Arc::new(fingerprint)))
    }

    /// The fingerprint of `request` as this source selects it.
    pub(crate) fn of(&self, request: &Request<Bytes>) -> Fingerprint {
        match &self.0 {
            Selection::WholeRequest => request_fingerprint(request),
            Selection::JsonPointers(pointers) => {
                let selected = selection(request.body(), pointers).finalize();
                Fingerprint::of_parts(Head::of(request).parts([&b"selected"[..], &selected[..]]))
            }
            Selection::Custom(fingerprint) => fingerprint(request),
        }
    }
}

impl fmt::Debug for FingerprintSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Selection::WholeRequest => f.write_str("FingerprintSource::WholeRequest"),
            Selection::JsonPointers(pointers) => f
                .debug_tuple("FingerprintSource::JsonPointers")
                .field(pointers)
                .finish(),
            Selection::Custom(_) => f.write_str("FingerprintSource::Custom(..)"),
        }
    }
}

/// The parts of a request's fingerprint besides its body: the method, the
/// path and the query's pairs.
struct Head<'r> {
    method: &'r [u8],
    path: &'r [u8],
    count: [u8; 8],
    pairs: Vec<(String, String)>,
}

impl<'r> Head<'r> {
    fn of<B>(request: &'r Request<B>) -> Self {
        let pairs = query_pairs(request);
        Self {
            method: request.method().as_str().as_bytes(),
            path: request_path(request).as_bytes(),
            count: (pairs.len() as u64).to_be_bytes(),
            pairs,
        }
    }

    /// The head's parts, then `rest`.
    fn parts<'a, const N: usize>(&'a self, rest: [&'a [u8]; N]) -> impl Iterator<Item = &'a [u8]> {
        [self.method, self.path, &self.count[..]]
            .into_iter()
            .chain(
                self.pairs
                    .iter()
                    .flat_map(|(name, value)| [name.as_bytes(), value.as_bytes()]),
            )
            .chain(rest)
    }
}

/// The request's path as the event carries it, or the URI's path for a
/// request built by hand.
pub(crate) fn request_path<B>(request: &Request<B>) -> &str {
    match raw_path(request) {
        "" => original_path(request),
        raw => raw,
    }
}

/// The path the client sent: axum's `OriginalUri` where its router put one
/// (a router given to `Router::nest` sees the path with the prefix
/// stripped), else the request's own.
fn original_path<B>(request: &Request<B>) -> &str {
    #[cfg(feature = "axum")]
    if let Some(original) = request.extensions().get::<axum::extract::OriginalUri>() {
        return original.path();
    }
    request.uri().path()
}

/// The query's decoded pairs, sorted by name (stable: a repeated name keeps
/// the order of its values): those `lambda_http` read from the event, or
/// the URI's query, form-decoded.
fn query_pairs<B>(request: &Request<B>) -> Vec<(String, String)> {
    if let Some(pairs) = event_query_pairs(request) {
        return pairs;
    }
    let query = request.uri().query().unwrap_or_default();
    let mut pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .map(|(name, value)| (name.into_owned(), value.into_owned()))
        .collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;
    use lambda_http::{http::header::CONTENT_TYPE, Body};

    fn request(method: &str, uri: &str, content_type: Option<&str>, body: &str) -> Request<Body> {
        let mut builder = lambda_http::http::Request::builder()
            .method(method)
            .uri(uri);
        if let Some(content_type) = content_type {
            builder = builder.header(CONTENT_TYPE, content_type);
        }
        builder.body(Body::from(body)).expect("request")
    }

    #[test]
    fn json_bodies_are_canonical() {
        let a = request(
            "POST",
            "/v1/charges",
            Some("application/json"),
            r#"{"amount":100,"currency":"eur"}"#,
        );
        let b = request(
            "POST",
            "/v1/charges",
            Some("application/json; charset=utf-8"),
            "{\n  \"currency\": \"eur\",\n  \"amount\": 100\n}",
        );
        assert_eq!(request_fingerprint(&a), request_fingerprint(&b));
        let c = request(
            "POST",
            "/v1/charges",
            Some("application/merge-patch+json"),
            r#"{ "amount":100, "currency":"eur" }"#,
        );
        let d = request(
            "POST",
            "/v1/charges",
            Some("application/merge-patch+json"),
            r#"{"currency":"eur","amount":100}"#,
        );
        assert_eq!(request_fingerprint(&c), request_fingerprint(&d));
    }

    #[test]
    fn method_path_and_body_all_count() {
        let base = request(
            "POST",
            "/v1/charges",
            Some("application/json"),
            r#"{"amount":100}"#,
        );
        for other in [
            request(
                "PATCH",
                "/v1/charges",
                Some("application/json"),
                r#"{"amount":100}"#,
            ),
            request(
                "POST",
                "/v1/refunds",
                Some("application/json"),
                r#"{"amount":100}"#,
            ),
            request(
                "POST",
                "/v1/charges?expand=customer",
                Some("application/json"),
                r#"{"amount":100}"#,
            ),
            request(
                "POST",
                "/v1/charges",
                Some("application/json"),
                r#"{"amount":101}"#,
            ),
        ] {
            assert_ne!(
                request_fingerprint(&base),
                request_fingerprint(&other),
                "{other:?}"
            );
        }
    }

    /// Issue 22, item 6: a retry that added `content-type` to the same JSON
    /// used to get 422 (the header decided JSON or raw bytes).
    #[test]
    fn json_is_json_whatever_the_content_type() {
        let body = r#"{"amount":100,"currency":"eur"}"#;
        let expected = request_fingerprint(&request(
            "POST",
            "/v1/charges",
            Some("application/json"),
            body,
        ));
        for content_type in [
            None,
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
        ] {
            let fingerprint =
                request_fingerprint(&request("POST", "/v1/charges", content_type, body));
            assert_eq!(fingerprint, expected, "{content_type:?}");
        }
        let a = request("POST", "/upload", Some("text/plain"), r#"{"a":1,"b":2}"#);
        let b = request("POST", "/upload", None, r#"{ "b":2, "a":1 }"#);
        assert_eq!(request_fingerprint(&a), request_fingerprint(&b));
        // The body of a request built by any body type.
        let bytes = Request::post("/v1/charges")
            .body(bytes::Bytes::from_static(body.as_bytes()))
            .expect("request");
        assert_eq!(request_fingerprint(&bytes), expected);
    }

    #[test]
    fn other_bodies_are_raw_bytes() {
        let a = request("POST", "/upload", Some("text/plain"), "a=1&b=2");
        let b = request("POST", "/upload", Some("text/plain"), "b=2&a=1");
        assert_ne!(request_fingerprint(&a), request_fingerprint(&b));
        // Invalid JSON under a JSON content type still fingerprints, as bytes.
        let c = request("POST", "/x", Some("application/json"), "{not json");
        let d = request("POST", "/x", Some("application/json"), "{not json ");
        assert_ne!(request_fingerprint(&c), request_fingerprint(&d));
    }

    #[test]
    fn query_order_does_not_matter_but_values_and_their_order_do() {
        let fingerprint = |uri: &str| request_fingerprint(&request("POST", uri, None, ""));
        let base = fingerprint("/v1/charges?a=1&b=2&c=3&tag=x&tag=y");
        assert_eq!(base, fingerprint("/v1/charges?tag=x&c=3&b=2&tag=y&a=1"));
        assert_eq!(base, fingerprint("/v1/charges?c=3&tag=x&tag=y&a=1&b=2"));
        for other in [
            "/v1/charges?a=1&b=2&c=3&tag=y&tag=x",
            "/v1/charges?a=1&b=2&c=4&tag=x&tag=y",
            "/v1/charges?a=1&b=2&c=3&tag=x",
            "/v1/charges?a=1&b=2&c=3&tag=x&tag=y&d",
            "/v1/charges?a=1&b=2&c=3&tag=x,y",
            "/v1/charges",
        ] {
            assert_ne!(base, fingerprint(other), "{other}");
        }
        assert_eq!(fingerprint("/v1/charges"), fingerprint("/v1/charges?"));
    }

    #[test]
    fn numbers_are_compared_exactly_and_duplicate_keys_are_not_canonicalised() {
        let fingerprint = |body: &str| {
            request_fingerprint(&request(
                "POST",
                "/v1/charges",
                Some("application/json"),
                body,
            ))
        };
        for (a, b) in [
            (
                r#"{"amount":100000000000000000000001}"#,
                r#"{"amount":100000000000000000000002}"#,
            ),
            (r#"{"amount":0.1}"#, r#"{"amount":0.10000000000000001}"#),
            (r#"{"amount":1}"#, r#"{"amount":1.0}"#),
            (r#"{"amount":1,"amount":2}"#, r#"{"amount":2}"#),
            (r#"{"amount":1,"amount":2}"#, r#"{"amount":2,"amount":1}"#),
        ] {
            assert_ne!(fingerprint(a), fingerprint(b), "{a} vs {b}");
        }
        assert_eq!(
            fingerprint(r#"{"amount":1E+2,"currency":"eur"}"#),
            fingerprint(r#"{ "currency" : "\u0065ur", "amount" : 1e2 }"#)
        );
    }
}
