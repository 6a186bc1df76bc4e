//! Issue 10, item 3: two functions sharing one table, with the same route,
//! principal and key, used to share records. The default prefix names the
//! function (its own test binary: it sets a process-wide variable).

use lambda_idempotency::{default_key_prefix, Attempt, Engine, Fingerprint, MemoryStore};
use std::sync::atomic::{AtomicUsize, Ordering};

#[tokio::test]
async fn two_functions_on_one_table_never_share_records() {
    let store = MemoryStore::new();
    let engine_of = |function: &str| {
        std::env::set_var("AWS_LAMBDA_FUNCTION_NAME", function);
        let engine = Engine::builder(store.clone()).build();
        std::env::remove_var("AWS_LAMBDA_FUNCTION_NAME");
        engine
    };
    let charges = engine_of("charges");
    let refunds = engine_of("refunds");
    let outside_lambda = Engine::builder(store.clone()).build();
    assert_eq!(default_key_prefix(), "idempotency");
    assert!(charges
        .record_id("s", "k")
        .as_str()
        .starts_with("idempotency:charges#"));
    assert!(refunds
        .record_id("s", "k")
        .as_str()
        .starts_with("idempotency:refunds#"));
    assert!(outside_lambda
        .record_id("s", "k")
        .as_str()
        .starts_with("idempotency#"));

    let runs = AtomicUsize::new(0);
    let attempt = Attempt::new("POST /v1/orders", "key-1", Fingerprint::of_bytes(b"same"));
    for engine in [&charges, &refunds, &outside_lambda, &charges] {
        engine
            .execute(&attempt, || async {
                Ok::<_, std::convert::Infallible>(runs.fetch_add(1, Ordering::SeqCst))
            })
            .await
            .unwrap();
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "one run per function; the last is a replay"
    );
}
