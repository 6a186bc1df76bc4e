//! A 200 MB response through the layer under a real `axum::serve`, read by
//! a real HTTP client: it streams (the layer holds at most what it could
//! store), arrives whole and in order, and its record completes as not
//! stored, so a retry learns it was processed and nothing runs again.
//!
//! Alone in its binary: it reads the process's resident memory while the
//! body streams, which other tests running beside it would disturb.
//!
//! Needs `AWS_ENDPOINT_URL_DYNAMODB`; `make test` provides it.

mod support;

use axum::{body::Body, http::header, routing::post, Router};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use lambda_idempotency::{
    http::{IdempotencyLayer, REPLAYED_HEADER},
    DynamoDbStore, Engine,
};
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Instant,
};

const CHUNK: usize = 64 * 1024;
const CHUNKS: usize = 200 * 1024 * 1024 / CHUNK;

/// The resident set of this process, in bytes (Linux).
fn resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// Chunk `i` of the export: its bytes say which chunk it is.
fn chunk(i: usize) -> Bytes {
    Bytes::from(vec![(i % 251) as u8; CHUNK])
}

async fn send_export(
    addr: std::net::SocketAddr,
    key: &str,
) -> hyper::Response<hyper::body::Incoming> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let request = hyper::Request::post("/v1/exports")
        .header(header::HOST, addr.to_string())
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request");
    sender.send_request(request).await.expect("a response")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mb_export_streams_through_and_is_never_run_twice() {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    let layer = IdempotencyLayer::new(Engine::builder(DynamoDbStore::new(client, table)).build())
        .shared_scope();
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let app = Router::new()
        .route(
            "/v1/exports",
            post(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async move {
                    let chunks =
                        futures::stream::iter(0..CHUNKS).map(|i| Ok::<_, std::io::Error>(chunk(i)));
                    (
                        [(header::CONTENT_TYPE, "application/octet-stream")],
                        Body::from_stream(chunks),
                    )
                }
            }),
        )
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });

    let before = resident();
    let started = Instant::now();
    let response = send_export(addr, "export-1").await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let (mut received, mut peak, mut first_byte) = (0usize, before, None);
    let mut expected = 0usize;
    let mut pending = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.expect("no error").into_data() else {
            continue;
        };
        first_byte.get_or_insert_with(|| started.elapsed());
        received += data.len();
        // Every byte in order: whole chunks, each holding its number.
        pending.extend_from_slice(&data);
        while pending.len() >= CHUNK {
            assert!(
                pending[..CHUNK]
                    .iter()
                    .all(|&b| b == (expected % 251) as u8),
                "chunk {expected} out of order"
            );
            pending.drain(..CHUNK);
            expected += 1;
        }
        if received % (8 * 1024 * 1024) < data.len() {
            peak = peak.max(resident());
        }
    }
    assert_eq!(received, CHUNKS * CHUNK);
    assert_eq!(expected, CHUNKS);
    let growth_mib = peak.saturating_sub(before) as f64 / (1024.0 * 1024.0);
    println!(
        "200 MB export through the layer: first byte after {:?}, all in {:?}, resident memory grew {growth_mib:.1} MiB",
        first_byte.unwrap_or_default(),
        started.elapsed()
    );
    // Buffered whole, it grew by the whole body (201 MiB measured); the
    // layer holds at most 16 MiB of it.
    assert!(growth_mib < 100.0, "grew {growth_mib:.1} MiB");

    let retry = send_export(addr, "export-1").await;
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()[REPLAYED_HEADER], "true");
    let problem = retry.into_body().collect().await.expect("body").to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&problem).expect("a problem");
    assert_eq!(
        problem["type"],
        "urn:lambda-idempotency:problem:idempotency-response-not-stored"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
