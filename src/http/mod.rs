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
//! `idempotency-write-rejected`, `idempotency-writes-not-committed`,
//! `idempotency-internal-error`, after a configurable prefix. None of the
//! layer's own answers is stored.
//!
//! A handler can hand the layer its own DynamoDB writes with [`CommitWith`]:
//! they commit in one transaction with the stored response.
//!
//! Keys are scoped by the caller's identity from the trusted request
//! context, the API and stage, and the route ([`default_scope`]): tenant A's key never
//! reaches tenant B's record. Requests are fingerprinted by method, path,
//! query and body ([`request_fingerprint`]). The lease of a claim runs until
//! the Lambda invocation's deadline. Record ids carry the function's name
//! ([`default_key_prefix`](crate::default_key_prefix)), so two functions on
//! one table never share records.
//!
//! # Who the caller is
//!
//! The principal ([`principal`]) is the most specific identity the request
//! context holds; never a header, which the client controls. It is written
//! as a JSON array that names its kind, so no identity of one kind can
//! spell another. An authenticated request is never anonymous.
//!
//! | integration | authorizer | principal |
//! |---|---|---|
//! | REST API (v1) | none | anonymous |
//! | REST API | Cognito user pool | `["jwt", iss, sub]` from `authorizer.claims` (without `sub`, as for JWTs below) |
//! | REST API | Lambda authorizer | `["lambda", context]`: `principalId` and the context, canonical JSON, less `integrationLatency` |
//! | REST API | IAM user | `["iam", identity.userArn]` |
//! | REST API | IAM assumed role | `["iam", identity.userArn]`: the role session's ARN, session name included |
//! | REST API | Cognito identity pool (IAM) | `["cognito_identity", identity.cognitoIdentityPoolId, identity.cognitoIdentityId]`, never the role ARN all the pool's users share |
//! | REST API | API key | `["api_key", identity.apiKeyId]`: the key's id, never the key |
//! | REST API | JWT | none exists on REST APIs: see Cognito user pool |
//! | HTTP API (v2) | none | anonymous |
//! | HTTP API | JWT (Cognito user pools included) | `["jwt", iss, sub]`; without `sub` (client-credentials tokens), `["jwt_client", iss, client_id or azp]`; without either, `["jwt_claims", claims]`: every claim but `exp`, `iat`, `nbf`, `jti` and `auth_time`, canonical JSON |
//! | HTTP API | Lambda authorizer | `["lambda", context]`: `authorizer.lambda`, canonical JSON |
//! | HTTP API | IAM user, IAM assumed role | `["iam", authorizer.iam.userArn]` |
//! | HTTP API | Cognito identity pool (IAM) | `["cognito_identity", authorizer.iam.cognitoIdentity.identityPoolId, ….identityId]` |
//! | HTTP API | API key | none exists on HTTP APIs |
//! | ALB | any | anonymous: the event carries no identity (see below) |
//! | Function URL | `NONE` | anonymous |
//! | Function URL | `AWS_IAM` | as the HTTP API's IAM rows (user, role, Cognito identity pool) |
//!
//! On a REST API the authorizer comes first, then the caller's IAM identity,
//! then the API key. An IAM identity without a `userArn` is
//! `["iam_user", user]` (its `user`, `userId` or `callerId`), and one with
//! nothing that names it `["iam_context", …]`, its whole context.
//!
//! What this asks of you:
//!
//! - A Lambda authorizer's `principalId` and context must name the caller,
//!   and not change between two requests of the same caller: a value that
//!   does (a timestamp, a request id) makes every retry a new caller, which
//!   runs again.
//! - An ALB that authenticates (OIDC, Cognito) passes the caller in the
//!   `x-amzn-oidc-identity` header, which a client can send too. Only when
//!   every listener rule that reaches the function authenticates, scope by
//!   it with [`IdempotencyLayer::scope`].
//! - The scope also holds the entry point, the API and its stage (the
//!   target group for an ALB), so two stages or two APIs on one function
//!   never share records; and the route: API Gateway's route key (HTTP API),
//!   or method and resource (REST API), the method and path elsewhere.
//!
//! # What the request is
//!
//! One request gives one fingerprint however often its event is parsed,
//! and two requests a handler can tell apart never share one:
//!
//! - the method and the path, as the event carries them;
//! - the query as the decoded pairs `lambda_http` reads from the event,
//!   sorted by name, the values of a repeated name kept in their order (for
//!   ALB events sorted too: `lambda_http` decodes an ALB query by splitting
//!   a string it joined in a hash map's order). Not the request's URI: `lambda_http` rebuilds a REST API or ALB query
//!   from a hash map, in an order that changes from one parse to the next,
//!   and builds the URI from a `Host` header that may hold anything;
//! - a JSON body (`application/json`, `+json`) in canonical form: keys
//!   sorted, whitespace dropped, strings unescaped; numbers by their text
//!   (`1.0` is not `1`, and nothing is rounded through a float), with only
//!   the exponent normalised (`1E+02` is `1e2`); a body with a duplicate
//!   key, which parsers disagree on, by its raw bytes;
//! - any other body by its raw bytes.
//!
//! Headers are not part of it. A repeated `Idempotency-Key` is a 400: HTTP
//! APIs join repeated headers with commas, and a bare key holds none (quote
//! a key that must). REST APIs hand `lambda_http` every value, and it keeps
//! only the last, so there the last key sent is the key.
//!
//! # What is stored
//!
//! The [outcome policy](default_store_policy) decides which responses are
//! stored: by default 2xx, 3xx and the deterministic 4xx, never 401, 403 or
//! 407 (credentials are not part of the fingerprint). With a response, its
//! status, the [allowlisted headers](default_stored_headers) and always the
//! headers that describe its body ([`BODY_HEADERS`]).
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
mod config;
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
pub use config::{default_store_policy, DEFAULT_HEADER};
pub use fingerprint::request_fingerprint;
pub use future::ResponseFuture;
pub use key::{parse_key, KeyError, MAX_KEY_LEN};
pub use layer::IdempotencyLayer;
pub use metrics::{EmfMetrics, HttpOutcome};
pub use problem::DEFAULT_PROBLEM_BASE;
pub use scope::{default_scope, principal, ANONYMOUS};
pub use service::{Idempotency, REPLAYED_HEADER};
pub use stored::{
    default_stored_headers, BODY_HEADERS, DEFAULT_COMPRESS_ABOVE, MAX_STORED_RESPONSE,
};

/// Decodes a response as the layer stored it in a record's `response`: for
/// operators and tools that show what a retry gets back. A response too
/// large to store comes back as its status and headers, with no body.
pub fn decode_stored_response(
    bytes: &[u8],
) -> Result<Response<Body>, Box<dyn std::error::Error + Send + Sync>> {
    match stored::ResponseCodec::default().decode(bytes)? {
        stored::StoredResponse::Full(response) => Ok(response),
        stored::StoredResponse::NotStored { status, headers } => {
            let mut response = Response::new(Body::Empty);
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            Ok(response)
        }
    }
}

/// Encodes a response as the layer stores it (for the fuzz targets).
#[cfg(feature = "fuzzing")]
pub(crate) fn encode_stored_for_fuzzing(response: Response<Body>) -> Result<Vec<u8>, BoxError> {
    stored::ResponseCodec::default().encode(&stored::StoredResponse::Full(response))
}

#[cfg(feature = "fuzzing")]
use crate::error::BoxError;
use crate::Codec;
use lambda_http::{Body, Response};

#[cfg(test)]
mod tests;
