//! Idempotent AWS Lambda handlers, with their records in DynamoDB,
//! PostgreSQL, MySQL, Redis or memory.
//!
//! Clients, gateways, queues and SDKs retry. With an idempotency key, this
//! crate makes an operation run **at most once per key**, replays its
//! original outcome to every retry, rejects a key reused with a different
//! payload, keeps concurrent duplicates from both running, and recovers when
//! an invocation crashes mid-flight.
//!
//! - **Stores**: [`DynamoDbStore`] (conditional writes), PostgreSQL
//!   ([`store::postgres`]), MySQL, Aurora MySQL and MariaDB on sqlx
//!   ([`store::sqlx`]), Redis and Valkey ([`store::redis`]: one Lua
//!   script a step), and [`MemoryStore`] (tests, one process). The SQL
//!   stores and the memory store offer the transactional capability
//!   ([`store::transaction`]): the handler runs inside the transaction that
//!   claims its key and commits with its record.
//! - **Adapters**: [`http`] (a tower layer for `lambda_http`, axum, hyper
//!   and tonic; actix-web middleware), [`consumers`] (SQS, Kinesis,
//!   DynamoDB Streams, Kafka, Amazon MQ, SNS, EventBridge, any
//!   `lambda_runtime` handler), and [`split`], on which
//!   [`lambda-idempotency-durable`](https://docs.rs/lambda-idempotency-durable)
//!   builds Lambda durable functions.
//! - **Where a request goes**: an adapter turns it into an [`Attempt`]; the
//!   [`Engine`] claims its key, runs it under a lease, and completes or
//!   releases the record; the store makes each of those writes atomically
//!   ([`Store`](store::Store)). Folder by folder, with the decisions each
//!   holds: the
//!   [code map](https://github.com/lambda-idempotency/lambda-idempotency/blob/main/CONTRIBUTING.md#code-map).
//!
//! # How it works
//!
//! One record per scoped key, in the store; on DynamoDB:
//!
//! 1. **claim**: a conditional `PutItem` writes an `IN_PROGRESS` record with
//!    a lease and a fresh owner token, unless a live record holds the key. If
//!    one does, DynamoDB hands it back with the conditional failure
//!    (`ReturnValuesOnConditionCheckFailure=ALL_OLD`), so a duplicate costs
//!    one call: a different payload is a [`Error::KeyReused`], a
//!    completed record is replayed, a record in progress is
//!    [`Error::InProgress`] with the time left on its lease.
//! 2. **run** the operation.
//! 3. **complete**: a conditional `UpdateItem` stores the outcome, *fenced* on
//!    the owner token; or, if the operation failed, **release**: a
//!    conditional `DeleteItem` with the same fence, so a retry can run (a
//!    takeover's claim is kept with its lease ended instead, so that the
//!    retry is told it takes over too).
//!
//! A claim is a lease: an invocation that crashes or times out does not
//! poison its key; once the lease passes a retry takes the key over. The
//! fence means an invocation whose lease passed (a zombie) can neither
//! overwrite nor delete its successor's record.
//!
//! # Guarantees
//!
//! For one key inside one scope:
//!
//! - the operation runs at most once while a claim is live; concurrent
//!   duplicates never both run;
//! - once it has completed, every retry within the retention (24 h by
//!   default) gets the original outcome, marked as a replay, and runs nothing;
//! - a retry with a different payload is rejected, never served the other
//!   request's outcome;
//! - a crashed or timed-out invocation's claim expires with its lease;
//! - a zombie cannot overwrite or delete its successor's record;
//! - when the store cannot be reached the operation does not run (fail
//!   closed), unless [`EngineBuilder::fail_open`] says otherwise.
//!
//! **Not guaranteed:** a side effect *outside* the store that happened
//! before a crash, and before completion, is repeated by a retry once the
//! lease passes; the retry is told so ([`ClaimHandle::takeover`]) and can
//! reconcile first. [`Engine::execute_transactional`] closes that gap for
//! effects written to the store (DynamoDB, PostgreSQL, MySQL): they commit
//! in one transaction with the completion.
//!
//! # Example
//!
//! The engine over the in-memory store (use [`DynamoDbStore`] in a Lambda):
//!
//! ```
//! use lambda_idempotency::{Attempt, Engine, Error, Fingerprint, MemoryStore, OutcomeKind};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, PartialEq, Serialize, Deserialize)]
//! struct Charge { id: String, amount: u64 }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::builder(MemoryStore::new()).build();
//!
//! let body = serde_json::json!({ "amount": 1250, "currency": "eur" });
//! let attempt = Attempt::new("tenant-42 POST /v1/charges", "8e03978e-40d5", Fingerprint::of_json(&body)?);
//!
//! let first = engine
//!     .execute(&attempt, || async { Ok::<_, std::io::Error>(Charge { id: "ch_1".into(), amount: 1250 }) })
//!     .await?;
//! assert_eq!(first.kind(), OutcomeKind::Fresh);
//!
//! // The client retries: nothing runs, the original charge comes back.
//! let retry = engine
//!     .execute(&attempt, || async { Ok::<_, std::io::Error>(Charge { id: "ch_2".into(), amount: 1250 }) })
//!     .await?;
//! assert!(retry.is_replay());
//! assert_eq!(retry.value().id, "ch_1");
//!
//! // The same key with another payload is rejected.
//! let other = Attempt::new("tenant-42 POST /v1/charges", "8e03978e-40d5", Fingerprint::of_json(&serde_json::json!({ "amount": 1 }))?);
//! let result = engine.execute(&other, || async { Ok::<_, std::io::Error>(Charge { id: "ch_3".into(), amount: 1 }) }).await;
//! assert!(matches!(result, Err(Error::KeyReused)));
//! # Ok(())
//! # }
//! ```
//!
//! In a Lambda function, build the client, the store and the engine once, in
//! `main`, and take the lease from the invocation's deadline:
//!
//! ```no_run
//! # #[cfg(feature = "dynamodb")]
//! # async fn example(deadline_ms: u64) -> Result<(), Box<dyn std::error::Error>> {
//! use lambda_idempotency::{Attempt, DynamoDbStore, Engine, Fingerprint};
//! use std::time::Duration;
//!
//! let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
//! let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&config), "idempotency");
//! let engine = Engine::builder(store)
//!     .retention(Duration::from_secs(24 * 3600))
//!     .key_prefix("charges")
//!     .cache(256)
//!     .build();
//!
//! // Per request: the scope from trusted context (the authorizer), never a header.
//! let attempt = Attempt::new("user-123", "order-77", Fingerprint::of_bytes(b"request body"))
//!     .deadline_ms(deadline_ms); // lambda_runtime::Context::deadline
//! let outcome = engine
//!     .execute(&attempt, || async { Ok::<_, std::io::Error>("receipt".to_string()) })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # The DynamoDB table
//!
//! A partition key `id` of type `S`, TTL enabled on `expiration`, on-demand
//! capacity. The names are configurable with [`AttributeNames`]. The raw key
//! is never stored: the record id is a sha256 of the scope and the key.
//! DynamoDB's TTL deletes lazily (often days later), so every read and every
//! condition compares `expiration` itself.
//!
//! # Costs
//!
//! On DynamoDB, a first call makes two calls (claim, complete), a replay one
//! (the failed claim returns the record), a replay from the optional local
//! cache ([`EngineBuilder::cache`]) none. An operation whose only effects
//! are its DynamoDB writes can skip the claim:
//! [`Engine::run_single_write`] commits the record and the writes in one
//! `TransactWriteItems`, so a first call makes one.
//!
//! # Long operations, crashed attempts, operators
//!
//! [`Engine::run`] hands the operation a [`ClaimHandle`]: it says whether
//! this attempt took over a crashed one's claim ([`Takeover`]: reconcile an
//! external effect before acting again), extends the lease
//! ([`ClaimHandle::extend`], or [`EngineBuilder::heartbeat`] for all), and
//! signals a lost claim ([`ClaimHandle::lost`]). [`Engine::inspect`] and
//! [`Engine::forget`] are for operators.
//!
//! # Where things are
//!
//! - The crate root: what an application uses. [`Engine`] (built with
//!   [`Engine::builder`]), [`Attempt`], [`Outcome`], [`Error`],
//!   [`Fingerprint`], [`derive_key`], and the two stores an application
//!   picks, [`DynamoDbStore`] and [`MemoryStore`] (the PostgreSQL, MySQL
//!   and Redis stores are in `store::postgres`, `store::sqlx::postgres`,
//!   `store::sqlx::mysql` and `store::redis`, behind their features).
//! - [`http`]: the tower layer for HTTP services: `lambda_http` (API
//!   Gateway REST and HTTP APIs, ALB, Function URLs), axum and hyper, in
//!   Lambda or on a server.
//! - [`consumers`]: event consumers: batches of every at-least-once
//!   source (SQS, Kinesis, DynamoDB Streams, Kafka, Amazon MQ, SNS,
//!   EventBridge) with each source's order and retry semantics, and
//!   `lambda_runtime` handlers of any event.
//! - [`store`]: the store SPI, for those who write a store: the [`Store`](store::Store)
//!   trait and the records it keeps, and the DynamoDB and memory stores'
//!   own types ([`AttributeNames`],
//!   [`MemoryWrite`](store::memory::MemoryWrite)).
//! - [`split`]: the protocol split across invocations (claimed in one,
//!   completed in another, by an owner token the caller keeps), which
//!   AWS Lambda durable functions are built on: see the
//!   [`lambda-idempotency-durable`](https://docs.rs/lambda-idempotency-durable)
//!   crate (preview), whose replays pass their own claim, and whose steps'
//!   effects run once.
//! - `testing` (feature `testing`): the conformance kit that proves a store
//!   keeps every guarantee, with one macro call, and the test doubles.
//!
//! Another adapter (for another framework or event source) calls
//! [`Engine::run`], the single entry point the crate's own adapters use,
//! with a [`Mode`].
//!
//! # Features
//!
//! | feature | default | what it adds |
//! | --- | --- | --- |
//! | `dynamodb` | yes | [`DynamoDbStore`] and `store::dynamodb`, on `aws-sdk-dynamodb` and `serde_dynamo`. The library turns off the SDK's default features; your own `aws-sdk-dynamodb` dependency brings the HTTPS client. |
//! | `http` | yes | [`http`]: the tower layer for HTTP services on any `http_body::Body`: axum, hyper, `lambda_http`. Needs none of Lambda's crates. |
//! | `lambda` | yes | The HTTP layer in Lambda, on `lambda_http`: the caller, the API and the route from the request context, the lease until the invocation's deadline (kept by the heartbeat while the handler runs under Lambda Managed Instances), the event's path and query, `lambda_http` bodies kept text or binary. An axum server outside Lambda turns the default features off and leaves it out. |
//! | `axum` | no | In the HTTP layer, axum's route template (`MatchedPath`) in the scope and the path before `Router::nest` stripped it (`OriginalUri`) in the fingerprint, and axum bodies streamed on. Turn it on in an axum application. |
//! | `consumers` | yes | [`consumers`]: `IdempotentEventLayer`, and `Batch` for SQS, Kinesis, DynamoDB Streams, Kafka, Amazon MQ, SNS and EventBridge, on `lambda_runtime` and `aws_lambda_events`. |
//! | `postgres` | no | `store::postgres::PostgresStore`, on tokio-postgres and deadpool-postgres: works through RDS Proxy and PgBouncer (transaction mode); the handler's SQL writes commit with the completion. |
//! | `sqlx-postgres` | no | `store::sqlx::postgres::SqlxPostgresStore`, the same store on the application's own sqlx `PgPool` (the same table and statements). |
//! | `sqlx-mysql` | no | `store::sqlx::mysql::SqlxMySqlStore`, over your own `sqlx::MySqlPool`: MySQL 8, Aurora MySQL and MariaDB, the handler inside the transaction too. No TLS here: your sqlx dependency picks it. |
//! | `redis` | no | `store::redis::RedisStore` (Redis 7, Valkey), on the redis crate: one Lua script per step, fenced like the others; no transactional writes. |
//! | `redis-tls` | no | `redis`, and TLS to Redis (`rediss://`: ElastiCache and MemoryDB with in-transit encryption) with rustls on aws-lc-rs. Without it, `redis` compiles no C code and refuses `rediss://` URLs with a [`Misconfigured`](StoreErrorKind::Misconfigured) error that names this feature. |
//! | `testing` | no | `testing`: the store conformance kit, `ManualClock`, `CountingStore`, `LostAnswers`, and the memory store's fault hooks. For dev-dependencies. |
//! | `powertools` | no | [`powertools`]: during a migration from Powertools for AWS Lambda, honour the idempotency records it wrote (DynamoDB, Redis). |
//! | `encryption` | no | `encryption`: stored responses sealed with AES-256-GCM (aws-lc-rs, the AWS SDK's TLS library) and bound to their record, on every store, through `EngineBuilder::encryption`. |
//! | `fuzzing` | no | Internals for the fuzz targets under `fuzz/`; not a public API. |
// Links to what a feature adds, for docs built without it: to docs.rs,
// which builds every feature.
#![cfg_attr(
    not(feature = "dynamodb"),
    doc = "",
    doc = "[`DynamoDbStore`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/struct.DynamoDbStore.html"
)]
#![cfg_attr(
    feature = "dynamodb",
    doc = "",
    doc = "[`AttributeNames`]: store::dynamodb::AttributeNames"
)]
#![cfg_attr(
    not(feature = "dynamodb"),
    doc = "",
    doc = "[`AttributeNames`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/store/dynamodb/struct.AttributeNames.html"
)]
#![cfg_attr(
    not(feature = "http"),
    doc = "",
    doc = "[`http`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/http/index.html"
)]
#![cfg_attr(
    not(feature = "consumers"),
    doc = "",
    doc = "[`consumers`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/consumers/index.html"
)]
#![cfg_attr(
    not(feature = "postgres"),
    doc = "",
    doc = "[`store::postgres`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/store/postgres/index.html"
)]
#![cfg_attr(
    not(feature = "sqlx-mysql"),
    doc = "",
    doc = "[`store::sqlx`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/store/sqlx/index.html"
)]
#![cfg_attr(
    not(feature = "redis"),
    doc = "",
    doc = "[`store::redis`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/store/redis/index.html"
)]
#![cfg_attr(
    not(feature = "powertools"),
    doc = "",
    doc = "[`powertools`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/powertools/index.html"
)]
#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![warn(rust_2018_idioms, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod child_key;
mod clock;
#[cfg(feature = "consumers")]
#[cfg_attr(docsrs, doc(cfg(feature = "consumers")))]
pub mod consumers;
#[cfg(any(feature = "dynamodb", feature = "http", feature = "encryption"))]
mod deflate;
#[cfg(feature = "encryption")]
#[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
pub mod encryption;
mod engine;
mod error;
mod fingerprint;
#[cfg(feature = "http")]
pub mod http;
mod lower_hex;
mod metrics;
pub mod observe;
#[cfg(feature = "powertools")]
#[cfg_attr(docsrs, doc(cfg(feature = "powertools")))]
pub mod powertools;
mod record_id;
pub mod redaction;
pub mod split;
pub mod store;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

pub use child_key::derive_key;
pub use clock::{Clock, SystemClock};
pub use engine::{
    default_key_prefix, managed_instances_concurrency, AbandonedPolicy, Attempt, BuildError,
    ClaimHandle, Codec, Completer, CompleterReport, Engine, EngineBuilder, Forgotten, Json, Mode,
    Outcome, OutcomeKind, Replayed, Settled, Settlement, Takeover, DEFAULT_KEY_PREFIX,
    DEFAULT_LEASE, DEFAULT_MAX_LEASE, DEFAULT_RETENTION, DISABLED_IN_LAMBDA_VARIABLE,
    DISABLED_VARIABLE, MAX_CONCURRENCY_VARIABLE, MAX_DURATION,
};
pub use error::{Error, ErrorKind, Result, StoreError, StoreErrorKind, WriteRefusal};
pub use fingerprint::{Fingerprint, InvalidJsonPointer, JsonPointer};
pub use metrics::EmfMetrics;
pub use redaction::{JsonRedaction, Redact, RedactedJson};
#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub use store::dynamodb::DynamoDbStore;
pub use store::memory::MemoryStore;

/// Internals the fuzz targets under `fuzz/` drive; not a public API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    /// A JSON value in the canonical form fingerprints hash.
    pub fn canonical_json(value: &serde_json::Value) -> Vec<u8> {
        crate::fingerprint::canonical_json(value)
    }

    /// The canonical form of a JSON document, from its text, or `None` when
    /// it has none (not JSON, a duplicate key, too deep).
    pub fn canonical(json: &[u8]) -> Option<Vec<u8>> {
        crate::fingerprint::canonical(json).ok()
    }

    /// Decodes a stored DynamoDB item as the DynamoDB store does.
    pub fn decode_record(
        item: std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>,
    ) -> Result<crate::store::Record, crate::StoreError> {
        crate::store::dynamodb::decode_item(item)
    }

    /// Decodes a stored HTTP response as the HTTP layer does (one too large
    /// to store: its status and headers, no body).
    pub fn decode_stored_response(
        bytes: &[u8],
    ) -> Result<::http::Response<crate::http::StoredBody>, Box<dyn std::error::Error + Send + Sync>>
    {
        crate::http::decode_stored_response(bytes)
    }

    /// Encodes a response as the HTTP layer stores it.
    pub fn encode_stored_response(
        response: ::http::Response<crate::http::StoredBody>,
    ) -> Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>> {
        crate::http::encode_stored_for_fuzzing(response)
    }

    pub use crate::Codec;
}

// The README's examples are compiled with the doc tests.
#[cfg(all(doctest, feature = "dynamodb"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
