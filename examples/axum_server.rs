//! An axum server outside Lambda (ECS, Fargate, EC2): the idempotency layer
//! behind an authentication middleware, with the caller's JWT principal as
//! the scope of its keys.
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! lambda-idempotency = "0.1"
//! axum = { version = "0.8", default-features = false, features = ["json", "tokio", "http1"] }
//! aws-config = { version = "1", features = ["behavior-version-latest"] }
//! aws-sdk-dynamodb = "1"
//! bytes = "1"
//! serde_json = "1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! `IDEMPOTENCY_TABLE=idempotency cargo run --example axum_server`, then
//!
//! ```sh
//! curl -i localhost:3000/v1/charges -H 'authorization: Bearer alice-token' \
//!   -H 'idempotency-key: 8e03978e' -H 'content-type: application/json' -d '{"amount":1250}'
//! ```
//!
//! Without `IDEMPOTENCY_TABLE` it keeps records in memory (one process).

use axum::{
    extract::Request,
    http::StatusCode,
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::post,
    Json, Router,
};
use bytes::Bytes;
use lambda_idempotency::{
    http::IdempotencyLayer, store::Store, DynamoDbStore, Engine, MemoryStore,
};
use serde_json::{json, Value};

/// The verified caller, as the authentication middleware leaves it in the
/// request's extensions.
#[derive(Clone, Debug)]
struct Principal {
    issuer: String,
    subject: String,
}

/// Stands in for real JWT verification (a JWKS-checked token, with the
/// `jsonwebtoken` crate or your gateway's): a bearer token names the caller.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    let principal = match token {
        Some("alice-token") => Principal {
            issuer: "https://issuer.example".into(),
            subject: "alice".into(),
        },
        Some("bob-token") => Principal {
            issuer: "https://issuer.example".into(),
            subject: "bob".into(),
        },
        _ => return StatusCode::UNAUTHORIZED.into_response(),
    };
    request.extensions_mut().insert(principal);
    next.run(request).await
}

async fn create_charge(Json(body): Json<Value>) -> (StatusCode, Json<Value>) {
    // Charge here: this runs once per caller and key.
    (
        StatusCode::CREATED,
        Json(json!({ "amount": body["amount"] })),
    )
}

fn app<St: Store>(engine: Engine<St>) -> Router {
    let idempotency =
        IdempotencyLayer::new(engine).scope(|request: &axum::http::Request<Bytes>| {
            let route = format!("{} {}", request.method(), request.uri().path());
            match request.extensions().get::<Principal>() {
                Some(caller) => format!("jwt {} {} {route}", caller.issuer, caller.subject),
                // Not reached behind `authenticate`, which refuses callers
                // without a token; said here so no change of middleware makes
                // callers share keys silently.
                None => format!("anonymous {route}"),
            }
        });
    Router::new()
        .route("/v1/charges", post(create_charge))
        .layer(idempotency)
        // Added last, so it runs first: the scope sees the principal.
        .layer(middleware::from_fn(authenticate))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let router = match std::env::var("IDEMPOTENCY_TABLE") {
        Ok(table) => {
            // Once, at start-up: one client for every request.
            let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
            let client = aws_sdk_dynamodb::Client::new(&config);
            app(Engine::builder(DynamoDbStore::new(client, table)).build())
        }
        Err(_) => {
            eprintln!("IDEMPOTENCY_TABLE is not set: records are kept in this process's memory");
            app(Engine::builder(MemoryStore::new()).build())
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    eprintln!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router).await?;
    Ok(())
}
