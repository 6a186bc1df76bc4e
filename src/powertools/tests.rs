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
    assert_eq!(
        check(&lapsed).await.unwrap(),
        Some(PowertoolsFound::Abandoned {
            takeover: Takeover {
                attempt: 2,
                first_started_at_ms: now_s as u64 * 1000,
            }
        }),
        "its invocation ended: runs, as a takeover"
    );
    // Without an in-progress expiry: written 59 min 50 s ago (an hour's
    // retention), longer than any invocation lives.
    let (_, no_lease) = with_record(record("INPROGRESS", now_s + 10, None));
    assert!(matches!(
        check(&no_lease).await.unwrap(),
        Some(PowertoolsFound::Abandoned { .. })
    ));
    let (_, undated) = with_record(PowertoolsRecord::new("INPROGRESS"));
    assert!(
        matches!(check(&undated).await, Err(Error::Store(e)) if e.kind() == StoreErrorKind::CorruptRecord),
        "neither expiry: whether it still runs cannot be told"
    );
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

/// Issue 37, item 3: an `INPROGRESS` record without
/// `in_progress_expiration` (Powertools had no Lambda context) is held for
/// as long as an invocation can live, counted from when Powertools wrote
/// it (its expiration less `expires_after_seconds`), then taken over.
#[tokio::test]
async fn a_record_without_an_in_progress_expiry_is_held_as_long_as_an_invocation_lives() {
    let now_s = (NOW_MS / 1000) as i64;
    let at = |compat: PowertoolsCompat, ms: u64| compat.clock(Arc::new(ManualClock::new(ms)));
    let written_s = now_s;
    let (_, compat) = with_record(record("INPROGRESS", written_s + 3600, None));
    // Written at `now_s` (to the second): held until 15 min after the end
    // of that second.
    let held_until_ms = (written_s as u64 + 1) * 1000 + 15 * 60 * 1000;
    for (ms, left_ms) in [
        (NOW_MS, held_until_ms - NOW_MS),
        (held_until_ms - 1_500, 1_500),
        (held_until_ms, 1_000),
    ] {
        assert_eq!(
            check(&at(compat.clone(), ms)).await.unwrap(),
            Some(PowertoolsFound::InProgress {
                retry_after: Duration::from_millis(left_ms).max(Duration::from_secs(1))
            }),
            "at {ms}"
        );
    }
    let abandoned = Some(PowertoolsFound::Abandoned {
        takeover: Takeover {
            attempt: 2,
            first_started_at_ms: written_s as u64 * 1000,
        },
    });
    assert_eq!(
        check(&at(compat.clone(), held_until_ms + 1)).await.unwrap(),
        abandoned,
        "then taken over, not held for the hour"
    );

    // Powertools' expires_after_seconds dates the record: a day's retention
    // configured there and here.
    let (_, day) = with_record(record("INPROGRESS", written_s + 86_400, None));
    let day = day.expires_after(Duration::from_secs(86_400));
    assert!(matches!(
        check(&at(day.clone(), held_until_ms)).await.unwrap(),
        Some(PowertoolsFound::InProgress { .. })
    ));
    assert_eq!(
        check(&at(day.clone(), held_until_ms + 1)).await.unwrap(),
        abandoned
    );
    // With the default hour, that record would look written 23 hours
    // later: still held.
    let (_, misdated) = with_record(record("INPROGRESS", written_s + 86_400, None));
    assert!(matches!(
        check(&at(misdated, held_until_ms + 1)).await.unwrap(),
        Some(PowertoolsFound::InProgress { .. })
    ));

    // A shorter function timeout, from the old function's configuration.
    let short = at(compat.clone(), (written_s as u64 + 1) * 1000 + 30_001)
        .function_timeout(Duration::from_secs(30));
    assert_eq!(check(&short).await.unwrap(), abandoned);

    // Never held past its expiration (a retention shorter than the
    // timeout), after which it is absent.
    let (_, brief) = with_record(record("INPROGRESS", written_s + 60, None));
    let brief = brief.expires_after(Duration::from_secs(60));
    assert!(matches!(
        check(&at(brief.clone(), (written_s as u64 + 61) * 1000 - 1)).await.unwrap(),
        Some(PowertoolsFound::InProgress { retry_after }) if retry_after == Duration::from_secs(1)
    ));
    assert_eq!(
        check(&at(brief, (written_s as u64 + 61) * 1000))
            .await
            .unwrap(),
        None
    );

    // An abandoned record is not validated: Powertools overwrites it
    // without a look at its hash.
    let (_, validated) = with_record(record("INPROGRESS", written_s + 3600, None));
    let validated = at(validated, held_until_ms + 1)
        .payload_validation_jmespath("v")
        .unwrap();
    assert_eq!(
        validated.check(&json!({"k": "x", "v": 2})).await.unwrap(),
        abandoned
    );
}

/// A compat over one record, stored under the id `event` gives with
/// `expression`, its clock at `now_ms`.
fn over(
    expression: &str,
    event: &Value,
    record: PowertoolsRecord,
    now_ms: u64,
) -> PowertoolsCompat {
    let id = compat(&Arc::new(Records::default()))
        .event_key_jmespath(expression)
        .unwrap()
        .record_id(event)
        .expect("a key");
    let records = Arc::new(Records {
        records: HashMap::from([(id, record)]),
        asked: Mutex::default(),
    });
    compat(&records)
        .event_key_jmespath(expression)
        .unwrap()
        .clock(Arc::new(ManualClock::new(now_ms)))
}

const WRITTEN_S: u64 = 1_800_000_000;
/// When a record written at `WRITTEN_S` without an in-progress expiry is
/// held no longer.
const ABANDONED_MS: u64 = (WRITTEN_S + 1) * 1000 + 15 * 60 * 1000 + 1;
const TAKEOVER: Takeover = Takeover {
    attempt: 2,
    first_started_at_ms: WRITTEN_S * 1000,
};

fn unleased() -> PowertoolsRecord {
    record("INPROGRESS", WRITTEN_S as i64 + 3600, None)
}

/// Issue 37, item 3: the HTTP handler that runs after an abandoned
/// Powertools record is told it takes over, with or without this crate's
/// key; before, the request is refused as in progress.
#[cfg(feature = "lambda")]
#[tokio::test]
async fn the_http_handler_after_an_abandoned_record_is_told_it_takes_over() {
    use crate::{http::IdempotencyLayer, Engine, MemoryStore};
    use lambda_http::{http, service_fn, Body, Request, Response};
    use tower::{Layer, ServiceExt};

    let seen = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let seen = Arc::clone(&seen);
        service_fn(move |request: Request| {
            let seen = Arc::clone(&seen);
            async move {
                let takeover = request.extensions().get::<Takeover>().copied();
                let claimed = request
                    .extensions()
                    .get::<crate::ClaimHandle>()
                    .and_then(crate::ClaimHandle::takeover);
                seen.lock().unwrap().push((takeover, claimed));
                Ok::<_, lambda_http::Error>(Response::new(Body::from("ran")))
            }
        })
    };
    let post = |key: Option<&str>| {
        let mut builder = http::Request::post("/v1/charges");
        if let Some(key) = key {
            builder = builder.header("idempotency-key", key);
        }
        builder.body(Body::from("{\"order_id\": \"o-1\"}")).unwrap()
    };
    let by_header = |now_ms| {
        let view = json!({"headers": {"Idempotency-Key": "pt-1"}});
        over("headers.\"Idempotency-Key\"", &view, unleased(), now_ms)
    };
    let engine = Engine::builder(MemoryStore::new()).build();

    let held = IdempotencyLayer::new(engine.clone())
        .shared_scope()
        .powertools(by_header((WRITTEN_S + 14 * 60) * 1000))
        .layer(handler.clone());
    let response = held.oneshot(post(Some("pt-1"))).await.unwrap();
    assert_eq!(response.status(), 409, "held while an invocation may live");
    assert!(seen.lock().unwrap().is_empty());

    let taken = IdempotencyLayer::new(engine.clone())
        .shared_scope()
        .powertools(by_header(ABANDONED_MS))
        .layer(handler.clone());
    let response = taken.oneshot(post(Some("pt-1"))).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        seen.lock().unwrap().pop(),
        Some((Some(TAKEOVER), Some(TAKEOVER))),
        "the takeover in the extensions and on the claim"
    );

    // Keyed on the body, the request without this crate's key passes
    // through unclaimed, and is told all the same.
    let view = json!({"body": "{\"order_id\": \"o-1\"}"});
    let by_body = over(
        "powertools_json(body).order_id",
        &view,
        unleased(),
        ABANDONED_MS,
    );
    let keyless = IdempotencyLayer::new(engine)
        .shared_scope()
        .require_key(false)
        .powertools(by_body)
        .layer(handler);
    let response = keyless.oneshot(post(None)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(seen.lock().unwrap().pop(), Some((Some(TAKEOVER), None)));
}

/// Issue 37, item 3: a batch record that runs after an abandoned
/// Powertools record is told it takes over (`ClaimHandle::current`);
/// before, it fails, to be delivered again.
#[cfg(feature = "consumers")]
#[tokio::test]
async fn a_batch_record_after_an_abandoned_record_is_told_it_takes_over() {
    use crate::{consumers::SqsBatch, ClaimHandle, Engine, MemoryStore};
    use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
    use lambda_runtime::{Context, LambdaEvent};

    let mut message = SqsMessage::default();
    message.message_id = Some("m-1".into());
    message.body = Some("{}".into());
    let view = serde_json::to_value(&message).unwrap();
    let mut event = SqsEvent::default();
    event.records = vec![message];
    let engine = Engine::builder(MemoryStore::new()).build();
    for (now_ms, failed, told) in [
        ((WRITTEN_S + 14 * 60) * 1000, 1, None),
        (ABANDONED_MS, 0, Some(Some(TAKEOVER))),
    ] {
        let told_in = Arc::new(Mutex::new(None));
        let batch = SqsBatch::new(engine.clone(), "queue").powertools(over(
            "messageId",
            &view,
            unleased(),
            now_ms,
        ));
        let response = batch
            .process(
                LambdaEvent::new(event.clone(), Context::default()),
                |_message: SqsMessage| {
                    let told_in = Arc::clone(&told_in);
                    async move {
                        *told_in.lock().unwrap() =
                            Some(ClaimHandle::current().and_then(|claim| claim.takeover()));
                        Ok::<_, String>(())
                    }
                },
            )
            .await
            .unwrap();
        assert_eq!(response.batch_item_failures.len(), failed, "at {now_ms}");
        assert_eq!(*told_in.lock().unwrap(), told, "at {now_ms}");
    }
}

/// Issue 37, item 4: a key on the query string, as API Gateway delivered
/// it to Powertools (REST: the last value of a repeated name; HTTP API:
/// the values joined with commas), finds the record Powertools wrote for
/// the whole event through the HTTP layer; a key on a header too.
#[cfg(feature = "lambda")]
#[tokio::test]
async fn keys_on_the_query_string_and_headers_are_read_as_api_gateway_delivered_them() {
    use crate::{http::IdempotencyLayer, Engine, MemoryStore};
    use lambda_http::{request::from_str, service_fn, Body, Request, Response};
    use tower::{Layer, ServiceExt};

    let mut rest: Value =
        serde_json::from_str(include_str!("../../events/rest-api-create-charge.json")).unwrap();
    rest["queryStringParameters"] = json!({"order": "o-2", "tag": "a b"});
    rest["multiValueQueryStringParameters"] = json!({"order": ["o-1", "o-2"], "tag": ["a b"]});
    let mut http_api: Value =
        serde_json::from_str(include_str!("../../events/http-api-create-charge.json")).unwrap();
    http_api["rawQueryString"] = json!("order=o-1&tag=a%20b&order=o-2");
    http_api["queryStringParameters"] = json!({"order": "o-1,o-2", "tag": "a b"});
    let completed = PowertoolsRecord {
        expiration_s: Some(WRITTEN_S as i64 + 3600),
        data: Some(PowertoolsData::String(
            "{\"statusCode\": 201, \"body\": \"from powertools\"}".to_owned(),
        )),
        ..PowertoolsRecord::new("COMPLETED")
    };
    // Each event's header names as API Gateway wrote them (JMESPath is
    // case-sensitive).
    for (name, event, header) in [
        ("REST API", &rest, "Idempotency-Key"),
        ("HTTP API", &http_api, "idempotency-key"),
    ] {
        for expression in [
            "queryStringParameters.order".to_owned(),
            "[queryStringParameters.order, queryStringParameters.tag]".to_owned(),
            "queryStringParameters".to_owned(),
            format!("headers.\"{header}\""),
            format!("[headers.\"{header}\", queryStringParameters.tag, body]"),
            "powertools_json(body).customer".to_owned(),
        ] {
            let expression = expression.as_str();
            // The id Powertools computed from the event as Lambda gave it.
            let compat = over(expression, event, completed.clone(), WRITTEN_S * 1000);
            let runs = Arc::new(Mutex::new(0));
            let counted = Arc::clone(&runs);
            let service = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build())
                .shared_scope()
                .require_key(false)
                .try_powertools(compat)
                .unwrap()
                .layer(service_fn(move |_: Request| {
                    *counted.lock().unwrap() += 1;
                    async { Ok::<_, lambda_http::Error>(Response::new(Body::from("ran"))) }
                }));
            let request = from_str(&event.to_string()).unwrap();
            let response = service.oneshot(request).await.unwrap();
            assert_eq!(
                (response.status().as_u16(), *runs.lock().unwrap()),
                (201, 0),
                "{name}, {expression}: replayed, not run"
            );
        }
    }
}

/// Issue 37, item 4: the HTTP layer refuses, when it is built, an
/// expression it cannot evaluate as Powertools did (the whole event by
/// default, `requestContext`), for the key and for payload validation;
/// a batch takes it (the whole record is there).
#[cfg(feature = "lambda")]
#[test]
fn the_http_layer_refuses_what_it_cannot_evaluate_when_built() {
    use crate::{http::IdempotencyLayer, Engine, MemoryStore};
    let layer = || IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build());
    let records = Arc::new(Records::default());
    let whole = compat(&records);
    let error = layer().try_powertools(whole.clone()).unwrap_err();
    assert!(error.to_string().contains("whole event"), "{error}");
    let by_request_id = compat(&records)
        .event_key_jmespath("requestContext.requestId")
        .unwrap();
    assert!(layer().try_powertools(by_request_id).is_err());
    let validated_on_context = compat(&records)
        .event_key_jmespath("queryStringParameters.order")
        .unwrap()
        .payload_validation_jmespath("requestContext.identity")
        .unwrap();
    assert!(layer().try_powertools(validated_on_context).is_err());
    // A closure is the user's own view of the request: taken.
    let closure = compat(&records).event_key(|view| view.get("body").cloned());
    assert!(layer().try_powertools(closure).is_ok());
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        layer().powertools(whole.clone())
    }));
    assert!(panicked.is_err());
    #[cfg(feature = "consumers")]
    {
        let _ = crate::consumers::SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "q")
            .powertools(whole);
    }
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
            decide(&record, port, 0, Holds::default()),
            Ok(Some(PowertoolsFound::Completed {
                data: Some(json.to_owned())
            })),
            "{port:?} {data:?}"
        );
    }
}

/// A batch record whose Powertools record has another payload hash is a
/// reused key: delivered again by default, given up as final with
/// `Unprocessable::Final`; its handler runs in neither.
#[cfg(feature = "consumers")]
#[tokio::test]
async fn a_batch_record_reusing_a_powertools_key_is_redelivered_or_given_up() {
    use crate::consumers::{SqsBatch, Unprocessable};
    use crate::{Engine, MemoryStore};
    use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
    use lambda_runtime::{Context, LambdaEvent};

    let mut message = SqsMessage::default();
    message.message_id = Some("m-1".into());
    message.body = Some("{\"amount\":2}".into());
    let view = serde_json::to_value(&message).unwrap();
    let mut event = SqsEvent::default();
    event.records = vec![message];
    let completed = PowertoolsRecord {
        expiration_s: Some((NOW_MS / 1000) as i64 + 3600),
        data: Some(PowertoolsData::String("{\"ok\": true}".to_owned())),
        validation: Some("the hash of another payload".to_owned()),
        ..PowertoolsRecord::new("COMPLETED")
    };
    for (unprocessable, failed) in [(Unprocessable::Redeliver, 1), (Unprocessable::Final, 0)] {
        let compat = over("messageId", &view, completed.clone(), NOW_MS)
            .payload_validation_jmespath("body")
            .unwrap();
        let runs = Arc::new(Mutex::new(0));
        let batch = SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "queue")
            .powertools(compat)
            .unprocessable(unprocessable);
        let response = batch
            .process(LambdaEvent::new(event.clone(), Context::default()), {
                let runs = Arc::clone(&runs);
                move |_message: SqsMessage| {
                    *runs.lock().unwrap() += 1;
                    async { Ok::<_, String>(()) }
                }
            })
            .await
            .unwrap();
        assert_eq!(
            response.batch_item_failures.len(),
            failed,
            "{unprocessable:?}"
        );
        assert_eq!(*runs.lock().unwrap(), 0, "{unprocessable:?}");
    }
}

/// Review finding (minor, not a second charge): Powertools TypeScript 2.35
/// counts a record expired from the millisecond after its `expiration`
/// (`IdempotencyRecord.isExpired`: `Date.now() / 1000 > this.expiryTimestamp`),
/// Python from the second after (`int(now) > expiry`). The mode applies
/// Python's rule to both ports, so for up to 999 ms a TypeScript record
/// TypeScript would overwrite and run again is replayed (or held) here.
///
/// Fixed: each port's own rule (`Port::expired`).
#[tokio::test]
async fn a_typescript_record_expires_the_millisecond_after_its_expiration() {
    let now_s = (NOW_MS / 1000) as i64; // NOW_MS is 500 ms into that second
    let base = Arc::new(Records::default());
    let ts = |records: &Arc<Records>| {
        PowertoolsCompat::typescript(Arc::clone(records), "fn")
            .event_key_jmespath("k")
            .unwrap()
            .clock(Arc::new(ManualClock::new(NOW_MS)))
    };
    let id = ts(&base).record_id(&json!({"k": "x"})).unwrap();
    let records = Arc::new(Records {
        records: HashMap::from([(id, record("COMPLETED", now_s, None))]),
        asked: Mutex::default(),
    });
    assert_eq!(
        check(&ts(&records)).await.unwrap(),
        None,
        "expired to TypeScript"
    );
}
