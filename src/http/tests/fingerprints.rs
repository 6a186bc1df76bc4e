//! What counts as the same request: the whole request by default, or what
//! a `FingerprintSource` selects.

use super::*;
use crate::{http::FingerprintSource, Fingerprint};

fn charge(key: &str, amount: u64, sent_at: &str) -> Request {
    post(
        Some(key),
        &format!(r#"{{"amount":{amount},"currency":"eur","sent_at":"{sent_at}"}}"#),
    )
}

#[tokio::test]
async fn a_regenerated_timestamp_is_a_422_with_the_whole_request() {
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .layer(echo.clone());
    send(&mut service, charge("k", 1250, "10:00:00")).await;
    let retry = send(&mut service, charge("k", 1250, "10:00:05")).await;
    assert_eq!(retry.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(echo.runs(), 1);
}

#[tokio::test]
async fn selected_pointers_replay_a_retry_that_changed_only_the_rest() {
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .fingerprint_source(FingerprintSource::json_pointers(["/amount", "/currency"]))
        .layer(echo.clone());
    let first = send(&mut service, charge("k", 1250, "10:00:00")).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let retry = send(&mut service, charge("k", 1250, "10:00:05")).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()[REPLAYED_HEADER], "true");
    assert_eq!(text(&retry), text(&first));

    // A selected field that changed is another request.
    let other = send(&mut service, charge("k", 9999, "10:00:05")).await;
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    // So is the path, whatever the body.
    let refund = http::Request::post("/v1/charges/ch_1/refunds")
        .header("idempotency-key", "k")
        .body(Body::from(r#"{"amount":1250,"currency":"eur"}"#))
        .unwrap();
    let refund = send(&mut service, refund).await;
    assert_ne!(
        refund.headers().get(REPLAYED_HEADER),
        Some(&HeaderValue::from_static("true"))
    );
    // A selected field that went missing differs from one that is there.
    let missing = send(&mut service, post(Some("k"), r#"{"amount":1250}"#)).await;
    assert_eq!(missing.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(echo.runs(), 2, "the first charge and the refund");
}

#[tokio::test]
async fn a_body_that_is_not_json_counts_whole_under_pointers() {
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .fingerprint_source(FingerprintSource::json_pointers(["/amount"]))
        .layer(echo.clone());
    send(&mut service, post(Some("k"), "amount=1250")).await;
    let same = send(&mut service, post(Some("k"), "amount=1250")).await;
    assert_eq!(same.headers()[REPLAYED_HEADER], "true");
    let other = send(&mut service, post(Some("k"), "amount=9999")).await;
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(echo.runs(), 1);
}

#[tokio::test]
async fn a_fingerprint_function_decides_alone() {
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .fingerprint_source(FingerprintSource::from_fn(|request| {
            Fingerprint::of_parts([request.uri().path().as_bytes()])
        }))
        .layer(echo.clone());
    send(&mut service, charge("k", 1250, "10:00:00")).await;
    let retry = send(&mut service, charge("k", 7, "10:00:05")).await;
    assert_eq!(retry.headers()[REPLAYED_HEADER], "true");
    assert_eq!(echo.runs(), 1);
}

#[test]
fn a_pointer_without_its_slash_is_refused_when_the_layer_is_built() {
    let Err(error) = FingerprintSource::try_json_pointers(["/amount", "currency"]) else {
        panic!("\"currency\" is not a pointer");
    };
    assert_eq!(error.pointer, "currency");
    let Err(panic) = std::panic::catch_unwind(|| FingerprintSource::json_pointers(["amount"]))
    else {
        panic!("json_pointers panics on a pointer that is not one");
    };
    assert!(crate::engine::panic_message(&*panic).contains("did you mean \"/amount\"?"));
}
