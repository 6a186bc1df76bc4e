//! Which outcomes are stored, and what failures (the handler's, the
//! store's, a panic) leave behind; the metrics that count them.

use super::*;

#[tokio::test]
async fn server_errors_and_retryable_4xx_are_released_deterministic_4xx_stored() {
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .layer(echo.clone());
    let with_status = |key: &str, status: u16| {
        let mut request = post(Some(key), "{}");
        request
            .headers_mut()
            .insert("x-status", HeaderValue::from(status));
        request
    };
    for status in [500, 503, 429, 409, 408, 407, 403, 401] {
        let key = format!("released-{status}");
        assert_eq!(
            send(&mut service, with_status(&key, status))
                .await
                .status()
                .as_u16(),
            status
        );
        let again = send(&mut service, with_status(&key, status)).await;
        assert!(
            again.headers().get(REPLAYED_HEADER).is_none(),
            "{status} was released"
        );
    }
    assert_eq!(echo.runs(), 16);
    for status in [400, 404] {
        let key = format!("stored-{status}");
        send(&mut service, with_status(&key, status)).await;
        let again = send(&mut service, with_status(&key, status)).await;
        assert_eq!(again.status().as_u16(), status);
        assert_eq!(
            again.headers()[REPLAYED_HEADER],
            "true",
            "{status} was stored"
        );
    }
    assert_eq!(echo.runs(), 18);

    // A custom policy: store everything, as Stripe does for 500s.
    let mut store_all = IdempotencyLayer::new(engine())
        .shared_scope()
        .store_when(|_| true)
        .layer(echo.clone());
    send(&mut store_all, with_status("k", 500)).await;
    assert_eq!(
        send(&mut store_all, with_status("k", 500)).await.headers()[REPLAYED_HEADER],
        "true"
    );
}

#[tokio::test]
async fn handler_errors_release_the_claim_and_propagate() {
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .layer(echo.clone());
    let mut failing = post(Some("k"), "{}");
    failing
        .headers_mut()
        .insert("x-fail", HeaderValue::from_static("1"));
    let error = service
        .ready()
        .await
        .unwrap()
        .call(failing)
        .await
        .expect_err("handler error");
    assert_eq!(error.to_string(), "handler failed");
    let retry = send(&mut service, post(Some("k"), "{}")).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(echo.runs(), 2);
}

#[tokio::test]
async fn store_unavailable_is_a_503_and_the_handler_does_not_run() {
    let store = MemoryStore::new();
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(Engine::builder(store.clone()).build())
        .shared_scope()
        .layer(echo.clone());
    store.fail_next(1);
    let response = send(&mut service, post(Some("k"), "{}")).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key(header::RETRY_AFTER));
    assert_eq!(
        problem(&response)["type"],
        "urn:lambda-idempotency:problem:idempotency-store-unavailable"
    );
    assert_eq!(echo.runs(), 0);
}

/// Review of issue 22: `Content-Type` is not part of the fingerprint, so a
/// 415 (axum's `Json` rejection of a JSON body sent without
/// `Content-Type: application/json`) was stored and replayed to the retry
/// that fixed the header: the key could never succeed. 415 and 406 answer
/// headers, not the payload: a retry runs again.
#[tokio::test]
async fn answers_about_headers_outside_the_fingerprint_are_not_stored() {
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = Arc::clone(&runs);
        service_fn(move |request: Request| {
            runs.fetch_add(1, Ordering::SeqCst);
            let status = match (
                request.headers().get(header::CONTENT_TYPE),
                request.headers().get(header::ACCEPT),
            ) {
                (None, _) => 415,
                (_, Some(accept)) if accept == "text/csv" => 406,
                _ => 201,
            };
            async move {
                Ok::<_, BoxError>(
                    Response::builder()
                        .status(status)
                        .body(Body::Empty)
                        .expect("response"),
                )
            }
        })
    };
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .layer(handler);
    let request = |content_type: Option<&str>, accept: Option<&str>| {
        let mut builder = http::Request::post("/v1/charges").header("idempotency-key", "k");
        if let Some(value) = content_type {
            builder = builder.header(header::CONTENT_TYPE, value);
        }
        if let Some(value) = accept {
            builder = builder.header(header::ACCEPT, value);
        }
        builder
            .body(Body::from(r#"{"amount":1}"#))
            .expect("request")
    };
    let first = send(&mut service, request(None, None)).await;
    assert_eq!(first.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let second = send(
        &mut service,
        request(Some("application/json"), Some("text/csv")),
    )
    .await;
    assert_eq!(second.status(), StatusCode::NOT_ACCEPTABLE, "ran again");
    let fixed = send(&mut service, request(Some("application/json"), None)).await;
    assert_eq!(fixed.status(), StatusCode::CREATED, "ran again");
    assert!(fixed.headers().get(REPLAYED_HEADER).is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let replay = send(&mut service, request(Some("application/json"), None)).await;
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn metrics_count_outcomes_in_embedded_metric_format() {
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = Arc::clone(&lines);
    let metrics = EmfMetrics::new("Payments")
        .with_writer(move |line| sink.lock().unwrap().push(line.to_owned()));
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .metrics(metrics)
        .layer(Echo::new());
    send(&mut service, post(Some("k"), r#"{"a":1}"#)).await;
    send(&mut service, post(Some("k"), r#"{"a":1}"#)).await;
    send(&mut service, post(Some("k"), r#"{"a":2}"#)).await;
    send(&mut service, post(None, "{}")).await;
    let lines = lines.lock().unwrap();
    let outcomes: Vec<String> = lines
        .iter()
        .map(|line| {
            let json: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(
                json["_aws"]["CloudWatchMetrics"][0]["Namespace"],
                "Payments"
            );
            assert_eq!(json["IdempotentRequests"], 1);
            json["Outcome"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(outcomes, ["fresh", "replay", "key_reused", "bad_key"]);
    assert!(
        !lines.iter().any(|l| l.contains("\"k\"")),
        "no keys in metrics"
    );
}

/// Issue 21, item 9: a handler that panics leaves no claim behind: the
/// panic goes on to the runtime (lambda_http answers the invocation with an
/// error), and the client's retry runs at once instead of getting "in
/// progress" until the dead invocation's deadline.
#[tokio::test]
async fn a_panicking_handler_releases_its_claim() {
    use futures_util::FutureExt;
    let echo = Echo::new();
    let store = MemoryStore::new();
    let mut service = IdempotencyLayer::new(Engine::builder(store.clone()).build())
        .shared_scope()
        .layer(echo.clone());
    let mut panicking = post(Some("k"), "{}");
    panicking
        .headers_mut()
        .insert("x-panic", HeaderValue::from_static("1"));
    let panic = std::panic::AssertUnwindSafe(send(&mut service, panicking))
        .catch_unwind()
        .await
        .expect_err("the panic reaches the runtime");
    assert_eq!(
        crate::engine::panic_message(&*panic),
        "the handler panicked"
    );
    assert!(store.records().is_empty(), "{:?}", store.records());
    let retry = send(&mut service, post(Some("k"), "{}")).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(echo.runs(), 2);
}

/// `problem_for` answers an engine error met in a handler as the layer
/// answers it: the same status, type, `Retry-After`; the operation's own
/// error is left to the handler.
#[tokio::test]
async fn problem_for_answers_engine_errors_as_the_layer_does() {
    use crate::{Error, StoreError, StoreErrorKind};
    use http_body_util::{BodyExt, Full};
    let base = "urn:example:";
    let answer = |error: Error<()>| {
        crate::http::problem_for::<_, Full<bytes::Bytes>>(&error, base).expect("a problem")
    };
    let unauthentic = answer(Error::Store(StoreError::new(
        StoreErrorKind::Unauthentic,
        "a step fails to open",
    )));
    assert_eq!(unauthentic.status(), 500);
    let body = unauthentic.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        problem["type"],
        "urn:example:idempotency-record-unauthentic"
    );

    let outage = answer(Error::Store(StoreError::new(
        StoreErrorKind::Unavailable,
        "throttled",
    )));
    assert_eq!(outage.status(), 503);
    assert!(outage.headers().contains_key("retry-after"));
    assert_eq!(answer(Error::LeaseLost).status(), 409);
    assert!(
        crate::http::problem_for::<_, Full<bytes::Bytes>>(&Error::Operation(()), base).is_none()
    );
}
