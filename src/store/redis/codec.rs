//! What goes to the scripts and comes back: numbers a Lua double holds
//! exactly, and hashes decoded without trusting what the server holds.

use crate::{
    store::{OwnerToken, Record, RecordId, Status},
    Fingerprint, StoreError, StoreErrorKind,
};
use redis::Value;
use std::collections::HashMap;

pub(super) fn unexpected(operation: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Other,
        format!("Redis {operation}: the script answered in an unexpected shape"),
    )
}

/// The largest integer a Lua number (a double) holds exactly: 2^53 − 1.
/// The scripts compare and add numbers as doubles; above this, two
/// different times could compare equal, or an expiry be off.
pub(super) const MAX_EXACT: u64 = (1 << 53) - 1;

/// `n` as a script argument, or [`StoreErrorKind::Rejected`] (nothing is
/// written) when the scripts cannot hold it exactly.
pub(super) fn exact(name: &str, n: u64) -> Result<Vec<u8>, StoreError> {
    if n > MAX_EXACT {
        return Err(StoreError::new(
            StoreErrorKind::Rejected,
            format!(
                "Redis: {name} = {n} is beyond 2^53 - 1, the largest integer the store's \
                 scripts hold exactly; nothing was written (is the retention or the lease \
                 out of range?)"
            ),
        ));
    }
    Ok(n.to_string().into_bytes())
}

/// `expiration_s` as a script argument: the scripts expire the record at
/// `(expiration_s + 1) * 1000` milliseconds, which must be exact too.
pub(super) fn expiration(expiration_s: u64) -> Result<Vec<u8>, StoreError> {
    match expiration_s
        .checked_add(1)
        .and_then(|s| s.checked_mul(1000))
    {
        Some(expire_at_ms) if expire_at_ms <= MAX_EXACT => exact("expiration_s", expiration_s),
        _ => Err(StoreError::new(
            StoreErrorKind::Rejected,
            format!(
                "Redis: expiration_s = {expiration_s} is beyond what the store can expire \
                 exactly (its expiry in milliseconds must stay below 2^53); nothing was \
                 written (is the retention out of range?)"
            ),
        )),
    }
}

/// `prefix` with the glob characters of `SCAN MATCH` escaped.
pub(super) fn glob_escape(prefix: &str) -> String {
    let mut escaped = String::with_capacity(prefix.len());
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// A hash that is not a record, found by a read: what the scripts answer
/// `NOTRECORD` for.
pub(super) fn not_a_record(why: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Misconfigured,
        format!(
            "Redis: the record's key holds a hash that is not an idempotency record ({why}); \
             does another application write under this namespace? see RedisStore::namespace"
        ),
    )
}

/// Decodes `HGETALL` fields; no fields is no record. Never panics on what
/// the server holds.
pub(super) fn decode(fields: &[Value]) -> Result<Option<Record>, StoreError> {
    if fields.is_empty() {
        return Ok(None);
    }
    let mut map: HashMap<String, Vec<u8>> = HashMap::with_capacity(fields.len() / 2);
    for pair in fields.chunks(2) {
        match pair {
            [Value::BulkString(name), Value::BulkString(value)] => {
                map.insert(String::from_utf8_lossy(name).into_owned(), value.clone());
            }
            _ => {
                return Err(StoreError::corrupt(
                    "a record hash holds a field that is not a string",
                ))
            }
        }
    }
    let string = |name: &str| -> Result<String, StoreError> {
        let bytes = map
            .get(name)
            .ok_or_else(|| StoreError::corrupt(format!("field `{name}` is missing")))?;
        String::from_utf8(bytes.clone())
            .map_err(|_| StoreError::corrupt(format!("field `{name}` is not UTF-8")))
    };
    let number = |name: &str| -> Result<Option<u64>, StoreError> {
        map.get(name)
            .map(|bytes| {
                std::str::from_utf8(bytes)
                    .ok()
                    .and_then(|text| text.parse::<u64>().ok())
                    .ok_or_else(|| StoreError::corrupt(format!("field `{name}` is not a number")))
            })
            .transpose()
    };
    // The fields the scripts decide on: a hash where they are not what a
    // record holds is someone else's data (as the scripts say, NOTRECORD),
    // not a record of ours gone bad.
    let status = map
        .get("status")
        .and_then(|bytes| std::str::from_utf8(bytes).ok())
        .and_then(|text| text.parse::<Status>().ok())
        .ok_or_else(|| not_a_record("its status is missing or unknown"))?;
    if !map.contains_key("owner") {
        return Err(not_a_record("it has no owner"));
    }
    let script_number = |name: &str| -> Result<Option<u64>, StoreError> {
        map.get(name)
            .map(|bytes| {
                std::str::from_utf8(bytes)
                    .ok()
                    .filter(|text| text.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|text| text.parse::<u64>().ok())
                    .filter(|n| *n <= MAX_EXACT)
                    .ok_or_else(|| not_a_record(&format!("its {name} is not a number")))
            })
            .transpose()
    };
    let expiration_s =
        script_number("expiration_s")?.ok_or_else(|| not_a_record("it has no expiration_s"))?;
    let lease_until_ms = script_number("lease_until_ms")?;
    let id = string("id")?;
    let record = Record {
        status,
        owner: OwnerToken::from_stored(string("owner")?),
        fingerprint: Fingerprint::from_stored(string("fingerprint")?),
        expiration_s,
        lease_until_ms,
        response: map.get("response").cloned(),
        created_at_ms: number("created_at_ms")?,
        completed_at_ms: number("completed_at_ms")?,
        attempt: number("attempt")?
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
            .unwrap_or(1),
        first_started_ms: number("first_started_ms")?,
        id: RecordId::from_stored(id),
    };
    record.checked().map(Some)
}
