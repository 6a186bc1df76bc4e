//! Log hygiene: every request leaves one summary line naming its outcome,
//! and no log line holds the raw key. Its own test binary: a process-wide
//! subscriber, so no test running beside it can race tracing's per-callsite
//! interest cache (with a thread-local subscriber, a summary line could go
//! missing when another test reached the call site first).

mod support;

use lambda_http::{http, service_fn, Body, Request, Response};
use lambda_idempotency::{http::IdempotencyLayer, Engine, MemoryStore};
use tower::{Layer, Service, ServiceExt};

type BoxError = lambda_http::Error;

fn post(key: &str, body: &str) -> Request {
    http::Request::post("/v1/charges")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Body::from(body))
        .expect("request")
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

#[tokio::test]
async fn logs_name_outcomes_but_never_the_raw_key() {
    let captured = support::Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let secret_key = "customer-7731-secret-key";
    let store = MemoryStore::new();
    let mut service = IdempotencyLayer::new(Engine::builder(store.clone()).build())
        .shared_scope()
        .layer(service_fn(|request: Request| async move {
            Response::builder()
                .status(201)
                .body(Body::from(request.body().as_ref().to_vec()))
                .map_err(BoxError::from)
        }));
    send(&mut service, post(secret_key, r#"{"a":1}"#)).await;
    send(&mut service, post(secret_key, r#"{"a":1}"#)).await;
    send(&mut service, post(secret_key, r#"{"a":2}"#)).await;
    store.fail_next(1);
    send(&mut service, post("other", r#"{"a":1}"#)).await;

    let logs = captured.text();
    for outcome in ["fresh", "replay", "key_reused", "store_error"] {
        let line = logs.lines().find(|line| {
            line.contains("idempotent request handled")
                && line.contains(&format!("outcome=\"{outcome}\""))
        });
        assert!(line.is_some(), "no summary line for {outcome}:\n{logs}");
    }
    for outcome in [
        "outcome=\"fresh\"",
        "outcome=\"replay\"",
        "outcome=\"key_reused\"",
        "outcome=\"store_error\"",
    ] {
        assert!(logs.contains(outcome), "{outcome} missing from:\n{logs}");
    }
    assert!(
        !logs.contains(secret_key),
        "the raw key leaked into the logs:\n{logs}"
    );
}
