//! The client's half of the `Idempotency-Key` protocol: a
//! [`reqwest-middleware`](https://docs.rs/reqwest-middleware) layer for
//! APIs that make POSTs safe to retry with a key (the servers of
//! [`lambda-idempotency`](https://docs.rs/lambda-idempotency), Stripe,
//! Adyen).
//!
//! [`IdempotencyMiddleware`], on POST and PATCH (by default,
//! [`methods`](IdempotencyMiddleware::methods) to choose):
//!
//! - **One key per logical request**, kept across every attempt: the
//!   caller's (the key header already set, or else an [`IdempotencyKey`]
//!   in the request's extensions), else a random UUID v4. Every retry, this
//!   middleware's or a retry layer's around or inside it, sends the same
//!   key, so the server runs the request at most once.
//! - **`409` while the key's first request is in progress**: waits as its
//!   `Retry-After` says and sends again, up to
//!   [`wait_in_progress`](IdempotencyMiddleware::wait_in_progress) in all,
//!   then returns the `409`. A `409` without `Retry-After` is returned at
//!   once (a conflict that sending again does not resolve).
//! - **`503` and `429`**: sent again after `Retry-After` (up to
//!   [`max_retry_after`](IdempotencyMiddleware::max_retry_after)), or
//!   after an exponential [backoff](IdempotencyMiddleware::backoff) with
//!   jitter, [`max_attempts`](IdempotencyMiddleware::max_attempts) in all;
//!   then the last response is returned.
//! - **Transport failures** (refused, reset, closed before the answer,
//!   timed out): the request may have run, and the key makes sending it
//!   again safe; after `max_attempts`, the error is a [`GaveUp`] with the
//!   key.
//! - **Never a `400`, `422` or other 4xx**: the answer to the request as it
//!   is, returned at once.
//! - **The replay marker surfaced**: every response to a keyed request
//!   carries an [`Idempotency`] extension, with the key sent, whether the
//!   server replayed a stored response (`Idempotent-Replayed: true`), and
//!   the attempts made.
//!
//! ```
//! use lambda_idempotency_client::{Idempotency, IdempotencyKey, IdempotencyMiddleware};
//! use std::time::Duration;
//!
//! # async fn charge() -> Result<(), Box<dyn std::error::Error>> {
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(IdempotencyMiddleware::new().wait_in_progress(Duration::from_secs(10)))
//!     .build();
//!
//! let response = client
//!     .post("http://127.0.0.1:3000/v1/charges")
//!     .header("content-type", "application/json")
//!     .body(r#"{"amount":1250}"#)
//!     // Optional: without it, a random key is generated.
//!     .with_extension(IdempotencyKey::new("order-1234-charge")?)
//!     .send()
//!     .await?;
//! let idempotency = response.extensions().get::<Idempotency>().cloned();
//! if let Some(idempotency) = idempotency {
//!     println!("key {}, replayed: {}", idempotency.key(), idempotency.replayed());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # With reqwest-retry
//!
//! Add this middleware **first**, `reqwest-retry`'s
//! `RetryTransientMiddleware` after it: the key is set once, before
//! reqwest-retry copies the request for each of its attempts, a `409` that
//! reqwest-retry returns (it never retries a 4xx) is waited out here, and
//! the replay marker is read from the response reqwest-retry ends with.
//! Each layer retries what it is set to, so their attempts multiply:
//! `max_attempts(1)` leaves 429, 503 and transport failures to reqwest-retry
//! (which does not read `Retry-After`), and this middleware still keys the
//! request, waits out `409`s and marks replays.
//!
//! ```
//! use lambda_idempotency_client::IdempotencyMiddleware;
//! use reqwest_retry::{policies::ExponentialBackoff, RetryTransientMiddleware};
//!
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(IdempotencyMiddleware::new().max_attempts(1))
//!     .with(RetryTransientMiddleware::new_with_policy(
//!         ExponentialBackoff::builder().build_with_max_retries(3),
//!     ))
//!     .build();
//! # drop(client);
//! ```
//!
//! The other order keeps the key too: this middleware finds the key it
//! generated on reqwest-retry's first attempt in the request's extensions,
//! which reqwest-retry hands to every attempt. There, this middleware's own
//! attempts come first, and a [`GaveUp`] is an error reqwest-retry does not
//! retry.
//!
//! A fresh `Extensions` for each logical request, where you pass your own
//! to `execute_with_extensions`: the generated key is kept there.
//!
//! # A streamed body
//!
//! A request whose body is a stream (`reqwest::Body::wrap_stream`,
//! `Body::wrap`) cannot be copied, so it is sent once, with its key: its
//! response is returned as it is, a `409` or `503` included, with its
//! [`Idempotency`]; a transport failure is a [`GaveUp`] whose
//! [`body_replayable`](GaveUp::body_replayable) is `false`. Build the
//! stream again and send it with [`Idempotency::key`] or [`GaveUp::key`] as
//! its [`IdempotencyKey`] to get the first request's result.
//!
//! # TLS
//!
//! This crate turns on none of reqwest's features: your own `reqwest`
//! dependency chooses TLS (`rustls`, its default), HTTP/2 and the rest, and
//! features unify.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod gave_up;
mod key;
mod middleware;
mod outcome;
mod policy;
mod retry_after;

pub use gave_up::GaveUp;
pub use key::{IdempotencyKey, InvalidKey, MAX_KEY_LEN};
pub use middleware::{IdempotencyMiddleware, DEFAULT_KEY_HEADER, DEFAULT_REPLAYED_HEADER};
pub use outcome::Idempotency;
