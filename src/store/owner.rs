//! The fencing token a claim is minted with.

use crate::lower_hex::shared_lower_hex;
use crate::{StoreError, StoreErrorKind};
use rand::{rngs::StdRng, rngs::SysRng, Rng, SeedableRng};
use std::{cell::RefCell, sync::Arc};

/// The fencing token of one claim: 128 random bits, minted per claim.
///
/// Completion and release are conditional on it, so an invocation whose
/// lease passed and was taken over (a zombie) cannot touch its successor's
/// record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OwnerToken(Arc<str>);

/// Tokens a thread's generator mints before it is seeded again from the
/// operating system (64 KiB of its output, as `rand`'s `ThreadRng`).
const TOKENS_PER_SEED: u32 = 4096;

/// A thread's token generator: ChaCha12 (`rand`'s `StdRng`), seeded from
/// the operating system's random source, and the tokens it may still mint
/// before it is seeded again.
struct Generator {
    rng: StdRng,
    tokens_left: u32,
}

thread_local! {
    /// `None` until the thread's first token; seeded again, or tried
    /// again after a failure, whenever it has no tokens left.
    static GENERATOR: RefCell<Option<Generator>> = const { RefCell::new(None) };
}

impl OwnerToken {
    /// A fresh random token: 128 bits of a cryptographically secure
    /// generator (ChaCha12) that each thread seeds from the operating
    /// system's random source and seeds again every 4,096 tokens. A claim
    /// costs no system call (one to the source took about 0.37 us, where a
    /// token from the generator takes about 8 ns).
    ///
    /// Fails when that source does: a fencing token made of guessable bits
    /// (the clock, an address) could let a zombie pass its successor's
    /// fence, so no claim is made and nothing runs (the engine reports a
    /// [`StoreErrorKind::Misconfigured`]
    /// error, never an unprotected run, even when it fails open).
    ///
    /// A process that forks carries its threads' generators into the child;
    /// tokens minted on both sides of a `fork` could repeat. Tokio servers
    /// and Lambda functions do not fork after they start.
    pub fn generate() -> Result<Self, StoreError> {
        let mut bytes = [0u8; 16];
        GENERATOR.with_borrow_mut(|slot| {
            let generator = match slot {
                Some(generator) if generator.tokens_left > 0 => generator,
                _ => slot.insert(Generator {
                    rng: StdRng::try_from_rng(&mut SysRng).map_err(|error| {
                        StoreError::new(
                            StoreErrorKind::Misconfigured,
                            format!("the operating system's random source failed ({error}): no fencing token could be minted, so nothing ran"),
                        )
                    })?,
                    tokens_left: TOKENS_PER_SEED,
                }),
            };
            generator.tokens_left -= 1;
            generator.rng.fill_bytes(&mut bytes);
            Ok(())
        })?;
        Ok(Self(shared_lower_hex(&[], &bytes)))
    }

    /// Wraps a token read back from a store.
    pub fn from_stored(token: impl Into<String>) -> Self {
        Self(Arc::from(token.into()))
    }

    /// Wraps one read back as text the store keeps: allocated once, where
    /// [`from_stored`](Self::from_stored) would make a `String` first.
    pub(crate) fn from_stored_text(token: &str) -> Self {
        Self(Arc::from(token))
    }

    /// The token as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::HashSet;

    /// A thread's generator is seeded again once it has minted
    /// `TOKENS_PER_SEED` tokens, not before.
    #[test]
    fn the_generator_is_seeded_again_after_its_tokens() {
        let left = || GENERATOR.with_borrow(|slot| slot.as_ref().map(|g| g.tokens_left));
        std::thread::spawn(move || {
            assert_eq!(left(), None, "seeded only at the first token");
            OwnerToken::generate().unwrap();
            assert_eq!(left(), Some(TOKENS_PER_SEED - 1));
            for _ in 1..TOKENS_PER_SEED {
                OwnerToken::generate().unwrap();
            }
            assert_eq!(left(), Some(0));
            OwnerToken::generate().unwrap();
            assert_eq!(left(), Some(TOKENS_PER_SEED - 1), "seeded again");
        })
        .join()
        .unwrap();
    }

    /// Tokens across seedings of one thread's generator, and across
    /// threads (each seeded on its own), never repeat.
    #[test]
    fn owner_tokens_are_distinct_across_seedings_and_threads() {
        let mint = || {
            (0..TOKENS_PER_SEED * 2 + 7)
                .map(|_| OwnerToken::generate().unwrap().0)
                .collect::<Vec<_>>()
        };
        let other = std::thread::spawn(mint);
        let mut seen = HashSet::new();
        for token in mint().into_iter().chain(other.join().unwrap()) {
            assert_eq!(token.len(), 32);
            assert!(token.bytes().all(|byte| byte.is_ascii_hexdigit()));
            assert!(seen.insert(token), "a token repeated");
        }
    }
}
