//! The layer on body types other than `lambda_http`'s: axum's `Router`
//! (`layer`, `route_layer`, `MethodRouter::layer`, extractors and their
//! rejections), `http_body_util::Full`; keys from anywhere, the body
//! limit and the scope outside Lambda. On the memory store.

use super::*;
use crate::{Engine, MemoryStore};
use axum::{
    body::Body as AxumBody,
    extract::{Path, Request as AxumRequest},
    http::{header, HeaderName, Request, StatusCode},
    middleware::{self, Next},
    routing::post,
    Json, Router,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
};
use tower::{Service, ServiceExt};

fn layer() -> IdempotencyLayer<MemoryStore> {
    IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build()).shared_scope()
}

/// A charge handler with a path and a JSON body, counting its runs.
fn charges(runs: &Arc<AtomicUsize>) -> axum::routing::MethodRouter {
    let runs = Arc::clone(runs);
    post(
        move |Path(customer): Path<String>, Json(body): Json<Value>| {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                (
                    StatusCode::CREATED,
                    Json(
                        json!({ "id": format!("ch_{run}"), "customer": customer, "amount": body["amount"] }),
                    ),
                )
            }
        },
    )
}

fn charge(key: Option<&str>, body: &str) -> Request<AxumBody> {
    let mut request = Request::post("/v1/customers/cus_1/charges")
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request
        .body(AxumBody::from(body.to_owned()))
        .expect("request")
}

async fn send<S>(
    service: &S,
    request: Request<AxumBody>,
) -> (StatusCode, axum::http::HeaderMap, Value)
where
    S: Service<Request<AxumBody>, Response = axum::response::Response, Error = Infallible> + Clone,
{
    let response = service.clone().oneshot(request).await.expect("infallible");
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.expect("body").to_bytes();
    let json = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (parts.status, parts.headers, json)
}

#[tokio::test]
async fn router_layer_gives_the_lambda_semantics() {
    let runs = Arc::default();
    let app = Router::new()
        .route("/v1/customers/{customer}/charges", charges(&runs))
        .layer(layer());
    let body = r#"{"amount":1250}"#;

    let (status, headers, first) = send(&app, charge(Some("k-1"), body)).await;
    assert_eq!(status, 201);
    assert_eq!(
        first,
        json!({ "id": "ch_1", "customer": "cus_1", "amount": 1250 })
    );
    assert!(headers.get(REPLAYED_HEADER).is_none());

    // The same request, reformatted: replayed, not run.
    let (status, headers, replay) = send(&app, charge(Some("k-1"), r#"{ "amount": 1250 }"#)).await;
    assert_eq!((status.as_u16(), &replay), (201, &first));
    assert_eq!(headers[REPLAYED_HEADER], "true");
    assert_eq!(headers[header::CONTENT_TYPE], "application/json");

    let (status, headers, problem) = send(&app, charge(Some("k-1"), r#"{"amount":99}"#)).await;
    assert_eq!(status, 422);
    assert_eq!(headers[header::CONTENT_TYPE], "application/problem+json");
    assert_eq!(
        problem["type"],
        "urn:lambda-idempotency:problem:idempotency-key-reused"
    );

    let (status, _, problem) = send(&app, charge(None, body)).await;
    assert_eq!(status, 400);
    assert_eq!(
        problem["type"],
        "urn:lambda-idempotency:problem:idempotency-key-missing"
    );
    let (status, _, problem) = send(&app, charge(Some("two words"), body)).await;
    assert_eq!(status, 400);
    assert_eq!(
        problem["type"],
        "urn:lambda-idempotency:problem:idempotency-key-invalid"
    );

    // Another path of the same route: the scope holds the route template
    // (axum's `MatchedPath`) and the fingerprint the path, so the key is
    // reused with another request, as inside Lambda (never cus_1's charge).
    let other = Request::post("/v1/customers/cus_2/charges")
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", "k-1")
        .body(AxumBody::from(body))
        .expect("request");
    let (status, _, problem) = send(&app, other).await;
    assert_eq!(status, 422);
    assert_eq!(
        problem["type"],
        "urn:lambda-idempotency:problem:idempotency-key-reused"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn route_layer_and_method_router_layer_protect_one_route() {
    for how in ["route_layer", "method_router"] {
        let runs = Arc::default();
        let webhook_runs = Arc::new(AtomicUsize::new(0));
        let webhook = {
            let runs = Arc::clone(&webhook_runs);
            post(move || {
                runs.fetch_add(1, Ordering::SeqCst);
                async { StatusCode::NO_CONTENT }
            })
        };
        let app = match how {
            "route_layer" => Router::new()
                .route("/v1/customers/{customer}/charges", charges(&runs))
                .route_layer(layer())
                .route("/webhooks", webhook),
            _ => Router::new()
                .route(
                    "/v1/customers/{customer}/charges",
                    charges(&runs).layer(layer()),
                )
                .route("/webhooks", webhook),
        };
        let (status, _, first) = send(&app, charge(Some("k"), r#"{"amount":1}"#)).await;
        assert_eq!(status, 201, "{how}");
        let (_, headers, replay) = send(&app, charge(Some("k"), r#"{"amount":1}"#)).await;
        assert_eq!(
            (headers[REPLAYED_HEADER].to_str().ok(), replay),
            (Some("true"), first)
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{how}");
        // The other route needs no key.
        let hook = Request::post("/webhooks")
            .body(AxumBody::empty())
            .expect("request");
        assert_eq!(send(&app, hook).await.0, 204, "{how}");
        assert_eq!(webhook_runs.load(Ordering::SeqCst), 1);
    }
}

/// An extractor's rejection is the handler's answer to that request: the
/// layer treats it as any handler response, so by the default outcome
/// policy a 4xx is stored and replayed (as a handler's own 400 or 422
/// would be), and the key stays bound to that body.
#[tokio::test]
async fn json_rejections_are_handler_answers_stored_by_the_policy() {
    let runs = Arc::default();
    let app = Router::new()
        .route("/v1/customers/{customer}/charges", charges(&runs))
        .layer(layer());
    let (status, headers, first) = send(&app, charge(Some("bad"), r#"{"amount":"#)).await;
    assert_eq!(status, 400, "axum's syntax error rejection: {first}");
    assert!(headers.get(REPLAYED_HEADER).is_none());
    let (status, headers, replay) = send(&app, charge(Some("bad"), r#"{"amount":"#)).await;
    assert_eq!((status.as_u16(), &replay), (400, &first));
    assert_eq!(headers[REPLAYED_HEADER], "true");
    // The corrected body needs a new key.
    assert_eq!(
        send(&app, charge(Some("bad"), r#"{"amount":1}"#)).await.0,
        422
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no handler body ran");
    // Without a JSON content type: axum's 415, an answer about a header the
    // fingerprint leaves out, so not stored: the retry that sets
    // `Content-Type` runs (it used to get the 415 replayed, for ever).
    let plain = Request::post("/v1/customers/cus_1/charges")
        .header("idempotency-key", "plain")
        .body(AxumBody::from(r#"{"amount":1}"#))
        .expect("request");
    let (status, headers, _) = send(&app, plain).await;
    assert_eq!(status, 415);
    assert!(headers.get(REPLAYED_HEADER).is_none());
    let (status, headers, _) = send(&app, charge(Some("plain"), r#"{"amount":1}"#)).await;
    assert_eq!(status, 201, "the corrected retry runs");
    assert!(headers.get(REPLAYED_HEADER).is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    runs.store(0, Ordering::SeqCst);

    // A policy that releases rejections lets the corrected retry run.
    let app = Router::new()
        .route("/v1/customers/{customer}/charges", charges(&runs))
        .layer(layer().store_when(|status| status.is_success()));
    assert_eq!(
        send(&app, charge(Some("bad"), r#"{"amount":"#)).await.0,
        400
    );
    assert_eq!(
        send(&app, charge(Some("bad"), r#"{"amount":1}"#)).await.0,
        201
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_duplicate_in_progress_gets_409() {
    let started = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Notify::new());
    let app = {
        let (started, release) = (Arc::clone(&started), Arc::clone(&release));
        Router::new()
            .route(
                "/v1/customers/{customer}/charges",
                post(move || {
                    let (started, release) = (Arc::clone(&started), Arc::clone(&release));
                    async move {
                        started.notify_one();
                        release.notified().await;
                        StatusCode::CREATED
                    }
                }),
            )
            .layer(layer())
    };
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, charge(Some("k"), "{}")).await.0 }
    });
    started.notified().await;
    let (status, headers, problem) = send(&app, charge(Some("k"), "{}")).await;
    assert_eq!(status, 409);
    assert!(headers.contains_key(header::RETRY_AFTER));
    assert_eq!(
        problem["type"],
        "urn:lambda-idempotency:problem:idempotency-key-in-use"
    );
    release.notify_one();
    assert_eq!(first.await.expect("joins"), 201);
}

/// A webhook receiver whose request counter tells runs apart.
fn webhook(runs: &Arc<AtomicUsize>) -> Router {
    let runs = Arc::clone(runs);
    Router::new().route(
        "/hooks",
        post(move || {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move { (StatusCode::OK, format!("run {run}")) }
        }),
    )
}

fn hook(header: Option<(&str, &str)>, body: &str) -> Request<AxumBody> {
    let mut request = Request::post("/hooks");
    if let Some((name, value)) = header {
        request = request.header(name, value);
    }
    request
        .body(AxumBody::from(body.to_owned()))
        .expect("request")
}

#[tokio::test]
async fn keys_from_a_json_body_a_header_or_a_function() {
    // Stripe: the event id in the body. Delivered twice, run once, and the
    // body's content type does not matter.
    let runs = Arc::default();
    let app = webhook(&runs).layer(layer().key_source(KeySource::json_pointer("/id")));
    let event = r#"{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","type":"charge.succeeded"}"#;
    let (status, _, first) = send(
        &app,
        hook(Some(("content-type", "application/json")), event),
    )
    .await;
    assert_eq!((status.as_u16(), &first), (200, &json!("run 1")));
    let (_, headers, again) = send(&app, hook(None, event)).await;
    assert_eq!(
        (headers[REPLAYED_HEADER].to_str().ok(), &again),
        (Some("true"), &first)
    );
    let (status, _, problem) = send(&app, hook(None, r#"{"type":"ping"}"#)).await;
    assert_eq!(status, 400);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("`/id` in its JSON body"),
        "{problem}"
    );
    let (status, _, problem) = send(&app, hook(None, r#"{"id":{"nested":1}}"#)).await;
    assert_eq!(status, 400);
    assert_eq!(
        problem["type"],
        "urn:lambda-idempotency:problem:idempotency-key-invalid"
    );
    let long = format!(r#"{{"id":"{}"}}"#, "x".repeat(256));
    assert_eq!(send(&app, hook(None, &long)).await.0, 400);
    assert_eq!(send(&app, hook(None, "not json")).await.0, 400);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // GitHub: a delivery header, and a replay header of one's own.
    let runs = Arc::default();
    let app = webhook(&runs).layer(
        layer()
            .key_source(KeySource::header(HeaderName::from_static(
                "x-github-delivery",
            )))
            .replayed_header(HeaderName::from_static("x-replayed")),
    );
    let delivery = Some(("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"));
    send(&app, hook(delivery, "{}")).await;
    let (_, headers, _) = send(&app, hook(delivery, "{}")).await;
    assert_eq!(headers["x-replayed"], "true");
    assert!(headers.get(REPLAYED_HEADER).is_none());
    let (status, _, problem) = send(&app, hook(None, "{}")).await;
    assert_eq!(status, 400);
    assert!(problem["detail"]
        .as_str()
        .unwrap_or_default()
        .contains("`x-github-delivery` header"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Shopify, through a function; optional keys pass through.
    let runs = Arc::default();
    let app = webhook(&runs).layer(
        layer()
            .key_source(KeySource::from_fn(
                "an `X-Shopify-Webhook-Id` header",
                |request| {
                    let value = request.headers().get("x-shopify-webhook-id")?;
                    value.to_str().ok().map(str::to_owned)
                },
            ))
            .require_key(false),
    );
    let shopify = Some((
        "x-shopify-webhook-id",
        "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
    ));
    send(&app, hook(shopify, "{}")).await;
    assert_eq!(
        send(&app, hook(shopify, "{}")).await.1[REPLAYED_HEADER],
        "true"
    );
    send(&app, hook(None, "{}")).await;
    send(&app, hook(None, "{}")).await;
    assert_eq!(runs.load(Ordering::SeqCst), 3, "without a key, each runs");
    let (status, _, problem) = send(
        &app,
        hook(Some(("x-shopify-webhook-id", "tab\there")), "{}"),
    )
    .await;
    assert_eq!(status, 400);
    assert!(problem["detail"]
        .as_str()
        .unwrap_or_default()
        .contains("X-Shopify-Webhook-Id"));
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_and_nothing_runs() {
    let runs = Arc::default();
    let app = webhook(&runs).layer(layer().body_limit(16));
    let (status, headers, problem) =
        send(&app, hook(Some(("idempotency-key", "k")), &"a".repeat(17))).await;
    assert_eq!(status, 413);
    assert_eq!(headers[header::CONTENT_TYPE], "application/problem+json");
    assert_eq!(
        problem["type"],
        "urn:lambda-idempotency:problem:idempotency-body-too-large"
    );
    // Streamed, with no declared length.
    let chunks = (0..5).map(|_| Ok::<_, Infallible>(Bytes::from_static(b"abcd")));
    let streamed = Request::post("/hooks")
        .header("idempotency-key", "k")
        .body(AxumBody::from_stream(futures::stream::iter(chunks)))
        .expect("request");
    assert_eq!(send(&app, streamed).await.0, 413);
    // At the limit, it runs; a request the layer passes through is not read.
    assert_eq!(
        send(&app, hook(Some(("idempotency-key", "k")), &"a".repeat(16)))
            .await
            .0,
        200
    );
    let app = webhook(&runs).layer(layer().body_limit(16).require_key(false));
    assert_eq!(send(&app, hook(None, &"a".repeat(100))).await.0, 200);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[derive(Clone)]
struct Principal(String);

/// An authentication middleware, as an app would have one: it puts the
/// verified caller in the request's extensions.
async fn authenticate(mut request: AxumRequest, next: Next) -> axum::response::Response {
    // A real one verifies a JWT; here the test names the caller.
    if let Some(user) = request
        .headers()
        .get("x-test-user")
        .and_then(|v| v.to_str().ok())
    {
        let principal = Principal(user.to_owned());
        request.extensions_mut().insert(principal);
    }
    next.run(request).await
}

#[tokio::test]
async fn the_scope_comes_from_request_extensions_outside_lambda() {
    let runs = Arc::default();
    let app = webhook(&runs)
        .layer(layer().scope(|request: &Request<Bytes>| {
            match request.extensions().get::<Principal>() {
                Some(Principal(user)) => format!("user:{user}"),
                None => "anonymous".to_owned(),
            }
        }))
        // Outside the idempotency layer, so it runs first.
        .layer(middleware::from_fn(authenticate));
    let request = |user: &str| {
        Request::post("/hooks")
            .header("idempotency-key", "same-key")
            .header("x-test-user", user)
            .body(AxumBody::from("{}"))
            .expect("request")
    };
    let (_, _, alice) = send(&app, request("alice")).await;
    let (_, headers, bob) = send(&app, request("bob")).await;
    assert!(
        headers.get(REPLAYED_HEADER).is_none(),
        "bob is not served alice's"
    );
    assert_ne!(alice, bob);
    assert_eq!(
        send(&app, request("alice")).await.1[REPLAYED_HEADER],
        "true"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn outside_lambda_without_a_caller_nothing_runs_and_the_fix_is_named() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let runs = Arc::default();
    let unset = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build());
    let app = webhook(&runs).layer(unset);
    let (status, headers, problem) = send(&app, hook(Some(("idempotency-key", "a")), "{}")).await;
    assert_eq!(status, 500);
    assert_eq!(headers[header::CONTENT_TYPE], "application/problem+json");
    assert_eq!(
        problem["type"],
        "urn:lambda-idempotency:problem:idempotency-scope-unset"
    );
    assert!(problem["detail"]
        .as_str()
        .unwrap_or_default()
        .contains("IdempotencyLayer::caller"));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "nothing runs without a scope"
    );
    let logs = String::from_utf8_lossy(&captured.0.lock().expect("log")).into_owned();
    assert!(logs.contains("ERROR"), "{logs}");
    assert!(logs.contains("IdempotencyLayer::shared_scope"), "{logs}");

    // Each explicit choice serves.
    let named = layer().caller(|_: &Request<Bytes>| Some("alice".to_owned()));
    let app = webhook(&runs).layer(named);
    assert_eq!(
        send(&app, hook(Some(("idempotency-key", "b")), "{}"))
            .await
            .0,
        200
    );
    let app = webhook(&runs).layer(layer().shared_scope());
    assert_eq!(
        send(&app, hook(Some(("idempotency-key", "c")), "{}"))
            .await
            .0,
        200
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Two callers named by `caller` never share a record; a caller named the
/// way a Lambda authorizer's principal is spelled is still another caller.
#[tokio::test]
async fn callers_named_by_the_layer_have_records_of_their_own() {
    let runs = Arc::default();
    let named = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build()).caller(
        |request: &Request<Bytes>| {
            request
                .headers()
                .get("x-test-caller")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        },
    );
    let app = webhook(&runs).layer(named);
    let as_caller = |caller: Option<&str>| {
        let mut request = Request::post("/hooks").header("idempotency-key", "same");
        if let Some(caller) = caller {
            request = request.header("x-test-caller", caller);
        }
        request.body(AxumBody::from("{}")).expect("request")
    };
    for caller in [Some("alice"), Some("bob"), Some(r#"["jwt","",""]"#)] {
        let (status, headers, _) = send(&app, as_caller(caller)).await;
        assert_eq!(status, 200);
        assert!(
            !headers.contains_key(REPLAYED_HEADER),
            "{caller:?} got another's record"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    // A request the function names no caller for is refused, never
    // answered as an anonymous caller that every such request would share.
    for _ in 0..2 {
        let (status, headers, body) = send(&app, as_caller(None)).await;
        assert_eq!(status, 500);
        assert!(!headers.contains_key(REPLAYED_HEADER));
        assert_eq!(
            body["type"], "urn:lambda-idempotency:problem:idempotency-scope-unset",
            "{body}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3, "nothing ran for them");
    assert_eq!(
        send(&app, as_caller(Some("bob"))).await.1[REPLAYED_HEADER],
        "true"
    );
}

/// Issue 22, item 6, through the layer.
#[tokio::test]
async fn a_retry_that_adds_a_content_type_is_replayed() {
    let runs = Arc::default();
    let app = webhook(&runs).layer(layer());
    let key = ("idempotency-key", "k");
    send(&app, hook(Some(key), r#"{"amount":1}"#)).await;
    let retry = Request::post("/hooks")
        .header(key.0, key.1)
        .header(header::CONTENT_TYPE, "application/json")
        .body(AxumBody::from(r#"{"amount":1}"#))
        .expect("request");
    assert_eq!(send(&app, retry).await.1[REPLAYED_HEADER], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A response body that fails while the layer reads it to store it: a 500
/// problem, and the claim released so a retry runs again.
#[tokio::test]
async fn a_failing_response_body_releases_the_claim() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = {
        let runs = Arc::clone(&runs);
        Router::new()
            .route(
                "/hooks",
                post(move || {
                    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    async move {
                        let chunks: Vec<Result<Bytes, std::io::Error>> = if run == 1 {
                            vec![
                                Ok(Bytes::from_static(b"par")),
                                Err(std::io::Error::other("reset")),
                            ]
                        } else {
                            vec![Ok(Bytes::from_static(b"whole"))]
                        };
                        AxumBody::from_stream(futures::stream::iter(chunks))
                    }
                }),
            )
            .layer(layer())
    };
    let (status, _, problem) = send(&app, hook(Some(("idempotency-key", "k")), "{}")).await;
    assert_eq!(status, 500);
    assert_eq!(
        problem["type"],
        "urn:lambda-idempotency:problem:idempotency-response-unreadable"
    );
    let (status, headers, body) = send(&app, hook(Some(("idempotency-key", "k")), "{}")).await;
    assert_eq!((status.as_u16(), body), (200, json!("whole")));
    assert!(headers.get(REPLAYED_HEADER).is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Not axum: `http_body_util::Full` in and out, as a hyper service might
/// have them.
#[tokio::test]
async fn full_bodies_work_too() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = {
        let runs = Arc::clone(&runs);
        tower::service_fn(move |request: Request<Full<Bytes>>| {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                let body = request.into_body().collect().await?.to_bytes();
                let text = format!("run {run}: {}", String::from_utf8_lossy(&body));
                Ok::<_, Infallible>(axum::http::Response::new(Full::new(Bytes::from(text))))
            }
        })
    };
    let service = tower::ServiceBuilder::new().layer(layer()).service(service);
    let request = || {
        Request::post("/x")
            .header("idempotency-key", "k")
            .body(Full::new(Bytes::from_static(b"payload")))
            .expect("request")
    };
    for _ in 0..2 {
        let response = service
            .clone()
            .oneshot(request())
            .await
            .expect("infallible");
        let body = response
            .into_body()
            .collect()
            .await
            .expect("full")
            .to_bytes();
        assert_eq!(body, "run 1: payload");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A request whose handler never ends (its invocation died) leaves an
/// abandoned claim; the completer's `fail` completes it with the layer's
/// answer, and the client's retry gets that answer, replayed, without the
/// handler running again.
#[tokio::test]
async fn a_retry_after_the_completer_failed_its_claim_gets_the_abandoned_answer() {
    use crate::{testing::ManualClock, AbandonedPolicy, Completer};
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(MemoryStore::new())
        .clock(clock.clone())
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let app = Router::new()
        .route(
            "/v1/customers/{customer}/charges",
            post(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<StatusCode>()
            }),
        )
        .layer(IdempotencyLayer::new(engine.clone()).shared_scope());
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, charge(Some("k-abandoned"), r#"{"amount":1}"#)).await }
    });
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    clock.advance(std::time::Duration::from_secs(3_600));
    let answer = abandoned_answer(DEFAULT_PROBLEM_BASE).expect("encodes");
    let report = engine
        .complete_abandoned(&Completer::new(AbandonedPolicy::Fail { answer }))
        .await
        .expect("a run");
    assert_eq!(report.count("failed"), 1, "{report:?}");

    let (status, headers, body) = send(&app, charge(Some("k-abandoned"), r#"{"amount":1}"#)).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(headers[header::CONTENT_TYPE], "application/problem+json");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(
        body["type"],
        "urn:lambda-idempotency:problem:idempotency-abandoned"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler did not run again"
    );
    first.abort();
}
