//! One event through `IdempotentEventLayer`: replays, failures, panics,
//! keys and fingerprints.

use super::*;

#[tokio::test]
async fn a_redelivered_event_replays_the_result() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer().layer(counting_handler(&runs));
    let first = service.clone().oneshot(order("o-1", 10)).await.unwrap();
    let again = service.clone().oneshot(order("o-1", 10)).await.unwrap();
    assert_eq!(first, "invoice 1 for o-1");
    assert_eq!(again, first);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let mismatch = service
        .clone()
        .oneshot(order("o-1", 11))
        .await
        .expect_err("other payload");
    assert!(
        mismatch.to_string().contains("different payload"),
        "{mismatch}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_failed_event_is_released_and_runs_again() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer().layer(counting_handler(&runs));
    let error = service
        .clone()
        .oneshot(order("o-2", 0))
        .await
        .expect_err("handler error");
    assert_eq!(error.to_string(), "empty order");
    let _ = service.clone().oneshot(order("o-2", 0)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2, "released, so it ran again");
}

/// Issue 21, item 9: an event whose handler panics releases its claim; the
/// panic goes on to the runtime (which fails the invocation), and Lambda's
/// async retry runs the event again at once instead of being told "in
/// progress" until the dead invocation's lease passes.
#[tokio::test]
async fn a_panicking_event_releases_its_claim() {
    use futures_util::FutureExt;
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = Arc::clone(&runs);
        service_fn(move |event: LambdaEvent<Order>| {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                assert!(run > 1, "the handler panicked on its first run");
                Ok::<_, BoxError>(format!("invoice {run} for {}", event.payload.order_id))
            }
        })
    };
    let service = layer().layer(handler);
    let panic = std::panic::AssertUnwindSafe(service.clone().oneshot(order("o-9", 10)))
        .catch_unwind()
        .await
        .expect_err("the panic reaches the runtime");
    assert!(crate::engine::panic_message(&*panic).contains("panicked on its first run"));
    let retried = service
        .clone()
        .oneshot(order("o-9", 10))
        .await
        .expect("the retry runs at once");
    assert_eq!(retried, "invoice 2 for o-9");
}

#[tokio::test]
async fn events_without_a_key_are_refused_unless_optional() {
    let runs = Arc::new(AtomicUsize::new(0));
    let keyless = IdempotentEventLayer::new(Engine::builder(MemoryStore::new()).build(), "orders")
        .key(|_: &Order| None);
    let error = keyless
        .clone()
        .layer(counting_handler(&runs))
        .oneshot(order("o", 1))
        .await
        .expect_err("no key");
    assert!(error.to_string().contains("no idempotency key"), "{error}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let optional = keyless.require_key(false).layer(counting_handler(&runs));
    optional.clone().oneshot(order("o", 1)).await.unwrap();
    optional.clone().oneshot(order("o", 1)).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_fingerprint_closure_decides_what_counts_as_the_same_event() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer()
        .fingerprint(|order: &Order| Fingerprint::of_bytes(order.order_id.as_bytes()))
        .layer(counting_handler(&runs));
    service.clone().oneshot(order("o-3", 10)).await.unwrap();
    // Only the id is fingerprinted: another total is the same event.
    service.clone().oneshot(order("o-3", 99)).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Issue 10, item 8: the default fingerprint of an event beyond 64 bits
/// was the hash of a serialisation error message, shared by every such event,
/// so a second transfer with another amount was served the first's result.
#[tokio::test]
async fn wide_numbers_are_fingerprinted_and_unserialisable_events_refused() {
    #[derive(Serialize)]
    struct Transfer {
        id: &'static str,
        amount: u128,
        labels: HashMap<Vec<u8>, u8>,
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let service = IdempotentEventLayer::new(Engine::builder(MemoryStore::new()).build(), "t")
        .key(|transfer: &Transfer| Some(transfer.id.to_owned()))
        .layer(service_fn(move |event: LambdaEvent<Transfer>| {
            counter.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok::<_, BoxError>(event.payload.amount.to_string()))
        }));
    let transfer = |id, amount, labels: &[(&[u8], u8)]| {
        LambdaEvent::new(
            Transfer {
                id,
                amount,
                labels: labels.iter().map(|(k, v)| (k.to_vec(), *v)).collect(),
            },
            Context::default(),
        )
    };
    let first = service
        .clone()
        .oneshot(transfer("t-1", u128::MAX, &[]))
        .await
        .unwrap();
    assert_eq!(first, u128::MAX.to_string());
    let other = service
        .clone()
        .oneshot(transfer("t-1", u128::MAX - 1, &[]))
        .await
        .unwrap_err()
        .to_string();
    assert!(other.contains("different payload"), "{other}");
    // A map keyed by bytes has no JSON form: refused, and nothing ran.
    let refused = service
        .clone()
        .oneshot(transfer("t-2", 1, &[(b"k", 1)]))
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("cannot be serialised"), "{refused}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The event layer's redaction: the first invocation gets the handler's
/// whole output, a retried one the redacted output, and the store never
/// holds what was taken out.
#[tokio::test]
async fn a_redacted_output_is_stored_and_replayed_without_its_secret() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let handler = service_fn(move |event: LambdaEvent<Order>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            Ok::<_, BoxError>(serde_json::json!({
                "invoice": format!("inv_{}", event.payload.order_id),
                "download_token": "tok_once_8c1f",
            }))
        }
    });
    let service = IdempotentEventLayer::new(Engine::builder(store.clone()).build(), "orders")
        .key(|order: &Order| Some(order.order_id.clone()))
        .redact_json(
            crate::JsonRedaction::new().remove(crate::JsonPointer::new("/download_token").unwrap()),
        )
        .layer(handler);
    let first = service.clone().oneshot(order("o-9", 10)).await.unwrap();
    assert_eq!(first["download_token"], "tok_once_8c1f");
    let again = service.clone().oneshot(order("o-9", 10)).await.unwrap();
    assert_eq!(again, serde_json::json!({ "invoice": "inv_o-9" }));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let stored = store.records().pop().unwrap().response.unwrap();
    assert!(!String::from_utf8_lossy(&stored).contains("tok_once"));
}

/// Each event's answer reaches the engine's observers through the event
/// port.
#[tokio::test]
async fn each_event_is_reported_through_the_event_port() {
    let observer = crate::testing::RecordingObserver::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder(MemoryStore::new())
        .observer(observer.clone())
        .build();
    let service = IdempotentEventLayer::new(engine, "orders")
        .key(|order: &Order| Some(order.order_id.clone()))
        .layer(counting_handler(&runs));
    service.clone().oneshot(order("o-1", 10)).await.unwrap();
    service.clone().oneshot(order("o-1", 10)).await.unwrap();
    let _ = service.clone().oneshot(order("o-2", 0)).await;
    assert_eq!(
        observer.answers_through(crate::observe::Port::Event),
        ["fresh", "replay", "operation_error"]
    );
}
