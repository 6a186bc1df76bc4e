//! The request fingerprint's time beside SHA-256's of the same body, built
//! as the server benchmark is (release, not the crate's own fat-LTO
//! profile): the server's 1 KB JSON body, keys out of order (`sorted`: in
//! order), fingerprinted in a loop, three times.
//!
//! `fingerprint [iterations] [sorted]`; run two builds alternately to
//! compare them (BENCHMARKS.md, "The layer's CPU").

use lambda_idempotency::{http::request_fingerprint, Fingerprint};
use std::{hint::black_box, time::Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let iterations: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(300_000);
    let mut body = server_bench::json_body(1024);
    if args.next().as_deref() == Some("sorted") {
        // serde_json's map (without `preserve_order`) sorts its keys.
        let value: serde_json::Value = serde_json::from_str(&body).expect("json");
        body = value.to_string();
    }
    let request = axum::http::Request::post("/v1/charges")
        .header("content-type", "application/json")
        .body(bytes::Bytes::from(body.clone()))
        .expect("request");
    for _ in 0..3 {
        let started = Instant::now();
        for _ in 0..iterations {
            black_box(request_fingerprint(black_box(&request)));
        }
        let fingerprint = started.elapsed().as_nanos() as f64 / iterations as f64;
        let started = Instant::now();
        for _ in 0..iterations {
            black_box(Fingerprint::of_bytes(black_box(body.as_bytes())));
        }
        let sha = started.elapsed().as_nanos() as f64 / iterations as f64;
        println!("request fingerprint {fingerprint:.0} ns, SHA-256 of the body {sha:.0} ns");
    }
}
