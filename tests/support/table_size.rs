//! What the table-size tests of every store share: records written
//! through the engine, one key each.

use lambda_idempotency::{store::Store, Attempt, Engine, Fingerprint};

/// Runs `n` operations under keys of their own, so that the store holds
/// `n` completed records more.
pub async fn complete_records<St: Store>(engine: &Engine<St>, n: usize) {
    for i in 0..n {
        let key = format!("k{i}");
        let attempt = Attempt::new("table-size", &key, Fingerprint::of_bytes(b"{}"));
        engine
            .execute(&attempt, || async { Ok::<_, ()>(i) })
            .await
            .expect("a fresh key runs");
    }
}
