//! Recovery points in the Powertools compatibility mode, on DynamoDB Local:
//! the mode only reads Powertools' records, and the claim a request runs
//! under is this crate's own record (its own id, in its own format), so a
//! step is recorded there, as without the mode. The Powertools record
//! beside it, in the same table, is never written: after the steps it is
//! byte for byte what Powertools wrote, and Powertools (Python 3.37, the
//! version `make bench` pins) still reads it as its own.
//!
//! Needs `AWS_ENDPOINT_URL_DYNAMODB` and `.tools/bench-py` (Powertools):
//! `scripts/with-dynamodb-local cargo test --test powertools_steps`.

mod support;

use aws_sdk_dynamodb::types::AttributeValue;
use lambda_http::{http, Body, Request, Response};
use lambda_idempotency::{
    http::IdempotencyLayer, powertools::PowertoolsCompat, ClaimHandle, DynamoDbStore, Engine,
    Takeover,
};
use std::{
    collections::HashMap,
    path::Path,
    process::Command,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{SystemTime, UNIX_EPOCH},
};
use tower::{service_fn, Layer, ServiceExt};

const PYTHON: &str = ".tools/bench-py/bin/python";
const BODY: &str = r#"{"order_id":"o-77","amount":1250}"#;

/// What Powertools (Python) reads of the record `id` in `table`, through
/// its own `DynamoDBPersistenceLayer`: `status` and the two expiries.
fn powertools_reads(table: &str, id: &str) -> serde_json::Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(PYTHON);
    assert!(
        python.exists(),
        "{PYTHON} is missing: `make .tools/bench-py/.installed` installs Powertools (make test does)"
    );
    let script = "import json, sys\n\
        from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer\n\
        record = DynamoDBPersistenceLayer(table_name=sys.argv[1])._get_record(sys.argv[2])\n\
        print(json.dumps({'status': record.status, 'expiry': int(record.expiry_timestamp),\n\
            'in_progress_expiry': int(record.in_progress_expiry_timestamp)}))\n";
    let output = Command::new(python)
        .args(["-c", script, table, id])
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("PYTHONWARNINGS", "ignore")
        .output()
        .expect("python runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("its JSON")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// A request the old (Powertools) function began and abandoned is retried
/// against this crate in compatibility mode: the handler runs as a
/// takeover, charges in a step and fails (the layer gives its key back);
/// the retry resumes after the step, so the card is charged once, and the
/// Powertools record is left exactly as Powertools wrote it.
#[tokio::test]
async fn steps_live_in_this_crates_record_and_leave_powertools_record_as_written() {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    let store = DynamoDbStore::new(client.clone(), &table);
    let compat = || {
        PowertoolsCompat::new(store.clone(), "pt-fn", "app.lambda_handler")
            .event_key_jmespath("powertools_json(body).order_id")
            .expect("a key expression")
    };
    // The record Powertools writes for a request in progress, in this
    // crate's table, abandoned: its invocation's lease passed a minute ago.
    let powertools_id = compat()
        .record_id(&serde_json::json!({ "body": BODY }))
        .expect("an id");
    let now_ms = now_ms();
    let written = HashMap::from([
        ("id".to_owned(), AttributeValue::S(powertools_id.clone())),
        ("status".to_owned(), AttributeValue::S("INPROGRESS".into())),
        (
            "expiration".to_owned(),
            AttributeValue::N((now_ms / 1000 + 3600).to_string()),
        ),
        (
            "in_progress_expiration".to_owned(),
            AttributeValue::N((now_ms - 60_000).to_string()),
        ),
    ]);
    client
        .put_item()
        .table_name(&table)
        .set_item(Some(written.clone()))
        .send()
        .await
        .expect("PutItem");
    assert_eq!(
        powertools_reads(&table, &powertools_id)["status"],
        "INPROGRESS",
        "Powertools reads what it wrote"
    );

    let charges = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (charges, calls) = (Arc::clone(&charges), Arc::clone(&calls));
        service_fn(move |request: Request| {
            let (charges, calls) = (Arc::clone(&charges), Arc::clone(&calls));
            async move {
                let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
                assert!(
                    request.extensions().get::<Takeover>().is_some(),
                    "told it takes over the Powertools attempt"
                );
                let claim = request
                    .extensions()
                    .get::<ClaimHandle>()
                    .expect("the claim")
                    .clone();
                let charge = claim
                    .step("charge", || async {
                        Ok::<_, ()>(format!("ch_{}", charges.fetch_add(1, Ordering::SeqCst) + 1))
                    })
                    .await
                    .expect("recorded");
                let status = if call == 1 { 500 } else { 201 };
                Response::builder()
                    .status(status)
                    .body(Body::Text(charge))
                    .map_err(lambda_http::Error::from)
            }
        })
    };
    let service = IdempotencyLayer::new(Engine::builder(store.clone()).build())
        .shared_scope()
        .powertools(compat())
        .layer(handler);
    let send = || {
        let request = http::Request::post("/v1/charges")
            .header("idempotency-key", "k-77")
            .header("content-type", "application/json")
            .body(Body::Text(BODY.into()))
            .expect("request");
        service.clone().oneshot(request)
    };
    let failed = send().await.expect("answered");
    assert_eq!(failed.status(), 500);
    let resumed = send().await.expect("answered");
    assert_eq!(resumed.status(), 201);
    assert_eq!(
        resumed.body(),
        &Body::Text("ch_1".into()),
        "the charge the first attempt recorded"
    );
    assert_eq!(charges.load(Ordering::SeqCst), 1, "charged once");

    let after = client
        .get_item()
        .table_name(&table)
        .key("id", AttributeValue::S(powertools_id.clone()))
        .consistent_read(true)
        .send()
        .await
        .expect("GetItem")
        .item
        .expect("the Powertools record");
    assert_eq!(after, written, "the Powertools record is as written");
    let read = powertools_reads(&table, &powertools_id);
    assert_eq!(read["status"], "INPROGRESS");
    assert_eq!(read["in_progress_expiry"], now_ms - 60_000);
}
