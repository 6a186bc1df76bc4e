//! Outside review of the Powertools compatibility mode (branch
//! review-powertools): record ids compared with the ids the real
//! Powertools computed for the same input (Powertools Python 3.37 on
//! CPython 3.11, `BasePersistenceLayer._get_hashed_idempotency_key` with
//! `key_prefix="fn"`; Powertools TypeScript 2.35 on Node 20,
//! `BasePersistenceLayer.getHashedIdempotencyKey` with `keyPrefix: 'fn'`).
//! The `#[ignore]`d tests fail today: each is a record Powertools wrote
//! that the mode does not find (a retry that runs again).
use futures_util::future::BoxFuture;
use lambda_idempotency::powertools::{
    PowertoolsCompat, PowertoolsLayout, PowertoolsRecord, PowertoolsRecords,
};
use lambda_idempotency::StoreError;
use serde_json::{json, Value};

#[derive(Debug)]
struct Nothing;

impl PowertoolsRecords for Nothing {
    fn read_powertools_record<'a>(
        &'a self,
        _id: &'a str,
        _layout: &'a PowertoolsLayout,
    ) -> BoxFuture<'a, Result<Option<PowertoolsRecord>, StoreError>> {
        Box::pin(async { Ok(None) })
    }
}

fn python(expression: &str) -> PowertoolsCompat {
    PowertoolsCompat::with_key_prefix(Nothing, "fn")
        .event_key_jmespath(expression)
        .unwrap()
}

fn typescript(expression: &str) -> PowertoolsCompat {
    PowertoolsCompat::typescript(Nothing, "fn")
        .event_key_jmespath(expression)
        .unwrap()
}

/// Held: bodies keyed whole (`powertools_json(body)`), ids as the real
/// Powertools computed them. 65 bodies were compared on both ports (numbers
/// 1e21, 1e-7, -0, 2^53+1, 5e-324, 1e400; U+2028, U+0000, astral and lone
/// surrogates; array-index-like keys, `constructor`, duplicates, case and
/// final-sigma collisions, objects of 40 to 90 keys whose keys collide once
/// lowercased, `__proto__`): all matched. A sample:
#[test]
fn body_hashes_match_real_powertools() {
    let pairs: Vec<String> = (0..30)
        .flat_map(|i| {
            [
                format!("\"Ab{i}\": {i}"),
                format!("\"aB{i}\": {}", 100 + i),
                format!("\"ab{i}\": {}", 200 + i),
            ]
        })
        .collect();
    let pairs = format!("{{{}}}", pairs.join(","));
    let cases: &[(&str, &str, &str)] = &[
        ("{\"n\": 1e21}", "fn#ceKC5raQjoIKypqEkYGKjQ==", "fn#645935639be42428e8732e28c0da0686"),
        ("{\"n\": 9007199254740993}", "fn#W1/oNpLvP1ufk4Ux+szlGQ==", "fn#ee9d187dc87ba5f626378416b3cd1478"),
        ("{\"s\": \"\\u2028\\u2029\"}", "fn#85Euvj07APKl+UYrvfVWiQ==", "fn#8b8ffddd8edf8a89472aed817b3a2da2"),
        (
            "{\"10\": 1, \"01\": 2, \"-1\": 3, \"4294967295\": 4, \"4294967294\": 5, \"\": 6, \"a\": 7, \"1.5\": 8, \"0\": 9, \"00\": 10}",
            "fn#YiMcDBJ+Nc5Q72A4ChSUZg==",
            "fn#8ae6a14df921978fa147708d249c6f4e",
        ),
        (
            "{\"constructor\": 1, \"toString\": 2, \"hasOwnProperty\": 3, \"valueOf\": 4}",
            "fn#ugTboQOXgDRO2CxImOtnDA==",
            "fn#71a8c7a8170586c9f9f021b0face86df",
        ),
        ("{\"\u{1e9e}\": 1, \"\u{df}\": 2, \"ss\": 3}", "fn#o0hWPwfIMGJ96mju8SUQ2Q==", "fn#2e693f17ab0b64a8b56cc9c1feef5d21"),
        ("{\"K\": 1, \"k\": 2, \"\u{212a}\": 3}", "fn#v82e/0smbRyLH6ANtL4eWg==", "fn#bef2589c5f20435c6a40912f0aeade7a"),
    ];
    for (body, ts, py) in cases {
        let event = json!({ "body": body });
        assert_eq!(
            typescript("powertools_json(body)")
                .record_id(&event)
                .as_deref(),
            Some(*ts),
            "{body}"
        );
        assert_eq!(
            python("powertools_json(body)").record_id(&event).as_deref(),
            Some(*py),
            "{body}"
        );
    }
    // 90 keys, in triples equal once lowercased: V8's TimSort with
    // deepSort's inconsistent comparator gave the stable order.
    assert_eq!(
        typescript("powertools_json(body)")
            .record_id(&json!({ "body": pairs }))
            .as_deref(),
        Some("fn#KaSltxsLt7+7GPKwj9hChA==")
    );
}

/// Finding: Powertools TypeScript's `powertools_json` does not raise on
/// text `JSON.parse` refuses: it returns `undefined`, and the list form
/// `[user, order_id]` after it is then `[null, null]`, which is not null:
/// Powertools keyed the request, ran the handler and wrote a record (the
/// same one for every such body: the empty body, `not json`, a body with
/// `NaN`). Powertools TS 2.35 computed, for the HTTP view's event
/// `{"headers": {}, "queryStringParameters": null, "body": B}`,
/// `fn#79hznynQaGEGP+tMxtM5Kw==` for each B below. The mode selects
/// nothing (it treats `powertools_json` of non-JSON as Powertools having
/// raised), looks nothing up, and the retry runs again. Fixed: the
/// JavaScript dialect reads it as `undefined`, as Powertools TS does.
#[test]
fn typescript_list_key_over_a_body_that_is_not_json_has_a_record() {
    for body in ["", "not json", "{\"user\": \"u\", \"order_id\": NaN}"] {
        let event = json!({ "headers": {}, "queryStringParameters": null, "body": body });
        assert_eq!(
            typescript("powertools_json(body).[user, order_id]")
                .record_id(&event)
                .as_deref(),
            Some("fn#79hznynQaGEGP+tMxtM5Kw=="),
            "{body:?}"
        );
    }
}

/// Held, the same bodies with a path key: TS's `powertools_json(body).order_id`
/// of non-JSON is null (no record), as here.
#[test]
fn typescript_path_key_over_a_body_that_is_not_json_has_none() {
    for body in ["", "not json", "{\"order_id\": NaN}"] {
        let event = json!({ "body": body });
        assert_eq!(
            typescript("powertools_json(body).order_id").record_id(&event),
            None
        );
        assert_eq!(typescript("powertools_json(body)").record_id(&event), None);
    }
}

/// Finding: a field of the event itself (not decoded by `powertools_json`)
/// is read as serde_json read it, not as Python's `json.loads` did. The
/// Lambda Python runtime reads the event with `json.loads`: an integer
/// past 64 bits keeps its digits, `-0` is the integer 0. serde_json makes
/// a double of both (`1.2345678901234568e29`, `-0.0`). An EventBridge
/// event (Batch's EventBridge source, or the event handed to `check`)
/// keyed on `detail.order_id`; Powertools Python 3.37 computed:
/// - `123456789012345678901234567890`: `fn#a46857f0ecc21f0a06ea434b94d9cf1d`
/// - `-0`: `fn#cfcd208495d565ef66e7dff9f98764da` (md5 of `0`)
///
/// (TypeScript: all 17 number cases tried matched, JSON.parse is doubles too.)
#[test]
#[ignore = "a known difference (module docs, \"What it sees of a request\"): event-level numbers are serde_json's, not json.loads'"]
fn python_event_fields_are_read_as_json_loads_reads_them() {
    let cases = [
        (
            "123456789012345678901234567890",
            "fn#a46857f0ecc21f0a06ea434b94d9cf1d",
        ),
        ("-0", "fn#cfcd208495d565ef66e7dff9f98764da"),
    ];
    for (number, id) in cases {
        let text = format!(
            "{{\"version\":\"0\",\"id\":\"e-1\",\"detail-type\":\"OrderPlaced\",\"source\":\"shop\",\
             \"account\":\"123456789012\",\"time\":\"2024-01-01T00:00:00Z\",\"region\":\"us-east-1\",\
             \"resources\":[],\"detail\":{{\"order_id\":{number}}}}}"
        );
        // What lambda_runtime and Batch::powertools make of it.
        let event: aws_lambda_events::eventbridge::EventBridgeEvent<Value> =
            serde_json::from_str(&text).unwrap();
        let view = serde_json::to_value(&event).unwrap();
        assert_eq!(
            python("detail.order_id").record_id(&view).as_deref(),
            Some(id),
            "{number}"
        );
    }
}

/// An INSERT from DynamoDB Streams (no OldImage, as Lambda delivers it).
const DYNAMODB_INSERT: &str = r#"{"Records":[{"eventID":"1","eventName":"INSERT","eventVersion":"1.0","eventSource":"aws:dynamodb","awsRegion":"us-east-1","dynamodb":{"Keys":{"Id":{"N":"101"}},"NewImage":{"Message":{"S":"New item!"},"Id":{"N":"101"}},"SequenceNumber":"111","SizeBytes":26,"StreamViewType":"NEW_AND_OLD_IMAGES","ApproximateCreationDateTime":1480642020},"eventSourceARN":"arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2015-06-27T00:48:05.899"}]}"#;

/// The record as `Batch::powertools` views it.
fn dynamodb_view() -> Value {
    let event: aws_lambda_events::dynamodb::Event = serde_json::from_str(DYNAMODB_INSERT).unwrap();
    serde_json::to_value(&event.records[0]).unwrap()
}

/// Held: `dynamodb.NewImage` (ids from both ports).
#[test]
fn dynamodb_new_image_is_exact() {
    assert_eq!(
        python("dynamodb.NewImage")
            .record_id(&dynamodb_view())
            .as_deref(),
        Some("fn#0538b44ef8bfafd05ef13ee2a7b4cab3")
    );
    assert_eq!(
        typescript("dynamodb.NewImage")
            .record_id(&dynamodb_view())
            .as_deref(),
        Some("fn#gdd7rVnC2n/sOCrLi6zgow==")
    );
}

/// Finding: the module docs say "A field path is exact; the whole record is
/// not", but a field holding an object gets the same extra members:
/// aws_lambda_events writes `"OldImage": {}` into `dynamodb` for an INSERT
/// Lambda delivered without one, so a batch keyed on `dynamodb` (the change
/// itself) finds none of Powertools' records. Powertools computed:
/// Python `fn#b12e888f9d469078cec34c6505841e61`, TypeScript
/// `fn#goYufPndltriinKJPI1vPg==`. (Also: `dynamodb.OldImage` of an INSERT
/// is absent to Powertools, no record, and `{}` here; TS records a `{}`
/// key, so a lookup of it could find another record's.)
#[test]
#[ignore = "a known difference (module docs, \"What it sees of a request\"): aws_lambda_events adds OldImage: {} inside the `dynamodb` field"]
fn dynamodb_field_is_exact() {
    assert_eq!(
        python("dynamodb").record_id(&dynamodb_view()).as_deref(),
        Some("fn#b12e888f9d469078cec34c6505841e61")
    );
    assert_eq!(
        typescript("dynamodb")
            .record_id(&dynamodb_view())
            .as_deref(),
        Some("fn#goYufPndltriinKJPI1vPg==")
    );
    assert_eq!(
        typescript("dynamodb.OldImage").record_id(&dynamodb_view()),
        None
    );
}
