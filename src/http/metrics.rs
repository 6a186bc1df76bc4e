//! The layer's outcomes, counted in CloudWatch Embedded Metric Format
//! ([`EmfMetrics`]), so operators see the dedup rate, conflicts and stuck
//! claims.

use crate::metrics::EmfMetrics;
use std::fmt;

/// What the layer did with one request: the `outcome` field of its
/// `tracing` span and the `Outcome` dimension of its metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HttpOutcome {
    /// The handler ran and its response was stored.
    Fresh,
    /// A stored response was replayed (from the store or the local cache).
    Replay,
    /// Another request with the key was in progress: 409.
    InProgress,
    /// The key was reused with another payload: 422.
    KeyReused,
    /// The handler ran, but its lease had passed and the key was taken over.
    LeaseLost,
    /// The store failed: 503 (or 500 for an unreadable record); the handler
    /// did not run.
    StoreError,
    /// The handler ran but its response could not be stored.
    NotRecorded,
    /// The handler's response was not to be stored (5xx, 408, 409, 425, 429
    /// by default), so the claim was released.
    Released,
    /// The handler returned an error; the claim was released.
    HandlerError,
    /// The key was missing or invalid: 400.
    BadKey,
    /// The request body was longer than the limit (413) or failed while
    /// it was read (400); the handler did not run.
    BadBody,
    /// The request was not subject to idempotency (method, or an optional
    /// key absent).
    PassThrough,
    /// The store was unavailable and the engine fails open: the handler ran
    /// unprotected.
    Unprotected,
    /// Idempotency is turned off (`IDEMPOTENCY_DISABLED`): the handler ran.
    Disabled,
    /// Outside Lambda, the layer has no way to name the caller (no
    /// `caller`, `scope` or `shared_scope`): 500, the handler did not run.
    ScopeUnset,
    /// [`max_in_flight`](super::IdempotencyLayer::max_in_flight) requests
    /// were running: 503, nothing claimed, the handler did not run.
    Overloaded,
}

impl HttpOutcome {
    /// A stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            HttpOutcome::Fresh => "fresh",
            HttpOutcome::Replay => "replay",
            HttpOutcome::InProgress => "in_progress",
            HttpOutcome::KeyReused => "key_reused",
            HttpOutcome::LeaseLost => "lease_lost",
            HttpOutcome::StoreError => "store_error",
            HttpOutcome::NotRecorded => "not_recorded",
            HttpOutcome::Released => "released",
            HttpOutcome::HandlerError => "handler_error",
            HttpOutcome::BadKey => "bad_key",
            HttpOutcome::BadBody => "bad_body",
            HttpOutcome::PassThrough => "pass_through",
            HttpOutcome::Unprotected => "unprotected",
            HttpOutcome::Disabled => "disabled",
            HttpOutcome::ScopeUnset => "scope_unset",
            HttpOutcome::Overloaded => "overloaded",
        }
    }
}

impl fmt::Display for HttpOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl EmfMetrics {
    /// One request's outcome: `IdempotentRequests`, dimension `Outcome`.
    pub(crate) fn record(&self, outcome: HttpOutcome) {
        self.count("IdempotentRequests", "Outcome", outcome.as_str());
    }
}
