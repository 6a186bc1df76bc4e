//! What an idempotent execution hands back.

/// The value an idempotent execution produced, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome<T> {
    value: T,
    kind: OutcomeKind,
    replayed: Option<Replayed>,
}

/// What is known of the record a replay came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Replayed {
    /// When the original request completed, epoch milliseconds (`None`
    /// for records written before it was stored).
    pub completed_at_ms: Option<u64>,
    /// When the record expires, epoch seconds: retries after that run
    /// again.
    pub expiration_s: u64,
    /// Which attempt completed it (more than 1 after a takeover).
    pub attempt: u32,
    /// Whether it came from the warm process's cache.
    pub cached: bool,
}

impl<T> Outcome<T> {
    pub(crate) fn new(value: T, kind: OutcomeKind) -> Self {
        Self {
            value,
            kind,
            replayed: None,
        }
    }

    pub(crate) fn replay(value: T, replayed: Replayed) -> Self {
        let kind = if replayed.cached {
            OutcomeKind::CachedReplay
        } else {
            OutcomeKind::Replay
        };
        Self {
            value,
            kind,
            replayed: Some(replayed),
        }
    }

    /// For a replay, what is known of the record it came from.
    pub fn replayed(&self) -> Option<&Replayed> {
        self.replayed.as_ref()
    }

    /// The operation's value, fresh or replayed.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// Takes the value out.
    pub fn into_value(self) -> T {
        self.value
    }

    /// Where the value came from.
    pub fn kind(&self) -> OutcomeKind {
        self.kind
    }

    /// Whether the value is a replay of an earlier execution (from the store
    /// or the local cache), which a response should mark as such.
    pub fn is_replay(&self) -> bool {
        matches!(self.kind, OutcomeKind::Replay | OutcomeKind::CachedReplay)
    }
}

/// Where an [`Outcome`]'s value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OutcomeKind {
    /// The operation ran now and its outcome was stored.
    Fresh,
    /// The stored outcome of an earlier execution; nothing ran.
    Replay,
    /// As [`Replay`](OutcomeKind::Replay), served from the warm process's
    /// cache without a store call.
    CachedReplay,
    /// The operation ran now, but its lease had passed and another
    /// invocation took the key over before completion, so this outcome was
    /// not stored (the other invocation's record stands). Logged as a
    /// warning: the lease is shorter than the operation takes.
    LeaseLost,
    /// The operation ran now, but its outcome was not stored. When the
    /// value could not be encoded (its codec refused it, or panicked), the
    /// claim is held until the record would have expired, so no retry runs
    /// the operation again within the retention (retries are told it is in
    /// progress); when the store failed to take the completion, the claim
    /// stays until its lease passes, and a retry after that runs again.
    NotRecorded,
    /// The store was unavailable and the engine is configured to fail open:
    /// the operation ran without idempotency protection.
    Unprotected,
    /// Idempotency is turned off (`IDEMPOTENCY_DISABLED=true`, for local
    /// tests): the operation ran, and nothing was stored.
    Disabled,
}

impl OutcomeKind {
    /// A stable snake_case name, for log fields and metric dimensions.
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeKind::Fresh => "fresh",
            OutcomeKind::Replay => "replay",
            OutcomeKind::CachedReplay => "cached_replay",
            OutcomeKind::LeaseLost => "lease_lost",
            OutcomeKind::NotRecorded => "not_recorded",
            OutcomeKind::Unprotected => "unprotected",
            OutcomeKind::Disabled => "disabled",
        }
    }
}
