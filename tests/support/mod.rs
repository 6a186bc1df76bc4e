//! Test support: DynamoDB Local clients and tables, a call counter, and the
//! other test servers' URLs.
#![allow(dead_code)]

pub mod proxy;
pub mod table_size;
pub mod tcp_proxy;

use aws_sdk_dynamodb::{
    config::{
        interceptors::BeforeSerializationInterceptorContextRef, ConfigBag, Credentials, Intercept,
        Region,
    },
    operation::{
        delete_item::DeleteItemInput, get_item::GetItemInput, put_item::PutItemInput,
        transact_write_items::TransactWriteItemsInput, update_item::UpdateItemInput,
    },
    types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
        TimeToLiveSpecification,
    },
    Client,
};
use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

pub const ENDPOINT_VAR: &str = "AWS_ENDPOINT_URL_DYNAMODB";

/// The DynamoDB Local endpoint; fails the test with instructions when unset.
pub fn endpoint() -> String {
    match std::env::var(ENDPOINT_VAR) {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "\n\nThis integration test needs DynamoDB Local and {ENDPOINT_VAR} is not set.\n\
             Run the whole suite with `make test` (it installs, starts and stops DynamoDB Local),\n\
             or wrap any test command in the script that does the same:\n    \
             scripts/with-dynamodb-local cargo test --test <name>\n\n"
        ),
    }
}

/// Counts DynamoDB operations made through a client, by operation name.
#[derive(Debug, Clone, Default)]
pub struct CallCounter {
    total: Arc<AtomicU64>,
    by_operation: Arc<Mutex<BTreeMap<&'static str, u64>>>,
}

impl CallCounter {
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::SeqCst)
    }

    pub fn by_operation(&self) -> BTreeMap<&'static str, u64> {
        self.by_operation
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn reset(&self) {
        self.total.store(0, Ordering::SeqCst);
        self.by_operation
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

impl Intercept for CallCounter {
    fn name(&self) -> &'static str {
        "CallCounter"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _cfg: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let input = context.input();
        let operation = if input.downcast_ref::<PutItemInput>().is_some() {
            "PutItem"
        } else if input.downcast_ref::<UpdateItemInput>().is_some() {
            "UpdateItem"
        } else if input.downcast_ref::<DeleteItemInput>().is_some() {
            "DeleteItem"
        } else if input.downcast_ref::<GetItemInput>().is_some() {
            "GetItem"
        } else if input.downcast_ref::<TransactWriteItemsInput>().is_some() {
            "TransactWriteItems"
        } else {
            "other"
        };
        self.total.fetch_add(1, Ordering::SeqCst);
        *self
            .by_operation
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(operation)
            .or_default() += 1;
        Ok(())
    }
}

fn config_for(endpoint: &str) -> aws_sdk_dynamodb::config::Builder {
    aws_sdk_dynamodb::Config::builder()
        .behavior_version_latest()
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::for_tests())
        .endpoint_url(endpoint)
}

/// `len` pseudo-random bytes: a body no compressor can shrink.
pub fn incompressible(len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(0x2545_f491_4f6c_dd1d);
    std::iter::repeat_with(|| rng.u8(..)).take(len).collect()
}

/// A client for DynamoDB Local.
pub fn client() -> Client {
    Client::from_conf(config_for(&endpoint()).build())
}

/// A client for `endpoint` (a fault proxy, say) that counts its calls, with
/// the SDK's standard retries (3 attempts) and short timeouts.
pub fn client_via(endpoint: &str) -> (Client, CallCounter) {
    let counter = CallCounter::default();
    let config = config_for(endpoint)
        .interceptor(counter.clone())
        .timeout_config(
            aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
                .connect_timeout(Duration::from_millis(500))
                .operation_attempt_timeout(Duration::from_secs(2))
                .operation_timeout(Duration::from_secs(6))
                .build(),
        )
        .build();
    (Client::from_conf(config), counter)
}

/// A client for DynamoDB Local that counts its calls.
pub fn counted_client() -> (Client, CallCounter) {
    let counter = CallCounter::default();
    let client = Client::from_conf(config_for(&endpoint()).interceptor(counter.clone()).build());
    (client, counter)
}

/// A client whose endpoint is a closed port on 127.0.0.1, with short
/// timeouts, so every call fails fast as "unreachable".
pub fn unreachable_client() -> Client {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        listener.local_addr().expect("local addr").port()
    };
    let config = config_for(&format!("http://127.0.0.1:{port}"))
        .timeout_config(
            aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
                .connect_timeout(Duration::from_millis(500))
                .operation_timeout(Duration::from_secs(3))
                .build(),
        )
        .retry_config(aws_sdk_dynamodb::config::retry::RetryConfig::standard().with_max_attempts(2))
        .build();
    Client::from_conf(config)
}

pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// Creates a fresh table with partition key `pk_name` (S) and TTL on `ttl`.
pub async fn create_table_with(
    client: &Client,
    prefix: &str,
    pk_name: &str,
    ttl: Option<&str>,
) -> String {
    let name = unique_name(prefix);
    create_named_table(client, &name, pk_name, ttl).await;
    name
}

/// Creates the table `name` with partition key `pk_name` (S) and TTL on `ttl`.
pub async fn create_named_table(client: &Client, name: &str, pk_name: &str, ttl: Option<&str>) {
    let created = client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(pk_name)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .expect("attribute definition"),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(pk_name)
                .key_type(KeyType::Hash)
                .build()
                .expect("key schema"),
        )
        .send()
        .await;
    // A loaded machine can lose the answer to a create the SDK then retries:
    // the retry finds the table its first attempt made (the name is unique to
    // this run, so the table is ours).
    if let Err(e) = created {
        let exists = e
            .as_service_error()
            .is_some_and(|e| e.is_resource_in_use_exception());
        assert!(exists, "create table {name}: {e:?}");
    }
    if let Some(ttl) = ttl {
        client
            .update_time_to_live()
            .table_name(name)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .attribute_name(ttl)
                    .enabled(true)
                    .build()
                    .expect("ttl spec"),
            )
            .send()
            .await
            .expect("enable TTL");
    }
}

/// A fresh idempotency table laid out as the crate's defaults expect.
pub async fn create_idempotency_table(client: &Client) -> String {
    create_table_with(client, "idempotency", "id", Some("expiration")).await
}

/// A test-size knob from the environment (`STRESS_KEYS=2000`), or `default`.
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Log output captured from a `tracing_subscriber` writer.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A test server's setting from the environment (`make test` sets them:
/// scripts/with-postgres, scripts/with-redis); fails the test with
/// instructions when unset.
pub fn variable(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: run with `make test` (scripts/with-postgres, scripts/with-redis)"
        )
    })
}

/// Runs `sql` (statements without parameters) on the PostgreSQL server at
/// `url`.
pub async fn postgres_execute(url: &str, sql: &str) {
    use lambda_idempotency::store::postgres::tokio_postgres;
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client.batch_execute(sql).await.expect(sql);
}

/// How many rows `table` holds, over a PostgreSQL connection of the test's
/// own.
pub async fn postgres_rows(url: &str, table: &str) -> i64 {
    use lambda_idempotency::store::postgres::tokio_postgres;
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .expect("count")
        .get(0)
}
