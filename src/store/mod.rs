//! The store SPI: the [`Store`] trait, what it reads and writes, and the
//! stores this crate ships.
//!
//! Applications only pick a store and hand it to the
//! [`Engine`](crate::Engine): `dynamodb::DynamoDbStore` (feature
//! `dynamodb`, the default), `postgres::PostgresStore` (feature `postgres`:
//! the handler's SQL writes commit with the completion; or the same on
//! sqlx, `sqlx::postgres::SqlxPostgresStore`, feature `sqlx-postgres`),
//! `sqlx::mysql::SqlxMySqlStore` (feature `sqlx-mysql`: MySQL, Aurora
//! MySQL and MariaDB over your sqlx pool), `redis::RedisStore` (feature
//! `redis`: the lowest latency, no transactional writes), or
//! [`MemoryStore`](memory::MemoryStore) for tests. Every one passes the
//! same conformance kit. The SQL stores and the memory store also run the
//! handler inside the transaction that holds its claim: the capability of
//! [`transaction`](mod@transaction), which the engine drives. This module
//! is for those who write a store:
//!
//! - A store does the protocol's conditional writes (claim, take over a
//!   lapsed claim, extend, complete, release; optionally a single-write
//!   commit) and a consistent read, plus two operator calls (remove, list
//!   the records in progress), and, if it can, a cheap count of what it
//!   holds ([`table_size`](mod@table_size)). Each write is one atomic step
//!   on the backend, with its condition evaluated against the `now` it is
//!   handed, never the store's own clock, so tests can move time and every
//!   participant agrees on what has expired.
//! - A store decides nothing else. When a write's condition fails, it
//!   reports the record it found there ([`Conditional::Refused`]), and the
//!   engine decides what that means: the store's own earlier write that
//!   landed (an SDK retry whose first answer was lost), a live record to
//!   replay or wait for, or a record that changed meanwhile (claim again).
//! - A store translates its backend's errors into [`StoreError`]s, in one
//!   place (its `errors` module), with the
//!   [`StoreErrorKind`](crate::StoreErrorKind) that says what the failure
//!   is; nothing above a store sees the backend. The kind decides what
//!   the engine does, so get it right:
//!
//! | kind | when | the engine |
//! |---|---|---|
//! | `Unavailable`, `Throttled` | an outage: cannot reach, timeout, failover in progress, out of capacity | fails closed (503), or, with [fail-open](crate::EngineBuilder::fail_open), runs without a claim: the only kinds that may |
//! | `Conflict` | the write lost a race with a concurrent one | claims again, then reads: in progress, a replay or a 422, never a 5xx, never unprotected |
//! | `Misconfigured` | no table, no permission, a bad name or URL, data that is not a record | fails closed (500), never a retry-later |
//! | `Rejected` | a value out of the store's range, refused before any write | fails closed (500) |
//! | `CorruptRecord` | a record that does not decode | fails closed (500), never replayed |
//! | `WriteRejected` | the operation's own writes refused | releases the claim (500) |
//! | `Other` | nothing above fits | fails closed (500) |
//!
//! Each store's module docs give its own table: which backend error is
//! which kind.
//!
//! The `testing` feature's conformance kit
//! (`lambda_idempotency::testing`) checks a store against every
//! guarantee with one macro call.
//!
//! # How each store can lose what it acknowledged
//!
//! - **DynamoDB**: a write is acknowledged once durable in several AZs. Nothing
//!   is lost by a failure of AWS's side that the store reports as success.
//! - **PostgreSQL**: with `synchronous_commit = on` (the default) a commit is on
//!   disk before it is acknowledged; RDS Multi-AZ instances replicate
//!   synchronously, and Aurora commits to a quorum. A failover to an
//!   asynchronous read replica promoted by hand can lose the last commits.
//! - **Redis**: replication is asynchronous. A primary that fails after
//!   acknowledging a claim or a completion, before its replica received it,
//!   loses that record when the replica is promoted. For this crate that means:
//!   a lost claim lets a concurrent duplicate run while the first still runs; a
//!   lost completion lets a later retry run the operation again, as a first
//!   attempt, not a takeover. `appendonly yes` with `appendfsync always`
//!   protects a restarted primary, not a failover. `WAIT 1 <ms>` after each
//!   write narrows the window but does not close it (Redis's own docs: it does
//!   not make Redis strongly consistent). **MemoryDB** closes it: a write is
//!   acknowledged only once in its multi-AZ transaction log, and a failover
//!   never loses it. For payments on a Redis API, use MemoryDB, or DynamoDB or
//!   PostgreSQL. The cluster tests found the same in practice: failing over to a
//!   replica that had not finished its initial sync lost completed records and
//!   let their keys run again, while a failover to an in-sync replica and a
//!   whole resharding under concurrent duplicates lost nothing.
//! - **Redis eviction**: every record carries a TTL, so a server at its
//!   `maxmemory` under any policy but `noeviction` (`volatile-lru` is
//!   ElastiCache's default parameter group; `volatile-*` and `allkeys-*`
//!   alike) deletes records it acknowledged, and their keys run again (on a
//!   local server with `maxmemory 4mb` and `volatile-lru`, 393 of 400
//!   completed keys ran again). The store reads `INFO` (which ElastiCache and
//!   MemoryDB allow, unlike `CONFIG`) when it connects and every minute after
//!   (the policy can change on a live server), on every primary of a
//!   cluster, and refuses such a server: every call fails as `Misconfigured`
//!   (a 500), naming the policy. Use `maxmemory-policy noeviction` (on
//!   ElastiCache, a custom parameter group), a cache of its own for the
//!   records, or MemoryDB. Under `noeviction` a full server refuses new
//!   claims (`OOM`: `Throttled`, a 503) instead of forgetting old ones.
//!   `RedisStore::allow_eviction()` accepts an evicting server, with a
//!   warning, and `RedisStore::server_report()` returns the policy and
//!   `evicted_keys` of each node (it logs a warning when the count grows):
//!   watch it, each eviction may be a key that runs again. ElastiCache and
//!   MemoryDB also publish the count as the CloudWatch metric `Evictions`
//!   (per node): alarm on any value above 0. When `INFO` is
//!   refused (an ACL) or says nothing of the policy, the store warns once and
//!   goes on.
//! - **Clock offsets**: conditions use the engine's `now` on every store. A
//!   Redis record's TTL is counted from that `now` (`PEXPIRE`), on the
//!   server's own clock, so an offset between the function's clock and the
//!   server's changes nothing. DynamoDB's TTL deletes by AWS's clock: the
//!   record's `expiration` is an absolute epoch time, so a function whose
//!   clock is behind AWS's by more than the retention writes records that
//!   AWS already counts as expired and may delete at any moment (their keys
//!   then run again); a clock ahead only keeps records longer. Lambda's clock
//!   is kept by AWS, so this matters for a function run elsewhere (a
//!   container or a machine whose clock drifts). PostgreSQL deletes nothing by
//!   itself: `purge_expired` deletes what expired before the `now_s` it is
//!   given (the CLI's `purge-expired`: the clock of the machine that runs it).
//! - **Every store**: a store that cannot be reached fails closed (a 503 with
//!   `Retry-After`), never a run without a claim; a completion whose answer is
//!   lost leaves the claim until its lease passes, and the retry after it is
//!   told it takes over (`Takeover`). A store that is set up wrong is a 500
//!   (`idempotency-store-failed`) and an error in the log, never a 503 and
//!   never a run without a claim, even failing open: each store's module docs
//!   have the table of which backend error is which kind
//!   (`StoreErrorKind`: an outage, a conflict, misconfiguration, a rejected
//!   value).
//! - **PostgreSQL at any isolation level**: at `SERIALIZABLE` or `REPEATABLE
//!   READ` (a server, database or role default), concurrent duplicates abort
//!   each other's claims (`40001`); the engine claims again and reads the
//!   winner's record, so one runs and the others are told in progress.

use crate::{Fingerprint, StoreError};
use std::future::Future;

pub mod abandoned;
#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub mod dynamodb;
pub mod memory;
mod owner;
#[cfg(any(feature = "postgres", feature = "sqlx-postgres"))]
mod pg;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
mod record;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(any(
    feature = "postgres",
    feature = "sqlx-postgres",
    feature = "sqlx-mysql"
))]
mod sql_columns;
#[cfg(any(feature = "sqlx-mysql", feature = "sqlx-postgres"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlx-mysql", feature = "sqlx-postgres")))
)]
pub mod sqlx;
pub mod steps;
pub mod table_size;
pub mod transaction;

pub use crate::record_id::RecordId;
pub use abandoned::{AbandonedPage, AbandonedQuery, PageCursor};
pub use owner::OwnerToken;
pub use record::{Record, Status, UnknownStatus};
pub use steps::{RecordedStep, StepLimits, StepWrite, MAX_STEP_NAME_BYTES};
pub use table_size::{Accuracy, SizeSource, TableSize};
pub use transaction::{
    OpenTransaction, Transaction, TransactionLimits, TransactionalStore, Transactions,
};

/// A request to claim a key: write a fresh `IN_PROGRESS` record where there
/// is none ([`Store::claim`]), or in place of a lapsed claim
/// ([`Store::take_over`]).
#[derive(Debug, Clone)]
pub struct Claim {
    /// The record to claim.
    pub id: RecordId,
    /// The new claim's fencing token.
    pub owner: OwnerToken,
    /// The payload's fingerprint.
    pub fingerprint: Fingerprint,
    /// The current time, epoch milliseconds.
    pub now_ms: u64,
    /// Until when the claim is live, epoch milliseconds.
    pub lease_until_ms: u64,
    /// When the record expires, epoch seconds.
    pub expiration_s: u64,
    /// Which attempt this is: 1, or one more than the lapsed claim's.
    pub attempt: u32,
    /// When the first attempt began, epoch milliseconds: `now_ms`, or the
    /// lapsed claim's.
    pub first_started_ms: u64,
}

impl Claim {
    /// `Some` when this claim takes over a lapsed one (its attempt is past
    /// the first).
    pub fn takeover(&self) -> Option<Takeover> {
        (self.attempt > 1).then_some(Takeover {
            attempt: self.attempt,
            first_started_at_ms: self.first_started_ms,
        })
    }
}

/// This attempt took over a claim whose lease passed: an earlier attempt
/// began the operation and did not finish it (its invocation crashed or
/// timed out), **and may have acted** before it died.
///
/// An operation with an effect outside the store (a payment provider call)
/// should reconcile before acting: look the effect up at the provider by a
/// key derived from the idempotency key
/// ([`derive_key`](crate::derive_key)), and act only if it is not there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Takeover {
    /// This attempt's number: 2 for the first takeover, and so on.
    pub attempt: u32,
    /// When the first attempt began, epoch milliseconds.
    pub first_started_at_ms: u64,
}

/// A request to write a completed record and the operation's writes in one
/// atomic step, without a claim before them
/// ([`Engine::run_single_write`](crate::Engine::run_single_write)).
#[derive(Debug, Clone)]
pub struct Commit<W> {
    /// The record to write.
    pub id: RecordId,
    /// A fresh token, so that a retried commit that had landed is
    /// recognised.
    pub owner: OwnerToken,
    /// The payload's fingerprint.
    pub fingerprint: Fingerprint,
    /// The encoded outcome.
    pub response: Vec<u8>,
    /// The current time, epoch milliseconds.
    pub now_ms: u64,
    /// When the record expires, epoch seconds.
    pub expiration_s: u64,
    /// Writes to commit atomically with the record.
    pub writes: Vec<W>,
}

/// A request to extend a claim's lease, fenced on its owner.
#[derive(Debug, Clone)]
pub struct Extension {
    /// The claimed record.
    pub id: RecordId,
    /// The claim's fencing token.
    pub owner: OwnerToken,
    /// The new end of the lease, epoch milliseconds.
    pub lease_until_ms: u64,
    /// The record's expiration, epoch seconds, pushed past the new lease.
    pub expiration_s: u64,
    /// The current time, epoch milliseconds.
    pub now_ms: u64,
}

/// Which records [`Store::remove`] may delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Any record: completed, in progress, expired.
    Any,
    /// Any record but an `IN_PROGRESS` one, whose operation may be running.
    UnlessInProgress,
}

/// A request to complete a claim: store the outcome, fenced on the owner.
#[derive(Debug, Clone)]
pub struct Completion<W> {
    /// The claimed record.
    pub id: RecordId,
    /// The claim's fencing token.
    pub owner: OwnerToken,
    /// The encoded outcome.
    pub response: Vec<u8>,
    /// The current time, epoch milliseconds.
    pub now_ms: u64,
    /// The refreshed expiration, epoch seconds.
    pub expiration_s: u64,
    /// Writes to commit atomically with the completion.
    pub writes: Vec<W>,
}

/// What a conditional write (claim, completion, release) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conditional {
    /// The condition held and the write applied.
    Applied,
    /// The condition failed and nothing was written. Carries the record
    /// found under the id, as it was when the condition failed (or, where
    /// the backend does not return it with the failure, as a consistent
    /// read found it just after); `None` when there was none.
    ///
    /// The store does not interpret it: the engine tells the store's own
    /// landed write from another claim's, and a live record from one that
    /// expired meanwhile.
    Refused(Option<Record>),
}

/// Storage for idempotency records.
///
/// Implementations translate their backend's errors into [`StoreError`]s;
/// nothing above a store sees the backend.
pub trait Store: Send + Sync + 'static {
    /// An extra write that [`complete`](Store::complete) commits atomically
    /// with the completed record (see
    /// [`Engine::execute_transactional`](crate::Engine::execute_transactional)).
    type Write: Clone + Send + Sync + 'static;

    /// Whether [`commit`](Store::commit) is implemented: the store can write
    /// a completed record and the operation's writes in one atomic step,
    /// conditioned as a claim. Checked at compile time by the single-write
    /// entry points
    /// ([`Engine::run_single_write`](crate::Engine::run_single_write)), so
    /// a store without it never fails at request time: it does not build.
    ///
    /// ```compile_fail,E0080
    /// # use lambda_idempotency::{store::*, Attempt, Engine, Fingerprint, Json, MemoryStore, StoreError};
    /// /// A store without single write (it leaves `SINGLE_WRITE` at `false`).
    /// struct Plain(MemoryStore);
    ///
    /// impl Store for Plain {
    ///     type Write = ();
    /// #   async fn claim(&self, c: &Claim) -> Result<Conditional, StoreError> { self.0.claim(c).await }
    /// #   async fn take_over(&self, c: &Claim, o: &OwnerToken) -> Result<Conditional, StoreError> { self.0.take_over(c, o).await }
    /// #   async fn extend(&self, e: &Extension) -> Result<Conditional, StoreError> { self.0.extend(e).await }
    /// #   async fn complete(&self, _: Completion<()>) -> Result<Conditional, StoreError> { Ok(Conditional::Refused(None)) }
    /// #   async fn release(&self, i: &RecordId, o: &OwnerToken) -> Result<Conditional, StoreError> { self.0.release(i, o).await }
    /// #   async fn remove(&self, i: &RecordId, r: Removal) -> Result<Conditional, StoreError> { self.0.remove(i, r).await }
    /// #   async fn list_in_progress(&self, p: &str, l: usize) -> Result<Vec<Record>, StoreError> { self.0.list_in_progress(p, l).await }
    /// #   async fn get(&self, i: &RecordId, n: u64) -> Result<Option<Record>, StoreError> { self.0.get(i, n).await }
    ///     // …
    /// }
    ///
    /// # async fn example() {
    /// let engine = Engine::builder(Plain(MemoryStore::new())).build();
    /// let attempt = Attempt::new("s", "k", Fingerprint::of_bytes(b"p"));
    /// // error[E0080]: this store cannot commit in a single write: use Engine::run
    /// let _ = engine
    ///     .run_single_write(&attempt, &Json, |_| async { Ok::<_, ()>((1u8, Vec::new())) })
    ///     .await;
    /// # }
    /// # fn main() { let _ = example(); }
    /// ```
    const SINGLE_WRITE: bool = false;

    /// The database, as OpenTelemetry's semantic conventions name it in
    /// `db.system.name` (`aws.dynamodb`, `postgresql`, `mysql`, `redis`):
    /// the engine's spans of its store calls carry it. `other` unless the
    /// store says.
    const DB_SYSTEM: &'static str = "other";

    /// Whether [`record_step`](Store::record_step) and
    /// [`steps`](Store::steps) are implemented (recovery points,
    /// [`steps`](mod@steps)). Without them a step
    /// ([`ClaimHandle::step`](crate::ClaimHandle::step)) is refused as
    /// [`StoreErrorKind::Unsupported`](crate::StoreErrorKind::Unsupported)
    /// before it runs. `false` unless the store says.
    const STEPS: bool = false;

    /// Writes the claim's fresh `IN_PROGRESS` record if and only if no
    /// record is there, or the one there has expired
    /// ([`Record::is_expired`] at `claim.now_ms`). Otherwise refuses, with
    /// the record found.
    fn claim(&self, claim: &Claim) -> impl Future<Output = Result<Conditional, StoreError>> + Send;

    /// Writes the claim's `IN_PROGRESS` record in place of a lapsed one
    /// ([`Record::is_lapsed`]) if and only if the record there is still
    /// `IN_PROGRESS` under `lapsed`, with its lease passed at
    /// `claim.now_ms`. Otherwise refuses, with the record found. Of
    /// concurrent takeovers of one lapsed claim, one applies.
    fn take_over(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> impl Future<Output = Result<Conditional, StoreError>> + Send;

    /// Sets the claim's lease end and expiration if and only if the record
    /// is still `IN_PROGRESS` under this owner (the fence). Otherwise
    /// refuses, with the record found.
    fn extend(
        &self,
        extension: &Extension,
    ) -> impl Future<Output = Result<Conditional, StoreError>> + Send;

    /// Marks the claim `COMPLETED` with its outcome, and commits the extra
    /// writes with it, all or nothing, if and only if the record is still
    /// `IN_PROGRESS` under this owner (the fence). Otherwise refuses, with
    /// the record found. A failure of one of the extra writes is an error
    /// ([`StoreErrorKind::WriteRejected`](crate::StoreErrorKind::WriteRejected)
    /// when retrying cannot help), not a refusal.
    fn complete(
        &self,
        completion: Completion<Self::Write>,
    ) -> impl Future<Output = Result<Conditional, StoreError>> + Send;

    /// Deletes the record if and only if it is still `IN_PROGRESS` under
    /// this owner, so that a retry can run again. Otherwise refuses, with
    /// the record found (`None` when the record is gone).
    fn release(
        &self,
        id: &RecordId,
        owner: &OwnerToken,
    ) -> impl Future<Output = Result<Conditional, StoreError>> + Send;

    /// Writes the commit's `COMPLETED` record, with its writes, all or
    /// nothing, if and only if the claim condition holds (no record, an
    /// expired one, or a lapsed claim: that is, unless [`Record::is_live`]
    /// at `commit.now_ms`), and the lapsed claim holds no response (one
    /// that does is a completed record whose status was changed in the
    /// table, never replaced). Otherwise refuses, with the record found. A
    /// concurrent write to the record is a
    /// [`StoreErrorKind::Conflict`](crate::StoreErrorKind::Conflict); a
    /// failure of one of the writes is an error, as for
    /// [`complete`](Store::complete).
    ///
    /// Only called when [`SINGLE_WRITE`](Store::SINGLE_WRITE) is `true`;
    /// the default refuses as misconfigured.
    fn commit(
        &self,
        commit: Commit<Self::Write>,
    ) -> impl Future<Output = Result<Conditional, StoreError>> + Send {
        drop(commit);
        std::future::ready(Err(StoreError::new(
            crate::StoreErrorKind::Misconfigured,
            "this store cannot commit a request in a single write",
        )))
    }

    /// Deletes the record, whatever its owner, if `removal` allows it: for
    /// operators ([`Engine::forget`](crate::Engine::forget)). Refuses, with
    /// the record found, an `IN_PROGRESS` record under
    /// [`Removal::UnlessInProgress`]; refuses with `None` when there is no
    /// record.
    fn remove(
        &self,
        id: &RecordId,
        removal: Removal,
    ) -> impl Future<Output = Result<Conditional, StoreError>> + Send;

    /// Up to `limit` `IN_PROGRESS` records whose id starts with `prefix`
    /// (live claims, and stuck ones whose lease passed), expired or not:
    /// for operators ([`Engine::list_in_progress`](crate::Engine::list_in_progress)).
    /// A scan: not for request paths.
    fn list_in_progress(
        &self,
        prefix: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Record>, StoreError>> + Send;

    /// Reads the record with strong consistency; an expired record is
    /// absent. Operators reach it through
    /// [`Engine::inspect`](crate::Engine::inspect).
    fn get(
        &self,
        id: &RecordId,
        now_ms: u64,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// Reads the record the cheapest way the backend offers, which may be
    /// stale (DynamoDB's eventually consistent `GetItem`: half the read
    /// units of [`get`](Store::get)); an expired record is absent. The
    /// engine reads this way before a claim only when asked to
    /// ([`EngineBuilder::read_before_claim`](crate::EngineBuilder::read_before_claim)),
    /// and acts on what it finds only to answer from a completed record,
    /// which does not change until it expires; anything else is decided
    /// by the conditional claim, as without the read. The default is
    /// [`get`](Store::get).
    fn peek(
        &self,
        id: &RecordId,
        now_ms: u64,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send {
        self.get(id, now_ms)
    }

    /// How many records the store holds, read the cheapest way its backend
    /// offers (its own count or estimate, never a scan), for a gauge an
    /// operator scrapes or schedules
    /// ([`Engine::sample_table_size`](crate::Engine::sample_table_size));
    /// `now_ms` tells a store that counts itself which records have
    /// expired. `None`, the default, when the store has no cheap count:
    /// [`table_size`](mod@table_size) has each store's answer.
    fn table_size(
        &self,
        now_ms: u64,
    ) -> impl Future<Output = Result<Option<TableSize>, StoreError>> + Send {
        let _ = now_ms;
        std::future::ready(Ok(None))
    }

    /// Records a finished step of the operation on its record
    /// ([`ClaimHandle::step`](crate::ClaimHandle::step)): appends
    /// `step.name` and `step.output` to the record's steps if and only if
    /// the record is still `IN_PROGRESS` under `step.owner` (the fence, as
    /// for [`complete`](Store::complete)) and holds exactly `step.index`
    /// steps. Otherwise refuses, with the record found. A claim
    /// ([`claim`](Store::claim)) starts a record without steps; a takeover
    /// ([`take_over`](Store::take_over)) and an extension keep them.
    ///
    /// Optional ([`steps`](mod@steps)): the default answers
    /// [`StoreErrorKind::Unsupported`](crate::StoreErrorKind::Unsupported).
    fn record_step(
        &self,
        step: &StepWrite,
    ) -> impl Future<Output = Result<Conditional, StoreError>> + Send {
        let _ = step;
        std::future::ready(Err(steps_unsupported()))
    }

    /// The steps recorded on the `IN_PROGRESS` record `id`, in the order
    /// they were recorded, read with strong consistency; none when there is
    /// no such record (absent, expired or completed).
    ///
    /// Optional, with [`record_step`](Store::record_step): the default
    /// answers [`StoreErrorKind::Unsupported`](crate::StoreErrorKind::Unsupported).
    fn steps(
        &self,
        id: &RecordId,
        now_ms: u64,
    ) -> impl Future<Output = Result<Vec<RecordedStep>, StoreError>> + Send {
        let _ = (id, now_ms);
        std::future::ready(Err(steps_unsupported()))
    }

    /// One page of abandoned claims ([`abandoned`](mod@abandoned)): up to
    /// `query.limit` records that [`AbandonedQuery::matches`] (`IN_PROGRESS`
    /// under the prefix, not expired, their lease ended before
    /// `query.lease_before_ms`), from where `query.cursor` says, with the
    /// cursor of the next page (`None` once the walk is over). Each call does
    /// a bounded amount of work; a walk lists every record that stayed
    /// abandoned throughout it at least once. A scan: for operators and the
    /// completer, never request paths.
    ///
    /// Optional: the default answers
    /// [`StoreErrorKind::Unsupported`](crate::StoreErrorKind::Unsupported).
    fn list_abandoned(
        &self,
        query: &AbandonedQuery,
    ) -> impl Future<Output = Result<AbandonedPage, StoreError>> + Send {
        let _ = query;
        std::future::ready(Err(StoreError::new(
            crate::StoreErrorKind::Unsupported,
            "this store does not list abandoned claims: Store::list_abandoned is not implemented",
        )))
    }

    /// The store's transactions, when it can run an operation inside one
    /// with its claim ([`transaction`](mod@transaction)); `None`, the
    /// default, when it cannot. A [`TransactionalStore`] returns itself.
    fn transactions(&self) -> Option<&dyn Transactions<Self::Write>> {
        None
    }
}

/// What a store without recovery points answers.
fn steps_unsupported() -> StoreError {
    StoreError::new(
        crate::StoreErrorKind::Unsupported,
        "this store does not record steps (recovery points): Store::record_step is not implemented",
    )
}
