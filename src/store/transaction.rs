//! The transactional capability: a store that can run an operation inside
//! one of its own transactions, with the claim and the completed record.
//!
//! The engine drives it ([`Engine::run_in_transaction`](crate::Engine::run_in_transaction),
//! the adapters' `in_transaction` settings); a store only opens the
//! transaction and does, inside it, what it does outside: claim, take over
//! a lapsed claim, complete; then commits, or rolls back. What a refusal
//! means, when the operation may start, how long it may run and what its
//! caller is told are the engine's, as for every other run.
//!
//! Inside a transaction a claim is invisible to every other until it
//! commits, and a concurrent claim of the same key waits on it (at most
//! [`TransactionLimits::claim_wait`]): a claim that waited in vain, or that
//! lost a race the database broke by aborting it, is a
//! [`Conflict`](crate::StoreErrorKind::Conflict), which the engine answers
//! as "in progress". A crash, a dropped future or a rollback leaves
//! nothing: not the operation's writes, not the claim.
//!
//! A store offers the capability in two parts: the object-safe
//! [`Transactions`] the engine reaches through [`Store::transactions`]
//! (the adapters are generic over their store, and find it there), and
//! [`TransactionalStore`], which names the transaction the operation is
//! handed, for the typed entry points.

use super::{Claim, Completion, Conditional, OwnerToken, Store};
use crate::StoreError;
use std::{any::Any, future::Future, pin::Pin, sync::Arc, time::Duration};

/// A future of a store call inside a transaction.
pub type TransactionFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// How long a duplicate's claim waits, by default, for the transaction
/// that holds its key to end.
pub const DEFAULT_CLAIM_WAIT: Duration = Duration::from_millis(100);

/// How long, by default, the whole transaction may take, from its
/// beginning to its commit.
pub const DEFAULT_TIME_LIMIT: Duration = Duration::from_secs(10);

/// The longest bound a transaction takes (`INT_MAX` milliseconds less a
/// second, about 24 days: PostgreSQL's longest timeout, with room for the
/// idle timeout a second later); the claim wait and the time limit are
/// capped to it.
const LONGEST_MS: u64 = i32::MAX as u64 - 1_000;

/// `duration` in milliseconds, within what a transaction's bounds take:
/// from 1 ms to about 24 days.
pub fn bounded_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(1, LONGEST_MS)
}

/// The bounds of a run inside a store transaction
/// ([`Engine::run_in_transaction`](crate::Engine::run_in_transaction)):
/// how long a concurrent duplicate waits for the key, and how long the
/// handler's transaction may last.
///
/// ```
/// use lambda_idempotency::store::TransactionLimits;
/// use std::time::Duration;
///
/// let limits = TransactionLimits::new()
///     .claim_wait(Duration::from_millis(50))
///     .time_limit(Duration::from_secs(5));
/// assert_eq!(limits.time_limit_value(), Duration::from_secs(5));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionLimits {
    claim_wait: Duration,
    time_limit: Duration,
}

impl Default for TransactionLimits {
    fn default() -> Self {
        Self {
            claim_wait: DEFAULT_CLAIM_WAIT,
            time_limit: DEFAULT_TIME_LIMIT,
        }
    }
}

impl TransactionLimits {
    /// [`DEFAULT_CLAIM_WAIT`] and [`DEFAULT_TIME_LIMIT`].
    pub fn new() -> Self {
        Self::default()
    }

    /// How long a duplicate's claim waits on the transaction that holds
    /// its key (PostgreSQL's `SET LOCAL lock_timeout`; from 1 ms to about
    /// 24 days). If that transaction commits within it, the duplicate gets
    /// its stored outcome (a replay); otherwise it is told the key is in
    /// progress ([`Error::InProgress`](crate::Error::InProgress), a 409) at
    /// once.
    #[must_use]
    pub fn claim_wait(mut self, wait: Duration) -> Self {
        self.claim_wait = Duration::from_millis(bounded_ms(wait));
        self
    }

    /// How long the transaction may take from its beginning to its commit
    /// (from 1 ms to about 24 days). Past it the handler is stopped,
    /// everything is rolled back, and the caller gets
    /// [`Error::TimeLimitExceeded`](crate::Error::TimeLimitExceeded), every
    /// time (a handler that answers once the limit has passed is rolled
    /// back too, whatever it answered: its statement may have been
    /// cancelled by the server's bound). The store has the server enforce
    /// the limit too (PostgreSQL: `statement_timeout` on each statement,
    /// and `idle_in_transaction_session_timeout` a second later), so a
    /// statement still running at the limit ends there and releases its
    /// locks, and a process that stops answering (a Lambda frozen after
    /// its timeout) holds no lock for longer either. With an invocation
    /// deadline ([`Attempt::deadline`](crate::Attempt::deadline), the
    /// Lambda context's), the limit ends 250 ms before it at the latest.
    #[must_use]
    pub fn time_limit(mut self, limit: Duration) -> Self {
        self.time_limit = Duration::from_millis(bounded_ms(limit));
        self
    }

    /// The configured claim wait.
    pub fn claim_wait_value(&self) -> Duration {
        self.claim_wait
    }

    /// The configured time limit.
    pub fn time_limit_value(&self) -> Duration {
        self.time_limit
    }
}

/// A store's transactions, as the engine reaches them
/// ([`Store::transactions`]). `W` is the store's
/// [`Write`](Store::Write).
pub trait Transactions<W>: Send + Sync {
    /// Opens a transaction bounded by `limits`: a claim in it waits at
    /// most [`claim_wait`](TransactionLimits::claim_wait) on another
    /// transaction's, and the backend ends it past
    /// [`time_limit`](TransactionLimits::time_limit) where it can.
    fn begin<'a>(
        &'a self,
        limits: &'a TransactionLimits,
    ) -> TransactionFuture<'a, Arc<dyn Transaction<W>>>;

    /// How many transactions the adapters may hold open at once in this
    /// process (each from its claim to its commit), told once when they are
    /// set up: a store whose connections are fewer says so (a warning), as
    /// they would wait for one another. Nothing by default.
    fn expect_open_at_once(&self, transactions: usize) {
        let _ = transactions;
    }
}

/// What every open transaction offers, whatever its store's writes: the
/// operation's side of it. Reached from the operation's
/// [`ClaimHandle`](crate::ClaimHandle), and by the adapters.
pub trait OpenTransaction: Any + Send + Sync {
    /// Undoes every write of the operation's so far, keeping the claim: for
    /// a refusal whose answer is stored without its writes. Can be called
    /// more than once.
    fn roll_back_writes(&self) -> TransactionFuture<'_, ()>;
}

/// One open transaction of a store, which holds (once
/// [`claim`](Transaction::claim) applied) the claim of the key. Dropped
/// open, it rolls back.
pub trait Transaction<W>: OpenTransaction {
    /// Writes the claim's `IN_PROGRESS` record in this transaction, under
    /// the same condition as [`Store::claim`], and refuses the same way,
    /// with the committed record found (read anew when the statement's
    /// view of it predates the commit it waited for; `None` when there is
    /// still none to see). A claim that waited past the claim wait, or lost
    /// a race the database ended, is a
    /// [`Conflict`](crate::StoreErrorKind::Conflict).
    fn claim<'a>(&'a self, claim: &'a Claim) -> TransactionFuture<'a, Conditional>;

    /// Takes over a lapsed claim in this transaction, under the same
    /// condition as [`Store::take_over`].
    fn take_over<'a>(
        &'a self,
        claim: &'a Claim,
        lapsed: &'a OwnerToken,
    ) -> TransactionFuture<'a, Conditional>;

    /// The claim is this transaction's: readies the transaction for the
    /// operation (PostgreSQL: the operation's own locks wait as the
    /// server's setting says, and a savepoint marks where its writes
    /// begin, for [`roll_back_writes`](OpenTransaction::roll_back_writes)).
    fn hold(&self) -> TransactionFuture<'_, ()>;

    /// Runs `writes` in this transaction, in order, without a record: for
    /// an engine with idempotency turned off. A write that fails is an
    /// error, as for [`complete`](Transaction::complete).
    fn write(&self, writes: Vec<W>) -> TransactionFuture<'_, ()>;

    /// Runs the completion's writes, then completes the record, fenced on
    /// its owner, as [`Store::complete`] does, in this transaction. A write
    /// that fails is an error (a refusal carries its
    /// [`WriteRefusal`](crate::WriteRefusal)); the writes before it are not
    /// undone here.
    fn complete(&self, completion: Completion<W>) -> TransactionFuture<'_, Conditional>;

    /// Commits.
    fn commit(&self) -> TransactionFuture<'_, ()>;

    /// Rolls back, best effort: a transaction whose rollback fails is
    /// ended by closing its connection, which rolls back too.
    fn roll_back(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;

    /// What the operation is handed: the store's
    /// [`TransactionalStore::Transaction`], which the operation's
    /// [`ClaimHandle::transaction`](crate::ClaimHandle::transaction) and
    /// [`current`] return.
    fn handed(&self) -> Arc<dyn OpenTransaction>;
}

/// A store that runs operations inside its transactions, and the
/// transaction it hands them: the typed side of the capability, for
/// [`Engine::run_in_transaction`](crate::Engine::run_in_transaction) and
/// the adapters' `in_transaction` settings. A store that implements it
/// returns itself from [`Store::transactions`], and its transactions are
/// [`Transaction`]s of this type.
pub trait TransactionalStore: Store + Transactions<Self::Write> {
    /// What the operation is handed: the open transaction, to run its own
    /// statements in (cheap to clone).
    type Transaction: OpenTransaction + Clone;
}

tokio::task_local! {
    /// The transaction of the operation being polled, for handlers whose
    /// signature has no room for it.
    static CURRENT: Arc<dyn OpenTransaction>;
}

/// The transaction the operation polled on this task runs in, as its
/// store's type `X` (`PgTransaction::current` and its kin); `None` outside
/// one, and in tasks the operation spawns (pass it to them).
pub fn current<X: OpenTransaction + Clone>() -> Option<X> {
    CURRENT
        .try_with(|open| {
            let open: &dyn Any = &**open;
            open.downcast_ref::<X>().cloned()
        })
        .ok()
        .flatten()
}

/// Polls `operation` with `transaction` as [`current`].
pub(crate) fn scope<F: Future>(
    transaction: Arc<dyn OpenTransaction>,
    operation: F,
) -> impl Future<Output = F::Output> {
    CURRENT.scope(transaction, operation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_stay_within_what_a_transaction_takes() {
        let limits = TransactionLimits::new()
            .claim_wait(Duration::ZERO)
            .time_limit(Duration::MAX);
        assert_eq!(limits.claim_wait_value(), Duration::from_millis(1));
        assert_eq!(limits.time_limit_value(), Duration::from_millis(LONGEST_MS));
        assert!(LONGEST_MS + 1_000 <= i32::MAX as u64);
        let defaults = TransactionLimits::default();
        assert_eq!(defaults.claim_wait_value(), DEFAULT_CLAIM_WAIT);
        assert_eq!(defaults.time_limit_value(), DEFAULT_TIME_LIMIT);
    }
}
