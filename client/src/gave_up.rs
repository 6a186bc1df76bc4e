//! [`GaveUp`]: the error of a keyed request whose every attempt failed
//! before an answer came.

use crate::IdempotencyKey;
use std::fmt;

/// A keyed request that got no response: each attempt failed in transport
/// (the connection refused, reset or closed before the answer, a timeout),
/// and the middleware stopped, after
/// [`max_attempts`](crate::IdempotencyMiddleware::max_attempts) (set above
/// 1), or after the only attempt a streamed body allows. With
/// `max_attempts(1)` the failure is returned as it is, for a retry layer
/// outside this one to classify.
///
/// The middleware returns it as `reqwest_middleware::Error::Middleware`;
/// [`source`](std::error::Error::source) is the last attempt's
/// `reqwest::Error`. The server may have run the request: send it again
/// with [`key`](Self::key) to get its result.
///
/// ```
/// # fn check(error: reqwest_middleware::Error) {
/// use lambda_idempotency_client::GaveUp;
///
/// if let reqwest_middleware::Error::Middleware(error) = &error {
///     if let Some(gave_up) = error.downcast_ref::<GaveUp>() {
///         eprintln!("try again later with key {}", gave_up.key());
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct GaveUp {
    pub(crate) key: IdempotencyKey,
    pub(crate) attempts: u32,
    pub(crate) body_replayable: bool,
    pub(crate) last: reqwest::Error,
}

impl GaveUp {
    /// The key every attempt sent.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// How many attempts this middleware made.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether the request's body could be sent again (`false` for a
    /// streamed body, which is sent once).
    pub fn body_replayable(&self) -> bool {
        self.body_replayable
    }
}

impl fmt::Display for GaveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.body_replayable {
            write!(
                f,
                "no response after {} attempts with Idempotency-Key {}",
                self.attempts, self.key
            )
        } else {
            write!(
                f,
                "no response, and the request's body is a stream that cannot be sent again: \
                 send it again with Idempotency-Key {}",
                self.key
            )
        }
    }
}

impl std::error::Error for GaveUp {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.last)
    }
}
