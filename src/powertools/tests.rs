use super::*;
use crate::testing::ManualClock;
use serde_json::json;
use std::{collections::HashMap, sync::Mutex};

/// Records by id, and the ids asked for.
#[derive(Debug, Default)]
struct Records {
    records: HashMap<String, PowertoolsRecord>,
    asked: Mutex<Vec<String>>,
}

impl PowertoolsRecords for Arc<Records> {
    fn read_powertools_record<'a>(
        &'a self,
        id: &'a str,
        _layout: &'a PowertoolsLayout,
    ) -> BoxFuture<'a, Result<Option<PowertoolsRecord>, StoreError>> {
        self.asked.lock().unwrap().push(id.to_owned());
        Box::pin(async move { Ok(self.records.get(id).cloned()) })
    }
}

fn event() -> Value {
    json!({
        "headers": {"Idempotency-Key": "k-1"},
        "body": "{\"order\": {\"id\": 7, \"amount\": 10.5, \"note\": \"\\u00e9\"}, \"user\": \"u\"}",
    })
}

fn compat(records: &Arc<Records>) -> PowertoolsCompat {
    PowertoolsCompat::new(Arc::clone(records), "orders", "app.lambda_handler")
}

// The expected ids are what Powertools 3.37 computes for the same event
// (BasePersistenceLayer._get_hashed_idempotency_key, _get_hashed_payload)
// with AWS_LAMBDA_FUNCTION_NAME=orders on app.lambda_handler.
#[test]
fn record_ids_are_powertools_own() {
    let records = Arc::new(Records::default());
    let cases = [
        (
            "headers.\"Idempotency-Key\"",
            "3244d3cb6b21c169d09a6b32d9c47ff1",
        ),
        (
            "powertools_json(body).order",
            "551b88cb664199fa24fe85b6b1c332a6",
        ),
        (
            "powertools_json(body).[user, order.id]",
            "dc64dda13e646c590e148a2cf78a3683",
        ),
        ("", "2f336fda65a2dc9d17e9b56acfcb7251"),
    ];
    for (expression, hash) in cases {
        let compat = compat(&records).event_key_jmespath(expression).unwrap();
        assert_eq!(
            compat.record_id(&event()).as_deref(),
            Some(format!("orders.app.lambda_handler#{hash}").as_str()),
            "{expression}"
        );
    }
    let sha = compat(&records)
        .event_key_jmespath("headers.\"Idempotency-Key\"")
        .unwrap()
        .hash_function(HashFunction::Sha256);
    assert_eq!(
        sha.record_id(&event()).as_deref(),
        Some("orders.app.lambda_handler#f613e2ddb1ed1aefc2d87a1bc773c3a3e671f40809ffe8875486d58482e5259a")
    );
    let prefixed = PowertoolsCompat::with_key_prefix(Arc::clone(&records), "my-prefix")
        .event_key_jmespath("messageId")
        .unwrap();
    assert_eq!(
        prefixed.record_id(&json!({"messageId": "m-1"})).as_deref(),
        Some("my-prefix#07bfa2edad72a6be5d2cb60e90978991")
    );
    let validation = compat(&records)
        .payload_validation_jmespath("powertools_json(body).order.amount")
        .unwrap();
    let selected = json!(10.5);
    assert_eq!(
        validation.hash_of(&Json::from(&selected)),
        "10b3adf4529649ecb009c579e7713c8e"
    );
}

#[test]
fn a_missing_key_is_not_looked_up() {
    let records = Arc::new(Records::default());
    let compat = compat(&records).event_key_jmespath("[a, b]").unwrap();
    for event in [json!({}), json!({"a": null})] {
        assert_eq!(compat.record_id(&event), None, "{event}");
    }
    // A list is missing only when every item is null, as in Powertools.
    assert!(compat.record_id(&json!({"a": ""})).is_some());
    let by_field = compat_field(&records, "a");
    for missing in [
        json!({}),
        json!({"a": ""}),
        json!({"a": []}),
        json!({"a": {"x": null}}),
    ] {
        assert_eq!(by_field.record_id(&missing), None, "{missing}");
    }
    for present in [
        json!({"a": 0}),
        json!({"a": false}),
        json!({"a": [null, 1]}),
    ] {
        assert!(by_field.record_id(&present).is_some(), "{present}");
    }
}

fn compat_field(records: &Arc<Records>, field: &str) -> PowertoolsCompat {
    compat(records).event_key_jmespath(field).unwrap()
}

const NOW_MS: u64 = 1_800_000_000_500;

fn with_record(record: PowertoolsRecord) -> (Arc<Records>, PowertoolsCompat) {
    let base = Arc::new(Records::default());
    let id = compat_field(&base, "k")
        .record_id(&json!({"k": "x"}))
        .unwrap();
    let records = Arc::new(Records {
        records: HashMap::from([(id, record)]),
        asked: Mutex::default(),
    });
    let compat = compat_field(&records, "k").clock(Arc::new(ManualClock::new(NOW_MS)));
    (records, compat)
}

fn record(status: &str, expiration_s: i64, in_progress_ms: Option<i64>) -> PowertoolsRecord {
    PowertoolsRecord {
        expiration_s: Some(expiration_s),
        in_progress_expiration_ms: in_progress_ms,
        data: (status == "COMPLETED")
            .then(|| PowertoolsData::String("{\"statusCode\": 201}".to_owned())),
        ..PowertoolsRecord::new(status)
    }
}

async fn check(compat: &PowertoolsCompat) -> Result<Option<PowertoolsFound>, Error> {
    compat.check(&json!({"k": "x"})).await
}

#[tokio::test]
async fn each_state_means_what_it_means_to_powertools() {
    let now_s = (NOW_MS / 1000) as i64;
    let (_, completed) = with_record(record("COMPLETED", now_s, None));
    assert_eq!(
        check(&completed).await.unwrap(),
        Some(PowertoolsFound::Completed {
            data: Some("{\"statusCode\": 201}".into())
        }),
        "live until the second after expiration, as DataRecord.is_expired"
    );
    let (_, expired) = with_record(record("COMPLETED", now_s - 1, None));
    assert_eq!(check(&expired).await.unwrap(), None);

    let lapses = NOW_MS as i64 + 2_500;
    let (_, in_progress) = with_record(record("INPROGRESS", now_s + 3600, Some(lapses)));
    assert_eq!(
        check(&in_progress).await.unwrap(),
        Some(PowertoolsFound::InProgress {
            retry_after: Duration::from_millis(2_500)
        })
    );
    let (_, lapsed) = with_record(record("INPROGRESS", now_s + 3600, Some(NOW_MS as i64 - 1)));
    assert_eq!(check(&lapsed).await.unwrap(), None);
    let (_, no_lease) = with_record(record("INPROGRESS", now_s + 10, None));
    assert!(matches!(
        check(&no_lease).await.unwrap(),
        Some(PowertoolsFound::InProgress { retry_after }) if retry_after > Duration::from_secs(9)
    ));
    let (_, odd) = with_record(record("DONE", now_s + 10, None));
    assert!(
        matches!(check(&odd).await, Err(Error::Store(e)) if e.kind() == StoreErrorKind::CorruptRecord)
    );
}

#[tokio::test]
async fn a_different_payload_is_a_reused_key() {
    let now_s = (NOW_MS / 1000) as i64;
    let hash_of_one = "c4ca4238a0b923820dcc509a6f75849b"; // md5("1")
    let mut stored = record("COMPLETED", now_s + 60, None);
    stored.validation = Some(hash_of_one.into());
    let (_, compat) = with_record(stored);
    let compat = compat.payload_validation_jmespath("v").unwrap();
    assert!(compat
        .check(&json!({"k": "x", "v": 1}))
        .await
        .unwrap()
        .is_some());
    assert!(matches!(
        compat.check(&json!({"k": "x", "v": 2})).await,
        Err(Error::KeyReused)
    ));
    // Without a hash the record cannot be checked: refused, as Powertools
    // refuses it.
    let (_, unchecked) = with_record(record("COMPLETED", now_s + 60, None));
    let unchecked = unchecked.payload_validation_jmespath("v").unwrap();
    assert!(matches!(
        unchecked.check(&json!({"k": "x", "v": 1})).await,
        Err(Error::KeyReused)
    ));
}

/// Review of issue 28: a single-table layout without `static_pk_value`
/// gets Powertools' default for the function named, as Powertools does.
#[test]
fn a_sort_key_without_a_partition_value_gets_powertools_default() {
    let records = Arc::new(Records::default());
    let single = PowertoolsLayout {
        sort_key_attr: Some("sk".into()),
        ..PowertoolsLayout::default()
    };
    let defaulted = compat(&records).layout(single.clone());
    assert_eq!(
        defaulted.layout.static_pk_value.as_deref(),
        Some("idempotency#orders")
    );
    let explicit = compat(&records).layout(PowertoolsLayout {
        static_pk_value: Some("pk#mine".into()),
        ..single.clone()
    });
    assert_eq!(explicit.layout.static_pk_value.as_deref(), Some("pk#mine"));
    // A key prefix alone does not name the function: left for the reader
    // to refuse, with what to set.
    let prefixed = PowertoolsCompat::with_key_prefix(Arc::clone(&records), "custom").layout(single);
    assert_eq!(prefixed.layout.static_pk_value, None);
}

/// Powertools TypeScript trims `keyPrefix` (`keyPrefix.trim()`). The ids
/// are what Powertools 2.35 computes under Node 20 for the same body with
/// `eventKeyJmesPath: 'powertools_json(body).order'`.
#[test]
fn a_typescript_key_prefix_is_trimmed_as_javascript_trims() {
    let records = Arc::new(Records::default());
    for (prefix, id) in [
        (
            " \t\u{feff} orders \u{2028}\u{3000}",
            "orders#WW4WGvIvAM/ND7TrGDVykw==",
        ),
        (" orders\u{85} ", "orders\u{85}#WW4WGvIvAM/ND7TrGDVykw=="),
    ] {
        let compat = PowertoolsCompat::typescript(Arc::clone(&records), prefix)
            .event_key_jmespath("powertools_json(body).order")
            .unwrap();
        assert_eq!(
            compat.record_id(&event()).as_deref(),
            Some(id),
            "{prefix:?}"
        );
    }
}

/// Every character JavaScript's `trim()` removes, as Node 20 lists them
/// (`(c + "x").trim() === "x"` over every code point), and no other.
#[test]
fn javascript_trim_removes_what_node_removes() {
    let node: [u32; 25] = [
        0x9, 0xa, 0xb, 0xc, 0xd, 0x20, 0xa0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004,
        0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000,
        0xfeff,
    ];
    for c in (0..=0x10FFFF).filter_map(char::from_u32) {
        let text = format!("{c}x");
        assert_eq!(
            javascript_trim(&text) == "x",
            node.contains(&u32::from(c)),
            "U+{:04X}",
            u32::from(c)
        );
    }
}

/// A response attribute means what each port stored: Python's string is
/// JSON text; TypeScript's string is what the handler returned, its other
/// values (null included) are themselves.
#[tokio::test]
async fn each_port_reads_its_stored_response() {
    let cases = [
        (
            Port::Python,
            PowertoolsData::String("\"hi\"".into()),
            "\"hi\"",
        ),
        (Port::Python, PowertoolsData::String("null".into()), "null"),
        (
            Port::TypeScript,
            PowertoolsData::String("hi \"x\"".into()),
            r#""hi \"x\"""#,
        ),
        (
            Port::TypeScript,
            PowertoolsData::String("{}".into()),
            r#""{}""#,
        ),
        (
            Port::TypeScript,
            PowertoolsData::Value("null".into()),
            "null",
        ),
        (
            Port::TypeScript,
            PowertoolsData::Value("{\"a\":1}".into()),
            "{\"a\":1}",
        ),
    ];
    for (port, data, json) in cases {
        let record = PowertoolsRecord {
            expiration_s: Some(i64::MAX / 1000),
            data: Some(data.clone()),
            ..PowertoolsRecord::new("COMPLETED")
        };
        assert_eq!(
            decide(&record, port, 0),
            Ok(Some(PowertoolsFound::Completed {
                data: Some(json.to_owned())
            })),
            "{port:?} {data:?}"
        );
    }
}
