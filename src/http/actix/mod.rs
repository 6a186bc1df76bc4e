//! The HTTP layer as actix-web middleware (feature `actix`): actix's
//! services are not tower services (not `Send`, on http 0.2 types), so
//! [`Idempotency`] gives `App::wrap`, `Scope::wrap` and `Resource::wrap`
//! what [`IdempotencyLayer`](super::IdempotencyLayer) gives tower: the
//! same configuration (built with the layer's methods), the same answers
//! (replays with `Idempotent-Replayed: true`, `problem+json` refusals),
//! the same canonical JSON [fingerprint](super::request_fingerprint).
//!
//! - **Caller**: outside Lambda nothing names the caller, so name it from
//!   the `ServiceRequest` ([`Idempotency::caller`]: what your
//!   authentication middleware, wrapped outside this one, found), or
//!   declare that callers share records ([`Idempotency::shared_scope`]).
//!   With neither, every idempotent request is refused (`500`,
//!   `idempotency-scope-unset`): fail closed.
//! - **Route**: the scope holds the method and actix's route template
//!   (`match_pattern()`: `POST /accounts/{id}/charges`, with the prefixes
//!   of the scopes it is under), the fingerprint the concrete path.
//! - **When the client leaves**: the handler runs on a local task of
//!   actix's runtime (`actix_web::rt::spawn`) and the layer's work from
//!   the claim on on a task of its own, so when actix drops the request's
//!   future the handler still finishes and the record is completed (or
//!   released), and a retry gets the replay.
//! - **Bodies**: the request's payload is read only if the layer reads it
//!   (within its [body limit](super::IdempotencyLayer::body_limit)), and
//!   passed on to the handler as a payload again. A response whose length
//!   actix knows is stored and replayed as through the layer; a streamed
//!   one passes through as the layer streams any body.
//! - **In the handler**: the [`ClaimHandle`](crate::ClaimHandle) and a
//!   [`Takeover`](crate::Takeover) are in the request's extensions
//!   (`req.extensions().get::<ClaimHandle>()`), and a
//!   [`CommitWith`](super::CommitWith) or
//!   [`StreamResponse`](super::StreamResponse) put in the response's
//!   extensions reaches the layer.
//!
//! ```
//! use actix_web::{web, App, HttpResponse};
//! use lambda_idempotency::{http::{actix::Idempotency, IdempotencyLayer}, Engine, MemoryStore};
//!
//! # fn main() { actix_web::rt::System::new().block_on(async {
//! // Once, in `main`: the engine over a `DynamoDbStore` in a real service.
//! let engine = Engine::builder(MemoryStore::new()).build();
//! let idempotency = Idempotency::new(IdempotencyLayer::new(engine))
//!     // The caller as your authentication middleware named it.
//!     .caller(|request| request.headers().get("x-verified-tenant")?.to_str().ok().map(str::to_owned));
//! let app = App::new().service(
//!     web::scope("/v1")
//!         .wrap(idempotency)
//!         .route("/charges", web::post().to(|| async { HttpResponse::Created().body(r#"{"id":"ch_1"}"#) })),
//! );
//! # let app = actix_web::test::init_service(app).await;
//! # let request = || actix_web::test::TestRequest::post().uri("/v1/charges")
//! #     .insert_header(("idempotency-key", "k1")).insert_header(("x-verified-tenant", "t1")).to_request();
//! # let first = actix_web::test::call_service(&app, request()).await;
//! # assert_eq!(first.status(), 201);
//! # let retry = actix_web::test::call_service(&app, request()).await;
//! # assert_eq!(retry.headers().get("idempotent-replayed").unwrap(), "true");
//! # }) }
//! ```

mod convert;
mod middleware;

pub use middleware::{Idempotency, IdempotencyMiddleware};
