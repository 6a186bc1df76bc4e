//! `Idempotency-Key` parsing: never panics; what it accepts is a key of 1 to
//! 255 printable ASCII characters; a bare token parses to itself and its
//! quoted form to the same key.
#![no_main]

use lambda_idempotency::http::{parse_key, MAX_KEY_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(key) = parse_key(data) else { return };
    assert!((1..=MAX_KEY_LEN).contains(&key.len()), "{key:?}");
    assert!(key.bytes().all(|b| (0x20..=0x7e).contains(&b)), "{key:?}");
    // Bare, a key holds no quote, and no comma: that is two keys, joined.
    if key.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b',') {
        assert_eq!(parse_key(key.as_bytes()).as_deref(), Ok(key.as_str()));
    }
    let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
    assert_eq!(parse_key(quoted.as_bytes()).as_deref(), Ok(key.as_str()));
});
