//! Recovery points on the SQL stores, beyond the kit
//! (`store_conformance!(steps: …)`, values at the edges among them): the
//! `steps` column as the database holds it, and a step inside the store's
//! transaction. Each store's module (`tests/postgres.rs`,
//! `tests/postgres/sqlx.rs`, `tests/postgres/partitioned.rs`,
//! `tests/sql/mysql.rs`) calls these with its store and its raw read.

use base64::Engine as _;
use lambda_idempotency::{
    store::{Claim, OwnerToken, RecordId, Store, TransactionLimits, TransactionalStore},
    testing::scenarios::payload,
    Attempt, ClaimHandle, Engine, Json, Mode,
};
use serde_json::{json, Value};
use std::future::Future;
use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

/// A claim of `id` under `owner`, leased for a minute, kept for an hour.
pub fn claim(id: &RecordId, owner: &str) -> Claim {
    let now_ms = now_ms();
    Claim {
        id: id.clone(),
        owner: OwnerToken::from_stored(owner),
        fingerprint: payload(1),
        lease_until_ms: now_ms + 60_000,
        expiration_s: now_ms / 1000 + 3600,
        now_ms,
        attempt: 1,
        first_started_ms: now_ms,
    }
}

/// While in progress the record's `steps` column holds its steps, a JSON
/// list of `{name, output}` with the output in base64 on one line; a fresh
/// claim's is NULL, and so is a completed record's (nothing reads the
/// steps of a completed record again). `raw` reads the column of a record
/// id as the database holds it, `None` for NULL.
pub async fn steps_live_in_the_row_until_its_completion<St, F, Fut>(store: St, raw: F)
where
    St: Store,
    F: Fn(String) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Option<Value>> + Send,
{
    let engine = Engine::builder(store).build();
    let id = engine.record_id("t", "steps-row").as_str().to_owned();
    let attempt = Attempt::new("t", "steps-row", payload(1));
    // Longer than base64's 76-character lines.
    let long = "x".repeat(100);
    let outcome = engine
        .run(&attempt, Mode::Plain, &Json, |claim| {
            let (raw, id, long) = (raw.clone(), id.clone(), long.clone());
            async move {
                assert_eq!(raw(id.clone()).await, None, "a claim writes no steps");
                claim
                    .step("charge", || async { Ok::<_, ()>("ch_1".to_owned()) })
                    .await?;
                claim.step("ledger", || async { Ok::<_, ()>(long) }).await?;
                let base64 = |json: &str| base64::engine::general_purpose::STANDARD.encode(json);
                assert_eq!(
                    raw(id).await,
                    Some(json!([
                        {"name": "charge", "output": base64("\"ch_1\"")},
                        {"name": "ledger", "output": base64(&format!("\"{}\"", "x".repeat(100)))},
                    ]))
                );
                Ok::<_, lambda_idempotency::Error<()>>((1u8, Vec::new()))
            }
        })
        .await;
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(raw(id).await, None, "the completion drops the steps");
}

/// Inside the store's transaction the claim commits or rolls back with the
/// operation, so there is nothing to resume: a step there just runs, each
/// time, and records nothing (`raw` shows the column NULL).
pub async fn a_step_inside_the_transaction_just_runs<St, F, Fut>(store: St, raw: F)
where
    St: TransactionalStore,
    F: Fn(String) -> Fut,
    Fut: Future<Output = Option<Value>>,
{
    let engine = Engine::builder(store).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let attempt = Attempt::new("t", "steps-in-transaction", payload(1));
    let limits = TransactionLimits::new().time_limit(Duration::from_secs(10));
    let outcome = engine
        .run_in_transaction(&attempt, limits, |_tx| {
            let runs = Arc::clone(&runs);
            async move {
                let claim = ClaimHandle::current().expect("inside the operation");
                let first = claim
                    .step("charge", || async {
                        Ok::<_, ()>(runs.fetch_add(1, Ordering::SeqCst) + 1)
                    })
                    .await;
                // The same name again runs again: nothing was recorded.
                let second = claim
                    .step("charge", || async {
                        Ok::<_, ()>(runs.fetch_add(1, Ordering::SeqCst) + 1)
                    })
                    .await;
                match (first, second) {
                    (Ok(first), Ok(second)) => Ok::<_, ()>((first, second)),
                    other => panic!("{other:?}"),
                }
            }
        })
        .await
        .expect("committed");
    assert_eq!(outcome.into_value(), (1, 2));
    let id = engine.record_id("t", "steps-in-transaction");
    assert_eq!(raw(id.as_str().to_owned()).await, None);
}
