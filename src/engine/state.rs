//! The engine's state: its configuration and what its clones share, read
//! by every step of the protocol (each step is a file beside this one,
//! adding its methods to [`Engine`]).

use super::{cache::RecordCache, local_runs::LocalRuns};
use crate::{
    store::{RecordId, Store},
    Clock,
};
use std::{sync::Arc, time::Duration};

/// Runs operations at most once per key, and replays their outcome to
/// every retry.
///
/// Cheap to clone: clones share the store, the configuration and the cache.
/// Build one per process (outside the Lambda handler) with
/// [`Engine::builder`].
#[derive(Debug)]
pub struct Engine<St> {
    pub(super) inner: Arc<Inner<St>>,
}

impl<St> Clone for Engine<St> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

/// What an engine's clones share: the store and the configuration the
/// builder checked.
#[derive(Debug)]
pub(super) struct Inner<St> {
    pub(super) store: super::observed_store::ObservedStore<St>,
    pub(super) key_prefix: String,
    pub(super) retention: Duration,
    pub(super) max_lease: Duration,
    pub(super) default_lease: Duration,
    pub(super) cache: Option<RecordCache>,
    pub(super) fail_open: bool,
    pub(super) heartbeat: bool,
    pub(super) read_before_claim: bool,
    /// The bounds on the steps an operation records.
    pub(super) step_limits: crate::store::StepLimits,
    /// The claims whose records may hold steps, while their operations run.
    pub(super) stepped_claims: super::steps::SteppedClaims,
    pub(super) disabled: bool,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) local_runs: LocalRuns,
    /// Who is told what happened.
    pub(super) observers: crate::observe::Observers,
    /// How stored responses are sealed and opened, when they are.
    #[cfg(feature = "encryption")]
    pub(super) encryption: Option<crate::encryption::Encryption>,
}

/// The shortest lease a claim gets, even when its deadline has passed.
pub(super) const MIN_LEASE_MS: u64 = 1_000;

impl<St: Store> Engine<St> {
    /// The store records are kept in.
    pub fn store(&self) -> &St {
        &self.inner.store.store
    }

    /// The record id `key` has inside `scope` with this engine's prefix.
    pub fn record_id(&self, scope: &str, key: &str) -> RecordId {
        RecordId::new(&self.inner.key_prefix, scope, key)
    }

    pub(crate) fn expiration_s(&self, now_ms: u64) -> u64 {
        (now_ms / 1000).saturating_add(self.inner.retention.as_secs())
    }

    /// Whether the heartbeat keeps each claim while its operation runs
    /// ([`EngineBuilder::heartbeat`](crate::EngineBuilder::heartbeat): as
    /// set, or on by default under Lambda Managed Instances).
    pub fn has_heartbeat(&self) -> bool {
        self.inner.heartbeat
    }
}
