//! The bound on running work (`max_in_flight`): refused before the claim,
//! and each slot given back however its work ends.

use super::*;
use futures_util::FutureExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_in_flight_a_request_is_503_and_claims_nothing() {
    let echo = Echo {
        delay: Duration::from_millis(300),
        ..Echo::new()
    };
    let store = MemoryStore::new();
    let layer = IdempotencyLayer::new(Engine::builder(store.clone()).build())
        .shared_scope()
        .max_in_flight(1);
    let in_flight = layer.in_flight();
    let service = layer.layer(echo.clone());
    // The first request's client leaves while its handler runs: its work
    // goes on, and keeps its slot.
    let first = tokio::spawn(service.clone().oneshot(post(Some("a"), "{}")));
    while echo.runs() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first.abort();
    assert_eq!(in_flight.len(), 1);

    let refused = service
        .clone()
        .oneshot(post(Some("b"), "{}"))
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
    assert_eq!(
        problem(&refused)["type"],
        "urn:lambda-idempotency:problem:idempotency-overloaded"
    );
    assert_eq!(store.records().len(), 1, "only the first request's claim");
    assert_eq!(echo.runs(), 1);

    assert!(in_flight.wait(Duration::from_secs(5)).await);
    let retry = service
        .clone()
        .oneshot(post(Some("b"), "{}"))
        .await
        .unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(retry.headers().get(REPLAYED_HEADER).is_none());
    assert_eq!(echo.runs(), 2);
}

/// A handler that panics before it first waits (in place, in the request's
/// future) or after (on the work's own task) gives its slot back: the next
/// request is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_gives_its_slot_back() {
    for delay in [Duration::ZERO, Duration::from_millis(20)] {
        let echo = Echo {
            delay,
            ..Echo::new()
        };
        let layer = IdempotencyLayer::new(engine())
            .shared_scope()
            .max_in_flight(1);
        let in_flight = layer.in_flight();
        let mut service = layer.layer(echo.clone());
        let mut panicking = post(Some("p"), "{}");
        panicking
            .headers_mut()
            .insert("x-panic", HeaderValue::from_static("1"));
        std::panic::AssertUnwindSafe(send(&mut service, panicking))
            .catch_unwind()
            .await
            .expect_err("the panic reaches the caller");
        assert_eq!(in_flight.len(), 0, "{delay:?}");
        let next = send(&mut service, post(Some("q"), "{}")).await;
        assert_eq!(next.status(), StatusCode::CREATED, "{delay:?}");
    }
}

#[tokio::test]
async fn the_default_bound_and_the_smallest() {
    let layer = IdempotencyLayer::new(engine());
    assert_eq!(
        layer.in_flight().limit(),
        crate::http::DEFAULT_MAX_IN_FLIGHT
    );
    assert_eq!(layer.max_in_flight(0).in_flight().limit(), 1);
}
