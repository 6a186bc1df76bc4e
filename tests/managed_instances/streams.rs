//! Response streaming in Lambda (`lambda_http`'s streaming runtime, a
//! function URL with `InvokeMode: RESPONSE_STREAM`) through the layer,
//! against the Runtime API stub: a stream that breaks part-way, by a panic
//! or an error, reaches Lambda as a failed stream (lambda_runtime's
//! `Runtime.StreamError`), never as a complete response, and its retry is
//! told it was not stored, without a second run.

use super::*;
use axum::{http::HeaderMap, routing::post, Router};
use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `POST /v1/exports`: a first row at once, then, 50 ms later, the stream
/// breaks as `x-break` says (`panic` or `error`).
fn exports(runs: &Arc<AtomicUsize>) -> Router {
    let runs = Arc::clone(runs);
    Router::new().route(
        "/v1/exports",
        post(move |headers: HeaderMap| {
            runs.fetch_add(1, Ordering::SeqCst);
            let panics = headers.get("x-break").is_some_and(|v| v == "panic");
            async move {
                let first =
                    futures::stream::once(async { Ok(Bytes::from_static(b"{\"row\":1}\n")) });
                let breaks = futures::stream::once(async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if panics {
                        panic!("the export's source panicked part-way");
                    }
                    Err(std::io::Error::other("the export's source failed part-way"))
                });
                (
                    [("content-type", "application/x-ndjson")],
                    axum::body::Body::from_stream(futures::StreamExt::chain(first, breaks)),
                )
            }
        })
        .layer(IdempotencyLayer::new(engine()).shared_scope()),
    )
}

fn export_event(key: &str, how: &str) -> Value {
    let mut event = charge_event(key, Duration::ZERO);
    event["rawPath"] = json!("/v1/exports");
    event["routeKey"] = json!("POST /v1/exports");
    event["requestContext"]["http"]["path"] = json!("/v1/exports");
    event["requestContext"]["routeKey"] = json!("POST /v1/exports");
    event["headers"]["x-break"] = json!(how);
    event
}

/// The streamed response's body, after its prelude.
fn streamed(reported: &Reported) -> String {
    let Reported::Streamed(whole) = reported else {
        panic!("a streamed response: {reported:?}");
    };
    let text = String::from_utf8_lossy(whole);
    let body = text.split("\0\0\0\0\0\0\0\0").nth(1).unwrap_or_default();
    body.to_owned()
}

async fn a_broken_stream_in_lambda(how: &str) {
    lambda_environment();
    let api = RuntimeApi::start().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = exports(&runs);
    let _runtime = start(&api, move || {
        lambda_http::run_with_streaming_response_concurrent(app)
    })
    .await;
    let key = format!("stream-{how}");
    let first = api
        .invoke(export_event(&key, how), Duration::from_secs(5))
        .await;
    let body = streamed(&first);
    assert!(body.starts_with("{\"row\":1}\n"), "{how}: {body:?}");
    assert!(
        body.contains("Lambda-Runtime-Function-Error-Type: Runtime.StreamError"),
        "{how}: Lambda is told the stream failed, not that it ended: {body:?}"
    );
    let started = Instant::now();
    let retry = loop {
        let retry = api
            .invoke(export_event(&key, how), Duration::from_secs(5))
            .await;
        let body = streamed(&retry);
        if !body.contains("idempotency-in-progress") || started.elapsed() > Duration::from_secs(10)
        {
            break body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        retry.contains("idempotency-response-not-stored"),
        "{how}: the retry is told it was not stored: {retry:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "{how}: never run again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lambda_stream_that_panics_part_way_fails_and_is_not_stored() {
    a_broken_stream_in_lambda("panic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lambda_stream_that_fails_part_way_fails_and_is_not_stored() {
    a_broken_stream_in_lambda("error").await;
}
