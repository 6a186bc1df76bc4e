//! A replay points to the work it replays: the trace context of the
//! request that ran, kept with its record (`keep_trace_context`), in the
//! replay's extensions and, when named, a header.

use super::*;
use crate::http::TraceContext;

const FIRST: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const RETRY: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const HEADER: &str = "idempotency-replay-of";

fn traced(key: &str, traceparent: &str) -> Request {
    let mut request = post(Some(key), r#"{"amount":100}"#);
    request
        .headers_mut()
        .insert("traceparent", HeaderValue::from_str(traceparent).unwrap());
    request
}

fn replay_of(response: &Response<Body>) -> Option<String> {
    response
        .extensions()
        .get::<TraceContext>()
        .map(ToString::to_string)
}

#[tokio::test]
async fn a_replay_names_the_trace_of_the_request_that_ran() {
    let echo = Echo::new();
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .replay_trace_header(HeaderName::from_static(HEADER))
        .layer(echo.clone());
    let first = send(&mut service, traced("k", FIRST)).await;
    assert!(
        first.headers().get(HEADER).is_none(),
        "a fresh answer names nothing"
    );
    // The retry comes in a trace of its own: the replay names the first's.
    let replay = send(&mut service, traced("k", RETRY)).await;
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert_eq!(replay.headers()[HEADER], FIRST);
    assert_eq!(replay_of(&replay).as_deref(), Some(FIRST));
    assert_eq!(text(&replay), text(&first));
    assert_eq!(echo.runs(), 1);
}

#[tokio::test]
async fn an_xray_header_is_kept_where_there_is_no_traceparent() {
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .keep_trace_context()
        .layer(Echo::new());
    let mut first = post(Some("k"), "{}");
    first.headers_mut().insert(
        "x-amzn-trace-id",
        HeaderValue::from_static(
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
        ),
    );
    send(&mut service, first).await;
    let replay = send(&mut service, post(Some("k"), "{}")).await;
    assert_eq!(
        replay_of(&replay).as_deref(),
        Some("00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01")
    );
    assert!(
        replay.headers().get(HEADER).is_none(),
        "no header unless one is named"
    );
}

#[tokio::test]
async fn without_keep_trace_context_a_record_keeps_none() {
    let store = MemoryStore::new();
    let mut service = IdempotencyLayer::new(Engine::builder(store.clone()).build())
        .shared_scope()
        .layer(Echo::new());
    send(&mut service, traced("k", FIRST)).await;
    let replay = send(&mut service, traced("k", RETRY)).await;
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert_eq!(replay_of(&replay), None);
    // The record is in the format every earlier version reads.
    let record = store.records().into_iter().next().expect("one record");
    assert_eq!(
        record.response.expect("a response")[0],
        1,
        "frame version 1"
    );
}

#[tokio::test]
async fn a_request_without_a_trace_keeps_nothing_and_replays_as_always() {
    let mut service = IdempotencyLayer::new(engine())
        .shared_scope()
        .replay_trace_header(HeaderName::from_static(HEADER))
        .layer(Echo::new());
    let mut first = post(Some("k"), "{}");
    first
        .headers_mut()
        .insert("traceparent", HeaderValue::from_static("not a traceparent"));
    send(&mut service, first).await;
    let replay = send(&mut service, post(Some("k"), "{}")).await;
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay_of(&replay), None);
    assert!(replay.headers().get(HEADER).is_none());
}

#[cfg(feature = "encryption")]
#[tokio::test]
async fn the_trace_context_is_sealed_with_the_response() {
    use crate::encryption::{Encryption, RawKeys};
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone())
        .encryption(Encryption::new(
            RawKeys::new("k1", &[9; 32]).unwrap(),
            "tests",
        ))
        .build();
    let mut service = IdempotencyLayer::new(engine)
        .shared_scope()
        .replay_trace_header(HeaderName::from_static(HEADER))
        .layer(Echo::new());
    send(&mut service, traced("k", FIRST)).await;
    let stored = store
        .records()
        .into_iter()
        .next()
        .unwrap()
        .response
        .unwrap();
    assert!(
        !stored
            .windows(FIRST.len())
            .any(|window| window == FIRST.as_bytes()),
        "the trace context is not in the clear"
    );
    let replay = send(&mut service, traced("k", RETRY)).await;
    assert_eq!(replay.headers()[HEADER], FIRST);
}

/// A response that streams (teed to the client, its record written when
/// it ends) keeps the trace of its work as one read whole does.
#[cfg(feature = "axum")]
#[tokio::test]
async fn a_streamed_response_keeps_the_trace_of_its_work() {
    use http_body_util::BodyExt;
    let more = Arc::new(tokio::sync::Notify::new());
    let handler = {
        let more = Arc::clone(&more);
        tower::service_fn(move |_: http::Request<axum::body::Body>| {
            let more = Arc::clone(&more);
            async move {
                let first = futures::stream::once(async { Ok(bytes::Bytes::from_static(b"1\n")) });
                let rest = futures::stream::once(async move {
                    more.notified().await;
                    Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"2\n"))
                });
                use futures::StreamExt;
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .header(header::CONTENT_TYPE, "application/x-ndjson")
                        .body(axum::body::Body::from_stream(first.chain(rest)))
                        .unwrap(),
                )
            }
        })
    };
    let service = IdempotencyLayer::new(engine())
        .shared_scope()
        .replay_trace_header(HeaderName::from_static(HEADER))
        .layer(handler);
    let request = |traceparent: &'static str| {
        http::Request::post("/v1/exports")
            .header("idempotency-key", "export")
            .header("traceparent", traceparent)
            .body(axum::body::Body::from("{}"))
            .unwrap()
    };
    let first = service.clone().oneshot(request(FIRST)).await.unwrap();
    more.notify_one();
    let rows = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&rows[..], b"1\n2\n");
    let replay = service.oneshot(request(RETRY)).await.unwrap();
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert_eq!(replay.headers()[HEADER], FIRST);
}

/// A duplicate that waits for the result in place (`wait_for_result`)
/// gets the replay with the trace of the request that ran, as a retry
/// after it does.
#[tokio::test]
async fn a_duplicate_that_waits_for_the_result_is_pointed_to_the_work() {
    let echo = Echo {
        delay: Duration::from_millis(300),
        ..Echo::new()
    };
    let service = IdempotencyLayer::new(engine())
        .shared_scope()
        .wait_for_result(Duration::from_secs(5))
        .replay_trace_header(HeaderName::from_static(HEADER))
        .layer(echo.clone());
    let first = tokio::spawn({
        let mut service = service.clone();
        async move { send(&mut service, traced("k", FIRST)).await }
    });
    while echo.runs() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let waited = send(&mut service.clone(), traced("k", RETRY)).await;
    let first = first.await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(waited.headers()[REPLAYED_HEADER], "true");
    assert_eq!(waited.headers()[HEADER], FIRST);
    assert_eq!(echo.runs(), 1);
}

/// Records written before the trace was kept (frame version 1), replayed
/// by a layer that keeps it: no trace, no header, the replay as always;
/// and a version-3 record replayed once the setting is off again names
/// nothing in a header (the header is the setting's).
#[tokio::test]
async fn records_of_either_setting_replay_under_the_other() {
    let store = MemoryStore::new();
    let layer = || IdempotencyLayer::new(Engine::builder(store.clone()).build()).shared_scope();
    let mut plain = layer().layer(Echo::new());
    let mut keeping = layer()
        .replay_trace_header(HeaderName::from_static(HEADER))
        .layer(Echo::new());

    send(&mut plain, traced("old", FIRST)).await;
    let replay = send(&mut keeping, traced("old", RETRY)).await;
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert!(replay.headers().get(HEADER).is_none());
    assert_eq!(replay_of(&replay), None);

    send(&mut keeping, traced("new", FIRST)).await;
    let replay = send(&mut plain, traced("new", RETRY)).await;
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert!(replay.headers().get(HEADER).is_none());
}

/// Replays served from the engine's in-process cache point to the work as
/// those read from the store do.
#[tokio::test]
async fn a_replay_from_the_engine_s_cache_is_pointed_to_the_work() {
    let mut service = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).cache(16).build())
        .shared_scope()
        .replay_trace_header(HeaderName::from_static(HEADER))
        .layer(Echo::new());
    send(&mut service, traced("k", FIRST)).await;
    for _ in 0..3 {
        let replay = send(&mut service, traced("k", RETRY)).await;
        assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
        assert_eq!(replay.headers()[HEADER], FIRST);
    }
}
