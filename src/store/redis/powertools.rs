//! Powertools' records, read for the compatibility mode
//! ([`crate::powertools`]): Powertools' `RedisCachePersistenceLayer` keeps
//! each record as a JSON string under its id (no namespace), read with one
//! `GET`; failures mapped as every other call of the store's.

use super::RedisStore;
use crate::{
    powertools::{PowertoolsData, PowertoolsLayout, PowertoolsRecord, PowertoolsRecords},
    StoreError, StoreErrorKind,
};
use futures_util::future::BoxFuture;
use serde_json::{Map, Value};

impl PowertoolsRecords for RedisStore {
    fn read_powertools_record<'a>(
        &'a self,
        id: &'a str,
        layout: &'a PowertoolsLayout,
    ) -> BoxFuture<'a, Result<Option<PowertoolsRecord>, StoreError>> {
        Box::pin(async move {
            let text: Option<Vec<u8>> = self
                .query("GET (Powertools record)", async |connection| {
                    redis::cmd("GET").arg(id).query_async(connection).await
                })
                .await?;
            text.map(|text| decode(id, layout, &text)).transpose()
        })
    }
}

fn decode(
    id: &str,
    layout: &PowertoolsLayout,
    text: &[u8],
) -> Result<PowertoolsRecord, StoreError> {
    let corrupt = |why: &str| {
        StoreError::new(
            StoreErrorKind::CorruptRecord,
            format!("Powertools record {id} in Redis: {why}"),
        )
    };
    let map: Map<String, Value> =
        serde_json::from_slice(text).map_err(|_| corrupt("not a JSON object"))?;
    let string = |name: &str| -> Result<Option<String>, StoreError> {
        match map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(_) => Err(corrupt(&format!("{name} is not a string"))),
        }
    };
    let integer = |name: &str| -> Result<Option<i64>, StoreError> {
        match map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value
                .as_i64()
                .map(Some)
                .ok_or_else(|| corrupt(&format!("{name} is not an integer"))),
        }
    };
    // Python stores the response as JSON text; TypeScript as the value
    // (null for null; left out for undefined).
    let data = match map.get(&layout.data_attr) {
        None => None,
        Some(Value::String(text)) => Some(PowertoolsData::String(text.clone())),
        Some(value) => Some(PowertoolsData::Value(value.to_string())),
    };
    let status = string(&layout.status_attr)?.ok_or_else(|| corrupt("no status"))?;
    Ok(PowertoolsRecord {
        expiration_s: integer(&layout.expiry_attr)?,
        in_progress_expiration_ms: integer(&layout.in_progress_expiry_attr)?,
        data,
        // Empty: validation was off (Powertools writes "" then).
        validation: string(&layout.validation_key_attr)?.filter(|hash| !hash.is_empty()),
        ..PowertoolsRecord::new(status)
    })
}
