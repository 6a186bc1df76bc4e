//! Recovery points: [`ClaimHandle::step`] runs a named step of the
//! operation once per key, recording its output on the claim's record with
//! a fenced write, so that a takeover resumes after the steps that
//! finished instead of repeating them (`docs/recovery-points.md`). With
//! encryption on, outputs are sealed and opened by `sealing.rs`.

use super::{
    claim_handle::{ClaimHandle, Held},
    sealing::StepBinding,
    state::Inner,
};
use crate::{
    store::{Conditional, OwnerToken, RecordId, RecordedStep, StepLimits, StepWrite, Store},
    Error, StoreError, StoreErrorKind,
};
use serde::{de::DeserializeOwned, Serialize};
use std::{
    future::Future,
    pin::Pin,
    sync::atomic::{AtomicUsize, Ordering},
};

type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The engine's side of recording steps, without its store type.
pub(super) trait StepRecorder: Send + Sync + 'static {
    fn record_step<'a>(&'a self, step: &'a StepWrite) -> StoreFuture<'a, Conditional>;
    fn steps<'a>(&'a self, id: &'a RecordId, now_ms: u64) -> StoreFuture<'a, Vec<RecordedStep>>;
    fn step_limits(&self) -> StepLimits;
    /// Whether the store records steps (`Store::STEPS`).
    fn records_steps(&self) -> bool;
    /// The claim under `owner` may hold steps (`SteppedClaims`).
    fn claim_stepped(&self, owner: &OwnerToken);
    /// The claim under `owner` ended: its handle is gone.
    fn claim_ended(&self, owner: &OwnerToken);
    /// The bytes to record for a step's encoded output: sealed when the
    /// engine encrypts (`sealing.rs`).
    fn seal_step<'a>(&'a self, step: StepBinding<'a>, output: Vec<u8>) -> StoreFuture<'a, Vec<u8>>;
    /// A recorded step's encoded output, opened when sealed.
    fn open_step<'a>(&'a self, step: StepBinding<'a>, stored: Vec<u8>) -> StoreFuture<'a, Vec<u8>>;
}

impl<St: Store> StepRecorder for Inner<St> {
    fn record_step<'a>(&'a self, step: &'a StepWrite) -> StoreFuture<'a, Conditional> {
        Box::pin(self.store.record_step(step))
    }

    fn steps<'a>(&'a self, id: &'a RecordId, now_ms: u64) -> StoreFuture<'a, Vec<RecordedStep>> {
        Box::pin(self.store.steps(id, now_ms))
    }

    fn step_limits(&self) -> StepLimits {
        self.step_limits
    }

    fn records_steps(&self) -> bool {
        St::STEPS
    }

    fn claim_stepped(&self, owner: &OwnerToken) {
        self.stepped_claims.insert(owner);
    }

    fn claim_ended(&self, owner: &OwnerToken) {
        self.stepped_claims.remove(owner);
    }

    fn seal_step<'a>(&'a self, step: StepBinding<'a>, output: Vec<u8>) -> StoreFuture<'a, Vec<u8>> {
        Box::pin(Inner::seal_step(self, step, output))
    }

    fn open_step<'a>(&'a self, step: StepBinding<'a>, stored: Vec<u8>) -> StoreFuture<'a, Vec<u8>> {
        Box::pin(Inner::open_step(self, step, stored))
    }
}

/// The claims of this engine whose records may hold steps, by owner token
/// (one per claim, so two runs of one key never share an entry), from the
/// first step write sent until the claim's handle is dropped: giving such
/// a key back ends its lease instead of deleting the record
/// (`Engine::release`), so the steps survive for the retry.
///
/// Kept by token, not found through the claim's run in `LocalRuns`: a
/// duplicate's run of the same key replaces that entry (the simulator's
/// seed 36521 with `SIM_STEPS=1`: a run in a transaction in the same
/// process, and the stepped record was deleted).
#[derive(Debug, Default)]
pub(super) struct SteppedClaims {
    owners: std::sync::Mutex<std::collections::HashSet<OwnerToken>>,
    /// How many: none, and `contains` takes no lock (every release asks).
    count: std::sync::atomic::AtomicUsize,
}

impl SteppedClaims {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<OwnerToken>> {
        self.owners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn insert(&self, owner: &OwnerToken) {
        let mut owners = self.lock();
        if owners.insert(owner.clone()) {
            self.count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
    }

    fn remove(&self, owner: &OwnerToken) {
        let mut owners = self.lock();
        if owners.remove(owner) {
            self.count.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
    }

    /// How many claims are marked.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.count.load(std::sync::atomic::Ordering::Acquire)
    }

    pub(super) fn contains(&self, owner: &OwnerToken) -> bool {
        self.count.load(std::sync::atomic::Ordering::Acquire) > 0 && self.lock().contains(owner)
    }
}

/// A step under way, counted in its handle's `running_steps` from its
/// bound check until it is recorded (`done`, under the lock of the
/// recorded steps) or fails (dropped).
struct Running<'a>(Option<&'a AtomicUsize>);

impl<'a> Running<'a> {
    fn start(running: &'a AtomicUsize) -> Self {
        running.fetch_add(1, Ordering::AcqRel);
        Self(Some(running))
    }

    fn done(&mut self) {
        if let Some(running) = self.0.take() {
            running.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.done();
    }
}

/// How often a step's write is tried again when the record holds another
/// count of steps than this attempt knew (steps recorded concurrently from
/// clones of one handle), before it gives up as a conflict.
const STEP_WRITE_TRIES: usize = 3;

impl ClaimHandle {
    /// Runs the step `name` of the operation once per key: returns the
    /// output recorded for it, when an earlier attempt at this key finished
    /// it (this attempt took that one over); otherwise runs `operation`,
    /// records its output on the claim's record (one fenced write, as a
    /// completion is: it lands only while the claim is this attempt's),
    /// and returns it.
    ///
    /// The same shape as the durable crate's `DurableIdempotency::step`
    /// (a name, and a closure returning a future of a serde value), so a
    /// handler's steps move between a durable function and a plain one.
    /// Names are unique within an operation: a second step of the same
    /// name gets the first one's output.
    ///
    /// The output returned is the one recorded, read back from its JSON,
    /// so the attempt that ran the step and a takeover resuming after it
    /// get the same value; an output that does not read back as its type
    /// (an `f64` NaN, written `null`) is not recorded (`Rejected`).
    ///
    /// Errors, and the operation should stop at each: [`Error::Operation`]
    /// with the step's own error (nothing recorded; a retry runs the step
    /// again); [`Error::LeaseLost`] when the handle already knows the
    /// claim was taken over ([`is_lost`](ClaimHandle::is_lost): the step
    /// does not run), or when it was taken over before
    /// the output could be recorded (the step ran, a zombie's: the
    /// successor may run it again, so a step with an effect outside the
    /// store passes its provider a key from [`step_key`](ClaimHandle::step_key));
    /// [`Error::Store`] when the store failed, the output does not encode
    /// or is over the engine's [`step_limits`](crate::EngineBuilder::step_limits)
    /// (`Rejected`), the store does not record steps (`Unsupported`), or
    /// the recorded output fails to open (`Unauthentic`, below).
    ///
    /// With the engine's [encryption](https://docs.rs/lambda-idempotency/latest/lambda_idempotency/encryption/index.html) on, the output is
    /// sealed as a response is (the same envelope and keys, the key id
    /// beside it), bound to the record, the request's fingerprint, the
    /// step's name and its index, and opened before it is returned to a
    /// takeover. One that fails to open (changed, copied from another
    /// step, index or record, or sealed under a key no longer configured)
    /// is never returned and the step is not run again: the call answers
    /// [`Error::Store`] of kind
    /// [`Unauthentic`](crate::StoreErrorKind::Unauthentic)
    /// ([`ErrorKind::UnauthenticRecord`](crate::ErrorKind::UnauthenticRecord)),
    /// with an ERROR log naming the record, the step and the key id, and so
    /// does every retry (the record is kept, in progress, its lease ended)
    /// until an operator forgets it (the CLI's `forget --force`; the next
    /// request then runs every step again: reconcile their effects first). Outputs
    /// recorded in the clear before encryption was turned on are used as
    /// they are, unless plaintext is refused.
    ///
    /// A name longer than [`MAX_STEP_NAME_BYTES`](crate::store::MAX_STEP_NAME_BYTES)
    /// is refused ([`Error::Store`] of kind
    /// [`Rejected`](crate::StoreErrorKind::Rejected)) before the step runs,
    /// with a claim or without.
    ///
    /// Without a claim (a single write, a disabled engine, fail-open
    /// through an outage, an operation inside a store transaction, whose
    /// claim commits or rolls back with it), the step just runs and nothing
    /// is recorded.
    ///
    /// ```
    /// use lambda_idempotency::{Attempt, Engine, Fingerprint, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let engine = Engine::builder(MemoryStore::new()).build();
    /// let attempt = Attempt::new("payments", "order-77", Fingerprint::of_bytes(b"1250 EUR"));
    /// let outcome = engine
    ///     .run(&attempt, lambda_idempotency::Mode::Plain, &lambda_idempotency::Json, |claim| async move {
    ///         let charge = claim.step("charge-card", || async { Ok("ch_1".to_owned()) }).await?;
    ///         let entry = claim.step("book-ledger", || async { Ok(7u64) }).await?;
    ///         Ok::<_, lambda_idempotency::Error<String>>(((charge, entry), Vec::new()))
    ///     })
    ///     .await;
    /// assert_eq!(outcome.unwrap().into_value(), ("ch_1".to_owned(), 7));
    /// # }
    /// ```
    pub async fn step<O, E, F, Fut>(&self, name: &str, operation: F) -> Result<O, Error<E>>
    where
        O: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<O, E>>,
    {
        // Checked with a claim or without: a name is valid or not whatever
        // path runs the step, and a handler tested on one path behaves the
        // same on the others.
        if name.len() > crate::store::MAX_STEP_NAME_BYTES {
            return Err(Error::Store(StoreError::new(
                StoreErrorKind::Rejected,
                format!(
                    "a step name of {} bytes, over the {} a step name may have",
                    name.len(),
                    crate::store::MAX_STEP_NAME_BYTES
                ),
            )));
        }
        let Some(held) = self.held_claim() else {
            return operation().await.map_err(Error::Operation);
        };
        // The claim is known taken over (a refused extension or step
        // write, the heartbeat): the step's effect would be a zombie's,
        // and its write would be refused anyway.
        if held.is_lost() {
            return Err(Error::LeaseLost);
        }
        let recorder = held.recorder();
        if !recorder.records_steps() {
            return Err(Error::Store(StoreError::new(
                StoreErrorKind::Unsupported,
                "this store does not record steps (recovery points): Store::STEPS is false",
            )));
        }
        let limits = recorder.step_limits();
        let recorded = held.recorded_steps(self.takeover().is_some()).await?;
        if let Some((index, step)) = recorded
            .iter()
            .enumerate()
            .find(|(_, step)| step.name == name)
        {
            let stored = step.output.clone();
            drop(recorded);
            // Opened (when sealed) before it is used: one that fails to
            // open stops the operation here, and the step does not run.
            let opened = recorder
                .open_step(held.binding(name, index), stored)
                .await
                .map_err(Error::Store)?;
            return serde_json::from_slice(&opened).map_err(|error| {
                Error::Store(StoreError::corrupt(format!(
                    "record {}: step {name:?}'s recorded output does not decode: {error}",
                    held.id()
                )))
            });
        }
        // The steps recorded and those under way from clones of this
        // handle (checked and counted under the lock of the recorded
        // ones): steps run at once cannot pass the bound together.
        let running = held.running_steps().load(Ordering::Acquire);
        if recorded.len() + running >= limits.max_steps as usize {
            return Err(Error::Store(StoreError::new(
                StoreErrorKind::Rejected,
                format!(
                    "step {name:?} would be step {} of a key that records at most {}",
                    recorded.len() + running + 1,
                    limits.max_steps
                ),
            )));
        }
        let mut slot = Running::start(held.running_steps());
        drop(recorded);
        if held.is_lost() {
            return Err(Error::LeaseLost);
        }
        let output = operation().await.map_err(Error::Operation)?;
        let encoded = serde_json::to_vec(&output).map_err(|error| {
            Error::Store(StoreError::new(
                StoreErrorKind::Rejected,
                format!("step {name:?}'s output does not encode: {error}"),
            ))
        })?;
        // What a takeover resuming after this step will get is the output
        // read back from its JSON, not the output itself: an `f64` NaN is
        // written `null` and never reads back (every takeover of the key
        // would fail until it expires), and `Some(None)` reads back as
        // `None`. So the output is read back before it is recorded, and
        // the value read back is what this attempt gets too.
        let output: O = serde_json::from_slice(&encoded).map_err(|error| {
            Error::Store(StoreError::new(
                StoreErrorKind::Rejected,
                format!("step {name:?}'s output does not read back from its JSON: {error}"),
            ))
        })?;
        if encoded.len() > limits.max_output_bytes {
            return Err(Error::Store(StoreError::new(
                StoreErrorKind::Rejected,
                format!(
                    "step {name:?}'s output is {} bytes, over the {} a step may record",
                    encoded.len(),
                    limits.max_output_bytes
                ),
            )));
        }
        held.record(name, encoded, &mut slot).await?;
        Ok(output)
    }

    /// A key for the downstream call step `name` makes (a payment
    /// provider's `Idempotency-Key`): the same in every attempt at this
    /// record, and distinct per step, so a step run again after its
    /// attempt died before recording it reaches the provider with the same
    /// key, and the provider answers it once. A hash of the record's id
    /// and the step's name ([`derive_key`](crate::derive_key)); the raw key
    /// is not in it. `None` without a claim. Inside the store transaction
    /// that holds the claim it is given too: a step's effect outside the
    /// store is repeated by the retry after a rollback.
    pub fn step_key(&self, name: &str) -> Option<String> {
        let id = match self.held_claim() {
            Some(held) => held.id(),
            None => self.claimed_in_transaction()?,
        };
        Some(crate::derive_key(id.as_str(), name))
    }
}

impl Held {
    /// What step `name`, the `index`-th of the record, is sealed to.
    fn binding<'a>(&'a self, name: &'a str, index: usize) -> StepBinding<'a> {
        StepBinding {
            id: self.id(),
            fingerprint: self.fingerprint(),
            name,
            index: u32::try_from(index).unwrap_or(u32::MAX),
        }
    }

    /// The steps recorded on the record, read once: from the store when
    /// this attempt took over (an earlier attempt may have recorded some),
    /// none for a fresh claim (a claim starts its record without steps).
    async fn recorded_steps<E>(
        &self,
        took_over: bool,
    ) -> Result<tokio::sync::MappedMutexGuard<'_, Vec<RecordedStep>>, Error<E>> {
        let mut steps = self.steps().lock().await;
        if steps.is_none() {
            let read = if took_over {
                let now_ms = self.now_ms();
                self.recorder()
                    .steps(self.id(), now_ms)
                    .await
                    .map_err(Error::Store)?
            } else {
                Vec::new()
            };
            if !read.is_empty() {
                self.mark_stepped();
            }
            *steps = Some(read);
        }
        Ok(tokio::sync::MutexGuard::map(steps, |steps| {
            steps.get_or_insert_with(Vec::new)
        }))
    }

    /// Records step `name`'s encoded output, fenced on this claim; the
    /// claim marked lost when the fence refuses it.
    async fn record<E>(
        &self,
        name: &str,
        output: Vec<u8>,
        slot: &mut Running<'_>,
    ) -> Result<(), Error<E>> {
        let mut steps = self.recorded_steps(false).await?;
        // Marked before the write is sent: a write whose answer is lost
        // may have landed, and a record that may hold a step must not be
        // deleted to give the key back (the simulator's seed 758 with
        // `SIM_STEPS=1`: a timed-out step write, then a release, and the
        // next claim ran the step again).
        self.mark_stepped();
        for _ in 0..STEP_WRITE_TRIES {
            // Sealed for the index it is written at: tried again at
            // another, it is sealed again.
            let stored = self
                .recorder()
                .seal_step(self.binding(name, steps.len()), output.clone())
                .await
                .map_err(Error::Store)?;
            let write = StepWrite::new(
                self.id().clone(),
                self.owner().clone(),
                u32::try_from(steps.len()).unwrap_or(u32::MAX),
                name,
                stored,
                self.now_ms(),
            );
            let refused = match self
                .recorder()
                .record_step(&write)
                .await
                .map_err(Error::Store)?
            {
                Conditional::Applied => {
                    // As the store holds it: sealed, opened when read.
                    steps.push(RecordedStep::new(name, write.output));
                    // Counted as recorded now, under the same lock.
                    slot.done();
                    // A record with steps is never deleted to give the key
                    // back: the retry takes it over and resumes.
                    self.mark_stepped();
                    return Ok(());
                }
                Conditional::Refused(found) => found,
            };
            let ours = refused.as_ref().is_some_and(|record| {
                record.owner == *self.owner() && record.status == crate::store::Status::InProgress
            });
            if !ours {
                tracing::warn!(record = %self.id(), step = name, outcome = "lease_lost",
                    "the claim was taken over before the step's output could be recorded");
                self.mark_lost();
                return Err(Error::LeaseLost);
            }
            // Still ours, with another count of steps: this write landed
            // before a retry whose answer was lost, or a clone of the
            // handle recorded one meanwhile. Read them again.
            let now_ms = self.now_ms();
            *steps = self
                .recorder()
                .steps(self.id(), now_ms)
                .await
                .map_err(Error::Store)?;
            if steps.iter().any(|step| step.name == name) {
                slot.done();
                self.mark_stepped();
                return Ok(());
            }
        }
        Err(Error::Store(StoreError::new(
            StoreErrorKind::Conflict,
            format!("step {name:?} could not be recorded: the record's steps kept changing"),
        )))
    }
}
