//! [`Idempotency`]: what the middleware tells the caller about a response,
//! in the response's extensions.

use crate::IdempotencyKey;

/// What happened to a request the middleware keyed, on its response:
/// `response.extensions().get::<Idempotency>()`.
///
/// Every response to a keyed request carries it, the final `409`, `429` or
/// `503` the middleware stopped waiting on too, so the caller can send the
/// request again later with the same key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    pub(crate) key: IdempotencyKey,
    pub(crate) replayed: bool,
    pub(crate) attempts: u32,
}

impl Idempotency {
    /// The key every attempt sent.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// Whether the server answered with a stored response rather than
    /// running the request: it set the replay header
    /// (`Idempotent-Replayed: true`, [`replayed_header`](crate::IdempotencyMiddleware::replayed_header)).
    pub fn replayed(&self) -> bool {
        self.replayed
    }

    /// How many times this middleware passed the request on (1 when it
    /// was not retried). A retry layer inside this one makes attempts of
    /// its own that this does not count.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}
