//! Stored items: whatever a table holds, decoding never panics; it gives a
//! record or a corrupt-record error, and a decoded COMPLETED record always
//! has a response, an IN_PROGRESS one a lease.
#![no_main]

use aws_sdk_dynamodb::{primitives::Blob, types::AttributeValue};
use lambda_idempotency::{fuzzing::decode_record, store::Status, StoreErrorKind};
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;

fuzz_target!(|data: &[u8]| {
    let (selector, rest) = data.split_first().unwrap_or((&0, &[]));
    let Ok(serde_json::Value::Object(object)) = serde_json::from_slice::<serde_json::Value>(rest) else {
        return;
    };
    let Ok(mut item) = serde_dynamo::to_item::<_, HashMap<String, AttributeValue>>(object) else {
        return;
    };
    // Turn string attributes into binary ones where the selector says so,
    // since JSON has no B type.
    for (i, value) in item.values_mut().enumerate() {
        if selector & (1 << (i % 8)) != 0 {
            if let AttributeValue::S(text) = value {
                *value = AttributeValue::B(Blob::new(text.clone().into_bytes()));
            }
        }
    }
    match decode_record(item) {
        Ok(record) => match record.status {
            Status::Completed => assert!(record.response.is_some()),
            Status::InProgress => assert!(record.lease_until_ms.is_some()),
            _ => {}
        },
        Err(error) => assert_eq!(error.kind(), StoreErrorKind::CorruptRecord, "{error}"),
    }
});
