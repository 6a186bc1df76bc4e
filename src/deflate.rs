//! Deflate for stored responses, written once for the three places that
//! compress one: the HTTP layer's frame, the DynamoDB store's large
//! responses, and a response deflated before it is sealed.
//!
//! Each keeps the deflated form only when it is smaller, and refuses to
//! inflate past a limit of its own: a stored value is read from a table
//! anyone with write access can edit, and a few KB of deflate can claim
//! gigabytes.

use std::io::{self, Read, Write};

pub(crate) use flate2::Compression;

/// `bytes` deflated at `level`, if that is smaller than `bytes`.
pub(crate) fn deflate(bytes: &[u8], level: Compression) -> Option<Vec<u8>> {
    let mut encoder =
        flate2::write::DeflateEncoder::new(Vec::with_capacity(bytes.len() / 2), level);
    encoder.write_all(bytes).ok()?;
    let compressed = encoder.finish().ok()?;
    (compressed.len() < bytes.len()).then_some(compressed)
}

/// `bytes` inflated, or an error if they are not deflate or inflate past
/// `limit` bytes (never more than `limit + 1` are produced).
pub(crate) fn inflate(bytes: &[u8], limit: u64) -> io::Result<Vec<u8>> {
    let mut inflated = Vec::with_capacity(bytes.len().saturating_mul(3));
    flate2::read::DeflateDecoder::new(bytes)
        .take(limit.saturating_add(1))
        .read_to_end(&mut inflated)?;
    if inflated.len() as u64 > limit {
        return Err(io::Error::other(format!("inflates past {limit} bytes")));
    }
    Ok(inflated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_smaller_form_is_kept_and_it_inflates_back() {
        let json = br#"{"id":"ch_1","amount":4200}"#.repeat(100);
        let deflated = deflate(&json, Compression::fast()).expect("repetitive JSON shrinks");
        assert!(deflated.len() < json.len());
        assert_eq!(inflate(&deflated, json.len() as u64).unwrap(), json);
        // Eight bytes of noise do not shrink.
        assert_eq!(
            deflate(
                &[0x8f, 0x1d, 0xe2, 0x47, 0x05, 0xb3, 0x6a, 0xc9],
                Compression::default()
            ),
            None
        );
    }

    #[test]
    fn a_value_that_inflates_past_its_limit_or_is_not_deflate_is_refused() {
        let zeros = vec![0u8; 1 << 20];
        let bomb = deflate(&zeros, Compression::best()).unwrap();
        assert_eq!(
            inflate(&bomb, zeros.len() as u64).unwrap().len(),
            zeros.len()
        );
        let error = inflate(&bomb, zeros.len() as u64 - 1).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("inflates past {} bytes", zeros.len() - 1)
        );
        assert!(inflate(b"not deflate", 1024).is_err());
    }
}
