//! [`IdempotencyKey`]: the one key of a logical request, given by the
//! caller or generated.

use std::fmt;

/// The longest key this crate sends, in characters (Stripe's limit, and
/// the `lambda-idempotency` server's).
pub const MAX_KEY_LEN: usize = 255;

/// The `Idempotency-Key` of one logical request: every attempt the
/// middleware (or a retry layer around it) makes sends this same key.
///
/// Give one per request through the request's extensions, or let the
/// middleware generate one (a random UUID v4):
///
/// ```
/// use lambda_idempotency_client::IdempotencyKey;
///
/// let key = IdempotencyKey::new("order-1234-charge").expect("a valid key");
/// assert_eq!(key.as_str(), "order-1234-charge");
/// assert!(IdempotencyKey::new("").is_err());
/// ```
///
/// The middleware reads it back from the response too, in
/// [`Idempotency::key`](crate::Idempotency::key).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a key was refused by [`IdempotencyKey::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidKey {
    /// The key is empty.
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`] characters.
    TooLong,
    /// The key holds something other than visible ASCII (a space, a control
    /// character, a non-ASCII character).
    InvalidCharacter,
}

impl fmt::Display for InvalidKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InvalidKey::Empty => "the idempotency key is empty",
            InvalidKey::TooLong => "the idempotency key is longer than 255 characters",
            InvalidKey::InvalidCharacter => {
                "the idempotency key may only hold visible ASCII characters"
            }
        })
    }
}

impl std::error::Error for InvalidKey {}

impl IdempotencyKey {
    /// A key of your own: 1 to [`MAX_KEY_LEN`] visible ASCII characters
    /// (a header value every server accepts, bare, as Stripe's are).
    pub fn new(key: impl Into<String>) -> Result<Self, InvalidKey> {
        let key = key.into();
        if key.is_empty() {
            Err(InvalidKey::Empty)
        } else if key.len() > MAX_KEY_LEN {
            Err(InvalidKey::TooLong)
        } else if !key.bytes().all(|byte| byte.is_ascii_graphic()) {
            Err(InvalidKey::InvalidCharacter)
        } else {
            Ok(Self(key))
        }
    }

    /// A random UUID v4 (122 random bits from the operating system), as
    /// Stripe recommends: keys of different requests never meet.
    pub fn generate() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)?;
        // RFC 9562: version 4 in the high nibble of byte 6, variant 0b10 in
        // the high bits of byte 8.
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        let mut text = String::with_capacity(36);
        for (index, byte) in bytes.iter().enumerate() {
            if matches!(index, 4 | 6 | 8 | 10) {
                text.push('-');
            }
            text.push(char::from(HEX[usize::from(byte >> 4)]));
            text.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
        Ok(Self(text))
    }

    /// The key.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyKey").field(&self.0).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_uuid_v4_and_differ() {
        let (a, b) = (
            IdempotencyKey::generate().unwrap(),
            IdempotencyKey::generate().unwrap(),
        );
        assert_ne!(a, b);
        let text = a.as_str();
        assert_eq!(text.len(), 36);
        assert_eq!(
            text.split('-').map(str::len).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert_eq!(&text[14..15], "4");
        assert!(matches!(&text[19..20], "8" | "9" | "a" | "b"));
        assert!(IdempotencyKey::new(text).is_ok());
    }

    #[test]
    fn keys_of_ones_own_are_checked() {
        assert_eq!(IdempotencyKey::new(""), Err(InvalidKey::Empty));
        assert_eq!(
            IdempotencyKey::new("a".repeat(256)),
            Err(InvalidKey::TooLong)
        );
        assert!(IdempotencyKey::new("a".repeat(255)).is_ok());
        assert_eq!(
            IdempotencyKey::new("a b"),
            Err(InvalidKey::InvalidCharacter)
        );
        assert_eq!(
            IdempotencyKey::new("clé"),
            Err(InvalidKey::InvalidCharacter)
        );
    }
}
