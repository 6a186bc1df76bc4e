//! The layer's own CPU cost per request, on the in-memory store (no
//! network): first call, replay, mismatch and in progress, for 1 KB and
//! 64 KB JSON bodies; and key parsing and fingerprinting alone.
//!
//! `cargo bench --bench layer`; BENCHMARKS.md has the last figures.

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use lambda_http::{http, Body, Request, Response};
use lambda_idempotency::{
    http::{parse_key, request_fingerprint, IdempotencyLayer},
    store::{Claim, OwnerToken, Store},
    Engine, Fingerprint, MemoryStore,
};
use std::{
    hint::black_box,
    sync::atomic::{AtomicU64, Ordering},
};
use tokio::runtime::Runtime;
use tower::{service_fn, Layer, ServiceExt};

mod support;

/// A JSON object of about `size` bytes, with keys out of order.
fn json_body(size: usize) -> String {
    support::json_with_items(
        r#"{"currency":"EUR","amount":1250,"customer":"cus_42","items":["#,
        size,
    )
}

fn request(key: &str, body: &str) -> Request {
    http::Request::post("/v1/charges")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::Text(body.to_owned()))
        .expect("request")
}

fn layer_benches(c: &mut Criterion) {
    let runtime = Runtime::new().expect("runtime");
    let handler = service_fn(|_: Request| async {
        Ok::<_, lambda_http::Error>(
            Response::builder()
                .status(201)
                .header("content-type", "application/json")
                .body(Body::from(
                    r#"{"id":"ch_1","amount":1250,"currency":"EUR"}"#,
                ))
                .expect("response"),
        )
    });
    let mut group = c.benchmark_group("layer");
    for size in [1024usize, 64 * 1024] {
        let body = json_body(size);
        let other = body.replacen("1250", "9999", 1);
        group.throughput(Throughput::Bytes(body.len() as u64));
        let store = MemoryStore::new();
        let engine = Engine::builder(store.clone()).build();
        let service = IdempotencyLayer::new(engine.clone())
            .shared_scope()
            .layer(handler);
        let label = format!("{}KB", size / 1024);

        let next = AtomicU64::new(0);
        group.bench_function(BenchmarkId::new("first_call", &label), |b| {
            b.to_async(&runtime).iter_batched(
                || {
                    request(
                        &format!("new-{}", next.fetch_add(1, Ordering::Relaxed)),
                        &body,
                    )
                },
                |request| {
                    let service = service.clone();
                    async move { black_box(service.oneshot(request).await.expect("response")) }
                },
                BatchSize::SmallInput,
            )
        });

        runtime
            .block_on(service.clone().oneshot(request("replayed", &body)))
            .expect("first");
        group.bench_function(BenchmarkId::new("replay", &label), |b| {
            b.to_async(&runtime).iter_batched(
                || request("replayed", &body),
                |request| {
                    let service = service.clone();
                    async move { black_box(service.oneshot(request).await.expect("response")) }
                },
                BatchSize::SmallInput,
            )
        });

        group.bench_function(BenchmarkId::new("mismatch", &label), |b| {
            b.to_async(&runtime).iter_batched(
                || request("replayed", &other),
                |request| {
                    let service = service.clone();
                    async move { black_box(service.oneshot(request).await.expect("response")) }
                },
                BatchSize::SmallInput,
            )
        });

        let now = lambda_idempotency::Clock::now_ms(&lambda_idempotency::SystemClock);
        // Held by another invocation for the whole run.
        let claim = Claim {
            id: engine.record_id(
                &lambda_idempotency::http::default_scope(&request("held", &body)),
                "held",
            ),
            owner: OwnerToken::generate().expect("the OS random source"),
            fingerprint: request_fingerprint(&request("held", &body)),
            now_ms: now,
            lease_until_ms: now + 3_600_000,
            expiration_s: now / 1000 + 7200,
            attempt: 1,
            first_started_ms: now,
        };
        runtime.block_on(store.claim(&claim)).expect("claim");
        group.bench_function(BenchmarkId::new("in_progress", &label), |b| {
            b.to_async(&runtime).iter_batched(
                || request("held", &body),
                |request| {
                    let service = service.clone();
                    async move { black_box(service.oneshot(request).await.expect("response")) }
                },
                BatchSize::SmallInput,
            )
        });

        let fingerprint_request = request("k", &body);
        group.bench_function(BenchmarkId::new("fingerprint", &label), |b| {
            b.iter(|| black_box(request_fingerprint(black_box(&fingerprint_request))))
        });
        // The floor the fingerprint is measured against: the hash alone,
        // of the same bytes.
        group.bench_function(BenchmarkId::new("sha256_of_body", &label), |b| {
            b.iter(|| black_box(Fingerprint::of_bytes(black_box(body.as_bytes()))))
        });
    }
    group.finish();

    let mut keys = c.benchmark_group("key");
    keys.bench_function("parse_token", |b| {
        b.iter(|| parse_key(black_box(b"8e03978e-40d5-43e8-bc93-6894a57f9324")))
    });
    keys.bench_function("parse_sf_string", |b| {
        b.iter(|| parse_key(black_box(br#""8e03978e-40d5-43e8-bc93-6894a57f9324""#)))
    });
    keys.bench_function("fingerprint_of_bytes_1KB", |b| {
        let bytes = vec![7u8; 1024];
        b.iter(|| Fingerprint::of_bytes(black_box(&bytes)))
    });
    keys.finish();
}

criterion_group!(benches, layer_benches);
criterion_main!(benches);
