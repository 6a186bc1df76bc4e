//! The client against raw TCP servers: one that reads each request whole
//! and hangs up, and ones that answer a scripted sequence of statuses, to
//! pin down what is retried, after how long, and with which key.

mod support;

use lambda_idempotency_client::{GaveUp, Idempotency, IdempotencyMiddleware};
use std::{error::Error as _, time::Duration};
use support::{
    client,
    raw::{Answer, RawServer},
};

fn idempotency(response: &reqwest::Response) -> Idempotency {
    response
        .extensions()
        .get::<Idempotency>()
        .cloned()
        .expect("the middleware's Idempotency")
}

fn status(code: u16, headers: &[(&'static str, &str)]) -> Answer {
    Answer::Status(
        code,
        headers
            .iter()
            .map(|(name, value)| (*name, (*value).to_owned()))
            .collect(),
    )
}

async fn post(
    client: &reqwest_middleware::ClientWithMiddleware,
    server: &RawServer,
) -> reqwest_middleware::Result<reqwest::Response> {
    client
        .post(server.url())
        .header("content-type", "application/json")
        .body(r#"{"amount":1250}"#)
        .send()
        .await
}

#[tokio::test]
async fn a_server_that_hangs_up_after_reading_the_body_gets_the_same_key_a_bounded_number_of_times()
{
    let server = RawServer::start(vec![Answer::HangUp]).await;
    let client = client(IdempotencyMiddleware::new().max_attempts(4));

    let error = tokio::time::timeout(Duration::from_secs(30), post(&client, &server))
        .await
        .expect("bounded attempts end")
        .expect_err("no answer, ever");

    let received = server.received();
    assert_eq!(received.len(), 4, "bounded: 4 attempts");
    assert!(received
        .iter()
        .all(|request| request.body == br#"{"amount":1250}"#));
    let keys = server.keys();
    assert!(keys.iter().all(|key| *key == keys[0]), "one key: {keys:?}");
    let reqwest_middleware::Error::Middleware(error) = error else {
        panic!("not the middleware's error: {error:?}");
    };
    let gave_up = error.downcast_ref::<GaveUp>().expect("GaveUp");
    assert_eq!(gave_up.attempts(), 4);
    assert_eq!(gave_up.key().as_str(), keys[0]);
    assert!(gave_up.body_replayable());
    assert_eq!(
        gave_up.to_string(),
        format!(
            "no response after 4 attempts with Idempotency-Key {}",
            keys[0]
        )
    );
    let last = gave_up.source().expect("the last failure");
    assert!(
        last.downcast_ref::<reqwest::Error>()
            .is_some_and(reqwest::Error::is_request),
        "{last:?}"
    );
}

#[tokio::test]
async fn too_many_requests_is_sent_again_after_retry_after_with_the_same_key() {
    let server = RawServer::start(vec![
        status(429, &[("retry-after", "1")]),
        status(201, &[("idempotent-replayed", "true")]),
    ])
    .await;
    let client = client(IdempotencyMiddleware::new());

    let response = post(&client, &server).await.unwrap();

    assert_eq!(response.status(), 201);
    assert_eq!(idempotency(&response).attempts(), 2);
    assert!(idempotency(&response).replayed());
    let received = server.received();
    assert_eq!(received[0].key, received[1].key);
    let waited = received[1].at - received[0].at;
    assert!(
        waited >= Duration::from_secs(1),
        "sent again after {waited:?}, not the 1 s asked"
    );
}

#[tokio::test]
async fn in_progress_is_waited_out_as_retry_after_says() {
    let server = RawServer::start(vec![
        status(409, &[("retry-after", "1")]),
        status(409, &[("retry-after", "1")]),
        status(200, &[]),
    ])
    .await;
    // The backoff is 20 ms: only Retry-After makes the client wait 1 s.
    let client = client(IdempotencyMiddleware::new());

    let response = post(&client, &server).await.unwrap();

    assert_eq!(response.status(), 200);
    assert_eq!(idempotency(&response).attempts(), 3);
    assert!(!idempotency(&response).replayed());
    let received = server.received();
    for pair in received.windows(2) {
        assert_eq!(pair[0].key, pair[1].key);
        let waited = pair[1].at - pair[0].at;
        assert!(
            waited >= Duration::from_secs(1),
            "sent again after {waited:?}, not the 1 s asked"
        );
    }
}

#[tokio::test]
async fn unavailable_without_retry_after_is_sent_again_with_backoff_and_then_returned() {
    let server = RawServer::start(vec![status(503, &[])]).await;
    let client = client(IdempotencyMiddleware::new().max_attempts(3));

    let response = post(&client, &server).await.unwrap();

    assert_eq!(response.status(), 503);
    assert_eq!(idempotency(&response).attempts(), 3);
    let keys = server.keys();
    assert_eq!(keys.len(), 3);
    assert!(keys.iter().all(|key| *key == keys[0]));
}

#[tokio::test]
async fn client_errors_are_returned_at_once_whatever_they_say() {
    for (code, headers) in [
        (400, vec![]),
        (422, vec![("retry-after", "1")]),
        (404, vec![]),
        // A conflict of the resource's state, not a request in progress.
        (409, vec![]),
    ] {
        let server = RawServer::start(vec![status(code, &headers), status(201, &[])]).await;
        let client = client(IdempotencyMiddleware::new());

        let response = post(&client, &server).await.unwrap();

        assert_eq!(response.status(), code);
        assert_eq!(idempotency(&response).attempts(), 1, "{code}");
        assert_eq!(server.received().len(), 1, "{code} sent once");
    }
}

#[tokio::test]
async fn a_retry_after_past_the_bound_is_not_waited_for() {
    let server = RawServer::start(vec![
        status(503, &[("retry-after", "3600")]),
        status(201, &[]),
    ])
    .await;
    let client = client(IdempotencyMiddleware::new().max_retry_after(Duration::from_secs(5)));

    let response = post(&client, &server).await.unwrap();

    assert_eq!(response.status(), 503);
    assert_eq!(idempotency(&response).attempts(), 1);
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn methods_left_alone_are_sent_once_without_a_key() {
    let server = RawServer::start(vec![status(503, &[]), status(200, &[])]).await;
    let plain = client(IdempotencyMiddleware::new());

    let response = plain.put(server.url()).body("{}").send().await.unwrap();

    assert_eq!(response.status(), 503);
    assert!(response.extensions().get::<Idempotency>().is_none());
    assert_eq!(server.keys(), [""]);

    // Made keyed by configuration, PUT is keyed and retried.
    let server = RawServer::start(vec![status(503, &[]), status(200, &[])]).await;
    let keyed = client(IdempotencyMiddleware::new().methods([reqwest::Method::PUT]));
    let response = keyed.put(server.url()).body("{}").send().await.unwrap();
    assert_eq!(response.status(), 200);
    let keys = server.keys();
    assert_eq!(keys.len(), 2);
    assert!(!keys[0].is_empty() && keys[0] == keys[1]);
}

#[tokio::test]
async fn a_server_that_never_answers_is_sent_the_same_key_again_after_each_timeout() {
    let server = RawServer::start(vec![Answer::Stall]).await;
    let client = client(IdempotencyMiddleware::new().max_attempts(3));

    let error = client
        .post(server.url())
        .timeout(Duration::from_millis(300))
        .body(r#"{"amount":1250}"#)
        .send()
        .await
        .expect_err("no answer");

    let keys = server.keys();
    assert_eq!(keys.len(), 3);
    assert!(keys.iter().all(|key| *key == keys[0]), "one key: {keys:?}");
    let reqwest_middleware::Error::Middleware(error) = error else {
        panic!("not the middleware's error: {error:?}");
    };
    let gave_up = error.downcast_ref::<GaveUp>().expect("GaveUp");
    assert_eq!(gave_up.attempts(), 3);
    let last = gave_up
        .source()
        .and_then(|source| source.downcast_ref::<reqwest::Error>());
    assert!(last.is_some_and(reqwest::Error::is_timeout), "{last:?}");
}

#[tokio::test]
async fn a_refused_connection_is_tried_again_a_bounded_number_of_times() {
    // A port nothing listens on any more.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = client(IdempotencyMiddleware::new().max_attempts(3));

    let error = client
        .post(format!("http://{addr}/charges"))
        .body("{}")
        .send()
        .await
        .expect_err("refused");

    let reqwest_middleware::Error::Middleware(error) = error else {
        panic!("not the middleware's error: {error:?}");
    };
    let gave_up = error.downcast_ref::<GaveUp>().expect("GaveUp");
    assert_eq!(gave_up.attempts(), 3);
    let last = gave_up
        .source()
        .and_then(|source| source.downcast_ref::<reqwest::Error>());
    assert!(last.is_some_and(reqwest::Error::is_connect), "{last:?}");
}

#[tokio::test]
async fn a_server_that_resets_after_reading_the_body_gets_the_same_key_a_bounded_number_of_times() {
    let server = RawServer::start(vec![Answer::Reset]).await;
    let client = client(IdempotencyMiddleware::new().max_attempts(3));

    let error = tokio::time::timeout(Duration::from_secs(30), post(&client, &server))
        .await
        .expect("bounded attempts end")
        .expect_err("no answer, ever");

    let keys = server.keys();
    assert_eq!(keys.len(), 3);
    assert!(keys.iter().all(|key| *key == keys[0]), "one key: {keys:?}");
    let reqwest_middleware::Error::Middleware(error) = error else {
        panic!("not the middleware's error: {error:?}");
    };
    let gave_up = error.downcast_ref::<GaveUp>().expect("GaveUp");
    assert_eq!(
        (gave_up.attempts(), gave_up.key().as_str()),
        (3, keys[0].as_str())
    );
}
