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
            .env_remove("IDEMPOTENCY_RAW_KEYS")
            .env_remove("IDEMPOTENCY_ENCRYPTION_CONTEXT")
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
    sealed_records(store.clone(), &tool).await;

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

/// The partitioned layout from the tool: `maintain-partitions` drops the
/// day past the audit window and makes the days ahead, `partitions` lists
/// them, `history` shows what support sees of a key (its record and the
/// one it replaced), and `purge-expired` is refused.
#[tokio::test]
async fn an_operator_maintains_a_partitioned_postgresql_table() {
    use lambda_idempotency::store::postgres::Partitioning;
    let url = variable("IDEMPOTENCY_TEST_POSTGRES_URL");
    let table = format!("cli_parted_{}", std::process::id());
    let store = PostgresStore::connect(&url, table.as_str(), 2)
        .expect("pool")
        .partitioned(Partitioning::daily().audit_window(Duration::from_secs(3 * 86_400)));
    store.create_table().await.expect("table");
    let tool = Tool(vec![
        "--store".into(),
        url,
        "--postgres-table".into(),
        table.clone(),
        "--postgres-partitioned".into(),
        "--audit-window-days".into(),
        "3".into(),
    ]);
    // A key first run ten days ago (a day's retention), and again now.
    let now = SystemClock.now_ms();
    let clock = ManualClock::new(now - 10 * 86_400_000);
    let engine = Engine::builder(store.clone())
        .key_prefix(PREFIX)
        .clock(clock.clone())
        .retention(Duration::from_secs(86_400))
        .build();
    let attempt = Attempt::new("tenant-1", "order-9", Fingerprint::of_bytes(b"p"));
    for _ in 0..2 {
        engine
            .execute(&attempt, || async { Ok::<_, std::io::Error>(1u8) })
            .await
            .expect("a record");
        clock.set(now);
    }
    let history = |tool: &Tool| {
        json(&tool.run(&[
            "history", "--scope", "tenant-1", "--key", "order-9", "--json",
        ]))
    };
    assert_eq!(history(&tool)["records"].as_array().map(Vec::len), Some(2));

    let output = tool.run(&["maintain-partitions", "--json"]);
    assert!(output.status.success(), "{output:?}");
    let report = json(&output);
    let dropped = report["dropped"].as_array().expect("dropped");
    assert_eq!(
        dropped.len(),
        4,
        "the day ten days ago, and the three empty days made ahead of it: {report}"
    );
    assert_eq!(history(&tool)["records"].as_array().map(Vec::len), Some(1));

    let output = tool.run(&["partitions", "--json"]);
    let partitions = json(&output);
    let partitions = partitions.as_array().expect("partitions");
    assert!(
        partitions.len() >= 4,
        "today and three days ahead: {partitions:?}"
    );
    assert!(partitions.iter().all(|p| p["name"]
        .as_str()
        .is_some_and(|n| n.starts_with(&format!("{table}_p")))));

    let output = tool.run(&["purge-expired"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("drop_expired_partitions"),
        "{output:?}"
    );
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
    inspect_list_forget(store.clone(), &tool).await;
    sealed_records(store, &tool).await;

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

/// Sealed responses (the engine's encryption) on DynamoDB: opened with the
/// keys and the context, refused plainly when a byte was changed in the
/// table, forgotten as any record.
#[tokio::test]
async fn an_operator_opens_sealed_records_and_forgets_one_that_does_not_open() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    let store = DynamoDbStore::new(client.clone(), table.clone());
    let tool = Tool(vec!["--table".into(), table.clone()]);
    sealed_records(store.clone(), &tool).await;

    // One byte of a sealed response changed in the table.
    let engine = sealing_engine(store, SEALED_CONTEXT);
    engine
        .execute(
            &Attempt::new("tenant-1", "tampered", Fingerprint::of_bytes(b"body")),
            || async { Ok::<_, std::io::Error>(serde_json::json!({ "card": "4242424242424242" })) },
        )
        .await
        .expect("completed");
    let id = engine.record_id("tenant-1", "tampered");
    let key =
        std::collections::HashMap::from([("id".to_owned(), AttributeValue::S(id.as_str().into()))]);
    let item = client
        .get_item()
        .table_name(&table)
        .set_key(Some(key.clone()))
        .consistent_read(true)
        .send()
        .await
        .expect("GetItem")
        .item
        .expect("the record");
    let mut response = item["response"].as_b().expect("binary").as_ref().to_vec();
    let last = response.len() - 1;
    response[last] ^= 1;
    client
        .update_item()
        .table_name(&table)
        .set_key(Some(key))
        .update_expression("SET #r = :r")
        .expression_attribute_names("#r", "response")
        .expression_attribute_values(":r", AttributeValue::B(response.into()))
        .send()
        .await
        .expect("UpdateItem");
    let files = KeyFiles::new();
    let output = tool.run(&[
        "--raw-key",
        &files.raw("k1"),
        "--encryption-context",
        SEALED_CONTEXT,
        "inspect",
        "--scope",
        "tenant-1",
        "--key",
        "tampered",
    ]);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("DOES NOT OPEN (unauthentic)"), "{stdout}");
    assert!(stdout.contains("forget"), "says what to do: {stdout}");
    assert!(!stdout.contains("4242"), "{stdout}");
    let output = tool.run(&[
        "forget", "--scope", "tenant-1", "--key", "tampered", "--json",
    ]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(json(&output)["result"], "removed");
}

const SEALED_CONTEXT: &str = "cli-test/records";

fn sealing_engine<St: Store>(store: St, context: &str) -> Engine<St> {
    use lambda_idempotency::encryption::{Encryption, RawKeys};
    let keys = RawKeys::new("k1", &[1; 32]).expect("key");
    Engine::builder(store)
        .key_prefix(PREFIX)
        .encryption(Encryption::new(keys, context))
        .build()
}

/// Key files of this test's own: `k1`'s key as raw bytes, another's as hex.
struct KeyFiles(std::path::PathBuf);

impl KeyFiles {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(support::unique_name("cli-keys"));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("k1.key"), [1u8; 32]).expect("write");
        std::fs::write(dir.join("k1.hex"), format!("{}\n", "01".repeat(32))).expect("write");
        std::fs::write(dir.join("k2.hex"), "02".repeat(32)).expect("write");
        std::fs::write(dir.join("short.key"), [1u8; 16]).expect("write");
        Self(dir)
    }

    /// `<id>=<file>` of the raw `k1` key under `id`.
    fn raw(&self, id: &str) -> String {
        format!("{id}={}", self.0.join("k1.key").display())
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for KeyFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A response sealed by the engine, through the tool: its key id without
/// keys; opened with them (a raw key file and a hex one); not opened, and
/// said so, under another context or without its key; the arguments'
/// mistakes as messages; and forgotten as any record.
async fn sealed_records<St: Store + Clone>(store: St, tool: &Tool) {
    let engine = sealing_engine(store, SEALED_CONTEXT);
    let attempt = Attempt::new("tenant-1", "sealed-1", Fingerprint::of_bytes(b"body"));
    engine
        .execute(&attempt, || async {
            Ok::<_, std::io::Error>(serde_json::json!({ "card": "4242424242424242" }))
        })
        .await
        .expect("completed");
    let files = KeyFiles::new();
    let inspect = |extra: &[&str]| {
        let mut args: Vec<&str> = extra.to_vec();
        args.extend([
            "inspect", "--scope", "tenant-1", "--key", "sealed-1", "--json",
        ]);
        tool.run(&args)
    };

    // No keys: the key id and the size, nothing of the response.
    let output = inspect(&[]);
    assert!(output.status.success(), "{output:?}");
    let record = json(&output);
    assert_eq!(record["response"]["sealed"]["key_id"], "k1");
    assert!(record["response"].get("opened").is_none());
    assert!(!String::from_utf8_lossy(&output.stdout).contains("4242"));

    // The key (raw bytes, or hex with a newline) and the context: opened,
    // as a retry gets it back.
    for key in [files.raw("k1"), format!("k1={}", files.path("k1.hex"))] {
        let output = inspect(&[
            "--raw-key",
            &key,
            "--raw-key",
            &format!("k2={}", files.path("k2.hex")),
            "--encryption-context",
            SEALED_CONTEXT,
        ]);
        assert!(output.status.success(), "{output:?}");
        let record = json(&output);
        assert_eq!(record["response"]["sealed"]["key_id"], "k1");
        assert_eq!(
            record["response"]["opened"]["json"]["card"], "4242424242424242",
            "{record}"
        );
    }

    // Another context (a record copied from another table), or no key of
    // its id: never an opaque error, a record that does not open (exit 3).
    for (args, reason) in [
        (
            vec![
                "--raw-key".to_owned(),
                files.raw("k1"),
                "--encryption-context".into(),
                "other".into(),
            ],
            "unauthentic",
        ),
        (
            vec![
                "--raw-key".to_owned(),
                format!("k2={}", files.path("k2.hex")),
                "--encryption-context".into(),
                SEALED_CONTEXT.into(),
            ],
            "unknown_key",
        ),
        (
            // Another key under k1's id.
            vec![
                "--raw-key".to_owned(),
                format!("k1={}", files.path("k2.hex")),
                "--encryption-context".into(),
                SEALED_CONTEXT.into(),
            ],
            "unauthentic",
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = inspect(&args);
        assert_eq!(output.status.code(), Some(3), "{args:?}: {output:?}");
        let record = json(&output);
        assert_eq!(
            record["response"]["not_opened"]["reason"], reason,
            "{record}"
        );
        assert_eq!(record["response"]["not_opened"]["key_id"], "k1", "{record}");
        assert!(record["response"].get("opened").is_none());
    }

    // The arguments' mistakes: messages, exit 2.
    for (args, says) in [
        (
            vec!["--raw-key".to_owned(), files.raw("k1")],
            "--encryption-context",
        ),
        (
            vec![
                "--raw-key".to_owned(),
                files.path("k1.key"),
                "--encryption-context".into(),
                "c".into(),
            ],
            "<key id>=<file>",
        ),
        (
            vec![
                "--raw-key".to_owned(),
                format!("k1={}", files.path("short.key")),
                "--encryption-context".into(),
                "c".into(),
            ],
            "64 hex digits",
        ),
        (
            vec![
                "--raw-key".to_owned(),
                format!("k1={}", files.path("missing")),
                "--encryption-context".into(),
                "c".into(),
            ],
            "missing",
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = inspect(&args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }

    // Forgotten as any record: the next request runs.
    let output = tool.run(&[
        "forget", "--scope", "tenant-1", "--key", "sealed-1", "--json",
    ]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(json(&output)["result"], "removed");
    assert_eq!(inspect(&[]).status.code(), Some(1));
}

/// `stats`: the table size as each store counts it, in text and JSON; a
/// store with no cheap count says so (exit code 1).
#[tokio::test]
async fn an_operator_reads_the_table_size() {
    async fn records<St: Store>(store: St) {
        let engine = Engine::builder(store).key_prefix(PREFIX).build();
        support::table_size::complete_records(&engine, 3).await;
    }

    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    records(DynamoDbStore::new(client, table.clone())).await;
    let output = cli(&table, &["stats", "--json"]);
    assert!(output.status.success(), "{output:?}");
    let stats = json(&output);
    assert_eq!(stats["records"], 3, "{stats}");
    assert_eq!(stats["accuracy"], "estimated");
    assert_eq!(stats["source"], "describe_table");
    assert!(stats["bytes"].as_u64().is_some_and(|b| b > 0), "{stats}");
    let text = String::from_utf8_lossy(&cli(&table, &["stats"]).stdout).into_owned();
    assert!(text.starts_with("about 3 records, "), "{text}");
    assert!(
        text.trim_end().ends_with("(estimated, describe_table)"),
        "{text}"
    );

    let url = variable("IDEMPOTENCY_TEST_POSTGRES_URL");
    let table = format!("cli_stats_{}", std::process::id());
    let store = PostgresStore::connect(&url, table.as_str(), 2).expect("pool");
    store.create_table().await.expect("table");
    records(store).await;
    support::postgres_execute(&url, &format!("ANALYZE {table}")).await;
    let tool = Tool(vec![
        "--store".into(),
        url,
        "--postgres-table".into(),
        table,
    ]);
    let stats = json(&tool.run(&["stats", "--json"]));
    assert_eq!(
        (&stats["records"], &stats["source"], &stats["in_progress"]),
        (&Value::from(3), &Value::from("pg_class"), &Value::Null),
        "{stats}"
    );

    let url = variable("IDEMPOTENCY_TEST_REDIS_URL");
    let namespace = format!("cli-stats-{}:", std::process::id());
    records(RedisStore::open(&url).expect("url").namespace(&namespace)).await;
    let tool = Tool(vec![
        "--store".into(),
        url,
        "--redis-namespace".into(),
        namespace,
    ]);
    let output = tool.run(&["stats"]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("--redis-owns-database"),
        "{output:?}"
    );
    // The test server is shared: DBSIZE counts these three and the rest.
    let stats = json(&tool.run(&["--redis-owns-database", "stats", "--json"]));
    assert!(stats["records"].as_u64().is_some_and(|n| n >= 3), "{stats}");
    assert_eq!(
        (&stats["accuracy"], &stats["source"]),
        (&Value::from("exact"), &Value::from("dbsize"))
    );
}

/// The completer through the tool, on each store: abandoned claims
/// reported (by default), released a page at a time, closed as failed
/// with the HTTP layer's answer.
#[tokio::test]
async fn an_operator_settles_abandoned_claims_in_dynamodb() {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    let tool = Tool(vec!["--table".into(), table.clone()]);
    abandoned_claims(DynamoDbStore::new(client, table), &tool).await;
}

#[tokio::test]
async fn an_operator_settles_abandoned_claims_in_postgresql() {
    let url = variable("IDEMPOTENCY_TEST_POSTGRES_URL");
    let table = format!("cli_abandoned_{}", std::process::id());
    let store = PostgresStore::connect(&url, table.as_str(), 2).expect("pool");
    store.create_table().await.expect("table");
    let tool = Tool(vec![
        "--store".into(),
        url,
        "--postgres-table".into(),
        table,
    ]);
    abandoned_claims(store, &tool).await;
}

#[tokio::test]
async fn an_operator_settles_abandoned_claims_in_redis() {
    let url = variable("IDEMPOTENCY_TEST_REDIS_URL");
    let namespace = format!("cli-abandoned-{}:", std::process::id());
    let store = RedisStore::open(&url).expect("url").namespace(&namespace);
    let tool = Tool(vec![
        "--store".into(),
        url,
        "--redis-namespace".into(),
        namespace,
    ]);
    abandoned_claims(store, &tool).await;
}

async fn abandoned_claims<St: Store>(store: St, tool: &Tool) {
    let engine = Engine::builder(store).key_prefix(PREFIX).build();
    let now = SystemClock.now_ms();
    // Invocations that died 20 minutes ago, and one a minute ago.
    let claim = |key: &str, lapsed_ms: u64| Claim {
        id: engine.record_id("tenant-1", key),
        owner: OwnerToken::from_stored(format!("dead-{key}")),
        fingerprint: Fingerprint::of_bytes(b"body"),
        now_ms: now - lapsed_ms - 30_000,
        lease_until_ms: now - lapsed_ms,
        expiration_s: now / 1000 + 3600,
        attempt: 1,
        first_started_ms: now - lapsed_ms - 30_000,
    };
    for (key, lapsed_ms) in [
        ("gone-1", 1_200_000),
        ("gone-2", 1_200_000),
        ("gone-3", 1_200_000),
        ("recent", 60_000),
    ] {
        engine
            .store()
            .claim(&claim(key, lapsed_ms))
            .await
            .expect("claimed");
    }
    let counts = |output: &Output| json(output)["counts"].clone();

    // The default: report, older than 15 minutes; nothing written.
    let output = tool.run(&["abandoned", "--page-size", "2", "--json"]);
    assert!(output.status.success(), "{output:?}");
    let report = json(&output);
    assert_eq!(report["policy"], "report");
    assert_eq!(report["found"], 3, "{report}");
    assert_eq!(report["counts"]["reported"], 3, "{report}");
    assert_eq!(report["walked_all"], true, "{report}");
    assert_eq!(report["claims"][0]["state"], "stuck", "{report}");
    let output = tool.run(&["abandoned"]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("3 abandoned claims found (3 reported), policy report"),
        "{text}"
    );

    let output = tool.run(&["abandoned", "--policy", "release", "--limit", "1", "--json"]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(counts(&output)["released"], 1, "{output:?}");
    assert_eq!(json(&output)["walked_all"], false, "stopped at --limit");

    let output = tool.run(&["abandoned", "--policy", "fail", "--json"]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(counts(&output)["failed"], 2, "{output:?}");
    let failed = json(&output)["claims"][0]["id"].clone();
    let key = ["gone-1", "gone-2", "gone-3"]
        .into_iter()
        .find(|key| engine.record_id("tenant-1", key).as_str() == failed)
        .expect("one of ours");
    // What a retry of it gets: the layer's answer, stored.
    let output = tool.run(&["inspect", "--scope", "tenant-1", "--key", key, "--json"]);
    let record = json(&output);
    assert_eq!(record["status"], "COMPLETED", "{record}");
    assert_eq!(record["response"]["http"]["status"], 500, "{record}");
    let body: Value =
        serde_json::from_str(record["response"]["http"]["body"].as_str().expect("a body"))
            .expect("problem+json");
    assert_eq!(
        body["type"], "urn:lambda-idempotency:problem:idempotency-abandoned",
        "{body}"
    );

    let output = tool.run(&["abandoned", "--json"]);
    assert_eq!(json(&output)["found"], 0, "{output:?}");
    let output = tool.run(&["abandoned", "--older-than", "0", "--json"]);
    assert_eq!(json(&output)["found"], 1, "the one lapsed a minute ago");
    let output = tool.run(&["abandoned", "--older-than", "soon"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}
