//! An axum app in Lambda: `lambda_http::run(router)`, with the idempotency
//! layer on the routes that create things, and none on the webhook.
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! lambda-idempotency = "0.1"
//! lambda_http = "1"
//! axum = { version = "0.8", default-features = false, features = ["json"] }
//! aws-config = { version = "1", features = ["behavior-version-latest"] }
//! aws-sdk-dynamodb = "1"
//! serde_json = "1"
//! tokio = { version = "1", features = ["macros"] }
//! ```
//!
//! Built by `cargo test --all-targets`; it needs the Lambda runtime (and
//! `IDEMPOTENCY_TABLE`) to run: `cargo lambda watch --example axum_lambda`.
//! Through API Gateway, the caller is the authorizer's (see the module
//! docs of `lambda_idempotency::http`).

use axum::{
    extract::Path,
    http::StatusCode,
    routing::{get, post},
    Json, Router,
};
use lambda_idempotency::{http::IdempotencyLayer, DynamoDbStore, Engine};
use serde_json::{json, Value};

async fn create_charge(
    Path(customer): Path<String>,
    Json(body): Json<Value>,
) -> Result<(StatusCode, Json<Value>), (StatusCode, String)> {
    let amount = body["amount"]
        .as_u64()
        .filter(|amount| *amount > 0)
        .ok_or((
            StatusCode::BAD_REQUEST,
            "amount must be a positive integer".into(),
        ))?;
    // Charge the customer here: this runs once per key.
    Ok((
        StatusCode::CREATED,
        Json(json!({ "customer": customer, "amount": amount })),
    ))
}

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    lambda_http::tracing::init_default_subscriber();
    // Once per execution environment, reused by every invocation.
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let client = aws_sdk_dynamodb::Client::new(&config);
    let table = std::env::var("IDEMPOTENCY_TABLE")?;
    let engine = Engine::builder(DynamoDbStore::new(client, table)).build();

    let app = Router::new()
        .route("/v1/customers/{customer}/charges", post(create_charge))
        // Only the routes above need an Idempotency-Key.
        .route_layer(IdempotencyLayer::new(engine))
        .route("/webhooks", post(|| async { StatusCode::NO_CONTENT }))
        .route("/health", get(|| async { "ok" }));
    lambda_http::run(app).await
}
