//! A record as the SQL stores' columns hold it: signed integers (`bigint`,
//! `integer`) and its status as text. Each SQL store reads its row's
//! columns its own way; what they mean, and what makes a row corrupt, is
//! decided here once.

use super::{OwnerToken, Record, RecordId, Status};
use crate::{Fingerprint, StoreError};

/// One row's columns, as read.
pub(crate) struct SqlColumns {
    pub(crate) id: String,
    pub(crate) status: String,
    pub(crate) owner: String,
    pub(crate) fingerprint: String,
    pub(crate) expiration_s: i64,
    pub(crate) lease_until_ms: Option<i64>,
    pub(crate) response: Option<Vec<u8>>,
    pub(crate) created_at_ms: Option<i64>,
    pub(crate) completed_at_ms: Option<i64>,
    pub(crate) attempt: i32,
    pub(crate) first_started_ms: Option<i64>,
}

impl SqlColumns {
    /// The record the columns hold, checked; a corrupt record (an unknown
    /// status, a negative time or attempt, an inconsistent record) is an
    /// error, never a panic.
    pub(crate) fn record(self) -> Result<Record, StoreError> {
        let id = self.id;
        let status = self.status.parse::<Status>().map_err(|_| {
            StoreError::corrupt(format!("record {id}: unknown status {:?}", self.status))
        })?;
        let record = Record {
            status,
            owner: OwnerToken::from_stored(self.owner),
            fingerprint: Fingerprint::from_stored(self.fingerprint),
            expiration_s: unsigned(self.expiration_s, "expiration_s")?,
            lease_until_ms: optional_unsigned(self.lease_until_ms, "lease_until_ms")?,
            response: self.response,
            created_at_ms: optional_unsigned(self.created_at_ms, "created_at_ms")?,
            completed_at_ms: optional_unsigned(self.completed_at_ms, "completed_at_ms")?,
            attempt: u32::try_from(self.attempt)
                .map_err(|_| StoreError::corrupt(format!("record {id}: negative attempt")))?,
            first_started_ms: optional_unsigned(self.first_started_ms, "first_started_ms")?,
            id: RecordId::from_stored(id),
        };
        record.checked()
    }
}

fn unsigned(value: i64, name: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::corrupt(format!("column `{name}` is negative")))
}

fn optional_unsigned(value: Option<i64>, name: &str) -> Result<Option<u64>, StoreError> {
    value.map(|value| unsigned(value, name)).transpose()
}
