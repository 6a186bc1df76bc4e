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

/// A client with only this middleware, as given (no backoff of the tests').
fn client_as_is(middleware: IdempotencyMiddleware) -> reqwest_middleware::ClientWithMiddleware {
    reqwest_middleware::ClientBuilder::new(support::reqwest())
        .with(middleware)
        .build()
}

#[tokio::test]
async fn a_409_asking_for_no_wait_with_a_zero_backoff_still_ends_within_the_budget() {
    let server = RawServer::start(vec![status(409, &[("retry-after", "0")])]).await;
    // A zero backoff, as tests and latency-minded callers set it.
    let client = client_as_is(
        IdempotencyMiddleware::new()
            .backoff(Duration::ZERO, Duration::ZERO)
            .wait_in_progress(Duration::from_secs(1)),
    );

    let result = tokio::time::timeout(Duration::from_secs(5), post(&client, &server)).await;

    let sent = server.received().len();
    let response = result.unwrap_or_else(|_| {
        panic!("still sending after 5 s against a 1 s budget: {sent} attempts so far")
    });
    assert_eq!(response.unwrap().status(), 409);
}

#[tokio::test]
async fn a_409_whose_retry_after_is_an_http_date_is_waited_until_then() {
    // Three seconds ahead: the date's whole seconds leave more than two.
    let at = std::time::SystemTime::now() + Duration::from_secs(3);
    let server = RawServer::start(vec![
        status(409, &[("retry-after", &httpdate_of(at))]),
        status(201, &[("idempotent-replayed", "true")]),
    ])
    .await;
    let client = client(IdempotencyMiddleware::new());

    let response = post(&client, &server).await.unwrap();

    assert_eq!(response.status(), 201);
    assert!(idempotency(&response).replayed());
    let received = server.received();
    assert_eq!(received[0].key, received[1].key);
    // The date has whole seconds: at least two of the three asked.
    let waited = received[1].at - received[0].at;
    assert!(waited >= Duration::from_secs(2), "{waited:?}");
}

fn httpdate_of(at: std::time::SystemTime) -> String {
    // RFC 9110's IMF-fixdate, by hand (httpdate is not a dev-dependency).
    let secs = at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (h, m, s) = (rest / 3600, rest % 3600 / 60, rest % 60);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days % 7) as usize];
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{weekday}, {d:02} {} {year} {h:02}:{m:02}:{s:02} GMT",
        months[(month - 1) as usize]
    )
}

#[tokio::test]
async fn a_503_with_retry_after_zero_is_sent_again_at_once_a_bounded_number_of_times() {
    let server = RawServer::start(vec![status(503, &[("retry-after", "0")])]).await;
    let client = client(IdempotencyMiddleware::new().max_attempts(3));

    let response = tokio::time::timeout(Duration::from_secs(5), post(&client, &server))
        .await
        .expect("bounded")
        .unwrap();

    assert_eq!(response.status(), 503);
    assert_eq!(idempotency(&response).attempts(), 3);
    let keys = server.keys();
    assert_eq!(keys.len(), 3);
    assert!(keys.iter().all(|key| *key == keys[0]));
}

/// A key header the caller set that is not a key (bytes outside visible
/// ASCII, as a key copied from a Latin-1 source has): refused before
/// anything is sent, with the reason, rather than sent and given back
/// (`Idempotency::key`, `GaveUp::key`) as another key than the one sent.
#[tokio::test]
async fn a_key_header_that_is_not_a_key_is_refused_before_anything_is_sent() {
    let server = RawServer::start(vec![status(201, &[])]).await;
    let client = client(IdempotencyMiddleware::new());
    for bad in [&b"ord\xe9r-1"[..], b"", b"two words"] {
        let sent = reqwest::header::HeaderValue::from_bytes(bad).unwrap();
        let error = client
            .post(server.url())
            .header("idempotency-key", sent)
            .body("{}")
            .send()
            .await
            .expect_err("not a key");
        let reqwest_middleware::Error::Middleware(error) = error else {
            panic!("a middleware error: {error:?}")
        };
        assert!(
            error
                .downcast_ref::<lambda_idempotency_client::InvalidKey>()
                .is_some(),
            "{error:?}"
        );
    }
    assert!(server.received().is_empty(), "nothing sent");
}

#[tokio::test]
async fn a_307_or_308_redirect_keeps_the_key_and_the_body_a_303_becomes_a_get() {
    for code in [307, 308] {
        let server = RawServer::start(vec![
            status(code, &[("location", "/v2/charges")]),
            status(201, &[("idempotent-replayed", "true")]),
        ])
        .await;
        let client = client(IdempotencyMiddleware::new());

        let response = post(&client, &server).await.unwrap();

        assert_eq!(response.status(), 201, "{code}");
        let sent = idempotency(&response);
        assert!(sent.replayed(), "the final response's marker");
        assert_eq!(sent.attempts(), 1, "reqwest's redirect is one attempt");
        let received = server.received();
        assert_eq!(received.len(), 2);
        assert_eq!(received[1].path, "/v2/charges");
        assert_eq!(received[1].method, "POST");
        assert_eq!(received[1].body, received[0].body);
        assert_eq!(received[1].key.as_deref(), Some(sent.key().as_str()));
        assert_eq!(received[0].key, received[1].key);
    }
    // 303 See Other: the answer is elsewhere, fetched with GET, no body.
    let server = RawServer::start(vec![
        status(303, &[("location", "/v1/charges/ch_1")]),
        status(200, &[]),
    ])
    .await;
    let client = client(IdempotencyMiddleware::new());
    let response = post(&client, &server).await.unwrap();
    assert_eq!(response.status(), 200);
    let received = server.received();
    assert_eq!(received[1].method, "GET");
    assert!(received[1].body.is_empty());
    assert_eq!(idempotency(&response).attempts(), 1);
}

#[tokio::test]
async fn a_caller_that_gives_up_mid_wait_leaves_nothing_sending() {
    let server = RawServer::start(vec![status(409, &[("retry-after", "1")])]).await;
    let client = client(IdempotencyMiddleware::new());

    let gave_up = tokio::time::timeout(Duration::from_millis(1_500), post(&client, &server)).await;
    assert!(gave_up.is_err(), "the caller's own timeout ends it");
    let when_dropped = server.received().len();
    assert!(
        (1..=2).contains(&when_dropped),
        "at 0 s and 1 s: {when_dropped}"
    );

    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        server.received().len(),
        when_dropped,
        "no attempt after the future was dropped"
    );
}

/// The answer's head arrived and its body is cut: the middleware has
/// returned the response already, so the failure is the caller's read,
/// not retried; the key is on the response, read before its body.
#[tokio::test]
async fn a_body_cut_after_the_head_is_not_retried_and_its_key_is_on_the_response() {
    let server = RawServer::start(vec![Answer::Truncated(vec![]), status(201, &[])]).await;
    let client = client(IdempotencyMiddleware::new());

    let response = post(&client, &server).await.unwrap();
    assert_eq!(response.status(), 201);
    let sent = idempotency(&response);
    assert_eq!(sent.attempts(), 1);
    let error = response.bytes().await.expect_err("the body was cut");
    assert!(
        error.is_body() || error.is_decode() || error.is_request(),
        "{error:?}"
    );
    assert_eq!(server.received().len(), 1, "not sent again");
    assert_eq!(server.keys()[0], sent.key().as_str());
}

/// Stripe, which the crate's docs name as a peer, answers a duplicate of a
/// request still in progress `409` (`idempotency_key_in_use`) without
/// `Retry-After`, with `Stripe-Should-Retry: true`; its own SDKs
/// (stripe-node's `_shouldRetry`, stripe-java, stripe-python) send any
/// `409` again with the same key, and honour `Stripe-Should-Retry`.
#[tokio::test]
async fn a_stripe_style_409_in_progress_is_waited_out() {
    let server = RawServer::start(vec![
        status(409, &[("stripe-should-retry", "true")]),
        status(200, &[("idempotent-replayed", "true")]),
    ])
    .await;
    let client = client(IdempotencyMiddleware::new());

    let response = post(&client, &server).await.unwrap();

    assert_eq!(
        response.status(),
        200,
        "the first request's result, after {} attempt(s)",
        idempotency(&response).attempts()
    );
    assert!(idempotency(&response).replayed());
}

/// A `409` marked `Idempotent-Replayed: true` is the key's stored answer
/// (a server that stores a handler's own conflict, with its
/// `Retry-After`), not a request in progress: sending it again gets it
/// again. This crate's server does not store a 409 by default; one told
/// to (`store_when`), or another, does.
#[tokio::test]
async fn a_replayed_409_is_returned_at_once() {
    let server = RawServer::start(vec![status(
        409,
        &[("retry-after", "1"), ("idempotent-replayed", "true")],
    )])
    .await;
    let client = client(IdempotencyMiddleware::new().wait_in_progress(Duration::from_secs(3)));

    let response = post(&client, &server).await.unwrap();

    assert_eq!(response.status(), 409);
    assert!(idempotency(&response).replayed());
    assert_eq!(
        server.received().len(),
        1,
        "the stored answer, asked for again and again"
    );
}
