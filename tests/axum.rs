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
