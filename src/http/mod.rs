//! A tower layer that makes an HTTP service idempotent, with the HTTP
//! semantics of the IETF `Idempotency-Key` draft and Stripe: a
//! `lambda_http` function, an axum `Router` (in Lambda through
//! `lambda_http::run`, or on ECS, Fargate or EC2), a hyper service. It
//! serves `http::Request<B>` for any [`http_body::Body`] `B` that can be
//! rebuilt from bytes, and answers in the inner service's own response body
//! type (see [On any HTTP stack](#on-any-http-stack)).
//!
//! | request | response |
//! |---|---|
//! | first with a key | the handler's; stored if the [outcome policy](default_store_policy) says so |
//! | retry, same payload | the stored status, headers and body, plus `Idempotent-Replayed: true` |
//! | retry while the first runs | `409` with `Retry-After` (or, with [`wait_for_result`](IdempotencyLayer::wait_for_result), the replay once it completes) |
//! | same key, different method, path or body | `422` |
//! | key missing (where required) | `400` |
//! | key invalid (empty, over 255 characters, not visible ASCII, malformed sf-string, repeated header) | `400` |
//! | body longer than the [limit](IdempotencyLayer::body_limit) (default 6 MiB) | `413`; the handler does not run |
//! | body that fails while it is read | `400`; the handler does not run |
//! | store unreachable | `503` with `Retry-After`; the handler does not run |
//! | outside Lambda, nothing names the caller ([`caller`](IdempotencyLayer::caller), [`shared_scope`](IdempotencyLayer::shared_scope)) | `500`; the handler does not run |
//!
//! Every error is `application/problem+json` (RFC 9457) with a stable
//! `type`: `idempotency-key-missing`, `idempotency-key-invalid`,
//! `idempotency-key-in-use`, `idempotency-key-reused`,
//! `idempotency-body-too-large`, `idempotency-body-unreadable`,
//! `idempotency-response-unreadable`,
//! `idempotency-store-unavailable`, `idempotency-record-corrupt`,
//! `idempotency-response-not-stored`, `idempotency-lease-lost`,
//! `idempotency-write-rejected`, `idempotency-writes-not-committed`,
//! `idempotency-internal-error`, `idempotency-scope-unset`, after a
//! configurable prefix. None of the layer's own answers is stored.
//!
//! A handler can hand the layer its own DynamoDB writes with [`CommitWith`]:
//! they commit in one transaction with the stored response.
//!
//! Keys are scoped by the caller's identity from the trusted request
//! context, the API and stage, and the [route] ([`default_scope`]): tenant
//! A's key never reaches tenant B's record. Requests are fingerprinted by
//! method, path, query and body ([`request_fingerprint`]). The lease of a
//! claim runs until the Lambda invocation's deadline (outside Lambda, the
//! engine's [default lease](crate::EngineBuilder::default_lease)). Once a
//! request has claimed its key, its handler runs to the end on a task of
//! its own, even if the request's future is dropped (see [When the client
//! leaves](#when-the-client-leaves)). Record ids carry the function's name
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
//! - a body that parses as JSON, whatever its `Content-Type` says (or
//!   whether it has one), in canonical form: keys sorted, whitespace
//!   dropped, strings unescaped; numbers by their text (`1.0` is not `1`,
//!   and nothing is rounded through a float), with only the exponent
//!   normalised (`1E+02` is `1e2`); a body with a duplicate key, which
//!   parsers disagree on, by its raw bytes;
//! - any other body by its raw bytes.
//!
//! No header is part of it, `Content-Type` included: a retry that adds,
//! drops or changes it on the same JSON body is the same request (it used
//! to decide JSON or raw bytes, and such a retry got 422). A repeated `Idempotency-Key` is a 400: HTTP
//! APIs join repeated headers with commas, and a bare key holds none (quote
//! a key that must). REST APIs hand `lambda_http` every value, and it keeps
//! only the last, so there the last key sent is the key.
//!
//! # What is stored
//!
//! The [outcome policy](default_store_policy) decides which responses are
//! stored: by default 2xx, 3xx and the deterministic 4xx, never 401, 403 or
//! 407 (credentials are not part of the fingerprint), nor 405. With a
//! response, its status, the [allowlisted headers](default_stored_headers)
//! and always the headers that describe its body ([`BODY_HEADERS`]).
//!
//! Not stored, and so never replayed, but completing the record all the
//! same: a stream (`text/event-stream`, a response marked
//! [`StreamResponse`], or one [`stream_when`](IdempotencyLayer::stream_when)
//! selects), which goes to the client from its first byte; and a response
//! longer than can be stored (16 MiB before compression, or past
//! [`max_stored_response`](IdempotencyLayer::max_stored_response) after
//! it). A retry gets the original status and stored headers with an
//! `idempotency-response-not-stored` problem that says the request was
//! processed: it never runs again.
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
//! # What the layer buffers
//!
//! To fingerprint a request (and to read a key from its body) the layer
//! reads the whole body of each request it makes idempotent before the
//! handler runs, at most [`body_limit`](IdempotencyLayer::body_limit) bytes
//! (default [`DEFAULT_BODY_LIMIT`], 6 MiB, Lambda's own limit): a declared
//! `Content-Length` over it is refused unread, a streamed body as soon as
//! it passes it, with a `413` problem, and nothing runs. The handler then
//! gets the same bytes in its own body type. Requests the layer passes
//! through (other methods, or no key where the key is optional and read
//! from a header) are not read.
//!
//! A response to store is read, at most 16 MiB of it (a `lambda_http` body
//! is whole already); a longer one goes on to the client, the part read
//! first and the rest as it comes, and is not stored. That needs a body
//! type the layer can rebuild around a stream: axum's `Body` (with the
//! `axum` feature) or `UnsyncBoxBody<Bytes, BoxError>`; a body of another
//! type is read whole unless it declares a longer `Content-Length`. A
//! stream passes through unread. A response the [outcome
//! policy](default_store_policy) does not store, and every response of a
//! request passed through, goes back to the client untouched, streamed if
//! it streams. A response body that fails while it
//! is read is a `500` problem and releases the claim, as a handler error
//! does. Behind axum, the layer's limit is the one that bounds its buffer;
//! axum's `DefaultBodyLimit` (2 MB) still applies to the extractors that
//! read the body after it.
//!
//! # On any HTTP stack
//!
//! [`Idempotency`] serves `http::Request<B>` where `B` is an
//! [`http_body::Body`] that is `From<Vec<u8>>` (the layer rebuilds it from
//! the bytes it read): `lambda_http::Body`, axum's `Body`,
//! `http_body_util::Full<Bytes>`. Its response is the inner service's
//! `Response<ResBody>`, with replays and problems built in `ResBody` (also
//! `From<Vec<u8>>`), so it fits wherever the inner service does:
//! `lambda_http::run`, axum's `Router::layer`, `Router::route_layer` and
//! `MethodRouter::layer`, hyper through `hyper_util`'s `TowerToHyperService`.
//! hyper's own `Incoming` cannot be rebuilt from bytes: put the layer
//! behind axum, or map the request body to one that can be (axum's
//! `Body::new`) first.
//!
//! With axum, layer only the routes that need it, so webhooks and reads
//! need no key; `Path`, `Json` and the other extractors see the request
//! as they would without the layer. An extractor's rejection (axum's `Json`
//! answers 400, 415 or 422) is the handler's answer to that request, and
//! the [outcome policy](default_store_policy) treats it as any handler
//! response: by default a 400 or 422 is stored and replayed, so a
//! corrected body needs a new key; a 415 (no JSON `Content-Type`) is not,
//! since the header is not part of the fingerprint, so the retry that sets
//! it runs. `store_when(|status| status.is_success())` releases them all
//! instead.
//!
//! With the `axum` feature, the scope holds the route as the application
//! defines it, axum's route template (`MatchedPath`: the whole template of
//! a nested router, `/accounts/{id}/charges`), and the fingerprint holds
//! the path the client sent (`OriginalUri`, which `Router::nest` does not
//! strip): nested routers never share a record, and the same key sent to
//! `/accounts/a/charges` and then to `/accounts/b/charges` is a `422`, as
//! in Lambda. Without the feature the layer sees the path axum hands it,
//! which `nest` strips: turn the feature on in an axum application.
//!
//! Which requests reach the layer: `Router::layer`, `Router::route_layer`
//! and `MethodRouter::layer` wrap every method's handler and axum's own
//! `405` answer to a method the route does not serve, so a keyless `POST`
//! to a `GET` route is answered `400` (key missing) before axum can say
//! `405`; with a key it gets axum's `405`, which is never stored.
//! `MethodRouter::route_layer` (`get(report).post(create).route_layer(layer)`)
//! wraps the handlers only: axum answers `405` first, key or not. A `404`
//! never reaches the layer.
//!
//! ```
//! use axum::{extract::Path, http::StatusCode, routing::{get, post}, Json, Router};
//! use lambda_idempotency::{http::IdempotencyLayer, Engine, MemoryStore};
//! use serde_json::{json, Value};
//!
//! async fn create_charge(Path(customer): Path<String>, Json(body): Json<Value>) -> (StatusCode, Json<Value>) {
//!     (StatusCode::CREATED, Json(json!({ "id": "ch_1", "customer": customer, "amount": body["amount"] })))
//! }
//!
//! // In `main`, once: the engine over a `DynamoDbStore` in a real service.
//! let engine = Engine::builder(MemoryStore::new()).build();
//! let app: Router = Router::new()
//!     .route("/v1/customers/{customer}/charges", post(create_charge))
//!     // Only the routes above: the webhook below needs no key.
//!     .route_layer(IdempotencyLayer::new(engine))
//!     .route("/webhooks", post(|| async { StatusCode::NO_CONTENT }))
//!     .route("/health", get(|| async { "ok" }));
//! // In Lambda: lambda_http::run(app).await
//! // Elsewhere:  axum::serve(listener, app).await
//! # let _ = app;
//! ```
//!
//! # Outside Lambda
//!
//! Without a Lambda request context there is no authorizer to name the
//! caller, and the layer will not guess: a request it cannot scope is
//! answered `500` (`idempotency-scope-unset`, logged as an error that names
//! the fix) and nothing runs, rather than one caller getting another's
//! response. Choose once, when you build the layer:
//!
//! - [`caller`](IdempotencyLayer::caller): name the caller from what your
//!   authentication middleware (layered outside this one, so it runs
//!   first) put in the request's extensions. The layer adds the route.
//! - [`shared_scope`](IdempotencyLayer::shared_scope): a single-tenant
//!   service, whose callers may share records.
//! - [`scope`](IdempotencyLayer::scope): the whole scope, yours to build.
//!
//! ```
//! use axum::{http::Request, routing::post, Router};
//! use bytes::Bytes;
//! use lambda_idempotency::{http::IdempotencyLayer, Engine, MemoryStore};
//!
//! /// What the JWT middleware puts in the request's extensions once the
//! /// token is verified.
//! #[derive(Clone)]
//! struct Principal { issuer: String, subject: String }
//!
//! let engine = Engine::builder(MemoryStore::new()).build();
//! let idempotency = IdempotencyLayer::new(engine).caller(|request: &Request<Bytes>| {
//!     // `None`, an anonymous caller: only where unauthenticated calls are
//!     // allowed at all.
//!     let caller = request.extensions().get::<Principal>()?;
//!     Some(format!("{} {}", caller.issuer, caller.subject))
//! });
//! let app: Router = Router::new()
//!     .route("/v1/charges", post(|| async { "charged" }))
//!     .layer(idempotency);
//!     // .layer(jwt_middleware): added last, so it runs first.
//! # let _ = app;
//! ```
//!
//! # When the client leaves
//!
//! hyper drops a request's future when its client disconnects, and tower's
//! and tower-http's `TimeoutLayer` at their deadline. Once a request has
//! claimed its key, the layer runs the claim, the handler and the
//! completion on a task of its own (`tokio::spawn`), so dropping the
//! request's future does not cut the handler short between its effect and
//! the record: the work finishes, the record is completed (or released, if
//! the handler fails), and the retry gets `409` while it runs and the
//! replay after. A claim is never released because its request was
//! dropped: a handler that charged first would be charged again at once.
//! A panic in the handler releases the claim and is raised again in the
//! request's own future, so an outer `CatchPanicLayer` answers it.
//!
//! At graceful shutdown, wait for that work after the server stops
//! accepting requests ([`IdempotencyLayer::in_flight`], [`InFlight::wait`]):
//! a process that exits first leaves those records in progress, and their
//! retries wait out the lease and then run again. In Lambda nothing
//! changes: the runtime never drops an invocation's future, and the lease
//! ends at the invocation's deadline.
//!
//! `examples/axum_server.rs` is a whole server on a TCP listener, and
//! `examples/axum_lambda.rs` the same router in Lambda.
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

mod body;
mod commit;
mod config;
mod fingerprint;
mod future;
mod in_flight;
mod key;
#[cfg(feature = "lambda")]
mod lambda_context;
#[cfg(not(feature = "lambda"))]
#[path = "no_lambda_context.rs"]
mod lambda_context;
mod layer;
mod metrics;
mod pipeline;
mod problem;
mod respond;
mod scope;
mod service;
mod stored;
mod stored_body;
mod streaming;

pub use body::DEFAULT_BODY_LIMIT;
pub use commit::CommitWith;
pub use config::{default_store_policy, DEFAULT_HEADER, REPLAYED_HEADER};
pub use fingerprint::request_fingerprint;
pub use future::ResponseFuture;
pub use in_flight::InFlight;
pub use key::{check_key, parse_key, InvalidJsonPointer, KeyError, KeySource, MAX_KEY_LEN};
pub use layer::IdempotencyLayer;
pub use metrics::{EmfMetrics, HttpOutcome};
pub use problem::DEFAULT_PROBLEM_BASE;
#[cfg(feature = "lambda")]
#[cfg_attr(docsrs, doc(cfg(feature = "lambda")))]
pub use scope::principal;
pub use scope::{default_scope, route, ANONYMOUS};
pub use service::Idempotency;
pub use stored::{
    default_stored_headers, BODY_HEADERS, DEFAULT_COMPRESS_ABOVE, MAX_STORED_RESPONSE,
};
pub use stored_body::StoredBody;
pub use streaming::StreamResponse;

/// Decodes a response as the layer stored it in a record's `response`: for
/// operators and tools that show what a retry gets back. A response too
/// large to store comes back as its status and headers, with no body.
pub fn decode_stored_response(
    bytes: &[u8],
) -> Result<Response<StoredBody>, Box<dyn std::error::Error + Send + Sync>> {
    match stored::ResponseCodec::default().decode(bytes)? {
        stored::StoredResponse::Full(response) => Ok(response),
        stored::StoredResponse::NotStored { status, headers } => {
            let mut response = Response::new(StoredBody::Empty);
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            Ok(response)
        }
    }
}

/// Encodes a response as the layer stores it (for the fuzz targets).
#[cfg(feature = "fuzzing")]
pub(crate) fn encode_stored_for_fuzzing(
    response: Response<StoredBody>,
) -> Result<Vec<u8>, BoxError> {
    stored::ResponseCodec::default().encode(&stored::StoredResponse::Full(response))
}

#[cfg(feature = "fuzzing")]
use crate::error::BoxError;
use crate::Codec;
use http::Response;

#[cfg(test)]
mod generic_tests;
#[cfg(test)]
mod tests;
