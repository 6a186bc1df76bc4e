//! The `Idempotency-Key` header: an RFC 8941 sf-string (`"…"`) or a bare
//! token of visible ASCII, 1 to 255 characters.

use std::fmt;

/// The longest key accepted, in characters (Stripe's limit).
pub const MAX_KEY_LEN: usize = 255;

/// Why an `Idempotency-Key` header was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is empty (`""` or a blank header).
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`] characters.
    TooLong,
    /// The header holds bytes outside visible ASCII (control characters,
    /// spaces outside quotes, non-ASCII).
    InvalidCharacter,
    /// An sf-string with no closing quote, a bad escape, or text after the
    /// closing quote.
    MalformedString,
    /// The header appears more than once, or holds a comma-separated list
    /// (API Gateway HTTP APIs join a repeated header's values with commas).
    Repeated,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyError::Empty => "the idempotency key is empty",
            KeyError::TooLong => "the idempotency key is longer than 255 characters",
            KeyError::InvalidCharacter => {
                "the idempotency key may only hold visible ASCII characters (spaces only inside a quoted string)"
            }
            KeyError::MalformedString => {
                "the idempotency key is a malformed structured-field string (RFC 8941: \"...\" with \\\" and \\\\ escapes only)"
            }
            KeyError::Repeated => {
                "the idempotency key header appears more than once or holds a list of values (send exactly one key; a bare key cannot contain a comma, quote it if it must)"
            }
        })
    }
}

impl std::error::Error for KeyError {}

/// Parses one header value into the key it carries.
///
/// Accepts an RFC 8941 sf-string (`"8e03978e-40d5-43e8"`, with `\"` and
/// `\\` escapes, spaces allowed inside) or a bare token of visible ASCII
/// (`8e03978e-40d5-43e8`). Surrounding spaces (OWS) are ignored.
pub fn parse_key(value: &[u8]) -> Result<String, KeyError> {
    let value = value.trim_ascii();
    let key = match value.first() {
        None => return Err(KeyError::Empty),
        Some(b'"') => parse_sf_string(value)?,
        Some(_) => {
            // No token holds a comma (RFC 8941): two keys, joined.
            if value.contains(&b',') {
                return Err(KeyError::Repeated);
            }
            if !value.iter().all(u8::is_ascii_graphic) {
                return Err(KeyError::InvalidCharacter);
            }
            // Visible ASCII only: valid UTF-8 by construction.
            String::from_utf8_lossy(value).into_owned()
        }
    };
    match key.len() {
        0 => Err(KeyError::Empty),
        n if n > MAX_KEY_LEN => Err(KeyError::TooLong),
        _ => Ok(key),
    }
}

fn parse_sf_string(value: &[u8]) -> Result<String, KeyError> {
    let mut key = String::with_capacity(value.len());
    let mut bytes = value.iter().skip(1);
    loop {
        match bytes.next() {
            None => return Err(KeyError::MalformedString),
            Some(b'\\') => match bytes.next() {
                Some(&escaped @ (b'"' | b'\\')) => key.push(escaped as char),
                _ => return Err(KeyError::MalformedString),
            },
            Some(b'"') => break,
            Some(&b) if (0x20..=0x7e).contains(&b) => key.push(b as char),
            Some(_) => return Err(KeyError::InvalidCharacter),
        }
    }
    let rest: Vec<u8> = bytes.copied().collect();
    if rest.trim_ascii_start().first() == Some(&b',') {
        return Err(KeyError::Repeated);
    }
    if !rest.is_empty() {
        return Err(KeyError::MalformedString);
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_tokens_and_sf_strings() {
        assert_eq!(
            parse_key(b"8e03978e-40d5-43e8-bc93-6894a57f9324").unwrap(),
            "8e03978e-40d5-43e8-bc93-6894a57f9324"
        );
        assert_eq!(parse_key(b"\"8e03978e-40d5\"").unwrap(), "8e03978e-40d5");
        assert_eq!(parse_key(b"  key-1 \t").unwrap(), "key-1", "OWS is trimmed");
        assert_eq!(
            parse_key(br#""with space and \"quotes\" \\ ""#).unwrap(),
            r#"with space and "quotes" \ "#
        );
        assert_eq!(parse_key(b"a").unwrap(), "a");
        assert_eq!(parse_key(&[b'k'; 255]).unwrap().len(), 255);
        // A comma inside a quoted key is part of it.
        assert_eq!(parse_key(b"\"a,b\"").unwrap(), "a,b");
        // A token and the sf-string of the same characters are the same key.
        assert_eq!(parse_key(b"abc").unwrap(), parse_key(b"\"abc\"").unwrap());
    }

    #[test]
    fn rejects_everything_else() {
        let cases: &[(&[u8], KeyError)] = &[
            (b"", KeyError::Empty),
            (b"   ", KeyError::Empty),
            (b"\"\"", KeyError::Empty),
            (&[b'k'; 256], KeyError::TooLong),
            (b"two words", KeyError::InvalidCharacter),
            (b"tab\there", KeyError::InvalidCharacter),
            (b"nul\0", KeyError::InvalidCharacter),
            (b"del\x7f", KeyError::InvalidCharacter),
            ("cl\u{e9}".as_bytes(), KeyError::InvalidCharacter),
            ("\"cl\u{e9}\"".as_bytes(), KeyError::InvalidCharacter),
            (b"\"ctl\x01\"", KeyError::InvalidCharacter),
            (b"\"unterminated", KeyError::MalformedString),
            (b"\"bad \\n escape\"", KeyError::MalformedString),
            (b"\"trailing\"x", KeyError::MalformedString),
            (b"\"dangling\\", KeyError::MalformedString),
            (b"key-one,key-two", KeyError::Repeated),
            (b"key-one, key-two", KeyError::Repeated),
            (b"a,", KeyError::Repeated),
            (b"\"key-one\",\"key-two\"", KeyError::Repeated),
            (b"\"key-one\" , key-two", KeyError::Repeated),
        ];
        for (input, expected) in cases {
            assert_eq!(
                parse_key(input),
                Err(*expected),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
        let mut long = vec![b'"'];
        long.extend([b'k'; 256]);
        long.push(b'"');
        assert_eq!(parse_key(&long), Err(KeyError::TooLong));
    }
}
