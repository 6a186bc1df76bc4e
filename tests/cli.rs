//! The `lambda-idempotency` operator tool against DynamoDB Local: inspect,
//! list, forget, with real records.
//!
//! Needs `AWS_ENDPOINT_URL_DYNAMODB`; `make test` provides it.

mod support;

use lambda_idempotency::{
    store::{Claim, OwnerToken, Store},
    Attempt, Clock, DynamoDbStore, Engine, Fingerprint, SystemClock,
};
use serde_json::Value;
use std::process::{Command, Output};

const PREFIX: &str = "idempotency:cli-test";

fn cli(table: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lambda-idempotency"))
        .args(["--table", table, "--prefix", PREFIX])
        .args(args)
        .env("AWS_ENDPOINT_URL_DYNAMODB", support::endpoint())
        .env("AWS_ACCESS_KEY_ID", "local")
        .env("AWS_SECRET_ACCESS_KEY", "local")
        .env("AWS_REGION", "us-east-1")
        .env_remove("AWS_PROFILE")
        .output()
        .expect("the tool runs")
}

fn json(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

#[tokio::test]
async fn an_operator_inspects_lists_and_forgets_records() {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    let store = DynamoDbStore::new(client, table.clone());
    let engine = Engine::builder(store.clone()).key_prefix(PREFIX).build();
    let attempt = Attempt::new(
        "tenant-1",
        "order-secret-77",
        Fingerprint::of_bytes(b"body"),
    );
    engine
        .execute(&attempt, || async {
            Ok::<_, std::io::Error>(serde_json::json!({ "charge": "ch_1" }))
        })
        .await
        .expect("completed");
    // A claim whose invocation died a minute ago: stuck.
    let now = SystemClock.now_ms();
    let stuck = Claim {
        id: engine.record_id("tenant-1", "order-secret-78"),
        owner: OwnerToken::from_stored("dead-owner"),
        fingerprint: Fingerprint::of_bytes(b"body"),
        now_ms: now - 60_000,
        lease_until_ms: now - 30_000,
        expiration_s: now / 1000 + 3600,
        attempt: 1,
        first_started_ms: now - 60_000,
    };
    store.claim(&stuck).await.expect("claimed");

    let output = cli(
        &table,
        &[
            "inspect",
            "--scope",
            "tenant-1",
            "--key",
            "order-secret-77",
            "--json",
        ],
    );
    assert!(output.status.success(), "{output:?}");
    let record = json(&output);
    assert_eq!(record["status"], "COMPLETED");
    assert_eq!(record["state"], "completed");
    assert_eq!(
        record["response"]["json"]["charge"], "ch_1",
        "what a retry gets back"
    );

    let output = cli(&table, &["list", "--in-progress", "--json"]);
    assert!(output.status.success(), "{output:?}");
    let listed = json(&output);
    let listed = listed.as_array().expect("a list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["state"], "stuck");
    assert_eq!(listed[0]["id"], stuck.id.as_str());
    assert!(
        !String::from_utf8_lossy(&output.stdout).contains("order-secret"),
        "a raw key it was not given is never printed"
    );

    let output = cli(
        &table,
        &[
            "forget",
            "--scope",
            "tenant-1",
            "--key",
            "order-secret-78",
            "--json",
        ],
    );
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(
        json(&output)["result"],
        "in_progress",
        "kept without --force"
    );
    let output = cli(
        &table,
        &[
            "forget",
            "--scope",
            "tenant-1",
            "--key",
            "order-secret-78",
            "--force",
            "--json",
        ],
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(json(&output)["result"], "removed");

    let output = cli(
        &table,
        &["forget", "--scope", "tenant-1", "--key", "order-secret-77"],
    );
    assert!(output.status.success(), "{output:?}");
    let output = cli(
        &table,
        &[
            "inspect",
            "--scope",
            "tenant-1",
            "--key",
            "order-secret-77",
            "--json",
        ],
    );
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(json(&output)["record"], Value::Null);
    let runs = engine
        .execute(&attempt, || async {
            Ok::<_, std::io::Error>(serde_json::json!({ "charge": "ch_2" }))
        })
        .await
        .expect("runs again");
    assert_eq!(
        runs.value()["charge"],
        "ch_2",
        "forgotten: the next request runs"
    );

    let output = cli(&table, &["purge-expired"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("TTL"));
}

#[tokio::test]
async fn an_operator_finds_a_record_from_the_request_event() {
    let event = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/events/http-api-create-charge.json"
    );
    let request = lambda_http::request::from_str(&std::fs::read_to_string(event).expect("event"))
        .expect("an HTTP API event");
    let scope = lambda_idempotency::http::default_scope(&request);

    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    let engine = Engine::builder(DynamoDbStore::new(client, table.clone()))
        .key_prefix(PREFIX)
        .build();
    let attempt = Attempt::new(&scope, "evt-key", Fingerprint::of_bytes(b"body"));
    engine
        .execute(&attempt, || async { Ok::<_, std::io::Error>(7u8) })
        .await
        .expect("completed");

    let output = cli(&table, &["scope", "--event", event, "--json"]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(json(&output)["scope"], scope.as_str(), "the layer's scope");
    let output = cli(
        &table,
        &["inspect", "--event", event, "--key", "evt-key", "--json"],
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(json(&output)["response"]["json"], 7);

    let output = cli(
        &table,
        &[
            "scope",
            "--event",
            concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
        ],
    );
    assert_eq!(
        output.status.code(),
        Some(2),
        "not an event: a message, not a panic"
    );
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("not an API Gateway"),
        "{output:?}"
    );
}
