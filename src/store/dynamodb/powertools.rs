//! Powertools' records, read for the compatibility mode
//! ([`crate::powertools`]): one strongly consistent `GetItem`, failures
//! mapped as every other call of the store's.

use super::{codec::Item, errors, DynamoDbStore};
use crate::{
    powertools::{PowertoolsData, PowertoolsLayout, PowertoolsRecord, PowertoolsRecords},
    StoreError, StoreErrorKind,
};
use aws_sdk_dynamodb::types::AttributeValue;
use futures_util::future::BoxFuture;
use std::collections::HashMap;

impl PowertoolsRecords for DynamoDbStore {
    fn read_powertools_record<'a>(
        &'a self,
        id: &'a str,
        layout: &'a PowertoolsLayout,
    ) -> BoxFuture<'a, Result<Option<PowertoolsRecord>, StoreError>> {
        Box::pin(async move {
            let key: Item = match (&layout.sort_key_attr, &layout.static_pk_value) {
                (Some(sort_key), Some(partition)) => HashMap::from([
                    (
                        layout.key_attr.clone(),
                        AttributeValue::S(partition.clone()),
                    ),
                    (sort_key.clone(), AttributeValue::S(id.to_owned())),
                ]),
                (Some(_), None) => {
                    return Err(StoreError::new(
                        StoreErrorKind::Misconfigured,
                        "Powertools layout: a sort key needs static_pk_value \
                         (Powertools' default is idempotency#<function name>)",
                    ))
                }
                (None, _) => {
                    HashMap::from([(layout.key_attr.clone(), AttributeValue::S(id.to_owned()))])
                }
            };
            let table = layout.table.as_deref().unwrap_or(self.table());
            let item = self
                .inner
                .client
                .get_item()
                .table_name(table)
                .set_key(Some(key))
                .consistent_read(true)
                .send()
                .await
                .map_err(|e| errors::from_sdk("GetItem (Powertools record)", e))?
                .item;
            item.map(|item| decode(id, layout, &item)).transpose()
        })
    }
}

fn decode(
    id: &str,
    layout: &PowertoolsLayout,
    item: &Item,
) -> Result<PowertoolsRecord, StoreError> {
    let corrupt = |why: &str| {
        StoreError::new(
            StoreErrorKind::CorruptRecord,
            format!("Powertools record {id}: {why}"),
        )
    };
    let string = |name: &str| -> Result<Option<String>, StoreError> {
        match item.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(AttributeValue::S(text)) => Ok(Some(text.clone())),
            Some(_) => Err(corrupt(&format!("{name} is not a string"))),
        }
    };
    let integer = |name: &str| -> Result<Option<i64>, StoreError> {
        match item.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(AttributeValue::N(text)) => text
                .parse()
                .map(Some)
                .map_err(|_| corrupt(&format!("{name} is not an integer"))),
            Some(_) => Err(corrupt(&format!("{name} is not a number"))),
        }
    };
    // Python stores the response as JSON text; TypeScript as the value
    // itself (a map, for a proxy response; NULL for null).
    let data = match item.get(&layout.data_attr) {
        None => None,
        Some(AttributeValue::S(text)) => Some(PowertoolsData::String(text.clone())),
        Some(value) => {
            let value: serde_json::Value = serde_dynamo::from_attribute_value(value.clone())
                .map_err(|e| corrupt(&format!("{} is not a response: {e}", layout.data_attr)))?;
            Some(PowertoolsData::Value(value.to_string()))
        }
    };
    let status = string(&layout.status_attr)?.ok_or_else(|| corrupt("no status"))?;
    Ok(PowertoolsRecord {
        expiration_s: integer(&layout.expiry_attr)?,
        in_progress_expiration_ms: integer(&layout.in_progress_expiry_attr)?,
        data,
        validation: string(&layout.validation_key_attr)?,
        ..PowertoolsRecord::new(status)
    })
}
