//! Where the key comes from, and the 400s for a missing or malformed one.

use super::*;

#[tokio::test]
async fn sf_string_and_token_forms_are_the_same_key() {
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .layer(echo.clone());
    send(&mut service, post(Some("abc-123"), "{}")).await;
    let replay = send(&mut service, post(Some("\"abc-123\""), "{}")).await;
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert_eq!(echo.runs(), 1);
}

#[tokio::test]
async fn missing_key_is_a_400_unless_optional() {
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .layer(echo.clone());
    let response = send(&mut service, post(None, "{}")).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        problem(&response)["type"],
        "urn:lambda-idempotency:problem:idempotency-key-missing"
    );
    assert_eq!(echo.runs(), 0);

    let mut optional = IdempotencyLayer::new(engine())
        .shared_scope()
        .require_key(false)
        .layer(echo.clone());
    send(&mut optional, post(None, "{}")).await;
    let again = send(&mut optional, post(None, "{}")).await;
    assert!(again.headers().get(REPLAYED_HEADER).is_none());
    assert_eq!(echo.runs(), 2, "without a key, no idempotency");
}

#[tokio::test]
async fn invalid_keys_are_400s_and_nothing_runs() {
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .layer(echo.clone());
    let long = "k".repeat(256);
    for key in [
        "",
        "\"\"",
        "two words",
        "\"unterminated",
        "\"bad\\escape\"",
        long.as_str(),
    ] {
        let response = send(&mut service, post(Some(key), "{}")).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{key:?}");
        assert_eq!(
            problem(&response)["type"],
            "urn:lambda-idempotency:problem:idempotency-key-invalid",
            "{key:?}"
        );
    }
    let mut non_ascii = post(None, "{}");
    non_ascii.headers_mut().insert(
        "idempotency-key",
        HeaderValue::from_bytes("clé".as_bytes()).unwrap(),
    );
    assert_eq!(
        send(&mut service, non_ascii).await.status(),
        StatusCode::BAD_REQUEST
    );

    let mut repeated = post(Some("a"), "{}");
    repeated
        .headers_mut()
        .append("idempotency-key", HeaderValue::from_static("b"));
    let response = send(&mut service, repeated).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(problem(&response)["detail"]
        .as_str()
        .unwrap()
        .contains("more than once"));
    assert_eq!(echo.runs(), 0);
}

#[tokio::test]
async fn other_methods_pass_through_untouched() {
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .layer(echo.clone());
    for _ in 0..2 {
        let get = http::Request::get("/v1/charges/ch_1")
            .header("idempotency-key", "k")
            .body(Body::Empty)
            .unwrap();
        let response = send(&mut service, get).await;
        assert!(response.headers().get(REPLAYED_HEADER).is_none());
    }
    assert_eq!(echo.runs(), 2);

    let mut put_too = IdempotencyLayer::new(engine())
        .shared_scope()
        .methods([Method::POST, Method::PUT])
        .layer(echo.clone());
    let put = || {
        http::Request::put("/v1/x")
            .header("idempotency-key", "k")
            .body(Body::from("{}"))
            .unwrap()
    };
    send(&mut put_too, put()).await;
    assert_eq!(
        send(&mut put_too, put()).await.headers()[REPLAYED_HEADER],
        "true"
    );
    assert_eq!(echo.runs(), 3);
}

#[tokio::test]
async fn a_custom_scope_and_header_are_used() {
    let echo = Echo::new();
    let layer = IdempotencyLayer::new(engine())
        .shared_scope()
        .header(HeaderName::from_static("x-request-key"))
        .scope(|request: &http::Request<bytes::Bytes>| {
            request
                .headers()
                .get("x-tenant-from-mtls")
                .map_or("none".into(), |v| format!("{v:?}"))
        });
    let mut service = layer.layer(echo.clone());
    let request = |tenant: &'static str| {
        http::Request::post("/v1/charges")
            .header("x-request-key", "k")
            .header("x-tenant-from-mtls", tenant)
            .body(Body::from("{}"))
            .unwrap()
    };
    send(&mut service, request("a")).await;
    send(&mut service, request("b")).await;
    assert_eq!(
        send(&mut service, request("a")).await.headers()[REPLAYED_HEADER],
        "true"
    );
    assert_eq!(echo.runs(), 2);
}

/// Issue 10, item 12: API Gateway HTTP APIs join a repeated header with
/// commas; that is two keys, not one.
#[tokio::test]
async fn a_comma_separated_key_is_a_repeated_header() {
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .layer(echo.clone());
    for key in ["key-one,key-two", "\"key-one\", \"key-two\""] {
        let response = send(&mut service, post(Some(key), "{}")).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{key}");
        assert!(problem(&response)["detail"]
            .as_str()
            .unwrap()
            .contains("more than once"));
    }
    let quoted = send(&mut service, post(Some("\"a,b\""), "{}")).await;
    assert_eq!(
        quoted.status(),
        StatusCode::CREATED,
        "a comma inside quotes"
    );
    assert_eq!(echo.runs(), 1);
}
