//! A conformance kit for stores, and the test doubles the crate's own tests
//! use (feature `testing`).
//!
//! The guarantees of the protocol (one run per key, replays, rejected key
//! reuse, leases, fencing, expiry, failing closed) are written once, as
//! [`scenarios`] over any [`Store`](crate::store::Store).
//! [`store_conformance!`](crate::store_conformance) turns them into one
//! `#[tokio::test]` each, so a store, ours or yours, proves itself with one
//! call:
//!
//! ```no_run
//! # // `no_run`: the generated tests are run by `cargo test`, not here.
//! use lambda_idempotency::MemoryStore;
//!
//! lambda_idempotency::store_conformance! {
//!     // A fresh, empty store for each scenario.
//!     store: async { MemoryStore::new() },
//!     // A store whose every call fails as unavailable.
//!     unavailable: async {
//!         let store = MemoryStore::new();
//!         store.fail_next(usize::MAX);
//!         store
//!     },
//!     // For a store whose `Store::SINGLE_WRITE` is true: its scenarios too.
//!     single_write,
//! }
//! ```
//!
//! The generated tests need `tokio` (features `macros` and
//! `rt-multi-thread`) among the test's dependencies.
//!
//! Beside the suite:
//!
//! - [`ManualClock`]: time that moves only when told to, so leases and
//!   expirations are tested without sleeping.
//! - [`CountingStore`]: counts the calls made to any store, for "how many
//!   round trips does a request cost" tests.
//! - [`LostAnswers`]: sends every write twice, as an SDK retries a write
//!   whose answer was lost, so the engine must recognise its own landed
//!   writes.
//! - The memory store's fault hooks:
//!   [`MemoryStore::fail_next`](crate::MemoryStore::fail_next),
//!   [`MemoryStore::insert_record`](crate::MemoryStore::insert_record) and
//!   its record accessors.

mod clock;
mod conformance;
mod counting;
mod lost_answers;
mod observer;
pub mod scenarios;

pub use clock::ManualClock;
pub use counting::{Calls, CountingStore};
pub use lost_answers::LostAnswers;
pub use observer::RecordingObserver;
