//! The HTTP layer outside Lambda, as a server on ECS or EC2 runs it: a real
//! `axum::serve` on a loopback port, real HTTP clients (hyper's, and a raw
//! TCP one that hangs up mid-request), DynamoDB Local behind the store.
//!
//! What breaks there and not under `lambda_http`: hyper drops the service
//! future when the client disconnects (and tower-http's `TimeoutLayer` at
//! its deadline), there is no authorizer to name the caller, axum's
//! `Router::nest` strips the path, and responses stream.
//!
//! Needs `AWS_ENDPOINT_URL_DYNAMODB`; `make test` provides it.

mod support;

use axum::{
    body::Body,
    extract::{Path, Request as AxumRequest},
    http::{header, HeaderMap, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use lambda_idempotency::{
    http::{IdempotencyLayer, KeySource, REPLAYED_HEADER},
    DynamoDbStore, Engine,
};
use serde_json::{json, Value};
use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};
use tokio::{io::AsyncWriteExt, net::TcpStream};
use tower_http::{catch_panic::CatchPanicLayer, timeout::TimeoutLayer};

/// The lease of a claim without a deadline: short, so that a test that
/// would see a takeover before the fix sees it within seconds.
const LEASE: Duration = Duration::from_secs(3);

async fn engine() -> Engine<DynamoDbStore> {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    Engine::builder(DynamoDbStore::new(client, table))
        .default_lease(LEASE)
        .build()
}

/// `app` served by `axum::serve` on a free loopback port, until the test's
/// runtime ends.
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

struct Answer {
    status: u16,
    headers: HeaderMap,
    json: Value,
}

impl Answer {
    fn replayed(&self) -> bool {
        self.headers.get(REPLAYED_HEADER).is_some()
    }
}

/// One request on a connection of its own, through hyper's client.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let response = request(addr, method, path, headers, body).await;
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.expect("the whole body").to_bytes();
    let json = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        json,
    }
}

/// The response head, its body still streaming.
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> hyper::Response<hyper::body::Incoming> {
    let stream = TcpStream::connect(addr).await.expect("connects");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, addr.to_string())
        .header(header::CONTENT_TYPE, "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request");
    sender.send_request(request).await.expect("a response")
}

/// A client that sends the whole request, waits `patience`, then hangs up
/// without reading an answer.
async fn send_and_hang_up(addr: SocketAddr, key: &str, body: &str, patience: Duration) {
    let mut stream = TcpStream::connect(addr).await.expect("connects");
    let head = format!(
        "POST /v1/charges HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         idempotency-key: {key}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("writes");
    tokio::time::sleep(patience).await;
    drop(stream);
}

/// Retries `POST /v1/charges` every 100 ms until it is answered with
/// something else than 409, for at most `budget`: the answer, and how many
/// 409s came first.
async fn retry_until_answered(
    addr: SocketAddr,
    key: &str,
    body: &str,
    budget: Duration,
) -> (Answer, usize) {
    let started = Instant::now();
    let mut in_progress = 0;
    loop {
        let answer = send(
            addr,
            "POST",
            "/v1/charges",
            &[("idempotency-key", key)],
            body,
        )
        .await;
        if answer.status != 409 || started.elapsed() > budget {
            return (answer, in_progress);
        }
        in_progress += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `POST /v1/charges`, counting charges, which take `work`: a charge at the
/// start of the handler (`charge_first`) or at its end.
fn charges_app(charges: &Arc<AtomicUsize>, charge_first: bool, work: Duration) -> Router {
    let charges = Arc::clone(charges);
    Router::new().route(
        "/v1/charges",
        post(move |Json(body): Json<Value>| {
            let charges = Arc::clone(&charges);
            async move {
                let charge = |charges: &AtomicUsize| charges.fetch_add(1, Ordering::SeqCst) + 1;
                let first = charge_first.then(|| charge(&charges));
                tokio::time::sleep(work).await;
                let number = first.unwrap_or_else(|| charge(&charges));
                (
                    StatusCode::CREATED,
                    Json(json!({ "charge": number, "amount": body["amount"] })),
                )
            }
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_mid_handler_is_charged_once_and_its_retry_replays() {
    for charge_first in [true, false] {
        let charges = Arc::new(AtomicUsize::new(0));
        let layer = IdempotencyLayer::new(engine().await).shared_scope();
        let in_flight = layer.in_flight();
        let app = charges_app(&charges, charge_first, Duration::from_secs(1)).layer(layer);
        let addr = serve(app).await;
        let body = r#"{"amount":1250}"#;

        send_and_hang_up(addr, "order-1", body, Duration::from_millis(150)).await;
        // The handler goes on without its client: its work is in flight,
        // and done (charged) without any retry.
        assert_eq!(in_flight.len(), 1, "charge first: {charge_first}");
        assert!(in_flight.wait(Duration::from_secs(5)).await);
        assert_eq!(
            charges.load(Ordering::SeqCst),
            1,
            "charge first: {charge_first}"
        );

        // The retries are answered from the record, past the lease too.
        let (answer, _) = retry_until_answered(addr, "order-1", body, LEASE * 2).await;
        assert_eq!(answer.status, 201);
        assert!(answer.replayed());
        assert_eq!(answer.json, json!({ "charge": 1, "amount": 1250 }));
        tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
        let later = send(
            addr,
            "POST",
            "/v1/charges",
            &[("idempotency-key", "order-1")],
            body,
        )
        .await;
        assert!(later.replayed());
        assert_eq!(
            charges.load(Ordering::SeqCst),
            1,
            "charge first: {charge_first}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_of_a_request_in_flight_get_409_then_the_replay() {
    let charges = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(engine().await).shared_scope();
    let app = charges_app(&charges, true, Duration::from_secs(1)).layer(layer);
    let addr = serve(app).await;
    let body = r#"{"amount":7}"#;
    send_and_hang_up(addr, "order-2", body, Duration::from_millis(150)).await;
    let (answer, in_progress) = retry_until_answered(addr, "order-2", body, LEASE * 2).await;
    assert!(in_progress > 0, "a retry while it runs gets 409");
    assert_eq!((answer.status, answer.replayed()), (201, true));
    assert_eq!(charges.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_layer_outside_answers_408_and_the_work_still_completes_once() {
    let charges = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(engine().await).shared_scope();
    let app = charges_app(&charges, true, Duration::from_secs(1))
        .layer(layer)
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            Duration::from_millis(500),
        ));
    let addr = serve(app).await;
    let body = r#"{"amount":3}"#;
    let first = send(
        addr,
        "POST",
        "/v1/charges",
        &[("idempotency-key", "order-3")],
        body,
    )
    .await;
    assert_eq!(first.status, 408);
    // Past one lease: before, the takeover timed out again and charged twice.
    let (answer, _) = retry_until_answered(addr, "order-3", body, LEASE * 2).await;
    assert_eq!((answer.status, answer.replayed()), (201, true));
    tokio::time::sleep(LEASE).await;
    assert!(send(
        addr,
        "POST",
        "/v1/charges",
        &[("idempotency-key", "order-3")],
        body
    )
    .await
    .replayed());
    assert_eq!(charges.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_reaches_catch_panic_layer_and_releases_the_key() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let app = Router::new()
        .route(
            "/v1/charges",
            post(move || {
                let run = counter.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    if run == 1 {
                        panic!("the payment provider's client panicked");
                    }
                    (StatusCode::CREATED, Json(json!({ "run": run })))
                }
            }),
        )
        .layer(IdempotencyLayer::new(engine().await).shared_scope())
        .layer(CatchPanicLayer::new());
    let addr = serve(app).await;
    let key = [("idempotency-key", "order-4")];
    let first = send(addr, "POST", "/v1/charges", &key, "{}").await;
    assert_eq!(
        first.status, 500,
        "CatchPanicLayer answers: {:?}",
        first.json
    );
    let retry = send(addr, "POST", "/v1/charges", &key, "{}").await;
    assert_eq!((retry.status, retry.replayed()), (201, false));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// What an authentication middleware puts in the request's extensions.
#[derive(Clone)]
struct Caller(String);

async fn authenticate(mut request: AxumRequest, next: Next) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::to_owned);
    match token {
        Some(caller) => {
            request.extensions_mut().insert(Caller(caller));
            next.run(request).await
        }
        None => StatusCode::UNAUTHORIZED.into_response(),
    }
}

fn owner_routes(runs: &Arc<AtomicUsize>) -> Router {
    let runs = Arc::clone(runs);
    Router::new().route(
        "/v1/charges",
        post(move |request: AxumRequest| {
            runs.fetch_add(1, Ordering::SeqCst);
            let owner = request
                .extensions()
                .get::<Caller>()
                .map(|caller| caller.0.clone());
            async move { (StatusCode::CREATED, Json(json!({ "owner": owner }))) }
        }),
    )
}

fn owner_app(runs: &Arc<AtomicUsize>, layer: IdempotencyLayer<DynamoDbStore>) -> Router {
    owner_routes(runs)
        .layer(layer)
        .layer(middleware::from_fn(authenticate))
}

fn caller_layer(engine: Engine<DynamoDbStore>) -> IdempotencyLayer<DynamoDbStore> {
    IdempotencyLayer::new(engine).caller(|request| {
        request
            .extensions()
            .get::<Caller>()
            .map(|caller| caller.0.clone())
    })
}

#[tokio::test]
async fn two_callers_never_share_a_record_outside_lambda() {
    let body = r#"{"amount":10}"#;
    let as_caller = |who: &'static str| [("idempotency-key", "same-key"), ("authorization", who)];

    // Nothing names the caller: refused, nothing runs, the fix is named.
    let runs = Arc::new(AtomicUsize::new(0));
    let addr = serve(owner_app(&runs, IdempotencyLayer::new(engine().await))).await;
    for who in ["Bearer alice", "Bearer bob"] {
        let answer = send(addr, "POST", "/v1/charges", &as_caller(who), body).await;
        assert_eq!(answer.status, 500);
        assert_eq!(
            answer.json["type"],
            "urn:lambda-idempotency:problem:idempotency-scope-unset"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // Named from the middleware's extension: each gets its own charge.
    let runs = Arc::new(AtomicUsize::new(0));
    let addr = serve(owner_app(&runs, caller_layer(engine().await))).await;
    let alice = send(
        addr,
        "POST",
        "/v1/charges",
        &as_caller("Bearer alice"),
        body,
    )
    .await;
    let bob = send(addr, "POST", "/v1/charges", &as_caller("Bearer bob"), body).await;
    assert_eq!(
        (alice.status, alice.json["owner"].as_str()),
        (201, Some("alice"))
    );
    assert_eq!((bob.status, bob.json["owner"].as_str()), (201, Some("bob")));
    assert!(!bob.replayed());
    let bob_again = send(addr, "POST", "/v1/charges", &as_caller("Bearer bob"), body).await;
    assert_eq!(
        (bob_again.replayed(), bob_again.json["owner"].as_str()),
        (true, Some("bob"))
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // The layers in the wrong order: the idempotency layer outside the
    // authentication, so the caller function runs first and finds no
    // caller. Refused, and nothing runs: never one anonymous caller whose
    // record Bob would share with Alice.
    let runs = Arc::new(AtomicUsize::new(0));
    let misordered = owner_routes(&runs)
        .layer(middleware::from_fn(authenticate))
        .layer(caller_layer(engine().await));
    let addr = serve(misordered).await;
    for who in ["Bearer alice", "Bearer bob"] {
        let answer = send(addr, "POST", "/v1/charges", &as_caller(who), body).await;
        assert_eq!(answer.status, 500, "{who}: {:?}", answer.json);
        assert_eq!(
            answer.json["type"],
            "urn:lambda-idempotency:problem:idempotency-scope-unset"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn nested_routers_never_share_a_record() {
    let engine = engine().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let items = |name: &'static str| {
        let runs = Arc::clone(&runs);
        Router::new()
            .route(
                "/items",
                post(move || {
                    runs.fetch_add(1, Ordering::SeqCst);
                    async move { (StatusCode::CREATED, Json(json!({ "router": name }))) }
                }),
            )
            .route_layer(IdempotencyLayer::new(engine.clone()).shared_scope())
    };
    let accounts = {
        let runs = Arc::clone(&runs);
        Router::new()
            .route(
                "/charges",
                post(move |Path(account): Path<String>| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    async move { (StatusCode::CREATED, Json(json!({ "account": account }))) }
                }),
            )
            .route_layer(IdempotencyLayer::new(engine.clone()).shared_scope())
    };
    let app = Router::new()
        .nest("/a", items("a"))
        .nest("/b", items("b"))
        .nest("/accounts/{account}", accounts);
    let addr = serve(app).await;
    let key = [("idempotency-key", "k")];

    let a = send(addr, "POST", "/a/items", &key, "{}").await;
    let b = send(addr, "POST", "/b/items", &key, "{}").await;
    assert_eq!((a.status, &a.json), (201, &json!({ "router": "a" })));
    assert_eq!((b.status, &b.json), (201, &json!({ "router": "b" })));
    assert!(!b.replayed(), "b's handler runs: another route");

    let alice = send(addr, "POST", "/accounts/acct_alice/charges", &key, "{}").await;
    assert_eq!(alice.json, json!({ "account": "acct_alice" }));
    let bob = send(addr, "POST", "/accounts/acct_bob/charges", &key, "{}").await;
    assert_eq!(bob.status, 422, "never acct_alice's charge: {:?}", bob.json);
    assert_eq!(
        bob.json["type"],
        "urn:lambda-idempotency:problem:idempotency-key-reused"
    );
    let alice_again = send(addr, "POST", "/accounts/acct_alice/charges", &key, "{}").await;
    assert!(alice_again.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// A handler that streams one server-sent event, then waits for `more`
/// before it sends the last one and ends: a layer that held the body back
/// until its end would never hand the client the first event.
fn events_app(
    engine: Engine<DynamoDbStore>,
    runs: &Arc<AtomicUsize>,
    more: &Arc<tokio::sync::Notify>,
) -> Router {
    let runs = Arc::clone(runs);
    let more = Arc::clone(more);
    Router::new()
        .route(
            "/v1/completions",
            post(move || {
                runs.fetch_add(1, Ordering::SeqCst);
                let more = Arc::clone(&more);
                async move {
                    let first = futures::stream::once(async { "data: token 0\n\n" });
                    let last = futures::stream::once(async move {
                        more.notified().await;
                        "data: [DONE]\n\n"
                    });
                    let events = first
                        .chain(last)
                        .map(|event| Ok::<_, std::io::Error>(Bytes::from_static(event.as_bytes())));
                    (
                        [(header::CONTENT_TYPE, "text/event-stream")],
                        Body::from_stream(events),
                    )
                }
            }),
        )
        .layer(IdempotencyLayer::new(engine).shared_scope())
}

/// The next event of a stream, which must come while the handler is still
/// streaming (bounded, so a layer that held it back fails rather than hangs).
async fn next_event(body: &mut hyper::body::Incoming) -> Bytes {
    let frame = tokio::time::timeout(Duration::from_secs(30), body.frame())
        .await
        .expect("the event arrives while the handler still streams");
    let data = frame.expect("a frame").expect("no error").into_data();
    data.expect("data")
}

#[tokio::test]
async fn server_sent_events_pass_through_from_the_first_byte() {
    let runs = Arc::new(AtomicUsize::new(0));
    let more = Arc::new(tokio::sync::Notify::new());
    let addr = serve(events_app(engine().await, &runs, &more)).await;
    let started = Instant::now();
    let response = request(
        addr,
        "POST",
        "/v1/completions",
        &[("idempotency-key", "sse-1")],
        "{}",
    )
    .await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = next_event(&mut body).await;
    assert_eq!(first.as_ref(), b"data: token 0\n\n");
    println!(
        "SSE first byte through the layer after {:?}",
        started.elapsed()
    );

    // The key is done with as soon as the stream started: a retry learns it
    // was processed and nothing runs again, even while the stream goes on.
    let retry = send(
        addr,
        "POST",
        "/v1/completions",
        &[("idempotency-key", "sse-1")],
        "{}",
    )
    .await;
    assert_eq!(retry.status, 200);
    assert!(retry.replayed());
    assert_eq!(
        retry.json["type"],
        "urn:lambda-idempotency:problem:idempotency-response-not-stored"
    );
    more.notify_one();
    assert_eq!(next_event(&mut body).await.as_ref(), b"data: [DONE]\n\n");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn twenty_digit_json_ids_are_two_keys() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let app = Router::new()
        .route(
            "/webhooks",
            post(move |Json(event): Json<Value>| {
                counter.fetch_add(1, Ordering::SeqCst);
                async move { Json(json!({ "type": event["type"] })) }
            }),
        )
        .layer(
            IdempotencyLayer::new(engine().await)
                .shared_scope()
                .key_source(KeySource::json_pointer("/id")),
        );
    let addr = serve(app).await;
    for id in ["98765432109876543210", "98765432109876543211"] {
        let event = format!(r#"{{"id":{id},"type":"invoice.paid"}}"#);
        let answer = send(addr, "POST", "/webhooks", &[], &event).await;
        assert_eq!(
            (answer.status, answer.replayed()),
            (200, false),
            "{id}: {:?}",
            answer.json
        );
    }
    let again = r#"{"id":98765432109876543211,"type":"invoice.paid"}"#;
    assert!(send(addr, "POST", "/webhooks", &[], again).await.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_method_the_route_does_not_serve_is_405_and_never_stored() {
    let engine = engine().await;
    let report = || get(|| async { "report" });
    // `MethodRouter::route_layer` wraps the route's handlers only: axum's
    // 405 comes first, with or without a key.
    let handlers_only = Router::new().route(
        "/v1/reports",
        report().route_layer(IdempotencyLayer::new(engine.clone()).shared_scope()),
    );
    // `Router::route_layer` wraps axum's 405 answer too: the key decides
    // whether the layer answers first, and a 405 is never stored.
    let whole_route = Router::new()
        .route("/v1/reports", report())
        .route_layer(IdempotencyLayer::new(engine.clone()).shared_scope());
    for (app, keyless) in [(handlers_only, 405), (whole_route, 400)] {
        let addr = serve(app).await;
        let keyed = [("idempotency-key", "k-405")];
        for _ in 0..2 {
            let answer = send(addr, "POST", "/v1/reports", &keyed, "{}").await;
            assert_eq!((answer.status, answer.replayed()), (405, false));
            assert_eq!(answer.headers[header::ALLOW], "GET,HEAD");
        }
        assert_eq!(
            send(addr, "POST", "/v1/reports", &[], "{}").await.status,
            keyless
        );
        assert_eq!(send(addr, "GET", "/v1/reports", &[], "").await.status, 200);
    }
}

#[path = "outside_lambda/streams.rs"]
mod streams;
