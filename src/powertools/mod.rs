//! Powertools compatibility: honour the idempotency records that Powertools
//! for AWS Lambda wrote, during a migration from it to this crate.
//!
//! A client that sent a request to the old (Powertools) function and
//! retries after the alias moved reaches the new function, which has never
//! seen the key: without this mode it runs the request a second time. In
//! compatibility mode the HTTP layer ([`IdempotencyLayer::powertools`]) and
//! the batches ([`Batch::powertools`]) first read the record Powertools
//! would have written for the same request, and:
//!
//! | Powertools record | answer |
//! |---|---|
//! | `COMPLETED`, `expiration` not passed | its stored response, replayed (HTTP: the proxy response dict as the response, status, headers and body as stored, with the `idempotent-replayed` header; a batch record: done, not run) |
//! | `INPROGRESS`, `in_progress_expiration` not passed; or without one, written less than [`function_timeout`](PowertoolsCompat::function_timeout) ago (15 minutes by default; see [below](#a-record-in-progress-without-in_progress_expiration)) | in progress: 409 with `Retry-After`; a failed record in a batch |
//! | either, with `validation` differing from this request's payload hash, or absent (payload validation on) | the key was reused: 422; a failed record (Powertools raises `IdempotencyValidationError` too), or one given up with `Unprocessable::Final` |
//! | `INPROGRESS` past that, `expiration` not passed: abandoned ([`PowertoolsFound::Abandoned`]) | this crate's own protocol runs, as a takeover: the handler is told ([`Takeover`] in the request's extensions, [`ClaimHandle::takeover`](crate::ClaimHandle::takeover) in a batch); `validation` is not compared (Powertools overwrites such a record unread) |
//! | expired, absent, or no key in the request | this crate's own protocol runs |
//!
//! The mode only reads: it never writes, changes or deletes a Powertools
//! record. The request then runs under this crate's own record, so its
//! recovery points ([`ClaimHandle::step`](crate::ClaimHandle::step)) are
//! recorded there, as without the mode, and a takeover of an abandoned
//! Powertools attempt resumes after them like any other; the Powertools
//! record stays as Powertools wrote it.
//!
//! # Configuration
//!
//! Tell it what Powertools was configured with:
//!
//! - the record id's prefix: the function name and the handler's
//!   `module.qualname` ([`PowertoolsCompat::new`]: `@idempotent` on
//!   `app.lambda_handler` in function `orders` makes `orders.app.lambda_handler`),
//!   or Powertools' `key_prefix` ([`PowertoolsCompat::with_key_prefix`]);
//! - `event_key_jmespath` ([`event_key_jmespath`](PowertoolsCompat::event_key_jmespath)),
//!   for the common forms: a field path (`messageId`,
//!   `headers."Idempotency-Key"`), a list of paths (`[user, order_id]`),
//!   either after `powertools_json(path)` (`powertools_json(body).order_id`),
//!   and the empty expression (the whole event); a closure
//!   ([`event_key`](PowertoolsCompat::event_key)) for anything else;
//! - `payload_validation_jmespath`, if it was on (and only then: a record
//!   without a `validation` hash is refused as a reused key, as Powertools
//!   refuses it; its Redis layer drops the hash when it completes a record,
//!   so with validation on Powertools answers every retry of a completed
//!   Redis record with `IdempotencyValidationError`, and so does this mode);
//! - `hash_function` ([`HashFunction`], md5 by default);
//! - `expires_after_seconds` ([`expires_after`](PowertoolsCompat::expires_after),
//!   one hour by default), which dates a record, and the old function's
//!   timeout ([`function_timeout`](PowertoolsCompat::function_timeout), 15
//!   minutes by default), for records in progress without
//!   `in_progress_expiration`;
//! - the table, key and attribute names ([`PowertoolsLayout`]), defaulting
//!   to Powertools' own (`id`, `expiration` in seconds,
//!   `in_progress_expiration` in milliseconds, `status`, `data`,
//!   `validation`).
//!
//! The record id is `{prefix}#{hash}`, where `hash` is the hex digest of
//! `json.dumps(selected, sort_keys=True)` (Python's separators, keys in
//! code point order, `ensure_ascii`, floats as Python's `repr`), as
//! Powertools' `BasePersistenceLayer._generate_hash` computes it; a selection
//! that Powertools counts as missing (null, `""`, an empty list or object, a
//! list or object of nulls) had no record and is not looked up. A payload
//! `powertools_json` decodes is read as Python's `json.loads` reads it, not
//! as serde_json would: `-0` is the integer `0`, an integer keeps all its
//! digits (a 30-digit id too), `NaN` and `Infinity` are floats, a lone
//! surrogate escape (`"\ud800"`) stays in the string, and arrays and
//! objects nest as deep as Python reads them (below 1,000 levels;
//! serde_json stops at 128).
//!
//! # What it sees of a request
//!
//! - HTTP: the request's `headers` (matched in any case: `lambda_http`
//!   lowercases names, API Gateway REST keeps the client's) and its `body`
//!   as the event carried it: the text, or for a body API Gateway delivered
//!   base64-encoded (`isBase64Encoded`), that base64 text, which Powertools
//!   hashed with `event_key_jmespath="body"` (and which `powertools_json`
//!   cannot read, in Powertools either); and its `queryStringParameters`
//!   as API Gateway wrote them: a REST API keeps the last value of a
//!   repeated name, an HTTP API (and a Function URL) joins the values
//!   with commas, in order; `null` without any. The values are
//!   `lambda_http`'s: a REST API's as API Gateway decoded them, an HTTP
//!   API's from `rawQueryString` decoded as a form (`+` as a space; that
//!   API Gateway decodes it the same way was not checked), an ALB's
//!   percent-decoded (ALB delivers them as the client encoded them, so an
//!   ALB key with an escape in it is not found). A closure sees the same
//!   view: `{"headers": {...}, "queryStringParameters": ..., "body": ...}`.
//! - HTTP, the expressions: the layer refuses, when it is built
//!   ([`IdempotencyLayer::try_powertools`] returns an
//!   [`UnsupportedExpression`] that says why; [`IdempotencyLayer::powertools`]
//!   panics with it), a key or validation expression that reads anything
//!   else: the whole event (not available after `lambda_http` parsed it,
//!   and it holds API Gateway's request id and time, so Powertools keyed
//!   on it never matched a client's retry), `requestContext.*` (the same
//!   per-delivery data: `requestContext.requestId` is a new id for every
//!   retry), the whole `headers` map (headers set anew on every request),
//!   and any other field (`pathParameters`, `multiValueHeaders`, ...).
//!   Otherwise each retry would find no record and run again, silently.
//!   `headers.<name>`, `queryStringParameters.<name>` (or the whole map)
//!   and `body` are read, in paths, lists of paths and after
//!   `powertools_json(...)`.
//! - HTTP, a request without this crate's key: read too. Powertools may
//!   have keyed on the body (`powertools_json(body).order_id`), so a retry
//!   of a request the old function ran carries no `Idempotency-Key`; its
//!   record is answered before [`require_key`] refuses the request or lets
//!   it pass through.
//! - Batches: the record serialised by `aws_lambda_events` (`messageId`,
//!   `body`, `attributes`...). A path to a string field is exact; the whole
//!   record is not (the crate's types write fields Lambda left out), and
//!   neither is a field that holds an object those types fill in: for a
//!   DynamoDB Streams `INSERT` they write `"OldImage": {}` inside
//!   `dynamodb`, where Lambda sent no `OldImage`, and an absent `Keys` or
//!   ActiveMQ `properties` is `{}` too, so a key on such a field finds no
//!   record (checked against the real Powertools by the outside review).
//!   Key batches on a string field, as Powertools' own examples do
//!   (`messageId`, `eventID`). A number in the record itself (not inside a
//!   `powertools_json` body) is read as serde_json read the event: an
//!   integer past 64 bits loses digits and `-0` is `-0.0`, where Python's
//!   `json.loads` kept them, so Powertools Python's record of such a key is
//!   not found either.
//!
//! # A record in progress without `in_progress_expiration`
//!
//! Powertools writes its in-progress expiry (`in_progress_expiration`) from
//! the Lambda context's remaining time, and leaves it out when no context
//! was registered: in Python 3.37, `BasePersistenceLayer.save_inprogress`
//! when `remaining_time_in_millis` is `None`, which is
//! `idempotent_function` without `config.register_lambda_context(context)`
//! (`@idempotent` registers the handler's context itself); in TypeScript
//! 2.35, `BasePersistenceLayer.saveInProgress` when the remaining time is
//! missing or `0`, which is `makeIdempotent` on a function not called with
//! a Lambda context as its second argument, without
//! `config.registerLambdaContext(context)`. Powertools then warns ("Did you
//! call register_lambda_context on IdempotencyConfig?").
//!
//! Its own retries treat such a record differently per store: the DynamoDB
//! layers (both ports) overwrite an `INPROGRESS` record only with
//! `attribute_exists(in_progress_expiration)`, so they refuse every retry
//! until `expiration` (an hour by default); Python's Redis layer does the
//! same on purpose ("Fail closed until the record TTL expires"); the
//! TypeScript `CachePersistenceLayer` takes it for an orphan and runs the
//! retry at once, beside an invocation that may still be live.
//!
//! This mode does neither, on every store and for both ports: such a
//! record is held (409, a failed batch record) for as long as the old
//! function's invocation could still run, counted from when Powertools
//! wrote it (its `expiration` less `expires_after_seconds`, plus the second
//! Powertools truncated), that is until
//! [`function_timeout`](PowertoolsCompat::function_timeout) (Lambda's 15
//! minutes unless set) has passed since, and never past its `expiration`.
//! Then it is abandoned: the request runs under this crate's protocol, and
//! its handler is told it takes over, since the old attempt may have acted
//! before it died. Set [`expires_after`](PowertoolsCompat::expires_after)
//! to Powertools' `expires_after_seconds`: a longer one here dates the
//! record too early, and a retry could run beside a live invocation. A
//! record with neither expiry cannot be dated and is reported as
//! unreadable (500; a failed batch record).
//!
//! # What a replay looks like
//!
//! A completed record's response is what API Gateway served for it: a
//! proxy response dict (`statusCode`, `headers`, `multiValueHeaders`,
//! `cookies`, `body`, base64 when `isBase64Encoded`) becomes that response.
//! A handler behind an HTTP API (payload format 2.0) or a Function URL may
//! return any other JSON, such as a plain dict, a string or null: API
//! Gateway served it as a 200 `application/json` response whose body is
//! "the function's response", a string as its text (AWS's documented
//! example: `"Hello from Lambda!"` is served as the body
//! `Hello from Lambda!`), anything else as its JSON (null as `null`, which
//! the documentation shows no example of), and so does the replay. Behind a
//! REST API or ALB, which answered such a response with an error, the
//! record is reported as unreadable (500).
//!
//! # Which Powertools
//!
//! - **Python** ([`PowertoolsCompat::new`], [`with_key_prefix`](PowertoolsCompat::with_key_prefix)):
//!   checked against Powertools for AWS Lambda (Python) 3.37, by tests in
//!   which Powertools itself writes the records (DynamoDB and Redis),
//!   unusual payloads included.
//! - **TypeScript** ([`PowertoolsCompat::typescript`]):
//!   `@aws-lambda-powertools/idempotency` 2.35 (`makeIdempotent`, the
//!   decorator, the Middy middleware), checked the same way (DynamoDB, and
//!   Redis through its `CachePersistenceLayer`). Its ids are
//!   `{prefix}#{hash}` with the prefix the function's name (or `keyPrefix`,
//!   trimmed as JavaScript's `trim()` trims) and the hash the base64 digest
//!   of `JSON.stringify(deepSort(selected))`: compact, keys sorted by
//!   `toLowerCase()` (full Unicode, final sigma included; keys equal once
//!   lowercased keep their order) but integer-like keys first (JavaScript's
//!   object order), `__proto__` members left out (`deepSort` copies members
//!   by assignment, which sets the copy's prototype instead), numbers as
//!   JavaScript writes doubles (a 30-digit integer is rounded, `-0` is
//!   `0`), non-ASCII characters as they are. A payload `powertools_json`
//!   decodes is read as `JSON.parse` reads it, nested up to 9,999 levels
//!   (`JSON.parse` has no limit; Powertools' `deepSort` and
//!   `JSON.stringify` recurse, and under Node 20's default stack it hashed
//!   objects 1,200 levels deep in the tests and raised `RangeError` from
//!   somewhere between about 1,500 and 3,400 levels, by shape and by what
//!   V8 had compiled: deeper than 9,999 had no record). It stores the
//!   response as the value itself (a DynamoDB map, or a JSON object in
//!   Redis, for a proxy response; a string as that string), rather than
//!   JSON text; the mode reads either. It writes a
//!   record for every selection but `null` (`throwOnNoIdempotencyKey` off,
//!   its default), where Python skips empty ones. Its layout is Python's
//!   (`id`, `expiration` in seconds, `in_progress_expiration` in
//!   milliseconds, `status`, `data`, `validation`).
//! - Java and .NET hash their own JSON serialisations; their sources were
//!   not checked here, and their records are not found.
//!
//! # Costs and limits
//!
//! - One extra strongly consistent read (DynamoDB `GetItem`, Redis `GET`)
//!   per request this crate has not answered from its local cache; none on
//!   a cached replay. Measured in BENCHMARKS.md.
//! - Switch it off once the old function's retention has passed since its
//!   last request (Powertools' `expires_after_seconds`, one hour by
//!   default): no record of it can be live after that.
//! - It cannot cover a request still running in the old function when the
//!   new one sees its retry: the old function may not have written its
//!   `INPROGRESS` record yet, or the retry may come before it; both may
//!   run. Drain the old alias first (move traffic, then wait for the old
//!   function's longest timeout) to narrow that window to nothing.
//! - A Powertools response replayed by the HTTP layer is not stored again
//!   in this crate's table: each retry reads the Powertools record again,
//!   until it expires.
//! - Where it still differs from Powertools (checked against Powertools
//!   3.37 on CPython 3.11, which writes the records of the tests):
//!   - Nesting: CPython refuses a payload nested about 1,000 levels deep
//!     (its recursion limit; in the tests' CPython 3.11 `json.loads` reads
//!     990 levels and refuses 1,000, and other versions differ); this mode
//!     reads up to 999 for Python, 9,999 for TypeScript (above). A payload
//!     Powertools refused is looked up here and has no record (Powertools
//!     raised): the crate's protocol runs, as it should.
//!   - TypeScript: a key path through a name that an object inherits in
//!     JavaScript (`powertools_json(body).__proto__`, `.constructor`)
//!     selects what JavaScript reads there (`{}`, or a function Powertools
//!     cannot hash); here it selects null. A handler that returned
//!     `undefined` has no stored response, and its record is reported as
//!     unreadable (500).
//!   - A replayed plain HTTP API response has the JSON Powertools stored
//!     (`json.dumps` with sorted keys and `ensure_ascii`), as Powertools'
//!     own replay has; the first response had the Lambda runtime's
//!     serialisation of the same value. Same JSON, not the same bytes.
//!   - The HTTP view has no whole event and a batch record's serialisation
//!     is `aws_lambda_events`' (above): key on fields.
//!   - A record in progress without `in_progress_expiration` is held for
//!     the function's timeout rather than until it expires (Python, and
//!     TypeScript on DynamoDB) or not at all (TypeScript on Redis), above.
//!
//!
//! [`Takeover`]: crate::Takeover
#![cfg_attr(
    feature = "http",
    doc = "",
    doc = "[`require_key`]: crate::http::IdempotencyLayer::require_key"
)]
#![cfg_attr(
    not(feature = "http"),
    doc = "",
    doc = "[`require_key`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/http/struct.IdempotencyLayer.html#method.require_key"
)]
#![cfg_attr(
    feature = "http",
    doc = "",
    doc = "[`IdempotencyLayer::powertools`]: crate::http::IdempotencyLayer::powertools"
)]
#![cfg_attr(
    not(feature = "http"),
    doc = "",
    doc = "[`IdempotencyLayer::powertools`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/http/struct.IdempotencyLayer.html#method.powertools"
)]
#![cfg_attr(
    feature = "http",
    doc = "",
    doc = "[`IdempotencyLayer::try_powertools`]: crate::http::IdempotencyLayer::try_powertools"
)]
#![cfg_attr(
    not(feature = "http"),
    doc = "",
    doc = "[`IdempotencyLayer::try_powertools`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/http/struct.IdempotencyLayer.html#method.try_powertools"
)]
#![cfg_attr(
    feature = "consumers",
    doc = "",
    doc = "[`Batch::powertools`]: crate::consumers::Batch::powertools"
)]
#![cfg_attr(
    not(feature = "consumers"),
    doc = "",
    doc = "[`Batch::powertools`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/consumers/struct.Batch.html#method.powertools"
)]

mod expr;
mod json;

pub use expr::UnsupportedExpression;

use crate::{Clock, Error, StoreError, StoreErrorKind, SystemClock, Takeover};
use expr::Expression;
use futures_util::future::BoxFuture;
use json::{Dialect, Json};
use serde_json::Value;
use std::{fmt, sync::Arc, time::Duration};

/// The hash function Powertools was configured with (`hash_function`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HashFunction {
    /// `md5`, Powertools' default.
    #[default]
    Md5,
    /// `sha256`.
    Sha256,
}

impl HashFunction {
    fn digest(self, bytes: &[u8]) -> Vec<u8> {
        match self {
            HashFunction::Md5 => {
                use md5::Digest;
                md5::Md5::digest(bytes).to_vec()
            }
            HashFunction::Sha256 => {
                use sha2::Digest;
                sha2::Sha256::digest(bytes).to_vec()
            }
        }
    }
}

/// Which port of Powertools wrote the records: each hashes its own JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Port {
    /// Python: the hex digest of `json.dumps(selected, sort_keys=True)`.
    Python,
    /// TypeScript: the base64 digest of `JSON.stringify(deepSort(selected))`.
    TypeScript,
}

impl Port {
    fn dialect(self) -> Dialect {
        match self {
            Port::Python => Dialect::Python,
            Port::TypeScript => Dialect::JavaScript,
        }
    }

    /// Whether Powertools wrote a record for this selection. Python skips
    /// idempotency for what `is_missing_idempotency_key` calls missing (null,
    /// `""`, empty or all-null lists and objects); TypeScript only for null
    /// (with `throwOnNoIdempotencyKey` off, its default: otherwise it raised
    /// for more, and a lookup here finds nothing).
    fn has_record(self, selected: &Json) -> bool {
        match self {
            Port::Python => !python_missing(selected),
            Port::TypeScript => *selected != Json::Null,
        }
    }

    /// A stored response as JSON text: Python's string is that text;
    /// TypeScript's is the string its handler returned.
    fn response_json(self, data: &PowertoolsData) -> String {
        match (self, data) {
            (Port::Python, PowertoolsData::String(json)) | (_, PowertoolsData::Value(json)) => {
                json.clone()
            }
            (Port::TypeScript, PowertoolsData::String(text)) => {
                Value::String(text.clone()).to_string()
            }
        }
    }

    /// Whether a record whose `expiration` is `expiration_s` has expired at
    /// `now_ms`: Python's `DataRecord.is_expired` compares whole seconds
    /// (`int(now) > expiry`), TypeScript's `IdempotencyRecord.isExpired`
    /// fractional ones (`Date.now() / 1000 > expiryTimestamp`), so a
    /// TypeScript record expires the millisecond after its second.
    fn expired(self, expiration_s: i64, now_ms: i64) -> bool {
        match self {
            Port::Python => now_ms.div_euclid(1000) > expiration_s,
            Port::TypeScript => now_ms > expiration_s.saturating_mul(1000),
        }
    }

    /// The hash Powertools computed for a selection.
    fn hash(self, function: HashFunction, selected: &Json) -> String {
        match self {
            Port::Python => hex::encode(function.digest(json::python::dumps(selected).as_bytes())),
            Port::TypeScript => {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD
                    .encode(function.digest(json::javascript::stringify(selected).as_bytes()))
            }
        }
    }
}

/// `String.prototype.trim`: ECMAScript's WhiteSpace (tab, vertical tab,
/// form feed, U+FEFF and every space separator) and LineTerminator (line
/// feed, carriage return, U+2028, U+2029) at either end. Unicode's
/// White_Space, which Rust trims, differs in U+0085 and U+FEFF.
fn javascript_trim(text: &str) -> &str {
    text.trim_matches(|c: char| (c.is_whitespace() && c != '\u{85}') || c == '\u{feff}')
}

/// Powertools (Python)'s `is_missing_idempotency_key`.
fn python_missing(value: &Json) -> bool {
    match value {
        Json::Null => true,
        Json::Bool(_) | Json::Number(_) => false,
        Json::String(text) => text.is_empty(),
        Json::Array(items) => items.iter().all(|item| *item == Json::Null),
        Json::Object(members) => Json::unique_members(members)
            .iter()
            .all(|(_, value)| **value == Json::Null),
    }
}

/// Where and under which names Powertools keeps its records; the defaults
/// are Powertools' own (`DynamoDBPersistenceLayer`, `RedisCachePersistenceLayer`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PowertoolsLayout {
    /// DynamoDB: the table, when it is not the store's own.
    pub table: Option<String>,
    /// DynamoDB: the partition key (`key_attr`, default `id`).
    pub key_attr: String,
    /// DynamoDB: the sort key (`sort_key_attr`), if the table has one: the
    /// id is then the sort key and the partition key is `static_pk_value`.
    pub sort_key_attr: Option<String>,
    /// DynamoDB: the partition key's value with a sort key (Powertools'
    /// default: `idempotency#{AWS_LAMBDA_FUNCTION_NAME}`).
    pub static_pk_value: Option<String>,
    /// `expiry_attr` (default `expiration`), epoch seconds.
    pub expiry_attr: String,
    /// `in_progress_expiry_attr` (default `in_progress_expiration`), epoch
    /// milliseconds.
    pub in_progress_expiry_attr: String,
    /// `status_attr` (default `status`).
    pub status_attr: String,
    /// `data_attr` (default `data`): the response (Python: its JSON text;
    /// TypeScript: the value itself).
    pub data_attr: String,
    /// `validation_key_attr` (default `validation`).
    pub validation_key_attr: String,
}

impl Default for PowertoolsLayout {
    fn default() -> Self {
        Self {
            table: None,
            key_attr: "id".to_owned(),
            sort_key_attr: None,
            static_pk_value: None,
            expiry_attr: "expiration".to_owned(),
            in_progress_expiry_attr: "in_progress_expiration".to_owned(),
            status_attr: "status".to_owned(),
            data_attr: "data".to_owned(),
            validation_key_attr: "validation".to_owned(),
        }
    }
}

/// A record as Powertools stored it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PowertoolsRecord {
    /// `INPROGRESS` or `COMPLETED`.
    pub status: String,
    /// When the record expires, epoch seconds.
    pub expiration_s: Option<i64>,
    /// When an `INPROGRESS` record lapses, epoch milliseconds (absent when
    /// Powertools did not know the invocation's remaining time).
    pub in_progress_expiration_ms: Option<i64>,
    /// The response attribute as stored (`COMPLETED` only).
    pub data: Option<PowertoolsData>,
    /// The payload's hash, when payload validation was on.
    pub validation: Option<String>,
}

impl PowertoolsRecord {
    /// A record with `status` and nothing else, to fill in (for other
    /// stores' implementations of [`PowertoolsRecords`]).
    pub fn new(status: impl Into<String>) -> Self {
        Self {
            status: status.into(),
            expiration_s: None,
            in_progress_expiration_ms: None,
            data: None,
            validation: None,
        }
    }
}

/// A record's response attribute, as the store holds it. Python stores
/// `json.dumps` of what the handler returned, a string; TypeScript stores
/// the value itself (a DynamoDB map, list, number, boolean, `NULL` or
/// string; a JSON value in Redis), so its string is the string the handler
/// returned, not JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PowertoolsData {
    /// A string attribute.
    String(String),
    /// Any other value (null included), as its JSON text.
    Value(String),
}

/// Reads a Powertools record by its id: what a store implements for
/// [`PowertoolsCompat`] (the DynamoDB and Redis stores do). The mode's
/// logic never touches a backend itself.
pub trait PowertoolsRecords: Send + Sync + fmt::Debug {
    /// The record stored under `id`, read with strong consistency, or
    /// `None`. Failures are the store's own [`StoreError`] kinds.
    fn read_powertools_record<'a>(
        &'a self,
        id: &'a str,
        layout: &'a PowertoolsLayout,
    ) -> BoxFuture<'a, Result<Option<PowertoolsRecord>, StoreError>>;
}

/// What Powertools' record says about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PowertoolsFound {
    /// Completed within its expiry: replay this response (JSON text: what
    /// Python stored, the JSON of what TypeScript stored; `None` if it
    /// stored none).
    Completed {
        /// The stored response.
        data: Option<String>,
    },
    /// Still in progress in the old function.
    InProgress {
        /// How long until it is held no longer (at least 1 s): its
        /// `in_progress_expiration`, or without one, when the old
        /// function's invocation must have ended
        /// ([`function_timeout`](PowertoolsCompat::function_timeout)).
        retry_after: Duration,
    },
    /// In progress, but its invocation can no longer be running (it
    /// crashed or timed out): the request runs again under this crate's
    /// protocol, **and the earlier attempt may have acted**. Run it as
    /// [`Attempt::taking_over`](crate::Attempt::taking_over)`(takeover)`,
    /// so that the operation is told (the HTTP layer and the batches do).
    Abandoned {
        /// Attempt 2 (Powertools keeps no count), begun when Powertools
        /// wrote the record (its `expiration` less
        /// [`expires_after`](PowertoolsCompat::expires_after), to the
        /// second).
        takeover: Takeover,
    },
}

type Selector = Arc<dyn Fn(&Value) -> Option<Value> + Send + Sync>;

#[derive(Clone)]
enum Selection {
    Expression(Expression),
    Closure(Selector),
}

impl Selection {
    /// The selected value, `None` when Powertools would have had no key.
    fn select(&self, event: &Value, headers_any_case: bool, port: Port) -> Option<Json> {
        let value = self.evaluate(event, headers_any_case, port)?;
        port.has_record(&value).then_some(value)
    }

    /// What the expression or closure selects, `None` when Powertools
    /// raised (`powertools_json` of what is not JSON to its language).
    fn evaluate(&self, event: &Value, headers_any_case: bool, port: Port) -> Option<Json> {
        match self {
            // EvalError::NotJson: Powertools raised, and wrote no record.
            Selection::Expression(expression) => expression
                .evaluate(event, headers_any_case, port.dialect())
                .ok(),
            Selection::Closure(closure) => closure(event).map(|value| Json::from(&value)),
        }
    }
}

/// The compatibility mode: how to find the record Powertools wrote for a
/// request, and what it means. See the [module docs](self).
#[derive(Clone)]
pub struct PowertoolsCompat {
    reader: Arc<dyn PowertoolsRecords>,
    prefix: String,
    key: Selection,
    validation: Option<Selection>,
    hash: HashFunction,
    port: Port,
    layout: PowertoolsLayout,
    clock: Arc<dyn Clock>,
    /// The Lambda function's name, when given: Powertools' default
    /// `static_pk_value` is `idempotency#{function}`.
    function_name: Option<String>,
    holds: Holds,
}

/// How long records in progress are held, from Powertools' configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holds {
    /// Powertools' `expires_after_seconds`: a record's `expiration` is its
    /// write time plus this.
    expires_after_s: i64,
    /// The longest an invocation of the old function could run.
    function_timeout_ms: i64,
}

/// Powertools' default `expires_after_seconds`.
pub const DEFAULT_EXPIRES_AFTER: Duration = Duration::from_secs(3600);
/// The longest a Lambda invocation can run: the default
/// [`function_timeout`](PowertoolsCompat::function_timeout).
pub const MAX_FUNCTION_TIMEOUT: Duration = Duration::from_secs(15 * 60);

impl Default for Holds {
    fn default() -> Self {
        Self {
            expires_after_s: secs_i64(DEFAULT_EXPIRES_AFTER),
            function_timeout_ms: millis_i64(MAX_FUNCTION_TIMEOUT),
        }
    }
}

fn secs_i64(duration: Duration) -> i64 {
    i64::try_from(duration.as_secs()).unwrap_or(i64::MAX)
}

fn millis_i64(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl fmt::Debug for PowertoolsCompat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PowertoolsCompat")
            .field("reader", &self.reader)
            .field("prefix", &self.prefix)
            .field("hash", &self.hash)
            .field("port", &self.port)
            .field("layout", &self.layout)
            .field("holds", &self.holds)
            .finish_non_exhaustive()
    }
}

impl PowertoolsCompat {
    /// Records of Powertools' `@idempotent` (or `@idempotent_function`) on
    /// `handler` (its `module.qualname`, such as `app.lambda_handler`) in the
    /// Lambda function `function_name` (its `AWS_LAMBDA_FUNCTION_NAME`),
    /// read through `reader` (a [`DynamoDbStore`] or
    /// a `RedisStore`). The key is the whole event until set.
    #[cfg_attr(
        feature = "dynamodb",
        doc = "",
        doc = "[`DynamoDbStore`]: crate::DynamoDbStore"
    )]
    #[cfg_attr(
        not(feature = "dynamodb"),
        doc = "",
        doc = "[`DynamoDbStore`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/struct.DynamoDbStore.html"
    )]
    pub fn new(
        reader: impl PowertoolsRecords + 'static,
        function_name: &str,
        handler: &str,
    ) -> Self {
        let mut compat = Self::with_key_prefix(reader, format!("{function_name}.{handler}"));
        compat.function_name = Some(function_name.to_owned());
        compat
    }

    /// Records of a Powertools handler configured with `key_prefix`.
    pub fn with_key_prefix(
        reader: impl PowertoolsRecords + 'static,
        key_prefix: impl Into<String>,
    ) -> Self {
        Self {
            reader: Arc::new(reader),
            prefix: key_prefix.into(),
            key: Selection::Expression(Expression::whole()),
            validation: None,
            hash: HashFunction::default(),
            port: Port::Python,
            layout: PowertoolsLayout::default(),
            clock: Arc::new(SystemClock),
            function_name: None,
            holds: Holds::default(),
        }
    }

    /// Records of Powertools for AWS Lambda (TypeScript)
    /// (`@aws-lambda-powertools/idempotency`: `makeIdempotent`, the
    /// `@idempotent` decorator, the Middy middleware) under `key_prefix`:
    /// the Lambda function's name (`AWS_LAMBDA_FUNCTION_NAME`), or its
    /// `keyPrefix` option when set. Its record ids are
    /// `{key_prefix}#{hash}`, the base64 digest of
    /// `JSON.stringify(deepSort(selected))`; its DynamoDB records hold the
    /// response as a map, read here as its JSON. Configure the rest as for
    /// Python (`eventKeyJmesPath`, `payloadValidationJmesPath`,
    /// `hashFunction`, the table's names). See the [module docs](self).
    ///
    /// Powertools trims `keyPrefix` with JavaScript's `trim()`, and so does
    /// this: whitespace and line terminators as ECMAScript counts them (the
    /// byte order mark U+FEFF included, U+0085 not). A `keyPrefix` that is
    /// all whitespace was ignored: give the function's name then.
    pub fn typescript(
        reader: impl PowertoolsRecords + 'static,
        key_prefix: impl Into<String>,
    ) -> Self {
        let key_prefix = key_prefix.into();
        let mut compat = Self::with_key_prefix(reader, javascript_trim(&key_prefix));
        compat.port = Port::TypeScript;
        compat
    }

    /// Powertools' `event_key_jmespath`, for the supported forms (see the
    /// [module docs](self)); anything else is refused: use
    /// [`event_key`](Self::event_key). The HTTP layer refuses, when it is
    /// built, what it cannot read of a request
    /// ([`IdempotencyLayer::try_powertools`]).
    #[cfg_attr(
        feature = "http",
        doc = "",
        doc = "[`IdempotencyLayer::try_powertools`]: crate::http::IdempotencyLayer::try_powertools"
    )]
    #[cfg_attr(
        not(feature = "http"),
        doc = "",
        doc = "[`IdempotencyLayer::try_powertools`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/http/struct.IdempotencyLayer.html#method.try_powertools"
    )]
    pub fn event_key_jmespath(mut self, expression: &str) -> Result<Self, UnsupportedExpression> {
        self.key = Selection::Expression(Expression::parse(expression)?);
        Ok(self)
    }

    /// The value Powertools' `event_key_jmespath` selected from the event
    /// (see the module docs for the event each adapter passes), for
    /// expressions outside the supported forms. `None`: no key.
    pub fn event_key(
        mut self,
        select: impl Fn(&Value) -> Option<Value> + Send + Sync + 'static,
    ) -> Self {
        self.key = Selection::Closure(Arc::new(select));
        self
    }

    /// Powertools' `payload_validation_jmespath`, when it was on.
    pub fn payload_validation_jmespath(
        mut self,
        expression: &str,
    ) -> Result<Self, UnsupportedExpression> {
        self.validation = Some(Selection::Expression(Expression::parse(expression)?));
        Ok(self)
    }

    /// Payload validation with a closure, like [`event_key`](Self::event_key).
    pub fn payload_validation(
        mut self,
        select: impl Fn(&Value) -> Option<Value> + Send + Sync + 'static,
    ) -> Self {
        self.validation = Some(Selection::Closure(Arc::new(select)));
        self
    }

    /// Powertools' `hash_function` (default md5).
    pub fn hash_function(mut self, hash: HashFunction) -> Self {
        self.hash = hash;
        self
    }

    /// Where and under which names the records are (default: Powertools'
    /// names, in the store's own table). A layout with a `sort_key_attr`
    /// and no `static_pk_value` gets Powertools' default,
    /// `idempotency#{function_name}`, when the function's name was given
    /// ([`new`](Self::new)).
    pub fn layout(mut self, mut layout: PowertoolsLayout) -> Self {
        if layout.sort_key_attr.is_some() && layout.static_pk_value.is_none() {
            if let Some(function) = &self.function_name {
                layout.static_pk_value = Some(format!("idempotency#{function}"));
            }
        }
        self.layout = layout;
        self
    }

    /// Powertools' `expires_after_seconds` (default one hour,
    /// [`DEFAULT_EXPIRES_AFTER`]; TypeScript's `expiresAfterSeconds`): a
    /// record's `expiration` is the time Powertools wrote it plus this, so
    /// a record in progress without `in_progress_expiration` is dated by
    /// it (see [`function_timeout`](Self::function_timeout)). Set it to
    /// what Powertools was configured with: a longer one here than there
    /// dates records earlier than they were written, and lets a retry run
    /// beside an invocation that may still be live.
    pub fn expires_after(mut self, expires_after: Duration) -> Self {
        self.holds.expires_after_s = secs_i64(expires_after);
        self
    }

    /// The longest the old function's invocation could run (its timeout;
    /// default and most: Lambda's 15 minutes, [`MAX_FUNCTION_TIMEOUT`]).
    ///
    /// Powertools writes an `INPROGRESS` record without
    /// `in_progress_expiration` when it had no Lambda context: Python's
    /// `idempotent_function` without `config.register_lambda_context(context)`
    /// (`@idempotent` registers the handler's context itself), TypeScript's
    /// `makeIdempotent` on a function not called with the context as its
    /// second argument, without `config.registerLambdaContext(context)`.
    /// Such a record is held (in progress: 409, a failed batch record) until
    /// this long after Powertools wrote it (its `expiration` less
    /// [`expires_after`](Self::expires_after), plus the second Powertools
    /// truncated), and never past its `expiration`; then it is
    /// [`Abandoned`](PowertoolsFound::Abandoned): the request runs, told
    /// it takes over. See the [module docs](self).
    pub fn function_timeout(mut self, timeout: Duration) -> Self {
        self.holds.function_timeout_ms = millis_i64(timeout);
        self
    }

    /// The clock expiries are compared with (default: the system's).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// `Ok` when the key and validation expressions read only what the HTTP
    /// layer sees of a request as Powertools read it from the API Gateway
    /// event (closures are the user's own); otherwise the first that does
    /// not, and why.
    #[cfg(feature = "http")]
    pub(crate) fn check_http(&self) -> Result<(), UnsupportedExpression> {
        for selection in std::iter::once(&self.key).chain(&self.validation) {
            if let Selection::Expression(expression) = selection {
                expression.check_http()?;
            }
        }
        Ok(())
    }

    /// The id of the record Powertools wrote for `event`, or `None` when it
    /// had no key (and wrote no record).
    pub fn record_id(&self, event: &Value) -> Option<String> {
        self.record_id_in(event, false)
    }

    fn record_id_in(&self, event: &Value, headers_any_case: bool) -> Option<String> {
        let selected = self.key.select(event, headers_any_case, self.port)?;
        Some(format!("{}#{}", self.prefix, self.hash_of(&selected)))
    }

    fn hash_of(&self, value: &Json) -> String {
        self.port.hash(self.hash, value)
    }

    /// Reads the record Powertools wrote for `event` and says what it
    /// means: `Ok(None)` lets this crate's protocol run. A record whose
    /// payload hash differs (validation on) is [`Error::KeyReused`]; a read
    /// that fails, [`Error::Store`].
    pub async fn check(&self, event: &Value) -> Result<Option<PowertoolsFound>, Error> {
        self.check_in(event, false).await
    }

    pub(crate) async fn check_in(
        &self,
        event: &Value,
        headers_any_case: bool,
    ) -> Result<Option<PowertoolsFound>, Error> {
        let Some(id) = self.record_id_in(event, headers_any_case) else {
            return Ok(None);
        };
        let record = self
            .reader
            .read_powertools_record(&id, &self.layout)
            .await
            .map_err(Error::Store)?;
        let Some(record) = record else {
            return Ok(None);
        };
        let found =
            decide(&record, self.port, self.clock.now_ms(), self.holds).map_err(|error| {
                Error::Store(StoreError::new(
                    StoreErrorKind::CorruptRecord,
                    format!("Powertools record {id}: {error}"),
                ))
            })?;
        // An abandoned record is overwritten by Powertools without a
        // look at its hash (its put's condition lets it through).
        if matches!(
            found,
            Some(PowertoolsFound::Completed { .. } | PowertoolsFound::InProgress { .. })
        ) {
            // A record without a hash fails validation too, as in Powertools
            // (its Redis layer drops the hash when it completes a record,
            // and then refuses every retry of it).
            if let Some(validation) = &self.validation {
                // Powertools hashes the selection even when it is null.
                let selected = validation
                    .evaluate(event, headers_any_case, self.port)
                    .unwrap_or(Json::Null);
                if record.validation.as_deref() != Some(self.hash_of(&selected).as_str()) {
                    tracing::debug!(record = %id, outcome = "key_reused", "Powertools record");
                    return Err(Error::KeyReused);
                }
            }
        }
        tracing::debug!(record = %id, found = ?found.as_ref().map(kind), "Powertools record read");
        Ok(found)
    }
}

fn kind(found: &PowertoolsFound) -> &'static str {
    match found {
        PowertoolsFound::Completed { .. } => "completed",
        PowertoolsFound::InProgress { .. } => "in_progress",
        PowertoolsFound::Abandoned { .. } => "abandoned",
    }
}

/// What a record means at `now_ms`, as Powertools decides it
/// (`DataRecord.is_expired`, `_handle_for_status`), but for a record in
/// progress without `in_progress_expiration`: held until the old
/// function's invocation must have ended (`holds`), then abandoned.
fn decide(
    record: &PowertoolsRecord,
    port: Port,
    now_ms: u64,
    holds: Holds,
) -> Result<Option<PowertoolsFound>, String> {
    let now_ms = i64::try_from(now_ms).unwrap_or(i64::MAX);
    if record
        .expiration_s
        .is_some_and(|expiration| port.expired(expiration, now_ms))
    {
        return Ok(None);
    }
    match record.status.as_str() {
        "COMPLETED" => Ok(Some(PowertoolsFound::Completed {
            data: record.data.as_ref().map(|data| port.response_json(data)),
        })),
        "INPROGRESS" => {
            // Powertools wrote the record at `expiration - expires_after`
            // (its expiry is truncated to the second: up to 1 s later).
            let written_s = record
                .expiration_s
                .map(|expiration| expiration.saturating_sub(holds.expires_after_s));
            let held_until_ms = match (record.in_progress_expiration_ms, record.expiration_s) {
                (Some(lapses), _) => lapses,
                (None, Some(expiration)) => {
                    let written_ms = written_s
                        .unwrap_or(expiration)
                        .saturating_add(1)
                        .saturating_mul(1000);
                    written_ms
                        .saturating_add(holds.function_timeout_ms)
                        // Live no longer than the second of its expiration.
                        .min(expiration.saturating_add(1).saturating_mul(1000))
                }
                (None, None) => {
                    return Err(
                        "an INPROGRESS record with neither an in-progress expiry nor an \
                                expiration: when it was written, or whether its invocation \
                                can still be running, cannot be told; delete it once the old \
                                function's invocations are over"
                            .to_owned(),
                    )
                }
            };
            if held_until_ms < now_ms {
                let first_started_at_ms = written_s
                    .map_or(now_ms, |s| s.saturating_mul(1000))
                    .clamp(0, now_ms);
                return Ok(Some(PowertoolsFound::Abandoned {
                    takeover: Takeover {
                        attempt: 2,
                        first_started_at_ms: u64::try_from(first_started_at_ms).unwrap_or(0),
                    },
                }));
            }
            let left = held_until_ms.saturating_sub(now_ms);
            let retry_after =
                Duration::from_millis(u64::try_from(left).unwrap_or(0)).max(Duration::from_secs(1));
            Ok(Some(PowertoolsFound::InProgress { retry_after }))
        }
        other => Err(format!("unknown status {other:?}")),
    }
}

#[cfg(test)]
mod tests;
