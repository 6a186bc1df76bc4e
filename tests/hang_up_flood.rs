//! A flood of clients that send a request and hang up, against a real
//! `axum::serve` on a loopback port: the layer's bound on running work
//! ([`IdempotencyLayer::max_in_flight`]) holds the handlers left running to
//! the bound, the memory they hold with them, and every request it refused
//! claimed nothing, so its retry runs once.
//!
//! On its own in this test binary: it reads the process's resident memory
//! (`VmRSS` in `/proc/self/status`), which another test would move. The
//! memory store needs no server.

use axum::{body::Bytes, http::HeaderMap, routing::post, Router};
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use lambda_idempotency::{http::IdempotencyLayer, Engine, MemoryStore};
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};
use tokio::{io::AsyncWriteExt, net::TcpStream, sync::watch};

/// The bound under test: small beside the flood.
const BOUND: usize = 64;
const CLIENTS: usize = 2_000;
/// Clients connected at once while the flood runs.
const AT_ONCE: usize = 200;
const BODY_BYTES: usize = 64 * 1024;

/// What the handler saw: runs per key, handlers running now and at most.
#[derive(Default)]
struct Seen {
    runs: Mutex<HashMap<String, usize>>,
    running: AtomicUsize,
    most: AtomicUsize,
}

/// `POST /v1/orders`: counts its run for the key, holds the body (as a
/// handler that works on it does) and waits until `open` is true.
fn app(
    layer: IdempotencyLayer<MemoryStore>,
    seen: &Arc<Seen>,
    open: watch::Receiver<bool>,
) -> Router {
    let seen = Arc::clone(seen);
    Router::new()
        .route(
            "/v1/orders",
            post(move |headers: HeaderMap, body: Bytes| {
                let seen = Arc::clone(&seen);
                let mut open = open.clone();
                async move {
                    let key = headers["idempotency-key"].to_str().unwrap_or("").to_owned();
                    *seen.runs.lock().unwrap().entry(key).or_default() += 1;
                    let now = seen.running.fetch_add(1, Ordering::SeqCst) + 1;
                    seen.most.fetch_max(now, Ordering::SeqCst);
                    let _ = open.wait_for(|open| *open).await;
                    seen.running.fetch_sub(1, Ordering::SeqCst);
                    (
                        axum::http::StatusCode::CREATED,
                        format!("{} bytes", body.len()),
                    )
                }
            }),
        )
        .layer(layer)
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line")
}

/// Sends the whole request and hangs up without reading an answer.
async fn send_and_hang_up(addr: SocketAddr, key: &str, body: &[u8]) {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return;
    };
    let head = format!(
        "POST /v1/orders HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/octet-stream\r\n\
         idempotency-key: {key}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    if stream.write_all(head.as_bytes()).await.is_ok() && stream.write_all(body).await.is_ok() {
        // Long enough for the server to read the request, as a client that
        // gives up after a moment does.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One request through hyper's client, read to the end: status, headers,
/// body.
async fn send(addr: SocketAddr, key: &str, body: &[u8]) -> (u16, HeaderMap, String) {
    let stream = TcpStream::connect(addr).await.expect("connects");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let request = hyper::Request::post("/v1/orders")
        .header("host", addr.to_string())
        .header("idempotency-key", key)
        .header("content-type", "application/octet-stream")
        .body(Full::new(Bytes::copy_from_slice(body)))
        .expect("request");
    let response = sender.send_request(request).await.expect("a response");
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.expect("the body").to_bytes();
    (
        parts.status.as_u16(),
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

/// Waits until `done` holds, checking every 10 ms, at most 30 s (a bound
/// against a hang, not a timing the test asserts).
async fn until(mut done: impl FnMut() -> bool) {
    for _ in 0..3_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hang_up_flood_runs_at_most_the_bound_and_every_refused_request_retries_once() {
    let engine = Engine::builder(MemoryStore::new()).build();
    let layer = IdempotencyLayer::new(engine.clone())
        .shared_scope()
        .max_in_flight(BOUND);
    let in_flight = layer.in_flight();
    assert_eq!(in_flight.limit(), BOUND);
    let seen = Arc::new(Seen::default());
    let (open, gate) = watch::channel(false);
    let addr = serve(app(layer, &seen, gate)).await;
    let body = vec![b'x'; BODY_BYTES];

    // Warm: the runtime's threads, the allocator's arenas, the connection
    // paths, before the baseline.
    open.send_replace(true);
    for n in 0..50 {
        let (status, _, _) = send(addr, &format!("warm-{n}"), &body).await;
        assert_eq!(status, 201);
    }
    open.send_replace(false);
    let before_kib = rss_kib();

    // The flood: every client sends 64 KiB and hangs up; the handlers it
    // starts wait behind the gate, so whatever is admitted stays running.
    futures::stream::iter(0..CLIENTS)
        .for_each_concurrent(AT_ONCE, |n| {
            let body = &body;
            async move { send_and_hang_up(addr, &format!("flood-{n}"), body).await }
        })
        .await;
    until(|| seen.running.load(Ordering::SeqCst) >= BOUND).await;
    let full_kib = rss_kib();
    println!(
        "RSS: {before_kib} KiB before the flood of {CLIENTS}, {full_kib} KiB with {} running",
        in_flight.len()
    );
    assert_eq!(in_flight.len(), BOUND, "the work running, clients gone");
    assert_eq!(seen.running.load(Ordering::SeqCst), BOUND);

    // A request over the bound: 503, a second to wait, its own problem
    // type, and no record for its key.
    let (status, headers, problem) = send(addr, "over", &body).await;
    assert_eq!(status, 503, "{problem}");
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(headers["content-type"], "application/problem+json");
    let problem: serde_json::Value = serde_json::from_str(&problem).expect("problem json");
    assert_eq!(
        problem["type"],
        "urn:lambda-idempotency:problem:idempotency-overloaded"
    );
    // Records: the warm-up's 50 and the admitted ones, no other.
    assert_eq!(engine.store().records().len(), 50 + BOUND);

    // The gate opens: the admitted work finishes, the count drains to 0.
    open.send_replace(true);
    assert!(in_flight.wait(Duration::from_secs(30)).await, "drained");
    assert_eq!(in_flight.len(), 0);
    let drained_kib = rss_kib();
    let admitted = seen
        .runs
        .lock()
        .unwrap()
        .keys()
        .filter(|k| k.starts_with("flood-"))
        .count();

    // Every key again, read to the end this time, a few at once (under the
    // bound): each ran exactly once over both rounds, the admitted ones
    // replayed, the refused ones run now as first requests.
    let replays = AtomicUsize::new(0);
    let keys: Vec<String> = (0..CLIENTS)
        .map(|n| format!("flood-{n}"))
        .chain(["over".to_owned()])
        .collect();
    futures::stream::iter(&keys)
        .for_each_concurrent(16, |key| {
            let (body, replays) = (&body, &replays);
            async move {
                let (status, headers, text) = send(addr, key, body).await;
                assert_eq!(status, 201, "{key}: {text}");
                if headers.contains_key("idempotent-replayed") {
                    replays.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
        .await;
    let runs = seen.runs.lock().unwrap();
    for key in &keys {
        assert_eq!(runs.get(key), Some(&1), "{key} ran once");
    }
    assert_eq!(replays.load(Ordering::SeqCst), admitted);
    assert!(seen.most.load(Ordering::SeqCst) <= BOUND);

    println!("RSS: {drained_kib} KiB after the drain ({admitted} of {CLIENTS} were admitted)");
    // Flat: the bound's 64 handlers hold 4 MiB of bodies; 2,000 would hold
    // 125 MiB. A margin for the allocator and the flood's own clients,
    // which run in this process.
    assert!(
        full_kib.saturating_sub(before_kib) < 48 * 1024,
        "{before_kib} KiB -> {full_kib} KiB"
    );
    assert!(
        drained_kib.saturating_sub(before_kib) < 48 * 1024,
        "{before_kib} KiB -> {drained_kib} KiB"
    );
}
