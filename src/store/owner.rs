//! The fencing token a claim is minted with.

use crate::lower_hex::lower_hex;
use crate::{StoreError, StoreErrorKind};

/// The fencing token of one claim: 128 random bits, minted per claim.
///
/// Completion and release are conditional on it, so an invocation whose
/// lease passed and was taken over (a zombie) cannot touch its successor's
/// record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OwnerToken(String);

impl OwnerToken {
    /// A fresh random token, from the operating system's random source.
    ///
    /// Fails when that source does: a fencing token made of guessable bits
    /// (the clock, an address) could let a zombie pass its successor's
    /// fence, so no claim is made and nothing runs (the engine reports a
    /// [`StoreErrorKind::Misconfigured`]
    /// error, never an unprotected run, even when it fails open).
    pub fn generate() -> Result<Self, StoreError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|error| {
            StoreError::new(
                StoreErrorKind::Misconfigured,
                format!("the operating system's random source failed ({error}): no fencing token could be minted, so nothing ran"),
            )
        })?;
        Ok(Self(lower_hex(&bytes)))
    }

    /// Wraps a token read back from a store.
    pub fn from_stored(token: impl Into<String>) -> Self {
        Self(token.into())
    }

    /// The token as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_tokens_are_distinct() {
        let a = OwnerToken::generate().unwrap();
        let b = OwnerToken::generate().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
    }
}
