//! How outcomes are turned into stored bytes and back.

use crate::{error::BoxError, StoreError, StoreErrorKind};
use serde::{de::DeserializeOwned, Serialize};

/// Encodes an operation's value for storage, and decodes it for a replay.
///
/// [`Engine::execute`](crate::Engine::execute) uses [`Json`]; the HTTP layer
/// has its own codec for responses (status, allowlisted headers, body).
pub trait Codec<T> {
    /// The bytes to store for `value`.
    fn encode(&self, value: &T) -> Result<Vec<u8>, BoxError>;
    /// The value stored as `bytes`.
    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError>;
}

/// Stores values as JSON with serde.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl<T: Serialize + DeserializeOwned> Codec<T> for Json {
    fn encode(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        Ok(serde_json::to_vec(value)?)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// The error for a value its codec could not encode, where it had to be
/// stored (its writes commit with it, or nothing does).
pub(crate) fn unserialisable(error: BoxError) -> StoreError {
    StoreError::new(
        StoreErrorKind::Other,
        "the operation's value could not be serialised for storage",
    )
    .with_source(error)
}
