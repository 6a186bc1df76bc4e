//! The HTTP layer in axum (`Router::layer`, `route_layer`,
//! `MethodRouter::layer`) on DynamoDB Local: the semantics lambda_http
//! users get, with axum's own body, extractors and rejections.
//!
//! Needs `AWS_ENDPOINT_URL_DYNAMODB`; `make test` provides it.

mod support;

use axum::{
    body::Body,
    extract::Path,
    http::{header, Request, StatusCode},
    routing::post,
    Json, Router,
};
use http_body_util::BodyExt;
use lambda_idempotency::{
    http::{IdempotencyLayer, KeySource, REPLAYED_HEADER},
    DynamoDbStore, Engine,
};
use serde_json::{json, Value};
use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use tower::{Service, ServiceExt};

async fn layer() -> IdempotencyLayer<DynamoDbStore> {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    IdempotencyLayer::new(Engine::builder(DynamoDbStore::new(client, table)).build()).shared_scope()
}

/// A charge route with a path and a JSON body that counts its runs and
/// takes `delay`.
fn charges(runs: &Arc<AtomicUsize>, delay: Duration) -> axum::routing::MethodRouter {
    let runs = Arc::clone(runs);
    post(
        move |Path(customer): Path<String>, Json(body): Json<Value>| {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                tokio::time::sleep(delay).await;
                let charge = json!({ "id": format!("ch_{run}"), "customer": customer, "amount": body["amount"] });
                (
                    StatusCode::CREATED,
                    [(header::LOCATION, format!("/v1/charges/ch_{run}"))],
                    Json(charge),
                )
            }
        },
    )
}

fn charge(key: Option<&str>, body: &str) -> Request<Body> {
    let mut request = Request::post("/v1/customers/cus_1/charges")
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request.body(Body::from(body.to_owned())).expect("request")
}

struct Answer {
    status: u16,
    replayed: bool,
    headers: axum::http::HeaderMap,
    json: Value,
}

async fn send<S>(app: &S, request: Request<Body>) -> Answer
where
    S: Service<Request<Body>, Response = axum::response::Response, Error = Infallible> + Clone,
{
    let response = app.clone().oneshot(request).await.expect("infallible");
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.expect("body").to_bytes();
    Answer {
        status: parts.status.as_u16(),
        replayed: parts
            .headers
            .get(REPLAYED_HEADER)
            .is_some_and(|v| v == "true"),
        json: serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned())),
        headers: parts.headers,
    }
}

#[tokio::test]
async fn each_way_of_layering_runs_once_replays_and_rejects() {
    for how in ["layer", "route_layer", "method_router"] {
        let runs = Arc::default();
        let route = "/v1/customers/{customer}/charges";
        let app = match how {
            "layer" => Router::new()
                .route(route, charges(&runs, Duration::ZERO))
                .layer(layer().await),
            "route_layer" => Router::new()
                .route(route, charges(&runs, Duration::ZERO))
                .route_layer(layer().await),
            _ => Router::new().route(route, charges(&runs, Duration::ZERO).layer(layer().await)),
        };
        let first = send(&app, charge(Some("k-1"), r#"{"amount":1250}"#)).await;
        assert_eq!((first.status, first.replayed), (201, false), "{how}");
        assert_eq!(first.json["customer"], "cus_1");
        let replay = send(&app, charge(Some("k-1"), r#"{ "amount" : 1250 }"#)).await;
        assert_eq!((replay.status, replay.replayed), (201, true), "{how}");
        assert_eq!(replay.json, first.json);
        assert_eq!(replay.headers[header::LOCATION], "/v1/charges/ch_1");
        let reused = send(&app, charge(Some("k-1"), r#"{"amount":1}"#)).await;
        assert_eq!(reused.status, 422, "{how}");
        assert_eq!(
            reused.headers[header::CONTENT_TYPE],
            "application/problem+json"
        );
        assert_eq!(send(&app, charge(None, "{}")).await.status, 400, "{how}");
        assert_eq!(
            send(&app, charge(Some(""), "{}")).await.status,
            400,
            "{how}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{how}");
    }
}

#[tokio::test]
async fn a_concurrent_duplicate_gets_409_then_the_replay() {
    let runs = Arc::default();
    let app = Router::new()
        .route(
            "/v1/customers/{customer}/charges",
            charges(&runs, Duration::from_millis(1500)),
        )
        .layer(layer().await);
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, charge(Some("slow"), "{}")).await.status }
    });
    // The duplicate goes once the first is inside its handler (its claim
    // made), however slow the machine.
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let duplicate = send(&app, charge(Some("slow"), "{}")).await;
    assert_eq!(duplicate.status, 409);
    // The first request on the route: the default 2 s less its age (read
    // from the record DynamoDB handed back), not the 60 s lease.
    let retry_after: u64 = duplicate.headers[header::RETRY_AFTER]
        .to_str()
        .expect("ASCII")
        .parse()
        .expect("seconds");
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    assert_eq!(first.await.expect("joins"), 201);
    let after = send(&app, charge(Some("slow"), "{}")).await;
    assert_eq!((after.status, after.replayed), (201, true));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_json_rejection_is_stored_and_replayed() {
    let runs = Arc::default();
    let app = Router::new()
        .route(
            "/v1/customers/{customer}/charges",
            charges(&runs, Duration::ZERO),
        )
        .layer(layer().await);
    let first = send(&app, charge(Some("bad"), r#"{"amount":"#)).await;
    assert_eq!((first.status, first.replayed), (400, false));
    let again = send(&app, charge(Some("bad"), r#"{"amount":"#)).await;
    assert_eq!((again.status, again.replayed), (400, true));
    assert_eq!(again.json, first.json);
    assert_eq!(
        send(&app, charge(Some("bad"), r#"{"amount":1}"#))
            .await
            .status,
        422
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_stripe_event_id_in_the_body_is_the_key() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = {
        let runs = Arc::clone(&runs);
        Router::new()
            .route(
                "/webhooks/stripe",
                post(move || {
                    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    async move { format!("handled {run}") }
                }),
            )
            .layer(layer().await.key_source(KeySource::json_pointer("/id")))
    };
    let event = || {
        Request::post("/webhooks/stripe")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(
                r#"{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","type":"charge.succeeded"}"#,
            ))
            .expect("request")
    };
    let first = send(&app, event()).await;
    let again = send(&app, event()).await;
    assert_eq!((first.status, first.replayed), (200, false));
    assert_eq!(
        (again.status, again.replayed, again.json),
        (200, true, first.json)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Redaction on a real server and a real store: `axum::serve` on a
/// loopback port, hyper as the client, DynamoDB Local as the store. The
/// first caller gets the charge's one-time secret; no item in the table
/// holds it (nor the card number), in any attribute; a retry gets the
/// redacted charge, replayed; with `withhold_bodies`, the status, the
/// `Location` and the digest of what the first caller got.
#[tokio::test]
async fn redacted_and_withheld_bodies_never_reach_the_table() {
    use lambda_idempotency::{JsonPointer, JsonRedaction};
    const SECRET: &str = "pi_3Q_secret_Zt7";
    const CARD: &str = "4000056655665556";
    for withhold in [false, true] {
        let client = support::client();
        let table = support::create_idempotency_table(&client).await;
        let layer = IdempotencyLayer::new(
            Engine::builder(DynamoDbStore::new(client.clone(), table.clone())).build(),
        )
        .shared_scope();
        let layer = if withhold {
            layer.withhold_bodies()
        } else {
            layer.redact_json(
                JsonRedaction::new()
                    .remove(JsonPointer::new("/client_secret").unwrap())
                    .replace(
                        JsonPointer::new("/card/number").unwrap(),
                        "************5556",
                    ),
            )
        };
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let app = Router::new()
            .route(
                "/v1/charges",
                post(move || {
                    counted.fetch_add(1, Ordering::SeqCst);
                    async move {
                        (
                            StatusCode::CREATED,
                            [(header::LOCATION, "/v1/charges/ch_9")],
                            Json(json!({ "id": "ch_9", "client_secret": SECRET, "card": { "number": CARD } })),
                        )
                    }
                }),
            )
            .layer(layer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("port");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move { axum::serve(listener, app).await });

        let first = post_over_http(addr, "k-secret").await;
        assert_eq!((first.0, first.1), (201, false));
        assert!(first.3.contains(SECRET), "the first caller gets it all");

        let items = client
            .scan()
            .table_name(&table)
            .send()
            .await
            .expect("scan")
            .items
            .unwrap_or_default();
        assert_eq!(items.len(), 1);
        // Every attribute's bytes, a binary one's (the response) included.
        let held: Vec<u8> = items[0]
            .values()
            .flat_map(|value| match value {
                aws_sdk_dynamodb::types::AttributeValue::B(blob) => blob.as_ref().to_vec(),
                aws_sdk_dynamodb::types::AttributeValue::S(text) => text.as_bytes().to_vec(),
                other => format!("{other:?}").into_bytes(),
            })
            .collect();
        assert!(
            held.windows(4).any(|w| w == b"ch_9") || withhold,
            "the bytes are read"
        );
        for secret in [SECRET, CARD] {
            assert!(
                !held.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "the item holds {secret}"
            );
        }

        let replay = post_over_http(addr, "k-secret").await;
        assert_eq!((replay.0, replay.1), (201, true), "withhold {withhold}");
        assert_eq!(replay.2, "/v1/charges/ch_9");
        let body: Value = serde_json::from_str(&replay.3).expect("json");
        if withhold {
            use base64::Engine as _;
            use sha2::Digest as _;
            let digest = sha2::Sha256::digest(first.3.as_bytes());
            assert_eq!(
                body["response_digest"],
                format!(
                    "sha-256=:{}:",
                    base64::engine::general_purpose::STANDARD.encode(digest)
                )
            );
        } else {
            assert_eq!(
                body,
                json!({ "id": "ch_9", "card": { "number": "************5556" } })
            );
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        server.abort();
    }
}

/// A `POST /v1/charges` with `key` over a fresh HTTP/1.1 connection: the
/// status, whether it was replayed, its `Location` and its body.
async fn post_over_http(addr: std::net::SocketAddr, key: &str) -> (u16, bool, String, String) {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(connection);
    let request = hyper::Request::post("/v1/charges")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key(REPLAYED_HEADER);
    let location = response
        .headers()
        .get(header::LOCATION)
        .map(|value| value.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (
        status,
        replayed,
        location,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// Outside review (finding, with `a_withheld_replay_carries_no_measure_of_
/// the_body_it_does_not_have` in tests/actix.rs): a response whose
/// `Content-Length` the application set and listed in `stored_headers`
/// (the brief's case), with `withhold_bodies`: the replay is a problem
/// body, and `head_only` (respond.rs) copies every stored header but the
/// `BODY_HEADERS`, so the original `Content-Length` goes out with a body
/// of another length. On `axum::serve` (hyper 1.12) the retry gets no
/// well-framed answer: in a debug build hyper's own assertion ("payload
/// claims content-length of 496, custom content-length header claims 48")
/// panics the connection task and the client reads `IncompleteMessage`;
/// in a release build hyper trusts the header, writes `content-length: 48`
/// and then the problem's 496 bytes, so the client reads a truncated
/// problem and the rest as the start of the next response on that
/// keep-alive connection. The same for any head-only replay (a response
/// too large, a stream). A redacted copy drops these headers
/// (`BODY_MEASURES`); the head-only replay should too.
#[tokio::test]
async fn a_withheld_replay_is_framed_by_its_own_length() {
    use lambda_idempotency::MemoryStore;
    let body = r#"{"id":"ch_9","client_secret":"pi_3Q_secret_Zt7"}"#;
    let layer = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build())
        .shared_scope()
        .stored_headers([header::LOCATION, header::CONTENT_LENGTH])
        .withhold_bodies();
    let app = Router::new()
        .route(
            "/v1/charges",
            post(move || async move {
                (
                    StatusCode::CREATED,
                    [
                        (header::LOCATION, "/v1/charges/ch_9".to_owned()),
                        (header::CONTENT_LENGTH, body.len().to_string()),
                        (header::CONTENT_TYPE, "application/json".to_owned()),
                    ],
                    body,
                )
            }),
        )
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("port");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let first = post_over_http(addr, "k-length").await;
    assert_eq!(first.3, body);
    let replay = tokio::time::timeout(Duration::from_secs(5), post_over_http(addr, "k-length"))
        .await
        .expect("the replay is answered");
    assert_eq!((replay.0, replay.1), (201, true));
    let problem: Result<Value, _> = serde_json::from_str(&replay.3);
    assert!(
        problem.is_ok_and(|problem| problem["response_digest"].is_string()),
        "a whole problem body: {:?}",
        replay.3
    );
    server.abort();
}

/// Recovery points through the layer: a handler that charges in a step,
/// then fails with a 500 (the layer gives the key back), is retried with
/// the same key; the retry takes the record over and gets the charge
/// recorded by the first attempt instead of charging again.
#[tokio::test]
async fn a_retry_after_a_failure_resumes_after_the_recorded_step() {
    let charges = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let route = {
        let (charges, calls) = (Arc::clone(&charges), Arc::clone(&calls));
        post(
            move |axum::Extension(claim): axum::Extension<lambda_idempotency::ClaimHandle>| {
                let (charges, calls) = (Arc::clone(&charges), Arc::clone(&calls));
                async move {
                    let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    let charge = claim
                        .step("charge", || async {
                            let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
                            Ok::<_, ()>(format!("ch_{n}"))
                        })
                        .await
                        .expect("recorded");
                    if call == 1 {
                        // The ledger was down: the layer gives the key back.
                        return (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({})))
                            .into_response();
                    }
                    (StatusCode::CREATED, Json(json!({ "id": charge }))).into_response()
                }
            },
        )
    };
    use axum::response::IntoResponse;
    let app = Router::new()
        .route("/v1/customers/{customer}/charges", route)
        .layer(layer().await);
    let failed = send(&app, charge(Some("k-steps"), r#"{"amount":1250}"#)).await;
    assert_eq!(failed.status, 500);
    let retried = send(&app, charge(Some("k-steps"), r#"{"amount":1250}"#)).await;
    assert_eq!((retried.status, retried.replayed), (201, false));
    assert_eq!(
        retried.json["id"], "ch_1",
        "the charge the first attempt recorded"
    );
    assert_eq!(charges.load(Ordering::SeqCst), 1, "charged once");
    let replay = send(&app, charge(Some("k-steps"), r#"{"amount":1250}"#)).await;
    assert_eq!((replay.status, replay.replayed), (201, true));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// Outside review of recovery points through the layer on a real server
/// (`axum::serve`, DynamoDB Local): a handler that charges in a step and
/// then panics (`CatchPanicLayer` answers 500), and a client that hangs
/// up after the step. Either way the charge is made once.
mod steps_review {
    use super::*;
    use axum::response::IntoResponse;
    use tokio::io::AsyncWriteExt;

    /// A route charging in a step, then doing what `after` says on the
    /// handler's `call`-th run.
    fn stepped(
        charges: &Arc<AtomicUsize>,
        calls: &Arc<AtomicUsize>,
        stepped: Arc<tokio::sync::Notify>,
        panic_on_first: bool,
    ) -> axum::routing::MethodRouter {
        let (charges, calls) = (Arc::clone(charges), Arc::clone(calls));
        post(
            move |axum::Extension(claim): axum::Extension<lambda_idempotency::ClaimHandle>| {
                let (charges, calls, stepped) = (
                    Arc::clone(&charges),
                    Arc::clone(&calls),
                    Arc::clone(&stepped),
                );
                async move {
                    let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    let charge = claim
                        .step("charge", || async {
                            let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
                            Ok::<_, ()>(format!("ch_{n}"))
                        })
                        .await
                        .expect("recorded");
                    stepped.notify_one();
                    if call == 1 {
                        if panic_on_first {
                            panic!("the handler's own panic, after its charge");
                        }
                        // The client hangs up meanwhile.
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                    (StatusCode::CREATED, Json(json!({ "id": charge }))).into_response()
                }
            },
        )
    }

    async fn serve(app: Router) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("port");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("serves");
        });
        (addr, server)
    }

    #[tokio::test]
    async fn a_panic_after_a_step_gives_the_key_back_and_the_retry_resumes() {
        let (charges, calls) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let route = stepped(&charges, &calls, Arc::default(), true);
        let app = Router::new()
            .route("/v1/charges", route)
            .layer(layer().await)
            .layer(tower_http::catch_panic::CatchPanicLayer::new());
        let (addr, server) = serve(app).await;
        let first = super::post_over_http(addr, "k-panic").await;
        assert_eq!(first.0, 500, "CatchPanicLayer answers");
        let retried = super::post_over_http(addr, "k-panic").await;
        assert_eq!((retried.0, retried.1), (201, false), "{}", retried.3);
        assert!(retried.3.contains("ch_1"), "{}", retried.3);
        assert_eq!(charges.load(Ordering::SeqCst), 1, "charged once");
        server.abort();
    }

    #[tokio::test]
    async fn a_client_that_hangs_up_after_a_step_leaves_one_charge_and_a_replay() {
        let (charges, calls) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let stepped_now = Arc::new(tokio::sync::Notify::new());
        let route = stepped(&charges, &calls, Arc::clone(&stepped_now), false);
        let app = Router::new()
            .route("/v1/charges", route)
            .layer(layer().await);
        let (addr, server) = serve(app).await;
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        let request = format!(
            "POST /v1/charges HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
             idempotency-key: k-hang-up\r\ncontent-length: 2\r\n\r\n{{}}"
        );
        stream.write_all(request.as_bytes()).await.expect("sent");
        stepped_now.notified().await;
        drop(stream);
        // The handler goes on (the layer's work is detached) and completes.
        let mut answer = super::post_over_http(addr, "k-hang-up").await;
        for _ in 0..50 {
            if answer.0 != 409 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            answer = super::post_over_http(addr, "k-hang-up").await;
        }
        assert_eq!((answer.0, answer.1), (201, true), "{}", answer.3);
        assert!(answer.3.contains("ch_1"), "{}", answer.3);
        assert_eq!(charges.load(Ordering::SeqCst), 1, "charged once");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler ran once");
        server.abort();
    }
}
