//! Lowercase hex of digests, as records store them.

/// `bytes` in lowercase hex. `hex::encode` builds its string a character
/// at a time, which showed in every request's profile (a record id, a
/// fingerprint and an owner token each); this encodes into one buffer.
pub(crate) fn lower_hex(bytes: &[u8]) -> String {
    let mut out = vec![0; bytes.len() * 2];
    // Fails only on a buffer of the wrong length, and the hex digits are
    // ASCII: neither fallback is ever taken.
    if hex::encode_to_slice(bytes, &mut out).is_err() {
        return hex::encode(bytes);
    }
    String::from_utf8(out).unwrap_or_else(|_| hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_the_hex_crate() {
        for bytes in [&[][..], &[0], &[0xab, 0x01, 0xff], &[7; 32]] {
            assert_eq!(super::lower_hex(bytes), hex::encode(bytes));
        }
    }
}
