//! An NDJSON export in Lambda with response streaming
//! (`lambda_http::run_with_streaming_response`, a function URL with
//! `InvokeMode: RESPONSE_STREAM`): each row reaches the client as the
//! handler writes it, through the idempotency layer, and the whole export
//! is stored when it ends, so a retry gets every row again without a second
//! run. `/v1/exports-bare` is the same export without the layer, to compare.
//!
//! Run by `make e2e` under `cargo lambda watch` (it needs
//! `IDEMPOTENCY_TABLE`; `scripts/charges_local.py`, `streaming`), which
//! checks that the first row arrives before the handler writes the last and
//! that a retry replays every row.

use axum::{body::Body, http::header, response::IntoResponse, routing::post, Router};
use futures_util::StreamExt;
use lambda_idempotency::{http::IdempotencyLayer, DynamoDbStore, Engine};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Rows of the export, and the time the handler takes to write each after
/// the first.
const ROWS: u64 = 5;
const ROW_GAP: Duration = Duration::from_millis(400);

/// The export: one JSON row every `ROW_GAP`, each saying when it was
/// written, without a length.
async fn export() -> impl IntoResponse {
    let rows = futures_util::stream::iter(0..ROWS).then(|row| async move {
        if row > 0 {
            tokio::time::sleep(ROW_GAP).await;
        }
        let written_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        Ok::<_, std::convert::Infallible>(format!(
            "{{\"row\":{row},\"written_ms\":{written_ms}}}\n"
        ))
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(rows),
    )
}

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    lambda_http::tracing::init_default_subscriber();
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let client = aws_sdk_dynamodb::Client::new(&config);
    let table = std::env::var("IDEMPOTENCY_TABLE")?;
    let engine = Engine::builder(DynamoDbStore::new(client, table)).build();
    // A function URL without an authorizer names no caller: one tenant.
    let idempotent = IdempotencyLayer::new(engine).shared_scope();

    let app = Router::new()
        .route("/v1/exports", post(export).layer(idempotent))
        .route("/v1/exports-bare", post(export));
    lambda_http::run_with_streaming_response(app).await
}
