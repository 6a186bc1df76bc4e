//! A tower layer that makes any `lambda_http` service idempotent, with the
//! HTTP semantics of the IETF `Idempotency-Key` draft and Stripe.
//!
//! | request | response |
//! |---|---|
//! | first with a key | the handler's; stored if the [outcome policy](default_store_policy) says so |
//! | retry, same payload | the stored status, headers and body, plus `Idempotent-Replayed: true` |
//! | retry while the first runs | `409` with `Retry-After` (or, with [`wait_for_result`](IdempotencyLayer::wait_for_result), the replay once it completes) |
//! | same key, different method, path or body | `422` |
//! | key missing (where required) | `400` |
//! | key invalid (empty, over 255 characters, not visible ASCII, malformed sf-string, repeated header) | `400` |
//! | store unreachable | `503` with `Retry-After`; the handler does not run |
//!
//! Every error is `application/problem+json` (RFC 9457) with a stable
//! `type`: `idempotency-key-missing`, `idempotency-key-invalid`,
//! `idempotency-key-in-use`, `idempotency-key-reused`,
//! `idempotency-store-unavailable`, `idempotency-record-corrupt`,
//! `idempotency-response-not-stored`, `idempotency-lease-lost`,
//! `idempotency-write-rejected`, after a configurable prefix. None of the
//! layer's own answers is stored.
//!
//! A handler can hand the layer its own DynamoDB writes with [`CommitWith`]:
//! they commit in one transaction with the stored response.
//!
//! Keys are scoped by the caller's identity from API Gateway's authorizer
//! context and by the route ([`default_scope`]): tenant A's key never
//! reaches tenant B's record. Requests are fingerprinted by method, path and
//! body, a JSON body in canonical form ([`request_fingerprint`]). The lease
//! of a claim runs until the Lambda invocation's deadline.
//!
//! # Example
//!
//! ```
//! use lambda_http::{service_fn, Body, Error, Request, Response};
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
//! let request = || {
//!     lambda_http::http::Request::post("/v1/charges")
//!         .header("idempotency-key", "8e03978e-40d5-43e8")
//!         .header("content-type", "application/json")
//!         .body(Body::from(r#"{"amount":1250}"#))
//! };
//! let first = service.ready().await?.call(request()?).await?;
//! assert_eq!(first.status(), 201);
//! let retry = service.ready().await?.call(request()?).await?;
//! assert_eq!(retry.status(), 201);
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! # Ok(())
//! # }
//! ```

mod commit;
mod fingerprint;
mod future;
mod key;
mod layer;
mod metrics;
mod problem;
mod scope;
mod service;
mod stored;

pub use commit::CommitWith;
pub use fingerprint::request_fingerprint;
pub use future::ResponseFuture;
pub use key::{parse_key, KeyError, MAX_KEY_LEN};
pub use layer::{
    default_store_policy, default_stored_headers, IdempotencyLayer, BODY_HEADERS,
    DEFAULT_COMPRESS_ABOVE, DEFAULT_HEADER,
};
pub use metrics::{EmfMetrics, HttpOutcome};
pub use problem::DEFAULT_PROBLEM_BASE;
pub use scope::{default_scope, principal, ANONYMOUS};
pub use service::{Idempotency, REPLAYED_HEADER};
pub use stored::MAX_STORED_RESPONSE;

/// The response codec with the layer's defaults (for the fuzz targets).
#[cfg(feature = "fuzzing")]
pub(crate) fn stored_codec_for_fuzzing() -> stored::ResponseCodec {
    stored::ResponseCodec {
        stored_headers: default_stored_headers(),
        compress_above: DEFAULT_COMPRESS_ABOVE,
        max_stored: MAX_STORED_RESPONSE,
        problem_base: DEFAULT_PROBLEM_BASE.to_owned(),
    }
}

#[cfg(test)]
mod tests;
