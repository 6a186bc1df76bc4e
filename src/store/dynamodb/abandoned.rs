//! Abandoned claims on DynamoDB, for the completer: a `Scan` of the table
//! (a `Query` of the one partition of a single-table layout) with a
//! filter, one request a page.
//!
//! There is no index on `status`, and none is added: a `Scan` reads every
//! item it evaluates, abandoned or not, and is billed for all of them. A
//! page evaluates at most the query's `limit` items (the request's
//! `Limit`) and 1 MB, eventually consistent: **64 read units per 512 KB,
//! 128 per 1 MB scanned** (half a unit per 4 KB; a strongly consistent
//! read would cost twice that, and buys nothing here: every write the
//! completer makes is fenced). A walk of the whole table costs its size
//! in MB times 128 read units, however few claims are abandoned.

use super::{codec::number, codec::string, codec::Item, errors, DynamoDbStore};
use crate::{
    store::{AbandonedPage, AbandonedQuery, PageCursor, Status},
    StoreError, StoreErrorKind,
};
use aws_sdk_dynamodb::types::AttributeValue;
use std::collections::HashMap;

/// `IN_PROGRESS`, its lease ended before `:before`, not expired at `:now_s`
/// (as [`Record::is_expired`](crate::store::Record::is_expired) reads it).
const ABANDONED: &str =
    "#status = :in_progress AND #lease_until < :before AND #expiration >= :now_s";

impl DynamoDbStore {
    /// One page: one `Scan` (or `Query`) request.
    pub(super) async fn abandoned_page(
        &self,
        query: &AbandonedQuery,
    ) -> Result<AbandonedPage, StoreError> {
        let inner = &*self.inner;
        let start = query.cursor.as_ref().map(decode_cursor).transpose()?;
        let limit = i32::try_from(query.limit).unwrap_or(i32::MAX);
        let values = [
            (":in_progress", string(Status::InProgress.as_str())),
            (":before", number(query.lease_before_ms)),
            (":now_s", number(query.now_ms / 1000)),
            (":prefix", string(&query.prefix)),
        ];
        let names = [
            ("#status", inner.names.status.as_str()),
            ("#lease_until", inner.names.lease_until.as_str()),
            ("#expiration", inner.names.expiration.as_str()),
        ];
        let (items, last) = match &inner.layout {
            super::KeyLayout::OwnPartition => {
                let mut request = inner
                    .client
                    .scan()
                    .table_name(&inner.table)
                    .limit(limit)
                    .filter_expression(format!("{ABANDONED} AND begins_with(#id, :prefix)"))
                    .expression_attribute_names("#id", &inner.names.id)
                    .set_exclusive_start_key(start);
                for (name, attribute) in names {
                    request = request.expression_attribute_names(name, attribute);
                }
                for (name, value) in values {
                    request = request.expression_attribute_values(name, value);
                }
                let page = request
                    .send()
                    .await
                    .map_err(|e| errors::from_sdk("Scan (list abandoned)", e))?;
                (page.items.unwrap_or_default(), page.last_evaluated_key)
            }
            super::KeyLayout::Single(single) => {
                let mut request = inner
                    .client
                    .query()
                    .table_name(&inner.table)
                    .limit(limit)
                    .key_condition_expression("#pk = :partition AND begins_with(#sk, :prefix)")
                    .filter_expression(ABANDONED)
                    .expression_attribute_names("#pk", &inner.names.id)
                    .expression_attribute_names("#sk", single.sort_key())
                    .expression_attribute_values(":partition", string(single.partition_value()))
                    .set_exclusive_start_key(start);
                for (name, attribute) in names {
                    request = request.expression_attribute_names(name, attribute);
                }
                for (name, value) in values {
                    request = request.expression_attribute_values(name, value);
                }
                let page = request
                    .send()
                    .await
                    .map_err(|e| errors::from_sdk("Query (list abandoned)", e))?;
                (page.items.unwrap_or_default(), page.last_evaluated_key)
            }
        };
        let mut records = Vec::with_capacity(items.len());
        for item in items {
            let key = self.describe_key(&item);
            match self.decode(item) {
                Ok(record) if query.matches(&record) => records.push(record),
                Ok(_) => {}
                // An application's item that looks like a claim (a
                // single-table partition is shared) is named and passed over.
                Err(error) => {
                    tracing::warn!(table = %inner.table, item = %key, %error,
                        "an item that is not a record was passed over while listing abandoned claims");
                }
            }
        }
        Ok(AbandonedPage::new(
            records,
            last.as_ref().map(encode_cursor).transpose()?,
        ))
    }
}

/// `LastEvaluatedKey` as a cursor: its attributes' names and string values,
/// as a JSON object (the table's keys are strings).
fn encode_cursor(key: &Item) -> Result<PageCursor, StoreError> {
    let mut object = serde_json::Map::new();
    for (name, value) in key {
        let AttributeValue::S(value) = value else {
            return Err(StoreError::new(
                StoreErrorKind::Misconfigured,
                format!("the table's key attribute {name} is not a string"),
            ));
        };
        object.insert(name.clone(), serde_json::Value::String(value.clone()));
    }
    Ok(PageCursor::from_stored(
        serde_json::Value::Object(object).to_string(),
    ))
}

fn decode_cursor(cursor: &PageCursor) -> Result<Item, StoreError> {
    let not_ours = || {
        StoreError::new(
            StoreErrorKind::Rejected,
            format!("{:?} is not a cursor of this store's", cursor.as_str()),
        )
    };
    let object: HashMap<String, String> =
        serde_json::from_str(cursor.as_str()).map_err(|_| not_ours())?;
    Ok(object
        .into_iter()
        .map(|(name, value)| (name, AttributeValue::S(value)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_is_the_last_evaluated_key_and_back() {
        let key: Item = [
            ("pk".to_owned(), AttributeValue::S("idempotency#f".into())),
            ("sk".to_owned(), AttributeValue::S("p#\"1\"".into())),
        ]
        .into_iter()
        .collect();
        let cursor = encode_cursor(&key).expect("strings");
        assert_eq!(decode_cursor(&cursor).expect("ours"), key);
        assert!(decode_cursor(&PageCursor::from_stored("17")).is_err());
        let number: Item = [("pk".to_owned(), AttributeValue::N("1".into()))]
            .into_iter()
            .collect();
        assert!(encode_cursor(&number).is_err());
    }
}
