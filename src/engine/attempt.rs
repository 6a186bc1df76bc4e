//! One attempt at an idempotent operation: who, which key, what payload,
//! and until when.

use crate::{clock::epoch_ms, Fingerprint};
use std::time::SystemTime;

/// One attempt at an idempotent operation, as a client may retry it.
///
/// The scope names the caller and the operation (a tenant or principal and
/// a route, say): the same key in two scopes is two records. Take it from
/// trusted context, never from anything the client sends.
#[derive(Debug, Clone)]
pub struct Attempt<'a> {
    pub(crate) scope: &'a str,
    pub(crate) key: &'a str,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) deadline_ms: Option<u64>,
}

impl<'a> Attempt<'a> {
    /// An attempt with `key` inside `scope`, for a payload whose fingerprint
    /// is `fingerprint`.
    pub fn new(scope: &'a str, key: &'a str, fingerprint: Fingerprint) -> Self {
        Self {
            scope,
            key,
            fingerprint,
            deadline_ms: None,
        }
    }

    /// The time by which this attempt's invocation ends (in Lambda, the
    /// context's deadline): the claim's lease runs until then, capped by the
    /// engine's maximum lease.
    pub fn deadline(mut self, deadline: SystemTime) -> Self {
        self.deadline_ms = Some(epoch_ms(deadline));
        self
    }

    /// As [`deadline`](Attempt::deadline), in epoch milliseconds, the unit of
    /// `lambda_runtime::Context::deadline`. `0` (a default `Context`, outside
    /// Lambda) means no deadline.
    pub fn deadline_ms(mut self, epoch_ms: u64) -> Self {
        self.deadline_ms = (epoch_ms > 0).then_some(epoch_ms);
        self
    }

    /// The payload's fingerprint.
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }
}

/// An [`Attempt`] that owns its scope and key, to move onto a task of its
/// own (detached work outlives the borrow).
#[derive(Debug, Clone)]
pub(crate) struct OwnedAttempt {
    scope: String,
    key: String,
    fingerprint: Fingerprint,
    deadline_ms: Option<u64>,
}

impl OwnedAttempt {
    /// An attempt with `key` inside `scope`, until `deadline_ms` (epoch
    /// milliseconds) if there is one.
    pub(crate) fn new(
        scope: String,
        key: String,
        fingerprint: Fingerprint,
        deadline_ms: Option<u64>,
    ) -> Self {
        Self {
            scope,
            key,
            fingerprint,
            deadline_ms,
        }
    }

    /// The attempt, borrowing from this one.
    pub(crate) fn attempt(&self) -> Attempt<'_> {
        let attempt = Attempt::new(&self.scope, &self.key, self.fingerprint.clone());
        match self.deadline_ms {
            Some(deadline_ms) => attempt.deadline_ms(deadline_ms),
            None => attempt,
        }
    }
}

impl From<&Attempt<'_>> for OwnedAttempt {
    fn from(attempt: &Attempt<'_>) -> Self {
        Self::new(
            attempt.scope.to_owned(),
            attempt.key.to_owned(),
            attempt.fingerprint.clone(),
            attempt.deadline_ms,
        )
    }
}
