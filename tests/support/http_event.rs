//! One arbitrary event through the whole HTTP layer: shared by the
//! `http_event` fuzz target (`fuzz/`, which includes this file) and
//! `tests/arbitrary_events.rs`.
//!
//! Whatever the event holds, nothing panics; the answer is the handler's
//! (201, or its replay) or the layer's own 400; the same event parsed again
//! has the same scope and fingerprint.

use lambda_http::{request::from_str, Body, Request, Response};
use lambda_idempotency::{
    http::{default_scope, principal, request_fingerprint, IdempotencyLayer},
    Engine, MemoryStore,
};
use std::panic::catch_unwind;
use tower::{service_fn, Layer, ServiceExt};

/// Parses `json` as `lambda_http` does in a function; `None` when it is no
/// request event, or when `lambda_http` itself panics on it (it does on some
/// `Host` headers, before any layer runs).
pub fn parse(json: &str) -> Option<Request> {
    catch_unwind(|| from_str(json)).ok()?.ok()
}

/// Runs the event through a layer over a fresh memory store, twice (the
/// second time must replay or be the same rejection), and checks the
/// boundary's invariants.
pub fn check(runtime: &tokio::runtime::Runtime, json: &str) {
    let Some(request) = parse(json) else { return };
    let again = parse(json).expect("an event that parsed once parses again");
    assert_eq!(request_fingerprint(&request), request_fingerprint(&again));
    assert_eq!(default_scope(&request), default_scope(&again));
    assert_eq!(principal(&request), principal(&again));
    let idempotent = matches!(request.method().as_str(), "POST" | "PATCH");

    let service = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build()).layer(
        service_fn(|_: Request| async {
            Response::builder()
                .status(201)
                .body(Body::from("created"))
                .map_err(lambda_http::Error::from)
        }),
    );
    let first = runtime
        .block_on(service.clone().oneshot(request))
        .expect("the echo handler does not fail");
    let second = runtime
        .block_on(service.oneshot(again))
        .expect("the echo handler does not fail");
    for response in [&first, &second] {
        let status = response.status().as_u16();
        assert!(
            status == 201 || (idempotent && status == 400),
            "status {status}"
        );
    }
    assert_eq!(
        first.status(),
        second.status(),
        "a retry gets the same answer"
    );
}
