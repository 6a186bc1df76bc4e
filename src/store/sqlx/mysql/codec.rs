//! The record as MySQL's columns: numbers that must fit `BIGINT`, and rows
//! decoded without trusting what the table holds.

use crate::{
    store::{OwnerToken, Record, RecordId, Status},
    Fingerprint, StoreError, StoreErrorKind,
};
use sqlx::{mysql::MySqlRow, Row};

/// A time or count as MySQL's `BIGINT`, refused before any statement when
/// it does not fit.
pub(super) fn int8(value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| {
        StoreError::new(
            StoreErrorKind::Rejected,
            format!("{value} does not fit MySQL's BIGINT; nothing was written"),
        )
    })
}

fn column<'r, T>(row: &'r MySqlRow, name: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::MySql> + sqlx::Type<sqlx::MySql>,
{
    row.try_get(name).map_err(|error| {
        StoreError::corrupt(format!("column `{name}` is missing or has the wrong type"))
            .with_source(error)
    })
}

fn unsigned(value: i64, name: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::corrupt(format!("column `{name}` is negative")))
}

fn optional_unsigned(value: Option<i64>, name: &str) -> Result<Option<u64>, StoreError> {
    value.map(|value| unsigned(value, name)).transpose()
}

/// The record id: compared byte for byte (`utf8mb4_bin`), which MySQL
/// reports as binary, so it is read as bytes, and must be UTF-8.
fn id_of(row: &MySqlRow) -> Result<String, StoreError> {
    let bytes: Vec<u8> = column(row, "id")?;
    String::from_utf8(bytes)
        .map_err(|error| StoreError::corrupt("column `id` is not UTF-8").with_source(error))
}

/// Decodes a row; never panics on what the table holds.
pub(super) fn decode(row: &MySqlRow) -> Result<Record, StoreError> {
    let id = id_of(row)?;
    let status: String = column(row, "status")?;
    let status = status
        .parse::<Status>()
        .map_err(|_| StoreError::corrupt(format!("record {id}: unknown status {status:?}")))?;
    let record = Record {
        status,
        owner: OwnerToken::from_stored(column::<String>(row, "owner")?),
        fingerprint: Fingerprint::from_stored(column::<String>(row, "fingerprint")?),
        expiration_s: unsigned(column(row, "expiration_s")?, "expiration_s")?,
        lease_until_ms: optional_unsigned(column(row, "lease_until_ms")?, "lease_until_ms")?,
        response: column(row, "response")?,
        created_at_ms: optional_unsigned(column(row, "created_at_ms")?, "created_at_ms")?,
        completed_at_ms: optional_unsigned(column(row, "completed_at_ms")?, "completed_at_ms")?,
        attempt: u32::try_from(column::<i32>(row, "attempt")?)
            .map_err(|_| StoreError::corrupt(format!("record {id}: negative attempt")))?,
        first_started_ms: optional_unsigned(column(row, "first_started_ms")?, "first_started_ms")?,
        id: RecordId::from_stored(id),
    };
    record.checked()
}
