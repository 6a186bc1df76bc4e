//! [`StoredBody`]: a response body as the layer stores and replays it.

/// A response body as the layer stores and replays it, and builds its own
/// problems in: empty, UTF-8 text, or binary. The kind is kept through the
/// store, so a `lambda_http` function replays text as text and binary as
/// base64, as it first answered; any other body type gets the bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoredBody {
    /// No body.
    #[default]
    Empty,
    /// A body that is UTF-8 text.
    Text(String),
    /// Any other body.
    Binary(Vec<u8>),
}

impl StoredBody {
    /// `bytes` as text when they are UTF-8, else binary; empty when there
    /// are none.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        if bytes.is_empty() {
            return StoredBody::Empty;
        }
        match String::from_utf8(bytes) {
            Ok(text) => StoredBody::Text(text),
            Err(error) => StoredBody::Binary(error.into_bytes()),
        }
    }

    /// The body's bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        match self {
            StoredBody::Empty => Vec::new(),
            StoredBody::Text(text) => text.into_bytes(),
            StoredBody::Binary(bytes) => bytes,
        }
    }
}

impl AsRef<[u8]> for StoredBody {
    fn as_ref(&self) -> &[u8] {
        match self {
            StoredBody::Empty => &[],
            StoredBody::Text(text) => text.as_bytes(),
            StoredBody::Binary(bytes) => bytes,
        }
    }
}

impl From<&str> for StoredBody {
    fn from(text: &str) -> Self {
        StoredBody::Text(text.to_owned())
    }
}

impl From<String> for StoredBody {
    fn from(text: String) -> Self {
        StoredBody::Text(text)
    }
}

#[cfg(feature = "lambda")]
impl From<StoredBody> for lambda_http::Body {
    fn from(body: StoredBody) -> Self {
        match body {
            StoredBody::Empty => lambda_http::Body::Empty,
            StoredBody::Text(text) => lambda_http::Body::Text(text),
            StoredBody::Binary(bytes) => lambda_http::Body::Binary(bytes),
        }
    }
}

#[cfg(feature = "lambda")]
impl From<lambda_http::Body> for StoredBody {
    fn from(body: lambda_http::Body) -> Self {
        match body {
            lambda_http::Body::Empty => StoredBody::Empty,
            lambda_http::Body::Text(text) => StoredBody::Text(text),
            lambda_http::Body::Binary(bytes) => StoredBody::Binary(bytes),
            #[allow(unreachable_patterns)]
            other => StoredBody::Binary(other.to_vec()),
        }
    }
}
