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
