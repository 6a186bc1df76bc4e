//! Stored HTTP responses: decoding arbitrary bytes never panics (nor
//! exhausts memory through a deflate bomb), and whatever decodes encodes
//! and decodes again to the same response.
#![no_main]

use lambda_idempotency::fuzzing::{decode_stored_response, encode_stored_response};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(response) = decode_stored_response(data) else { return };
    let encoded = encode_stored_response(&response).expect("a decoded response encodes");
    let again = decode_stored_response(&encoded).expect("and decodes");
    assert_eq!(again.status(), response.status());
    assert_eq!(again.body(), response.body());
    for (name, value) in again.headers() {
        assert!(response.headers().get_all(name).iter().any(|v| v == value));
    }
});
