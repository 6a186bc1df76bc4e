//! Record ids: the scope and the client's key hashed together, so the raw
//! key is never stored and one scope can never reach another's records.
//! (The key a request brings is the HTTP layer's `idempotency_key`; a key
//! derived from another is `child_key`.)

use crate::fingerprint::hash_part;
use crate::lower_hex::shared_lower_hex;
use sha2::{Digest, Sha256};
use std::{fmt, sync::Arc};

/// The partition key of one idempotency record:
/// `<prefix>#<hex sha256 of scope and key>`.
///
/// The scope is length-prefixed before hashing, so `("ab", "c")` and
/// `("a", "bc")` never share a record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RecordId(Arc<str>);

impl RecordId {
    /// The id of `key` inside `scope`, under `prefix`.
    pub fn new(prefix: &str, scope: &str, key: &str) -> Self {
        let mut hasher = Sha256::new();
        hash_part(&mut hasher, scope.as_bytes());
        hasher.update(key.as_bytes());
        Self(shared_lower_hex(&[prefix, "#"], &hasher.finalize()))
    }

    /// Wraps an id read back from a store.
    pub fn from_stored(id: impl Into<String>) -> Self {
        Self(Arc::from(id.into()))
    }

    /// Wraps one read back as text the store keeps: allocated once, where
    /// [`from_stored`](Self::from_stored) would make a `String` first.
    pub(crate) fn from_stored_text(id: &str) -> Self {
        Self(Arc::from(id))
    }

    /// The id as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_and_key_are_separated_unambiguously() {
        assert_ne!(RecordId::new("p", "ab", "c"), RecordId::new("p", "a", "bc"));
        assert_ne!(RecordId::new("p", "", "abc"), RecordId::new("p", "abc", ""));
    }

    #[test]
    fn id_is_prefixed_hex_and_never_holds_the_key() {
        let id = RecordId::new("charges", "tenant-a", "order-1234");
        let (prefix, hash) = id.as_str().split_once('#').expect("separator");
        assert_eq!(prefix, "charges");
        assert_eq!(hash.len(), 64);
        assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(!id.as_str().contains("order-1234"));
        assert_eq!(id, RecordId::new("charges", "tenant-a", "order-1234"));
    }
}
