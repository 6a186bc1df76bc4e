//! The `lambda-idempotency` operator tool against DynamoDB Local,
//! PostgreSQL and Redis: inspect, list, forget, purge, with real records.
//!
//! Needs `AWS_ENDPOINT_URL_DYNAMODB`, `IDEMPOTENCY_TEST_POSTGRES_URL` and
//! `IDEMPOTENCY_TEST_REDIS_URL`; `make test` provides them.

// The integration harness helpers are the library's (tests/support).
#[path = "../../tests/support/mod.rs"]
mod support;

use lambda_idempotency::{
    store::{postgres::PostgresStore, redis::RedisStore, Claim, OwnerToken, Store},
    testing::ManualClock,
    Attempt, Clock, DynamoDbStore, Engine, Fingerprint, SystemClock,
};
use serde_json::Value;
use std::{
    process::{Command, Output},
    time::Duration,
};
use support::variable;

const PREFIX: &str = "idempotency:cli-test";

/// The tool, with the arguments that name a store.
struct Tool(Vec<String>);

impl Tool {
    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_lambda-idempotency"))
            .args(&self.0)
            .args(["--prefix", PREFIX])
            .args(args)
            .env("AWS_ENDPOINT_URL_DYNAMODB", support::endpoint())
            .env("AWS_ACCESS_KEY_ID", "local")
            .env("AWS_SECRET_ACCESS_KEY", "local")
            .env("AWS_REGION", "us-east-1")
            .env_remove("AWS_PROFILE")
            .env_remove("IDEMPOTENCY_STORE_URL")
            .env_remove("IDEMPOTENCY_TABLE")
            .env_remove("AWS_LAMBDA_FUNCTION_NAME")
            .output()
            .expect("the tool runs")
    }
}

fn cli(table: &str, args: &[&str]) -> Output {
    Tool(vec!["--table".into(), table.into()]).run(args)
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
    let tool = Tool(vec!["--table".into(), table.clone()]);
    inspect_list_forget(DynamoDbStore::new(client, table.clone()), &tool).await;

    let output = tool.run(&["purge-expired"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("TTL"));
    let output = Tool(vec![
        "--store".into(),
        format!("dynamodb://{table}"),
        "--table".into(),
        "other".into(),
    ])
    .run(&["list", "--in-progress"]);
    assert_eq!(
        output.status.code(),
        Some(2),
        "two tables named: {output:?}"
    );
}

/// Powertools' names: `key_attr`, `sort_key_attr`, `static_pk_value`.
#[tokio::test]
async fn an_operator_inspects_lists_and_forgets_records_of_a_single_table_layout() {
    use lambda_idempotency::store::dynamodb::{AttributeNames, SingleTable};
    let client = support::client();
    let table = support::unique_name("cli-single-table");
    let store = DynamoDbStore::new(client, table.clone())
        .attribute_names(AttributeNames::default().id("pk"))
        .single_table(SingleTable::new("idempotency#cli", "sk"));
    store.create_table().await.expect("create_table");
    let tool = Tool(
        [
            "--table",
            &table,
            "--key-attr",
            "pk",
            "--sort-key-attr",
            "sk",
            "--static-pk-value",
            "idempotency#cli",
        ]
        .map(String::from)
        .to_vec(),
    );
    inspect_list_forget(store, &tool).await;

    // Another partition value is another function's: nothing of ours.
    let output = Tool(
        [
            "--table",
            &table,
            "--key-attr",
            "pk",
            "--sort-key-attr",
            "sk",
            "--static-pk-value",
            "idempotency#other",
        ]
        .map(String::from)
        .to_vec(),
    )
    .run(&["list", "--in-progress", "--json"]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(json(&output), serde_json::json!([]), "{output:?}");

    // Review of issue 28: a layout that is not the table's, or no
    // partition value, is an error, not "no record".
    for args in [
        &["--table", &table][..],
        &[
            "--table",
            &table,
            "--key-attr",
            "pk",
            "--sort-key-attr",
            "sk",
        ][..],
    ] {
        let output =
            Tool(args.iter().map(|a| a.to_string()).collect()).run(&["list", "--in-progress"]);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("key is not what the store needs")
                || stderr.contains("--static-pk-value"),
            "{args:?}: {stderr}"
        );
    }
}

#[tokio::test]
async fn an_operator_inspects_lists_forgets_and_purges_postgresql_records() {
    let url = variable("IDEMPOTENCY_TEST_POSTGRES_URL");
    let table = format!("cli_{}", std::process::id());
    let store = PostgresStore::connect(&url, table.as_str(), 2).expect("pool");
    store.create_table().await.expect("table");
    let tool = Tool(vec![
        "--store".into(),
        url,
        "--postgres-table".into(),
        table.clone(),
    ]);
    inspect_list_forget(store.clone(), &tool).await;

    // Three records that expired a day ago, beside the live ones.
    let clock = ManualClock::new(SystemClock.now_ms() - 2 * 86_400_000);
    let past = Engine::builder(store.clone())
        .key_prefix(PREFIX)
        .clock(clock)
        .retention(Duration::from_secs(86_400))
        .build();
    for key in ["old-1", "old-2", "old-3"] {
        past.execute(
            &Attempt::new("tenant-1", key, Fingerprint::of_bytes(b"old")),
            || async { Ok::<_, std::io::Error>(1u8) },
        )
        .await
        .expect("an old record");
    }
    let postgres = variable("IDEMPOTENCY_TEST_POSTGRES_URL");
    let rows = || support::postgres_rows(&postgres, &table);
    let before = rows().await;
    let output = tool.run(&["purge-expired", "--batch", "2", "--json"]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        json(&output)["purged"],
        3,
        "the three expired records, in batches of 2"
    );
    assert_eq!(rows().await, before - 3, "the live records stay");
    let output = tool.run(&["purge-expired", "--json"]);
    assert_eq!(json(&output)["purged"], 0, "nothing left to purge");
}

#[tokio::test]
async fn an_operator_inspects_lists_and_forgets_redis_records() {
    let url = variable("IDEMPOTENCY_TEST_REDIS_URL");
    let namespace = format!("cli-{}:", std::process::id());
    let store = RedisStore::open(&url).expect("url").namespace(&namespace);
    let tool = Tool(vec![
        "--store".into(),
        url,
        "--redis-namespace".into(),
        namespace,
    ]);
    inspect_list_forget(store, &tool).await;

    let output = tool.run(&["purge-expired"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("PEXPIREAT"),
        "{output:?}"
    );
}

#[test]
fn a_store_url_the_tool_does_not_know_is_a_message() {
    for url in [
        "ftp://example.com/records",
        "dynamodb://",
        "postgres://[bad",
    ] {
        let output = Tool(vec!["--store".into(), url.into()]).run(&["list", "--in-progress"]);
        assert_eq!(output.status.code(), Some(2), "{url}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.starts_with("lambda-idempotency: "),
            "{url}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{url}: {stderr}");
    }
}

/// Inspect, list and forget through the tool, on records the engine wrote
/// to `store` (which `tool` names).
async fn inspect_list_forget<St: Store + Clone>(store: St, tool: &Tool) {
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

    let output = tool.run(&[
        "inspect",
        "--scope",
        "tenant-1",
        "--key",
        "order-secret-77",
        "--json",
    ]);
    assert!(output.status.success(), "{output:?}");
    let record = json(&output);
    assert_eq!(record["status"], "COMPLETED");
    assert_eq!(record["state"], "completed");
    assert_eq!(
        record["response"]["json"]["charge"], "ch_1",
        "what a retry gets back"
    );

    let output = tool.run(&["list", "--in-progress", "--json"]);
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

    let output = tool.run(&[
        "forget",
        "--scope",
        "tenant-1",
        "--key",
        "order-secret-78",
        "--json",
    ]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(
        json(&output)["result"],
        "in_progress",
        "kept without --force"
    );
    let output = tool.run(&[
        "forget",
        "--scope",
        "tenant-1",
        "--key",
        "order-secret-78",
        "--force",
        "--json",
    ]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(json(&output)["result"], "removed");

    let output = tool.run(&["forget", "--scope", "tenant-1", "--key", "order-secret-77"]);
    assert!(output.status.success(), "{output:?}");
    let output = tool.run(&[
        "inspect",
        "--scope",
        "tenant-1",
        "--key",
        "order-secret-77",
        "--json",
    ]);
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
}

#[tokio::test]
async fn an_operator_finds_a_record_from_the_request_event() {
    let event = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../events/http-api-create-charge.json"
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
