//! The layer's answers reach the engine's observers through the HTTP
//! port: one for each request that reached the engine.

use super::*;
use crate::{observe::Port, testing::RecordingObserver};

#[tokio::test]
async fn each_request_is_reported_through_the_http_port() {
    let observer = RecordingObserver::default();
    let engine = Engine::builder(MemoryStore::new())
        .observer(observer.clone())
        .build();
    let mut service = IdempotencyLayer::new(engine)
        .shared_scope()
        .layer(Echo::new());
    send(&mut service, post(Some("k1"), "{}")).await;
    send(&mut service, post(Some("k1"), "{}")).await;
    send(&mut service, post(Some("k1"), r#"{"other":1}"#)).await;
    assert_eq!(
        observer.answers_through(Port::Http),
        ["fresh", "replay", "key_reused"]
    );
    assert_eq!(observer.answers().len(), 3, "{:?}", observer.answers());
}

/// Issue 58 part 1, outside review: a duplicate that waits for another
/// process's run (`wait_for_result`) is one HTTP request, and the module
/// docs promise one answer per attempt (the dedup rate is replays over all
/// answers). The layer's wait loop calls the engine again after each
/// backoff, and every call reports: one request, several `in_progress`
/// answers and then its `replay`.
#[tokio::test]
async fn a_duplicate_that_waits_for_another_process_is_reported_once() {
    let store = MemoryStore::new();
    // The first "process": its handler takes 600 ms.
    let slow = Echo {
        runs: Arc::default(),
        delay: Duration::from_millis(600),
    };
    let mut first = IdempotencyLayer::new(Engine::builder(store.clone()).build())
        .shared_scope()
        .layer(slow.clone());
    // The second "process", observed, waiting up to 5 s for the result.
    let observer = RecordingObserver::default();
    let mut second = IdempotencyLayer::new(
        Engine::builder(store.clone())
            .observer(observer.clone())
            .build(),
    )
    .shared_scope()
    .wait_for_result(Duration::from_secs(5))
    .layer(Echo::new());
    let running = tokio::spawn(async move { send(&mut first, post(Some("k1"), "{}")).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let duplicate = send(&mut second, post(Some("k1"), "{}")).await;
    running.await.unwrap();
    assert_eq!(duplicate.headers()[REPLAYED_HEADER], "true");
    assert_eq!(slow.runs(), 1);
    assert_eq!(
        observer.answers_through(Port::Http),
        ["replay"],
        "one HTTP request, one answer"
    );
}
