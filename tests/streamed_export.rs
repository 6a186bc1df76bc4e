//! Streams through the layer under a real `axum::serve`, read by a real
//! HTTP client, beside the same app without the layer: a 200 MB export
//! streams (the layer holds at most what it could store), arrives whole and
//! in order, and its record completes as not stored, so a retry learns it
//! was processed and nothing runs again; a slow NDJSON stream reaches the
//! client row by row. Each prints its first byte and memory, with and
//! without the layer (the figures in BENCHMARKS.md).
//!
//! Alone in its binary, its tests one at a time: they read the process's
//! resident memory while the body streams, which other tests running beside
//! them would disturb.
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
    time::{Duration, Instant},
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

/// One test at a time: each reads the resident memory of the process.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `app` on a free loopback port, with or without the layer.
async fn serve(
    app: Router,
    layer: Option<IdempotencyLayer<DynamoDbStore>>,
) -> std::net::SocketAddr {
    let app = match layer {
        Some(layer) => app.layer(layer),
        None => app,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn layer() -> IdempotencyLayer<DynamoDbStore> {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    IdempotencyLayer::new(Engine::builder(DynamoDbStore::new(client, table)).build()).shared_scope()
}

/// The export, counting its runs.
fn export_app(runs: &Arc<AtomicUsize>) -> Router {
    let counter = Arc::clone(runs);
    Router::new().route(
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
}

/// Reads the whole export, checking every byte in order: its first byte,
/// its whole time, and how much the resident memory grew meanwhile (MiB).
async fn read_export(addr: std::net::SocketAddr, key: &str) -> (Duration, Duration, f64) {
    let before = resident();
    let started = Instant::now();
    let response = send_export(addr, key).await;
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
    (
        first_byte.unwrap_or_default(),
        started.elapsed(),
        growth_mib,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mb_export_streams_through_and_is_never_run_twice() {
    let _alone = ALONE.lock().await;
    let bare = serve(export_app(&Arc::new(AtomicUsize::new(0))), None).await;
    let (first_byte, all, growth_mib) = read_export(bare, "export-bare").await;
    println!(
        "200 MB export without the layer: first byte after {first_byte:?}, all in {all:?}, resident memory grew {growth_mib:.1} MiB"
    );

    let runs = Arc::new(AtomicUsize::new(0));
    let addr = serve(export_app(&runs), Some(layer().await)).await;
    let (first_byte, all, growth_mib) = read_export(addr, "export-1").await;
    println!(
        "200 MB export through the layer: first byte after {first_byte:?}, all in {all:?}, resident memory grew {growth_mib:.1} MiB"
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
    let detail = problem["detail"].as_str().expect("a detail");
    assert!(detail.contains("longer than can be stored"), "{detail}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Rows of the slow NDJSON export, and the gap before each after the first.
const ROWS: usize = 5;
const ROW_GAP: Duration = Duration::from_millis(400);

/// An NDJSON export of `ROWS` rows, one every `ROW_GAP`, without a length,
/// counting the rows written.
fn ndjson_app(written: &Arc<AtomicUsize>) -> Router {
    let written = Arc::clone(written);
    Router::new().route(
        "/v1/exports",
        post(move || {
            let written = Arc::clone(&written);
            async move {
                let rows = futures::stream::iter(0..ROWS).then(move |row| {
                    let written = Arc::clone(&written);
                    async move {
                        if row > 0 {
                            tokio::time::sleep(ROW_GAP).await;
                        }
                        written.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>(Bytes::from(format!("{{\"row\":{row}}}\n")))
                    }
                });
                (
                    [(header::CONTENT_TYPE, "application/x-ndjson")],
                    Body::from_stream(rows),
                )
            }
        }),
    )
}

/// Reads the NDJSON export: its first byte, and how many rows the handler
/// had written when the first arrived; then the rest, whole.
async fn read_ndjson(
    addr: std::net::SocketAddr,
    key: &str,
    written: &AtomicUsize,
) -> (Duration, usize, Bytes) {
    let started = Instant::now();
    let response = send_export(addr, key).await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = loop {
        let frame = body.frame().await.expect("a row").expect("no error");
        if let Ok(data) = frame.into_data() {
            break data;
        }
    };
    let first_byte = started.elapsed();
    let written_then = written.load(Ordering::SeqCst);
    let rest = body.collect().await.expect("the rest").to_bytes();
    (first_byte, written_then, [first, rest].concat().into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_ndjson_export_reaches_the_client_row_by_row() {
    let _alone = ALONE.lock().await;
    let written = Arc::new(AtomicUsize::new(0));
    let bare = serve(ndjson_app(&written), None).await;
    let (first_byte, _, _) = read_ndjson(bare, "ndjson-bare", &written).await;
    println!("slow NDJSON ({ROWS} rows, {ROW_GAP:?} apart) without the layer: first byte after {first_byte:?}");

    let written = Arc::new(AtomicUsize::new(0));
    let addr = serve(ndjson_app(&written), Some(layer().await)).await;
    let (first_byte, written_then, rows) = read_ndjson(addr, "ndjson-1", &written).await;
    println!("slow NDJSON ({ROWS} rows, {ROW_GAP:?} apart) through the layer: first byte after {first_byte:?}");
    // The first row came while the handler was still writing (a layer that
    // held the body would send it after the fifth).
    assert!(
        written_then < ROWS,
        "the first row came after all {ROWS} were written"
    );
    let expected: String = (0..ROWS)
        .map(|row| format!("{{\"row\":{row}}}\n"))
        .collect();
    assert_eq!(rows, expected.as_bytes());
}
