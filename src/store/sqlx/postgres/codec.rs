//! The record as PostgreSQL's columns, over sqlx: the claim's numbers as
//! `bigint` and `integer` binds (refused before any statement when one
//! does not fit), and rows decoded without trusting what the table holds.

use crate::{
    store::{pg::int8, sql_columns::SqlColumns, Claim, OwnerToken, Record},
    StoreError,
};
use sqlx::{
    postgres::{PgArguments, PgRow},
    Arguments, Postgres, Row,
};

/// Binds `values` in order. The store binds only `text`, `bigint`,
/// `integer` and `bytea`, which always encode; an encoding error is still
/// reported rather than dropped.
pub(super) struct Binds(PgArguments, Option<String>);

impl Binds {
    pub(super) fn new() -> Self {
        Self(PgArguments::default(), None)
    }

    pub(super) fn add<'q, T>(mut self, value: T) -> Self
    where
        T: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>,
    {
        if let Err(error) = self.0.add(value) {
            self.1.get_or_insert_with(|| error.to_string());
        }
        self
    }

    pub(super) fn done(self) -> Result<PgArguments, StoreError> {
        match self.1 {
            None => Ok(self.0),
            Some(error) => Err(StoreError::new(
                crate::StoreErrorKind::Rejected,
                format!("a value could not be encoded for PostgreSQL: {error}"),
            )),
        }
    }
}

/// The claim statement's parameters, in its order (the shared statement's
/// `$1` to `$9`).
pub(super) fn claim(claim: &Claim) -> Result<PgArguments, StoreError> {
    Binds::new()
        .add(claim.id.as_str())
        .add(claim.owner.as_str())
        .add(claim.fingerprint.as_str())
        .add(int8(claim.expiration_s)?)
        .add(int8(claim.lease_until_ms)?)
        .add(int8(claim.now_ms)?)
        .add(attempt(claim))
        .add(int8(claim.first_started_ms)?)
        .add(int8(claim.now_ms / 1000)?)
        .done()
}

/// The take-over statement's parameters, in its order: the claim over the
/// lapsed claim of `lapsed`'s token.
pub(super) fn take_over(claim: &Claim, lapsed: &OwnerToken) -> Result<PgArguments, StoreError> {
    Binds::new()
        .add(claim.id.as_str())
        .add(lapsed.as_str())
        .add(claim.owner.as_str())
        .add(claim.fingerprint.as_str())
        .add(int8(claim.expiration_s)?)
        .add(int8(claim.lease_until_ms)?)
        .add(int8(claim.now_ms)?)
        .add(attempt(claim))
        .add(int8(claim.first_started_ms)?)
        .add(int8(claim.now_ms)?)
        .done()
}

/// The attempt as `integer`: past its range it stays at its largest, as
/// in the tokio-postgres store.
fn attempt(claim: &Claim) -> i32 {
    i32::try_from(claim.attempt).unwrap_or(i32::MAX)
}

fn column<'r, T>(row: &'r PgRow, name: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    row.try_get(name).map_err(|error| {
        StoreError::corrupt(format!("column `{name}` is missing or has the wrong type"))
            .with_source(error)
    })
}

/// Whether an answered statement applied (its `applied` column).
pub(super) fn applied(row: &PgRow) -> Result<bool, StoreError> {
    row.try_get("applied")
        .map_err(|e| StoreError::corrupt("the answer has no `applied`").with_source(e))
}

/// The record of a row whose columns may all be NULL (no record).
pub(super) fn decode_optional(row: &PgRow) -> Result<Option<Record>, StoreError> {
    let id: Option<String> = column(row, "id")?;
    id.map(|_| decode(row)).transpose()
}

/// Decodes a row; never panics on what the table holds.
pub(super) fn decode(row: &PgRow) -> Result<Record, StoreError> {
    let id = column(row, "id")?;
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
