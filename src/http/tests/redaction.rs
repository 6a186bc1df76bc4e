//! What a record keeps when the layer redacts or withholds bodies: the
//! first caller gets the whole response, every retry (from the store, the
//! cache, or waiting on the run in this process) what was stored, marked
//! replayed, and the record never holds what was taken out.

use super::*;
use crate::{JsonPointer, JsonRedaction};
use base64::Engine as _;
use sha2::{Digest, Sha256};

const SECRET: &str = "pi_1_secret_Xq9";
const CARD: &str = "4242424242424242";

/// A charge with a one-time secret and a card number, as `content_type`,
/// after `delay`; counts its runs.
fn charges(
    runs: &Arc<AtomicUsize>,
    content_type: &'static str,
    delay: Duration,
) -> impl Service<Request, Response = Response<Body>, Error = BoxError, Future: Send> + Clone {
    let runs = Arc::clone(runs);
    service_fn(move |_: Request| {
        let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            tokio::time::sleep(delay).await;
            let body = format!(
                r#"{{"id":"ch_{run}","client_secret":"{SECRET}","card":{{"number":"{CARD}","exp":"12/30"}}}}"#
            );
            Ok::<_, BoxError>(
                Response::builder()
                    .status(StatusCode::CREATED)
                    .header(header::CONTENT_TYPE, content_type)
                    .header(header::LOCATION, format!("/v1/charges/ch_{run}"))
                    .body(Body::from(body))?,
            )
        }
    })
}

fn redaction() -> JsonRedaction {
    JsonRedaction::new()
        .remove(JsonPointer::new("/client_secret").unwrap())
        .replace(
            JsonPointer::new("/card/number").unwrap(),
            "************4242",
        )
}

fn json(response: &Response<Body>) -> serde_json::Value {
    serde_json::from_str(text(response)).expect("json")
}

/// No record of `store` holds `secret`, in any form the store keeps.
fn never_stored(store: &MemoryStore, secret: &str) {
    let records = store.records();
    assert!(!records.is_empty());
    for record in records {
        let response = record.response.expect("completed");
        assert!(
            !response
                .windows(secret.len())
                .any(|w| w == secret.as_bytes()),
            "the record holds {secret}"
        );
    }
}

fn digest_of(body: &str) -> String {
    format!(
        "sha-256=:{}:",
        base64::engine::general_purpose::STANDARD.encode(Sha256::digest(body.as_bytes()))
    )
}

#[tokio::test]
async fn the_first_caller_gets_the_whole_response_and_retries_the_redacted_one() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut service = IdempotencyLayer::new(Engine::builder(store.clone()).build())
        .shared_scope()
        .redact_json(redaction())
        .layer(charges(&runs, "application/json", Duration::ZERO));
    let first = send(&mut service, post(Some("k1"), "{}")).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(json(&first)["client_secret"], SECRET);
    assert_eq!(json(&first)["card"]["number"], CARD);
    never_stored(&store, SECRET);
    never_stored(&store, CARD);

    for _ in 0..2 {
        let replay = send(&mut service, post(Some("k1"), "{}")).await;
        assert_eq!(replay.status(), StatusCode::CREATED);
        assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
        assert_eq!(replay.headers()[header::LOCATION], "/v1/charges/ch_1");
        assert_eq!(
            json(&replay),
            serde_json::json!({ "id": "ch_1", "card": { "number": "************4242", "exp": "12/30" } })
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The local cache keeps what was stored, not what the first caller got.
#[tokio::test]
async fn a_replay_from_the_local_cache_is_redacted_too() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut service = IdempotencyLayer::new(Engine::builder(store.clone()).cache(16).build())
        .shared_scope()
        .redact_json(redaction())
        .layer(charges(&runs, "application/json", Duration::ZERO));
    send(&mut service, post(Some("k1"), "{}")).await;
    // The store's copy gone, a replay can come from the cache only.
    for record in store.records() {
        let removed = crate::store::Store::remove(&store, &record.id, crate::store::Removal::Any)
            .await
            .unwrap();
        assert!(matches!(removed, crate::store::Conditional::Applied));
    }
    let replay = send(&mut service, post(Some("k1"), "{}")).await;
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert!(
        json(&replay).get("client_secret").is_none(),
        "{}",
        text(&replay)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A duplicate that waits on the run in this process gets its result in
/// memory, without a store read: the stored form all the same.
#[tokio::test]
async fn a_duplicate_waiting_in_the_same_process_gets_the_redacted_response() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let service = IdempotencyLayer::new(Engine::builder(store.clone()).build())
        .shared_scope()
        .redact_json(redaction())
        .wait_for_result(Duration::from_secs(30))
        .layer(charges(
            &runs,
            "application/json",
            Duration::from_millis(300),
        ));
    let (first, duplicate) = tokio::join!(service.clone().oneshot(post(Some("k1"), "{}")), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        service.clone().oneshot(post(Some("k1"), "{}")).await
    });
    let (first, duplicate) = (first.unwrap(), duplicate.unwrap());
    assert_eq!(json(&first)["client_secret"], SECRET);
    assert_eq!(duplicate.headers()[REPLAYED_HEADER], "true");
    assert!(
        json(&duplicate).get("client_secret").is_none(),
        "{}",
        text(&duplicate)
    );
    assert_eq!(json(&duplicate)["card"]["number"], "************4242");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn withheld_bodies_replay_the_status_headers_and_the_digest() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut service = IdempotencyLayer::new(Engine::builder(store.clone()).build())
        .shared_scope()
        .withhold_bodies()
        .layer(charges(&runs, "application/json", Duration::ZERO));
    let first = send(&mut service, post(Some("k1"), "{}")).await;
    assert_eq!(json(&first)["client_secret"], SECRET);
    never_stored(&store, SECRET);
    never_stored(&store, "ch_1\"");
    // What an operator's tool reads from the record: the head, and why
    // with the digest.
    let record = store.records().pop().expect("one record");
    let decoded =
        crate::http::decode_stored_response(&record.response.expect("completed")).expect("decodes");
    let not_stored = decoded
        .extensions()
        .get::<crate::http::BodyNotStored>()
        .expect("says why");
    assert_eq!(not_stored.repr_digest(), Some(digest_of(text(&first))));

    let replay = send(&mut service, post(Some("k1"), "{}")).await;
    assert_eq!(replay.status(), StatusCode::CREATED, "the original status");
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert_eq!(replay.headers()[header::LOCATION], "/v1/charges/ch_1");
    let problem = problem(&replay);
    assert_eq!(
        problem["type"],
        "urn:lambda-idempotency:problem:idempotency-response-not-stored"
    );
    assert_eq!(problem["response_digest"], digest_of(text(&first)));
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("does not keep"),
        "{problem}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A body the JSON redaction cannot read, and a hook that fails, keep no
/// body at all: never the unredacted one.
#[tokio::test]
async fn a_response_that_cannot_be_redacted_is_withheld_never_stored_whole() {
    for (name, content_type, hook) in [
        ("not JSON", "text/plain", None),
        ("a JSON suffix, not JSON", "application/vnd.api+json", None),
        ("a failing hook", "application/json", Some(false)),
        ("a panicking hook", "application/json", Some(true)),
    ] {
        let store = MemoryStore::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let layer = IdempotencyLayer::new(Engine::builder(store.clone()).build()).shared_scope();
        let layer = match hook {
            Some(false) => layer.redact(|_| Err("no".into())),
            Some(true) => layer.redact(|_| panic!("the hook panicked")),
            None => layer.redact_json(redaction()),
        };
        let respond = {
            let runs = Arc::clone(&runs);
            service_fn(move |_: Request| {
                runs.fetch_add(1, Ordering::SeqCst);
                async move {
                    // Valid JSON for the hook case; not JSON otherwise.
                    let body = if hook.is_some() {
                        format!(r#"{{"client_secret":"{SECRET}"}}"#)
                    } else {
                        format!("client_secret={SECRET}")
                    };
                    Ok::<_, BoxError>(
                        Response::builder()
                            .status(StatusCode::CREATED)
                            .header(header::CONTENT_TYPE, content_type)
                            .body(Body::from(body))?,
                    )
                }
            })
        };
        let mut service = layer.layer(respond);
        let first = send(&mut service, post(Some("k1"), "{}")).await;
        assert!(
            text(&first).contains(SECRET),
            "{name}: the first caller gets it"
        );
        never_stored(&store, SECRET);
        let replay = send(&mut service, post(Some("k1"), "{}")).await;
        assert_eq!(replay.status(), StatusCode::CREATED, "{name}");
        assert_eq!(
            problem(&replay)["response_digest"],
            digest_of(text(&first)),
            "{name}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");
    }
}

/// Redaction runs before sealing: the sealed record holds the redacted
/// response, and the replay opens to it.
#[cfg(feature = "encryption")]
#[tokio::test]
async fn an_encrypted_record_holds_the_redacted_response() {
    use crate::encryption::{Encryption, RawKeys};
    let keys = RawKeys::new("k1", &[1; 32]).unwrap();
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder(store.clone())
        .encryption(Encryption::new(keys.clone(), "test"))
        .build();
    let mut service = IdempotencyLayer::new(engine)
        .shared_scope()
        .redact_json(redaction())
        .layer(charges(&runs, "application/json", Duration::ZERO));
    send(&mut service, post(Some("k1"), "{}")).await;
    let record = store.records().pop().unwrap();
    let opened = Encryption::new(keys, "test")
        .open_response(&record)
        .await
        .unwrap()
        .unwrap();
    assert!(!opened.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()));
    let replay = send(&mut service, post(Some("k1"), "{}")).await;
    assert!(json(&replay).get("client_secret").is_none());
    assert_eq!(json(&replay)["id"], "ch_1");
}

/// Outside review: `redact`'s docs say the record holds "what the hook
/// left" of the response (its status, headers and body), and its own
/// example removes a header. A response that passes through unread (a
/// `text/event-stream`, a `StreamResponse`) or that is longer than a record
/// holds and streams on (a hyper/axum body whose size hint is past the
/// limit; a gRPC server-streaming call) is recorded as its head only, and
/// that head is written from the original response
/// (`recording.rs::passed_through`, `teed_record.rs`): the hook never runs,
/// so a header it removes is stored. Here: `text/event-stream`. For gRPC, where every metadata entry but cookies is stored, this
/// needs no `stored_headers` setting at all (a server-streaming call).
#[tokio::test]
async fn a_streamed_or_too_large_response_s_head_goes_through_the_hook_too() {
    const URL: &str = "https://dl.example/once?sig=s3cr3t_sig";
    let download = HeaderName::from_static("x-download-url");
    let mut rng = fastrand::Rng::with_seed(7);
    let noise: Vec<u8> = std::iter::repeat_with(|| rng.u8(..))
        .take(64 * 1024)
        .collect();
    for (name, content_type, body) in [
        (
            "a server-sent event stream",
            "text/event-stream",
            Body::from("data: 1\n\n"),
        ),
        // A lambda_http body too large to store is read whole and goes
        // through the hook (that held); an axum body whose size hint is
        // past the limit streams on, as here.
        (
            "a body too large to store",
            "application/octet-stream",
            Body::Binary(noise),
        ),
    ] {
        let store = MemoryStore::new();
        let mut service = IdempotencyLayer::new(Engine::builder(store.clone()).build())
            .shared_scope()
            .stored_headers([header::LOCATION, download.clone()])
            .max_stored_response(8 * 1024)
            .redact(|response| {
                response.headers_mut().remove("x-download-url");
                Ok(())
            })
            .layer(service_fn(move |_: Request| {
                let body = body.clone();
                async move {
                    Ok::<_, BoxError>(
                        Response::builder()
                            .status(StatusCode::CREATED)
                            .header(header::CONTENT_TYPE, content_type)
                            .header(header::LOCATION, "/v1/exports/e_1")
                            .header("x-download-url", URL)
                            .body(body)?,
                    )
                }
            }));
        let first = send(&mut service, post(Some("k1"), "{}")).await;
        assert_eq!(first.headers()["x-download-url"], URL, "{name}");
        never_stored(&store, "s3cr3t_sig");
        let replay = send(&mut service, post(Some("k1"), "{}")).await;
        assert!(replay.headers().get("x-download-url").is_none(), "{name}");
    }
}

/// Outside review: the body is read into a `serde_json::Value`, whose
/// integers are 64 bits: one past that (an amount in minor units of a
/// high-precision ledger, a 128-bit id written as a number) would be
/// written again as a rounded float, and every retry told another value
/// for a field nobody asked to redact. Such a body is withheld instead
/// (its status and digest), as any body the redaction cannot read.
#[tokio::test]
async fn redact_json_keeps_the_numbers_it_does_not_name() {
    let store = MemoryStore::new();
    let body = r#"{"id":"ch_1","client_secret":"s","amount":18446744073709551617,"ledger":-9223372036854775809}"#;
    let mut service = IdempotencyLayer::new(Engine::builder(store.clone()).build())
        .shared_scope()
        .redact_json(redaction())
        .layer(service_fn(move |_: Request| async move {
            Ok::<_, BoxError>(
                Response::builder()
                    .status(StatusCode::CREATED)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(body))?,
            )
        }));
    let first = send(&mut service, post(Some("k1"), "{}")).await;
    assert_eq!(text(&first), body);
    let replay = send(&mut service, post(Some("k1"), "{}")).await;
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert!(
        !text(&replay).contains("e+"),
        "never rounded: {}",
        text(&replay)
    );
    assert_eq!(problem(&replay)["response_digest"], digest_of(body));
    never_stored(&store, "client_secret");
}
