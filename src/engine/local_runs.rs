//! The runs of this process under their claims, by record: a duplicate
//! that arrives while the same process runs its key is answered from here,
//! without a store call, and one that may wait for the outcome waits on the
//! run itself, in memory, rather than asking the store again and again.
//!
//! Duplicates in other processes are not seen here: they find the claim in
//! the store, as before.
//!
//! Every claimed run registers here, so the registry is kept cheap on the
//! path of a request that meets no duplicate: one allocation a run, the
//! record id hashed by its own last bytes (a SHA-256 in hex), and no lock
//! at all to look up a key while nothing runs, nor to publish a completion
//! nobody waits for.

use super::{claim_handle::ClaimHandle, state::Engine};
use crate::store::{Claim, Record, RecordId, Status, Store};
use std::{
    collections::HashMap,
    hash::{BuildHasherDefault, Hasher},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex, OnceLock, PoisonError,
    },
    time::Duration,
};
use tokio::sync::Notify;

/// The runs under way in this process, by record id.
#[derive(Debug, Default)]
pub(crate) struct LocalRuns {
    runs: Mutex<HashMap<RecordId, Arc<LocalRun>, BuildHasherDefault<IdHasher>>>,
    /// How many runs are registered: none, and a look-up takes no lock.
    registered: AtomicUsize,
    /// How many duplicates wait, on any run: none, and a completion is not
    /// looked up.
    waiting: AtomicUsize,
}

/// One run under its claim, as its duplicates see it.
#[derive(Debug)]
pub(crate) struct LocalRun {
    /// The claim it runs under: what a duplicate would find in the store.
    claim: Claim,
    /// The run's handle to it: its lease as last extended.
    handle: ClaimHandle,
    /// Its completed record, set as it completes, when a duplicate waits.
    completed: OnceLock<Record>,
    /// Duplicates waiting for it: its completion is kept for them only.
    waiting: AtomicUsize,
    /// Set when the run ends, however it ends (completed, released,
    /// failed, its future dropped: the [`Running`] guard's drop), and its
    /// waiters are woken.
    ended: AtomicBool,
    woken: Notify,
}

/// A run registered for as long as this lives; dropped, it is gone, and
/// its waiting duplicates wake.
pub(crate) struct Running<'a> {
    runs: &'a LocalRuns,
    run: Arc<LocalRun>,
}

/// Hashes a record id by its last 16 bytes: the end of a SHA-256 in hex
/// (64 bits of it), which no key can aim at, and which every id of one
/// engine has (its prefix is the same for all).
#[derive(Debug, Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        let tail = &bytes[bytes.len().saturating_sub(16)..];
        for chunk in tail.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(29) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl LocalRuns {
    /// Registers the run of `claim` (which this process holds), whose
    /// operation has `handle`.
    pub(crate) fn start(&self, claim: &Claim, handle: &ClaimHandle) -> Running<'_> {
        let run = Arc::new(LocalRun {
            claim: claim.clone(),
            handle: handle.clone(),
            completed: OnceLock::new(),
            waiting: AtomicUsize::new(0),
            ended: AtomicBool::new(false),
            woken: Notify::new(),
        });
        let mut runs = self.lock();
        if runs.insert(claim.id.clone(), Arc::clone(&run)).is_none() {
            self.registered.fetch_add(1, Ordering::Release);
        }
        drop(runs);
        Running { runs: self, run }
    }

    /// The run of `id` under way in this process, if any.
    pub(crate) fn get(&self, id: &RecordId) -> Option<Arc<LocalRun>> {
        if self.registered.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.lock().get(id).cloned()
    }

    /// Keeps the record of the run of `claim`, completed with `response`
    /// at `now_ms`, for the duplicates waiting on it (built only if one
    /// waits). Called once the completion landed in the store, never
    /// before: a waiter replays only what is stored.
    pub(crate) fn completed(&self, claim: &Claim, response: &[u8], expiration_s: u64, now_ms: u64) {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return;
        }
        let Some(run) = self.get(&claim.id) else {
            return;
        };
        if run.claim.owner != claim.owner || run.waiting.load(Ordering::Acquire) == 0 {
            return;
        }
        let _ = run.completed.set(Record {
            id: claim.id.clone(),
            status: Status::Completed,
            owner: claim.owner.clone(),
            fingerprint: claim.fingerprint.clone(),
            expiration_s,
            lease_until_ms: None,
            response: Some(response.to_vec()),
            created_at_ms: Some(claim.now_ms),
            attempt: claim.attempt,
            first_started_ms: Some(claim.first_started_ms),
            completed_at_ms: Some(now_ms),
        });
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<RecordId, Arc<LocalRun>, BuildHasherDefault<IdHasher>>>
    {
        self.runs.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut runs = self.runs.lock();
        // Only this run's entry: a later run of the key (after this one
        // released it) may have registered since.
        if runs
            .get(&self.run.claim.id)
            .is_some_and(|run| Arc::ptr_eq(run, &self.run))
        {
            runs.remove(&self.run.claim.id);
            self.runs.registered.fetch_sub(1, Ordering::Release);
        }
        drop(runs);
        self.run.ended.store(true, Ordering::Release);
        self.run.woken.notify_waiters();
    }
}

impl LocalRun {
    /// Until when its claim is leased, as last extended: past it, the
    /// store decides (a retry may take the key over, as from a run
    /// elsewhere), even though the run goes on here.
    pub(super) fn lease_until_ms(&self) -> u64 {
        self.handle
            .lease_until_ms()
            .unwrap_or(self.claim.lease_until_ms)
    }

    /// The payload's fingerprint the run claimed with.
    pub(super) fn fingerprint(&self) -> &crate::Fingerprint {
        &self.claim.fingerprint
    }

    /// The claim as a record in progress, as the store would hand it to a
    /// duplicate's claim.
    pub(super) fn in_progress(&self) -> Record {
        let claim = &self.claim;
        Record {
            id: claim.id.clone(),
            status: Status::InProgress,
            owner: claim.owner.clone(),
            fingerprint: claim.fingerprint.clone(),
            expiration_s: claim.expiration_s,
            lease_until_ms: Some(self.lease_until_ms()),
            response: None,
            created_at_ms: Some(claim.now_ms),
            attempt: claim.attempt,
            first_started_ms: Some(claim.first_started_ms),
            completed_at_ms: None,
        }
    }

    /// Waits at most `budget` for the run to end: `Ended::Completed` with
    /// its record, `Ended::Other` if it ended without completing here (the
    /// key may be free: claim it), `None` if it still runs.
    pub(super) async fn wait(&self, runs: &LocalRuns, budget: Duration) -> Option<Ended> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        runs.waiting.fetch_add(1, Ordering::AcqRel);
        let waited = {
            let woken = self.woken.notified();
            tokio::pin!(woken);
            // Registered before the flag is read: an end in between still
            // wakes it.
            woken.as_mut().enable();
            if self.ended.load(Ordering::Acquire) {
                Ok(())
            } else {
                tokio::time::timeout(budget, woken).await
            }
        };
        runs.waiting.fetch_sub(1, Ordering::AcqRel);
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        if waited.is_err() {
            return None;
        }
        Some(match self.completed.get() {
            Some(record) => Ended::Completed(record.clone()),
            None => Ended::Other,
        })
    }
}

/// How a run a duplicate waited on ended.
pub(crate) enum Ended {
    /// Completed: its record.
    Completed(Record),
    /// Released, failed, or gone without a word here.
    Other,
}

impl<St: Store> Engine<St> {
    /// The runs under way in this process.
    pub(crate) fn local_runs(&self) -> &LocalRuns {
        &self.inner.local_runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{engine::claim_handle::ClaimHandle, store::OwnerToken, Fingerprint};

    fn claim(owner: &str) -> Claim {
        Claim {
            id: RecordId::from_stored("p#k"),
            owner: OwnerToken::from_stored(owner),
            fingerprint: Fingerprint::from_stored("f"),
            now_ms: 1_000,
            lease_until_ms: 61_000,
            expiration_s: 86_400,
            attempt: 1,
            first_started_ms: 1_000,
        }
    }

    /// `make mutants` (the owner guard of `completed`): a completion under
    /// another owner's claim is not the registered run's, and the
    /// duplicates waiting on that run never get it as its outcome.
    #[tokio::test]
    async fn a_completion_under_another_owner_is_not_the_waited_runs() {
        let runs = LocalRuns::default();
        let ours = claim("ours");
        let running = runs.start(&ours, &ClaimHandle::unprotected(None));
        let run = runs.get(&ours.id).expect("registered");
        // Waiting on the run, through the registry the completion reads.
        let (ended, ()) = tokio::join!(run.wait(&runs, Duration::from_secs(5)), async {
            tokio::task::yield_now().await;
            runs.completed(&claim("theirs"), b"not ours", 86_400, 2_000);
            drop(running);
        });
        assert!(
            matches!(ended, Some(Ended::Other)),
            "the run ended without completing"
        );
    }
}
