//! The HTTP layer as actix-web middleware (`http::actix::Idempotency`), in
//! a real `HttpServer` on a loopback port, with hyper's client (and a raw
//! TCP one that hangs up): the everyday cases of the axum tests, on the
//! memory store.

use actix_web::{
    dev::{ServerHandle, Service, ServiceRequest},
    error::ErrorRequestTimeout,
    web, App, HttpMessage, HttpRequest, HttpResponse, HttpServer,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{header, HeaderMap};
use hyper_util::rt::TokioIo;
use lambda_idempotency::{
    http::{actix::Idempotency, IdempotencyLayer, REPLAYED_HEADER},
    Engine, MemoryStore,
};
use serde_json::{json, Value};
use std::{
    net::SocketAddr,
    sync::atomic::{AtomicBool, AtomicUsize, Ordering},
    time::{Duration, Instant},
};
use tokio::{io::AsyncWriteExt, net::TcpStream};

/// What the handlers share with the test.
#[derive(Default)]
struct State {
    runs: AtomicUsize,
    /// How long each run takes, in milliseconds.
    work_ms: AtomicUsize,
    /// The next run answers 500.
    fail_next: AtomicBool,
    /// Runs that got to their end.
    finished: AtomicUsize,
    /// The next run panics.
    panic_next: AtomicBool,
    /// Lets `/v1/rows` write its second row.
    second_row: tokio::sync::Notify,
}

impl State {
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

/// The caller, as an authentication middleware in front of the
/// idempotency one names it (here from a bearer token taken on trust).
#[derive(Clone)]
struct Tenant(String);

/// `POST /v1/charges` and `POST /v1/accounts/{id}/charges`: a new charge
/// each run, with a `Location`, after `work_ms`.
async fn charge(state: web::Data<State>, request: HttpRequest, body: Bytes) -> HttpResponse {
    let run = state.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let work = Duration::from_millis(state.work_ms.load(Ordering::SeqCst) as u64);
    actix_web::rt::time::sleep(work).await;
    if state.panic_next.swap(false, Ordering::SeqCst) {
        panic!("the handler panics");
    }
    state.finished.fetch_add(1, Ordering::SeqCst);
    if state.fail_next.swap(false, Ordering::SeqCst) {
        return HttpResponse::InternalServerError().json(json!({ "error": "try again" }));
    }
    let claimed = request
        .extensions()
        .get::<lambda_idempotency::ClaimHandle>()
        .is_some();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    HttpResponse::Created()
        .insert_header((header::LOCATION.as_str(), format!("/v1/charges/ch_{run}")))
        .json(json!({ "id": format!("ch_{run}"), "request": body, "claimed": claimed }))
}

/// `POST /v1/events`: two server-sent events, a second apart.
async fn events(state: web::Data<State>) -> HttpResponse {
    state.runs.fetch_add(1, Ordering::SeqCst);
    let events = futures::stream::unfold(0, |sent| async move {
        match sent {
            0 => Some((Ok::<_, actix_web::Error>(Bytes::from("data: 1\n\n")), 1)),
            1 => {
                actix_web::rt::time::sleep(Duration::from_secs(1)).await;
                Some((Ok(Bytes::from("data: 2\n\n")), 2))
            }
            _ => None,
        }
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .streaming(events)
}

/// `POST /v1/exports`: a response of 100 000 bytes, whose length actix
/// knows.
async fn export(state: web::Data<State>) -> HttpResponse {
    let run = state.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let mut body = vec![b'x'; 100_000];
    body[..run.to_string().len()].copy_from_slice(run.to_string().as_bytes());
    HttpResponse::Ok().content_type("text/plain").body(body)
}

/// `POST /v1/rows`: NDJSON without a length, its second row written only
/// when the test says so.
async fn rows(state: web::Data<State>) -> HttpResponse {
    state.runs.fetch_add(1, Ordering::SeqCst);
    let rows = futures::stream::unfold(0, move |written| {
        let state = state.clone();
        async move {
            match written {
                0 => Some((Ok::<_, actix_web::Error>(Bytes::from("{\"row\":1}\n")), 1)),
                1 => {
                    state.second_row.notified().await;
                    Some((Ok(Bytes::from("{\"row\":2}\n")), 2))
                }
                _ => None,
            }
        }
    });
    HttpResponse::Ok()
        .content_type("application/x-ndjson")
        .streaming(rows)
}

/// `POST /v1/broken`: a first row at once, then the stream breaks as the
/// `x-break` header says: `panic` (the stream panics while polled),
/// `error` (an error item), `short` (a body of 100 000 declared bytes that
/// ends after the first row: its producer went away), `short-small` (the
/// same with 1,000 declared bytes, which the middleware reads whole).
async fn broken(state: web::Data<State>, request: HttpRequest) -> HttpResponse {
    state.runs.fetch_add(1, Ordering::SeqCst);
    let how = request
        .headers()
        .get("x-break")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    // A length actix knows, if any: past 64 KiB the middleware streams the
    // body; at most that, it reads it whole.
    let declared = match how.as_str() {
        "short" => Some(100_000),
        "short-small" => Some(1_000),
        _ => None,
    };
    let rows = futures::stream::unfold(0, move |written| {
        let how = how.clone();
        async move {
            if written == 1 {
                // The head and the first row reach the client first.
                actix_web::rt::time::sleep(Duration::from_millis(50)).await;
            }
            match (written, how.as_str()) {
                (0, _) => Some((Ok::<_, actix_web::Error>(Bytes::from("{\"row\":1}\n")), 1)),
                (1, "panic") => panic!("the export's source panicked part-way"),
                (1, "error") => Some((
                    Err(actix_web::error::ErrorInternalServerError(
                        "the export's source failed part-way",
                    )),
                    2,
                )),
                _ => None,
            }
        }
    });
    let mut response = HttpResponse::Ok();
    response.content_type("application/x-ndjson");
    match declared {
        Some(length) => response.body(actix_web::body::SizedStream::new(length, rows)),
        None => response.streaming(rows),
    }
}

struct Server {
    addr: SocketAddr,
    handle: ServerHandle,
    state: web::Data<State>,
}

impl Server {
    async fn stop(self) {
        self.handle.stop(false).await;
    }
}

/// The idempotency middleware with the caller from [`Tenant`].
fn by_tenant() -> Idempotency<MemoryStore> {
    let engine = Engine::builder(MemoryStore::new()).build();
    Idempotency::new(IdempotencyLayer::new(engine)).caller(|request: &ServiceRequest| {
        request.extensions().get::<Tenant>().map(|t| t.0.clone())
    })
}

/// An `HttpServer` (one worker) on a free loopback port, on a thread of
/// its own: `/v1` behind `idempotency`, behind authentication and (if
/// given) a timeout that drops the request's future at its deadline.
fn serve(idempotency: Idempotency<MemoryStore>, timeout: Option<Duration>) -> Server {
    let state = web::Data::new(State::default());
    let app_state = state.clone();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let server = HttpServer::new(move || {
                App::new()
                    .app_data(app_state.clone())
                    .service(
                        web::scope("/v1")
                            .wrap(idempotency.clone())
                            .route("/charges", web::post().to(charge))
                            .route("/accounts/{id}/charges", web::post().to(charge))
                            .route("/charges", web::get().to(|| async { "[]" }))
                            .route("/events", web::post().to(events))
                            .route("/exports", web::post().to(export))
                            .route("/rows", web::post().to(rows))
                            .route("/broken", web::post().to(broken)),
                    )
                    .wrap_fn(|request, service| {
                        if let Some(token) = request
                            .headers()
                            .get("authorization")
                            .and_then(|value| value.to_str().ok())
                            .and_then(|value| value.strip_prefix("Bearer "))
                        {
                            let tenant = Tenant(token.to_owned());
                            request.extensions_mut().insert(tenant);
                        }
                        service.call(request)
                    })
                    .wrap_fn(move |request, service| {
                        let response = service.call(request);
                        async move {
                            match timeout {
                                Some(timeout) => tokio::time::timeout(timeout, response)
                                    .await
                                    .unwrap_or_else(|_| Err(ErrorRequestTimeout("timed out"))),
                                None => response.await,
                            }
                        }
                    })
            })
            .workers(1)
            .disable_signals()
            .bind(("127.0.0.1", 0))
            .expect("a loopback port");
            let addr = server.addrs()[0];
            let server = server.run();
            sender
                .send((addr, server.handle()))
                .expect("the test waits");
            server.await
        })
    });
    let (addr, handle) = receiver.recv().expect("the server starts");
    Server {
        addr,
        handle,
        state,
    }
}

#[derive(Debug)]
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    fn replayed(&self) -> bool {
        self.headers
            .get(REPLAYED_HEADER)
            .is_some_and(|value| value == "true")
    }

    fn problem_type(&self) -> String {
        assert_eq!(
            self.headers[header::CONTENT_TYPE],
            "application/problem+json",
            "{self:?}"
        );
        self.json()["type"].as_str().unwrap_or_default().to_owned()
    }
}

/// One request on a connection of its own, through hyper's client.
async fn send(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let stream = TcpStream::connect(addr).await.expect("connects");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let mut request = hyper::Request::builder()
        .method("POST")
        .uri(path)
        .header(header::HOST, addr.to_string())
        .header(header::CONTENT_TYPE, "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request");
    let response = sender.send_request(request).await.expect("a response");
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: body.collect().await.expect("the whole body").to_bytes(),
    }
}

/// A charge by tenant `t1` with `key`.
async fn charge_with(addr: SocketAddr, key: &str, body: &str) -> Answer {
    send(
        addr,
        "/v1/charges",
        &[("idempotency-key", key), ("authorization", "Bearer t1")],
        body,
    )
    .await
}

/// Retries until the answer is not 409, for at most `budget`.
async fn retry_until_answered(addr: SocketAddr, key: &str, body: &str, budget: Duration) -> Answer {
    let started = Instant::now();
    loop {
        let answer = charge_with(addr, key, body).await;
        if answer.status != 409 || started.elapsed() > budget {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_retry_after_success_gets_the_same_response_replayed() {
    let server = serve(by_tenant(), None);
    let body = r#"{"amount":1250,"currency":"eur"}"#;
    let first = charge_with(server.addr, "k-replay", body).await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed());
    assert_eq!(
        first.json()["claimed"],
        true,
        "the claim is in the request's extensions"
    );

    let retry = charge_with(server.addr, "k-replay", body).await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(
        retry.headers[header::LOCATION],
        first.headers[header::LOCATION]
    );
    assert_eq!(
        retry.headers[header::CONTENT_TYPE],
        first.headers[header::CONTENT_TYPE]
    );
    assert_eq!(retry.body, first.body);
    assert_eq!(server.state.runs(), 1);
    server.stop().await;
}

#[tokio::test]
async fn json_bodies_that_differ_in_key_order_and_whitespace_are_one_request() {
    let server = serve(by_tenant(), None);
    let first = charge_with(server.addr, "k-json", r#"{"amount":1250,"currency":"eur"}"#).await;
    assert_eq!(first.status, 201);
    let retry = charge_with(
        server.addr,
        "k-json",
        "{ \"currency\" : \"eur\",\n  \"amount\": 1250 }",
    )
    .await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(retry.replayed());
    assert_eq!(server.state.runs(), 1);
    server.stop().await;
}

#[tokio::test]
async fn concurrent_duplicates_run_once_and_the_others_get_409_with_retry_after() {
    let server = serve(by_tenant(), None);
    server.state.work_ms.store(1000, Ordering::SeqCst);
    let addr = server.addr;
    let first = tokio::spawn(async move { charge_with(addr, "k-dup", "{}").await });
    // The first holds the claim before its duplicates arrive.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let duplicates: Vec<_> = (0..4)
        .map(|_| tokio::spawn(async move { charge_with(addr, "k-dup", "{}").await }))
        .collect();
    for duplicate in duplicates {
        let answer = duplicate.await.expect("answered");
        assert_eq!(answer.status, 409, "{answer:?}");
        assert!(
            answer.headers.contains_key(header::RETRY_AFTER),
            "{answer:?}"
        );
        assert!(answer.problem_type().ends_with("idempotency-key-in-use"));
    }
    assert_eq!(first.await.expect("answered").status, 201);
    assert_eq!(server.state.runs(), 1);
    let retry = charge_with(addr, "k-dup", "{}").await;
    assert!(retry.replayed());
    server.stop().await;
}

#[tokio::test]
async fn a_key_reused_with_another_body_is_422_and_a_missing_key_400() {
    let server = serve(by_tenant(), None);
    assert_eq!(
        charge_with(server.addr, "k-reused", r#"{"amount":1}"#)
            .await
            .status,
        201
    );
    let reused = charge_with(server.addr, "k-reused", r#"{"amount":2}"#).await;
    assert_eq!(reused.status, 422, "{reused:?}");
    assert!(reused.problem_type().ends_with("idempotency-key-reused"));

    let missing = send(
        server.addr,
        "/v1/charges",
        &[("authorization", "Bearer t1")],
        "{}",
    )
    .await;
    assert_eq!(missing.status, 400, "{missing:?}");
    assert!(missing.problem_type().ends_with("idempotency-key-missing"));
    assert_eq!(server.state.runs(), 1, "neither ran");
    server.stop().await;
}

#[tokio::test]
async fn a_500_is_not_stored_and_the_retry_runs_again() {
    let server = serve(by_tenant(), None);
    server.state.fail_next.store(true, Ordering::SeqCst);
    let failed = charge_with(server.addr, "k-500", "{}").await;
    assert_eq!(failed.status, 500, "{failed:?}");
    assert!(!failed.replayed());
    let retry = charge_with(server.addr, "k-500", "{}").await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(!retry.replayed());
    assert_eq!(server.state.runs(), 2);
    server.stop().await;
}

#[tokio::test]
async fn two_callers_with_one_key_get_records_of_their_own() {
    let server = serve(by_tenant(), None);
    let alice = send(
        server.addr,
        "/v1/charges",
        &[
            ("idempotency-key", "k-shared"),
            ("authorization", "Bearer alice"),
        ],
        "{}",
    )
    .await;
    let bob = send(
        server.addr,
        "/v1/charges",
        &[
            ("idempotency-key", "k-shared"),
            ("authorization", "Bearer bob"),
        ],
        "{}",
    )
    .await;
    assert_eq!((alice.status, bob.status), (201, 201), "{bob:?}");
    assert!(!bob.replayed(), "bob must not get alice's charge");
    assert_ne!(alice.json()["id"], bob.json()["id"]);
    assert_eq!(server.state.runs(), 2);

    // An unauthenticated request: no caller named, refused, not anonymous.
    let nobody = send(
        server.addr,
        "/v1/charges",
        &[("idempotency-key", "k-shared")],
        "{}",
    )
    .await;
    assert_eq!(nobody.status, 500, "{nobody:?}");
    assert!(nobody.problem_type().ends_with("idempotency-scope-unset"));
    assert_eq!(server.state.runs(), 2);
    server.stop().await;
}

#[tokio::test]
async fn without_a_caller_or_a_shared_scope_keyed_requests_are_refused() {
    let engine = Engine::builder(MemoryStore::new()).build();
    let server = serve(Idempotency::new(IdempotencyLayer::new(engine)), None);
    let refused = charge_with(server.addr, "k-closed", "{}").await;
    assert_eq!(refused.status, 500, "{refused:?}");
    assert!(refused.problem_type().ends_with("idempotency-scope-unset"));
    assert_eq!(server.state.runs(), 0);
    server.stop().await;

    let engine = Engine::builder(MemoryStore::new()).build();
    let server = serve(
        Idempotency::new(IdempotencyLayer::new(engine)).shared_scope(),
        None,
    );
    assert_eq!(charge_with(server.addr, "k-open", "{}").await.status, 201);
    let other = send(
        server.addr,
        "/v1/charges",
        &[("idempotency-key", "k-open")],
        "{}",
    )
    .await;
    assert!(
        other.replayed(),
        "a shared scope: one record for every caller"
    );
    server.stop().await;
}

#[tokio::test]
async fn the_route_template_is_the_scope_and_the_path_the_fingerprint() {
    let server = serve(by_tenant(), None);
    let auth = ("authorization", "Bearer t1");
    let a = send(
        server.addr,
        "/v1/accounts/a/charges",
        &[("idempotency-key", "k-route"), auth],
        "{}",
    )
    .await;
    assert_eq!(a.status, 201);
    // The same route template, another account: the key was used for
    // another request, never answered with account a's charge.
    let b = send(
        server.addr,
        "/v1/accounts/b/charges",
        &[("idempotency-key", "k-route"), auth],
        "{}",
    )
    .await;
    assert_eq!(b.status, 422, "{b:?}");
    // Another route: a scope of its own.
    let other = charge_with(server.addr, "k-route", "{}").await;
    assert_eq!(other.status, 201, "{other:?}");
    assert!(!other.replayed());
    assert_eq!(server.state.runs(), 2);
    server.stop().await;
}

#[tokio::test]
async fn a_request_future_dropped_mid_handler_still_completes_and_its_retry_replays() {
    // The timeout outside drops the middleware's future after 200 ms; the
    // handler takes a second.
    let server = serve(by_tenant(), Some(Duration::from_millis(200)));
    server.state.work_ms.store(1000, Ordering::SeqCst);
    let timed_out = charge_with(server.addr, "k-left", "{}").await;
    assert_eq!(timed_out.status, 408, "{timed_out:?}");
    assert_eq!(server.state.finished.load(Ordering::SeqCst), 0);

    server.state.work_ms.store(0, Ordering::SeqCst);
    let retry = retry_until_answered(server.addr, "k-left", "{}", Duration::from_secs(5)).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(
        retry.replayed(),
        "the first run completed the record: {retry:?}"
    );
    assert_eq!(server.state.runs(), 1);
    assert_eq!(server.state.finished.load(Ordering::SeqCst), 1);
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_handler_is_charged_once() {
    let server = serve(by_tenant(), None);
    server.state.work_ms.store(400, Ordering::SeqCst);
    let mut stream = TcpStream::connect(server.addr).await.expect("connects");
    let body = "{}";
    let head = format!(
        "POST /v1/charges HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
         authorization: Bearer t1\r\nidempotency-key: k-hangup\r\ncontent-length: {}\r\n\r\n{body}",
        server.addr,
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("writes");
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(stream);

    let retry = retry_until_answered(server.addr, "k-hangup", body, Duration::from_secs(5)).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(server.state.runs(), 1);
    server.stop().await;
}

#[tokio::test]
async fn other_methods_pass_through_with_their_bodies() {
    let server = serve(by_tenant(), None);
    let stream = TcpStream::connect(server.addr).await.expect("connects");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let request = hyper::Request::get("/v1/charges")
        .header(header::HOST, server.addr.to_string())
        .body(Full::new(Bytes::new()))
        .expect("request");
    let response = sender.send_request(request).await.expect("a response");
    assert_eq!(response.status(), 200);
    assert!(!response.headers().contains_key(REPLAYED_HEADER));
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(body, "[]");
    server.stop().await;
}

#[tokio::test]
async fn a_stream_passes_through_from_its_first_byte_and_is_never_run_again() {
    let server = serve(by_tenant(), None);
    let stream = TcpStream::connect(server.addr).await.expect("connects");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let request = hyper::Request::post("/v1/events")
        .header(header::HOST, server.addr.to_string())
        .header("idempotency-key", "k-events")
        .header("authorization", "Bearer t1")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let started = Instant::now();
    let response = sender.send_request(request).await.expect("a response");
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = body
        .frame()
        .await
        .expect("a frame")
        .expect("data")
        .into_data()
        .expect("data");
    assert_eq!(first, "data: 1\n\n");
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "the first event before the second is written: {:?}",
        started.elapsed()
    );
    let rest = body.collect().await.expect("the rest").to_bytes();
    assert_eq!(rest, "data: 2\n\n");

    let retry = send(
        server.addr,
        "/v1/events",
        &[
            ("idempotency-key", "k-events"),
            ("authorization", "Bearer t1"),
        ],
        "",
    )
    .await;
    assert!(
        retry
            .problem_type()
            .ends_with("idempotency-response-not-stored"),
        "{retry:?}"
    );
    assert_eq!(server.state.runs(), 1);
    server.stop().await;
}

#[tokio::test]
async fn a_stream_without_a_length_reaches_the_client_as_it_is_written_and_is_stored() {
    let server = serve(by_tenant(), None);
    let stream = TcpStream::connect(server.addr).await.expect("connects");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let headers = [
        ("idempotency-key", "k-rows"),
        ("authorization", "Bearer t1"),
    ];
    let mut request =
        hyper::Request::post("/v1/rows").header(header::HOST, server.addr.to_string());
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let request = request.body(Full::new(Bytes::new())).expect("request");
    // The second row waits for this test, which waits for the first: a
    // layer that held the body to its end would send nothing (bounded, so
    // it fails rather than hangs).
    let bounded = Duration::from_secs(30);
    let response = tokio::time::timeout(bounded, sender.send_request(request))
        .await
        .expect("the head while the handler streams")
        .expect("a response");
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = tokio::time::timeout(bounded, body.frame())
        .await
        .expect("the first row while the handler streams")
        .expect("a frame")
        .expect("data")
        .into_data()
        .expect("data");
    assert_eq!(first, "{\"row\":1}\n");
    server.state.second_row.notify_one();
    let rest = body.collect().await.expect("the rest").to_bytes();
    assert_eq!(rest, "{\"row\":2}\n");

    // Stored whole when it ended, before the client had its end.
    let retry = send(server.addr, "/v1/rows", &headers, "").await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, "{\"row\":1}\n{\"row\":2}\n");
    assert_eq!(retry.headers[header::CONTENT_TYPE], "application/x-ndjson");
    assert_eq!(server.state.runs(), 1);
    server.stop().await;
}

#[tokio::test]
async fn a_long_response_is_stored_and_replayed_whole() {
    let server = serve(by_tenant(), None);
    let headers = [
        ("idempotency-key", "k-export"),
        ("authorization", "Bearer t1"),
    ];
    let first = send(server.addr, "/v1/exports", &headers, "{}").await;
    assert_eq!((first.status, first.body.len()), (200, 100_000));
    assert_eq!(
        first
            .headers
            .get(header::CONTENT_LENGTH)
            .map(|v| v.as_bytes()),
        Some(&b"100000"[..]),
        "the length actix knew is kept on the first answer: {:?}",
        first.headers
    );
    assert!(!first.headers.contains_key(header::TRANSFER_ENCODING));
    let retry = send(server.addr, "/v1/exports", &headers, "{}").await;
    assert!(retry.replayed(), "{:?}", retry.headers);
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.headers[header::CONTENT_TYPE], "text/plain");
    assert_eq!(server.state.runs(), 1);
    server.stop().await;
}

#[tokio::test]
async fn bodies_past_the_limit_are_413_with_a_key_and_passed_on_whole_without() {
    let engine = Engine::builder(MemoryStore::new()).build();
    let layer = IdempotencyLayer::new(engine)
        .require_key(false)
        .body_limit(1024);
    let server = serve(
        Idempotency::new(layer).caller(|request: &ServiceRequest| {
            request.extensions().get::<Tenant>().map(|t| t.0.clone())
        }),
        None,
    );
    let body = json!({ "pad": "x".repeat(4000) }).to_string();
    let keyed = charge_with(server.addr, "k-large", &body).await;
    assert_eq!(keyed.status, 413, "{keyed:?}");
    assert!(keyed.problem_type().ends_with("idempotency-body-too-large"));
    assert_eq!(server.state.runs(), 0);

    let keyless = send(
        server.addr,
        "/v1/charges",
        &[("authorization", "Bearer t1")],
        &body,
    )
    .await;
    assert_eq!(keyless.status, 201, "{keyless:?}");
    assert_eq!(
        keyless.json()["request"]["pad"].as_str().map(str::len),
        Some(4000)
    );
    assert_eq!(keyless.json()["claimed"], false);
    server.stop().await;
}

#[tokio::test]
async fn a_handler_that_panics_releases_its_key_and_the_retry_runs() {
    let server = serve(by_tenant(), None);
    server.state.panic_next.store(true, Ordering::SeqCst);
    let panicked = charge_with(server.addr, "k-panic", "{}").await;
    assert_eq!(panicked.status, 500, "{panicked:?}");
    let retry = charge_with(server.addr, "k-panic", "{}").await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(!retry.replayed());
    assert_eq!(server.state.runs(), 2);
    // The worker is still serving.
    assert!(charge_with(server.addr, "k-panic", "{}").await.replayed());
    server.stop().await;
}

#[test]
fn under_app_wrap_the_route_template_scopes_and_commit_with_commits_with_the_record() {
    use lambda_idempotency::{http::CommitWith, store::memory::MemoryWrite};
    actix_web::rt::System::new().block_on(async {
        let store = MemoryStore::new();
        let engine = Engine::builder(store.clone()).build();
        let app = actix_web::test::init_service(
            App::new()
                .wrap(Idempotency::new(IdempotencyLayer::new(engine)).shared_scope())
                .route(
                    "/accounts/{id}/charges",
                    web::post().to(|id: web::Path<String>| async move {
                        let mut response = HttpResponse::Created().body(format!("charged {id}"));
                        response
                            .extensions_mut()
                            .insert(CommitWith(vec![MemoryWrite::put(
                                format!("charge-{id}"),
                                "1",
                            )]));
                        response
                    }),
                ),
        )
        .await;
        let charge = |account: &str| {
            actix_web::test::TestRequest::post()
                .uri(&format!("/accounts/{account}/charges"))
                .insert_header(("idempotency-key", "k-app"))
                .to_request()
        };
        let first = actix_web::test::call_service(&app, charge("a")).await;
        assert_eq!(first.status(), 201);
        assert_eq!(
            store.item("charge-a"),
            Some(b"1".to_vec()),
            "committed with the record"
        );
        let other_account = actix_web::test::call_service(&app, charge("b")).await;
        assert_eq!(
            other_account.status(),
            422,
            "one route template, another path"
        );
        assert_eq!(store.item("charge-b"), None);
    });
}

/// A response stream that breaks part-way, however it breaks: the client
/// sees the cut (the body ends in an error, never as complete), and every
/// retry is told that the response was not stored, without running the
/// handler again.
async fn a_broken_stream(how: &str) {
    let server = serve(by_tenant(), None);
    let key = format!("k-broken-{how}");
    let headers = [
        ("idempotency-key", key.as_str()),
        ("authorization", "Bearer t1"),
        ("x-break", how),
    ];
    let stream = TcpStream::connect(server.addr).await.expect("connects");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let mut request = hyper::Request::builder()
        .method("POST")
        .uri("/v1/broken")
        .header(header::HOST, server.addr.to_string());
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let response = sender
        .send_request(request.body(Full::new(Bytes::new())).expect("request"))
        .await
        .expect("the head");
    assert_eq!(response.status(), 200);
    let cut = tokio::time::timeout(Duration::from_secs(10), response.into_body().collect())
        .await
        .expect("the body ends");
    assert!(
        cut.is_err(),
        "{how}: the client sees the stream cut, not a complete body: {:?}",
        cut.map(|body| body.to_bytes())
    );
    let started = Instant::now();
    let retry = loop {
        let retry = send(server.addr, "/v1/broken", &headers, "").await;
        if retry.status != 409 || started.elapsed() > Duration::from_secs(10) {
            break retry;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        retry
            .problem_type()
            .ends_with("idempotency-response-not-stored"),
        "{how}: {retry:?}"
    );
    assert_ne!(retry.body.as_ref(), b"{\"row\":1}\n", "{how}");
    assert_eq!(server.state.runs(), 1, "{how}: never run again");
    server.stop().await;
}

#[tokio::test]
async fn a_stream_that_panics_part_way_is_cut_and_never_replayed_as_whole() {
    a_broken_stream("panic").await;
}

#[tokio::test]
async fn a_stream_that_fails_part_way_is_cut_and_never_replayed_as_whole() {
    a_broken_stream("error").await;
}

#[tokio::test]
async fn a_stream_that_ends_short_of_its_length_is_cut_and_never_replayed_as_whole() {
    a_broken_stream("short").await;
}

/// A body of a known length under 64 KiB (read whole by the middleware)
/// that ends short: a response that failed while read (500, not stored),
/// never a shorter whole one (an outside review found it answered 200 with
/// a content-length of 10 and replayed so).
#[tokio::test]
async fn a_small_body_that_ends_short_of_its_length_is_never_a_whole_response() {
    let server = serve(by_tenant(), None);
    let headers = [
        ("idempotency-key", "k-short-small"),
        ("authorization", "Bearer t1"),
        ("x-break", "short-small"),
    ];
    for attempt in 1..=2 {
        let answer = send(server.addr, "/v1/broken", &headers, "").await;
        assert_eq!(answer.status, 500, "attempt {attempt}: {answer:?}");
        assert!(!answer.replayed(), "attempt {attempt}");
        assert!(
            answer
                .problem_type()
                .ends_with("idempotency-response-unreadable"),
            "{answer:?}"
        );
    }
    server.stop().await;
}

/// The engine's observers hear actix-web's requests through the HTTP
/// port, once each.
#[tokio::test]
async fn each_request_is_reported_through_the_http_port() {
    use lambda_idempotency::{observe::Port, testing::RecordingObserver};
    let observer = RecordingObserver::default();
    let engine = Engine::builder(MemoryStore::new())
        .observer(observer.clone())
        .build();
    let idempotency =
        Idempotency::new(IdempotencyLayer::new(engine)).caller(|request: &ServiceRequest| {
            request.extensions().get::<Tenant>().map(|t| t.0.clone())
        });
    let server = serve(idempotency, None);
    let body = r#"{"amount":1250,"currency":"eur"}"#;
    charge_with(server.addr, "k-observed", body).await;
    charge_with(server.addr, "k-observed", body).await;
    charge_with(server.addr, "k-observed", r#"{"amount":1}"#).await;
    assert_eq!(
        observer.answers_through(Port::Http),
        ["fresh", "replay", "key_reused"]
    );
    assert_eq!(observer.answers().len(), 3, "{:?}", observer.answers());
    server.stop().await;
}

/// Outside review of redaction through actix-web's middleware
/// (`IdempotencyLayer::redact_json`, `redact`, `withhold_bodies`): the
/// first caller gets the whole response, every retry (from the store, the
/// local cache, or waiting on the run in this process) the redacted one,
/// and the record never holds what was taken out.
mod redaction {
    use super::*;
    use base64::Engine as _;
    use lambda_idempotency::{
        http::{decode_stored_response, BodyNotStored},
        JsonPointer, JsonRedaction,
    };
    use sha2::{Digest, Sha256};

    const SECRET: &str = "pi_1_secret_Xq9";
    const CARD: &str = "4242424242424242";

    fn redaction() -> JsonRedaction {
        JsonRedaction::new()
            .remove(JsonPointer::new("/client_secret").unwrap())
            .replace(
                JsonPointer::new("/card/number").unwrap(),
                "************4242",
            )
    }

    fn digest(body: &[u8]) -> String {
        format!(
            "sha-256=:{}:",
            base64::engine::general_purpose::STANDARD.encode(Sha256::digest(body))
        )
    }

    fn header_of<'a>(request: &'a HttpRequest, name: &str) -> Option<&'a str> {
        request.headers().get(name).and_then(|v| v.to_str().ok())
    }

    /// A charge whose JSON body holds a one-time secret and a card number,
    /// after `work_ms`: `x-status` its status (201 by default), `x-pad`
    /// bytes of padding (past 64 KiB the middleware streams the body to
    /// its record), `x-measured` adds the headers that measure or name
    /// the body (`ETag`, `Content-Digest`).
    async fn secret_charge(state: web::Data<State>, request: HttpRequest) -> HttpResponse {
        let run = state.runs.fetch_add(1, Ordering::SeqCst) + 1;
        let work = Duration::from_millis(state.work_ms.load(Ordering::SeqCst) as u64);
        actix_web::rt::time::sleep(work).await;
        let pad: usize = header_of(&request, "x-pad")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let status: u16 = header_of(&request, "x-status")
            .and_then(|v| v.parse().ok())
            .unwrap_or(201);
        let body = json!({
            "id": format!("ch_{run}"),
            "client_secret": SECRET,
            "card": { "number": CARD, "exp": "12/30" },
            "pad": "p".repeat(pad),
        })
        .to_string();
        state.finished.fetch_add(1, Ordering::SeqCst);
        let mut response =
            HttpResponse::build(actix_web::http::StatusCode::from_u16(status).expect("a status"));
        response
            .content_type("application/json")
            .insert_header(("location", format!("/v1/charges/ch_{run}")));
        if header_of(&request, "x-measured").is_some() {
            let sha = Sha256::digest(body.as_bytes());
            response.insert_header((
                "etag",
                format!(
                    "\"{}\"",
                    sha.iter().map(|b| format!("{b:02x}")).collect::<String>()
                ),
            ));
            response.insert_header(("content-digest", digest(body.as_bytes())));
        }
        response.body(body)
    }

    /// The same charge as a stream without a length, in two chunks.
    async fn streamed_charge(state: web::Data<State>) -> HttpResponse {
        let run = state.runs.fetch_add(1, Ordering::SeqCst) + 1;
        let body = json!({ "id": format!("ch_{run}"), "client_secret": SECRET }).to_string();
        let (head, tail) = body.split_at(body.len() / 2);
        let chunks = [
            Ok::<_, actix_web::Error>(Bytes::from(head.to_owned())),
            Ok(Bytes::from(tail.to_owned())),
        ];
        HttpResponse::Created()
            .content_type("application/json")
            .streaming(futures::stream::iter(chunks))
    }

    /// The same charge gzip-compressed, as actix's `Compress` wrapped
    /// inside the idempotency middleware would send it.
    async fn gzipped_charge(state: web::Data<State>) -> HttpResponse {
        use std::io::Write as _;
        let run = state.runs.fetch_add(1, Ordering::SeqCst) + 1;
        let body = json!({ "id": format!("ch_{run}"), "client_secret": SECRET }).to_string();
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gzip.write_all(body.as_bytes()).unwrap();
        HttpResponse::Created()
            .content_type("application/json")
            .insert_header(("content-encoding", "gzip"))
            .body(gzip.finish().unwrap())
    }

    /// The request's body as a JSON response.
    async fn echo(state: web::Data<State>, body: Bytes) -> HttpResponse {
        state.runs.fetch_add(1, Ordering::SeqCst);
        HttpResponse::Created()
            .content_type("application/json")
            .body(body)
    }

    /// A charge whose only field of any secrecy is its card number.
    async fn card_charge(state: web::Data<State>) -> HttpResponse {
        let run = state.runs.fetch_add(1, Ordering::SeqCst) + 1;
        HttpResponse::Created()
            .content_type("application/json")
            .insert_header(("location", format!("/v1/charges/ch_{run}")))
            .body(card_body(run, CARD))
    }

    fn card_body(run: usize, card: &str) -> String {
        json!({ "id": format!("ch_{run}"), "card": { "number": card, "exp": "12/30" } }).to_string()
    }

    /// A refusal an actix handler answers with its own error type: a 422
    /// whose JSON body holds the secret.
    #[derive(Debug)]
    struct Declined;

    impl std::fmt::Display for Declined {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("declined")
        }
    }

    impl actix_web::ResponseError for Declined {
        fn status_code(&self) -> actix_web::http::StatusCode {
            actix_web::http::StatusCode::UNPROCESSABLE_ENTITY
        }

        fn error_response(&self) -> HttpResponse {
            HttpResponse::UnprocessableEntity()
                .content_type("application/json")
                .body(json!({ "error": "declined", "client_secret": SECRET }).to_string())
        }
    }

    async fn declined(state: web::Data<State>) -> Result<HttpResponse, Declined> {
        state.runs.fetch_add(1, Ordering::SeqCst);
        Err(Declined)
    }

    /// A real `HttpServer` with the redaction routes behind `idempotency`
    /// (callers share records).
    fn serve_redacting(idempotency: Idempotency<MemoryStore>) -> Server {
        let state = web::Data::new(State::default());
        let app_state = state.clone();
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let server = HttpServer::new(move || {
                    App::new().app_data(app_state.clone()).service(
                        web::scope("/r")
                            .wrap(idempotency.clone())
                            .route("/charges", web::post().to(secret_charge))
                            .route("/streamed", web::post().to(streamed_charge))
                            .route("/gzipped", web::post().to(gzipped_charge))
                            .route("/declined", web::post().to(declined))
                            .route("/cards", web::post().to(card_charge))
                            .route("/echo", web::post().to(echo)),
                    )
                })
                .workers(1)
                .disable_signals()
                .bind(("127.0.0.1", 0))
                .expect("a loopback port");
                let addr = server.addrs()[0];
                let server = server.run();
                sender
                    .send((addr, server.handle()))
                    .expect("the test waits");
                server.await
            })
        });
        let (addr, handle) = receiver.recv().expect("the server starts");
        Server {
            addr,
            handle,
            state,
        }
    }

    fn layer(store: &MemoryStore) -> IdempotencyLayer<MemoryStore> {
        IdempotencyLayer::new(Engine::builder(store.clone()).build())
    }

    fn middleware(layer: IdempotencyLayer<MemoryStore>) -> Idempotency<MemoryStore> {
        Idempotency::new(layer).shared_scope()
    }

    async fn post(addr: SocketAddr, path: &str, key: &str, extra: &[(&str, &str)]) -> Answer {
        let mut headers = vec![("idempotency-key", key)];
        headers.extend_from_slice(extra);
        send(addr, path, &headers, "{}").await
    }

    /// No record of `store` holds `secret`, in any form.
    fn never_stored(store: &MemoryStore, secret: &str) {
        let records = store.records();
        assert!(!records.is_empty(), "a record");
        for record in records {
            let response = record.response.unwrap_or_default();
            assert!(
                !response
                    .windows(secret.len())
                    .any(|w| w == secret.as_bytes()),
                "the record holds {secret}"
            );
        }
    }

    fn redacted(answer: &Answer) {
        assert!(answer.replayed(), "{answer:?}");
        let body = answer.json();
        assert!(body.get("client_secret").is_none(), "{answer:?}");
        assert_eq!(body["card"]["number"], "************4242", "{answer:?}");
    }

    /// The everyday case through a real actix server: the first caller
    /// whole; a duplicate waiting on the run in this process, a retry from
    /// the local cache and one from the store redacted; the operator's
    /// decoding of the record redacted too.
    #[tokio::test]
    async fn the_first_caller_gets_it_whole_and_every_other_reader_redacted() {
        let store = MemoryStore::new();
        let engine = Engine::builder(store.clone()).cache(16).build();
        let server = serve_redacting(middleware(
            IdempotencyLayer::new(engine)
                .redact_json(redaction())
                .wait_for_result(Duration::from_secs(10)),
        ));
        server.state.work_ms.store(400, Ordering::SeqCst);
        let (first, waiter) = tokio::join!(post(server.addr, "/r/charges", "k1", &[]), async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            post(server.addr, "/r/charges", "k1", &[]).await
        });
        assert_eq!(first.status, 201, "{first:?}");
        assert!(!first.replayed());
        assert_eq!(first.json()["client_secret"], SECRET);
        assert_eq!(first.json()["card"]["number"], CARD);
        assert_eq!(waiter.status, 201, "{waiter:?}");
        redacted(&waiter);
        // From the cache (the store's copy still there: a replay either way).
        redacted(&post(server.addr, "/r/charges", "k1", &[]).await);
        never_stored(&store, SECRET);
        never_stored(&store, CARD);
        let record = store.records().pop().expect("one record");
        let decoded = decode_stored_response(&record.response.expect("completed")).unwrap();
        assert!(!format!("{:?}", decoded.body()).contains(SECRET));
        assert_eq!(server.state.runs(), 1);
        server.stop().await;
    }

    /// A body of more than 64 KiB (streamed to its record through the
    /// channel, teed to the client) and a body without a length are
    /// redacted as a small one is.
    #[tokio::test]
    async fn a_long_or_streamed_json_body_is_redacted_too() {
        let store = MemoryStore::new();
        let server = serve_redacting(middleware(layer(&store).redact_json(redaction())));
        let pad = [("x-pad", "100000")];
        let first = post(server.addr, "/r/charges", "k-long", &pad).await;
        assert_eq!(first.json()["client_secret"], SECRET, "{}", first.status);
        assert_eq!(first.json()["pad"].as_str().map(str::len), Some(100_000));
        let retry = post(server.addr, "/r/charges", "k-long", &pad).await;
        redacted(&retry);
        assert_eq!(retry.json()["pad"].as_str().map(str::len), Some(100_000));

        let first = post(server.addr, "/r/streamed", "k-stream", &[]).await;
        assert_eq!(first.json()["client_secret"], SECRET, "{first:?}");
        let retry = post(server.addr, "/r/streamed", "k-stream", &[]).await;
        assert!(retry.replayed(), "{retry:?}");
        assert_eq!(retry.json(), json!({ "id": "ch_2" }), "{retry:?}");
        never_stored(&store, SECRET);
        assert_eq!(server.state.runs(), 2);
        server.stop().await;
    }

    /// A duplicate that waits in this process on a run whose body is teed
    /// to its first caller as it streams (past 64 KiB): it gets the
    /// redacted record once the body has ended, never the first caller's
    /// stream.
    #[tokio::test]
    async fn a_duplicate_waiting_on_a_teed_body_gets_it_redacted() {
        let store = MemoryStore::new();
        let server = serve_redacting(middleware(
            layer(&store)
                .redact_json(redaction())
                .wait_for_result(Duration::from_secs(10)),
        ));
        server.state.work_ms.store(300, Ordering::SeqCst);
        let pad = [("x-pad", "200000")];
        let (first, waiter) =
            tokio::join!(post(server.addr, "/r/charges", "k-teed", &pad), async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                post(server.addr, "/r/charges", "k-teed", &pad).await
            });
        assert_eq!(first.json()["client_secret"], SECRET, "{}", first.status);
        redacted(&waiter);
        assert_eq!(waiter.json()["pad"].as_str().map(str::len), Some(200_000));
        never_stored(&store, SECRET);
        assert_eq!(server.state.runs(), 1);
        server.stop().await;
    }

    /// A gzip body (`Compress` inside the middleware) is not JSON the
    /// redaction reads: its record keeps the status and the digest of the
    /// bytes sent, and the retry is told so.
    #[tokio::test]
    async fn a_compressed_body_is_withheld_with_its_digest() {
        let store = MemoryStore::new();
        let server = serve_redacting(middleware(layer(&store).redact_json(redaction())));
        let first = post(server.addr, "/r/gzipped", "k-gz", &[]).await;
        assert_eq!(first.status, 201);
        assert_eq!(first.headers["content-encoding"], "gzip");
        let retry = post(server.addr, "/r/gzipped", "k-gz", &[]).await;
        assert_eq!(retry.status, 201, "the original status");
        assert!(retry.replayed());
        assert!(retry.headers.get("content-encoding").is_none(), "{retry:?}");
        assert!(retry
            .problem_type()
            .ends_with("idempotency-response-not-stored"));
        assert_eq!(retry.json()["response_digest"], digest(&first.body));
        assert!(store.records()[0]
            .response
            .as_ref()
            .is_some_and(|r| r.len() < 200));
        assert_eq!(server.state.runs(), 1);
        server.stop().await;
    }

    /// A hook that fails or panics (on actix's worker thread, where the
    /// handler's local task runs too): the first caller gets the response,
    /// the record keeps the status and the digest, the handler runs once
    /// and the worker goes on serving.
    #[tokio::test]
    async fn a_hook_that_fails_or_panics_withholds_and_the_worker_serves_on() {
        for panics in [false, true] {
            let store = MemoryStore::new();
            let layer = layer(&store);
            let layer = if panics {
                layer.redact(|_| panic!("the redaction hook panicked"))
            } else {
                layer.redact(|_| Err("cannot redact".into()))
            };
            let server = serve_redacting(middleware(layer));
            let first = post(server.addr, "/r/charges", "k-hook", &[]).await;
            assert_eq!(first.status, 201, "{first:?}");
            assert_eq!(first.json()["client_secret"], SECRET);
            let retry = post(server.addr, "/r/charges", "k-hook", &[]).await;
            assert_eq!(retry.status, 201, "{retry:?}");
            assert!(retry.replayed());
            assert!(
                retry.headers.get(header::LOCATION).is_none(),
                "status and digest only"
            );
            assert_eq!(retry.json()["response_digest"], digest(&first.body));
            never_stored(&store, SECRET);
            assert_eq!(server.state.runs(), 1, "panics: {panics}");
            let other = post(server.addr, "/r/charges", "k-hook-2", &[]).await;
            assert_eq!(other.status, 201, "the worker serves on");
            server.stop().await;
        }
    }

    /// A 4xx (a `HttpResponse` and a handler's own `ResponseError`) is
    /// stored redacted; a 5xx is not stored (the retry runs again).
    #[tokio::test]
    async fn a_stored_4xx_is_redacted_and_a_5xx_is_not_stored() {
        let store = MemoryStore::new();
        let server = serve_redacting(middleware(
            layer(&store)
                .redact_json(redaction().remove(JsonPointer::new("/client_secret").unwrap())),
        ));
        let status = [("x-status", "422")];
        let first = post(server.addr, "/r/charges", "k-422", &status).await;
        assert_eq!(first.status, 422);
        assert_eq!(first.json()["client_secret"], SECRET);
        let retry = post(server.addr, "/r/charges", "k-422", &status).await;
        assert_eq!(retry.status, 422);
        redacted(&retry);

        let first = post(server.addr, "/r/declined", "k-declined", &[]).await;
        assert_eq!(first.status, 422);
        assert_eq!(first.json()["client_secret"], SECRET, "{first:?}");
        let retry = post(server.addr, "/r/declined", "k-declined", &[]).await;
        assert_eq!(retry.status, 422);
        assert!(retry.replayed(), "{retry:?}");
        assert_eq!(retry.json(), json!({ "error": "declined" }));
        never_stored(&store, SECRET);

        let status = [("x-status", "503")];
        post(server.addr, "/r/charges", "k-503", &status).await;
        let retry = post(server.addr, "/r/charges", "k-503", &status).await;
        assert!(!retry.replayed(), "a 5xx is released");
        assert_eq!(server.state.runs(), 4);
        server.stop().await;
    }

    /// A client that hangs up mid-handler: the run completes on its task,
    /// and its retry gets the redacted replay.
    #[tokio::test]
    async fn a_client_that_hangs_up_gets_the_redacted_replay() {
        let store = MemoryStore::new();
        let server = serve_redacting(middleware(layer(&store).redact_json(redaction())));
        server.state.work_ms.store(400, Ordering::SeqCst);
        let mut stream = TcpStream::connect(server.addr).await.expect("connects");
        let head = format!(
            "POST /r/charges HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
             idempotency-key: k-gone\r\ncontent-length: 2\r\n\r\n{{}}",
            server.addr
        );
        stream.write_all(head.as_bytes()).await.expect("writes");
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(stream);
        let started = Instant::now();
        let retry = loop {
            let answer = post(server.addr, "/r/charges", "k-gone", &[]).await;
            if answer.status != 409 || started.elapsed() > Duration::from_secs(5) {
                break answer;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(retry.status, 201, "{retry:?}");
        redacted(&retry);
        never_stored(&store, SECRET);
        assert_eq!(server.state.runs(), 1);
        server.stop().await;
    }

    /// `stored_headers` that measure the body (`Content-Digest`, listed by
    /// the user) are dropped from a redacted copy; an `ETag` is stored by
    /// default.
    ///
    /// Finding: the ETag computed over the original body is replayed with
    /// the redacted body. A strong validator now names a representation
    /// the retry never got (a cache that revalidates with it gets a 304
    /// and keeps the redacted body as the resource), and when the ETag is
    /// a hash of the body (as here, and as frameworks compute it), the
    /// retry holds a hash of the unredacted body beside everything of it
    /// but the redacted field: a low-entropy field (a card number masked
    /// to its last four, its BIN known) is recovered by trying candidates.
    /// `redacted_copy` drops `BODY_MEASURES` when the body changes; an
    /// ETag is one too (or at least weakened).
    #[tokio::test]
    async fn a_redacted_replay_drops_the_validators_of_the_original_body() {
        let store = MemoryStore::new();
        let server = serve_redacting(middleware(
            layer(&store)
                .stored_headers([
                    header::LOCATION,
                    header::ETAG,
                    header::HeaderName::from_static("content-digest"),
                ])
                .redact_json(redaction()),
        ));
        let measured = [("x-measured", "1")];
        let first = post(server.addr, "/r/charges", "k-etag", &measured).await;
        assert!(first.headers.contains_key(header::ETAG));
        let retry = post(server.addr, "/r/charges", "k-etag", &measured).await;
        redacted(&retry);
        assert!(
            retry.headers.get("content-digest").is_none(),
            "held: {retry:?}"
        );
        assert_ne!(
            retry.headers.get(header::ETAG),
            first.headers.get(header::ETAG),
            "the original body's ETag on the redacted one"
        );
        server.stop().await;
    }

    /// Finding: with `withhold_bodies` (and for a response too large or
    /// streamed), the replay is a problem body, but the stored headers
    /// that measured the original body go with it: `head_only` (respond.rs)
    /// skips `BODY_HEADERS` only, not `BODY_MEASURES`. The retry gets a
    /// `Content-Digest` (and an `ETag`) that does not describe the body it
    /// gets: a client that checks `Content-Digest` (RFC 9530) rejects the
    /// replay as corrupt. (actix drops a stored `Content-Length` itself; a
    /// tower server sends it with a body of another length:
    /// `a_withheld_replay_is_framed_by_its_own_length` in tests/axum.rs.)
    #[tokio::test]
    async fn a_withheld_replay_carries_no_measure_of_the_body_it_does_not_have() {
        let store = MemoryStore::new();
        let server = serve_redacting(middleware(
            layer(&store)
                .stored_headers([
                    header::LOCATION,
                    header::ETAG,
                    header::HeaderName::from_static("content-digest"),
                ])
                .withhold_bodies(),
        ));
        let measured = [("x-measured", "1")];
        let first = post(server.addr, "/r/charges", "k-withheld", &measured).await;
        assert_eq!(first.headers["content-digest"], digest(&first.body));
        let retry = post(server.addr, "/r/charges", "k-withheld", &measured).await;
        assert!(retry.replayed());
        assert!(retry
            .problem_type()
            .ends_with("idempotency-response-not-stored"));
        assert_eq!(retry.headers[header::LOCATION], "/v1/charges/ch_1");
        assert!(
            retry
                .headers
                .get("content-digest")
                .is_none_or(|value| *value == digest(&retry.body)),
            "a Content-Digest that is not the body's: {retry:?}"
        );
        server.stop().await;
    }

    /// Finding: a withheld body (`withhold_bodies`, and every redaction
    /// that fails) is kept as the unkeyed SHA-256 of the whole body the
    /// first caller got, in the record (the store, its backups, the
    /// operator tool's `BodyNotStored::digest`) and in every retry's
    /// `response_digest`. When the body's only unknown is a field of low
    /// entropy (the docs' own example, a full card number: its BIN and
    /// last four are what any masked display shows, six digits under the
    /// Luhn check are left), the digest is an offline oracle for it: here
    /// 100,000 hashes recover the card from the record alone. PCI DSS
    /// (3.5.1.1) accepts only keyed hashes of a PAN. A keyed digest (an
    /// HMAC under a key of the deployment's, or the sealing key), or none
    /// for a redaction that failed, would keep the record from saying
    /// more than the redaction meant it to.
    #[tokio::test]
    #[ignore = "known limitation, documented in src/docs/redaction.md: the digest is unkeyed unless encryption seals it"]
    async fn a_withheld_record_is_no_oracle_for_the_field_it_withholds() {
        let store = MemoryStore::new();
        let server = serve_redacting(middleware(layer(&store).withhold_bodies()));
        let first = post(server.addr, "/r/cards", "k-card", &[]).await;
        assert_eq!(first.status, 201);
        server.stop().await;
        // What a reader of the record has: its digest, and what the API
        // shows of the charge anyway (its id, the card's BIN and last four).
        let record = store.records().pop().expect("one record");
        let decoded = decode_stored_response(&record.response.expect("completed")).unwrap();
        let kept = decoded
            .extensions()
            .get::<BodyNotStored>()
            .and_then(|why| why.digest)
            .expect("a digest");
        let luhn = |number: &str| {
            let sum: u32 = number
                .bytes()
                .rev()
                .enumerate()
                .map(|(i, b)| {
                    let d = u32::from(b - b'0');
                    if i % 2 == 1 {
                        if d * 2 > 9 {
                            d * 2 - 9
                        } else {
                            d * 2
                        }
                    } else {
                        d
                    }
                })
                .sum();
            sum.is_multiple_of(10)
        };
        let recovered = (0..1_000_000u32)
            .map(|middle| format!("424242{middle:06}4242"))
            .filter(|card| luhn(card))
            .find(|card| Sha256::digest(card_body(1, card).as_bytes())[..] == kept[..]);
        assert_eq!(recovered, None, "the record gives the card number back");
    }

    /// Finding: `redact_json` refuses a body with an integer past 64 bits
    /// (`has_integer_past_64_bits`: written again it would be rounded, and
    /// every retry told another value for a field nobody asked to redact),
    /// but a decimal with more significant digits than an `f64` holds is
    /// the same case and is not refused: `serde_json::Value` reads it as
    /// the nearest `f64` and writes that. A ledger amount, an exchange
    /// rate, a crypto quantity (18 decimals) is replayed as another number
    /// (observed: `0.123456789012345678901` as `0.12345678901234568`,
    /// `12345678901234567.89` as `1.2345678901234568e+16`). It should be
    /// withheld as the integers are (or the number kept as written).
    #[tokio::test]
    async fn redact_json_keeps_the_decimals_it_does_not_name() {
        let store = MemoryStore::new();
        let server = serve_redacting(middleware(layer(&store).redact_json(redaction())));
        let body = r#"{"id":"ch_1","client_secret":"s","amount":"1.00","rate":0.123456789012345678901,"total":12345678901234567.89}"#;
        let headers = [("idempotency-key", "k-decimal")];
        let first = send(server.addr, "/r/echo", &headers, body).await;
        assert_eq!(first.body, body);
        let retry = send(server.addr, "/r/echo", &headers, body).await;
        assert!(retry.replayed(), "{retry:?}");
        let replayed = String::from_utf8_lossy(&retry.body);
        for number in ["0.123456789012345678901", "12345678901234567.89"] {
            assert!(
                replayed.contains(number) || retry.json()["response_digest"].is_string(),
                "{number} replayed as another number: {replayed}"
            );
        }
        assert_eq!(server.state.runs(), 1);
        server.stop().await;
    }
}

/// The actix adapter keeps the trace context of the request that ran and
/// names it in its replays, as the tower layer does; and how real request
/// headers read: X-Ray's through an ALB that added `Self=`, a
/// `traceparent` padded with tabs, a `tracestate` (not kept).
mod trace_links {
    use super::*;

    const HEADER: &str = "idempotency-replay-of";
    const FIRST: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const RETRY: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn traced() -> Server {
        let engine = Engine::builder(MemoryStore::new()).build();
        let layer = IdempotencyLayer::new(engine)
            .replay_trace_header(hyper::header::HeaderName::from_static(HEADER));
        serve(
            Idempotency::new(layer).caller(|request: &ServiceRequest| {
                request.extensions().get::<Tenant>().map(|t| t.0.clone())
            }),
            None,
        )
    }

    async fn charge(addr: SocketAddr, key: &str, trace: &[(&str, &str)]) -> Answer {
        let mut headers = vec![("idempotency-key", key), ("authorization", "Bearer t1")];
        headers.extend_from_slice(trace);
        send(addr, "/v1/charges", &headers, r#"{"amount":1}"#).await
    }

    #[tokio::test]
    async fn an_actix_replay_names_the_trace_of_the_request_that_ran() {
        let server = traced();
        let first = charge(
            server.addr,
            "t-1",
            &[("traceparent", FIRST), ("tracestate", "congo=t61rcWkgMzE")],
        )
        .await;
        assert_eq!(first.status, 201);
        assert!(first.headers.get(HEADER).is_none());
        let replay = charge(server.addr, "t-1", &[("traceparent", RETRY)]).await;
        assert!(replay.replayed());
        assert_eq!(
            replay.headers[HEADER], FIRST,
            "the first's, without its tracestate"
        );
        assert_eq!(server.state.runs.load(Ordering::SeqCst), 1);

        // W3C's example padded with a tab (optional whitespace on the wire).
        charge(
            server.addr,
            "t-2",
            &[("traceparent", &format!("\t{FIRST}"))],
        )
        .await;
        let replay = charge(server.addr, "t-2", &[]).await;
        assert_eq!(replay.headers[HEADER], FIRST);

        // An ALB in front adds `Self=` before the caller's own X-Ray header.
        charge(
            server.addr,
            "t-3",
            &[(
                "x-amzn-trace-id",
                "Self=1-67891234-12456789abcdef012345678;Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
            )],
        )
        .await;
        let replay = charge(server.addr, "t-3", &[]).await;
        assert_eq!(
            replay.headers[HEADER],
            "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"
        );
        server.stop().await;
    }

    /// Two `traceparent` fields: W3C Trace Context's test suite
    /// (`test_traceparent_duplicated`) expects them ignored, as one field
    /// joined with a comma is invalid; OpenTelemetry Java's extractor
    /// joins them. The layer keeps none.
    #[tokio::test]
    async fn two_traceparent_fields_keep_no_trace() {
        let server = traced();
        charge(
            server.addr,
            "t-4",
            &[("traceparent", FIRST), ("traceparent", RETRY)],
        )
        .await;
        let replay = charge(server.addr, "t-4", &[]).await;
        assert!(replay.replayed());
        server.stop().await;
        assert_eq!(replay.headers.get(HEADER), None);
    }
}
