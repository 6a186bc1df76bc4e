//! One attempt at an idempotent operation: who, which key, what payload,
//! and until when.

use super::retry_after::RetryHint;
use crate::{clock::epoch_ms, Fingerprint, Takeover};
use std::time::{Duration, SystemTime};

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
    /// What this attempt never does, whatever the engine allows.
    pub(crate) caution: Caution,
    pub(crate) taking_over: Option<Takeover>,
    /// What a duplicate that finds the key in progress is told to wait.
    pub(crate) retry_hint: RetryHint,
    pub(crate) wait_in_process: Option<Duration>,
    /// The port it came through, as the engine's observers are told.
    pub(crate) port: crate::observe::Port,
    /// Whether the engine reports its answer; not when the port asks the
    /// engine again and again for one answer (a wait for a duplicate's
    /// result), and reports that answer itself.
    pub(crate) reported: bool,
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
            caution: Caution::default(),
            taking_over: None,
            retry_hint: RetryHint::Lease,
            wait_in_process: None,
            port: crate::observe::Port::Engine,
            reported: true,
        }
    }

    /// The port this attempt came through, as the engine's
    /// [observers](crate::observe) are told ([`Port::Engine`](crate::observe::Port::Engine)
    /// by default; the crate's adapters set their own).
    pub fn port(mut self, port: crate::observe::Port) -> Self {
        self.port = port;
        self
    }

    /// This attempt follows one that began outside this crate's records
    /// and did not finish, **and may have acted** (a Powertools record
    /// found abandoned:
    /// [`PowertoolsFound::Abandoned`]).
    /// The operation is told so, as after a takeover of a lapsed claim of
    /// this crate's own: [`ClaimHandle::takeover`](crate::ClaimHandle::takeover)
    /// is `takeover` (or, when this crate's own claim was taken over since,
    /// that later takeover), and the claim's attempt numbers go on from
    /// `takeover.attempt`.
    #[cfg_attr(
        feature = "powertools",
        doc = "",
        doc = "[`PowertoolsFound::Abandoned`]: crate::powertools::PowertoolsFound::Abandoned"
    )]
    #[cfg_attr(
        not(feature = "powertools"),
        doc = "",
        doc = "[`PowertoolsFound::Abandoned`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/powertools/enum.PowertoolsFound.html#variant.Abandoned"
    )]
    pub fn taking_over(mut self, takeover: Takeover) -> Self {
        self.taking_over = Some(takeover);
        self
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
    /// Lambda), or any value before 2001 (`cargo lambda watch` sends its
    /// timeout, `600000`), means no deadline.
    pub fn deadline_ms(mut self, epoch_ms: u64) -> Self {
        self.deadline_ms = crate::clock::invocation_deadline_ms(epoch_ms);
        self
    }

    /// This attempt's answer is not reported by the engine: its port
    /// reports the answer it makes of several (see `reported`).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn unreported(mut self) -> Self {
        self.reported = false;
        self
    }

    /// While another attempt at this key runs **in this process** (a
    /// duplicate that reached the same server, or another worker of a
    /// Lambda Managed Instance), wait up to `budget` for its outcome, on
    /// the run itself: its replay as soon as it completes (or this attempt
    /// runs, if it released the key), [`Error::InProgress`](crate::Error::InProgress)
    /// if it still runs when the budget is spent. No store call is made
    /// while it waits. Without this (the default), such a duplicate is
    /// answered `Error::InProgress` at once, without a store call either. A
    /// run in another process is found in the store as before: this attempt
    /// is answered `Error::InProgress` at once (ask again as its
    /// `retry_after` says; the HTTP layer's `wait_for_result` does both).
    #[must_use]
    pub fn wait_in_process(mut self, budget: Duration) -> Self {
        self.wait_in_process = Some(budget);
        self
    }

    /// This attempt never runs without a claim, even on an engine built
    /// with [`fail_open`](crate::EngineBuilder::fail_open): a store outage
    /// at its claim is [`Error::Store`](crate::Error::Store). For the
    /// operations of a fail-open engine that something else runs again
    /// (a payment a client retries, a durable step's body that the SDK
    /// re-runs when its checkpoint was lost): a run with nothing recorded
    /// is a second effect waiting for that retry.
    #[must_use]
    pub fn fail_closed(mut self) -> Self {
        self.caution.fail_closed = true;
        self
    }

    /// An operation that panics keeps its claim until the lease passes
    /// (by default the claim is released, so that a retry runs at once, as
    /// Powertools deletes its record on any exception). For operations
    /// that may have acted before they panicked and that something runs
    /// again (a durable step's body, which the SDK re-runs): the next run
    /// waits out the lease and is then a [takeover](crate::ClaimHandle::takeover),
    /// told that an earlier attempt may have acted, rather than a fresh
    /// claim that cannot tell.
    #[must_use]
    pub fn keep_claim_on_panic(mut self) -> Self {
        self.caution.keep_claim_on_panic = true;
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
    caution: Caution,
    taking_over: Option<Takeover>,
    retry_hint: RetryHint,
    port: crate::observe::Port,
}

/// What an attempt never does, whatever its engine allows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Caution {
    /// Never run without a claim, even on an engine that fails open.
    pub(crate) fail_closed: bool,
    /// Keep the claim when the operation panics.
    pub(crate) keep_claim_on_panic: bool,
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
            caution: Caution::default(),
            taking_over: None,
            retry_hint: RetryHint::Lease,
            port: crate::observe::Port::Engine,
        }
    }

    /// What a duplicate that finds the key in progress is told to wait
    /// (default: the time left on the lease).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn retry_hint(mut self, hint: RetryHint) -> Self {
        self.retry_hint = hint;
        self
    }

    /// As [`Attempt::port`].
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn port(mut self, port: crate::observe::Port) -> Self {
        self.port = port;
        self
    }

    /// As [`Attempt::taking_over`], when `takeover` is `Some`.
    pub(crate) fn taking_over(mut self, takeover: Option<Takeover>) -> Self {
        self.taking_over = takeover;
        self
    }

    /// The attempt, borrowing from this one.
    pub(crate) fn attempt(&self) -> Attempt<'_> {
        Attempt {
            scope: &self.scope,
            key: &self.key,
            fingerprint: self.fingerprint.clone(),
            deadline_ms: self.deadline_ms,
            caution: self.caution,
            taking_over: self.taking_over,
            retry_hint: self.retry_hint,
            wait_in_process: None,
            port: self.port,
            reported: true,
        }
    }
}

impl From<&Attempt<'_>> for OwnedAttempt {
    fn from(attempt: &Attempt<'_>) -> Self {
        Self {
            caution: attempt.caution,
            retry_hint: attempt.retry_hint,
            port: attempt.port,
            ..Self::new(
                attempt.scope.to_owned(),
                attempt.key.to_owned(),
                attempt.fingerprint.clone(),
                attempt.deadline_ms,
            )
        }
        .taking_over(attempt.taking_over)
    }
}
