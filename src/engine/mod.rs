//! The engine: claim, run, then complete or release.
//!
//! It decides everything from what the [`Store`](crate::store::Store) returns and never touches a
//! backend itself, so the same protocol runs on DynamoDB, PostgreSQL, Redis
//! and in memory. One request through [`Engine::run`]:
//!
//! 1. **cache** ([`replay`]): a completed record this process has seen
//!    answers without a store call;
//! 2. **claim** ([`claim`]): a conditional write of an `IN_PROGRESS` record
//!    under a fresh owner token; a lapsed claim is taken over; a refusal
//!    hands back the record that holds the key, which [`replay`] turns into
//!    a replay, a 422-style mismatch or an in-progress answer;
//! 3. **run** ([`lease`]): the operation, with its [`ClaimHandle`] and the
//!    heartbeat that extends the lease (optional, on by default where
//!    invocations outlive their deadlines: [`managed_instances`]);
//! 4. **complete or release** ([`completion`]): both fenced on the owner
//!    token, both retried on a conflict ([`conflicts`]).
//!
//! Every step that meets a record asks [`fence`](mod@fence) whose it is and whether
//! it may act on it, and every retry of a contended write counts against
//! the one policy in [`conflicts`]. The entry points are in [`execute`];
//! the loop they share is [`run`]; the engine's state is in [`state`].
//!
//! The loop holds the key under a lease, or inside a store's transaction
//! ([`holding`]; what the latter means is in [`in_transaction`]).
//! [`single_write`] is the protocol without a claim, for operations whose
//! only effects are the writes they return; [`split`] the protocol split across
//! invocations; [`local_runs`] the runs of this process, which answer (or
//! keep waiting) a duplicate in memory; [`operator`] holds what operators
//! call outside any request.

mod alert;
mod attempt;
mod builder;
mod cache;
mod claim;
mod claim_handle;
mod codec;
mod completer;
mod completion;
mod conflicts;
mod detach;
mod execute;
mod fence;
mod holding;
mod in_transaction;
mod lease;
mod local_runs;
mod managed_instances;
mod mode;
mod observed_store;
mod operator;
mod outcome;
mod panic;
mod replay;
mod report;
mod retry_after;
mod run;
mod sealing;
mod single_write;
mod split;
mod state;
mod steps;
mod table_size;

pub use crate::store::Takeover;
pub use attempt::Attempt;
#[cfg(feature = "http")]
pub(crate) use attempt::OwnedAttempt;
pub use builder::{
    default_key_prefix, BuildError, EngineBuilder, DEFAULT_KEY_PREFIX, DEFAULT_LEASE,
    DEFAULT_MAX_LEASE, DEFAULT_RETENTION, DISABLED_IN_LAMBDA_VARIABLE, DISABLED_VARIABLE,
    MAX_DURATION,
};
pub use claim_handle::ClaimHandle;
pub use completer::{AbandonedPolicy, Completer, CompleterReport, Settled, Settlement};
#[cfg(test)]
pub(crate) use conflicts::{CLAIM_TRIES, CONFLICT_TRIES};
#[cfg(any(feature = "http", feature = "consumers"))]
pub(crate) use managed_instances::transactions_at_once;
pub use managed_instances::{managed_instances_concurrency, MAX_CONCURRENCY_VARIABLE};

pub use codec::{Codec, Json};
#[cfg(feature = "http")]
pub(crate) use detach::detached;
pub use mode::Mode;
pub use operator::Forgotten;
pub use outcome::{Outcome, OutcomeKind, Replayed};
pub(crate) use panic::panic_message;
pub use state::Engine;
// Hints other than the lease come from the HTTP layer's route estimates.
#[cfg_attr(not(feature = "http"), allow(unused_imports))]
pub(crate) use retry_after::RetryHint;

#[cfg(all(test, feature = "encryption"))]
mod encryption_tests;
#[cfg(test)]
mod observe_tests;
#[cfg(test)]
mod steps_tests;
#[cfg(test)]
mod tests;
