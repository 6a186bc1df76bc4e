//! The lease an operation runs under: its handle to the claim, and the
//! heartbeat that extends it.

use super::{
    claim_handle::{self, ClaimHandle},
    state::{Engine, Inner, MIN_LEASE_MS},
};
use crate::{
    clock::duration_ms,
    store::{Claim, Conditional, Extension, Store, Takeover},
    Error, StoreError,
};
use std::{convert::Infallible, future::Future, sync::Arc, time::Duration};
use tracing::warn;

impl<St: Store> Engine<St> {
    /// The operation's handle to the claim it runs under.
    pub(super) fn handle(&self, claim: &Claim) -> ClaimHandle {
        let takeover = claim.takeover();
        ClaimHandle::held(
            // The engine's own allocation, shared: no new one per claim.
            Arc::clone(&self.inner) as Arc<dyn claim_handle::Extender>,
            claim.id.clone(),
            claim.owner.clone(),
            claim.fingerprint.clone(),
            claim.lease_until_ms,
            claim.expiration_s,
            takeover,
        )
    }

    /// Runs the operation, with the heartbeat beside it if configured: the
    /// lease is extended by [`heartbeat_extension`] every third of that
    /// (the first time within a third of the lease the claim got), until
    /// the operation ends or the claim is found lost. An extension that
    /// fails is tried again soon after, not a third of a lease later, and
    /// one answered slowly brings the next one forward: the next beat is
    /// never further off than a third of what is left of the lease.
    pub(super) async fn run_claimed<Fut: Future>(
        &self,
        handle: &ClaimHandle,
        operation: Fut,
    ) -> Fut::Output {
        let Some(held) = handle.held_claim().filter(|_| self.inner.heartbeat) else {
            return operation.await;
        };
        let clock = &self.inner.clock;
        let left = || Duration::from_millis(held.lease_until_ms().saturating_sub(clock.now_ms()));
        let first = left().max(Duration::from_millis(MIN_LEASE_MS));
        let extension = heartbeat_extension(first, self.inner.max_lease);
        let heartbeat = async {
            let mut wait = first.min(extension) / 3;
            loop {
                tokio::time::sleep(wait).await;
                wait = match held.extend(extension).await {
                    Ok(()) => extension / 3,
                    Err(_) if held.is_lost() => break,
                    Err(error) => {
                        warn!(%error, lease_left_ms = left().as_millis() as u64,
                            "the heartbeat could not extend the lease; trying again");
                        HEARTBEAT_RETRY
                    }
                }
                .min(left() / 3);
            }
            std::future::pending::<Infallible>().await
        };
        tokio::pin!(operation);
        tokio::select! {
            output = &mut operation => output,
            never = heartbeat => match never {},
        }
    }
}

/// The shortest lease a claim gets with the heartbeat, and keeps: a lease
/// of a few seconds (an invocation near or past its deadline) would lapse
/// through a store that answers slowly or fails for a second (a throttle
/// the SDK retries), and the heartbeat would write several times a second
/// to keep it. The cost: a process that dies holds its keys this long at
/// most before a retry may take them over.
pub(super) const HEARTBEAT_LEASE_FLOOR: Duration = Duration::from_secs(10);

/// How soon an extension that failed is tried again.
const HEARTBEAT_RETRY: Duration = Duration::from_millis(100);

/// What each beat extends a lease to (from now): the claim's own lease,
/// at least [`HEARTBEAT_LEASE_FLOOR`], at most `max_lease` (which caps
/// every extension), and never under [`MIN_LEASE_MS`].
pub(super) fn heartbeat_extension(first: Duration, max_lease: Duration) -> Duration {
    first
        .max(HEARTBEAT_LEASE_FLOOR)
        .min(max_lease)
        .max(Duration::from_millis(MIN_LEASE_MS))
}

impl<St: Store> claim_handle::Extender for Inner<St> {
    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Never under the shortest lease a claim gets: a `max_lease` below it
    /// would cap an extension under the lease the claim already has.
    fn max_lease_ms(&self) -> u64 {
        duration_ms(self.max_lease).max(MIN_LEASE_MS)
    }

    fn extend<'a>(
        &'a self,
        extension: &'a Extension,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Conditional, StoreError>> + Send + 'a>> {
        Box::pin(self.store.extend(extension))
    }
}

/// Runs an operation without a claim (a single write before its commit, a
/// disabled engine, fail-open through an outage), with a handle that says
/// so, and that it follows an abandoned attempt, if it does
/// ([`Attempt::taking_over`](crate::Attempt::taking_over)).
pub(super) async fn run_unclaimed<T, W, E, F, Fut>(
    operation: F,
    takeover: Option<Takeover>,
) -> Result<(T, Vec<W>), Error<E>>
where
    F: FnOnce(ClaimHandle) -> Fut,
    Fut: Future<Output = Result<(T, Vec<W>), E>>,
{
    let handle = ClaimHandle::unprotected(takeover);
    // Boxed where it is made, as under a claim (`run_unreported`): the
    // single write runs every operation here, and its future would
    // otherwise hold room for the operation's (some kilobytes for an HTTP
    // handler) beside the commit's.
    Box::pin(handle.clone().scope(operation(handle)))
        .await
        .map_err(Error::Operation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        store::{memory::MemoryWrite, Completion, OwnerToken, Record, RecordId, Removal, Status},
        Attempt, Clock, Fingerprint, MemoryStore,
    };
    use std::sync::Mutex;
    use tokio::time::Instant;

    const EPOCH_MS: u64 = 1_700_000_000_000;

    /// The engine's clock on tokio's, paused in these tests: it moves only
    /// as the runtime's timers do.
    #[derive(Debug)]
    struct TokioClock(Instant);

    impl Clock for TokioClock {
        fn now_ms(&self) -> u64 {
            EPOCH_MS + duration_ms(self.0.elapsed())
        }
    }

    /// What the next extension meets.
    #[derive(Debug, Clone, Copy)]
    enum Next {
        /// It fails (a timeout, say).
        Fails,
        /// It lands, and its answer arrives this much later.
        AnsweredAfter(Duration),
    }

    /// The memory store, with every extension written down as asked (when,
    /// by tokio's clock, and to what lease), and the next ones failing or
    /// answered late as told.
    #[derive(Clone, Default)]
    struct Beats {
        store: MemoryStore,
        /// (ms since the claim, lease asked for until, ms since the claim).
        asked: Arc<Mutex<Vec<(u64, u64)>>>,
        next: Arc<Mutex<Vec<Next>>>,
    }

    impl Beats {
        fn asked(&self) -> Vec<(u64, u64)> {
            self.asked.lock().expect("beats").clone()
        }
    }

    impl Store for Beats {
        type Write = MemoryWrite;

        async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
            self.store.claim(claim).await
        }

        async fn take_over(
            &self,
            claim: &Claim,
            lapsed: &OwnerToken,
        ) -> Result<Conditional, StoreError> {
            self.store.take_over(claim, lapsed).await
        }

        async fn extend(&self, extension: &Extension) -> Result<Conditional, StoreError> {
            let at = extension.now_ms - EPOCH_MS;
            let beats = {
                let mut asked = self.asked.lock().expect("beats");
                asked.push((at, extension.lease_until_ms - EPOCH_MS));
                asked.len()
            };
            // A heartbeat that never rests would hang the test.
            assert!(beats <= 50, "{beats} extensions: the heartbeat spins");
            let next = {
                let mut next = self.next.lock().expect("next");
                (!next.is_empty()).then(|| next.remove(0))
            };
            match next {
                Some(Next::Fails) => Err(StoreError::new(
                    crate::StoreErrorKind::Unavailable,
                    "timed out",
                )),
                Some(Next::AnsweredAfter(late)) => {
                    let answer = self.store.extend(extension).await;
                    tokio::time::sleep(late).await;
                    answer
                }
                None => self.store.extend(extension).await,
            }
        }

        async fn complete(
            &self,
            completion: Completion<MemoryWrite>,
        ) -> Result<Conditional, StoreError> {
            self.store.complete(completion).await
        }

        async fn release(
            &self,
            id: &RecordId,
            owner: &OwnerToken,
        ) -> Result<Conditional, StoreError> {
            self.store.release(id, owner).await
        }

        async fn remove(&self, id: &RecordId, removal: Removal) -> Result<Conditional, StoreError> {
            self.store.remove(id, removal).await
        }

        async fn list_in_progress(
            &self,
            prefix: &str,
            limit: usize,
        ) -> Result<Vec<Record>, StoreError> {
            self.store.list_in_progress(prefix, limit).await
        }

        async fn get(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
            self.store.get(id, now_ms).await
        }
    }

    /// Runs an operation of `runs_for` under a claim with the heartbeat,
    /// whose lease is the heartbeat's floor (10 s), on `store`; `during`
    /// is called once the claim is made (to take the key over, say). The
    /// extensions asked for.
    async fn beats(
        store: &Beats,
        next: &[Next],
        runs_for: Duration,
        during: impl FnOnce(&Beats, &RecordId),
    ) -> Vec<(u64, u64)> {
        let engine = Engine::builder(store.clone())
            .clock(TokioClock(Instant::now()))
            .default_lease(HEARTBEAT_LEASE_FLOOR)
            .heartbeat(true)
            .build();
        *store.next.lock().expect("next") = next.to_vec();
        let id = engine.record_id("s", "k");
        let attempt = Attempt::new("s", "k", Fingerprint::of_bytes(b"{}"));
        let _ = engine
            .execute(&attempt, || async {
                let claimed = store.store.record(&id).expect("claimed");
                assert_eq!(claimed.lease_until_ms, Some(EPOCH_MS + 10_000));
                during(store, &id);
                tokio::time::sleep(runs_for).await;
                Ok::<_, std::convert::Infallible>(0u8)
            })
            .await;
        store.asked()
    }

    /// The extensions asked for were at `when` (ms since the claim, within
    /// the few ms that tokio's timer rounds a sleep up to), each for the
    /// 10 s lease from then.
    fn assert_beats(asked: &[(u64, u64)], when: &[u64]) {
        let at: Vec<u64> = asked.iter().map(|&(at, _)| at).collect();
        assert!(
            at.len() == when.len() && at.iter().zip(when).all(|(&a, &w)| a.abs_diff(w) <= 5),
            "extensions at {at:?} ms, not {when:?}"
        );
        for &(at, until) in asked {
            assert_eq!(until, at + 10_000, "the lease asked for at {at} ms");
        }
    }

    /// Every third of the lease (3.33 s of 10 s), each to 10 s from then.
    #[tokio::test(start_paused = true)]
    async fn the_heartbeat_extends_the_lease_every_third_of_it() {
        let store = Beats::default();
        let asked = beats(&store, &[], Duration::from_secs(12), |_, _| {}).await;
        assert_beats(&asked, &[3_333, 6_667, 10_000]);
    }

    /// An extension that fails is tried again 100 ms later, not a third of
    /// a lease later; the beats go on from the one that landed.
    #[tokio::test(start_paused = true)]
    async fn a_failed_extension_is_tried_again_soon() {
        let store = Beats::default();
        let asked = beats(&store, &[Next::Fails], Duration::from_secs(8), |_, _| {}).await;
        assert_beats(&asked, &[3_333, 3_433, 6_767]);
    }

    /// An extension answered 2 s late brings the next forward: a third of
    /// what is left of the lease when the answer came (8 s), not of 10 s.
    #[tokio::test(start_paused = true)]
    async fn an_extension_answered_late_brings_the_next_one_forward() {
        let store = Beats::default();
        let late = Next::AnsweredAfter(Duration::from_secs(2));
        let asked = beats(&store, &[late], Duration::from_secs(9), |_, _| {}).await;
        // Answered at 5.333 s; the next at 5.333 + 8/3 s.
        assert_beats(&asked, &[3_333, 8_000]);
    }

    /// A claim taken over is lost: the extension refused, the heartbeat
    /// stops (it does not keep asking for a lease that is another's).
    #[tokio::test(start_paused = true)]
    async fn the_heartbeat_stops_once_the_claim_is_lost() {
        let store = Beats::default();
        let asked = beats(&store, &[], Duration::from_secs(12), |store, id| {
            let mut record = store.store.record(id).expect("claimed");
            record.owner = OwnerToken::from_stored("another");
            record.status = Status::InProgress;
            store.store.insert_record(record);
        })
        .await;
        assert_beats(&asked, &[3_333]);
    }

    #[test]
    fn the_heartbeat_keeps_a_lease_of_at_least_its_floor_within_max_lease() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // An invocation with a minute left keeps its minute.
        assert_eq!(heartbeat_extension(s(60), s(900)), s(60));
        // One near or past its deadline (the 1 s floor) keeps ten seconds.
        assert_eq!(heartbeat_extension(s(1), s(900)), HEARTBEAT_LEASE_FLOOR);
        // max_lease caps it, but never under the shortest lease a claim gets.
        assert_eq!(heartbeat_extension(s(60), s(5)), s(5));
        assert_eq!(heartbeat_extension(s(1), ms(200)), ms(MIN_LEASE_MS));
    }
}
