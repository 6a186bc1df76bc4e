//! JSON canonicalisation and request fingerprints: never panic; the
//! canonical form is a fixed point (canonicalising it again changes nothing),
//! means what the document means (serde_json reads the same value from
//! both), and a JSON body is fingerprinted by it.
#![no_main]

use lambda_http::{http, Body};
use lambda_idempotency::{
    fuzzing::{canonical, canonical_json},
    http::request_fingerprint,
    Fingerprint,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let request = |content_type: &str, body: &[u8]| {
        http::Request::post("/v1/charges")
            .header("content-type", content_type)
            .body(Body::Binary(body.to_vec()))
            .expect("request")
    };
    let json = request_fingerprint(&request("application/json", data));
    let raw = request_fingerprint(&request("application/octet-stream", data));
    assert_eq!(json.as_str().len(), 64);
    if let Some(canonical_form) = canonical(data) {
        // Since issue 22 the content type does not decide: a body that
        // parses as JSON is fingerprinted by its canonical form under any.
        assert_eq!(json, raw, "a JSON body is fingerprinted in canonical form whatever its content type");
        assert_eq!(canonical(&canonical_form).as_ref(), Some(&canonical_form), "a fixed point");
        let again = request_fingerprint(&request("application/json", &canonical_form));
        assert_eq!(json, again, "whitespace, key order and escapes do not change the fingerprint");
        // serde_json refuses numbers beyond an f64 (`54e444`), which have a
        // canonical form (their text): it reads both forms, or neither.
        let original = serde_json::from_slice::<serde_json::Value>(data).ok();
        let reparsed = serde_json::from_slice::<serde_json::Value>(&canonical_form).ok();
        assert_eq!(reparsed, original, "the canonical form means what the document means");
    }
    // The value path (scopes, events) is a fixed point too.
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let canonical = canonical_json(&value);
        let reparsed: serde_json::Value = serde_json::from_slice(&canonical).expect("parses");
        assert_eq!(canonical_json(&reparsed), canonical, "canonical form is a fixed point");
        assert_eq!(Fingerprint::of_json(&value).ok(), Fingerprint::of_json(&reparsed).ok());
    }
});
