//! The middleware composed with reqwest-retry's `RetryTransientMiddleware`:
//! the key survives the attempts reqwest-retry makes, in the order the
//! docs recommend (this middleware first) and in the other.

mod support;

use lambda_idempotency_client::{Idempotency, IdempotencyMiddleware};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::{policies::ExponentialBackoff, Jitter, RetryTransientMiddleware};
use std::time::Duration;
use support::{
    raw::{Answer, RawServer},
    reqwest,
    server::Server,
};

/// reqwest-retry with `retries` retries, 10 to 50 ms apart.
fn retry(retries: u32) -> RetryTransientMiddleware<ExponentialBackoff> {
    RetryTransientMiddleware::new_with_policy(
        ExponentialBackoff::builder()
            .retry_bounds(Duration::from_millis(10), Duration::from_millis(50))
            .jitter(Jitter::None)
            .build_with_max_retries(retries),
    )
}

/// This middleware first, reqwest-retry inside it: the recommended order.
fn keyed_then_retried(retries: u32) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest())
        .with(IdempotencyMiddleware::new().max_attempts(1))
        .with(retry(retries))
        .build()
}

async fn post(
    client: &ClientWithMiddleware,
    url: String,
) -> reqwest_middleware::Result<::reqwest::Response> {
    client
        .post(url)
        .header("content-type", "application/json")
        .body(r#"{"amount":1250}"#)
        .send()
        .await
}

#[tokio::test]
async fn reqwest_retrys_attempts_inside_send_the_key_set_once() {
    let server = RawServer::start(vec![Answer::HangUp]).await;

    let error = post(&keyed_then_retried(2), server.url())
        .await
        .expect_err("no answer");

    // reqwest-retry's own error: it retried; this middleware did not again.
    assert_eq!(error.to_string(), "Request failed after 2 retries");
    let keys = server.keys();
    assert_eq!(keys.len(), 3, "the first attempt and reqwest-retry's 2");
    assert!(!keys[0].is_empty());
    assert!(keys.iter().all(|key| *key == keys[0]), "one key: {keys:?}");
}

#[tokio::test]
async fn a_store_outage_retried_by_reqwest_retry_runs_once_and_is_marked() {
    let server = Server::start().await;
    // The first request's store call fails: 503, then reqwest-retry's
    // attempt.
    server.store.fail_next(1);

    let response = post(&keyed_then_retried(3), server.url("/charges"))
        .await
        .unwrap();

    assert_eq!(response.status(), 201);
    let sent = response.extensions().get::<Idempotency>().cloned().unwrap();
    assert_eq!(sent.attempts(), 1, "the attempts were reqwest-retry's");
    assert!(!sent.replayed());
    assert_eq!(server.keys(), vec![sent.key().as_str(); 2]);
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn with_reqwest_retry_outside_each_attempt_finds_the_key_generated_for_the_first() {
    let server = RawServer::start(vec![Answer::HangUp]).await;
    let client = ClientBuilder::new(reqwest())
        .with(retry(2))
        .with(IdempotencyMiddleware::new().max_attempts(1))
        .build();

    post(&client, server.url()).await.expect_err("no answer");

    let keys = server.keys();
    assert_eq!(keys.len(), 3);
    assert!(!keys[0].is_empty());
    assert!(keys.iter().all(|key| *key == keys[0]), "one key: {keys:?}");
}

#[tokio::test]
async fn a_409_that_reqwest_retry_returns_is_waited_out_and_replayed() {
    let server = Server::start().await;
    let first = tokio::spawn({
        let (client, url) = (keyed_then_retried(2), server.url("/slow"));
        async move {
            client
                .post(url)
                .header("content-type", "application/json")
                .header("idempotency-key", "slow-3")
                .body(r#"{"amount":1250}"#)
                .send()
                .await
                .unwrap()
        }
    });
    let started = async {
        while server.runs() < 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), started)
        .await
        .expect("the first request runs");

    let second = keyed_then_retried(2)
        .post(server.url("/slow"))
        .header("content-type", "application/json")
        .header("idempotency-key", "slow-3")
        .body(r#"{"amount":1250}"#)
        .send()
        .await
        .unwrap();

    assert_eq!(second.status(), 201);
    let sent = second.extensions().get::<Idempotency>().cloned().unwrap();
    assert!(sent.replayed());
    assert!(sent.attempts() >= 2, "told 409 first");
    assert_eq!(first.await.unwrap().status(), 201);
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn inside_reqwest_retry_this_middlewares_attempts_come_first_and_its_gave_up_ends_them() {
    let server = RawServer::start(vec![Answer::HangUp]).await;
    let client = ClientBuilder::new(reqwest())
        .with(retry(2))
        .with(
            IdempotencyMiddleware::new()
                .max_attempts(3)
                .backoff(Duration::from_millis(10), Duration::from_millis(50)),
        )
        .build();

    let error = post(&client, server.url()).await.expect_err("no answer");

    // Three attempts of this middleware's; reqwest-retry does not multiply
    // them.
    let keys = server.keys();
    assert_eq!(keys.len(), 3);
    assert!(keys.iter().all(|key| *key == keys[0]), "one key: {keys:?}");
    assert!(
        error.to_string().contains("no response after 3 attempts"),
        "{error}"
    );
}
