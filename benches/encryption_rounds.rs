//! The CPU that encryption adds to the engine's new and replayed request,
//! interleaved request by request: one engine with encryption off and one
//! with it on take turns (off, on, on, off, ...), each request timed on its
//! own, so both arms run on the same heap, caches and clock frequency. A
//! round is `ITERATIONS` requests an arm; the figure is the distribution
//! of the rounds' differences.
//!
//! `make bench-encryption` (or `cargo bench --bench encryption_rounds
//! --features encryption`). `ROUNDS` (default 21), `ITERATIONS` (default
//! 20,000) and `SIZES` (the responses' sizes in bytes, default
//! `1024,1100`) set its length. The issue's target is at most 1 µs added
//! to a 1 KB request; `benches/encryption.rs` has criterion's figures of
//! sealing and opening alone.
//!
//! Why interleaved request by request rather than in blocks: with glibc's
//! allocator, a replay of a 1 KB JSON value costs about 7.3 µs or about
//! 9.1 µs depending on the heap's state (freeing a block that glibc's
//! per-thread cache does not take, over 1,032 bytes, can consolidate every
//! small block the JSON value left), in either arm. Timed in blocks, which
//! state each arm meets decides the difference (+0.1 µs or +2 µs for one
//! build); taking turns, both meet the same one.

use lambda_idempotency::{
    encryption::{Encryption, RawKeys},
    Attempt, Engine, Fingerprint, MemoryStore,
};
use std::{
    hint::black_box,
    time::{Duration, Instant},
};
use tokio::runtime::{Builder, Runtime};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// A JSON response of about `size` bytes (the same as `benches/encryption.rs`).
fn response(size: usize) -> serde_json::Value {
    let mut body = String::from(r#"{"id":"ch_1","amount":1250,"currency":"EUR","items":["#);
    let mut i = 0;
    while body.len() < size - 40 {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&format!(r#"{{"sku":"item-{i:05}","qty":{}}}"#, i % 7 + 1));
        i += 1;
    }
    body.push_str("]}");
    serde_json::from_str(&body).expect("json")
}

fn engine(encrypted: bool) -> Engine<MemoryStore> {
    let builder = Engine::builder(MemoryStore::new());
    if encrypted {
        builder
            .encryption(Encryption::new(
                RawKeys::new("2026-11", &[7; 32]).expect("key"),
                "prod/idempotency",
            ))
            .build()
    } else {
        builder.build()
    }
}

/// One request on `engine` for `key`, timed; `replay` says which outcome
/// it must have.
async fn request(
    engine: &Engine<MemoryStore>,
    key: &str,
    value: &serde_json::Value,
    replay: bool,
) -> Duration {
    let attempt = Attempt::new("s", key, Fingerprint::of_bytes(b"payload"));
    let started = Instant::now();
    let outcome = engine
        .execute(&attempt, || async { Ok::<_, ()>(value.clone()) })
        .await
        .expect("request");
    let took = started.elapsed();
    assert_eq!(outcome.is_replay(), replay);
    black_box(outcome);
    took
}

/// Nanoseconds per request with encryption off and on: `iterations`
/// requests each, taking turns; new keys on fresh stores, or replays of
/// one stored record (read from the store: the engine keeps no cache).
fn round(
    runtime: &Runtime,
    value: &serde_json::Value,
    iterations: usize,
    replay: bool,
) -> (f64, f64) {
    let arms = [engine(false), engine(true)];
    let keys: Vec<String> = (0..iterations).map(|i| format!("k{i}")).collect();
    runtime.block_on(async {
        if replay {
            for engine in &arms {
                request(engine, "replayed", value, false).await;
            }
        }
        let mut took = [Duration::ZERO; 2];
        for (i, key) in keys.iter().enumerate() {
            let key = if replay { "replayed" } else { key };
            // off, on, on, off: neither arm always goes first.
            let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
            for arm in order {
                took[arm] += request(&arms[arm], key, value, replay).await;
            }
        }
        let per_request = |took: Duration| took.as_nanos() as f64 / iterations as f64;
        (per_request(took[0]), per_request(took[1]))
    })
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len() % 2 == 1 {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter is not supported.
    let rounds = env_or("ROUNDS", 21).max(1);
    let iterations = env_or("ITERATIONS", 20_000).max(1);
    let sizes: Vec<usize> = std::env::var("SIZES")
        .unwrap_or_else(|_| "1024,1100".into())
        .split(',')
        .filter_map(|size| size.trim().parse().ok())
        .filter(|size| *size >= 64)
        .collect();
    let runtime = Builder::new_current_thread().build().expect("runtime");
    for size in sizes {
        let value = response(size);
        let stored = serde_json::to_vec(&value).expect("json").len();
        // Warm-up: the allocator, the caches, the cipher's key schedule.
        round(&runtime, &value, iterations / 4 + 1, false);
        round(&runtime, &value, iterations / 4 + 1, true);
        println!(
            "\n{stored} bytes of JSON; {rounds} rounds of {iterations} requests an arm, \
             taking turns; ns per request"
        );
        println!("round  new plain  new sealed  added  replay plain  replay opened  added");
        let (mut added_new, mut added_replay) = (Vec::new(), Vec::new());
        for number in 1..=rounds {
            let (new_plain, new_sealed) = round(&runtime, &value, iterations, false);
            let (replay_plain, replay_opened) = round(&runtime, &value, iterations, true);
            added_new.push(new_sealed - new_plain);
            added_replay.push(replay_opened - replay_plain);
            println!(
                "{number:>5}  {new_plain:>9.0}  {new_sealed:>10.0}  {:>+5.0}  {replay_plain:>12.0}  \
                 {replay_opened:>13.0}  {:>+5.0}",
                new_sealed - new_plain,
                replay_opened - replay_plain,
            );
        }
        for (name, added) in [("new", &mut added_new), ("replay", &mut added_replay)] {
            let middle = median(added);
            let within = added.iter().filter(|ns| **ns <= 1_000.0).count();
            println!(
                "{stored} bytes, {name}: added median {middle:+.0} ns, min {:+.0}, max {:+.0}; \
                 {within} of {} rounds at most +1,000 ns",
                added[0],
                added[added.len() - 1],
                added.len(),
            );
        }
    }
}
