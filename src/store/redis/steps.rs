//! Recovery points on Redis: the steps in the record's hash, `steps` (how
//! many) and `step:<i>:name`, `step:<i>:output` for each, written by the
//! fenced `step.lua`, kept by a takeover (its `HSET` leaves them), removed
//! by a completion, gone with the hash (`docs/recovery-points.md`).

use super::RecordId;
use crate::{store::RecordedStep, StoreError};
use redis::Value;
use std::collections::HashMap;

/// The steps of a record's hash (`HGETALL`'s fields), in order.
pub(super) fn decode_steps(
    id: &RecordId,
    fields: &[Value],
) -> Result<Vec<RecordedStep>, StoreError> {
    let mut map: HashMap<&[u8], &[u8]> = HashMap::with_capacity(fields.len() / 2);
    for pair in fields.chunks(2) {
        if let [Value::BulkString(name), Value::BulkString(value)] = pair {
            map.insert(name, value);
        }
    }
    let corrupt = |why: &str| StoreError::corrupt(format!("record {id}: {why}"));
    let count = match map.get(&b"steps"[..]) {
        None => return Ok(Vec::new()),
        Some(count) => std::str::from_utf8(count)
            .ok()
            .and_then(|count| count.parse::<u32>().ok())
            .ok_or_else(|| corrupt("its step count is not a number"))?,
    };
    (0..count)
        .map(|i| {
            let name = map
                .get(format!("step:{i}:name").as_bytes())
                .and_then(|name| std::str::from_utf8(name).ok())
                .ok_or_else(|| corrupt("a step has no name"))?;
            let output = map
                .get(format!("step:{i}:output").as_bytes())
                .ok_or_else(|| corrupt("a step has no output"))?;
            Ok(RecordedStep::new(name, output.to_vec()))
        })
        .collect()
}
