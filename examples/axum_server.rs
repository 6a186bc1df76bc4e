//! An axum server outside Lambda (ECS, Fargate, EC2): the idempotency layer
//! behind an authentication middleware, with the caller's JWT principal
//! naming the caller of each key; at shutdown (SIGTERM, as ECS sends it, or
//! Ctrl-C) it stops accepting requests and waits for the claimed ones to
//! finish, so none is left in progress.
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! # No Lambda crates: a server outside Lambda needs `http` and `axum` only.
//! lambda-idempotency = { version = "0.1", default-features = false, features = ["dynamodb", "http", "axum"] }
//! axum = { version = "0.8", default-features = false, features = ["json", "tokio", "http1"] }
//! aws-config = { version = "1", features = ["behavior-version-latest"] }
//! aws-sdk-dynamodb = "1"
//! bytes = "1"
//! serde_json = "1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "signal"] }
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
use std::time::Duration;

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

fn idempotency<St: Store>(engine: Engine<St>) -> IdempotencyLayer<St> {
    // The caller only: the layer adds the route (axum's route template) and
    // the path stays in the fingerprint.
    IdempotencyLayer::new(engine).caller(|request: &axum::http::Request<Bytes>| {
        // `None` (no principal: `authenticate` has not run) is refused with
        // a 500 rather than shared as one anonymous caller.
        let caller = request.extensions().get::<Principal>()?;
        Some(format!("{} {}", caller.issuer, caller.subject))
    })
}

fn app<St: Store>(idempotency: IdempotencyLayer<St>) -> Router {
    Router::new()
        .route("/v1/charges", post(create_charge))
        .layer(idempotency)
        // Added last, so it runs first: the caller is known to the layer.
        .layer(middleware::from_fn(authenticate))
}

/// SIGTERM (what ECS and Kubernetes send) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (router, in_flight) = match std::env::var("IDEMPOTENCY_TABLE") {
        Ok(table) => {
            // Once, at start-up: one client for every request.
            let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
            let client = aws_sdk_dynamodb::Client::new(&config);
            // The heartbeat keeps a long handler's claim: nothing else ends
            // its run on a server, and a lapsed lease would let a retry
            // run it a second time alongside.
            let engine = Engine::builder(DynamoDbStore::new(client, table))
                .heartbeat(true)
                .build();
            let layer = idempotency(engine);
            (app(layer.clone()), layer.in_flight())
        }
        Err(_) => {
            eprintln!("IDEMPOTENCY_TABLE is not set: records are kept in this process's memory");
            let layer = idempotency(Engine::builder(MemoryStore::new()).heartbeat(true).build());
            (app(layer.clone()), layer.in_flight())
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    eprintln!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    // Requests whose clients left are still charging: let them complete
    // their records, within ECS's 30 s stop timeout.
    if !in_flight.wait(Duration::from_secs(25)).await {
        eprintln!(
            "{} idempotent requests still running at exit; their keys wait out their lease",
            in_flight.len()
        );
    }
    Ok(())
}
