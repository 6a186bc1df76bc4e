//! Lowercase hex of digests, as records store them.

use std::sync::Arc;

/// `bytes` in lowercase hex. `hex::encode` builds its string a character
/// at a time, which showed in every request's profile (a record id, a
/// fingerprint and an owner token each); this encodes a digest at a time.
pub(crate) fn lower_hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_lower_hex(&mut out, bytes);
    out
}

/// `prefix`'s parts, then `bytes` in lowercase hex, as one shared string:
/// written on the stack and allocated once, where a `String` made first
/// would be allocated twice (an `Arc<str>` cannot take a `String`'s
/// allocation over).
pub(crate) fn shared_lower_hex(prefix: &[&str], bytes: &[u8]) -> Arc<str> {
    let len = prefix.iter().map(|part| part.len()).sum::<usize>() + bytes.len() * 2;
    let mut buffer = [0; 192];
    let Some(text) = buffer.get_mut(..len) else {
        let mut text = String::with_capacity(len);
        for part in prefix {
            text.push_str(part);
        }
        push_lower_hex(&mut text, bytes);
        return Arc::from(text);
    };
    let mut at = 0;
    for part in prefix {
        text[at..at + part.len()].copy_from_slice(part.as_bytes());
        at += part.len();
    }
    write_digits(&mut text[at..], bytes);
    // Strings, then ASCII digits: the check cannot fail.
    Arc::from(std::str::from_utf8(text).unwrap_or_default())
}

/// Writes `bytes` in lowercase hex to the start of `digits` (twice as
/// long, or the rest is left as it is).
///
/// A nibble at a time from a table: `hex::encode_to_slice` walks its
/// output through iterator adapters, some twenty instructions a byte
/// (counted: about 1,600 a request, for the fingerprint, record id and
/// owner token together), where this takes a few.
fn write_digits(digits: &mut [u8], bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, byte) in digits.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xf)];
    }
}

/// Appends `bytes` in lowercase hex to `out`.
pub(crate) fn push_lower_hex(out: &mut String, bytes: &[u8]) {
    let mut buffer = [0; 64];
    for chunk in bytes.chunks(buffer.len() / 2) {
        let digits = &mut buffer[..chunk.len() * 2];
        write_digits(digits, chunk);
        // Hex digits are ASCII: the check cannot fail.
        out.push_str(std::str::from_utf8(digits).unwrap_or_default());
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_the_hex_crate() {
        for bytes in [&[][..], &[0], &[0xab, 0x01, 0xff], &[7; 32], &[0x5a; 77]] {
            assert_eq!(super::lower_hex(bytes), hex::encode(bytes));
            let prefixed = super::shared_lower_hex(&["p", "#"], bytes);
            assert_eq!(*prefixed, format!("p#{}", hex::encode(bytes)));
        }
        // Past the stack's room: built in a `String` first, the same.
        let long = "x".repeat(300);
        assert_eq!(
            *super::shared_lower_hex(&[&long, "#"], &[0xab; 32]),
            format!("{long}#{}", hex::encode([0xab; 32]))
        );
    }
}
