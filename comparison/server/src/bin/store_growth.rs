//! `make bench-memory-store`: what a `MemoryStore` that keeps every
//! record costs as it grows, as a server's does for the hour its records
//! live: the process's resident memory per record kept, and the longest
//! claim and completion (the one that rebuilt the table, under the store's
//! lock, which every other request waits for). Records as the server
//! benchmark's: a 76-byte id, a 32-byte owner, a 64-byte fingerprint and
//! an 80-byte response. Counted on one thread, not timed under load.
//!
//!     store_growth [records]   (2,000,000 unless given)

use lambda_idempotency::{
    store::{Claim, Completion, OwnerToken, RecordId, Store},
    Fingerprint, MemoryStore,
};
use std::time::{Duration, Instant};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let records: usize = std::env::args()
        .nth(1)
        .and_then(|count| count.parse().ok())
        .unwrap_or(2_000_000);
    let store = MemoryStore::new();
    let owner = OwnerToken::generate().expect("an owner token");
    let fingerprint = Fingerprint::of_bytes(b"the request's payload");
    let response = vec![b'x'; 80];
    let now_ms = 1_800_000_000_000u64;
    let expiration_s = now_ms / 1000 + 3600;
    // The times are noted in memory touched before the store's is read.
    let mut each = vec![Duration::ZERO; records];
    let resident_before = resident_kb();
    let started = Instant::now();
    for i in 0..records {
        let id = RecordId::new("idempotency", "0: 0: POST /v1/charges", &format!("key-{i}"));
        let began = Instant::now();
        let claim = Claim {
            id: id.clone(),
            owner: owner.clone(),
            fingerprint: fingerprint.clone(),
            now_ms,
            lease_until_ms: now_ms + 30_000,
            expiration_s,
            attempt: 1,
            first_started_ms: now_ms,
        };
        store.claim(&claim).await.expect("claimed");
        let completion = Completion {
            id,
            owner: owner.clone(),
            response: response.clone(),
            now_ms,
            expiration_s,
            writes: vec![],
        };
        store.complete(completion).await.expect("completed");
        each[i] = began.elapsed();
    }
    let total = started.elapsed();
    let kept_kb = resident_kb().saturating_sub(resident_before);
    each.sort_unstable();
    let longest: Vec<String> = each.iter().rev().take(3).map(|took| ms(*took)).collect();
    println!(
        "{records} records kept: {:.0} bytes of resident memory each, {} in all, \
         longest claim and completion {} ms (then {}), median {:.2} us",
        (kept_kb * 1024) as f64 / records as f64,
        ms(total),
        longest[0],
        longest[1..].join(", "),
        each[records / 2].as_secs_f64() * 1e6,
    );
}

fn ms(took: Duration) -> String {
    format!("{:.0}", took.as_secs_f64() * 1e3)
}

/// The process's resident memory, in KiB (Linux).
fn resident_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}
