//! `charges`: the reference Lambda function behind API Gateway.
//!
//! - `POST /v1/charges` with `{"amount": 1250, "currency": "EUR", "customer": "cus_42"}`
//!   and an `Idempotency-Key` header creates a charge: 201 with the charge.
//!   Every execution writes one item to the charges table, committed in one
//!   transaction with the idempotency record; a duplicate that slipped
//!   through would show as a second item.
//! - `GET /v1/charges/{id}` returns the charge, or 404.
//!
//! Environment: `IDEMPOTENCY_TABLE`, `CHARGES_TABLE`, and the standard AWS
//! variables (`AWS_REGION`, `AWS_ENDPOINT_URL_DYNAMODB` for local runs).
//! With `IDEMPOTENCY_METRICS_NAMESPACE` (set by the template), the engine's
//! answers are CloudWatch metrics in that namespace, which the template's
//! dashboard reads.
//!
//! The idempotency records live in DynamoDB (`IDEMPOTENCY_TABLE`) unless
//! `IDEMPOTENCY_STORE_URL` names another store: `postgres://…` or
//! `postgresql://…` (the table `idempotency` is created if missing),
//! `redis://…` or `rediss://…`. With another store the charge item is
//! written to DynamoDB by the handler, between the claim and the completion,
//! not in one transaction with the record: a crash between the two leaves a
//! charge whose record is still in progress, and a retry after the lease
//! passes is told it takes over (`Takeover`) and finds the charge already
//! written (its id is derived from the idempotency record, so the write is
//! conditional on it not existing).
#![forbid(unsafe_code)]

#[path = "../../../cli/src/store_url.rs"]
mod store_url;
#[cfg_attr(
    not(any(feature = "postgres", feature = "redis")),
    allow(unused_imports)
)]
use store_url::OtherStore;

use aws_sdk_dynamodb::{
    types::{AttributeValue, Put, TransactWriteItem},
    Client,
};
use lambda_http::{
    http::{header, Method, StatusCode},
    service_fn, Body, Error, Request, RequestExt, Response,
};
use lambda_idempotency::{
    http::{CommitWith, IdempotencyLayer},
    store::Store,
    DynamoDbStore, EmfMetrics, Engine,
};
use serde::{Deserialize, Serialize};
use std::{sync::Arc, time::SystemTime};
use tower::ServiceBuilder;

/// The prefix of the problem `type`s this function answers with.
const PROBLEM_BASE: &str = "urn:charges:problem:";
const COLLECTION: &str = "/v1/charges";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Charge {
    id: String,
    amount: u64,
    currency: String,
    customer: String,
    created: u64,
}

/// The body of `POST /v1/charges`, before validation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewCharge {
    amount: serde_json::Value,
    currency: serde_json::Value,
    customer: serde_json::Value,
}

/// Validates a request body into (amount, currency, customer), or says what
/// is wrong with it.
fn validate(body: &[u8]) -> Result<(u64, String, String), String> {
    let new: NewCharge = serde_json::from_slice(body).map_err(|e| {
        format!("the body must be a JSON object with `amount`, `currency` and `customer`: {e}")
    })?;
    let amount = new
        .amount
        .as_u64()
        .filter(|amount| *amount > 0)
        .ok_or("`amount` must be a positive integer, in minor units (cents)")?;
    let currency = new
        .currency
        .as_str()
        .filter(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_alphabetic()))
        .ok_or("`currency` must be an ISO 4217 code of three letters, such as \"EUR\"")?
        .to_ascii_uppercase();
    let customer = new
        .customer
        .as_str()
        .map(str::trim)
        .filter(|c| !c.is_empty() && c.len() <= 255)
        .ok_or("`customer` must be a non-empty string of at most 255 characters")?
        .to_owned();
    Ok((amount, currency, customer))
}

#[derive(Clone)]
struct Charges {
    client: Client,
    table: Arc<str>,
    /// Whether the idempotency store commits the charge with the record
    /// (DynamoDB), or the handler writes it itself.
    commits_with_record: bool,
}

impl Charges {
    async fn handle(self, request: Request) -> Result<Response<Body>, Error> {
        // Function URLs, HTTP APIs and REST APIs (with or without the stage in
        // the path) all reach the same routes.
        let path = request.raw_http_path();
        let route = path
            .find(COLLECTION)
            .map(|start| &path[start + COLLECTION.len()..]);
        let id = route
            .and_then(|rest| rest.strip_prefix('/'))
            .filter(|id| !id.is_empty());
        match (request.method(), route, id) {
            (&Method::POST, Some("" | "/"), _) => self.create(&request).await,
            (&Method::GET, _, Some(id)) if !id.contains('/') => self.get(id).await,
            (&Method::GET, _, Some(_)) => {
                problem(StatusCode::NOT_FOUND, "not-found", "No such route.")
            }
            (_, Some("" | "/"), _) | (_, _, Some(_)) => problem(
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Use POST /v1/charges or GET /v1/charges/{id}.",
            ),
            _ => problem(StatusCode::NOT_FOUND, "not-found", "No such route."),
        }
    }

    async fn create(&self, request: &Request) -> Result<Response<Body>, Error> {
        let (amount, currency, customer) = match validate(request.body()) {
            Ok(valid) => valid,
            Err(detail) => return problem(StatusCode::BAD_REQUEST, "invalid-charge", &detail),
        };
        let charge = Charge {
            id: new_charge_id(),
            amount,
            currency,
            customer,
            created: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default(),
        };
        let item = serde_dynamo::to_item(&charge)?;
        tracing::info!(charge = %charge.id, amount, "charge created");
        let mut response = Response::builder()
            .status(StatusCode::CREATED)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::LOCATION, format!("{COLLECTION}/{}", charge.id))
            .body(Body::Text(serde_json::to_string(&charge)?))?;
        if !self.commits_with_record {
            // Another store: the charge is written now, under the claim.
            self.client
                .put_item()
                .table_name(&*self.table)
                .set_item(Some(item))
                .condition_expression("attribute_not_exists(id)")
                .send()
                .await?;
            return Ok(response);
        }
        let put = Put::builder()
            .table_name(&*self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(id)")
            .build()?;
        // The charge is written only if this response is stored, in the same
        // transaction: never a charge without its record, or the reverse.
        response
            .extensions_mut()
            .insert(CommitWith(vec![TransactWriteItem::builder()
                .put(put)
                .build()]));
        Ok(response)
    }

    async fn get(&self, id: &str) -> Result<Response<Body>, Error> {
        let item = self
            .client
            .get_item()
            .table_name(&*self.table)
            .key("id", AttributeValue::S(id.to_owned()))
            .consistent_read(true)
            .send()
            .await?
            .item;
        match item {
            Some(item) => {
                let charge: Charge = serde_dynamo::from_item(item)?;
                Ok(Response::builder()
                    .status(StatusCode::OK)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::Text(serde_json::to_string(&charge)?))?)
            }
            None => problem(
                StatusCode::NOT_FOUND,
                "charge-not-found",
                "No charge has this id.",
            ),
        }
    }
}

fn new_charge_id() -> String {
    let mut bytes = [0u8; 12];
    // The OS random source is not input-dependent; if it fails there is
    // nothing better to do than fall back to the clock.
    if getrandom::fill(&mut bytes).is_err() {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        bytes.copy_from_slice(&nanos.to_be_bytes()[4..]);
    }
    format!("ch_{}", hex::encode(bytes))
}

fn problem(status: StatusCode, kind: &str, detail: &str) -> Result<Response<Body>, Error> {
    let body = serde_json::json!({
        "type": format!("{PROBLEM_BASE}{kind}"),
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    Ok(Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/problem+json")
        .body(Body::Text(body.to_string()))?)
}

fn required_env(name: &str) -> Result<String, Error> {
    std::env::var(name).map_err(|_| format!("environment variable {name} is not set").into())
}

// One invocation at a time per execution environment of a function of the
// default kind: the single-threaded runtime saves a hop between threads on
// every store round trip (about a third of a Redis new key's latency;
// BENCHMARKS.md). run_concurrent serves them one at a time there, and
// AWS_LAMBDA_MAX_CONCURRENCY at once under Lambda Managed Instances (on this
// one thread: I/O-bound work; a CPU-bound handler wants #[tokio::main]).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    // JSON logs when AWS_LAMBDA_LOG_FORMAT=JSON (set by the template).
    lambda_http::tracing::init_default_subscriber();

    // Built once per execution environment, reused by every invocation.
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let client = Client::new(&config);
    let table: Arc<str> = required_env("CHARGES_TABLE")?.into();
    let charges = |commits_with_record| Charges {
        client: client.clone(),
        table: Arc::clone(&table),
        commits_with_record,
    };
    // The default record prefix names the function (AWS_LAMBDA_FUNCTION_NAME),
    // so other functions on the same store never meet its records.
    match std::env::var("IDEMPOTENCY_STORE_URL")
        .ok()
        .filter(|url| !url.is_empty())
    {
        None => {
            let store = DynamoDbStore::new(client.clone(), required_env("IDEMPOTENCY_TABLE")?);
            let engine = engine(store);
            // The handler's only effect is the charge it commits with the
            // stored response (CommitWith): so both go in one write, without
            // a claim before it. A new charge costs one DynamoDB call, a
            // replay one, a cached replay none.
            serve(IdempotencyLayer::new(engine).single_write(), charges(true)).await
        }
        Some(url) => serve_other(&url, charges(false)).await,
    }
}

/// The engine on `store`, with a cache of completed records, reporting to
/// CloudWatch (Embedded Metric Format lines on stdout) when
/// `IDEMPOTENCY_METRICS_NAMESPACE` names a namespace.
fn engine<St: Store>(store: St) -> Engine<St> {
    let builder = Engine::builder(store).cache(1024);
    match std::env::var("IDEMPOTENCY_METRICS_NAMESPACE") {
        Ok(namespace) if !namespace.is_empty() => {
            builder.observer(EmfMetrics::new(namespace)).build()
        }
        _ => builder.build(),
    }
}

/// The store named by `IDEMPOTENCY_STORE_URL`, where this build has it
/// (features `postgres`, `redis`: `cargo lambda build --features postgres,redis`).
#[cfg_attr(
    not(any(feature = "postgres", feature = "redis")),
    allow(unused_variables)
)]
async fn serve_other(url: &str, charges: Charges) -> Result<(), Error> {
    match store_url::open(url, store_url::POSTGRES_TABLE, true).await? {
        #[cfg(feature = "postgres")]
        OtherStore::Postgres(store) => serve(IdempotencyLayer::new(engine(store)), charges).await,
        #[cfg(feature = "redis")]
        OtherStore::Redis(store) => serve(IdempotencyLayer::new(engine(store)), charges).await,
    }
}

async fn serve<St: Store>(layer: IdempotencyLayer<St>, charges: Charges) -> Result<(), Error> {
    let service = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(move |request| charges.clone().handle(request)));
    lambda_http::run_concurrent(service).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_bodies_are_accepted_and_normalised() {
        let (amount, currency, customer) =
            validate(br#"{"amount": 1250, "currency": "eur", "customer": " cus_42 "}"#).unwrap();
        assert_eq!(
            (amount, currency.as_str(), customer.as_str()),
            (1250, "EUR", "cus_42")
        );
    }

    #[test]
    fn invalid_bodies_say_what_is_wrong() {
        for (body, expected) in [
            (&br#"not json"#[..], "JSON object"),
            (
                br#"{"amount": 0, "currency": "EUR", "customer": "c"}"#,
                "positive integer",
            ),
            (
                br#"{"amount": -5, "currency": "EUR", "customer": "c"}"#,
                "positive integer",
            ),
            (
                br#"{"amount": 12.5, "currency": "EUR", "customer": "c"}"#,
                "positive integer",
            ),
            (
                br#"{"amount": "12", "currency": "EUR", "customer": "c"}"#,
                "positive integer",
            ),
            (
                br#"{"amount": 1, "currency": "EURO", "customer": "c"}"#,
                "ISO 4217",
            ),
            (
                br#"{"amount": 1, "currency": "E1R", "customer": "c"}"#,
                "ISO 4217",
            ),
            (
                br#"{"amount": 1, "currency": "EUR", "customer": "  "}"#,
                "non-empty",
            ),
            (br#"{"amount": 1, "currency": "EUR"}"#, "JSON object"),
            (
                br#"{"amount": 1, "currency": "EUR", "customer": "c", "extra": 1}"#,
                "JSON object",
            ),
        ] {
            let error = validate(body).expect_err(std::str::from_utf8(body).unwrap());
            assert!(error.contains(expected), "{error}");
        }
    }

    #[test]
    fn charge_ids_are_unique_and_prefixed() {
        let (a, b) = (new_charge_id(), new_charge_id());
        assert_ne!(a, b);
        assert!(a.starts_with("ch_") && a.len() == 27, "{a}");
    }
}
