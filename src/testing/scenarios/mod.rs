//! The protocol's guarantees as scenarios over any store.
//!
//! Each takes a fresh store and panics, like an assertion, when the store
//! (with the engine over it) breaks a guarantee.
//! [`store_conformance!`](crate::store_conformance) runs them all; call
//! one directly to run it with your own test attributes.

use super::{LostAnswers, ManualClock};
use crate::{
    clock::Clock,
    store::{Claim, Completion, Conditional, Extension, OwnerToken, RecordId, Status, Store},
    Attempt, Engine, Error, ErrorKind, Fingerprint, Forgotten, Json, Mode, OutcomeKind,
};
use serde::{Deserialize, Serialize};
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use tokio::sync::oneshot;

/// The value the scenarios' operations return.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// Which run made it: `ch_<n>` for the n-th run.
    pub id: String,
    /// The amount asked.
    pub amount: u64,
}

/// The error the scenarios' failing operations return.
#[derive(Debug, PartialEq, Eq)]
pub struct Declined;

impl std::fmt::Display for Declined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("declined")
    }
}

/// The fingerprint of a charge request for `amount`.
pub fn payload(amount: u64) -> Fingerprint {
    Fingerprint::of_json(&serde_json::json!({ "amount": amount, "currency": "eur" }))
        .expect("a JSON object always serialises")
}

/// An operation that counts its runs in `runs` and returns a charge.
pub fn charge(
    runs: &Arc<AtomicUsize>,
    amount: u64,
) -> impl FnOnce() -> std::future::Ready<Result<Charge, Declined>> {
    let runs = Arc::clone(runs);
    move || {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        std::future::ready(Ok(Charge {
            id: format!("ch_{n}"),
            amount,
        }))
    }
}

fn engine<St: Store>(store: St, clock: &ManualClock) -> Engine<St> {
    Engine::builder(store).clock(clock.clone()).build()
}

fn claim_at(
    id: &RecordId,
    clock: &ManualClock,
    owner: &str,
    amount: u64,
    lease: Duration,
) -> Claim {
    let now_ms = clock.now_ms();
    Claim {
        id: id.clone(),
        owner: OwnerToken::from_stored(owner),
        fingerprint: payload(amount),
        now_ms,
        lease_until_ms: now_ms + lease.as_millis() as u64,
        expiration_s: now_ms / 1000 + 3600,
        attempt: 1,
        first_started_ms: now_ms,
    }
}

fn completion<W>(
    claim: &Claim,
    clock: &ManualClock,
    response: &[u8],
    writes: Vec<W>,
) -> Completion<W> {
    Completion {
        id: claim.id.clone(),
        owner: claim.owner.clone(),
        response: response.to_vec(),
        now_ms: clock.now_ms(),
        expiration_s: clock.now_ms() / 1000 + 3600,
        writes,
    }
}

mod abandoned;
mod basics;
mod fencing;
mod leases;
mod operators;
mod single_write;
mod steps;

pub use abandoned::*;
pub use basics::*;
pub use fencing::*;
pub use leases::*;
pub use operators::*;
pub use single_write::*;
pub use steps::*;
