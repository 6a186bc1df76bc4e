//! Idempotent AWS Lambda durable functions, on
//! [lambda-idempotency](https://docs.rs/lambda-idempotency) (**preview**:
//! this crate follows the AWS Durable Execution SDK for Rust,
//! `aws-durable-execution-sdk` 0.1, which is in preview, and may change
//! with it in a minor release; a new preview of the SDK is a release of
//! this crate only, built on the engine's
//! [`lambda_idempotency::split`] calls).
//!
//! A durable function suspends (on a `wait`, a callback, a retry delay)
//! and is invoked again, and its code replays from the start, completed
//! steps answered from their checkpoints. An idempotent handler that claims
//! its key in the first invocation finds its own `IN_PROGRESS` record in
//! every replay: Powertools answered "already in progress" to its own
//! replays until both of its ports learnt to let a replay pass. Here:
//!
//! - **The claim is a durable step.** The first invocation claims the key;
//!   its decision (run, or replay this output) is checkpointed, so replays
//!   never read the store again and always decide the same. The claim's
//!   owner token is derived from the execution ARN, so an invocation that
//!   crashed between writing the claim and checkpointing it is recognised
//!   by the next one as the same execution's, not as a duplicate.
//! - **A duplicate execution** (another execution name, the same key)
//!   gets the first one's output without running, or fails with the error
//!   type `IdempotencyAlreadyInProgress` while the first runs; with
//!   [`wait_while_in_progress`](DurableIdempotency::wait_while_in_progress)
//!   it waits instead (a durable wait: suspended, not billed) and then
//!   replays the first one's output. The same key with another payload
//!   fails with `IdempotencyKeyReused`.
//! - **The record is completed once**, at the end, with the handler's
//!   output, in a step of its own (a store outage is tried again in a
//!   later invocation, for about an hour); a handler that returns an
//!   error releases it, so that a new execution may run the key.
//! - **Effects inside steps, at most once**
//!   ([`step`](DurableIdempotency::step)): the SDK's default step semantics
//!   (`AtLeastOncePerRetry`) run a step's body again when its invocation
//!   ended after the body's side effect and before its checkpoint. The
//!   helper keys the body by the execution ARN and the step's name, so its
//!   effect runs once and a re-execution gets the stored result.
//!
//! ```no_run
//! use aws_durable_execution_sdk::{self as sdk, BoxError, DurableContext};
//! use lambda_idempotency::{DynamoDbStore, Engine};
//! use lambda_idempotency_durable::DurableIdempotency;
//! use serde::{Deserialize, Serialize};
//! use std::time::Duration;
//!
//! #[derive(Serialize, Deserialize)]
//! struct Order { order_id: String, amount: u64 }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Receipt { charge: String }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), sdk::lambda_runtime::Error> {
//!     let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
//!     let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&config), "idempotency");
//!     let idempotency = DurableIdempotency::new(Engine::builder(store).build())
//!         .execution_timeout(Duration::from_secs(7 * 24 * 3600));
//!     let steps = idempotency.clone();
//!     sdk::run(idempotency.handler(
//!         |order: &Order| Some(order.order_id.clone()),
//!         move |order: Order, ctx: DurableContext| {
//!             let steps = steps.clone();
//!             async move {
//!                 let charge = steps
//!                     .step(&ctx, "charge-card", move || async move {
//!                         Ok::<_, BoxError>(format!("ch_{}", order.amount)) // the payment API
//!                     })
//!                     .await?;
//!                 ctx.wait(Duration::from_secs(3600)).name("cool-off").await?;
//!                 Ok::<_, BoxError>(Receipt { charge })
//!             }
//!         },
//!     ))
//!     .await
//! }
//! ```
//!
//! # What to know
//!
//! - The claim adds one step to the execution, first, and a wait per poll
//!   when waiting for a duplicate: durable operations are numbered by
//!   position, so turning idempotency on or off for executions already in
//!   flight makes their replays fail as non-deterministic. Deploy it to a
//!   new version.
//! - Waiting for a duplicate (`wait_while_in_progress`) polls after 1, 2,
//!   4… seconds, at most every 15 minutes: each poll is an invocation that
//!   replays the history.
//! - Nothing runs while an execution is suspended, so no heartbeat can
//!   renew its claim: the claim's lease is the
//!   [`execution_timeout`](DurableIdempotency::execution_timeout) (24 hours
//!   unless set; make it the function's `ExecutionTimeout`). An execution
//!   that outlives it can be taken over by a duplicate, which then runs
//!   too; its own completion is then refused (and logged).
//!   An invocation's deadline does not end it, so an invocation that runs
//!   past its deadline (Lambda Managed Instances do not stop one there)
//!   does not free the key either. A [`step`](DurableIdempotency::step)'s
//!   claim is the engine's, leased until the invocation's deadline: under
//!   Managed Instances the engine's heartbeat (on by default there, see
//!   [`EngineBuilder::heartbeat`](lambda_idempotency::EngineBuilder::heartbeat))
//!   keeps it while the body runs.
//! - The key comes from the input event, which is the same in every
//!   invocation (the envelope around it changes). The fingerprint is the
//!   whole input event, canonical JSON.
//! - Step names given to [`step`](DurableIdempotency::step) must be unique
//!   within an execution, child contexts and `map` items included (the SDK
//!   numbers steps by position and does not require it; the helper keys by
//!   name): a name used twice returns the first step's result without
//!   running. In a loop, a `map` item or a child context, put the item's
//!   index or id in the name. Inside `with_retry`, a helper step keeps its
//!   first result across the block's retries (its effect happened); name
//!   it per attempt if each attempt must act anew.
//! - An execution that the SDK ends without returning to the handler (a
//!   checkpoint refused for good, the execution's own timeout, a panic
//!   the runtime reports) cannot release its claim: the key stays claimed
//!   until `execution_timeout`, duplicates are told it is in progress, and
//!   an operator can free it (`Engine::forget_even_in_progress`, the
//!   tool's `forget --force`). Only a handler that returns an error
//!   releases it.
//! - Claims fail closed, on an engine built with
//!   [`fail_open`](lambda_idempotency::EngineBuilder::fail_open) too: the claim step
//!   tries a store outage (and a claim answered after its lease passed,
//!   which the engine gives back) again, five times in all, then fails the
//!   execution with `IdempotencyStoreError`; a [`step`](DurableIdempotency::step)'s
//!   body never runs without its claim (the step tries the outage again
//!   with backoff, five times in all, then fails with
//!   `IdempotencyStoreError`). A body run with nothing recorded would run
//!   again, unrecognised, when the SDK re-runs it after a lost checkpoint.
//! - The output is stored as JSON and replayed from it, so it must
//!   serialise and decode back to the same JSON (`f64::NAN` is written as
//!   `null`, which does not decode as a float; a map keyed by tuples does
//!   not serialise), and fit the store's item (DynamoDB: 400 KB). The
//!   execution that ran gets the output read back from that JSON, as its
//!   duplicates do (`Some(None)` is `None` to both). One that
//!   does not is returned but not stored (an error is logged), and its
//!   claim is kept, not released: the handler's effects happened, so
//!   duplicates are told it is in progress until `execution_timeout`, or
//!   until an operator frees the key (`forget --force`). The SDK, which
//!   serialises the output too, may then fail the execution. A step's
//!   result is checked the same way: one that cannot be stored is
//!   returned, its claim holds until its lease passes, and a later run
//!   of the body is a takeover.
//! - Lambda's own `DurableExecutionName` already makes a second `Invoke`
//!   with the same name return the first execution: this crate covers
//!   callers that cannot name executions, and keys that come from the
//!   payload (an order id, a message id).
//! - Stored outputs are checkpointed as the claim step's result when a
//!   duplicate replays them: keep them within the SDK's checkpoint size.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![warn(rust_2018_idioms, unreachable_pub)]

mod error;
mod output;

pub use error::DurableError;
use output::StorableJson;

use aws_durable_execution_sdk::{
    builders::StepBuilder, BoxError, DurableContext, RetryDecision, StepContext, StepError,
};
use lambda_idempotency::{
    derive_key,
    split::{self, SplitAttempt, SplitClaim},
    store::{OwnerToken, Store},
    Attempt, Engine, Error, Fingerprint, JsonRedaction,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::{future::Future, pin::Pin, sync::Arc, time::Duration};
use tracing::warn;

/// The name of the claim step in the execution's history.
pub const CLAIM_STEP: &str = "idempotency-claim";
/// The name of the step that completes the record with the output.
pub const COMPLETE_STEP: &str = "idempotency-complete";
/// The name of the waits for a duplicate's execution in progress.
pub const WAIT_STEP: &str = "idempotency-wait";
/// The scope of the records [`DurableIdempotency::step`] writes.
pub const STEP_SCOPE: &str = "durable-step";
/// The default lease of an execution's claim: 24 hours.
pub const DEFAULT_EXECUTION_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The longest wait between two checks of a duplicate in progress.
const MAX_POLL: Duration = Duration::from_secs(15 * 60);
/// How many times a call to the store is tried through an outage of it
/// (the claim step, a release, a step's body whose store call failed).
/// Not the engine's `CLAIM_TRIES`, which counts a claim's refusals.
const OUTAGE_TRIES: u32 = 5;
/// How many times a step's body is tried while another run holds its key.
const IN_PROGRESS_TRIES: u32 = 10;
/// The longest wait for another run's claim on a step: Lambda's longest
/// invocation.
const MAX_CLAIM_WAIT: Duration = Duration::from_secs(15 * 60);
/// How many times a step's body is tried on its own errors (the SDK's
/// default).
const OPERATION_TRIES: u32 = 6;

/// A boxed future of a step body, as [`DurableIdempotency::step`] builds
/// them.
pub type StepFuture<O> = Pin<Box<dyn Future<Output = Result<O, BoxError>> + Send>>;

/// A durable handler, as [`DurableIdempotency::handler`] returns it: what
/// `aws_durable_execution_sdk::run` takes.
pub type DurableHandlerFuture<O> = Pin<Box<dyn Future<Output = Result<O, BoxError>> + Send>>;

/// Makes durable executions idempotent: see the [crate docs](crate).
///
/// Cheap to clone; build it once in `main`.
#[derive(Debug)]
pub struct DurableIdempotency<St> {
    engine: Engine<St>,
    scope: Arc<str>,
    execution_timeout: Duration,
    wait_while_in_progress: Option<Duration>,
    redaction: Arc<JsonRedaction>,
}

impl<St> Clone for DurableIdempotency<St> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            scope: Arc::clone(&self.scope),
            execution_timeout: self.execution_timeout,
            wait_while_in_progress: self.wait_while_in_progress,
            redaction: Arc::clone(&self.redaction),
        }
    }
}

/// What the claim step decided, checkpointed so that every replay decides
/// the same without the store.
#[derive(Serialize, Deserialize)]
#[serde(tag = "decision", content = "output", rename_all = "snake_case")]
enum ClaimDecision<O> {
    Run,
    Replay(O),
    InProgress { retry_after_ms: u64 },
    KeyReused,
    Disabled,
}

impl<St: Store + Send + Sync + 'static> DurableIdempotency<St> {
    /// Executions claimed in `engine`'s store, under its key prefix, in
    /// the scope `durable`.
    pub fn new(engine: Engine<St>) -> Self {
        Self {
            engine,
            scope: Arc::from("durable"),
            execution_timeout: DEFAULT_EXECUTION_TIMEOUT,
            wait_while_in_progress: None,
            redaction: Arc::default(),
        }
    }

    /// The records' scope: keys of two scopes never share a record.
    #[must_use]
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Arc::from(scope.into());
        self
    }

    /// How long an execution's claim holds: the function's durable
    /// `ExecutionTimeout`. A suspended execution cannot renew its claim,
    /// so a duplicate may take over one that lives longer (24 hours unless
    /// set; at least a second, at most [`MAX_DURATION`](lambda_idempotency::MAX_DURATION)).
    /// The record is kept at least this long, and the engine's retention
    /// after it completes.
    #[must_use]
    pub fn execution_timeout(mut self, timeout: Duration) -> Self {
        self.execution_timeout = timeout;
        self
    }

    /// A duplicate execution that finds the key in progress waits for the
    /// first one, for up to `max_wait` in all, with durable waits (polling
    /// after 1, 2, 4… seconds, at most every 15 minutes, never billed while
    /// suspended), and then
    /// replays its output; it fails with `IdempotencyAlreadyInProgress`
    /// only when `max_wait` has passed. Without it, it fails at once.
    #[must_use]
    pub fn wait_while_in_progress(mut self, max_wait: Duration) -> Self {
        self.wait_while_in_progress = Some(max_wait);
        self
    }

    /// The record keeps the execution's output with the fields `redaction`
    /// names removed or replaced (a one-time secret, a full card number),
    /// and a duplicate execution gets it so, as a replay; the execution
    /// that ran gets its whole output. The redacted JSON must still read
    /// back as the output's type (remove `Option` fields and fields with
    /// `#[serde(default)]`; replace others with a value of their type):
    /// when it does not, the output is not stored, as one that does not
    /// serialise, and its claim holds the key until `execution_timeout`.
    ///
    /// This is the idempotency record only. The durable service keeps the
    /// execution's output, and every step's, in its own checkpoints (AWS's
    /// storage, under its keys), and [`step`](Self::step) records keep
    /// their outputs whole: a step's output is what the handler goes on
    /// with, and a redacted one would change what it does. Encrypt them
    /// with the engine's encryption instead.
    #[must_use]
    pub fn redact_json(mut self, redaction: JsonRedaction) -> Self {
        self.redaction = Arc::new(redaction);
        self
    }

    /// The engine the records are kept by.
    pub fn engine(&self) -> &Engine<St> {
        &self.engine
    }

    /// Wraps a durable handler: `key` finds the idempotency key in the
    /// input event (`None` fails the execution with
    /// `IdempotencyKeyMissing`), `handler` runs at most once per key. The
    /// result goes to `aws_durable_execution_sdk::run`.
    pub fn handler<E, O, K, H, Fut>(
        &self,
        key: K,
        handler: H,
    ) -> impl Fn(E, DurableContext) -> DurableHandlerFuture<O> + Send + Sync + 'static
    where
        E: Serialize + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        K: Fn(&E) -> Option<String> + Send + Sync + 'static,
        H: Fn(E, DurableContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, BoxError>> + Send + 'static,
    {
        let this = self.clone();
        let key = Arc::new(key);
        let handler = Arc::new(handler);
        move |event: E, ctx: DurableContext| {
            let this = this.clone();
            let key = Arc::clone(&key);
            let handler = Arc::clone(&handler);
            Box::pin(async move {
                let Some(key) = key(&event).filter(|key| !key.is_empty()) else {
                    return Err(DurableError::KeyMissing.into_boxed());
                };
                this.run(&ctx, &key, event, |event, ctx| handler(event, ctx))
                    .await
            })
        }
    }

    /// Runs `handler` at most once for `key`, from inside a durable
    /// handler: what [`handler`](Self::handler) does, for a key found
    /// otherwise. Call it first in the handler, with the same key in every
    /// invocation of the execution.
    pub async fn run<E, O, H, Fut>(
        &self,
        ctx: &DurableContext,
        key: &str,
        event: E,
        handler: H,
    ) -> Result<O, BoxError>
    where
        E: Serialize,
        O: Serialize + DeserializeOwned + Send + 'static,
        H: FnOnce(E, DurableContext) -> Fut,
        Fut: Future<Output = Result<O, BoxError>>,
    {
        if key.is_empty() {
            return Err(DurableError::KeyMissing.into_boxed());
        }
        let fingerprint =
            Fingerprint::of_json(&event).map_err(|e| DurableError::Event(e).into_boxed())?;
        let attempt = SplitAttempt::new(
            Arc::clone(&self.scope),
            key,
            fingerprint,
            execution_owner(ctx.execution_arn(), &self.scope, key),
            self.execution_timeout,
        );
        let mut waited = Duration::ZERO;
        let mut polls = 0u32;
        loop {
            let decision = match self.claim_step::<O>(ctx, &attempt).await {
                Ok(decision) => decision,
                Err(error) => {
                    // The claim may have landed before the step failed (its
                    // checkpoint refused): the execution is ending, so its
                    // claim must not hold the key until execution_timeout.
                    self.release(&attempt).await;
                    return Err(error);
                }
            };
            match decision {
                ClaimDecision::Run => break,
                ClaimDecision::Disabled => return handler(event, ctx.clone()).await,
                ClaimDecision::Replay(output) => return Ok(output),
                ClaimDecision::KeyReused => return Err(DurableError::KeyReused.into_boxed()),
                ClaimDecision::InProgress { retry_after_ms } => {
                    let retry_after = Duration::from_millis(retry_after_ms);
                    // Every poll replays the whole history: doubling keeps a
                    // long wait to a few dozen invocations.
                    let poll = retry_after
                        .min(Duration::from_secs(1 << polls.min(10)))
                        .clamp(Duration::from_secs(1), MAX_POLL);
                    polls += 1;
                    match self.wait_while_in_progress {
                        Some(max_wait) if waited + poll <= max_wait => {
                            ctx.wait(poll).name(WAIT_STEP).await?;
                            waited += poll;
                        }
                        _ => return Err(DurableError::InProgress { retry_after }.into_boxed()),
                    }
                }
            }
        }
        match handler(event, ctx.clone()).await {
            Ok(output) => match StorableJson::stored_redacted(&output, &self.redaction) {
                // A duplicate gets the output read back from its JSON
                // (`Some(None)` is `None` there): so does this execution,
                // whole, where the duplicate's is redacted.
                Ok((response, replayed)) => {
                    self.complete_step(ctx, &attempt, response).await;
                    Ok(replayed)
                }
                // The handler's effects happened: releasing the key would
                // let a duplicate run them again.
                Err(error) => {
                    tracing::error!(key = %attempt.key(), %error,
                        "the durable execution's output cannot be stored, so it is returned and \
                         not stored; its claim holds the key until execution_timeout: duplicates \
                         are told it is in progress (an operator can free it with forget --force)");
                    Ok(output)
                }
            },
            Err(error) => {
                self.release(&attempt).await;
                Err(error)
            }
        }
    }

    /// Completes the record in a step, so that a store outage is retried
    /// with durable waits (the execution suspended between tries) and a
    /// replay after it never writes again. The output is the execution's
    /// whatever becomes of the record: a completion that fails for good
    /// is logged, and the claim then holds the key until it expires.
    async fn complete_step(&self, ctx: &DurableContext, attempt: &SplitAttempt, response: Vec<u8>) {
        let engine = self.engine.clone();
        let owned = attempt.clone();
        let completed = ctx
            .step(move |_| async move {
                match split::complete(&engine, &owned, response).await {
                    Ok(kind) => Ok(kind.as_str().to_owned()),
                    Err(error) => Err(DurableError::Store(error).into_boxed()),
                }
            })
            .name(COMPLETE_STEP)
            .retry_strategy(retry_completion)
            .await;
        if let Err(error) = completed {
            tracing::error!(key = %attempt.key(), %error,
                "the durable execution completed but its record could not be: duplicates get \
                 IdempotencyAlreadyInProgress until its claim expires (execution_timeout); an \
                 output too large for the store (DynamoDB: 400 KB an item) never fits");
        }
    }

    /// Releases the execution's claim, trying a store outage again a few
    /// times; a claim that cannot be released holds the key until it
    /// expires.
    async fn release(&self, attempt: &SplitAttempt) {
        for tries in 0..OUTAGE_TRIES {
            match split::release(&self.engine, attempt).await {
                Ok(()) => return,
                Err(error) if error.kind().is_transient() && release_backoff(tries).is_some() => {
                    tokio::time::sleep(release_backoff(tries).unwrap_or_default()).await;
                }
                Err(error) => {
                    warn!(key = %attempt.key(), %error,
                        "the failed durable execution's claim could not be released; it holds the key until it expires (execution_timeout)");
                    return;
                }
            }
        }
    }

    async fn claim_step<O>(
        &self,
        ctx: &DurableContext,
        attempt: &SplitAttempt,
    ) -> Result<ClaimDecision<O>, BoxError>
    where
        O: Serialize + DeserializeOwned + Send + 'static,
    {
        let engine = self.engine.clone();
        let attempt = attempt.clone();
        let decision = ctx
            .step(move |_| async move {
                let claimed = split::claim::<_, O>(&engine, &attempt, &StorableJson).await;
                match claimed {
                    Ok(SplitClaim::Ours) => Ok(ClaimDecision::Run),
                    Ok(SplitClaim::Replay(output)) => Ok(ClaimDecision::Replay(output)),
                    Ok(SplitClaim::Disabled) => Ok(ClaimDecision::Disabled),
                    Err(Error::InProgress { retry_after }) => Ok(ClaimDecision::InProgress {
                        retry_after_ms: u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX),
                    }),
                    Err(Error::KeyReused) => Ok(ClaimDecision::KeyReused),
                    Err(error) => Err(DurableError::from_engine(error).into_boxed()),
                }
            })
            .name(CLAIM_STEP)
            .retry_strategy(retry_store_outages)
            .await?;
        Ok(decision)
    }

    /// A step whose body's effect runs at most once, even when the SDK runs
    /// the body again (an invocation that ended after the effect and before
    /// the step's checkpoint): the body is claimed under a key derived from
    /// the execution ARN and `name`, and a second run gets the first one's
    /// stored result. `name` must be unique within the execution. Await the
    /// builder, or configure it first (`retry_strategy`, `semantics`).
    ///
    /// A body interrupted during its effect (its invocation crashed) is
    /// claimed until its lease passes (the invocation's deadline): the step
    /// is retried after the time left on it, and its body then runs again
    /// as a takeover ([`ClaimHandle::takeover`](lambda_idempotency::ClaimHandle::takeover)
    /// says so): whether the first run's effect happened is for the body to
    /// check.
    ///
    /// The body never runs without its claim, even on an engine built
    /// with [`fail_open`](lambda_idempotency::EngineBuilder::fail_open): a store outage
    /// at the claim is retried by the step. A body that panics keeps its
    /// claim (it may have acted): the SDK's next run of it waits out the
    /// claim's lease and is a takeover.
    ///
    /// One case costs liveness: a claim whose write landed while its answer
    /// was lost, and the read that would confirm it failed too, is not
    /// recognised by the step's retry as its own (each run claims under a
    /// token of its own). The retry waits out its lease (the invocation's
    /// deadline) and runs the body as a takeover, though no run acted.
    ///
    /// The step's default retry strategy: `IdempotencyAlreadyInProgress`
    /// after the time left on the other claim (up to 10 times), a store
    /// outage with backoff (5 tries), and the body's own errors as the
    /// SDK's default does (6 attempts, 5 seconds doubling to 60, without
    /// its jitter). A `retry_strategy` of your own replaces it: retry
    /// `IdempotencyAlreadyInProgress` there too
    /// ([`DurableError::find`] finds it in a `StepError`).
    pub fn step<O, F, Fut>(
        &self,
        ctx: &DurableContext,
        name: &str,
        operation: F,
    ) -> StepBuilder<O, impl FnOnce(StepContext) -> StepFuture<O> + Send + 'static, StepFuture<O>>
    where
        O: Serialize + DeserializeOwned + Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<O, BoxError>> + Send + 'static,
    {
        let engine = self.engine.clone();
        let key = derive_key(ctx.execution_arn(), name);
        let fingerprint = Fingerprint::of_bytes(name.as_bytes());
        let deadline_ms = ctx.lambda_context().deadline;
        ctx.step(move |_: StepContext| -> StepFuture<O> {
            Box::pin(async move {
                // The SDK runs a body again when its checkpoint was lost, or
                // its invocation died: one run with nothing recorded, or a
                // claim released by a panic after the effect, and that is a
                // second effect that cannot tell. An outage is retried by
                // the step instead, and a panic's claim is taken over.
                let attempt = Attempt::new(STEP_SCOPE, &key, fingerprint)
                    .fail_closed()
                    .keep_claim_on_panic()
                    .port(lambda_idempotency::observe::Port::DurableStep);
                let attempt = match invocation_deadline(deadline_ms) {
                    Some(deadline_ms) => attempt.deadline_ms(deadline_ms),
                    None => attempt,
                };
                match engine
                    .execute_with(&attempt, &StorableJson, operation)
                    .await
                {
                    Ok(outcome) => Ok(outcome.into_value()),
                    Err(Error::Operation(error)) => Err(error),
                    Err(error) => Err(DurableError::from_engine(error).into_boxed()),
                }
            })
        })
        .name(name)
        .retry_strategy(retry_step)
    }
}

/// The owner token of an execution's claim on a key: the same in every
/// invocation of the execution, and another execution's never.
fn execution_owner(execution_arn: &str, scope: &str, key: &str) -> OwnerToken {
    let mut hash = Sha256::new();
    for part in ["durable", execution_arn, scope, key] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    OwnerToken::from_stored(hex::encode(&hash.finalize()[..16]))
}

/// The claim step is tried again through a store outage, and only then.
fn retry_store_outages(error: &StepError, attempt: u32) -> RetryDecision {
    claim_retry(DurableError::find(error), attempt)
}

/// [`retry_store_outages`] of what the step's error holds (testable: the SDK
/// makes the `StepError`).
fn claim_retry(error: Option<&DurableError>, attempt: u32) -> RetryDecision {
    match error {
        Some(DurableError::Store(store))
            if store.kind().is_transient() && attempt < OUTAGE_TRIES =>
        {
            RetryDecision::Retry {
                delay: backoff(attempt),
            }
        }
        // A claim answered after its lease passed was given back: the
        // next try claims anew.
        Some(DurableError::LeaseLost) if attempt < OUTAGE_TRIES => RetryDecision::Retry {
            delay: backoff(attempt),
        },
        _ => RetryDecision::Stop,
    }
}

/// The completion step is tried through a store outage for about an hour
/// (the execution suspended between tries), and only then.
fn retry_completion(error: &StepError, attempt: u32) -> RetryDecision {
    completion_retry(DurableError::find(error), attempt)
}

/// [`retry_completion`] of what the step's error holds.
fn completion_retry(error: Option<&DurableError>, attempt: u32) -> RetryDecision {
    match error {
        Some(DurableError::Store(store)) if store.kind().is_transient() && attempt < 12 => {
            RetryDecision::Retry {
                delay: Duration::from_secs(1 << attempt.min(9)).min(MAX_POLL),
            }
        }
        _ => RetryDecision::Stop,
    }
}

/// A step's body: another run's claim is waited out, an outage backed off,
/// the body's own errors retried as the SDK's default strategy would.
fn retry_step(error: &StepError, attempt: u32) -> RetryDecision {
    step_retry(DurableError::find(error), attempt)
}

/// [`retry_step`] of what the step's error holds: `None`, the body's own.
fn step_retry(error: Option<&DurableError>, attempt: u32) -> RetryDecision {
    let retry = match error {
        Some(DurableError::InProgress { retry_after }) => (attempt < IN_PROGRESS_TRIES)
            .then(|| (*retry_after).clamp(Duration::from_secs(1), MAX_CLAIM_WAIT)),
        Some(DurableError::Store(store)) if store.kind().is_transient() => {
            (attempt < OUTAGE_TRIES).then(|| backoff(attempt))
        }
        Some(_) => None,
        None => (attempt < OPERATION_TRIES).then(|| {
            Duration::from_secs(5u64 << attempt.saturating_sub(1).min(4))
                .min(Duration::from_secs(60))
        }),
    };
    match retry {
        Some(delay) => RetryDecision::Retry { delay },
        None => RetryDecision::Stop,
    }
}

/// The invocation's deadline, epoch milliseconds, as the context gives it:
/// `None` for none (LocalRunner's context gives 0), and the engine's
/// default lease then.
fn invocation_deadline(deadline_ms: u64) -> Option<u64> {
    (deadline_ms > 0).then_some(deadline_ms)
}

/// How long a release waits after its try `tries` (from 0) failed as an
/// outage, before the next; `None` after the last, when it gives up.
fn release_backoff(tries: u32) -> Option<Duration> {
    (tries + 1 < OUTAGE_TRIES).then(|| Duration::from_millis(100 << tries))
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1 << attempt.min(5))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lambda_idempotency::{StoreError, StoreErrorKind};

    #[test]
    fn a_step_s_lease_ends_at_the_invocation_s_deadline_when_there_is_one() {
        assert_eq!(invocation_deadline(0), None);
        assert_eq!(invocation_deadline(1), Some(1));
        assert_eq!(
            invocation_deadline(1_700_000_000_000),
            Some(1_700_000_000_000)
        );
    }

    #[test]
    fn a_release_tries_five_times_doubling_its_wait() {
        let waits: Vec<_> = (0..OUTAGE_TRIES).map(release_backoff).collect();
        let ms = Duration::from_millis;
        assert_eq!(
            waits,
            vec![
                Some(ms(100)),
                Some(ms(200)),
                Some(ms(400)),
                Some(ms(800)),
                None
            ]
        );
    }

    fn store(kind: StoreErrorKind) -> DurableError {
        DurableError::Store(StoreError::new(kind, "store"))
    }

    /// The decisions for attempts 1, 2, …: `Some(seconds)` to retry after.
    fn decisions(
        retry: fn(Option<&DurableError>, u32) -> RetryDecision,
        error: Option<&DurableError>,
        attempts: u32,
    ) -> Vec<Option<u64>> {
        (1..=attempts)
            .map(|attempt| match retry(error, attempt) {
                RetryDecision::Retry { delay } => Some(delay.as_secs()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_claim_step_retries_a_store_outage_four_times_backing_off() {
        let outage = store(StoreErrorKind::Unavailable);
        assert_eq!(
            decisions(claim_retry, Some(&outage), 5),
            [Some(2), Some(4), Some(8), Some(16), None]
        );
        let refused = store(StoreErrorKind::Misconfigured);
        assert_eq!(decisions(claim_retry, Some(&refused), 2), [None, None]);
        assert_eq!(
            decisions(claim_retry, Some(&DurableError::KeyReused), 1),
            [None]
        );
        assert_eq!(decisions(claim_retry, None, 1), [None]);
        // A claim answered after its lease passed, given back: claimed again.
        assert_eq!(
            decisions(claim_retry, Some(&DurableError::LeaseLost), 5),
            [Some(2), Some(4), Some(8), Some(16), None]
        );
    }

    #[test]
    fn the_completion_step_retries_a_store_outage_for_about_an_hour() {
        let outage = store(StoreErrorKind::Unavailable);
        assert_eq!(
            decisions(completion_retry, Some(&outage), 12),
            [2, 4, 8, 16, 32, 64, 128, 256, 512, 512, 512]
                .map(Some)
                .into_iter()
                .chain([None])
                .collect::<Vec<_>>()
        );
        let refused = store(StoreErrorKind::Misconfigured);
        assert_eq!(decisions(completion_retry, Some(&refused), 1), [None]);
        assert_eq!(decisions(completion_retry, None, 1), [None]);
    }

    #[test]
    fn a_step_waits_out_a_claim_backs_off_an_outage_and_retries_its_own_errors() {
        // Another run's claim: waited out as long as it has left, between
        // a second and 15 minutes, nine times.
        let held = |secs| DurableError::InProgress {
            retry_after: Duration::from_secs(secs),
        };
        assert_eq!(decisions(step_retry, Some(&held(0)), 1), [Some(1)]);
        assert_eq!(decisions(step_retry, Some(&held(30)), 1), [Some(30)]);
        assert_eq!(
            decisions(step_retry, Some(&held(3600)), 10),
            [Some(900); 9].into_iter().chain([None]).collect::<Vec<_>>()
        );
        let outage = store(StoreErrorKind::Unavailable);
        assert_eq!(
            decisions(step_retry, Some(&outage), 5),
            [Some(2), Some(4), Some(8), Some(16), None]
        );
        let refused = store(StoreErrorKind::Misconfigured);
        assert_eq!(decisions(step_retry, Some(&refused), 1), [None]);
        assert_eq!(
            decisions(step_retry, Some(&DurableError::KeyReused), 1),
            [None]
        );
        // The body's own error, as the SDK's default strategy: 5 s doubling,
        // at most a minute, six tries.
        assert_eq!(
            decisions(step_retry, None, 6),
            [Some(5), Some(10), Some(20), Some(40), Some(60), None]
        );
    }

    #[test]
    fn owners_differ_by_execution_and_key_and_not_by_invocation() {
        let a = execution_owner("arn:exec/a", "durable", "order-1");
        assert_eq!(a, execution_owner("arn:exec/a", "durable", "order-1"));
        assert_ne!(a, execution_owner("arn:exec/b", "durable", "order-1"));
        assert_ne!(a, execution_owner("arn:exec/a", "durable", "order-2"));
        // Lengths are hashed: the parts cannot be shifted into each other.
        assert_ne!(
            execution_owner("arn:exec/a", "durable", "x"),
            execution_owner("arn:exec/a", "durablex", "")
        );
        assert_eq!(a.as_str().len(), 32);
    }
}
