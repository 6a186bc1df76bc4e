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
