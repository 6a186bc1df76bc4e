//! The two ends the client's tests run against: this workspace's own
//! server (axum::serve behind the HTTP layer, `server`), and raw TCP
//! servers that answer as scripted or hang up (`raw`), with a proxy that
//! hangs up after the request reached the server (`hang_up`).

#![allow(dead_code)]

pub mod hang_up;
pub mod raw;
pub mod server;

use lambda_idempotency_client::IdempotencyMiddleware;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use std::time::Duration;

/// A client with only this middleware, its backoff short.
pub fn client(middleware: IdempotencyMiddleware) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest())
        .with(middleware.backoff(Duration::from_millis(20), Duration::from_millis(100)))
        .build()
}

/// A plain reqwest client that goes straight to the loopback address.
pub fn reqwest() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a reqwest client")
}
