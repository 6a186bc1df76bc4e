//! The layer's cost per request without the network: the server
//! benchmark's app, bare and behind this crate's layer on the memory store,
//! driven by `oneshot` on one thread, timed in batches. A server's figures
//! move by microseconds from run to run with how the load and the kernel
//! interleave; these move by tens of nanoseconds, so two builds run in
//! turn (`inproc` of each, alternately) can be told apart by a microsecond.
//!
//! `inproc [batches] [requests per batch]` prints, for each app and for new
//! keys and replays, the median time per request over the batches (after
//! one batch not counted) and what the layer adds to the bare app's;
//! `INPROC_KEYS=distinct` (or `replays`) runs only those, and
//! `INPROC_APP=bare` (or `memory`, or `memory-encrypted`: the memory store
//! with responses sealed at rest under a raw key) only that app, for a
//! profile or a count.

use axum::{body::Body, extract::Json, routing::post, Router};
use lambda_idempotency::{
    encryption::{Encryption, RawKeys},
    http::IdempotencyLayer,
    Engine, MemoryStore,
};
use serde_json::{json, Value};
use std::time::Instant;
use tower::ServiceExt;

async fn charge(Json(order): Json<Value>) -> (axum::http::StatusCode, Json<Value>) {
    (
        axum::http::StatusCode::CREATED,
        Json(json!({ "id": "ch_1", "amount": order["amount"] })),
    )
}

fn app(name: &str) -> Router {
    let routes = Router::new().route("/v1/charges", post(charge));
    let engine = Engine::builder(MemoryStore::new());
    match name {
        "bare" => routes,
        "memory" => routes.layer(IdempotencyLayer::new(engine.build()).shared_scope()),
        "memory-encrypted" => routes.layer(
            IdempotencyLayer::new(
                engine
                    .encryption(Encryption::new(
                        RawKeys::new("bench", &[7; 32]).expect("a 32-byte key"),
                        "inproc",
                    ))
                    .build(),
            )
            .shared_scope(),
        ),
        other => panic!("unknown app {other}"),
    }
    .with_state(())
}

/// Nanoseconds per request of `requests` requests, keys numbered from
/// `first` (or all one key, `repeated`).
async fn batch(
    app: &Router,
    body: &bytes::Bytes,
    first: u64,
    requests: u64,
    repeated: bool,
) -> f64 {
    let started = Instant::now();
    for i in first..first + requests {
        let key = if repeated {
            "k".to_owned()
        } else {
            format!("k-{i}")
        };
        let request = axum::http::Request::post("/v1/charges")
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(Body::from(body.clone()))
            .expect("request");
        let response = app.clone().oneshot(request).await.expect("response");
        assert!(response.status().is_success(), "{}", response.status());
        axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
    }
    started.elapsed().as_nanos() as f64 / requests as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let batches: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
    let requests: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let body = bytes::Bytes::from(server_bench::json_body(1024));
    let mut medians = Vec::new();
    // `INPROC_KEYS=distinct` (or `replays`) runs only those: for a profile.
    let only = std::env::var("INPROC_KEYS").ok();
    // `INPROC_APP=bare` (or `memory`) runs only that app: for a profile of
    // each, side by side.
    let apps = std::env::var("INPROC_APP").ok();
    for (keys, repeated) in [("distinct", false), ("replays", true)] {
        if only.as_deref().is_some_and(|only| only != keys) {
            continue;
        }
        for name in ["bare", "memory", "memory-encrypted"] {
            if apps.as_deref().is_some_and(|apps| apps != name) {
                medians.push(0.0);
                continue;
            }
            let app = app(name);
            let mut times = Vec::new();
            for b in 0..=batches {
                let time = batch(&app, &body, b * requests, requests, repeated).await;
                if b > 0 {
                    times.push(time);
                }
            }
            let m = median(times) / 1000.0;
            println!("{name} {keys}: {m:.2} us per request");
            medians.push(m);
        }
        let [bare, memory, encrypted] = medians[medians.len() - 3..] else {
            unreachable!("three apps a row")
        };
        println!("layer over bare, {keys}: {:.2} us", memory - bare);
        println!(
            "encryption over memory, {keys}: {:.2} us",
            encrypted - memory
        );
    }
}
