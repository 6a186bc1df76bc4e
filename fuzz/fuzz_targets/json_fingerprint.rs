//! JSON canonicalisation and request fingerprints: never panic; the
//! canonical form is a fixed point (canonicalising it again changes nothing)
//! and parses back to the same value.
#![no_main]

use lambda_http::{http, Body};
use lambda_idempotency::{fuzzing::canonical_json, http::request_fingerprint, Fingerprint};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let request = |content_type: &str| {
        http::Request::post("/v1/charges")
            .header("content-type", content_type)
            .body(Body::Binary(data.to_vec()))
            .expect("request")
    };
    let json = request_fingerprint(&request("application/json"));
    let raw = request_fingerprint(&request("application/octet-stream"));
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        assert_eq!(json.as_str().len(), 64);
        return;
    };
    assert_ne!(json, raw, "a JSON body is fingerprinted in canonical form, apart from raw bytes");
    let canonical = canonical_json(&value);
    let reparsed: serde_json::Value = serde_json::from_slice(&canonical).expect("canonical JSON parses");
    assert_eq!(reparsed, value);
    assert_eq!(canonical_json(&reparsed), canonical, "canonical form is a fixed point");
    assert_eq!(Fingerprint::of_json(&value).ok(), Fingerprint::of_json(&reparsed).ok());
    let again = request_fingerprint(
        &http::Request::post("/v1/charges")
            .header("content-type", "application/json")
            .body(Body::Binary(canonical))
            .expect("request"),
    );
    assert_eq!(json, again, "whitespace and key order do not change the fingerprint");
});
