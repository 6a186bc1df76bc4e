//! One simulated history: the real engine over a simulated store, on a
//! scheduler that a seed drives.
//!
//! - **Tasks.** Each attempt is a future (`Engine::run` or
//!   `Engine::run_single_write`) polled here by hand, with a waker that
//!   only marks it ready. Which ready task runs next is the seed's choice.
//! - **The store.** [`SimStore`] implements the real `Store` trait: a call
//!   is a request put on a simulated network and a future that waits for
//!   its answer. The scheduler applies requests in a seeded order (delay,
//!   reordering), to a real [`MemoryStore`] (the stores' semantics: the
//!   conditions, expiry by the caller's `now`), with faults: an outage, a
//!   throttle or a conflict (nothing written), or an answer lost after the
//!   write landed (the SDK sends it again, later, or gives up with a
//!   timeout). An answer is delivered at a later step, so other writes land
//!   between a write and its answer.
//! - **Crashes.** Dropping a task's future at any of its await points is a
//!   crash; its requests already sent may still land.
//! - **Time.** A virtual true time moves only when the scheduler says so,
//!   in steps of [`QUANTUM_MS`], and tokio's paused clock moves with it
//!   (the heartbeat's interval, the conflict backoff, the operations'
//!   work). Each process (an engine) reads it through its own clock, offset
//!   by up to [`SKEW_MS`] either way. The engine's backoff is random (up to
//!   160 ms): shorter than a quantum, it always ends at the next step, so
//!   the history stays the seed's.
//! - **Inside a store transaction.** An attempt of the transactional way
//!   (`Engine::run_in_transaction`) runs in one of the memory store's
//!   transactions: its claim locks the key (a claim of another
//!   transaction's waits, at most its claim wait, on tokio's paused clock;
//!   a write outside to the key is a conflict), and nothing it wrote is
//!   seen until its `COMMIT`, which crosses the simulated network as the
//!   other writes do (faults, an answer lost after it landed). A crash
//!   drops the transaction: everything rolls back.
//! - **Waiting in a process.** Several attempts of one process share its
//!   engine: a duplicate of a run under way there is answered by that run,
//!   and three in ten wait on it (`Attempt::wait_in_process`) for up to 40
//!   quanta, its replay when it completes, or the claim when it does not.

use crate::rng::Rng;
use futures::FutureExt;
use lambda_idempotency::store::memory::{MemoryTransaction, MemoryWrite};
use lambda_idempotency::{
    split::{self, SplitAttempt, SplitClaim},
    store::{
        transaction::TransactionFuture, Claim, Commit, Completion, Conditional, Extension,
        OpenTransaction, OwnerToken, Record, RecordId, RecordedStep, Removal, StepWrite, Store,
        Transaction, TransactionLimits, TransactionalStore, Transactions,
    },
    Attempt, ClaimHandle, Clock, Engine, Error, Fingerprint, Json, MemoryStore, Mode, OutcomeKind,
    StoreError, StoreErrorKind,
};
use serde::{Deserialize, Serialize};
use std::{
    cell::Cell,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, MutexGuard,
    },
    task::{Context, Poll, Wake, Waker},
    time::Duration,
};

/// The virtual epoch a history starts at (September 2020): far from the
/// machine's own clock, so a lease measured on the wrong clock shows.
pub const EPOCH_MS: u64 = 1_600_000_000_000;
/// Time moves in steps of this many milliseconds: longer than the engine's
/// longest conflict backoff (160 ms).
pub const QUANTUM_MS: u64 = 200;
/// The largest offset of a process's clock from the true time, either way:
/// Lambda's hosts are kept "well under a second" apart (RELIABILITY.md),
/// so two clocks differ by up to 2 × this.
pub const SKEW_MS: u64 = 400;
/// The prefix of every record id.
pub const PREFIX: &str = "sim";

thread_local! {
    /// The task being polled: a store call names its caller by it.
    static CURRENT: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// How an attempt calls the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// `Engine::run` in `Mode::Plain`.
    Plain,
    /// `Engine::run` with writes: transactional completion.
    Transactional,
    /// `Engine::run_single_write`.
    SingleWrite,
    /// `Engine::run_in_transaction`: the operation's effect written in the
    /// transaction that holds the claim.
    InTransaction,
    /// A durable execution's use of the engine (`split::claim`, then
    /// `split::complete`, or `split::release` when the work fails), under
    /// an owner token of the execution's own, each step tried again on a
    /// store error under the same token, as the durable crate's steps are.
    Split,
}

/// A write or read as the store saw it, with the record before and after.
#[derive(Debug, Clone)]
pub enum Op {
    Claim(Claim),
    TakeOver(Claim, OwnerToken),
    Extend(Extension),
    Complete(Completion<MemoryWrite>),
    Release(RecordId, OwnerToken),
    Commit(Commit<MemoryWrite>),
    Get(RecordId, u64),
    /// A read that may be stale (`Store::peek`): it may miss a record
    /// that is there.
    Peek(RecordId, u64),
    /// A transaction's `COMMIT`: its claim and its completion (with the
    /// operation's effect) land together, or nothing does.
    CommitTransaction(Box<Committing>),
    /// A step's output recorded on the record (`Store::record_step`).
    Step(StepWrite),
    /// The record's steps read (`Store::steps`).
    Steps(RecordId, u64),
}

/// What a transaction commits, and the transaction.
#[derive(Clone)]
pub struct Committing {
    pub claim: Claim,
    pub completion: Completion<MemoryWrite>,
    transaction: Arc<dyn Transaction<MemoryWrite>>,
}

impl std::fmt::Debug for Committing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Committing")
            .field("claim", &self.claim)
            .field("completion", &self.completion)
            .finish_non_exhaustive()
    }
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Claim(_) => "claim",
            Op::TakeOver(..) => "take_over",
            Op::Extend(_) => "extend",
            Op::Complete(_) => "complete",
            Op::Release(..) => "release",
            Op::Commit(_) => "commit",
            Op::Get(..) => "get",
            Op::Peek(..) => "peek",
            Op::CommitTransaction(_) => "COMMIT",
            Op::Step(_) => "step",
            Op::Steps(..) => "steps",
        }
    }

    pub fn id(&self) -> &RecordId {
        match self {
            Op::Claim(c) | Op::TakeOver(c, _) => &c.id,
            Op::Extend(e) => &e.id,
            Op::Complete(c) => &c.id,
            Op::Release(id, _) | Op::Get(id, _) | Op::Peek(id, _) => id,
            Op::Commit(c) => &c.id,
            Op::CommitTransaction(c) => &c.claim.id,
            Op::Step(s) => &s.id,
            Op::Steps(id, _) => id,
        }
    }

    fn is_write(&self) -> bool {
        !matches!(self, Op::Get(..) | Op::Peek(..) | Op::Steps(..))
    }
}

/// What a store call answered, kept cloneable.
#[derive(Debug, Clone)]
pub enum Answer {
    Write(Conditional),
    Read(Option<Record>),
    Steps(Vec<RecordedStep>),
    Fault(StoreErrorKind, &'static str),
}

impl Answer {
    pub fn short(&self) -> String {
        match self {
            Answer::Write(Conditional::Applied) => "applied".into(),
            Answer::Write(Conditional::Refused(None)) => "refused(none)".into(),
            Answer::Write(Conditional::Refused(Some(r))) => format!("refused({})", brief(r)),
            Answer::Read(None) => "none".into(),
            Answer::Read(Some(r)) => brief(r),
            Answer::Steps(steps) => format!(
                "[{}]",
                steps
                    .iter()
                    .map(|step| step.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Answer::Fault(kind, why) => format!("ERR {} ({why})", kind.as_str()),
        }
    }
}

fn brief(record: &Record) -> String {
    format!(
        "{} try {} lease {} exp {}",
        record.status.as_str(),
        record.attempt,
        record.lease_until_ms.map_or("-".into(), ms),
        record.expiration_s.saturating_sub(EPOCH_MS / 1000)
    )
}

/// Epoch milliseconds as seconds since the history's epoch.
pub fn ms(epoch_ms: u64) -> String {
    let rel = epoch_ms as i64 - EPOCH_MS as i64;
    format!("{:.1}s", rel as f64 / 1000.0)
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    Ok { kind: OutcomeKind, value: u64 },
    InProgress,
    KeyReused,
    Store(StoreErrorKind),
    LeaseLost,
    WritesNotCommitted,
    TimeLimitExceeded,
    Operation,
}

/// One entry of the history.
// Landings carry the records before and after; the history is read once,
// by the checker, and boxing them would cost an allocation a landing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Event {
    /// An attempt arrives at a process.
    Arrive {
        att: usize,
        key: usize,
        payload: u8,
        process: usize,
        way: Way,
        clock_ms: u64,
    },
    /// The attempt is first polled: the engine reads its clock now.
    Begin { att: usize, clock_ms: u64 },
    /// A store request landed (or failed without landing).
    Landed {
        req: usize,
        att: usize,
        op: Op,
        before: Option<Record>,
        after: Option<Record>,
        answer: Answer,
        /// The answer will be lost: `true` when the SDK sends it again.
        lost: Option<bool>,
    },
    /// The operation began.
    Start {
        att: usize,
        exec: u64,
        key: usize,
        takeover: Option<u32>,
        claimed: bool,
    },
    /// The operation returned, or was dropped (`crashed`).
    End { exec: u64, crashed: bool },
    /// The attempt's future was dropped.
    Crash { att: usize },
    /// A transaction of the attempt's holds the key: from its claim in the
    /// transaction to its end.
    Held { att: usize, key: RecordId },
    /// The transaction ended (committed, rolled back, or dropped).
    Unheld { att: usize, key: RecordId },
    /// A step's body began (its effect: a provider's call): step `step`
    /// of the attempt's operation on its key (`ClaimHandle::step`).
    StepEffect { att: usize, key: usize, step: usize },
    /// The step's body finished, before its output is recorded.
    StepDone { att: usize, key: usize, step: usize },
    /// The attempt returned.
    Done {
        att: usize,
        ending: Ending,
        clock_ms: u64,
    },
    /// True time moved.
    Advance,
}

/// An event and the true time it happened at.
#[derive(Debug, Clone)]
pub struct Entry {
    pub at_ms: u64,
    pub event: Event,
}

/// What a history's attempts were: their process's clock offset, their
/// way, and whether they are still running.
#[derive(Debug, Clone)]
pub struct AttemptInfo {
    pub key: usize,
    pub payload: u8,
    pub skew: i64,
    /// Its process's engine runs the heartbeat.
    pub heartbeat: bool,
    pub way: Way,
    pub faults: u32,
    pub conflicts: u32,
    /// How many steps its operation takes (`ClaimHandle::step`): 0 unless
    /// it runs in steps.
    pub steps: usize,
}

/// The configuration of one history, drawn from its seed.
#[derive(Debug, Clone)]
pub struct Config {
    pub retention_s: u64,
    pub default_lease_ms: u64,
    pub max_lease_ms: u64,
    pub processes: Vec<Process>,
    pub attempts: usize,
    pub keys: usize,
    pub p_fault: u32,
    pub p_conflict: u32,
    pub p_lost: u32,
    pub p_crash: u32,
    pub outage: Option<(u64, u64)>,
}

#[derive(Debug, Clone)]
pub struct Process {
    pub skew: i64,
    pub heartbeat: bool,
    pub cache: usize,
}

impl Config {
    pub fn draw(rng: &mut Rng) -> Self {
        let default_lease_ms = 1_000 * rng.range(1, 4);
        let processes = (0..rng.range(1, 4))
            .map(|_| Process {
                skew: rng.range(0, 2 * SKEW_MS + 1) as i64 - SKEW_MS as i64,
                heartbeat: rng.chance(30),
                cache: if rng.chance(50) { 8 } else { 0 },
            })
            .collect();
        let faulty = rng.chance(70);
        let start = EPOCH_MS + QUANTUM_MS * rng.range(0, 40);
        Config {
            retention_s: rng.range(6, 30),
            default_lease_ms,
            max_lease_ms: default_lease_ms * rng.range(1, 3),
            processes,
            attempts: rng.range(2, 8) as usize,
            keys: rng.range(1, 3) as usize,
            p_fault: if faulty { rng.range(0, 15) as u32 } else { 0 },
            p_conflict: if faulty { rng.range(0, 15) as u32 } else { 0 },
            p_lost: if faulty { rng.range(0, 25) as u32 } else { 0 },
            p_crash: rng.range(0, 4) as u32,
            outage: (faulty && rng.chance(15))
                .then(|| (start, start + QUANTUM_MS * rng.range(1, 15))),
        }
    }
}

/// A request on the simulated network.
struct Request {
    att: usize,
    op: Op,
    /// Sent again after its first answer was lost.
    resent: bool,
    answer: Option<Answer>,
    delivered: bool,
    waker: Option<Waker>,
}

/// Everything the tasks and the scheduler share.
pub struct World {
    pub now_ms: u64,
    pub history: Vec<Entry>,
    requests: Vec<Request>,
    next_exec: u64,
    /// The operations' waits: until when, and whom to wake.
    timers: Vec<(u64, Arc<AtomicBool>, Waker)>,
}

type Shared = Arc<Mutex<World>>;

fn lock(world: &Shared) -> MutexGuard<'_, World> {
    world.lock().unwrap_or_else(|p| p.into_inner())
}

impl World {
    fn log(&mut self, event: Event) {
        let at_ms = self.now_ms;
        self.history.push(Entry { at_ms, event });
    }
}

/// A process's clock: the true time, offset.
#[derive(Debug, Clone)]
struct SimClock {
    world: Shared,
    skew: i64,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("World")
    }
}

impl Clock for SimClock {
    fn now_ms(&self) -> u64 {
        (lock(&self.world).now_ms as i64 + self.skew) as u64
    }
}

/// The simulated store: every call goes through the network (in a
/// transaction, its `COMMIT`).
#[derive(Clone)]
pub struct SimStore {
    world: Shared,
    memory: MemoryStore,
}

struct Reply {
    world: Shared,
    req: usize,
}

impl Future for Reply {
    type Output = Answer;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        let mut world = lock(&self.world);
        let request = &mut world.requests[self.req];
        if request.delivered {
            return Poll::Ready(request.answer.clone().expect("a delivered answer"));
        }
        request.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl SimStore {
    fn send(&self, op: Op) -> Reply {
        let mut world = lock(&self.world);
        let att = CURRENT.with(Cell::get);
        world.requests.push(Request {
            att,
            op,
            resent: false,
            answer: None,
            delivered: false,
            waker: None,
        });
        Reply {
            world: Arc::clone(&self.world),
            req: world.requests.len() - 1,
        }
    }

    async fn write(&self, op: Op) -> Result<Conditional, StoreError> {
        match self.send(op).await {
            Answer::Write(conditional) => Ok(conditional),
            Answer::Fault(kind, why) => Err(StoreError::new(kind, why)),
            Answer::Read(_) | Answer::Steps(_) => unreachable!("a write answered as a read"),
        }
    }
}

impl Store for SimStore {
    type Write = MemoryWrite;

    const SINGLE_WRITE: bool = true;
    const STEPS: bool = true;

    async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
        self.write(Op::Claim(claim.clone())).await
    }

    async fn take_over(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        self.write(Op::TakeOver(claim.clone(), lapsed.clone()))
            .await
    }

    async fn extend(&self, extension: &Extension) -> Result<Conditional, StoreError> {
        self.write(Op::Extend(extension.clone())).await
    }

    async fn complete(
        &self,
        completion: Completion<MemoryWrite>,
    ) -> Result<Conditional, StoreError> {
        self.write(Op::Complete(completion)).await
    }

    async fn release(&self, id: &RecordId, owner: &OwnerToken) -> Result<Conditional, StoreError> {
        self.write(Op::Release(id.clone(), owner.clone())).await
    }

    async fn commit(&self, commit: Commit<MemoryWrite>) -> Result<Conditional, StoreError> {
        self.write(Op::Commit(commit)).await
    }

    async fn remove(&self, _: &RecordId, _: Removal) -> Result<Conditional, StoreError> {
        unreachable!("operators do not call the simulated store")
    }

    async fn list_in_progress(&self, _: &str, _: usize) -> Result<Vec<Record>, StoreError> {
        unreachable!("operators do not call the simulated store")
    }

    async fn get(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        match self.send(Op::Get(id.clone(), now_ms)).await {
            Answer::Read(record) => Ok(record),
            Answer::Fault(kind, why) => Err(StoreError::new(kind, why)),
            _ => unreachable!("a read answered as a write"),
        }
    }

    async fn record_step(&self, step: &StepWrite) -> Result<Conditional, StoreError> {
        self.write(Op::Step(step.clone())).await
    }

    async fn steps(&self, id: &RecordId, now_ms: u64) -> Result<Vec<RecordedStep>, StoreError> {
        match self.send(Op::Steps(id.clone(), now_ms)).await {
            Answer::Steps(steps) => Ok(steps),
            Answer::Fault(kind, why) => Err(StoreError::new(kind, why)),
            _ => unreachable!("a read of steps answered otherwise"),
        }
    }

    async fn peek(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        match self.send(Op::Peek(id.clone(), now_ms)).await {
            Answer::Read(record) => Ok(record),
            Answer::Fault(kind, why) => Err(StoreError::new(kind, why)),
            _ => unreachable!("a read answered as a write"),
        }
    }

    fn transactions(&self) -> Option<&dyn Transactions<MemoryWrite>> {
        Some(self)
    }
}

impl Transactions<MemoryWrite> for SimStore {
    fn begin<'a>(
        &'a self,
        limits: &'a TransactionLimits,
    ) -> TransactionFuture<'a, Arc<dyn Transaction<MemoryWrite>>> {
        Box::pin(async move {
            let inner = self.memory.begin(limits).await?;
            let transaction: Arc<dyn Transaction<MemoryWrite>> = Arc::new(SimTransaction {
                store: self.clone(),
                att: CURRENT.with(Cell::get),
                inner,
                held: Mutex::new(None),
                completion: Mutex::new(None),
            });
            Ok(transaction)
        })
    }
}

impl TransactionalStore for SimStore {
    type Transaction = MemoryTransaction;
}

/// A memory store transaction, its claim logged when it applies (the key
/// is then held) and its `COMMIT` sent over the simulated network.
struct SimTransaction {
    store: SimStore,
    att: usize,
    inner: Arc<dyn Transaction<MemoryWrite>>,
    /// The claim this transaction holds the key with, until it ends.
    held: Mutex<Option<Claim>>,
    completion: Mutex<Option<Completion<MemoryWrite>>>,
}

impl SimTransaction {
    /// Logs a claim (or a takeover) that applied in the transaction: its
    /// record, as the transaction sees it, and the key held.
    fn claimed(&self, op: Op, claim: &Claim, before: Option<Record>) {
        let after = Record {
            id: claim.id.clone(),
            status: lambda_idempotency::store::Status::InProgress,
            owner: claim.owner.clone(),
            fingerprint: claim.fingerprint.clone(),
            expiration_s: claim.expiration_s,
            lease_until_ms: Some(claim.lease_until_ms),
            response: None,
            created_at_ms: Some(claim.now_ms),
            attempt: claim.attempt,
            first_started_ms: Some(claim.first_started_ms),
            completed_at_ms: None,
        };
        let mut world = lock(&self.store.world);
        world.log(Event::Landed {
            req: usize::MAX,
            att: self.att,
            op,
            before,
            after: Some(after),
            answer: Answer::Write(Conditional::Applied),
            lost: None,
        });
        world.log(Event::Held {
            att: self.att,
            key: claim.id.clone(),
        });
        *self.held.lock().unwrap() = Some(claim.clone());
    }

    /// The key is no longer held: logged once.
    fn unheld(&self) {
        if let Some(claim) = self.held.lock().unwrap().take() {
            lock(&self.store.world).log(Event::Unheld {
                att: self.att,
                key: claim.id,
            });
        }
    }
}

impl Drop for SimTransaction {
    fn drop(&mut self) {
        self.unheld();
    }
}

impl OpenTransaction for SimTransaction {
    fn roll_back_writes(&self) -> TransactionFuture<'_, ()> {
        self.inner.roll_back_writes()
    }
}

impl Transaction<MemoryWrite> for SimTransaction {
    fn claim<'a>(&'a self, claim: &'a Claim) -> TransactionFuture<'a, Conditional> {
        Box::pin(async move {
            let before = self.store.memory.record(&claim.id);
            let claimed = self.inner.claim(claim).await;
            if matches!(claimed, Ok(Conditional::Applied)) {
                self.claimed(Op::Claim(claim.clone()), claim, before);
            }
            claimed
        })
    }

    fn take_over<'a>(
        &'a self,
        claim: &'a Claim,
        lapsed: &'a OwnerToken,
    ) -> TransactionFuture<'a, Conditional> {
        Box::pin(async move {
            let before = self.store.memory.record(&claim.id);
            let taken = self.inner.take_over(claim, lapsed).await;
            if matches!(taken, Ok(Conditional::Applied)) {
                self.claimed(Op::TakeOver(claim.clone(), lapsed.clone()), claim, before);
            }
            taken
        })
    }

    fn hold(&self) -> TransactionFuture<'_, ()> {
        self.inner.hold()
    }

    fn write(&self, writes: Vec<MemoryWrite>) -> TransactionFuture<'_, ()> {
        self.inner.write(writes)
    }

    fn complete(&self, completion: Completion<MemoryWrite>) -> TransactionFuture<'_, Conditional> {
        *self.completion.lock().unwrap() = Some(completion.clone());
        self.inner.complete(completion)
    }

    fn commit(&self) -> TransactionFuture<'_, ()> {
        Box::pin(async move {
            let claim = self.held.lock().unwrap().clone();
            let completion = self.completion.lock().unwrap().clone();
            let (Some(claim), Some(completion)) = (claim, completion) else {
                // Nothing claimed (idempotency off): nothing to simulate.
                return self.inner.commit().await;
            };
            // From here the COMMIT is on the wire, and its landing (or its
            // failure) ends the transaction (`land` logs it), not this
            // handle's drop: a process that crashes now still has its
            // COMMIT delivered before its connection's close, as TCP does.
            self.held.lock().unwrap().take();
            let op = Op::CommitTransaction(Box::new(Committing {
                claim,
                completion,
                transaction: Arc::clone(&self.inner),
            }));
            match self.store.write(op).await {
                Ok(_) => {
                    self.unheld();
                    Ok(())
                }
                Err(error) => Err(error),
            }
        })
    }

    fn roll_back(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            self.inner.roll_back().await;
            self.unheld();
        })
    }

    fn handed(&self) -> Arc<dyn OpenTransaction> {
        self.inner.handed()
    }
}

/// Applies `op` to the memory store, which never waits.
fn apply(memory: &MemoryStore, op: &Op) -> Answer {
    let answer = match op {
        Op::Claim(c) => memory.claim(c).now_or_never().map(|r| r.map(Answer::Write)),
        Op::TakeOver(c, o) => memory
            .take_over(c, o)
            .now_or_never()
            .map(|r| r.map(Answer::Write)),
        Op::Extend(e) => memory
            .extend(e)
            .now_or_never()
            .map(|r| r.map(Answer::Write)),
        Op::Complete(c) => memory
            .complete(c.clone())
            .now_or_never()
            .map(|r| r.map(Answer::Write)),
        Op::Release(id, o) => memory
            .release(id, o)
            .now_or_never()
            .map(|r| r.map(Answer::Write)),
        Op::Commit(c) => memory
            .commit(c.clone())
            .now_or_never()
            .map(|r| r.map(Answer::Write)),
        Op::Get(id, now) | Op::Peek(id, now) => memory
            .get(id, *now)
            .now_or_never()
            .map(|r| r.map(Answer::Read)),
        Op::CommitTransaction(c) => c
            .transaction
            .commit()
            .now_or_never()
            .map(|r| r.map(|()| Answer::Write(Conditional::Applied))),
        Op::Step(s) => memory
            .record_step(s)
            .now_or_never()
            .map(|r| r.map(Answer::Write)),
        Op::Steps(id, now) => memory
            .steps(id, *now)
            .now_or_never()
            .map(|r| r.map(Answer::Steps)),
    };
    match answer.expect("the memory store never waits") {
        Ok(answer) => answer,
        Err(error) => Answer::Fault(error.kind(), "rejected by the store"),
    }
}

/// An operation's work: a wait on the virtual time, woken by the scheduler
/// (not a tokio timer, so that it never fires in the same step as the
/// heartbeat's: `tokio::select!` polls its branches in an order of its own).
struct Work {
    world: Shared,
    until_ms: u64,
    /// Set when the scheduler fires its timer: until then it waits, even
    /// if the time has passed (the heartbeat's turn comes first).
    fired: Arc<AtomicBool>,
}

impl Future for Work {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.fired.load(Ordering::Relaxed) {
            return Poll::Ready(());
        }
        let until = self.until_ms;
        let fired = Arc::clone(&self.fired);
        lock(&self.world)
            .timers
            .push((until, fired, cx.waker().clone()));
        Poll::Pending
    }
}

/// What the operation returns, and what is stored and replayed.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Receipt {
    exec: u64,
}

/// Marks the operation's end when it returns or is dropped (a crash).
struct ExecGuard {
    world: Shared,
    exec: u64,
    returned: bool,
}

impl Drop for ExecGuard {
    fn drop(&mut self) {
        let mut world = lock(&self.world);
        world.log(Event::End {
            exec: self.exec,
            crashed: !self.returned,
        });
    }
}

/// What the operation of one attempt does.
#[derive(Debug, Clone)]
struct Plan {
    /// Its work: waits of so many milliseconds.
    work: Vec<u64>,
    /// Extends its lease by hand between waits, by this much.
    extend_by: Option<u64>,
    fails: bool,
    /// Waits this long on a run of its key in the same process
    /// (`Attempt::wait_in_process`), in milliseconds.
    wait_in_process: Option<u64>,
    /// Inside a transaction: how long its claim waits on another's, and
    /// how long it may last.
    limits: TransactionLimits,
    /// A durable execution's lease: nothing renews it.
    split_lease_ms: u64,
    /// Each wait of its work is a step (`ClaimHandle::step`) named after
    /// its place, `s0`, `s1`, …
    steps: bool,
}

struct TaskWaker(AtomicBool);

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }
}

struct Task {
    future: Option<Pin<Box<dyn Future<Output = ()>>>>,
    waker: Arc<TaskWaker>,
}

/// A finished history.
pub struct History {
    pub config: Config,
    pub attempts: Vec<AttemptInfo>,
    pub entries: Vec<Entry>,
    /// The scheduler gave up: something never finished.
    pub hung: Option<String>,
}

/// Runs the history of `seed`.
pub fn run(seed: u64) -> History {
    run_with(seed, Options::default())
}

/// What a history's engines and attempts do beside the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Every process's engine reads before it claims
    /// (`EngineBuilder::read_before_claim`).
    pub read_before_claim: bool,
    /// Two attempts in five are durable executions ([`Way::Split`]).
    pub split_executions: bool,
    /// The plain runs' work is done in steps (`ClaimHandle::step`), each
    /// recorded on the record (recovery points).
    pub steps: bool,
}

/// The history of `seed`, with `options`.
pub fn run_with(seed: u64, options: Options) -> History {
    let Options {
        read_before_claim,
        split_executions,
        steps: in_steps,
    } = options;
    let mut rng = Rng::new(seed);
    let config = Config::draw(&mut rng);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let _context = runtime.enter();
    let world: Shared = Arc::new(Mutex::new(World {
        now_ms: EPOCH_MS,
        history: Vec::with_capacity(128),
        requests: Vec::with_capacity(64),
        next_exec: 0,
        timers: Vec::new(),
    }));
    let memory = MemoryStore::new();
    let engines: Vec<Engine<SimStore>> = config
        .processes
        .iter()
        .map(|process| {
            Engine::builder(SimStore {
                world: Arc::clone(&world),
                memory: memory.clone(),
            })
            .key_prefix(PREFIX)
            .retention(Duration::from_secs(config.retention_s))
            .default_lease(Duration::from_millis(config.default_lease_ms))
            .max_lease(Duration::from_millis(config.max_lease_ms))
            .heartbeat(process.heartbeat)
            .cache(process.cache)
            .read_before_claim(read_before_claim)
            .clock(SimClock {
                world: Arc::clone(&world),
                skew: process.skew,
            })
            .build()
        })
        .collect();

    let mut attempts: Vec<AttemptInfo> = Vec::new();
    let mut tasks: Vec<Task> = Vec::new();
    let mut steps = 0u32;
    let mut hung = None;
    let max_steps = 4_000;
    loop {
        steps += 1;
        if steps > max_steps {
            hung = Some(format!("still running after {max_steps} steps"));
            break;
        }
        // Every task woken by the last step runs now, in a fixed order: no
        // two wakes of one task are ever pending together, so the order in
        // which `tokio::select!` polls its branches changes nothing.
        poll_woken(&mut tasks);
        let (pending, answered): (Vec<usize>, Vec<usize>) = {
            let world = lock(&world);
            let mut pending = Vec::new();
            let mut answered = Vec::new();
            for (i, r) in world.requests.iter().enumerate() {
                if r.delivered {
                    continue;
                }
                if r.answer.is_some() {
                    answered.push(i);
                } else {
                    pending.push(i);
                }
            }
            (pending, answered)
        };
        let running: Vec<usize> = (0..tasks.len())
            .filter(|&t| tasks[t].future.is_some())
            .collect();
        let arrivals_left = attempts.len() < config.attempts;
        if pending.is_empty() && answered.is_empty() && !arrivals_left && running.is_empty() {
            break;
        }
        // What can happen now, each with a weight; with only running tasks
        // left, only time moves things (leases, work, heartbeats).
        let weights = [
            if pending.is_empty() { 0 } else { 25 },
            if answered.is_empty() { 0 } else { 25 },
            if arrivals_left { 8 } else { 0 },
            10,
            if running.is_empty() {
                0
            } else {
                config.p_crash
            },
        ];
        match rng.weighted(&weights) {
            0 => {
                let r = pending[rng.below(pending.len())];
                land(
                    &mut lock(&world),
                    &memory,
                    &config,
                    &mut attempts,
                    r,
                    &mut rng,
                );
            }
            1 => {
                let r = answered[rng.below(answered.len())];
                let mut world = lock(&world);
                let request = &mut world.requests[r];
                request.delivered = true;
                if let Some(waker) = request.waker.take() {
                    waker.wake();
                }
            }
            2 => {
                let att = attempts.len();
                let key = rng.below(config.keys);
                let payload = u8::from(rng.chance(10));
                let process = rng.below(engines.len());
                // (Drawn only when asked: the default histories stay
                // those their seeds always made.)
                let way = if split_executions && rng.chance(40) {
                    Way::Split
                } else {
                    match rng.below(12) {
                        0..=5 => Way::Plain,
                        6..=7 => Way::Transactional,
                        8..=9 => Way::InTransaction,
                        _ => Way::SingleWrite,
                    }
                };
                let skew = config.processes[process].skew;
                let plan = Plan {
                    work: (0..rng.range(0, 4))
                        .map(|_| QUANTUM_MS * rng.range(1, 12))
                        .collect(),
                    extend_by: rng.chance(15).then(|| 1_000 * rng.range(1, 4)),
                    fails: rng.chance(10),
                    wait_in_process: rng.chance(30).then(|| QUANTUM_MS * rng.range(1, 40)),
                    limits: TransactionLimits::new()
                        .claim_wait(Duration::from_millis(QUANTUM_MS * rng.range(0, 6)))
                        .time_limit(Duration::from_millis(QUANTUM_MS * rng.range(2, 60))),
                    // Within max_lease, as every lease the checker sees.
                    split_lease_ms: config.default_lease_ms,
                    steps: in_steps && way == Way::Plain,
                };
                let clock_ms = (lock(&world).now_ms as i64 + skew) as u64;
                let deadline_ms = rng.chance(30).then(|| clock_ms + 1_000 * rng.range(1, 6));
                lock(&world).log(Event::Arrive {
                    att,
                    key,
                    payload,
                    process,
                    way,
                    clock_ms,
                });
                attempts.push(AttemptInfo {
                    key,
                    payload,
                    skew,
                    heartbeat: config.processes[process].heartbeat,
                    way,
                    faults: 0,
                    conflicts: 0,
                    steps: if plan.steps { plan.work.len() } else { 0 },
                });
                let future = attempt_future(
                    engines[process].clone(),
                    Arc::clone(&world),
                    att,
                    key,
                    payload,
                    way,
                    deadline_ms,
                    plan,
                );
                tasks.push(Task {
                    future: Some(Box::pin(future)),
                    waker: Arc::new(TaskWaker(AtomicBool::new(true))),
                });
            }
            3 => {
                let by = QUANTUM_MS * if rng.chance(70) { 1 } else { rng.range(1, 30) };
                let now_ms = {
                    let mut world = lock(&world);
                    world.now_ms += by;
                    world.log(Event::Advance);
                    world.now_ms
                };
                // The heartbeats and backoffs first (tokio's timers) ...
                runtime.block_on(tokio::time::advance(Duration::from_millis(by)));
                poll_woken(&mut tasks);
                // ... then the operations' work.
                let due: Vec<_> = {
                    let mut world = lock(&world);
                    let timers = std::mem::take(&mut world.timers);
                    let (due, later) = timers
                        .into_iter()
                        .partition(|(until, _, _)| *until <= now_ms);
                    world.timers = later;
                    due
                };
                for (_, fired, waker) in due {
                    fired.store(true, Ordering::Relaxed);
                    waker.wake();
                }
            }
            _ => {
                let t = running[rng.below(running.len())];
                let future = tasks[t].future.take();
                lock(&world).log(Event::Crash { att: t });
                drop(future);
            }
        }
    }
    // Stop what is left (a hang): drop the futures, outside the world's lock.
    for task in &mut tasks {
        drop(task.future.take());
    }
    drop(engines);
    let entries = std::mem::take(&mut lock(&world).history);
    History {
        config,
        attempts,
        entries,
        hung,
    }
}

/// Polls every woken task, in order, until none is.
fn poll_woken(tasks: &mut [Task]) {
    loop {
        let mut polled = false;
        for (t, task) in tasks.iter_mut().enumerate() {
            let Some(future) = task.future.as_mut() else {
                continue;
            };
            if !task.waker.0.swap(false, Ordering::Relaxed) {
                continue;
            }
            polled = true;
            let waker = Waker::from(Arc::clone(&task.waker));
            let mut cx = Context::from_waker(&waker);
            CURRENT.with(|c| c.set(t));
            let ready = future.as_mut().poll(&mut cx).is_ready();
            CURRENT.with(|c| c.set(usize::MAX));
            if ready {
                task.future = None;
            }
        }
        if !polled {
            return;
        }
    }
}

/// Lands (or fails) request `r` on the store.
fn land(
    world: &mut World,
    memory: &MemoryStore,
    config: &Config,
    attempts: &mut [AttemptInfo],
    r: usize,
    rng: &mut Rng,
) {
    let op = world.requests[r].op.clone();
    let att = world.requests[r].att;
    let down = config
        .outage
        .is_some_and(|(from, to)| (from..to).contains(&world.now_ms));
    let fault = if down || rng.chance(config.p_fault) {
        Some(if !down && rng.chance(30) {
            (StoreErrorKind::Throttled, "throttled")
        } else {
            (StoreErrorKind::Unavailable, "unreachable")
        })
    } else if op.is_write() && !world.requests[r].resent && rng.chance(config.p_conflict) {
        Some((StoreErrorKind::Conflict, "conflict"))
    } else {
        None
    };
    if let Some((kind, why)) = fault {
        if let Some(info) = attempts.get_mut(att) {
            if kind == StoreErrorKind::Conflict {
                info.conflicts += 1;
            } else {
                info.faults += 1;
            }
        }
        // A COMMIT that fails before it lands: the connection is lost, and
        // the server rolls the transaction back.
        if let Op::CommitTransaction(c) = &op {
            c.transaction.roll_back().now_or_never();
            let key = c.claim.id.clone();
            world.log(Event::Unheld { att, key });
        }
        let answer = Answer::Fault(kind, why);
        world.requests[r].answer = Some(answer.clone());
        world.log(Event::Landed {
            req: r,
            att,
            op,
            before: None,
            after: None,
            answer,
            lost: None,
        });
        return;
    }
    let before = memory.record(op.id());
    let answer = match apply(memory, &op) {
        // A stale read: the record written since is not seen yet.
        Answer::Read(Some(_)) if matches!(op, Op::Peek(..)) && rng.chance(30) => Answer::Read(None),
        answer => answer,
    };
    let after = memory.record(op.id());
    // A write refused because a transaction holds its key: a conflict the
    // store made, not one the network injected.
    if let (Answer::Fault(StoreErrorKind::Conflict, _), Some(info)) =
        (&answer, attempts.get_mut(att))
    {
        info.conflicts += 1;
    }
    let committing = matches!(op, Op::CommitTransaction(_));
    if let Op::CommitTransaction(c) = &op {
        let key = c.claim.id.clone();
        world.log(Event::Unheld { att, key });
    }
    // A COMMIT whose answer is lost is not sent again (the transaction has
    // ended either way): the client times out.
    let lost = (op.is_write() && !world.requests[r].resent && rng.chance(config.p_lost))
        .then(|| !committing && rng.chance(60));
    match lost {
        // The SDK sends it again, later.
        Some(true) => world.requests[r].resent = true,
        // The SDK gives up: a timeout, though the write landed.
        Some(false) => {
            if let Some(info) = attempts.get_mut(att) {
                info.faults += 1;
            }
            world.requests[r].answer =
                Some(Answer::Fault(StoreErrorKind::Unavailable, "timed out"));
        }
        None => world.requests[r].answer = Some(answer.clone()),
    }
    world.log(Event::Landed {
        req: r,
        att,
        op,
        before,
        after,
        answer,
        lost,
    });
}

#[allow(clippy::too_many_arguments)]
async fn attempt_future(
    engine: Engine<SimStore>,
    world: Shared,
    att: usize,
    key: usize,
    payload: u8,
    way: Way,
    deadline_ms: Option<u64>,
    plan: Plan,
) {
    let key_text = format!("k{key}");
    let mut attempt = Attempt::new("scope", &key_text, Fingerprint::of_bytes(&[payload]));
    if let Some(deadline) = deadline_ms {
        attempt = attempt.deadline_ms(deadline);
    }
    if let Some(wait) = plan.wait_in_process {
        attempt = attempt.wait_in_process(Duration::from_millis(wait));
    }
    let operation_world = Arc::clone(&world);
    // The clock the engine reads first, with no await before its read.
    let begin_ms = engine.now_ms();
    lock(&world).log(Event::Begin {
        att,
        clock_ms: begin_ms,
    });
    let limits = plan.limits;
    // The operation's work under its claim: its execution's number, or its
    // failure.
    // (A durable execution has no handle: it runs only under its claim,
    // and is not told of a takeover.)
    let work = move |handle: Option<ClaimHandle>| async move {
        let exec = {
            let mut world = lock(&operation_world);
            let exec = world.next_exec;
            world.next_exec += 1;
            world.log(Event::Start {
                att,
                exec,
                key,
                takeover: handle
                    .as_ref()
                    .and_then(|handle| handle.takeover().map(|t| t.attempt)),
                claimed: handle.as_ref().is_none_or(ClaimHandle::is_claimed),
            });
            exec
        };
        let mut guard = ExecGuard {
            world: Arc::clone(&operation_world),
            exec,
            returned: false,
        };
        for (step, wait) in plan.work.iter().enumerate() {
            let wait = || async {
                let until_ms = lock(&operation_world).now_ms + wait;
                Work {
                    world: Arc::clone(&operation_world),
                    until_ms,
                    fired: Arc::default(),
                }
                .await;
            };
            match &handle {
                Some(handle) if plan.steps => {
                    let world = &operation_world;
                    handle
                        .step(&format!("s{step}"), || async {
                            lock(world).log(Event::StepEffect { att, key, step });
                            wait().await;
                            lock(world).log(Event::StepDone { att, key, step });
                            Ok::<_, std::convert::Infallible>(step)
                        })
                        .await
                        .map_err(|_| "a step was not recorded")?;
                }
                _ => wait().await,
            }
            if let (Some(by), Some(handle)) = (plan.extend_by, &handle) {
                let _ = handle.extend(Duration::from_millis(by)).await;
            }
        }
        guard.returned = true;
        drop(guard);
        if plan.fails {
            return Err("the operation failed");
        }
        Ok(exec)
    };
    let effect = move |exec: u64| MemoryWrite::put(format!("effect/k{key}/{exec}"), Vec::new());
    if way == Way::Split {
        let owner = OwnerToken::from_stored(format!("execution-{att}"));
        let lease = Duration::from_millis(plan.split_lease_ms);
        let execution = SplitAttempt::new(
            "scope",
            key_text.as_str(),
            attempt.fingerprint().clone(),
            owner,
            lease,
        );
        let ending = split_execution(&engine, &execution, work(None)).await;
        let clock_ms = engine.now_ms();
        lock(&world).log(Event::Done {
            att,
            ending,
            clock_ms,
        });
        return;
    }
    let result = match way {
        Way::InTransaction => {
            engine
                .run_in_transaction(
                    &attempt,
                    limits,
                    |transaction: MemoryTransaction| async move {
                        let handle = ClaimHandle::current().ok_or("run outside its claim")?;
                        let exec = work(Some(handle)).await?;
                        // The effect, written in the transaction that holds the
                        // claim: it commits with the record, or not at all.
                        transaction
                            .write(effect(exec))
                            .map_err(|_| "the effect was refused")?;
                        Ok::<_, &str>(Receipt { exec })
                    },
                )
                .await
        }
        _ => {
            let operation = move |handle: ClaimHandle| async move {
                let exec = work(Some(handle)).await?;
                let writes = match way {
                    Way::Plain => Vec::new(),
                    _ => vec![effect(exec)],
                };
                Ok((Receipt { exec }, writes))
            };
            match way {
                Way::Plain => engine.run(&attempt, Mode::Plain, &Json, operation).await,
                Way::Transactional => {
                    engine
                        .run(&attempt, Mode::Transactional, &Json, operation)
                        .await
                }
                _ => engine.run_single_write(&attempt, &Json, operation).await,
            }
        }
    };
    let ending = match result {
        Ok(outcome) => Ending::Ok {
            kind: outcome.kind(),
            value: outcome.value().exec,
        },
        Err(Error::InProgress { .. }) => Ending::InProgress,
        Err(Error::KeyReused) => Ending::KeyReused,
        Err(Error::Store(error)) => Ending::Store(error.kind()),
        Err(Error::LeaseLost) => Ending::LeaseLost,
        Err(Error::WritesNotCommitted(_)) => Ending::WritesNotCommitted,
        Err(Error::TimeLimitExceeded { .. }) => Ending::TimeLimitExceeded,
        Err(Error::Operation(_)) => Ending::Operation,
        Err(_) => Ending::Operation,
    };
    let clock_ms = engine.now_ms();
    lock(&world).log(Event::Done {
        att,
        ending,
        clock_ms,
    });
}

/// How many times a durable step tries a store error in all (the durable
/// crate's claim step: five).
const SPLIT_TRIES: u32 = 5;

/// A durable execution of the attempt's key: its claim step, its work, and
/// its completion step (or its release when the work failed), each step
/// tried again on a store error under the execution's one token (a claim
/// whose answer was lost is found again as its own, a completion whose
/// answer was lost as landed).
async fn split_execution(
    engine: &Engine<SimStore>,
    execution: &SplitAttempt,
    work: impl Future<Output = Result<u64, &'static str>>,
) -> Ending {
    let mut tries = 1;
    let claimed = loop {
        match split::claim(engine, execution, &Json).await {
            Err(Error::Store(_) | Error::LeaseLost) if tries < SPLIT_TRIES => tries += 1,
            claimed => break claimed,
        }
    };
    match claimed {
        Ok(SplitClaim::Ours) => {}
        Ok(SplitClaim::Replay(Receipt { exec })) => {
            return Ending::Ok {
                kind: OutcomeKind::Replay,
                value: exec,
            }
        }
        Ok(SplitClaim::Disabled) => {
            return Ending::Ok {
                kind: OutcomeKind::Disabled,
                value: 0,
            }
        }
        Err(Error::InProgress { .. }) => return Ending::InProgress,
        Err(Error::KeyReused) => return Ending::KeyReused,
        Err(Error::Store(error)) => return Ending::Store(error.kind()),
        Err(Error::LeaseLost) => return Ending::LeaseLost,
        Err(_) => return Ending::Operation,
    }
    let exec = match work.await {
        Ok(exec) => exec,
        Err(_) => {
            let mut tries = 1;
            while split::release(engine, execution).await.is_err() && tries < SPLIT_TRIES {
                tries += 1;
            }
            return Ending::Operation;
        }
    };
    let response = serde_json::to_vec(&Receipt { exec }).unwrap_or_default();
    let mut tries = 1;
    loop {
        match split::complete(engine, execution, response.clone()).await {
            Ok(kind) => return Ending::Ok { kind, value: exec },
            Err(_) if tries < SPLIT_TRIES => tries += 1,
            Err(error) => return Ending::Store(error.kind()),
        }
    }
}
