//! A tower layer that makes an HTTP service idempotent, with the HTTP
//! semantics of the IETF `Idempotency-Key` draft and Stripe: a
//! `lambda_http` function, an axum `Router` (in Lambda through
//! `lambda_http::run`, or on ECS, Fargate or EC2), a tonic gRPC server, a
//! hyper service. It serves `http::Request<B>` for any [`http_body::Body`]
//! `B` it can build ([`RebuildBody`]), and answers in the inner service's
//! own response body type (see [On any HTTP stack](#on-any-http-stack)).
//! gRPC calls get gRPC statuses instead of the HTTP answers below (see
//! [gRPC (tonic)](#grpc-tonic)).
//!
//! | request | response |
//! |---|---|
//! | first with a key | the handler's; stored if the [outcome policy](default_store_policy) says so |
//! | retry, same payload | the stored status, headers and body, plus `Idempotent-Replayed: true` |
//! | retry while the first runs | `409` with `Retry-After`: what is left of the route's typical duration, 2 s on a route with none yet, never past the lease ([Retry-After](#retry-after)); or, with [`wait_for_result`](IdempotencyLayer::wait_for_result), the replay once it completes |
//! | same key, different method, path or body | `422` |
//! | key missing (where required) | `400` |
//! | key invalid (empty, over 255 characters, not visible ASCII, malformed sf-string, repeated header) | `400` |
//! | body longer than the [limit](IdempotencyLayer::body_limit) (default 6 MiB) | `413`; the handler does not run |
//! | body that fails while it is read | `400`; the handler does not run |
//! | store unreachable | `503` with `Retry-After`; the handler does not run |
//! | [`max_in_flight`](IdempotencyLayer::max_in_flight) requests running (default 1,024) | `503` with `Retry-After: 1`; nothing claimed, the handler does not run, a retry with the key runs as a first request |
//! | store misconfigured (no table, no permission: an operator must act) | `500`; the handler does not run |
//! | outside Lambda, nothing names the caller ([`caller`](IdempotencyLayer::caller), [`shared_scope`](IdempotencyLayer::shared_scope)) | `500`; the handler does not run |
//!
//! Every error is `application/problem+json` (RFC 9457) with a stable
//! `type`: `idempotency-key-missing`, `idempotency-key-invalid`,
//! `idempotency-key-in-use`, `idempotency-key-reused`,
//! `idempotency-body-too-large`, `idempotency-body-unreadable`,
//! `idempotency-response-unreadable`,
//! `idempotency-store-unavailable`, `idempotency-store-failed`,
//! `idempotency-record-corrupt`, `idempotency-record-unauthentic`,
//! `idempotency-response-not-stored`, `idempotency-lease-lost`,
//! `idempotency-write-rejected`, `idempotency-writes-not-committed`,
//! `idempotency-internal-error`, `idempotency-time-limit-exceeded`,
//! `idempotency-scope-unset`,
//! `idempotency-overloaded`, after a configurable prefix. None of the layer's own answers is stored,
//! but one the completer stores: `idempotency-abandoned` (`500`), the answer
//! [`abandoned_answer`] encodes, replayed to every retry of a key whose
//! abandoned claim an operator closed as failed
//! ([`AbandonedPolicy::Fail`](crate::AbandonedPolicy::Fail)).
//!
//! A handler can hand the layer its own DynamoDB writes with [`CommitWith`]:
//! they commit in one transaction with the stored response. A refusal of
//! one of them that the application expects (a condition on a business
//! item, a PostgreSQL constraint) is answered as it chooses with
//! [`on_write_refusal`](IdempotencyLayer::on_write_refusal), not a 500.
//! With the PostgreSQL store, the handler can run inside the transaction
//! that claims its key (`IdempotencyLayer::in_transaction`).
//!
//! Keys are scoped by the caller's identity from the trusted request
//! context, the API and stage, and the [route] ([`default_scope`]): tenant
//! A's key never reaches tenant B's record. Requests are fingerprinted by
//! method, path, query and body ([`request_fingerprint`]). The lease of a
//! claim runs until the Lambda invocation's deadline (outside Lambda, the
//! engine's [default lease](crate::EngineBuilder::default_lease)); under
//! Lambda Managed Instances, which do not stop an invocation at its
//! deadline, the engine's [heartbeat](crate::EngineBuilder::heartbeat)
//! extends it while the handler runs, by default. Once a
//! request has claimed its key, its handler runs to the end on a task of
//! its own, even if the request's future is dropped (see [When the client
//! leaves](#when-the-client-leaves)). Record ids carry the function's name
//! ([`default_key_prefix`](crate::default_key_prefix)), so two functions on
//! one table never share records.
//!
#![doc = include_str!("../docs/caller.md")]
#![cfg_attr(
    not(feature = "lambda"),
    doc = "",
    doc = "[`principal`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/http/fn.principal.html"
)]
//!
#![doc = include_str!("../docs/fingerprint.md")]
//!
//! # What is stored
//!
//! The [outcome policy](default_store_policy) decides which responses are
//! stored: by default 2xx, 3xx and the deterministic 4xx, never 401, 403 or
//! 407 (credentials are not part of the fingerprint), nor 405; a gRPC
//! response by its `grpc-status` ([`default_grpc_store_policy`]). With a
//! response, its status, the [allowlisted headers](default_stored_headers)
//! and always the headers that describe its body ([`BODY_HEADERS`]) (a
//! gRPC response: all its metadata but `set-cookie`), and its trailers,
//! replayed after the body.
//!
//! No response waits for the layer: a body that would wait for its next
//! frame goes to the client as it comes, copied as it passes, and is
//! stored when it ends if it fit ([what the layer
//! buffers](#what-the-layer-buffers)).
//!
//! Not stored, and so never replayed, but completing the record all the
//! same: a stream (`text/event-stream`, a response marked
//! [`StreamResponse`], or one [`stream_when`](IdempotencyLayer::stream_when)
//! selects), which goes to the client from its first byte; a response
//! longer than can be stored (16 MiB before compression, or past
//! [`max_stored_response`](IdempotencyLayer::max_stored_response) after
//! it); and a stream that failed part-way or outlived most of its lease. A
//! retry gets the original status and stored headers with an
//! `idempotency-response-not-stored` problem that says the request was
//! processed, and why its response was not stored: it never runs again.
//!
#![doc = include_str!("../docs/redaction.md")]
//!
//! # Keys from anywhere
//!
//! The key is read from the `Idempotency-Key` header unless
//! [`key_source`](IdempotencyLayer::key_source) says otherwise: another
//! header (GitHub's `X-GitHub-Delivery`), a field of a JSON body (Stripe's
//! event `id`: [`KeySource::json_pointer`]`("/id")`), or any function of the
//! request ([`KeySource::from_fn`]). Keys from anywhere are checked as
//! header keys are (1 to 255 characters; [`check_key`]), and a missing or
//! invalid one is a `400` whose detail says where the key goes. A header
//! key is read before the body; the others after it, within the body limit.
//!
#![doc = include_str!("../docs/buffering.md")]
//!
#![doc = include_str!("../docs/servers.md")]
//!
#![doc = include_str!("../docs/retry_after.md")]
//!
//! # Example: `lambda_http`
//!
//! ```
//! use lambda_http::{request::RequestContext, service_fn, Body, Error, Request, RequestExt, Response};
//! use lambda_idempotency::{http::IdempotencyLayer, Engine, MemoryStore};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! async fn create_charge(request: Request) -> Result<Response<Body>, Error> {
//!     Ok(Response::builder().status(201).body(Body::from(r#"{"id":"ch_1"}"#))?)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! // In `main`, once: the engine over a `DynamoDbStore` in a real function.
//! let engine = Engine::builder(MemoryStore::new()).build();
//! let mut service = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(engine))
//!     .service(service_fn(create_charge));
//! // lambda_http::run(service).await
//!
//! // As lambda_http makes it from an HTTP API event (here without an
//! // authorizer: an anonymous caller).
//! let request = || -> Result<Request, Error> {
//!     Ok(lambda_http::http::Request::post("/v1/charges")
//!         .header("idempotency-key", "8e03978e-40d5-43e8")
//!         .header("content-type", "application/json")
//!         .body(Body::from(r#"{"amount":1250}"#))?
//!         .with_request_context(RequestContext::ApiGatewayV2(Default::default())))
//! };
//! let first = service.ready().await?.call(request()?).await?;
//! assert_eq!(first.status(), 201);
//! let retry = service.ready().await?.call(request()?).await?;
//! assert_eq!(retry.status(), 201);
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "actix")]
#[cfg_attr(docsrs, doc(cfg(feature = "actix")))]
pub mod actix;
mod body;
mod commit;
mod config;
mod fingerprint;
mod future;
mod grpc;
mod grpc_wire;
mod idempotency_key;
mod in_flight;
#[cfg(feature = "lambda")]
mod lambda_context;
#[cfg(not(feature = "lambda"))]
#[path = "no_lambda_context.rs"]
mod lambda_context;
mod layer;
mod metrics;
mod pipeline;
#[cfg(feature = "powertools")]
mod powertools;
mod problem;
mod rebuild_body;
mod respond;
mod retry_after;
mod scope;
mod service;
mod stored;
mod stored_body;
mod streaming;
mod trace_context;
#[cfg(feature = "opentelemetry")]
mod trace_link;

pub use crate::metrics::EmfMetrics;
pub use body::DEFAULT_BODY_LIMIT;
pub use commit::CommitWith;
pub use config::{default_store_policy, DEFAULT_HEADER, REPLAYED_HEADER};
pub use fingerprint::{request_fingerprint, FingerprintSource};
pub use future::ResponseFuture;
pub use grpc::default_grpc_store_policy;
pub use idempotency_key::{check_key, parse_key, KeyError, KeySource, MAX_KEY_LEN};
pub use in_flight::{InFlight, DEFAULT_MAX_IN_FLIGHT};
pub use layer::IdempotencyLayer;
pub use metrics::HttpOutcome;
pub use problem::DEFAULT_PROBLEM_BASE;
pub use rebuild_body::RebuildBody;
pub use retry_after::{RetryAfter, DEFAULT_FIRST_RETRY_AFTER};
#[cfg(feature = "lambda")]
#[cfg_attr(docsrs, doc(cfg(feature = "lambda")))]
pub use scope::principal;
pub use scope::{default_scope, route, ANONYMOUS};
pub use service::Idempotency;
pub use stored::{
    default_stored_headers, BodyNotStored, BODY_HEADERS, DEFAULT_COMPRESS_ABOVE,
    MAX_STORED_RESPONSE,
};
pub use stored_body::StoredBody;
pub use streaming::StreamResponse;
pub use trace_context::TraceContext;

/// Decodes a response as the layer stored it in a record's `response`: for
/// operators and tools that show what a retry gets back. A response too
/// large to store, a stream, or a body withheld by the layer's settings
/// comes back as its status and headers, with no body, and a
/// [`BodyNotStored`] in its extensions saying why (and a withheld body's
/// digest). Its
/// trailers (a gRPC response's status), when it had some, are in its
/// extensions as an `http::HeaderMap`.
pub fn decode_stored_response(
    bytes: &[u8],
) -> Result<Response<StoredBody>, Box<dyn std::error::Error + Send + Sync>> {
    match stored::ResponseCodec::default().decode(bytes)? {
        stored::StoredResponse::Full(mut response, trailers) => {
            if let Some(trailers) = trailers {
                response.extensions_mut().insert(trailers);
            }
            Ok(response)
        }
        stored::StoredResponse::NotStored {
            status,
            headers,
            why,
        } => Ok(head_only(status, headers, why, None)),
        stored::StoredResponse::Withheld {
            status,
            headers,
            digest,
        } => Ok(head_only(
            status,
            headers,
            stored::WhyNotStored::Withheld,
            Some(digest),
        )),
    }
}

/// The stored answer of a key whose abandoned claim the completer closed
/// as failed ([`AbandonedPolicy::Fail`](crate::AbandonedPolicy::Fail)),
/// encoded as the layer stores responses: a `500`
/// `application/problem+json` of type `idempotency-abandoned` after
/// `problem_base` (the layer's
/// [`problem_type_base`](IdempotencyLayer::problem_type_base),
/// [`DEFAULT_PROBLEM_BASE`] by default). Every retry of the key gets it,
/// marked as a replay, and the handler never runs. Not for gRPC routes,
/// whose records hold gRPC answers.
pub fn abandoned_answer(
    problem_base: &str,
) -> Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>> {
    let response = problem::Problem::Abandoned.to_response(problem_base);
    stored::ResponseCodec::default().encode(&stored::StoredResponse::Full(response, None))
}

/// The answer the layer gives an engine error, for a handler that meets
/// one itself: a [step](crate::ClaimHandle::step) whose recorded output
/// fails to open (`500`, `idempotency-record-unauthentic`), a store outage
/// (`503` with `Retry-After`), a lost lease (`409`), as
/// `application/problem+json` whose `type` starts with `problem_base` (the
/// layer's [`problem_type_base`](IdempotencyLayer::problem_type_base),
/// [`DEFAULT_PROBLEM_BASE`] by default). `None` for the operation's own
/// error ([`Error::Operation`](crate::Error::Operation)), which is the
/// handler's to answer.
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use lambda_idempotency::{http, Error, StoreError, StoreErrorKind};
///
/// // What `claim.step("charge", ...)` answers when the recorded output was
/// // tampered with: never run again, never replayed.
/// let error: Error<String> = Error::Store(StoreError::new(
///     StoreErrorKind::Unauthentic,
///     "record p#0b4e: its step `charge` fails to open",
/// ));
/// let response = http::problem_for::<_, Full<Bytes>>(&error, http::DEFAULT_PROBLEM_BASE)
///     .expect("an engine error has its problem");
/// assert_eq!(response.status(), 500);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
///
/// // A declined card is the handler's own answer.
/// let declined = Error::Operation("declined".to_owned());
/// assert!(http::problem_for::<_, Full<Bytes>>(&declined, http::DEFAULT_PROBLEM_BASE).is_none());
/// ```
pub fn problem_for<E, B: RebuildBody>(
    error: &crate::Error<E>,
    problem_base: &str,
) -> Option<Response<B>> {
    if matches!(error, crate::Error::Operation(_)) {
        return None;
    }
    let problem = problem::Problem::from(error);
    Some(body::into_response(problem.to_response(problem_base), None))
}

/// A response of `status` and `headers` with no body, saying why in its
/// extensions.
fn head_only(
    status: http::StatusCode,
    headers: http::HeaderMap,
    why: stored::WhyNotStored,
    digest: Option<[u8; 32]>,
) -> Response<StoredBody> {
    let mut response = Response::new(StoredBody::Empty);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response.extensions_mut().insert(BodyNotStored {
        why: problem::not_stored_because(why),
        digest,
    });
    response
}

/// Encodes a response as the layer stores it (for the fuzz targets).
#[cfg(feature = "fuzzing")]
pub(crate) fn encode_stored_for_fuzzing(
    response: Response<StoredBody>,
) -> Result<Vec<u8>, BoxError> {
    stored::ResponseCodec::default().encode(&stored::StoredResponse::Full(response, None))
}

#[cfg(feature = "fuzzing")]
use crate::error::BoxError;
use crate::Codec;
use http::Response;

#[cfg(test)]
mod generic_tests;
#[cfg(test)]
mod tests;
