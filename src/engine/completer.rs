//! The completer: claims abandoned past their lease (an `IN_PROGRESS`
//! record whose caller died and never retried), found a page at a time
//! and reported, released or finished by policy (Brandur's completer and
//! reaper; `docs/recovery-points.md`, "The completer").
//!
//! Every write it makes goes through a takeover first: the same
//! conditional write, on the same conditions (the record still
//! `IN_PROGRESS` under the owner it was listed with, its lease passed),
//! that a retry's takeover makes. Of a completer and a retry racing for
//! one record, one takeover applies: never two owners. A claim whose
//! owner came back to life (its heartbeat extended the lease) or that a
//! retry took over meanwhile is left alone.

use super::{
    completion::Lapsing,
    conflicts::retry_conflicts,
    fence::{fence, Fence},
    outcome::OutcomeKind,
    state::Engine,
};
use crate::{
    store::{
        AbandonedPage, AbandonedQuery, Claim, Conditional, OwnerToken, PageCursor, Record, Store,
    },
    StoreError,
};
use std::{convert::Infallible, time::Duration};

/// What the completer does to each abandoned claim it finds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AbandonedPolicy {
    /// Nothing: list them (a dry run).
    Report,
    /// Delete the record, so that the next request with the key runs as a
    /// first attempt (not told that an earlier one may have acted). A
    /// record that holds steps (recovery points) is never deleted: the
    /// retry would run its steps again. It is left as it is, lapsed, for
    /// the next request to take over and resume after its steps
    /// ([`Settlement::KeptForSteps`]).
    Release,
    /// Complete the record with `answer` (encoded as the application's
    /// records are: `http::abandoned_answer` (feature `http`)
    /// for the HTTP layer's), so that every later retry gets that answer
    /// and the operation never runs again. Its steps, if any, go with the
    /// completion: they are listed in the report for an operator to
    /// reconcile.
    Fail {
        /// The stored answer, as the engine's codec encodes a value (sealed
        /// by the engine when it encrypts, as a run's is).
        answer: Vec<u8>,
    },
}

impl AbandonedPolicy {
    /// `report`, `release` or `fail`.
    pub fn as_str(&self) -> &'static str {
        match self {
            AbandonedPolicy::Report => "report",
            AbandonedPolicy::Release => "release",
            AbandonedPolicy::Fail { .. } => "fail",
        }
    }
}

/// One run of the completer: a policy, how long past its lease a claim
/// must be, and how many to handle
/// ([`Engine::complete_abandoned`]).
#[derive(Debug, Clone)]
pub struct Completer {
    policy: AbandonedPolicy,
    older_than: Duration,
    limit: usize,
    page_size: usize,
}

impl Completer {
    /// A run under `policy` of up to 100 claims whose lease has passed, in
    /// pages of 100 records.
    pub fn new(policy: AbandonedPolicy) -> Self {
        Self {
            policy,
            older_than: Duration::ZERO,
            limit: 100,
            page_size: 100,
        }
    }

    /// Only claims whose lease ended at least this long ago (default: any
    /// whose lease has passed).
    #[must_use]
    pub fn older_than(mut self, older_than: Duration) -> Self {
        self.older_than = older_than;
        self
    }

    /// At most this many claims handled in the run (default 100; at least 1).
    #[must_use]
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit.max(1);
        self
    }

    /// The records one store call reads or returns at most (default 100;
    /// at least 1): on DynamoDB the items one `Scan` evaluates, on Redis
    /// the `COUNT` of one `SCAN`.
    #[must_use]
    pub fn page_size(mut self, page_size: usize) -> Self {
        self.page_size = page_size.max(1);
        self
    }

    /// The run's policy.
    pub fn policy(&self) -> &AbandonedPolicy {
        &self.policy
    }
}

/// What the completer did to one abandoned claim.
#[derive(Debug)]
#[non_exhaustive]
pub struct Settled {
    /// The record as it was listed.
    pub record: Record,
    /// The names of the steps it held when the completer read them (none
    /// on a store without recovery points).
    pub steps: Vec<String>,
    /// What was done.
    pub settlement: Settlement,
}

/// What the completer did to one abandoned claim.
#[derive(Debug)]
#[non_exhaustive]
pub enum Settlement {
    /// Listed only (the `report` policy).
    Reported,
    /// Deleted (the `release` policy): the next request runs.
    Released,
    /// Left lapsed, because its record holds steps (the `release` policy):
    /// the next request takes it over and resumes after them.
    KeptForSteps,
    /// Completed with the policy's answer (the `fail` policy): every
    /// retry gets it, and the operation never runs again.
    Failed,
    /// Nothing written: the claim was no longer abandoned when the
    /// completer's takeover reached it (a retry took it over, its owner
    /// extended its lease or completed it, it expired). Carries the
    /// record found, if any.
    Lost(Option<Record>),
    /// A store call failed; what it found is unknown, and a later run
    /// finds the claim again if it is still abandoned.
    Error(StoreError),
}

impl Settlement {
    /// `reported`, `released`, `kept_for_steps`, `failed`, `lost` or `error`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Settlement::Reported => "reported",
            Settlement::Released => "released",
            Settlement::KeptForSteps => "kept_for_steps",
            Settlement::Failed => "failed",
            Settlement::Lost(_) => "lost",
            Settlement::Error(_) => "error",
        }
    }
}

/// What a run of the completer found and did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct CompleterReport {
    /// Each abandoned claim handled, in the order found.
    pub settled: Vec<Settled>,
    /// The store calls that listed them.
    pub pages: usize,
    /// Whether the walk reached the end of the store; `false` when it
    /// stopped at the run's limit (the next run starts from the beginning,
    /// and finds again what is still abandoned).
    pub walked_all: bool,
}

impl CompleterReport {
    /// How many claims were handled with `settlement` (by its
    /// [`as_str`](Settlement::as_str) name).
    pub fn count(&self, settlement: &str) -> usize {
        self.settled
            .iter()
            .filter(|settled| settled.settlement.as_str() == settlement)
            .count()
    }
}

impl<St: Store> Engine<St> {
    /// One page of this engine's abandoned claims: `IN_PROGRESS`, not
    /// expired, their lease ended more than `older_than` ago
    /// ([`Store::list_abandoned`]). For operators: it scans the store.
    pub async fn list_abandoned(
        &self,
        older_than: Duration,
        limit: usize,
        cursor: Option<PageCursor>,
    ) -> Result<AbandonedPage, StoreError> {
        let now_ms = self.inner.clock.now_ms();
        let older_than_ms = u64::try_from(older_than.as_millis()).unwrap_or(u64::MAX);
        let query = AbandonedQuery::new(
            format!("{}#", self.inner.key_prefix),
            now_ms,
            now_ms.saturating_sub(older_than_ms),
            limit,
        )
        .after(cursor);
        self.inner.store.list_abandoned(&query).await
    }

    /// Walks this engine's abandoned claims a page at a time and settles
    /// each by the completer's policy, until `limit` are handled or the
    /// store has been walked. A page that fails to list ends the run with
    /// its error; a claim whose settlement fails is reported
    /// ([`Settlement::Error`]) and the run goes on.
    ///
    /// ```
    /// use lambda_idempotency::{AbandonedPolicy, Completer, Engine, MemoryStore};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let engine = Engine::builder(MemoryStore::new()).build();
    /// let completer = Completer::new(AbandonedPolicy::Release)
    ///     .older_than(Duration::from_secs(15 * 60))
    ///     .limit(100);
    /// let report = engine.complete_abandoned(&completer).await.unwrap();
    /// assert!(report.settled.is_empty() && report.walked_all);
    /// # }
    /// ```
    pub async fn complete_abandoned(
        &self,
        completer: &Completer,
    ) -> Result<CompleterReport, StoreError> {
        let mut report = CompleterReport::default();
        let mut cursor = None;
        // A walk may list a record twice (Redis's `SCAN`): settled once.
        let mut seen = std::collections::HashSet::new();
        loop {
            let page = self
                .list_abandoned(completer.older_than, completer.page_size, cursor)
                .await?;
            report.pages += 1;
            let mut records = page.records.into_iter();
            for record in records.by_ref() {
                if !seen.insert(record.id.clone()) {
                    continue;
                }
                report
                    .settled
                    .push(self.settle_abandoned(&record, &completer.policy).await);
                if report.settled.len() >= completer.limit {
                    break;
                }
            }
            // The rest of a page not gone through is found by the next run.
            let rest = records.next().is_some();
            cursor = page.next;
            if cursor.is_none() && !rest {
                report.walked_all = true;
                return Ok(report);
            }
            if report.settled.len() >= completer.limit {
                return Ok(report);
            }
        }
    }

    /// Settles one abandoned claim, as listed, by `policy`.
    pub async fn settle_abandoned(&self, record: &Record, policy: &AbandonedPolicy) -> Settled {
        let mut settled = Settled {
            record: record.clone(),
            steps: Vec::new(),
            settlement: Settlement::Reported,
        };
        let now_ms = self.inner.clock.now_ms();
        if St::STEPS {
            match self.inner.store.steps(&record.id, now_ms).await {
                Ok(steps) => settled.steps = steps.into_iter().map(|step| step.name).collect(),
                Err(error) => {
                    settled.settlement = Settlement::Error(error);
                    return settled;
                }
            }
        }
        settled.settlement = match policy {
            AbandonedPolicy::Report => Settlement::Reported,
            // Left as it is: it is lapsed already, and the next request
            // takes it over and resumes. No write, so a completer run every
            // few minutes does not count an attempt each time.
            AbandonedPolicy::Release if !settled.steps.is_empty() => Settlement::KeptForSteps,
            AbandonedPolicy::Release => self.release_abandoned(record, &mut settled.steps).await,
            AbandonedPolicy::Fail { answer } => self.fail_abandoned(record, answer.clone()).await,
        };
        if matches!(settled.settlement, Settlement::Reported) {
            tracing::info!(record = %record.id, steps = settled.steps.len(),
                "an abandoned claim, reported by the completer");
        } else {
            tracing::warn!(record = %record.id, policy = policy.as_str(),
                outcome = settled.settlement.as_str(), steps = settled.steps.len(),
                "an abandoned claim was settled by the completer");
        }
        settled
    }

    /// Takes the abandoned claim over, as a retry would: `Ok(claim)` when
    /// the completer holds it now, `Err` with what settles it otherwise.
    async fn take_over_abandoned(&self, record: &Record) -> Result<Claim, Settlement> {
        let inner = &*self.inner;
        let now_ms = inner.clock.now_ms();
        let lease_until_ms = now_ms
            .saturating_add(u64::try_from(inner.default_lease.as_millis()).unwrap_or(u64::MAX));
        let owner = OwnerToken::generate().map_err(Settlement::Error)?;
        let claim = Claim {
            id: record.id.clone(),
            owner,
            fingerprint: record.fingerprint.clone(),
            now_ms,
            lease_until_ms,
            // Kept as long as the record was, and past the completer's lease.
            expiration_s: record.expiration_s.max(lease_until_ms / 1000 + 1),
            attempt: record.attempt.saturating_add(1),
            first_started_ms: record
                .first_started_ms
                .or(record.created_at_ms)
                .unwrap_or(now_ms),
        };
        match retry_conflicts(|| inner.store.take_over(&claim, &record.owner)).await {
            Ok(Conditional::Applied) => Ok(claim),
            Ok(Conditional::Refused(found)) => {
                match fence(found.as_ref(), &claim.owner, now_ms) {
                    // The takeover landed; its answer was lost.
                    Fence::OwnClaim => Ok(claim),
                    _ => Err(Settlement::Lost(found)),
                }
            }
            Err(error) => Err(Settlement::Error(error)),
        }
    }

    async fn release_abandoned(&self, record: &Record, steps: &mut Vec<String>) -> Settlement {
        let claim = match self.take_over_abandoned(record).await {
            Ok(claim) => claim,
            Err(settlement) => return settlement,
        };
        let inner = &*self.inner;
        let now_ms = inner.clock.now_ms();
        // Read again under the completer's token: its owner may have
        // recorded a step between the first read and the takeover. No step
        // lands now but the completer's.
        if St::STEPS {
            match inner.store.steps(&claim.id, now_ms).await {
                Ok(found) if !found.is_empty() => {
                    *steps = found.into_iter().map(|step| step.name).collect();
                    return self.lapse_abandoned(&claim, now_ms).await;
                }
                Ok(_) => {}
                Err(error) => return self.lapse_after(&claim, now_ms, error).await,
            }
        }
        match retry_conflicts(|| inner.store.release(&claim.id, &claim.owner)).await {
            Ok(Conditional::Applied | Conditional::Refused(None)) => Settlement::Released,
            Ok(Conditional::Refused(found)) => Settlement::Lost(found),
            Err(error) => Settlement::Error(error),
        }
    }

    /// Gives the completer's takeover back, lapsed at once, keeping the
    /// record (and its steps) for the next request to take over.
    async fn lapse_abandoned(&self, claim: &Claim, now_ms: u64) -> Settlement {
        let ended = self.lapse(
            Lapsing {
                id: &claim.id,
                owner: &claim.owner,
                lease_until_ms: claim.lease_until_ms,
                expiration_s: claim.expiration_s,
            },
            now_ms,
        );
        match retry_conflicts(|| self.inner.store.extend(&ended)).await {
            Ok(_) => Settlement::KeptForSteps,
            Err(error) => Settlement::Error(error),
        }
    }

    /// Gives the takeover back after `error`, which is what is reported.
    async fn lapse_after(&self, claim: &Claim, now_ms: u64, error: StoreError) -> Settlement {
        let _ = self.lapse_abandoned(claim, now_ms).await;
        Settlement::Error(error)
    }

    async fn fail_abandoned(&self, record: &Record, answer: Vec<u8>) -> Settlement {
        let claim = match self.take_over_abandoned(record).await {
            Ok(claim) => claim,
            Err(settlement) => return settlement,
        };
        // The completion every run makes: fenced on the completer's token,
        // sealed when the engine encrypts.
        match self
            .complete::<Infallible>(&claim, answer, Vec::new(), false, false)
            .await
        {
            Ok(OutcomeKind::Fresh) => Settlement::Failed,
            Ok(OutcomeKind::LeaseLost) => Settlement::Lost(None),
            Ok(_) => Settlement::Error(StoreError::new(
                crate::StoreErrorKind::Other,
                "the completer's answer was not recorded; the claim stays until its lease passes",
            )),
            Err(error) => Settlement::Error(match error {
                crate::Error::Store(error) => error,
                other => StoreError::new(crate::StoreErrorKind::Other, other.to_string()),
            }),
        }
    }
}
