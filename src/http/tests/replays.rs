//! What a retry gets: the stored response, exactly, or a 422 for another
//! payload, or an explanation for a response that was not stored.

use super::*;

#[tokio::test]
async fn replays_the_stored_response_without_running() {
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .layer(echo.clone());
    let first = send(&mut service, post(Some("k1"), r#"{"amount":100}"#)).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get(REPLAYED_HEADER).is_none());
    assert_eq!(
        first.headers()[header::SET_COOKIE],
        "session=secret",
        "the fresh response is untouched"
    );

    let replay = send(&mut service, post(Some("k1"), "{ \"amount\": 100 }")).await;
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert_eq!(text(&replay), text(&first));
    assert_eq!(replay.headers()[header::LOCATION], "/v1/charges/ch_1");
    assert!(
        replay.headers().get(header::SET_COOKIE).is_none(),
        "set-cookie is never replayed by default"
    );
    assert_eq!(echo.runs(), 1);
}

#[tokio::test]
async fn a_different_payload_is_a_422() {
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .layer(echo.clone());
    send(&mut service, post(Some("k"), r#"{"amount":100}"#)).await;
    let response = send(&mut service, post(Some("k"), r#"{"amount":999}"#)).await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        problem(&response)["type"],
        "urn:lambda-idempotency:problem:idempotency-key-reused"
    );
    let other_path = http::Request::post("/v1/refunds")
        .header("idempotency-key", "k")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(r#"{"amount":100}"#))
        .unwrap();
    // Same (anonymous) principal but another route: another scope.
    assert_eq!(
        send(&mut service, other_path).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(echo.runs(), 2);
}

#[tokio::test]
async fn a_corrupt_record_is_a_500_never_a_replay() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).build();
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine)
        .shared_scope()
        .layer(echo.clone());
    send(&mut service, post(Some("k"), "{}")).await;
    for mut record in store.records() {
        record.response = Some(b"\x07garbage".to_vec());
        store.insert_record(record);
    }
    let response = send(&mut service, post(Some("k"), "{}")).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        problem(&response)["type"],
        "urn:lambda-idempotency:problem:idempotency-record-corrupt"
    );
    assert_eq!(echo.runs(), 1);
}

#[tokio::test]
async fn binary_bodies_round_trip_exactly() {
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .layer(echo.clone());
    let bytes: Vec<u8> = (0..=255).chain((0..=255).rev()).collect();
    let request = || {
        http::Request::post("/v1/files")
            .header("idempotency-key", "k")
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(Body::Binary(bytes.clone()))
            .unwrap()
    };
    let first = send(&mut service, request()).await;
    let replay = send(&mut service, request()).await;
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert!(
        replay.body() == &Body::Binary(bytes.clone()),
        "the replay's body differs"
    );
    assert!(first.body() == replay.body());
}

#[tokio::test]
async fn a_response_too_large_to_store_is_never_run_again() {
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .max_stored_response(2048)
        .layer(echo.clone());
    let mut rng = fastrand::Rng::with_seed(0x9e37_79b9_7f4a_7c15);
    let noise: Vec<u8> = std::iter::repeat_with(|| rng.u8(..))
        .take(32 * 1024)
        .collect();
    let request = || {
        http::Request::post("/v1/exports")
            .header("idempotency-key", "k")
            .body(Body::Binary(noise.clone()))
            .unwrap()
    };
    let first = send(&mut service, request()).await;
    assert!(
        first.body() == &Body::Binary(noise.clone()),
        "the caller gets the whole response"
    );
    let retry = send(&mut service, request()).await;
    assert_eq!(retry.status(), StatusCode::CREATED, "the original status");
    assert_eq!(retry.headers()[REPLAYED_HEADER], "true");
    assert_eq!(retry.headers()[header::LOCATION], "/v1/charges/ch_1");
    assert_eq!(
        problem(&retry)["type"],
        "urn:lambda-idempotency:problem:idempotency-response-not-stored"
    );
    assert_eq!(echo.runs(), 1);
}

/// Review of issue 22: the explanation that replaces a body too large to
/// store is plain JSON; the stored `Content-Encoding` (and the other headers
/// that describe the original body) used to be copied onto it, so a client
/// tried to gunzip the problem and failed.
#[tokio::test]
async fn a_not_stored_replay_does_not_describe_the_body_it_lacks() {
    let mut rng = fastrand::Rng::with_seed(0x2545_f491_4f6c_dd1d);
    let noise: Vec<u8> = std::iter::repeat_with(|| rng.u8(..))
        .take(32 * 1024)
        .collect();
    let handler = service_fn(move |_: Request| {
        let noise = noise.clone();
        async move {
            Ok::<_, BoxError>(
                Response::builder()
                    .status(201)
                    .header(header::CONTENT_TYPE, "application/json")
                    .header(header::CONTENT_ENCODING, "gzip")
                    .header(header::CONTENT_LANGUAGE, "fr")
                    .header(
                        header::CONTENT_DISPOSITION,
                        "attachment; filename=\"export.gz\"",
                    )
                    .header(header::LOCATION, "/v1/exports/1")
                    .body(Body::Binary(noise))
                    .expect("response"),
            )
        }
    });
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .max_stored_response(2048)
        .layer(handler);
    let request = || {
        http::Request::post("/v1/exports")
            .header("idempotency-key", "k")
            .body(Body::Empty)
            .expect("request")
    };
    let first = send(&mut service, request()).await;
    assert_eq!(first.headers()[header::CONTENT_ENCODING], "gzip");
    let retry = send(&mut service, request()).await;
    assert_eq!(retry.headers()[REPLAYED_HEADER], "true");
    assert_eq!(retry.headers()[header::LOCATION], "/v1/exports/1");
    for name in [
        header::CONTENT_ENCODING,
        header::CONTENT_LANGUAGE,
        header::CONTENT_DISPOSITION,
    ] {
        assert!(
            retry.headers().get(&name).is_none(),
            "{name} describes the original body, not the problem"
        );
    }
    assert_eq!(
        problem(&retry)["type"],
        "urn:lambda-idempotency:problem:idempotency-response-not-stored"
    );
}

/// Issue 10, item 10: a replay describes its body, whatever the allowlist.
#[tokio::test]
async fn headers_that_describe_the_body_are_always_replayed() {
    let handler = service_fn(|_: Request| async {
        Response::builder()
            .status(200)
            .header(header::CONTENT_TYPE, "text/csv")
            .header(header::CONTENT_ENCODING, "gzip")
            .header(header::CONTENT_LANGUAGE, "de")
            .header(
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"r.csv.gz\"",
            )
            .header(header::LOCATION, "/reports/1")
            .body(Body::Binary(vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0]))
            .map_err(BoxError::from)
    });
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .stored_headers([])
        .layer(handler);
    let first = send(&mut service, post(Some("k"), "{}")).await;
    let replay = send(&mut service, post(Some("k"), "{}")).await;
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert_eq!(replay.body(), first.body());
    for name in BODY_HEADERS {
        assert_eq!(
            replay.headers().get(&name),
            first.headers().get(&name),
            "{name}"
        );
    }
    assert!(
        replay.headers().get(header::LOCATION).is_none(),
        "not listed"
    );
}

#[tokio::test]
async fn the_replay_hook_adjusts_replays_only() {
    let clock = ManualClock::new(1_700_000_000_000);
    let engine = Engine::builder(MemoryStore::new())
        .clock(clock.clone())
        .build();
    let mut service = IdempotencyLayer::new(engine)
        .shared_scope()
        .on_replay(|response, replayed| {
            let at = replayed.completed_at_ms.unwrap_or_default();
            response.headers_mut().insert(
                "x-original-completed-at-ms",
                HeaderValue::from_str(&at.to_string()).unwrap(),
            );
        })
        .layer(Echo::new());
    let first = send(&mut service, post(Some("k"), r#"{"a":1}"#)).await;
    assert!(first.headers().get("x-original-completed-at-ms").is_none());
    clock.advance(Duration::from_secs(7));
    let replay = send(&mut service, post(Some("k"), r#"{"a":1}"#)).await;
    assert_eq!(
        replay.headers().get("x-original-completed-at-ms").unwrap(),
        "1700000000000",
        "the first request's completion time"
    );
    assert_eq!(replay.headers().get(REPLAYED_HEADER).unwrap(), "true");
}

/// With the engine's encryption, a replay through the layer is the first
/// response, byte for byte (status, headers, body: small, binary and large
/// enough for the layer's own compression), though the store holds only
/// sealed bytes.
#[cfg(feature = "encryption")]
#[tokio::test]
async fn an_encrypted_replay_is_the_first_response_byte_for_byte() {
    use crate::encryption::{key_id_of, Encryption, RawKeys};
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone())
        .encryption(Encryption::new(
            RawKeys::new("k1", &[1; 32]).unwrap(),
            "test",
        ))
        .build();
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine)
        .shared_scope()
        .layer(echo.clone());
    let large = format!(r#"{{"amount":100,"memo":"{}"}}"#, "card 4242 ".repeat(1000));
    let bodies = [
        Body::from(r#"{"amount":100,"card":"4242424242424242"}"#),
        Body::Binary((0..=255).chain((0..=255).rev()).collect()),
        Body::from(large.as_str()),
    ];
    for (n, body) in bodies.into_iter().enumerate() {
        let key = format!("k{n}");
        let request = || {
            http::Request::post("/v1/charges")
                .header("idempotency-key", key.as_str())
                .header(header::CONTENT_TYPE, "application/json")
                .body(body.clone())
                .unwrap()
        };
        let first = send(&mut service, request()).await;
        let replay = send(&mut service, request()).await;
        assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
        assert_eq!(replay.status(), first.status());
        assert!(replay.body() == first.body(), "the replay's body differs");
        for (name, value) in first.headers() {
            if name != header::SET_COOKIE {
                assert_eq!(replay.headers().get(name), Some(value), "{name}");
            }
        }
    }
    assert_eq!(echo.runs(), 3);
    for record in store.records() {
        let response = record.response.expect("completed");
        assert_eq!(key_id_of(&response), Some("k1"));
        assert!(!response.windows(4).any(|w| w == b"4242"), "sealed");
    }
}

/// A tampered record, with encryption on, is answered with a problem of
/// its own, never replayed and never run again; the record stays.
#[cfg(feature = "encryption")]
#[tokio::test]
async fn a_tampered_encrypted_record_is_a_problem_of_its_own() {
    use crate::encryption::{Encryption, RawKeys};
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone())
        .encryption(Encryption::new(
            RawKeys::new("k1", &[1; 32]).unwrap(),
            "test",
        ))
        .build();
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine)
        .shared_scope()
        .layer(echo.clone());
    send(&mut service, post(Some("k"), r#"{"amount":100}"#)).await;
    let mut tampered = store.records();
    for record in &mut tampered {
        let response = record.response.as_mut().expect("completed");
        let last = response.len() - 1;
        response[last] ^= 1;
        store.insert_record(record.clone());
    }
    for _ in 0..2 {
        let response = send(&mut service, post(Some("k"), r#"{"amount":100}"#)).await;
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(response.headers().get(REPLAYED_HEADER).is_none());
        let problem = problem(&response);
        assert_eq!(
            problem["type"],
            "urn:lambda-idempotency:problem:idempotency-record-unauthentic"
        );
        assert_eq!(problem["status"], 500);
    }
    assert_eq!(echo.runs(), 1);
    assert_eq!(store.records(), tampered, "not overwritten");
}
