//! tmp
#![deny(missing_docs)]

mod clock;
mod engine;
mod error;
mod fingerprint;
mod key;
mod record;
mod store;

pub use clock::{Clock, ManualClock, SystemClock};
pub use engine::{
    Attempt, Engine, EngineBuilder, Outcome, OutcomeKind, DEFAULT_KEY_PREFIX, DEFAULT_LEASE,
    DEFAULT_MAX_LEASE, DEFAULT_RETENTION,
};
pub use error::{Error, ErrorKind, Result, StoreError, StoreErrorKind};
pub use fingerprint::Fingerprint;
pub use key::{OwnerToken, RecordId};
pub use record::{Record, Status, UnknownStatus};
#[cfg(feature = "dynamodb")]
pub use store::dynamodb::{AttributeNames, DynamoDbStore};
pub use store::memory::{MemoryStore, MemoryWrite};
pub use store::{Claim, ClaimOutcome, Completion, Fenced, Store};
