//! A streamed request body cannot be copied, so it cannot be sent again:
//! the middleware sends it once, with its key, returns what came (a
//! response, or a `GaveUp` that names the key), and the caller sends a new
//! stream with that key.

mod support;

use bytes::Bytes;
use http_body_util::Full;
use lambda_idempotency_client::{GaveUp, Idempotency, IdempotencyMiddleware};
use support::{
    client,
    raw::{Answer, RawServer},
    server::Server,
};

/// A body reqwest holds as a stream (`Body::wrap`), not as bytes.
fn streamed(json: &'static str) -> reqwest::Body {
    reqwest::Body::wrap(Full::new(Bytes::from_static(json.as_bytes())))
}

#[tokio::test]
async fn a_streamed_body_gets_its_first_response_as_it_is() {
    let server = Server::start().await;
    let client = client(IdempotencyMiddleware::new());
    server.store.fail_next(usize::MAX);

    let response = client
        .post(server.url("/charges"))
        .header("content-type", "application/json")
        .body(streamed(r#"{"amount":9}"#))
        .send()
        .await
        .unwrap();

    // The 503 that a copyable body would have been sent again after.
    assert_eq!(response.status(), 503);
    let sent = response.extensions().get::<Idempotency>().cloned().unwrap();
    assert_eq!(sent.attempts(), 1);
    assert_eq!(server.keys(), [sent.key().as_str()]);

    // A new stream, sent with the key it was given.
    server.store.fail_next(0);
    let again = client
        .post(server.url("/charges"))
        .header("content-type", "application/json")
        .body(streamed(r#"{"amount":9}"#))
        .with_extension(sent.key().clone())
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(server.keys(), vec![sent.key().as_str(); 2]);
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn a_streamed_body_whose_connection_drops_is_a_gave_up_that_names_its_key() {
    let server = RawServer::start(vec![Answer::HangUp]).await;
    let client = client(IdempotencyMiddleware::new());

    let error = client
        .post(server.url())
        .body(streamed(r#"{"amount":9}"#))
        .send()
        .await
        .expect_err("no answer");

    assert_eq!(server.received().len(), 1, "sent once");
    let reqwest_middleware::Error::Middleware(error) = error else {
        panic!("not the middleware's error: {error:?}");
    };
    let gave_up = error.downcast_ref::<GaveUp>().expect("GaveUp");
    assert_eq!(gave_up.attempts(), 1);
    assert!(!gave_up.body_replayable());
    assert_eq!(
        Some(gave_up.key().as_str()),
        server.received()[0].key.as_deref()
    );
    assert!(
        gave_up.to_string().contains("cannot be sent again"),
        "{gave_up}"
    );
}
