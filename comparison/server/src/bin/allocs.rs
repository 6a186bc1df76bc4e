//! Heap allocations per request, counted (not timed, so the figure does not
//! move with the machine's noise): the server benchmark's app, bare and
//! behind this crate's layer on the memory store, 1,000 requests each in
//! one task, with new keys and with one repeated key. "Retained" are the
//! allocations still live after the requests: the records a server keeps,
//! which scatter long-lived chunks among every later request's.

use axum::{body::Body, extract::Json, routing::post, Router};
use lambda_idempotency::{http::IdempotencyLayer, Engine, MemoryStore};
use serde_json::{json, Value};
use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicI64, AtomicU64, Ordering},
};
use tower::ServiceExt;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static LIVE: AtomicI64 = AtomicI64::new(0);
static LARGE: AtomicU64 = AtomicU64::new(0);

/// glibc's per-thread cache holds chunks up to 1,032 bytes; a larger
/// request goes to the arena's bins and first merges every small free
/// chunk there (`malloc_consolidate`): a cost the count alone does not show.
const LARGEST_CACHED: usize = 1032;

fn count(size: usize) {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    BYTES.fetch_add(size as u64, Ordering::Relaxed);
    if size > LARGEST_CACHED {
        LARGE.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        LIVE.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's layout, as GlobalAlloc requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: allocated by `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        count(size);
        // SAFETY: as GlobalAlloc::realloc requires, passed on.
        unsafe { System.realloc(ptr, layout, size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

const REQUESTS: u64 = 1000;

async fn charge(Json(order): Json<Value>) -> (axum::http::StatusCode, Json<Value>) {
    (
        axum::http::StatusCode::CREATED,
        Json(json!({ "id": "ch_1", "amount": order["amount"] })),
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let body = server_bench::json_body(1024);
    println!("\nHeap allocations per request, {REQUESTS} requests each (counted, not timed)");
    println!("| server | keys | allocations | over 1,032 bytes | bytes allocated | retained allocations |");
    println!("|---|---|---|---|---|---|");
    for variant in ["bare", "memory"] {
        let routes = Router::new().route("/v1/charges", post(charge));
        let app = if variant == "memory" {
            routes.layer(
                IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build()).shared_scope(),
            )
        } else {
            routes
        }
        // As axum::serve has it: the layers applied once, not per request.
        .with_state(());
        for (keys, repeated) in [("distinct", false), ("repeated (replays)", true)] {
            let request = |i: u64| {
                let key = if repeated {
                    "k".to_owned()
                } else {
                    format!("k-{i}")
                };
                axum::http::Request::post("/v1/charges")
                    .header("content-type", "application/json")
                    .header("idempotency-key", key)
                    .body(Body::from(body.clone()))
                    .expect("request")
            };
            // The first request of a repeated key is not a replay.
            let first = app
                .clone()
                .oneshot(request(u64::MAX))
                .await
                .expect("response");
            axum::body::to_bytes(first.into_body(), usize::MAX)
                .await
                .expect("body");
            let before = (
                ALLOCATIONS.load(Ordering::Relaxed),
                BYTES.load(Ordering::Relaxed),
                LIVE.load(Ordering::Relaxed),
                LARGE.load(Ordering::Relaxed),
            );
            for i in 0..REQUESTS {
                let response = app.clone().oneshot(request(i)).await.expect("response");
                assert!(response.status().is_success(), "{}", response.status());
                axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .expect("body");
            }
            let per_request = |after: u64, before: u64| (after - before) as f64 / REQUESTS as f64;
            println!(
                "| {variant} | {keys} | {:.1} | {:.1} | {:.0} | {:.2} |",
                per_request(ALLOCATIONS.load(Ordering::Relaxed), before.0),
                per_request(LARGE.load(Ordering::Relaxed), before.3),
                per_request(BYTES.load(Ordering::Relaxed), before.1),
                (LIVE.load(Ordering::Relaxed) - before.2) as f64 / REQUESTS as f64,
            );
        }
    }
}
