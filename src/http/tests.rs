//! The layer's behaviours, one by one, on the memory store, with a counting
//! echo service underneath.

use super::*;
use crate::{store::Status, testing::ManualClock, Engine, MemoryStore};
use lambda_http::{
    http::{self, header, HeaderName, HeaderValue, Method, StatusCode},
    service_fn, Body, Request, RequestExt, Response,
};
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};
use tower::{Layer, Service, ServiceExt};

type BoxError = lambda_http::Error;

/// Echoes the request body with a run counter, answering `status` (or the
/// status named in an `x-status` request header).
#[derive(Clone)]
struct Echo {
    runs: Arc<AtomicUsize>,
    delay: Duration,
}

impl Echo {
    fn new() -> Self {
        Self {
            runs: Arc::default(),
            delay: Duration::ZERO,
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

impl Service<Request> for Echo {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<Body>, BoxError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let runs = Arc::clone(&self.runs);
        let delay = self.delay;
        Box::pin(async move {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(delay).await;
            if request.headers().contains_key("x-fail") {
                return Err("handler failed".into());
            }
            if request.headers().contains_key("x-panic") {
                panic!("the handler panicked");
            }
            let status = request
                .headers()
                .get("x-status")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(201);
            let (body, content_type) = match request.into_body() {
                Body::Binary(bytes) => (Body::Binary(bytes), "application/octet-stream"),
                Body::Text(text) => (Body::Text(format!("run {run}: {text}")), "application/json"),
                _ => (Body::Text(format!("run {run}")), "application/json"),
            };
            Ok(Response::builder()
                .status(status)
                .header(header::CONTENT_TYPE, content_type)
                .header(header::LOCATION, format!("/v1/charges/ch_{run}"))
                .header(header::SET_COOKIE, "session=secret")
                .body(body)?)
        })
    }
}

fn engine() -> Engine<MemoryStore> {
    Engine::builder(MemoryStore::new()).build()
}

fn post(key: Option<&str>, body: &str) -> Request {
    let mut builder =
        http::Request::post("/v1/charges").header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder.body(Body::from(body)).expect("request")
}

async fn send<S>(service: &mut S, request: Request) -> Response<Body>
where
    S: Service<Request, Response = Response<Body>, Error = BoxError>,
{
    service
        .ready()
        .await
        .expect("ready")
        .call(request)
        .await
        .expect("response")
}

fn text(response: &Response<Body>) -> &str {
    match response.body() {
        Body::Text(text) => text,
        other => panic!("expected a text body, got {other:?}"),
    }
}

fn problem(response: &Response<Body>) -> serde_json::Value {
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    serde_json::from_str(text(response)).expect("problem json")
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_in_flight_gets_409_with_retry_after() {
    let echo = Echo {
        delay: Duration::from_millis(300),
        ..Echo::new()
    };
    let service = IdempotencyLayer::new(engine())
        .shared_scope()
        .layer(echo.clone());
    let first = tokio::spawn(service.clone().oneshot(post(Some("k"), "{}")));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let duplicate = service
        .clone()
        .oneshot(post(Some("k"), "{}"))
        .await
        .unwrap();
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    let retry_after: u64 = duplicate.headers()[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    assert_eq!(
        problem(&duplicate)["type"],
        "urn:lambda-idempotency:problem:idempotency-key-in-use"
    );
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
    assert_eq!(echo.runs(), 1);
}

/// Sends a request and, while its handler (300 ms) runs, a duplicate that
/// waits up to `budget`: the duplicate must get the first one's replay.
async fn a_waiting_duplicate_gets_the_replay(engine: Engine<MemoryStore>, budget: Duration) {
    let echo = Echo {
        delay: Duration::from_millis(300),
        ..Echo::new()
    };
    let service = IdempotencyLayer::new(engine)
        .shared_scope()
        .wait_for_result(budget)
        .layer(echo.clone());
    let first = tokio::spawn(service.clone().oneshot(post(Some("k"), "{}")));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let duplicate = service
        .clone()
        .oneshot(post(Some("k"), "{}"))
        .await
        .unwrap();
    assert_eq!(duplicate.status(), StatusCode::CREATED);
    assert_eq!(duplicate.headers()[REPLAYED_HEADER], "true");
    let first = first.await.unwrap().unwrap();
    assert_eq!(text(&duplicate), text(&first));
    assert_eq!(echo.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_the_result_replays_it() {
    a_waiting_duplicate_gets_the_replay(engine(), Duration::from_secs(5)).await;

    // A budget shorter than the handler: 409 after waiting.
    let short = IdempotencyLayer::new(engine())
        .shared_scope()
        .wait_for_result(Duration::from_millis(100))
        .layer(Echo {
            delay: Duration::from_millis(500),
            ..Echo::new()
        });
    let first = tokio::spawn(short.clone().oneshot(post(Some("k"), "{}")));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    let duplicate = short.clone().oneshot(post(Some("k"), "{}")).await.unwrap();
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    assert!(started.elapsed() >= Duration::from_millis(100));
    first.await.unwrap().unwrap();
}

#[tokio::test]
async fn waiting_never_passes_the_invocation_deadline() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).build();
    let service = IdempotencyLayer::new(engine.clone())
        .shared_scope()
        .wait_for_result(Duration::from_secs(30))
        .layer(Echo::new());
    // Someone else holds the key.
    let mut held = post(Some("k"), "{}");
    let claim_holder = IdempotencyLayer::new(engine)
        .shared_scope()
        .layer(service_fn(|_: Request| async {
            std::future::pending::<()>().await;
            Ok::<_, BoxError>(Response::new(Body::Empty))
        }));
    let holder =
        tokio::spawn(claim_holder.oneshot(std::mem::replace(&mut held, post(Some("k"), "{}"))));
    tokio::time::sleep(Duration::from_millis(20)).await;

    let mut context = lambda_http::Context::default();
    context.deadline = crate::clock::epoch_ms(std::time::SystemTime::now()) + 800;
    let started = std::time::Instant::now();
    let response = service
        .oneshot(held.with_lambda_context(context))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    holder.abort();
}

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
async fn the_lease_runs_until_the_invocation_deadline() {
    let store = MemoryStore::new();
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store.clone()).clock(clock.clone()).build();
    let deadline = crate::Clock::now_ms(&clock) + 12_345;
    let holder = {
        let store = store.clone();
        service_fn(move |_: Request| {
            let store = store.clone();
            async move {
                let record = store.records().pop().expect("claimed");
                assert_eq!(record.status, Status::InProgress);
                Ok::<_, BoxError>(Response::new(Body::from(
                    record.lease_until_ms.unwrap_or_default().to_string(),
                )))
            }
        })
    };
    let mut context = lambda_http::Context::default();
    context.deadline = deadline;
    let response = IdempotencyLayer::new(engine)
        .shared_scope()
        .layer(holder)
        .oneshot(post(Some("k"), "{}").with_lambda_context(context))
        .await
        .unwrap();
    assert_eq!(text(&response), deadline.to_string());
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

/// A handler that writes `charge#<run>` with its response through
/// `CommitWith`, answering `status`.
fn committing(
    runs: Arc<AtomicUsize>,
    status: u16,
) -> impl Service<Request, Response = Response<Body>, Error = BoxError, Future = impl Send> + Clone
{
    service_fn(move |_: Request| {
        let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let mut response = Response::builder()
                .status(status)
                .body(Body::from(format!("ch_{run}")))?;
            response.extensions_mut().insert(CommitWith(vec![
                crate::store::memory::MemoryWrite::put(format!("charge#{run}"), "1"),
            ]));
            Ok::<_, BoxError>(response)
        }
    })
}

#[tokio::test]
async fn commit_with_writes_only_with_a_stored_response() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut service = IdempotencyLayer::new(Engine::builder(store.clone()).build())
        .shared_scope()
        .layer(committing(Arc::clone(&runs), 201));
    send(&mut service, post(Some("k"), "{}")).await;
    assert_eq!(store.item("charge#1").as_deref(), Some(&b"1"[..]));
    let replay = send(&mut service, post(Some("k"), "{}")).await;
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert_eq!(store.item("charge#2"), None);

    let runs = Arc::new(AtomicUsize::new(0));
    let mut failing = IdempotencyLayer::new(Engine::builder(store.clone()).build())
        .shared_scope()
        .layer(committing(Arc::clone(&runs), 503));
    let response = send(&mut failing, post(Some("other"), "{}")).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(store.records().len(), 1, "released");
    assert!(store.item("charge#1").is_some() && store.item("charge#2").is_none());
}

#[tokio::test]
async fn a_request_fenced_out_of_its_transaction_commits_nothing_and_says_so() {
    let store = MemoryStore::new();
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store.clone()).clock(clock.clone()).build();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let gate = Arc::new(Mutex::new(Some((started_tx, finish_rx))));
    let slow = service_fn(move |_: Request| {
        let gate = gate.lock().unwrap().take();
        async move {
            if let Some((started, finish)) = gate {
                let _ = started.send(());
                let _ = finish.await;
            }
            let mut response = Response::builder().status(201).body(Body::from("zombie"))?;
            response.extensions_mut().insert(CommitWith(vec![
                crate::store::memory::MemoryWrite::put("charge#zombie", "1"),
            ]));
            Ok::<_, BoxError>(response)
        }
    });
    let zombie = tokio::spawn(
        IdempotencyLayer::new(engine.clone())
            .shared_scope()
            .layer(slow)
            .oneshot(post(Some("k"), "{}")),
    );
    started_rx.await.unwrap();
    clock.advance(Duration::from_secs(61));
    let runs = Arc::new(AtomicUsize::new(0));
    let successor = IdempotencyLayer::new(engine.clone())
        .shared_scope()
        .layer(committing(runs, 201))
        .oneshot(post(Some("k"), "{}"))
        .await
        .unwrap();
    assert_eq!(successor.status(), StatusCode::CREATED);
    finish_tx.send(()).unwrap();
    let zombie = zombie.await.unwrap().unwrap();
    assert_eq!(zombie.status(), StatusCode::CONFLICT);
    assert_eq!(
        problem(&zombie)["type"],
        "urn:lambda-idempotency:problem:idempotency-lease-lost"
    );
    assert_eq!(zombie.headers()[header::RETRY_AFTER], "1");
    assert_eq!(
        store.item("charge#zombie"),
        None,
        "the zombie's write was not committed"
    );
    assert!(store.item("charge#1").is_some());
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

/// Issue 10, item 13: `wait_for_result(Duration::MAX)` overflowed the clock
/// and panicked on every keyed request. The engine's own durations go up to
/// `MAX_DURATION` (issue 21, item 2: beyond it, `try_build` refuses them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_at_their_maximum_never_panic() {
    let engine = Engine::builder(MemoryStore::new())
        .retention(crate::MAX_DURATION)
        .max_lease(crate::MAX_DURATION)
        .default_lease(crate::MAX_DURATION)
        .build();
    a_waiting_duplicate_gets_the_replay(engine, Duration::MAX).await;
}

/// Issue 10, item 11: with fail-open, a handler whose writes need the store
/// never runs without it when declared transactional; undeclared, it has
/// run, and the answer says that its writes were not saved (never "not
/// processed").
#[tokio::test]
async fn fail_open_never_runs_a_declared_transactional_handler() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).fail_open(true).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut declared = IdempotencyLayer::new(engine.clone())
        .shared_scope()
        .mode(crate::Mode::Transactional)
        .layer(committing(Arc::clone(&runs), 201));
    // The claim, and the read that confirms the outage.
    store.fail_next(2);
    let response = send(&mut declared, post(Some("k"), "{}")).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        problem(&response)["type"],
        "urn:lambda-idempotency:problem:idempotency-store-unavailable"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "never ran without the store"
    );

    let mut undeclared = IdempotencyLayer::new(engine)
        .shared_scope()
        .layer(committing(Arc::clone(&runs), 201));
    // The claim, and the read that confirms the outage.
    store.fail_next(2);
    let response = send(&mut undeclared, post(Some("k2"), "{}")).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "it ran");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key(header::RETRY_AFTER));
    let body = problem(&response);
    assert_eq!(
        body["type"],
        "urn:lambda-idempotency:problem:idempotency-writes-not-committed"
    );
    let detail = body["detail"].as_str().unwrap();
    assert!(!detail.contains("not processed"), "{detail}");
    assert!(
        detail.contains("none of its changes were saved"),
        "{detail}"
    );
    assert_eq!(store.item("charge#1"), None, "nothing committed");

    // A plain handler still runs unprotected during the outage.
    let echo = Echo::new();
    let mut plain = IdempotencyLayer::new(Engine::builder(store.clone()).fail_open(true).build())
        .shared_scope()
        .layer(echo.clone());
    // The claim, and the read that confirms the outage.
    store.fail_next(2);
    assert_eq!(
        send(&mut plain, post(Some("k3"), "{}")).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(echo.runs(), 1);
}

#[tokio::test]
async fn a_request_that_takes_over_a_crashed_one_finds_the_takeover_in_its_extensions() {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(MemoryStore::new())
        .clock(clock.clone())
        .default_lease(Duration::from_secs(5))
        .build();
    let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel();
    let handler = service_fn(move |request: Request| {
        let started = started_tx.clone();
        async move {
            let takeover = request.extensions().get::<crate::Takeover>().copied();
            let claim = request.extensions().get::<crate::ClaimHandle>().cloned();
            let _ = started.send(claim.is_some());
            match takeover {
                // The first attempt hangs until its invocation dies.
                None => std::future::pending().await,
                Some(takeover) => Ok::<_, BoxError>(Response::new(Body::from(format!(
                    "attempt {}",
                    takeover.attempt
                )))),
            }
        }
    });
    let service = IdempotencyLayer::new(engine).shared_scope().layer(handler);
    let crashed = tokio::spawn(service.clone().oneshot(post(Some("k"), "{}")));
    assert_eq!(
        started_rx.recv().await,
        Some(true),
        "the claim is in the extensions"
    );
    crashed.abort();
    let _ = crashed.await;
    clock.advance(Duration::from_secs(6));
    let response = service.oneshot(post(Some("k"), "{}")).await.unwrap();
    assert_eq!(text(&response), "attempt 2");
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
