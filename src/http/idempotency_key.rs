//! Where a request's key comes from ([`KeySource`]), and what a key may
//! be: in a header, an RFC 8941 sf-string (`"…"`) or a bare token of
//! visible ASCII; from anywhere else, visible ASCII and spaces. 1 to 255
//! characters either way.

use crate::{
    fingerprint::{pointed, Pointed},
    InvalidJsonPointer, JsonPointer,
};
use bytes::Bytes;
use http::{HeaderName, Request};
use std::{fmt, sync::Arc};

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
    /// A key read from a JSON body is neither a string nor a number.
    NotText,
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
            KeyError::NotText => "the idempotency key in the body is neither a string nor a number",
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

/// Checks a key that did not come from a header (a [`KeySource::json_pointer`]
/// or [`KeySource::from_fn`] value): 1 to [`MAX_KEY_LEN`] characters of
/// visible ASCII or spaces, taken as they are (no quotes, no trimming).
pub fn check_key(key: &str) -> Result<&str, KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if !key.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err(KeyError::InvalidCharacter);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong);
    }
    Ok(key)
}

type ReadKey = Arc<dyn Fn(&Request<Bytes>) -> Option<String> + Send + Sync>;

/// Where an [`IdempotencyLayer`](super::IdempotencyLayer) reads each
/// request's key (Powertools' `event_key_jmespath`): a header (the default,
/// `Idempotency-Key`), a field of a JSON body, or any function of the
/// request.
///
/// Whatever the source, the key is checked as keys are (1 to 255
/// characters, see [`check_key`] and [`parse_key`]), and a missing or
/// invalid one is a `400` problem that names the source.
///
/// ```
/// use lambda_idempotency::http::KeySource;
///
/// // Stripe webhooks: the event's `id`, in the JSON body.
/// let stripe = KeySource::json_pointer("/id");
/// // GitHub webhooks: one delivery, one id.
/// let github = KeySource::header("x-github-delivery".parse()?);
/// // Shopify webhooks, through a function of the request.
/// let shopify = KeySource::from_fn("an `X-Shopify-Webhook-Id` header", |request| {
///     request.headers().get("x-shopify-webhook-id")?.to_str().ok().map(str::to_owned)
/// });
/// # let _ = (stripe, github, shopify);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct KeySource(pub(crate) Source);

#[derive(Clone)]
pub(crate) enum Source {
    Header(HeaderName),
    JsonPointer(String),
    Custom { place: String, read: ReadKey },
}

impl KeySource {
    /// The key is the value of header `name`: an sf-string or a bare token
    /// ([`parse_key`]); a header sent twice, or a list, is a `400`. The
    /// layer reads it before the body: a request without one is answered
    /// (or passed through, with an optional key) unread.
    pub fn header(name: HeaderName) -> Self {
        Self(Source::Header(name))
    }

    /// The key is the value at `pointer` (RFC 6901, for example `/id` or
    /// `/data/object/id`) in a JSON body, whatever its `Content-Type`: a
    /// string as it is, a number as its exact text (never rounded through a
    /// float: the 20-digit ids `98765432109876543210` and
    /// `98765432109876543211` are two keys). A body that is not JSON, holds
    /// a duplicate key, or has nothing at `pointer`, carries no key.
    ///
    /// # Panics
    ///
    /// When `pointer` is not a JSON pointer: `"id"` (without the leading
    /// `/`) would match nothing, and every request would count as keyless.
    /// It panics where the layer is built, in `main`;
    /// [`try_json_pointer`](KeySource::try_json_pointer) returns the error
    /// instead, for a pointer read from configuration.
    ///
    /// ```should_panic
    /// use lambda_idempotency::http::KeySource;
    ///
    /// let _ = KeySource::json_pointer("id"); // not "/id"
    /// ```
    #[track_caller]
    pub fn json_pointer(pointer: impl Into<String>) -> Self {
        match Self::try_json_pointer(pointer) {
            Ok(source) => source,
            Err(error) => panic!("{error}"),
        }
    }

    /// Like [`json_pointer`](KeySource::json_pointer), with an error for a
    /// `pointer` that is not one (RFC 6901): not empty and without a
    /// leading `/`, or with a `~` that is not `~0` or `~1`.
    pub fn try_json_pointer(pointer: impl Into<String>) -> Result<Self, InvalidJsonPointer> {
        JsonPointer::new(pointer)
            .map(|pointer| Self(Source::JsonPointer(pointer.as_str().to_owned())))
    }

    /// The key is what `read` returns for the request (its head and whole
    /// body), `None` when it carries none. `place` says where a client puts
    /// the key, in the `400` answers, for example ``"an `X-Shopify-Webhook-Id` header"``.
    pub fn from_fn(
        place: impl Into<String>,
        read: impl Fn(&Request<Bytes>) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Self(Source::Custom {
            place: place.into(),
            read: Arc::new(read),
        })
    }

    /// Where a client puts the key, as the problem answers say it.
    pub(crate) fn place(&self) -> String {
        match &self.0 {
            Source::Header(name) => format!("an `{name}` header"),
            Source::JsonPointer(pointer) => format!("a key at `{pointer}` in its JSON body"),
            Source::Custom { place, .. } => place.clone(),
        }
    }

    /// The key a request with a buffered body carries, for the sources that
    /// read more than a header.
    pub(crate) fn read(&self, request: &Request<Bytes>) -> Result<Option<String>, KeyError> {
        let value = match &self.0 {
            // Read before the body is.
            Source::Header(_) => return Ok(None),
            Source::JsonPointer(pointer) => match pointed(request.body(), pointer) {
                Pointed::Absent => return Ok(None),
                Pointed::Text(text) => text,
                Pointed::NotText => return Err(KeyError::NotText),
            },
            Source::Custom { read, .. } => match read(request) {
                Some(value) => value,
                None => return Ok(None),
            },
        };
        check_key(&value)?;
        Ok(Some(value))
    }
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Source::Header(name) => f.debug_tuple("Header").field(name).finish(),
            Source::JsonPointer(pointer) => f.debug_tuple("JsonPointer").field(pointer).finish(),
            Source::Custom { place, .. } => f
                .debug_struct("Custom")
                .field("place", place)
                .finish_non_exhaustive(),
        }
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
    fn json_pointers_are_checked_when_the_source_is_built() {
        // Which pointers are valid is JsonPointer's test; here, that the
        // key source checks them.
        assert!(KeySource::try_json_pointer("/data/object/id").is_ok());
        assert!(KeySource::try_json_pointer("id").is_err());
        let Err(panic) = std::panic::catch_unwind(|| KeySource::json_pointer("id")) else {
            panic!("json_pointer panics on a pointer that is not one");
        };
        assert!(crate::engine::panic_message(&*panic).contains("is not a JSON pointer"));
    }

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
    fn keys_from_elsewhere_are_checked_as_they_are() {
        assert_eq!(
            check_key("evt_1NG8Du2eZvKYlo2CUI79vXWy"),
            Ok("evt_1NG8Du2eZvKYlo2CUI79vXWy")
        );
        assert_eq!(check_key("a, \"quoted\" key"), Ok("a, \"quoted\" key"));
        assert_eq!(check_key(&"k".repeat(255)).map(str::len), Ok(255));
        assert_eq!(check_key(""), Err(KeyError::Empty));
        assert_eq!(check_key(&"k".repeat(256)), Err(KeyError::TooLong));
        assert_eq!(check_key("tab\there"), Err(KeyError::InvalidCharacter));
        assert_eq!(check_key("cl\u{e9}"), Err(KeyError::InvalidCharacter));
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
