//! The lease an operation runs under: its handle to the claim, and the
//! heartbeat that extends it.

use super::{
    claim_handle::{self, ClaimHandle, Takeover},
    orchestrator::{Engine, Inner, MIN_LEASE_MS},
};
use crate::{
    clock::duration_ms,
    store::{Claim, Conditional, Extension, Store},
    Error, StoreError,
};
use std::{convert::Infallible, future::Future, sync::Arc, time::Duration};
use tracing::warn;

impl<St: Store> Engine<St> {
    /// The operation's handle to the claim it runs under.
    pub(super) fn handle(&self, claim: &Claim) -> ClaimHandle {
        let takeover = (claim.attempt > 1).then_some(Takeover {
            attempt: claim.attempt,
            first_started_at_ms: claim.first_started_ms,
        });
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

    /// Runs the operation, with the heartbeat beside it if configured: every
    /// third of the lease, the lease is extended by its length, until the
    /// operation ends or the claim is found lost.
    pub(super) async fn run_claimed<Fut: Future>(
        &self,
        handle: &ClaimHandle,
        operation: Fut,
    ) -> Fut::Output {
        let Some(held) = handle.held_claim().filter(|_| self.inner.heartbeat) else {
            return operation.await;
        };
        let lease = Duration::from_millis(
            held.lease_until_ms()
                .saturating_sub(self.inner.clock.now_ms())
                .max(MIN_LEASE_MS),
        );
        let heartbeat = async {
            let mut beats = tokio::time::interval(lease / 3);
            beats.tick().await; // the first tick is immediate
            loop {
                beats.tick().await;
                match held.extend(lease).await {
                    Ok(()) => {}
                    Err(_) if held.is_lost() => break,
                    // A store error: the next beat tries again, well within
                    // the lease.
                    Err(error) => warn!(%error, "the heartbeat could not extend the lease"),
                }
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

impl<St: Store> claim_handle::Extender for Inner<St> {
    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn max_lease_ms(&self) -> u64 {
        duration_ms(self.max_lease)
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
