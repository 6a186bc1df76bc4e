//! Child keys: the keys of a fan-out's downstream operations, derived from
//! the parent's key, so that a retry of the parent reaches each of them
//! with the same key.

use crate::fingerprint::hash_part;
use crate::lower_hex::lower_hex;
use sha2::{Digest, Sha256};

/// A child key for one downstream operation of a fan-out: deterministic, so
/// a retry of the parent (same key) reaches every downstream call with the
/// same child key, and distinct per `purpose`, so two downstream calls never
/// share one.
///
/// The result is 64 lowercase hex characters: a valid key for this crate,
/// for Stripe (at most 255 characters) and for the IETF header.
///
/// ```
/// use lambda_idempotency::derive_key;
///
/// let charge = derive_key("order-77", "charge-card");
/// let email = derive_key("order-77", "send-receipt");
/// assert_ne!(charge, email);
/// assert_eq!(charge, derive_key("order-77", "charge-card"));
/// ```
pub fn derive_key(parent: &str, purpose: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"lambda-idempotency child key\0");
    hash_part(&mut hasher, parent.as_bytes());
    hasher.update(purpose.as_bytes());
    lower_hex(&hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_keys_are_stable_distinct_and_unambiguous() {
        assert_eq!(derive_key("p", "a"), derive_key("p", "a"));
        assert_ne!(derive_key("p", "a"), derive_key("p", "b"));
        assert_ne!(derive_key("p", "a"), derive_key("q", "a"));
        assert_ne!(derive_key("ab", "c"), derive_key("a", "bc"));
        assert_eq!(derive_key("p", "a").len(), 64);
    }
}
