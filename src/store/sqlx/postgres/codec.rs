//! The record as PostgreSQL's columns, over sqlx: the claim's numbers as
//! `bigint` and `integer` values (refused before any statement when one
//! does not fit), and rows decoded without trusting what the table holds,
//! in either format a row comes in (binary from a prepared statement,
//! text from a simple query).

use super::query::Value::{self, Int4, Int8, Text};
use crate::{
    store::{pg::int8, sql_columns::SqlColumns, Claim, OwnerToken, Record},
    StoreError,
};
use sqlx::{
    postgres::{PgRow, PgValueFormat},
    Postgres, Row, Type, ValueRef,
};

/// The claim statement's values, in its order (the shared statement's
/// `$1` to `$9`).
pub(super) fn claim(claim: &Claim) -> Result<[Value<'_>; 9], StoreError> {
    Ok([
        Text(claim.id.as_str()),
        Text(claim.owner.as_str()),
        Text(claim.fingerprint.as_str()),
        Int8(int8(claim.expiration_s)?),
        Int8(int8(claim.lease_until_ms)?),
        Int8(int8(claim.now_ms)?),
        Int4(attempt(claim)),
        Int8(int8(claim.first_started_ms)?),
        Int8(int8(claim.now_ms / 1000)?),
    ])
}

/// The take-over statement's values, in its order: the claim over the
/// lapsed claim of `lapsed`'s token.
pub(super) fn take_over<'a>(
    claim: &'a Claim,
    lapsed: &'a OwnerToken,
) -> Result<[Value<'a>; 10], StoreError> {
    Ok([
        Text(claim.id.as_str()),
        Text(lapsed.as_str()),
        Text(claim.owner.as_str()),
        Text(claim.fingerprint.as_str()),
        Int8(int8(claim.expiration_s)?),
        Int8(int8(claim.lease_until_ms)?),
        Int8(int8(claim.now_ms)?),
        Int4(attempt(claim)),
        Int8(int8(claim.first_started_ms)?),
        Int8(int8(claim.now_ms)?),
    ])
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
        response: bytea(row, "response")?,
        created_at_ms: column(row, "created_at_ms")?,
        completed_at_ms: column(row, "completed_at_ms")?,
        attempt: column(row, "attempt")?,
        first_started_ms: column(row, "first_started_ms")?,
    }
    .record()
}

/// A `bytea` column, in either format: binary (a prepared statement's
/// row), or text (a simple query's), which is `\x` and hex digits, or,
/// where the server, the database or the role sets `bytea_output =
/// escape`, the bytes with `\\` and octal escapes (sqlx itself reads only
/// the first).
pub(super) fn bytea(row: &PgRow, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
    let wrong = || StoreError::corrupt(format!("column `{name}` is missing or has the wrong type"));
    let value = row.try_get_raw(name).map_err(|e| wrong().with_source(e))?;
    if value.is_null() {
        return Ok(None);
    }
    if !<Vec<u8> as Type<Postgres>>::compatible(&value.type_info()) {
        return Err(wrong());
    }
    let format = value.format();
    let bytes = value.as_bytes().map_err(|_| wrong())?;
    match format {
        PgValueFormat::Binary => Ok(Some(bytes.to_vec())),
        PgValueFormat::Text => text_bytea(bytes).map(Some).ok_or_else(|| {
            StoreError::corrupt(format!(
                "column `{name}` is not bytea in PostgreSQL's text output"
            ))
        }),
    }
}

/// The bytes of `bytea`'s text output, hex (`\x…`) or escape format.
fn text_bytea(text: &[u8]) -> Option<Vec<u8>> {
    if let Some(digits) = text.strip_prefix(b"\\x") {
        return hex::decode(digits).ok();
    }
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some((&first, after)) = rest.split_first() {
        if first != b'\\' {
            bytes.push(first);
            rest = after;
            continue;
        }
        match after {
            [b'\\', more @ ..] => {
                bytes.push(b'\\');
                rest = more;
            }
            [a @ b'0'..=b'3', b @ b'0'..=b'7', c @ b'0'..=b'7', more @ ..] => {
                bytes.push(((a - b'0') << 6) | ((b - b'0') << 3) | (c - b'0'));
                rest = more;
            }
            _ => return None,
        }
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::text_bytea;

    #[test]
    fn bytea_reads_in_both_text_outputs() {
        let bytes = b"\x00'\\\xff{}";
        assert_eq!(text_bytea(b"\\x00275cff7b7d"), Some(bytes.to_vec()));
        assert_eq!(text_bytea(b"\\000'\\\\\\377{}"), Some(bytes.to_vec()));
        assert_eq!(text_bytea(b"\\x"), Some(Vec::new()));
        assert_eq!(text_bytea(b""), Some(Vec::new()));
        for bad in [&b"\\x0"[..], b"\\", b"\\8", b"\\400", b"\\12"] {
            assert_eq!(text_bytea(bad), None, "{bad:?}");
        }
    }
}
