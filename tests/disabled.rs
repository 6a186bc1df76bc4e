//! `IDEMPOTENCY_DISABLED=true` turns the engine off for local tests, and is
//! refused inside Lambda unless forced. One test: it sets the process's
//! environment.

use lambda_idempotency::{
    store::memory::MemoryWrite, Attempt, Engine, Error, Fingerprint, Json, MemoryStore, Mode,
    OutcomeKind,
};
use std::sync::atomic::{AtomicUsize, Ordering};

async fn twice(engine: &Engine<MemoryStore>) -> (usize, OutcomeKind) {
    let runs = AtomicUsize::new(0);
    let attempt = Attempt::new("t", "k", Fingerprint::of_bytes(b"body"));
    let mut last = None;
    for _ in 0..2 {
        let outcome = engine
            .execute(&attempt, || async {
                Ok::<_, std::io::Error>(runs.fetch_add(1, Ordering::SeqCst))
            })
            .await
            .expect("runs");
        last = Some(outcome.kind());
    }
    (runs.load(Ordering::SeqCst), last.expect("ran"))
}

#[tokio::test]
async fn the_switch_turns_idempotency_off_outside_lambda_only() {
    std::env::remove_var("AWS_LAMBDA_FUNCTION_NAME");
    std::env::set_var("IDEMPOTENCY_DISABLED", "true");
    let store = MemoryStore::new();
    let off = Engine::builder(store.clone()).key_prefix("p").build();
    assert_eq!(twice(&off).await, (2, OutcomeKind::Disabled), "both ran");
    assert!(
        off.inspect("t", "k").await.expect("read").is_none(),
        "nothing stored"
    );
    // An operation whose effects are writes committed with its record: it
    // runs, and since nothing is recorded its writes are not committed,
    // which the caller is told.
    let with_writes = off
        .run(
            &Attempt::new("t", "w", Fingerprint::of_bytes(b"body")),
            Mode::Transactional,
            &Json,
            |_| async { Ok::<_, std::io::Error>((1u8, vec![MemoryWrite::put("charge", "ch_1")])) },
        )
        .await;
    assert!(
        matches!(with_writes, Err(Error::WritesNotCommitted(_))),
        "{with_writes:?}"
    );
    assert_eq!(store.item("charge"), None);
    // A step (recovery points) just runs, each time, unrecorded: there is
    // no claim to record it on (docs/recovery-points.md).
    let stepped = off
        .run(
            &Attempt::new("t", "s", Fingerprint::of_bytes(b"body")),
            Mode::Plain,
            &Json,
            |claim| async move {
                assert!(!claim.is_claimed());
                assert_eq!(claim.step_key("charge"), None);
                let first = claim.step("charge", || async { Ok::<_, ()>(1u8) }).await?;
                let again = claim.step("charge", || async { Ok::<_, ()>(2u8) }).await?;
                Ok::<_, Error<()>>(((first, again), Vec::<MemoryWrite>::new()))
            },
        )
        .await
        .expect("runs");
    assert_eq!(stepped.kind(), OutcomeKind::Disabled);
    assert_eq!(stepped.into_value(), (1, 2), "each step ran, none recorded");

    // Inside Lambda the switch is refused: idempotency stays on.
    std::env::set_var("AWS_LAMBDA_FUNCTION_NAME", "charges");
    let on = Engine::builder(MemoryStore::new()).key_prefix("p").build();
    assert_eq!(twice(&on).await, (1, OutcomeKind::Replay));

    // Unless forced.
    std::env::set_var("IDEMPOTENCY_DISABLED_IN_LAMBDA", "true");
    let forced = Engine::builder(MemoryStore::new()).key_prefix("p").build();
    assert_eq!(twice(&forced).await, (2, OutcomeKind::Disabled));
}
