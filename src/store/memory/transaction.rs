//! The memory store's transactions ([`Transactions`]): what a SQL
//! database does for the run inside a transaction, in memory, so that the
//! engine's transactional run can be tested (and simulated) without one.
//!
//! - A transaction's claim locks its key: another transaction's claim of
//!   it waits, at most its [claim wait](TransactionLimits::claim_wait),
//!   then is a [`Conflict`](StoreErrorKind::Conflict), as PostgreSQL's
//!   `lock_timeout` is. A write outside a transaction to a key one holds
//!   is a `Conflict` at once (PostgreSQL's would wait on the row lock).
//! - Nothing it writes (its record, the operation's
//!   [`MemoryTransaction::write`]s, the completion's writes) is seen
//!   outside it until it commits; a rollback, or dropping it open (a crash,
//!   a dropped future), leaves nothing.

use super::{check_writes, packed::Packed, MemoryStore, MemoryWrite};
use crate::{
    store::{
        transaction::{self, TransactionFuture},
        Claim, Completion, Conditional, OpenTransaction, OwnerToken, Record, Status, Takeover,
        Transaction, TransactionLimits, TransactionalStore, Transactions,
    },
    StoreError, StoreErrorKind,
};
use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};
use tokio::sync::OwnedMutexGuard;

/// The locks of the keys that transactions hold or wait for.
pub(super) type KeyLocks = Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>;

/// The transaction an operation runs in on the [`MemoryStore`]
/// ([`Engine::run_in_transaction`](crate::Engine::run_in_transaction)): its
/// writes are seen by none but it until it commits, with the completed
/// record. Cheap to clone.
#[derive(Clone)]
pub struct MemoryTransaction {
    open: Arc<Open>,
}

impl std::fmt::Debug for MemoryTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryTransaction")
            .field("takeover", &self.takeover())
            .finish_non_exhaustive()
    }
}

struct Open {
    store: MemoryStore,
    claim_wait: Duration,
    state: Mutex<Staged>,
}

/// What the transaction has written, and the key it holds.
#[derive(Default)]
struct Staged {
    /// The key's lock, from its claim to the transaction's end.
    held: Option<(String, OwnedMutexGuard<()>)>,
    /// The claim this transaction wrote (a takeover too).
    claim: Option<Claim>,
    /// Its completion: the response, when, and until when it is kept.
    completed: Option<(Vec<u8>, u64, u64)>,
    /// Every write, the operation's and the completion's, in order.
    writes: Vec<MemoryWrite>,
    /// Where the operation's writes begin ([`Transaction::hold`]).
    savepoint: usize,
    /// Committed or rolled back: nothing more is written.
    ended: bool,
}

impl MemoryTransaction {
    /// The transaction the operation polled on this task runs in; `None`
    /// outside one, and in tasks the operation spawns.
    pub fn current() -> Option<MemoryTransaction> {
        transaction::current()
    }

    /// Whether this attempt took over a lapsed claim (one made outside a
    /// transaction, whose lease passed).
    pub fn takeover(&self) -> Option<Takeover> {
        self.open.staged().claim.as_ref().and_then(Claim::takeover)
    }

    /// Writes an item in this transaction: seen by [`item`](Self::item)
    /// here at once, and by the store once the transaction commits. An
    /// `if_absent` write onto an item there is refused
    /// ([`StoreErrorKind::WriteRejected`]), and the transaction goes on.
    pub fn write(&self, write: MemoryWrite) -> Result<(), StoreError> {
        let mut staged = self.open.staged();
        if write.if_absent && self.item_in(&staged, &write.key).is_some() {
            return Err(StoreError::new(
                StoreErrorKind::WriteRejected,
                format!("memory store: an item already exists under {:?}", write.key),
            ));
        }
        staged.writes.push(write);
        Ok(())
    }

    /// The item under `key` as this transaction sees it: its own last write,
    /// or the store's.
    pub fn item(&self, key: &str) -> Option<Vec<u8>> {
        let staged = self.open.staged();
        self.item_in(&staged, key)
    }

    fn item_in(&self, staged: &Staged, key: &str) -> Option<Vec<u8>> {
        match staged.writes.iter().rev().find(|write| write.key == key) {
            Some(write) => Some(write.value.clone()),
            None => self.open.store.item(key),
        }
    }

    /// Undoes the operation's writes, keeping the claim.
    pub fn roll_back_writes(&self) {
        let mut staged = self.open.staged();
        let savepoint = staged.savepoint;
        staged.writes.truncate(savepoint);
    }
}

impl Open {
    fn staged(&self) -> MutexGuard<'_, Staged> {
        // Every change to it is a single assignment or push.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the key's lock, waiting at most the claim wait for the
    /// transaction that holds it.
    async fn lock(&self, id: &str) -> Result<(), StoreError> {
        if self
            .staged()
            .held
            .as_ref()
            .is_some_and(|(held, _)| held == id)
        {
            return Ok(());
        }
        let lock = {
            let mut locks = self.store.key_locks();
            Arc::clone(locks.entry(id.to_owned()).or_default())
        };
        let guard = match tokio::time::timeout(self.claim_wait, lock.lock_owned()).await {
            Ok(guard) => guard,
            Err(_) => {
                self.store.forget_lock(id);
                return Err(StoreError::new(
                    StoreErrorKind::Conflict,
                    "memory store: another transaction holds the key past the claim wait",
                ));
            }
        };
        self.store.state().held.insert(id.to_owned());
        self.staged().held = Some((id.to_owned(), guard));
        Ok(())
    }

    /// The record as this transaction sees it.
    fn record(&self, claim: &Claim, staged: &Staged) -> Option<Record> {
        match &staged.claim {
            Some(own) if own.id == claim.id => Some(staged_record(own, staged)),
            _ => self
                .store
                .state()
                .records
                .get(claim.id.as_str())
                .map(|record| record.record()),
        }
    }

    async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
        self.lock(claim.id.as_str()).await?;
        // A failure injected for the kit (`MemoryStore::fail_next`) fails
        // the claim too, as a connection lost while the claim waited on
        // the key's lock would.
        drop(self.store.enter()?);
        let mut staged = self.staged();
        match self.record(claim, &staged) {
            Some(found) if !found.is_expired(claim.now_ms) => Ok(Conditional::Refused(Some(found))),
            _ => {
                staged.claim = Some(claim.clone());
                Ok(Conditional::Applied)
            }
        }
    }

    async fn take_over(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        self.lock(claim.id.as_str()).await?;
        let mut staged = self.staged();
        match self.record(claim, &staged) {
            Some(found)
                if found.status == Status::InProgress
                    && found.owner == *lapsed
                    && found
                        .lease_until_ms
                        .is_some_and(|lease| lease < claim.now_ms) =>
            {
                staged.claim = Some(claim.clone());
                Ok(Conditional::Applied)
            }
            found => Ok(Conditional::Refused(found)),
        }
    }

    fn complete(&self, completion: Completion<MemoryWrite>) -> Result<Conditional, StoreError> {
        // A failure injected for the kit fails the completion too, as a
        // connection lost before its statement answered would.
        drop(self.store.enter()?);
        let mut staged = self.staged();
        match &staged.claim {
            Some(own) if own.id == completion.id && own.owner == completion.owner => {}
            Some(own) if own.id == completion.id => {
                return Ok(Conditional::Refused(Some(staged_record(own, &staged))))
            }
            _ => {
                let state = self.store.state();
                let found = state.records.get(completion.id.as_str());
                return Ok(Conditional::Refused(found.map(|record| record.record())));
            }
        }
        let mut items = HashMap::new();
        for write in &staged.writes {
            items.insert(write.key.clone(), write.value.clone());
        }
        for (index, write) in completion.writes.iter().enumerate() {
            if write.if_absent
                && (items.contains_key(&write.key) || self.store.item(&write.key).is_some())
            {
                // A refusal the application can answer, as outside a
                // transaction (`check_writes`).
                let message = format!("memory store: an item already exists under {:?}", write.key);
                return Err(
                    StoreError::new(StoreErrorKind::WriteRejected, message.clone())
                        .with_write_refusal(crate::WriteRefusal::new(
                            index,
                            "ConditionalCheckFailed",
                            message,
                        )),
                );
            }
        }
        staged.writes.extend(completion.writes);
        staged.completed = Some((
            completion.response,
            completion.now_ms,
            completion.expiration_s,
        ));
        Ok(Conditional::Applied)
    }

    fn commit(&self) -> Result<(), StoreError> {
        let mut staged = self.staged();
        if staged.ended {
            return Err(StoreError::new(
                StoreErrorKind::Other,
                "memory store: the transaction has ended",
            ));
        }
        let mut state = self.store.state();
        let state = &mut *state;
        check_writes(&state.items, &staged.writes)?;
        if let Some(claim) = &staged.claim {
            state.records.put(Packed::claimed_from(claim));
            if let (Some((response, now_ms, expiration_s)), Some(found)) =
                (&staged.completed, state.records.found(claim.id.as_str()))
            {
                found.complete(response, *now_ms, *expiration_s);
            }
        }
        for write in std::mem::take(&mut staged.writes) {
            state.items.insert(write.key, write.value);
        }
        Ok(())
    }

    /// Ends the transaction: its key's lock given back, whatever it wrote
    /// forgotten unless it committed.
    fn end(&self) {
        let held = {
            let mut staged = self.staged();
            staged.ended = true;
            staged.writes.clear();
            staged.held.take()
        };
        if let Some((id, guard)) = held {
            self.store.state().held.remove(&id);
            drop(guard);
            self.store.forget_lock(&id);
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.end();
    }
}

/// The record a transaction's own claim (and completion) make.
fn staged_record(claim: &Claim, staged: &Staged) -> Record {
    let mut record = Packed::claimed_from(claim).record();
    if let Some((response, now_ms, expiration_s)) = &staged.completed {
        record.status = Status::Completed;
        record.response = Some(response.clone());
        record.lease_until_ms = None;
        record.completed_at_ms = Some(*now_ms);
        record.expiration_s = *expiration_s;
    }
    record
}

impl MemoryStore {
    fn key_locks(&self) -> MutexGuard<'_, HashMap<String, Arc<tokio::sync::Mutex<()>>>> {
        self.inner
            .key_locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops the key's lock from the table once no transaction holds or
    /// waits for it.
    fn forget_lock(&self, id: &str) {
        let mut locks = self.key_locks();
        if locks
            .get(id)
            .is_some_and(|lock| Arc::strong_count(lock) == 1)
        {
            locks.remove(id);
        }
    }
}

/// The transaction's side that the engine drives.
struct Driven(MemoryTransaction);

impl OpenTransaction for MemoryTransaction {
    fn roll_back_writes(&self) -> TransactionFuture<'_, ()> {
        MemoryTransaction::roll_back_writes(self);
        Box::pin(std::future::ready(Ok(())))
    }
}

impl OpenTransaction for Driven {
    fn roll_back_writes(&self) -> TransactionFuture<'_, ()> {
        OpenTransaction::roll_back_writes(&self.0)
    }
}

impl Transaction<MemoryWrite> for Driven {
    fn claim<'a>(&'a self, claim: &'a Claim) -> TransactionFuture<'a, Conditional> {
        Box::pin(self.0.open.claim(claim))
    }

    fn take_over<'a>(
        &'a self,
        claim: &'a Claim,
        lapsed: &'a OwnerToken,
    ) -> TransactionFuture<'a, Conditional> {
        Box::pin(self.0.open.take_over(claim, lapsed))
    }

    fn hold(&self) -> TransactionFuture<'_, ()> {
        let mut staged = self.0.open.staged();
        staged.savepoint = staged.writes.len();
        Box::pin(std::future::ready(Ok(())))
    }

    fn write(&self, writes: Vec<MemoryWrite>) -> TransactionFuture<'_, ()> {
        let written = writes.into_iter().try_for_each(|write| self.0.write(write));
        Box::pin(std::future::ready(written))
    }

    fn complete(&self, completion: Completion<MemoryWrite>) -> TransactionFuture<'_, Conditional> {
        Box::pin(std::future::ready(self.0.open.complete(completion)))
    }

    fn commit(&self) -> TransactionFuture<'_, ()> {
        let committed = self.0.open.commit();
        self.0.open.end();
        Box::pin(std::future::ready(committed))
    }

    fn roll_back(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        self.0.open.end();
        Box::pin(std::future::ready(()))
    }

    fn handed(&self) -> Arc<dyn OpenTransaction> {
        Arc::new(self.0.clone())
    }
}

impl Transactions<MemoryWrite> for MemoryStore {
    fn begin<'a>(
        &'a self,
        limits: &'a TransactionLimits,
    ) -> TransactionFuture<'a, Arc<dyn Transaction<MemoryWrite>>> {
        let began = self.enter().map(|_| {
            let transaction = MemoryTransaction {
                open: Arc::new(Open {
                    store: self.clone(),
                    claim_wait: limits.claim_wait_value(),
                    state: Mutex::new(Staged::default()),
                }),
            };
            Arc::new(Driven(transaction)) as Arc<dyn Transaction<MemoryWrite>>
        });
        Box::pin(std::future::ready(began))
    }
}

impl TransactionalStore for MemoryStore {
    type Transaction = MemoryTransaction;
}
