//! `examples/postgres_balance.rs` on the sqlx store: an axum server whose
//! handler runs **inside the PostgreSQL transaction** that claims its
//! idempotency key, with sqlx queries: it locks the account
//! (`SELECT … FOR UPDATE`), checks the balance, debits it and records the
//! payment; the completed idempotency record commits with them, or nothing
//! does. A balance too low is a 422 problem the application chose, stored
//! and replayed to every retry, never a 500.
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! lambda-idempotency = { version = "0.1", default-features = false, features = ["sqlx-postgres", "http", "axum"] }
//! sqlx = { version = "0.8", default-features = false, features = ["runtime-tokio", "postgres"] }
//! axum = { version = "0.8", default-features = false, features = ["json", "tokio", "http1"] }
//! serde_json = "1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! It needs a PostgreSQL server:
//! `IDEMPOTENCY_STORE_URL=postgres://postgres@127.0.0.1:5432/postgres cargo run --example sqlx_balance --features sqlx-postgres,axum`
//! (or `scripts/with-postgres sh -c 'IDEMPOTENCY_STORE_URL=$IDEMPOTENCY_TEST_POSTGRES_URL cargo run --example sqlx_balance --features sqlx-postgres,axum'`), then
//!
//! ```sh
//! curl -i localhost:3000/v1/accounts/acct_1/payments -H 'idempotency-key: 8e03978e' -d '{"amount":1250}'
//! ```

use axum::{
    extract::{Extension, Path},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::post,
    Json, Router,
};
use lambda_idempotency::{
    http::IdempotencyLayer,
    store::sqlx::postgres::{
        sqlx::{self, postgres::PgPoolOptions, PgConnection},
        RefusalRules, SqlxPgTransaction, SqlxPostgresStore, TransactionLimits,
    },
    Engine,
};
use serde_json::{json, Value};
use std::time::Duration;

/// A problem+json answer (RFC 9457) of the application's own.
fn problem(status: StatusCode, kind: &str, detail: &str) -> Response {
    let body = json!({ "type": kind, "title": detail, "status": status.as_u16() });
    (
        status,
        [("content-type", "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

/// The application's own database function: it takes any connection, so
/// it runs inside the idempotency transaction as it would anywhere else.
/// `persistent(false)`: unnamed statements, which PgBouncer in transaction
/// mode (before 1.21) and RDS Proxy keep within the transaction.
async fn debit(
    connection: &mut PgConnection,
    account: &str,
    amount: i64,
) -> Result<i64, sqlx::Error> {
    sqlx::query("UPDATE accounts SET balance = balance - $2 WHERE id = $1")
        .bind(account)
        .bind(amount)
        .persistent(false)
        .execute(&mut *connection)
        .await?;
    sqlx::query_scalar("INSERT INTO payments (account, amount) VALUES ($1, $2) RETURNING id")
        .bind(account)
        .bind(amount)
        .persistent(false)
        .fetch_one(&mut *connection)
        .await
}

/// The handler: every query goes through `tx`, the transaction that holds
/// the key's claim.
async fn pay(
    Extension(tx): Extension<SqlxPgTransaction>,
    Extension(rules): Extension<RefusalRules>,
    Path(account): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    let Some(amount) = body
        .get("amount")
        .and_then(Value::as_i64)
        .filter(|a| *a > 0)
    else {
        return problem(
            StatusCode::BAD_REQUEST,
            "invalid-amount",
            "amount must be a positive integer",
        );
    };
    let mut connection = tx.lock().await;
    let balance: Option<i64> =
        match sqlx::query_scalar("SELECT balance FROM accounts WHERE id = $1 FOR UPDATE")
            .bind(&account)
            .persistent(false)
            .fetch_optional(&mut *connection)
            .await
        {
            Ok(balance) => balance,
            Err(error) => {
                return problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "database",
                    &error.to_string(),
                )
            }
        };
    let Some(balance) = balance else {
        return problem(StatusCode::NOT_FOUND, "no-such-account", "no such account");
    };
    // The application's own check: a stored 422, without any write.
    if balance < amount {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "insufficient-funds",
            "the balance is lower than the amount",
        );
    }
    match debit(&mut connection, &account, amount).await {
        Ok(id) => (
            StatusCode::CREATED,
            Json(json!({ "payment": id, "balance": balance - amount })),
        )
            .into_response(),
        // The constraint's refusal (a concurrent change the check could
        // not see, a rule kept in the schema): the layer rolls the writes
        // back and stores this 422.
        Err(error) if rules.refusal(&error).is_some() => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "insufficient-funds",
            "the balance would go below zero",
        ),
        // Anything else: a 500, which the layer rolls back and does not
        // store; a retry runs again.
        Err(error) => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "database",
            &error.to_string(),
        ),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("IDEMPOTENCY_STORE_URL")
        .map_err(|_| "set IDEMPOTENCY_STORE_URL=postgres://user@host:port/database")?;
    // The application's pool: its own queries and the store's share it.
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url)
        .await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS accounts (id text PRIMARY KEY, balance bigint NOT NULL \
           CONSTRAINT accounts_balance_not_negative CHECK (balance >= 0)); \
         CREATE TABLE IF NOT EXISTS payments (id bigserial PRIMARY KEY, account text NOT NULL, \
           amount bigint NOT NULL); \
         INSERT INTO accounts VALUES ('acct_1', 5000) ON CONFLICT DO NOTHING",
    )
    .execute(&pool)
    .await?;
    let store = SqlxPostgresStore::new(pool, "idempotency")?;
    store.create_table().await?;

    let engine = Engine::builder(store).build();
    let layer = IdempotencyLayer::new(engine)
        // One tenant; with authentication, name the caller instead
        // (IdempotencyLayer::caller).
        .shared_scope()
        .in_transaction(
            TransactionLimits::new()
                .claim_wait(Duration::from_millis(100))
                .time_limit(Duration::from_secs(5)),
        );
    let app = Router::new()
        .route("/v1/accounts/{account}/payments", post(pay))
        .layer(layer)
        .layer(Extension(
            RefusalRules::new().constraint("accounts_balance_not_negative"),
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://127.0.0.1:3000");
    axum::serve(listener, app).await?;
    Ok(())
}
