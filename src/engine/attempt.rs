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
