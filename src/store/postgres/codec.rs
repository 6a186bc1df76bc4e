//! The record as PostgreSQL's columns: numbers that must fit `bigint`, and
//! rows decoded without trusting what the table holds.

use crate::{
    store::{pg::int8, sql_columns::SqlColumns, Claim, Record},
    StoreError,
};
use tokio_postgres::{
    types::{ToSql, Type},
    Row,
};

/// A claim as the parameters of the claim and take-over statements: its
/// numbers as PostgreSQL's integers, refused before any statement when one
/// does not fit.
pub(super) struct ClaimValues<'a> {
    id: &'a str,
    owner: &'a str,
    fingerprint: &'a str,
    expiration: i64,
    lease: i64,
    now: i64,
    now_s: i64,
    attempt: i32,
    first_started: i64,
}

/// A statement's parameters with their types.
pub(super) type Params<'a, const N: usize> = [(&'a (dyn ToSql + Sync), Type); N];

impl<'a> ClaimValues<'a> {
    pub(super) fn of(claim: &'a Claim) -> Result<Self, StoreError> {
        Ok(Self {
            id: claim.id.as_str(),
            owner: claim.owner.as_str(),
            fingerprint: claim.fingerprint.as_str(),
            expiration: int8(claim.expiration_s)?,
            lease: int8(claim.lease_until_ms)?,
            now: int8(claim.now_ms)?,
            now_s: int8(claim.now_ms / 1000)?,
            attempt: i32::try_from(claim.attempt).unwrap_or(i32::MAX),
            first_started: int8(claim.first_started_ms)?,
        })
    }

    /// The claim statement's parameters, in its order.
    pub(super) fn claim(&self) -> Params<'_, 9> {
        [
            (&self.id, Type::TEXT),
            (&self.owner, Type::TEXT),
            (&self.fingerprint, Type::TEXT),
            (&self.expiration, Type::INT8),
            (&self.lease, Type::INT8),
            (&self.now, Type::INT8),
            (&self.attempt, Type::INT4),
            (&self.first_started, Type::INT8),
            (&self.now_s, Type::INT8),
        ]
    }

    /// The take-over statement's parameters, in its order: the claim over
    /// the lapsed claim of `lapsed`'s token.
    pub(super) fn take_over<'s>(&'s self, lapsed: &'s &'s str) -> Params<'s, 10> {
        [
            (&self.id, Type::TEXT),
            (lapsed, Type::TEXT),
            (&self.owner, Type::TEXT),
            (&self.fingerprint, Type::TEXT),
            (&self.expiration, Type::INT8),
            (&self.lease, Type::INT8),
            (&self.now, Type::INT8),
            (&self.attempt, Type::INT4),
            (&self.first_started, Type::INT8),
            (&self.now, Type::INT8),
        ]
    }
}

/// The record of a row whose columns may all be NULL (no record).
pub(super) fn decode_optional(row: &Row) -> Result<Option<Record>, StoreError> {
    let id: Option<String> = column(row, "id")?;
    id.map(|_| decode(row)).transpose()
}

fn column<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    name: &str,
) -> Result<T, StoreError> {
    row.try_get(name).map_err(|error| {
        StoreError::corrupt(format!("column `{name}` is missing or has the wrong type"))
            .with_source(error)
    })
}

/// Decodes a row; never panics on what the table holds.
pub(super) fn decode(row: &Row) -> Result<Record, StoreError> {
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
