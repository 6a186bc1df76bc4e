//! The sequence many tests share: send, send the same again, and the
//! second answer must be a replay of the first.
//!
//! Included by path (`#[path = "support/replays.rs"] mod replays;`), not
//! from `support/mod.rs`: it reads HTTP responses, and the durable crate's
//! tests, which share `support`, have no HTTP types.

use lambda_idempotency::{Outcome, OutcomeKind};
use std::{fmt::Debug, future::Future};

/// An answer a test gets back: the engine's outcome, or the HTTP layer's
/// response.
pub trait Answer {
    /// Asserts that this answer is a replay of a stored outcome.
    fn assert_replayed(&self);
}

impl<T> Answer for Outcome<T> {
    fn assert_replayed(&self) {
        assert_eq!(self.kind(), OutcomeKind::Replay);
    }
}

impl<B> Answer for lambda_http::http::Response<B> {
    fn assert_replayed(&self) {
        assert_eq!(self.headers()["idempotent-replayed"], "true");
    }
}

/// Sends what `send` sends, then sends it again: the retry must be
/// answered with a replay. Returns both answers, the first's and the
/// replay, for what the test checks beyond that.
pub async fn sent_twice<A, E, Fut>(mut send: impl FnMut() -> Fut) -> (A, A)
where
    A: Answer,
    E: Debug,
    Fut: Future<Output = Result<A, E>>,
{
    let first = send().await.expect("answered");
    let replay = send().await.expect("replayed");
    replay.assert_replayed();
    (first, replay)
}
