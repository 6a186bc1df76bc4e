//! The CPU that encryption adds to the engine's new and replayed request,
//! interleaved request by request: engines with encryption off, under a
//! raw key, and (feature `kms`) under a cached KMS data key take turns
//! (A, B, C, C, B, A, ...), each request timed on its own, so every arm
//! runs on the same heap, caches and clock frequency. A round is
//! `ITERATIONS` requests an arm; the figure is the distribution of the
//! rounds' differences from encryption off.
//!
//! `make bench-encryption` (or `cargo bench --bench encryption_rounds
//! --features kms`). `ROUNDS` (default 21), `ITERATIONS` (default
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

mod support;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// A JSON response of about `size` bytes (the same as `benches/encryption.rs`).
fn response(size: usize) -> serde_json::Value {
    let json = support::json_with_items(
        r#"{"id":"ch_1","amount":1250,"currency":"EUR","items":["#,
        size,
    );
    serde_json::from_str(&json).expect("json")
}

/// The arms: encryption off, raw keys, and (with the `kms` feature) a
/// KMS data key already cached, as every request between two KMS calls
/// finds it (the KMS API answered by aws-smithy-mocks, once).
fn arms() -> Vec<(&'static str, Engine<MemoryStore>)> {
    let raw = Encryption::new(
        RawKeys::new("2026-11", &[7; 32]).expect("key"),
        "prod/idempotency",
    );
    let mut arms = vec![
        ("plaintext", Engine::builder(MemoryStore::new()).build()),
        (
            "raw key",
            Engine::builder(MemoryStore::new()).encryption(raw).build(),
        ),
    ];
    #[cfg(feature = "kms")]
    arms.push((
        "KMS, cached",
        Engine::builder(MemoryStore::new())
            .encryption(kms::encryption())
            .build(),
    ));
    arms
}

#[cfg(feature = "kms")]
mod kms {
    use aws_sdk_kms::{
        operation::{decrypt::DecryptOutput, generate_data_key::GenerateDataKeyOutput},
        primitives::Blob,
        Client,
    };
    use aws_smithy_mocks::{mock, mock_client, RuleMode};
    use lambda_idempotency::encryption::{Encryption, KmsKeys};
    use std::time::Duration;

    const KEY: &str = "arn:aws:kms:us-east-1:111122223333:key/11111111-1111-1111-1111-111111111111";

    /// Encryption under KMS data keys that a round never renews.
    pub(super) fn encryption() -> Encryption {
        let generate = mock!(Client::generate_data_key).then_compute_output(|_| {
            GenerateDataKeyOutput::builder()
                .key_id(KEY)
                .plaintext(Blob::new(vec![9; 32]))
                .ciphertext_blob(Blob::new(vec![9; 184]))
                .build()
        });
        let decrypt = mock!(Client::decrypt).then_compute_output(|_| {
            DecryptOutput::builder()
                .key_id(KEY)
                .plaintext(Blob::new(vec![9; 32]))
                .build()
        });
        let client = mock_client!(aws_sdk_kms, RuleMode::MatchAny, &[&generate, &decrypt]);
        KmsKeys::builder(client, KEY, "prod/idempotency")
            .max_records(1 << 32)
            .max_age(Duration::from_secs(24 * 3600))
            .build()
            .expect("KMS keys")
            .encryption()
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

/// Nanoseconds per request for each arm: `iterations` requests each,
/// taking turns; new keys on fresh stores, or replays of one stored record
/// (read from the store: the engine keeps no cache).
fn round(
    runtime: &Runtime,
    value: &serde_json::Value,
    iterations: usize,
    replay: bool,
) -> Vec<f64> {
    let arms = arms();
    let keys: Vec<String> = (0..iterations).map(|i| format!("k{i}")).collect();
    runtime.block_on(async {
        if replay {
            for (_, engine) in &arms {
                request(engine, "replayed", value, false).await;
            }
        }
        let mut took = vec![Duration::ZERO; arms.len()];
        let forward: Vec<usize> = (0..arms.len()).collect();
        let backward: Vec<usize> = (0..arms.len()).rev().collect();
        for (i, key) in keys.iter().enumerate() {
            let key = if replay { "replayed" } else { key };
            // A, B, C then C, B, A: no arm always goes first.
            let order = if i % 2 == 0 { &forward } else { &backward };
            for &arm in order {
                took[arm] += request(&arms[arm].1, key, value, replay).await;
            }
        }
        took.iter()
            .map(|took| took.as_nanos() as f64 / iterations as f64)
            .collect()
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
    let runtime = Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    for size in sizes {
        let value = response(size);
        let stored = serde_json::to_vec(&value).expect("json").len();
        // Warm-up: the allocator, the caches, the cipher's key schedule.
        round(&runtime, &value, iterations / 4 + 1, false);
        round(&runtime, &value, iterations / 4 + 1, true);
        let names: Vec<&str> = arms().iter().map(|(name, _)| *name).collect();
        for (kind, replay) in [("new", false), ("replay", true)] {
            println!(
                "\n{stored} bytes of JSON, {kind}: {rounds} rounds of {iterations} requests an \
                 arm, taking turns; ns per request, and what each encrypted arm adds"
            );
            println!("round  {}", names.join("  "));
            let mut added = vec![Vec::new(); names.len()];
            for number in 1..=rounds {
                let took = round(&runtime, &value, iterations, replay);
                let mut line = format!("{number:>5}  {:>9.0}", took[0]);
                for (arm, ns) in took.iter().enumerate().skip(1) {
                    added[arm].push(ns - took[0]);
                    line += &format!("  {ns:>7.0} ({:+5.0})", ns - took[0]);
                }
                println!("{line}");
            }
            for (arm, added) in added.iter_mut().enumerate().skip(1) {
                let middle = median(added);
                let within = added.iter().filter(|ns| **ns <= 1_000.0).count();
                println!(
                    "{stored} bytes, {kind}, {}: added median {middle:+.0} ns, min {:+.0}, \
                     max {:+.0}; {within} of {} rounds at most +1,000 ns",
                    names[arm],
                    added[0],
                    added[added.len() - 1],
                    added.len(),
                );
            }
        }
    }
}
