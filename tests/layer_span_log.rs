//! The request's span with no tracing subscriber at all: a `log` logger
//! sees it entered, as it always did.
//!
//! The crate's default features (`lambda`, `consumers`: `lambda_runtime`)
//! turn on `tracing`'s `log` feature. With it, and no tracing dispatcher,
//! a disabled span still reports to the `log` crate: its creation
//! (`tracing::span`) and every entry and exit (`-> name;` / `<- name;`,
//! target `tracing::span::active`) of an `Instrumented` future. The layer
//! always instrumented the request, so a `log` logger at trace
//! level (env_logger, simple_logger, ...) saw `-> idempotency;` lines for
//! every poll; it must still, though the layer skips instrumenting a
//! request whose span a subscriber disabled.
//!
//! This file must never set a tracing dispatcher (has_been_set is global).

use axum::{body::Body, routing::post, Router};
use http_body_util::BodyExt;
use lambda_idempotency::{http::IdempotencyLayer, Engine, MemoryStore};
use std::sync::Mutex;
use tower::ServiceExt;
use tracing::{log, Instrument};

static RECORDS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        RECORDS
            .lock()
            .unwrap()
            .push((record.target().to_owned(), record.args().to_string()));
    }
    fn flush(&self) {}
}

fn activity(name: &str) -> Vec<String> {
    RECORDS
        .lock()
        .unwrap()
        .iter()
        .filter(|(target, message)| {
            target == "tracing::span::active" && message.ends_with(&format!(" {name};"))
        })
        .map(|(_, message)| message.clone())
        .collect()
}

#[tokio::test]
async fn without_a_subscriber_a_log_logger_still_sees_the_request_span_entered() {
    log::set_logger(&Capture).expect("the only logger");
    log::set_max_level(log::LevelFilter::Trace);
    assert!(!tracing::dispatcher::has_been_set());

    // Control: instrumenting with a span no
    // subscriber enables, is visible to the logger.
    let span = tracing::info_span!("control");
    assert!(span.is_disabled());
    async { tokio::task::yield_now().await }
        .instrument(span)
        .await;
    let control = activity("control");
    assert!(
        control.iter().any(|m| m == "-> control;") && control.iter().any(|m| m == "<- control;"),
        "tracing's log feature reports a disabled span's entries: {control:?}"
    );

    let app = Router::new()
        .route("/v1/charges", post(|| async { "ok" }))
        .layer(IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build()).shared_scope());
    let response = app
        .oneshot(
            axum::http::Request::post("/v1/charges")
                .header("idempotency-key", "k1")
                .header("content-type", "application/json")
                .body(Body::from("{}"))
                .expect("request"),
        )
        .await
        .expect("infallible");
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.expect("body");

    let entered = activity("idempotency");
    let span_records: Vec<(String, String)> = RECORDS
        .lock()
        .unwrap()
        .iter()
        .filter(|(target, message)| {
            target.starts_with("tracing::span") && message.contains("idempotency")
        })
        .cloned()
        .collect();
    assert!(
        entered.iter().any(|m| m == "-> idempotency;"),
        "every poll of the request enters the `idempotency` span, \
         which a log logger sees (as it sees `-> control;` above); got: {entered:?}; \
         the span's records the logger got: {span_records:?}"
    );
}
