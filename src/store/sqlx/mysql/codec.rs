//! The record as MySQL's columns: numbers that must fit `BIGINT`, and rows
//! decoded without trusting what the table holds.

use crate::{
    store::{sql_columns::SqlColumns, Record},
    StoreError, StoreErrorKind,
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
    SqlColumns {
        id,
        status: column(row, "status")?,
        owner: column(row, "owner")?,
        fingerprint: column(row, "fingerprint")?,
        expiration_s: column(row, "expiration_s")?,
        lease_until_ms: column(row, "lease_until_ms")?,
        response: column(row, "response")?,
        created_at_ms: column(row, "created_at_ms")?,
        completed_at_ms: column(row, "completed_at_ms")?,
        attempt: column(row, "attempt")?,
        first_started_ms: column(row, "first_started_ms")?,
    }
    .record()
}
