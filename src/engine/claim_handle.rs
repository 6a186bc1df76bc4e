//! [`ClaimHandle`]: what an operation knows about its claim, and how it
//! keeps it.

use crate::{
    store::{Conditional, Extension, OpenTransaction, OwnerToken, RecordId, Takeover},
    Error, StoreError, StoreErrorKind,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};
use tokio::sync::Notify;

tokio::task_local! {
    /// The claim of the operation being polled, for adapters whose handler
    /// signature has no room for it.
    static CURRENT: ClaimHandle;
}

/// An operation's handle to its claim: whether it took over a lapsed
/// claim, its lease, extending it, and learning that it was lost.
///
/// [`Engine::run`](crate::Engine::run) hands one to the operation; the HTTP
/// layer puts it in the request's extensions. Cheap to clone.
#[derive(Clone)]
pub struct ClaimHandle {
    takeover: Option<Takeover>,
    held: Option<Arc<Held>>,
    transaction: Option<Arc<dyn OpenTransaction>>,
    /// The record a store transaction holds the claim on (`in_transaction`):
    /// its steps' downstream keys ([`step_key`](ClaimHandle::step_key)).
    claimed_in_transaction: Option<RecordId>,
}

pub(super) struct Held {
    extender: Arc<dyn Extender>,
    id: RecordId,
    owner: OwnerToken,
    /// The request's fingerprint, which a sealed step's output is bound to.
    fingerprint: crate::Fingerprint,
    lease: Mutex<Lease>,
    /// Set once an extension finds the claim lost; `lost_now` wakes whoever
    /// waits for it (kept in the handle's own allocation, unlike a channel).
    lost: AtomicBool,
    lost_now: Notify,
    /// The steps recorded on the record (`steps.rs`): `None` until the
    /// first step reads or starts them; locked while one is read or
    /// written, never while a step runs.
    steps: tokio::sync::Mutex<Option<Vec<crate::store::RecordedStep>>>,
    /// Set once the record holds a step: giving the key back then ends the
    /// lease instead of deleting the record, so the retry resumes.
    stepped: AtomicBool,
    /// Steps under way on this handle and its clones, from their bound
    /// check until their output is in `steps` (or they failed): counted
    /// against the step bound with the recorded ones (`steps.rs`).
    running_steps: std::sync::atomic::AtomicUsize,
}

#[derive(Debug, Clone, Copy)]
struct Lease {
    until_ms: u64,
    expiration_s: u64,
    /// The furthest lease and expiration this attempt has asked for: an
    /// extension whose answer was lost may have landed, so no later one
    /// asks for less (it would shorten a lease it cannot see).
    asked_until_ms: u64,
    asked_expiration_s: u64,
}

type ExtendFuture<'a> = Pin<Box<dyn Future<Output = Result<Conditional, StoreError>> + Send + 'a>>;

/// The engine's side of an extension (and of recording steps), without
/// its store type.
pub(super) trait Extender: super::steps::StepRecorder {
    fn now_ms(&self) -> u64;
    fn max_lease_ms(&self) -> u64;
    fn extend<'a>(&'a self, extension: &'a Extension) -> ExtendFuture<'a>;
}

impl ClaimHandle {
    pub(super) fn held(
        extender: Arc<dyn Extender>,
        id: RecordId,
        owner: OwnerToken,
        fingerprint: crate::Fingerprint,
        lease_until_ms: u64,
        expiration_s: u64,
        takeover: Option<Takeover>,
    ) -> Self {
        Self {
            takeover,
            held: Some(Arc::new(Held {
                extender,
                id,
                owner,
                fingerprint,
                lease: Mutex::new(Lease {
                    until_ms: lease_until_ms,
                    expiration_s,
                    asked_until_ms: lease_until_ms,
                    asked_expiration_s: expiration_s,
                }),
                lost: AtomicBool::new(false),
                lost_now: Notify::new(),
                steps: tokio::sync::Mutex::new(None),
                stepped: AtomicBool::new(false),
                running_steps: std::sync::atomic::AtomicUsize::new(0),
            })),
            transaction: None,
            claimed_in_transaction: None,
        }
    }

    /// The handle of an operation inside the store transaction that holds
    /// its claim: no lease to extend (the claim lives as long as the
    /// transaction), the transaction to run its own statements in.
    /// `id` is the record it claims (`None` with idempotency disabled).
    pub(super) fn in_transaction(
        takeover: Option<Takeover>,
        transaction: Arc<dyn OpenTransaction>,
        id: Option<RecordId>,
    ) -> Self {
        Self {
            takeover,
            held: None,
            transaction: Some(transaction),
            claimed_in_transaction: id,
        }
    }

    /// The record a store transaction holds this operation's claim on.
    pub(super) fn claimed_in_transaction(&self) -> Option<&RecordId> {
        self.claimed_in_transaction.as_ref()
    }

    /// The store transaction the operation runs in, as its store's type
    /// `X` (a [`PgTransaction`](https://docs.rs/lambda-idempotency/latest/lambda_idempotency/store/postgres/struct.PgTransaction.html)),
    /// when it runs inside one (`Engine::run_in_transaction`, the
    /// adapters' `in_transaction`): its statements commit with the
    /// completed record.
    pub fn transaction<X: OpenTransaction>(&self) -> Option<&X> {
        let open: &dyn std::any::Any = &**self.transaction.as_ref()?;
        open.downcast_ref()
    }

    /// The store transaction the operation runs in, whatever its store.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn open_transaction(&self) -> Option<&Arc<dyn OpenTransaction>> {
        self.transaction.as_ref()
    }

    /// The handle of an operation run without a claim: a single write, a
    /// disabled engine, or fail-open during a store outage; a takeover only
    /// of an attempt outside this crate's records.
    pub(super) fn unprotected(takeover: Option<Takeover>) -> Self {
        Self {
            takeover,
            held: None,
            transaction: None,
            claimed_in_transaction: None,
        }
    }

    /// The handle of the operation running on this task: set by the engine
    /// while it polls an operation, whatever the adapter (an SQS record's
    /// handler, an event handler, your own). `None` outside an operation,
    /// and in tasks the operation spawns (pass the handle to them).
    ///
    /// ```
    /// use lambda_idempotency::ClaimHandle;
    ///
    /// async fn send_receipt() {
    ///     if let Some(takeover) = ClaimHandle::current().and_then(|claim| claim.takeover()) {
    ///         // attempt `takeover.attempt`: look the receipt up before sending it again
    ///         let _ = takeover;
    ///     }
    /// }
    /// ```
    pub fn current() -> Option<ClaimHandle> {
        CURRENT.try_with(Clone::clone).ok()
    }

    /// Runs `operation` with this handle as [`current`](ClaimHandle::current).
    pub(crate) fn scope<F: Future>(self, operation: F) -> impl Future<Output = F::Output> {
        CURRENT.scope(self, operation)
    }

    /// `Some` when this attempt took over a lapsed claim: an earlier attempt
    /// may have acted. See [`Takeover`].
    pub fn takeover(&self) -> Option<Takeover> {
        self.takeover
    }

    /// Whether the operation runs under a claim; `false` for a single
    /// write, a disabled engine, and an unprotected run (fail-open during a
    /// store outage); `true` inside the store transaction that holds
    /// the claim.
    pub fn is_claimed(&self) -> bool {
        self.held.is_some() || self.transaction.is_some()
    }

    /// The end of the claim's lease, epoch milliseconds, as last written by
    /// this attempt.
    pub fn lease_until_ms(&self) -> Option<u64> {
        self.held.as_ref().map(|held| held.lease().until_ms)
    }

    /// Extends the lease to `by` from now (capped by the engine's
    /// [`max_lease`](crate::EngineBuilder::max_lease)), if the claim is
    /// still this attempt's: a fenced write, one store call.
    ///
    /// [`Error::LeaseLost`] when the claim was taken over (the operation
    /// should stop: its completion will be refused too, and
    /// [`lost`](ClaimHandle::lost) resolves); [`Error::Store`] when the
    /// store failed, or when there is no claim (an unprotected run).
    pub async fn extend(&self, by: Duration) -> Result<(), Error> {
        let Some(held) = &self.held else {
            return Err(Error::Store(StoreError::new(
                StoreErrorKind::Unavailable,
                "this operation runs without a claim (a single write, idempotency disabled, or fail-open during a store outage): there is no lease to extend",
            )));
        };
        held.extend(by).await
    }

    /// Resolves when an extension (by hand or by the heartbeat) finds the
    /// claim lost to another attempt; never, while it is not. Select on it
    /// to stop work whose outcome can no longer be stored.
    pub async fn lost(&self) {
        match &self.held {
            Some(held) => loop {
                // Registered before the flag is read: a loss marked in
                // between still wakes it.
                let notified = held.lost_now.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if held.is_lost() {
                    return;
                }
                notified.await;
            },
            None => std::future::pending().await,
        }
    }

    /// Whether an extension found the claim lost.
    pub fn is_lost(&self) -> bool {
        self.held.as_ref().is_some_and(|held| held.is_lost())
    }

    pub(super) fn held_claim(&self) -> Option<&Held> {
        self.held.as_deref()
    }
}

impl Held {
    fn lease(&self) -> Lease {
        *self.lease.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) async fn extend(&self, by: Duration) -> Result<(), Error> {
        let now_ms = self.extender.now_ms();
        let by_ms = u64::try_from(by.as_millis())
            .unwrap_or(u64::MAX)
            .min(self.extender.max_lease_ms());
        let until_ms;
        let expiration_s;
        {
            let mut lease = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
            // Never less than an extension already asked for, whose answer
            // may have been lost after it landed.
            until_ms = now_ms
                .saturating_add(by_ms)
                .max(lease.until_ms)
                .max(lease.asked_until_ms);
            // The record must outlive its lease, or it would count as absent.
            expiration_s = lease
                .expiration_s
                .max(lease.asked_expiration_s)
                .max(until_ms / 1000 + 1);
            lease.asked_until_ms = until_ms;
            lease.asked_expiration_s = expiration_s;
        }
        let extension = Extension {
            id: self.id.clone(),
            owner: self.owner.clone(),
            lease_until_ms: until_ms,
            expiration_s,
            now_ms,
        };
        match self
            .extender
            .extend(&extension)
            .await
            .map_err(Error::Store)?
        {
            Conditional::Applied => {}
            Conditional::Refused(_) => {
                tracing::warn!(record = %self.id, outcome = "lease_lost",
                    "the claim was taken over before its lease could be extended");
                self.mark_lost();
                return Err(Error::LeaseLost);
            }
        }
        let mut lease = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
        lease.until_ms = lease.until_ms.max(until_ms);
        lease.expiration_s = lease.expiration_s.max(expiration_s);
        Ok(())
    }

    pub(super) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Marks the claim lost, and wakes whoever waits for it.
    pub(super) fn mark_lost(&self) {
        self.lost.store(true, Ordering::Release);
        self.lost_now.notify_waiters();
    }

    pub(super) fn id(&self) -> &RecordId {
        &self.id
    }

    pub(super) fn owner(&self) -> &OwnerToken {
        &self.owner
    }

    pub(super) fn fingerprint(&self) -> &crate::Fingerprint {
        &self.fingerprint
    }

    pub(super) fn now_ms(&self) -> u64 {
        self.extender.now_ms()
    }

    pub(super) fn recorder(&self) -> &dyn super::steps::StepRecorder {
        &*self.extender
    }

    pub(super) fn steps(&self) -> &tokio::sync::Mutex<Option<Vec<crate::store::RecordedStep>>> {
        &self.steps
    }

    pub(super) fn running_steps(&self) -> &std::sync::atomic::AtomicUsize {
        &self.running_steps
    }

    /// Marks the claim's record as one that may hold steps, so that
    /// giving its key back keeps it (`Engine::release`), for as long as
    /// this claim's handle lives.
    pub(super) fn mark_stepped(&self) {
        if !self.stepped.swap(true, Ordering::AcqRel) {
            self.recorder().claim_stepped(&self.owner);
        }
    }

    pub(super) fn lease_until_ms(&self) -> u64 {
        self.lease().until_ms
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if *self.stepped.get_mut() {
            self.extender.claim_ended(&self.owner);
        }
    }
}

impl fmt::Debug for ClaimHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimHandle")
            .field("takeover", &self.takeover)
            .field("lease_until_ms", &self.lease_until_ms())
            .field("lost", &self.is_lost())
            .finish()
    }
}
