//! An actix-web server outside Lambda: the idempotency middleware behind an
//! authentication middleware that names the caller of each key. At
//! shutdown (Ctrl-C; add SIGTERM as `axum_server` does) it stops accepting connections, waits for
//! the claimed requests to finish (their work runs on actix's workers,
//! which stop with the server), then stops.
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! lambda-idempotency = { version = "0.1", default-features = false, features = ["dynamodb", "actix"] }
//! actix-web = "4"
//! aws-config = { version = "1", features = ["behavior-version-latest"] }
//! aws-sdk-dynamodb = "1"
//! serde_json = "1"
//! tokio = { version = "1", features = ["signal"] }
//! ```
//!
//! `IDEMPOTENCY_TABLE=idempotency cargo run --example actix_server --features actix`, then
//!
//! ```sh
//! curl -i localhost:3000/v1/charges -H 'authorization: Bearer alice-token' \
//!   -H 'idempotency-key: 8e03978e' -H 'content-type: application/json' -d '{"amount":1250}'
//! ```
//!
//! Without `IDEMPOTENCY_TABLE` it keeps records in memory (one process).

use actix_web::{
    dev::{Service, ServiceRequest},
    web, App, HttpMessage, HttpResponse, HttpServer,
};
use lambda_idempotency::{
    http::{actix::Idempotency, IdempotencyLayer},
    store::Store,
    DynamoDbStore, Engine, MemoryStore,
};
use serde_json::{json, Value};
use std::time::Duration;

/// The verified caller, as the authentication middleware leaves it in the
/// request's extensions.
#[derive(Clone, Debug)]
struct Principal(String);

/// Stands in for real token verification: a bearer token names the caller.
fn principal(request: &ServiceRequest) -> Option<Principal> {
    let token = request
        .headers()
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?;
    match token {
        "alice-token" => Some(Principal("alice".into())),
        "bob-token" => Some(Principal("bob".into())),
        _ => None,
    }
}

async fn create_charge(body: web::Json<Value>) -> HttpResponse {
    // Charge here: this runs once per caller and key.
    HttpResponse::Created().json(json!({ "amount": body["amount"] }))
}

fn idempotency<St: Store>(engine: Engine<St>) -> Idempotency<St> {
    // The caller only: the middleware adds the route (actix's route
    // template), and the path stays in the fingerprint. `None` (no
    // principal: authentication did not run first) is refused with a 500
    // rather than shared as one anonymous caller.
    Idempotency::new(IdempotencyLayer::new(engine)).caller(|request: &ServiceRequest| {
        request
            .extensions()
            .get::<Principal>()
            .map(|caller| caller.0.clone())
    })
}

async fn serve<St: Store>(idempotency: Idempotency<St>) -> std::io::Result<()> {
    let in_flight = idempotency.in_flight();
    let server = HttpServer::new(move || {
        App::new()
            .service(
                web::scope("/v1")
                    .wrap(idempotency.clone())
                    .route("/charges", web::post().to(create_charge)),
            )
            // Registered last, so it runs first: the caller is known to
            // the idempotency middleware.
            .wrap_fn(|request, service| {
                let principal = principal(&request);
                let authenticated = principal.is_some();
                if let Some(principal) = principal {
                    request.extensions_mut().insert(principal);
                }
                let response = (authenticated).then(|| service.call(request));
                async move {
                    match response {
                        Some(response) => response.await,
                        None => Err(actix_web::error::ErrorUnauthorized("who are you?")),
                    }
                }
            })
    })
    .disable_signals()
    .bind(("127.0.0.1", 3000))?
    .run();
    let handle = server.handle();
    eprintln!("listening on http://127.0.0.1:3000");
    actix_web::rt::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        // No new connections; requests whose clients left are still
        // charging: let them complete their records before the workers stop.
        handle.pause().await;
        if !in_flight.wait(Duration::from_secs(25)).await {
            eprintln!(
                "{} idempotent requests still running at exit; their keys wait out their lease",
                in_flight.len()
            );
        }
        handle.stop(true).await;
    });
    server.await
}

fn main() -> std::io::Result<()> {
    actix_web::rt::System::new().block_on(async {
        match std::env::var("IDEMPOTENCY_TABLE") {
            Ok(table) => {
                let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
                let client = aws_sdk_dynamodb::Client::new(&config);
                // The heartbeat keeps a long handler's claim.
                let engine = Engine::builder(DynamoDbStore::new(client, table))
                    .heartbeat(true)
                    .build();
                serve(idempotency(engine)).await
            }
            Err(_) => {
                eprintln!(
                    "IDEMPOTENCY_TABLE is not set: records are kept in this process's memory"
                );
                serve(idempotency(
                    Engine::builder(MemoryStore::new()).heartbeat(true).build(),
                ))
                .await
            }
        }
    })
}
