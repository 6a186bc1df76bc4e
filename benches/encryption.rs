//! The CPU that encryption adds to a stored response: sealing a response
//! (on each completion) and opening it (on each replay from the store),
//! for 1 KB and 16 KB JSON responses; and the engine's new request and
//! replay on the in-memory store, with encryption off and on.
//!
//! `cargo bench --bench encryption --features encryption`. The issue's
//! target is at most 1 µs of added CPU for a 1 KB response.

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use lambda_idempotency::{
    encryption::{Encryption, RawKeys},
    store::{OwnerToken, Record, RecordId, Status},
    Attempt, Engine, Fingerprint, MemoryStore,
};
use std::{
    future::Future,
    hint::black_box,
    pin::pin,
    sync::atomic::{AtomicU64, Ordering},
    task::{Context, Poll, Waker},
};
use tokio::runtime::Runtime;

mod support;

/// A JSON response of about `size` bytes.
fn response(size: usize) -> Vec<u8> {
    support::json_with_items(
        r#"{"id":"ch_1","amount":1250,"currency":"EUR","items":["#,
        size,
    )
    .into_bytes()
}

/// A future that is ready at its first poll (raw keys never wait), run
/// without a runtime, so that the figure is the cipher's and the
/// envelope's, not a scheduler's.
fn now<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("raw keys never wait"),
    }
}

fn encryption() -> Encryption {
    Encryption::new(
        RawKeys::new("2026-11", &[7; 32]).expect("key"),
        "prod/idempotency",
    )
}

fn seal_open(c: &mut Criterion) {
    let encryption = encryption();
    let id = RecordId::new(
        "idempotency",
        "caller|POST /v1/charges",
        "0b4e7a0e-5fe1-4d5b-8c5e",
    );
    let fingerprint = Fingerprint::of_bytes(b"POST /v1/charges {\"amount\":1250}");
    let expiration_s = 1_800_000_000;
    let mut group = c.benchmark_group("encryption");
    for size in [1024usize, 16 * 1024] {
        let plaintext = response(size);
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(
            BenchmarkId::new("seal", size),
            &plaintext,
            |b, plaintext| {
                b.iter(|| {
                    now(encryption.seal_response(
                        &id,
                        &fingerprint,
                        expiration_s,
                        black_box(plaintext),
                    ))
                    .expect("sealed")
                })
            },
        );
        let sealed = now(encryption.seal_response(&id, &fingerprint, expiration_s, &plaintext))
            .expect("sealed")
            .expect("sealing");
        let record = Record {
            id: id.clone(),
            status: Status::Completed,
            owner: OwnerToken::from_stored("owner"),
            fingerprint: fingerprint.clone(),
            expiration_s,
            lease_until_ms: None,
            response: Some(sealed),
            created_at_ms: None,
            attempt: 1,
            first_started_ms: None,
            completed_at_ms: None,
        };
        assert_eq!(
            now(encryption.open_response(&record)).expect("opened"),
            Some(plaintext.clone())
        );
        // Includes the copy of the stored response that a replay reads
        // from the store anyway (open_response clones it; the engine opens
        // the record's own bytes in place).
        group.bench_with_input(BenchmarkId::new("open", size), &record, |b, record| {
            b.iter(|| now(encryption.open_response(black_box(record))).expect("opened"))
        });
        let uncompressed = encryption.clone().compress_above(usize::MAX);
        group.bench_with_input(
            BenchmarkId::new("seal, not deflated", size),
            &plaintext,
            |b, plaintext| {
                b.iter(|| {
                    now(uncompressed.seal_response(
                        &id,
                        &fingerprint,
                        expiration_s,
                        black_box(plaintext),
                    ))
                    .expect("sealed")
                })
            },
        );
        eprintln!(
            "{size} bytes of JSON sealed: {} bytes",
            record.response.as_ref().map_or(0, Vec::len)
        );
        group.bench_with_input(
            BenchmarkId::new("copy (baseline of open)", size),
            &record,
            |b, record| b.iter(|| black_box(record.response.clone())),
        );
    }
    group.finish();
}

/// The engine's first call and replay (from the store: no cache) with a
/// 1 KB value, encryption off and on: the difference is what a request
/// pays.
fn engine_requests(c: &mut Criterion) {
    let runtime = Runtime::new().expect("runtime");
    let value: serde_json::Value = serde_json::from_slice(&response(1024)).expect("json");
    let mut group = c.benchmark_group("engine 1 KB");
    for encrypted in [false, true] {
        let label = if encrypted { "encrypted" } else { "plaintext" };
        let builder = Engine::builder(MemoryStore::new());
        let engine = if encrypted {
            builder.encryption(encryption()).build()
        } else {
            builder.build()
        };
        let fingerprint = Fingerprint::of_bytes(b"payload");
        let counter = AtomicU64::new(0);
        group.bench_function(BenchmarkId::new("new", label), |b| {
            b.iter_batched(
                || format!("k{}", counter.fetch_add(1, Ordering::Relaxed)),
                |key| {
                    runtime.block_on(async {
                        let attempt = Attempt::new("s", &key, fingerprint.clone());
                        engine
                            .execute(&attempt, || async { Ok::<_, ()>(value.clone()) })
                            .await
                            .expect("new")
                    })
                },
                BatchSize::SmallInput,
            )
        });
        runtime.block_on(async {
            let attempt = Attempt::new("s", "replayed", fingerprint.clone());
            engine
                .execute(&attempt, || async { Ok::<_, ()>(value.clone()) })
                .await
                .expect("first");
        });
        group.bench_function(BenchmarkId::new("replay", label), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let attempt = Attempt::new("s", "replayed", fingerprint.clone());
                    let outcome = engine
                        .execute(&attempt, || async { Ok::<_, ()>(value.clone()) })
                        .await
                        .expect("replay");
                    assert!(outcome.is_replay());
                    outcome
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, seal_open, engine_requests);
criterion_main!(benches);
