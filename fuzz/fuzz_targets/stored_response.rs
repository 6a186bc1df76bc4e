//! Stored HTTP responses: decoding arbitrary bytes never panics (nor
//! exhausts memory through a deflate bomb), and whatever decodes encodes
//! and decodes again to the same response.
#![no_main]

use lambda_idempotency::fuzzing::{decode_stored_response, encode_stored_response};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(response) = decode_stored_response(data) else { return };
    let (status, headers) = (response.status(), response.headers().clone());
    let body = format!("{:?}", response.body());
    let encoded = encode_stored_response(response).expect("a decoded response encodes");
    let again = decode_stored_response(&encoded).expect("and decodes");
    assert_eq!(again.status(), status);
    assert_eq!(format!("{:?}", again.body()), body);
    for (name, value) in again.headers() {
        assert!(headers.get_all(name).iter().any(|v| v == value));
    }
});
