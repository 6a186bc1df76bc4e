//! Encryption on every real store: DynamoDB Local (its own table and the
//! single-table layout), PostgreSQL (tokio-postgres, its partitioned layout
//! too, and sqlx), MySQL and
//! Redis, through the HTTP layer, `Engine::execute` and each store's
//! transactional completions (the single write, the completion with the
//! store's writes, the run inside the store's transaction).
//!
//! Records are sealed through the engine, then changed behind its back
//! with the store's own client: a byte of the response flipped, two
//! records' responses swapped, the status turned back into a lapsed claim,
//! the expiry moved, a record read under another context (as if copied
//! from another table). Every one is refused as the module docs of
//! `lambda_idempotency::encryption` promise: never replayed, the operation
//! not run again, the record left as it is, the HTTP layer's problem type
//! `idempotency-record-unauthentic`, an ERROR log naming the record and the
//! key once. Then the migration (plaintext, on, refusing plaintext, open
//! only, off) and a rotation, on each store.
//!
//! One scenario set ([`encryption_on_store!`]) runs on each store, through
//! a [`Raw`] view of the store's records. Needs the servers `make test`
//! starts: `AWS_ENDPOINT_URL_DYNAMODB`, `IDEMPOTENCY_TEST_POSTGRES_URL`,
//! `IDEMPOTENCY_TEST_MYSQL_URL`, `IDEMPOTENCY_TEST_REDIS_URL` (each store's
//! module needs only its own: `scripts/with-redis cargo test --test
//! encryption_stores redis::`).

mod support;

use lambda_http::{
    http::{self, header},
    Body, Request, Response,
};
use lambda_idempotency::{
    encryption::{key_id_of, Encryption, RawKeys},
    http::IdempotencyLayer,
    store::{Store, TransactionLimits, TransactionalStore},
    Attempt, Engine, Error, ErrorKind, Fingerprint, Json, OutcomeKind,
};
use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};
use tower::{Layer, ServiceExt};

/// The records' id prefix: a listing of the table finds them by it, beside
/// the business items some paths write.
const PREFIX: &str = "enc";
const SCOPE: &str = "charges";
const CONTEXT: &str = "tests/encryption_stores";
const CARD: &str = "4242424242424242";

/// A store's records, read and changed behind the engine's back with the
/// store's own client: what someone with write access to the table can do.
trait Raw: Sized + Send + Sync {
    type St: Store + Clone;

    /// A store over a fresh table (or namespace) of its own.
    async fn fresh() -> Self;
    fn store(&self) -> Self::St;
    /// The ids of every record (starting with [`PREFIX`]).
    async fn ids(&self) -> Vec<String>;
    async fn response(&self, id: &str) -> Vec<u8>;
    async fn set_response(&self, id: &str, response: &[u8]);
    /// Turns the record into a claim: `IN_PROGRESS`, with this lease.
    async fn set_in_progress(&self, id: &str, lease_until_ms: u64);
    async fn expiration_s(&self, id: &str) -> u64;
    async fn set_expiration_s(&self, id: &str, expiration_s: u64);
    /// Everything stored for the record, to tell whether it changed.
    async fn row(&self, id: &str) -> String;
    /// The entry points this store has beyond the HTTP layer and
    /// `Engine::execute`.
    fn transactional_paths() -> &'static [Path];
    /// `key` through one of [`transactional_paths`](Raw::transactional_paths).
    async fn send_transactional(
        &self,
        engine: &Engine<Self::St>,
        path: Path,
        key: &str,
        runs: &AtomicUsize,
    ) -> Answer;
}

/// Where a request enters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// The HTTP layer (lambda_http types), `shared_scope`.
    Http,
    /// `Engine::execute`.
    Execute,
    /// `Engine::execute_transactional`, with a write of the store's.
    Transactional,
    /// `Engine::run_single_write`, with a write of the store's.
    SingleWrite,
    /// `Engine::run_in_transaction`.
    InTransaction,
}

/// What a request got, whatever the entry point.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// The operation ran: its value (or body).
    Ran(String),
    /// A replay of this value (or body).
    Replayed(String),
    /// Refused: the HTTP layer's problem type without its prefix
    /// (`record-unauthentic`), or the engine's error kind
    /// (`unauthentic_record`).
    Refused(String),
}

/// The refusal of a record that fails to open, as `path` answers it.
fn unauthentic(path: Path) -> Answer {
    Answer::Refused(match path {
        Path::Http => "record-unauthentic".into(),
        _ => ErrorKind::UnauthenticRecord.as_str().into(),
    })
}

/// The refusal of a record that does not decode, as `path` answers it.
fn corrupt(path: Path) -> Answer {
    Answer::Refused(match path {
        Path::Http => "record-corrupt".into(),
        _ => ErrorKind::CorruptRecord.as_str().into(),
    })
}

fn keys(id: &str, byte: u8) -> RawKeys {
    RawKeys::new(id, &[byte; 32]).expect("key")
}

fn sealing(keys: RawKeys) -> Encryption {
    Encryption::new(keys, CONTEXT)
}

fn engine<St: Store>(store: St, encryption: Option<Encryption>) -> Engine<St> {
    let builder = Engine::builder(store).key_prefix(PREFIX);
    match encryption {
        Some(encryption) => builder.encryption(encryption).build(),
        None => builder.build(),
    }
}

fn value(run: usize) -> String {
    format!("card {CARD}, run {run}")
}

fn answered<E: std::fmt::Debug>(
    result: Result<lambda_idempotency::Outcome<String>, Error<E>>,
) -> Answer {
    match result {
        Ok(outcome) if outcome.kind() == OutcomeKind::Replay => {
            Answer::Replayed(outcome.into_value())
        }
        Ok(outcome) => Answer::Ran(outcome.into_value()),
        Err(error) => Answer::Refused(error.kind().as_str().into()),
    }
}

fn attempt(key: &str) -> Attempt<'_> {
    Attempt::new(SCOPE, key, Fingerprint::of_bytes(b"1250"))
}

/// `key` through `path`, counting the operation's runs in `runs`.
async fn send<R: Raw>(
    raw: &R,
    engine: &Engine<R::St>,
    path: Path,
    key: &str,
    runs: &AtomicUsize,
) -> Answer {
    match path {
        Path::Http => http(engine, key, runs).await,
        Path::Execute => answered(
            engine
                .execute(&attempt(key), || async {
                    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    Ok::<_, Infallible>(value(run))
                })
                .await,
        ),
        path => raw.send_transactional(engine, path, key, runs).await,
    }
}

/// A POST through the HTTP layer to a handler that answers 201 with a card.
async fn http<St: Store>(engine: &Engine<St>, key: &str, runs: &AtomicUsize) -> Answer {
    let runs_here = Arc::new(AtomicUsize::new(runs.load(Ordering::SeqCst)));
    let counted = Arc::clone(&runs_here);
    let handler = tower::service_fn(move |_: Request| {
        let run = counted.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            Response::builder()
                .status(201)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::Text(format!(r#"{{"card":"{CARD}","run":{run}}}"#)))
                .map_err(lambda_http::Error::from)
        }
    });
    let service = IdempotencyLayer::new(engine.clone())
        .shared_scope()
        .layer(handler);
    let request = http::Request::post("/v1/charges")
        .header("idempotency-key", key)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::Text(r#"{"amount":1250}"#.into()))
        .expect("request");
    let response = service.oneshot(request).await.expect("answered");
    runs.store(runs_here.load(Ordering::SeqCst), Ordering::SeqCst);
    let body = match response.body() {
        Body::Text(text) => text.clone(),
        Body::Binary(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        _ => String::new(),
    };
    if response.status().is_success() {
        if response.headers().contains_key("idempotent-replayed") {
            Answer::Replayed(body)
        } else {
            Answer::Ran(body)
        }
    } else {
        let problem: serde_json::Value = serde_json::from_str(&body).expect("problem+json");
        let kind = problem["type"].as_str().unwrap_or_default();
        Answer::Refused(
            kind.strip_prefix("urn:lambda-idempotency:problem:idempotency-")
                .unwrap_or(kind)
                .to_owned(),
        )
    }
}

/// `engine.execute_transactional` with `write`.
async fn transactional<St: Store>(
    engine: &Engine<St>,
    key: &str,
    runs: &AtomicUsize,
    write: St::Write,
) -> Answer {
    answered(
        engine
            .execute_transactional(&attempt(key), || async {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                Ok::<_, Infallible>((value(run), vec![write]))
            })
            .await,
    )
}

/// `engine.run_single_write` with `write`. Only for a store with single
/// write (a const assertion: called from that store's own code).
async fn single_write<St: Store>(
    engine: &Engine<St>,
    key: &str,
    runs: &AtomicUsize,
    write: St::Write,
) -> Answer {
    answered(
        engine
            .run_single_write(&attempt(key), &Json, |_| async {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                Ok::<_, Infallible>((value(run), vec![write]))
            })
            .await,
    )
}

/// `engine.run_in_transaction`, the operation writing nothing.
async fn in_transaction<St: TransactionalStore>(
    engine: &Engine<St>,
    key: &str,
    runs: &AtomicUsize,
) -> Answer {
    answered(
        engine
            .run_in_transaction(&attempt(key), TransactionLimits::new(), |_| async {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                Ok::<_, Infallible>(value(run))
            })
            .await,
    )
}

/// The paths of store `R`: the HTTP layer, `execute`, and its own.
fn paths<R: Raw>() -> Vec<Path> {
    let mut paths = vec![Path::Http, Path::Execute];
    paths.extend_from_slice(R::transactional_paths());
    paths
}

/// Sends `key` through `path` on a fresh engine with `encryption`; returns
/// the record's id (the one that was not there before) and the answer.
async fn first<R: Raw>(
    raw: &R,
    engine: &Engine<R::St>,
    path: Path,
    key: &str,
    runs: &AtomicUsize,
) -> String {
    let before = raw.ids().await;
    let answer = send(raw, engine, path, key, runs).await;
    assert!(matches!(answer, Answer::Ran(_)), "{path:?}: {answer:?}");
    let mut new: Vec<String> = raw
        .ids()
        .await
        .into_iter()
        .filter(|id| !before.contains(id))
        .collect();
    assert_eq!(new.len(), 1, "{path:?}: one record written: {new:?}");
    new.pop().expect("one")
}

/// How a record is changed behind the engine's back.
#[derive(Debug, Clone, Copy)]
enum Tamper {
    /// One bit of the stored response's last byte flipped.
    FlipByte,
    /// Two records' responses swapped.
    Swap,
    /// Turned back into a claim whose lease passed a second ago, its
    /// sealed response left in place.
    StatusLapsed,
    /// Turned back into a claim whose lease runs for another minute.
    StatusLive,
    /// The expiry pushed an hour later.
    ExpiryLater,
    /// The expiry pulled a minute earlier (still in the future).
    ExpiryEarlier,
    /// Read under another context: the record copied from another table.
    OtherContext,
}

/// A record sealed through `path`, changed by `tamper`, then sent again
/// twice: refused as `expected` each time, never replayed, the operation
/// not run again, the record (and its swapped partner) left as it is.
async fn refused_after<R: Raw>(path: Path, tamper: Tamper, expected: Answer) {
    let raw = R::fresh().await;
    let sealed = engine(raw.store(), Some(sealing(keys("k1", 1))));
    let runs = AtomicUsize::new(0);
    let id = first(&raw, &sealed, path, "a", &runs).await;
    assert_eq!(key_id_of(&raw.response(&id).await), Some("k1"), "{path:?}");
    let mut reader = sealed.clone();
    let mut watched = vec![id.clone()];
    match tamper {
        Tamper::FlipByte => {
            let mut response = raw.response(&id).await;
            let last = response.len() - 1;
            response[last] ^= 1;
            raw.set_response(&id, &response).await;
        }
        Tamper::Swap => {
            let other = first(&raw, &sealed, path, "b", &runs).await;
            let (a, b) = (raw.response(&id).await, raw.response(&other).await);
            raw.set_response(&id, &b).await;
            raw.set_response(&other, &a).await;
            watched.push(other);
        }
        Tamper::StatusLapsed => raw.set_in_progress(&id, now_ms() - 1_000).await,
        Tamper::StatusLive => raw.set_in_progress(&id, now_ms() + 60_000).await,
        Tamper::ExpiryLater => {
            let expiration_s = raw.expiration_s(&id).await;
            raw.set_expiration_s(&id, expiration_s + 3_600).await;
        }
        Tamper::ExpiryEarlier => {
            let expiration_s = raw.expiration_s(&id).await;
            raw.set_expiration_s(&id, expiration_s - 60).await;
        }
        Tamper::OtherContext => {
            reader = engine(
                raw.store(),
                Some(Encryption::new(keys("k1", 1), "another table")),
            );
        }
    }
    let ran = runs.load(Ordering::SeqCst);
    let mut rows = Vec::new();
    for id in &watched {
        rows.push(raw.row(id).await);
    }
    let keys_sent: &[&str] = if watched.len() == 2 {
        &["a", "b"]
    } else {
        &["a"]
    };
    for _ in 0..2 {
        for key in keys_sent {
            let answer = send(&raw, &reader, path, key, &runs).await;
            assert_eq!(answer, expected, "{path:?}, {tamper:?}, key {key}");
        }
    }
    // The single write runs its operation before its commit learns of
    // the record (Engine::run_single_write's docs): its effects are its
    // writes, which commit with the record or not at all, so the record
    // left as it is says they did not commit again.
    if path != Path::SingleWrite {
        assert_eq!(
            runs.load(Ordering::SeqCst),
            ran,
            "{path:?}, {tamper:?}: run again"
        );
    }
    for (id, row) in watched.iter().zip(rows) {
        assert_eq!(raw.row(id).await, row, "{path:?}, {tamper:?}: overwritten");
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// Every path of the store with `tamper`.
async fn tamper_every_path<R: Raw>(tamper: Tamper, expected: fn(Path) -> Answer) {
    for path in paths::<R>() {
        refused_after::<R>(path, tamper, expected(path)).await;
    }
}

/// The in-progress answer of `path`.
fn in_progress(path: Path) -> Answer {
    Answer::Refused(match path {
        Path::Http => "key-in-use".into(),
        _ => ErrorKind::InProgress.as_str().into(),
    })
}

/// Sealed, then replayed as the first answer, and the stored bytes hold no
/// card number.
async fn sealed_and_replayed<R: Raw>() {
    for path in paths::<R>() {
        let raw = R::fresh().await;
        let sealed = engine(raw.store(), Some(sealing(keys("k1", 1))));
        let runs = AtomicUsize::new(0);
        let Answer::Ran(body) = send(&raw, &sealed, path, "a", &runs).await else {
            panic!("{path:?}: not run")
        };
        let replay = send(&raw, &sealed, path, "a", &runs).await;
        assert_eq!(replay, Answer::Replayed(body), "{path:?}");
        if path != Path::SingleWrite {
            assert_eq!(runs.load(Ordering::SeqCst), 1, "{path:?}");
        }
        let ids = raw.ids().await;
        assert_eq!(ids.len(), 1, "{path:?}");
        let stored = raw.response(&ids[0]).await;
        assert_eq!(key_id_of(&stored), Some("k1"), "{path:?}");
        assert!(
            !contains(&stored, CARD),
            "{path:?}: the card is in the clear"
        );
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// The ERROR logs of every test of this binary: one subscriber for the
/// process, installed by the first test that reads it. (A subscriber of a
/// test's own thread missed events now and then: a callsite's interest
/// registered on another test's thread.)
fn error_logs() -> &'static support::Captured {
    static LOGS: std::sync::OnceLock<support::Captured> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let captured = support::Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::ERROR)
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        captured
    })
}

/// One refused request logs one ERROR naming the record id and the key id.
async fn the_error_log_names_the_record_and_the_key_once<R: Raw>() {
    let logs = error_logs();
    let raw = R::fresh().await;
    let sealed = engine(raw.store(), Some(sealing(keys("k1", 1))));
    let runs = AtomicUsize::new(0);
    // A key of this store's own: the record id, in the logs of every
    // store's test, is this test's.
    let key = std::any::type_name::<R>();
    let id = first(&raw, &sealed, Path::Http, key, &runs).await;
    let mut response = raw.response(&id).await;
    response[40] ^= 1;
    raw.set_response(&id, &response).await;
    assert_eq!(
        send(&raw, &sealed, Path::Http, key, &runs).await,
        unauthentic(Path::Http)
    );
    let text = logs.text();
    let failed: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("failed to open") && line.contains(&id))
        .collect();
    assert_eq!(failed.len(), 1, "{text}");
    assert!(failed[0].contains("ERROR"), "{text}");
    assert!(
        failed[0].contains("key_id") && failed[0].contains("k1"),
        "the key id: {text}"
    );
}

/// Plaintext records, then encryption on (they replay; refused when
/// plaintext is), then open only (new ones plaintext, sealed ones open),
/// then off (a sealed record is corrupt: never replayed, never run again).
async fn plaintext_on_open_only_off<R: Raw>() {
    let raw = R::fresh().await;
    let runs = AtomicUsize::new(0);
    let path = Path::Execute;
    let plain = engine(raw.store(), None);
    let a = first(&raw, &plain, path, "a", &runs).await;
    assert!(contains(&raw.response(&a).await, CARD));

    let on = engine(raw.store(), Some(sealing(keys("k1", 1))));
    assert!(matches!(
        send(&raw, &on, path, "a", &runs).await,
        Answer::Replayed(_)
    ));
    let b = first(&raw, &on, path, "b", &runs).await;
    assert_eq!(key_id_of(&raw.response(&b).await), Some("k1"));

    let strict = engine(raw.store(), Some(sealing(keys("k1", 1)).refuse_plaintext()));
    assert_eq!(
        send(&raw, &strict, path, "a", &runs).await,
        unauthentic(path)
    );
    assert!(matches!(
        send(&raw, &strict, path, "b", &runs).await,
        Answer::Replayed(_)
    ));

    let open_only = engine(raw.store(), Some(sealing(keys("k1", 1)).open_only()));
    assert!(matches!(
        send(&raw, &open_only, path, "a", &runs).await,
        Answer::Replayed(_)
    ));
    assert!(matches!(
        send(&raw, &open_only, path, "b", &runs).await,
        Answer::Replayed(_)
    ));
    let c = first(&raw, &open_only, path, "c", &runs).await;
    assert!(
        contains(&raw.response(&c).await, CARD),
        "stored in the clear"
    );

    let off = engine(raw.store(), None);
    let b_row = raw.row(&b).await;
    assert!(matches!(
        send(&raw, &off, path, "a", &runs).await,
        Answer::Replayed(_)
    ));
    assert!(matches!(
        send(&raw, &off, path, "c", &runs).await,
        Answer::Replayed(_)
    ));
    for _ in 0..2 {
        assert_eq!(send(&raw, &off, path, "b", &runs).await, corrupt(path));
    }
    assert_eq!(
        raw.row(&b).await,
        b_row,
        "the sealed record is left as it is"
    );
    // And through the HTTP layer: its own problem for a corrupt record.
    let http_b = first(&raw, &on, Path::Http, "http-b", &runs).await;
    assert_eq!(
        send(&raw, &off, Path::Http, "http-b", &runs).await,
        corrupt(Path::Http)
    );
    assert_eq!(key_id_of(&raw.response(&http_b).await), Some("k1"));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        4,
        "a, b, c and http-b ran once each"
    );
}

/// Sealed under A; B primary with A beside it: A's records replay, new ones
/// are B's; A dropped: A's records are refused, not run.
async fn rotation<R: Raw>() {
    let raw = R::fresh().await;
    let runs = AtomicUsize::new(0);
    let path = Path::Execute;
    let under_a = engine(raw.store(), Some(sealing(keys("A", 0xa))));
    let Answer::Ran(a_value) = send(&raw, &under_a, path, "a", &runs).await else {
        panic!("a ran")
    };
    let rotated = engine(
        raw.store(),
        Some(sealing(
            keys("B", 0xb).with_key("A", &[0xa; 32]).expect("A"),
        )),
    );
    assert_eq!(
        send(&raw, &rotated, path, "a", &runs).await,
        Answer::Replayed(a_value.clone())
    );
    let b = first(&raw, &rotated, path, "b", &runs).await;
    assert_eq!(key_id_of(&raw.response(&b).await), Some("B"));

    let a_dropped = engine(raw.store(), Some(sealing(keys("B", 0xb))));
    assert!(matches!(
        send(&raw, &a_dropped, path, "b", &runs).await,
        Answer::Replayed(_)
    ));
    let a_id = under_a.record_id(SCOPE, "a");
    let a_row = raw.row(a_id.as_str()).await;
    for _ in 0..2 {
        assert_eq!(
            send(&raw, &a_dropped, path, "a", &runs).await,
            unauthentic(path)
        );
    }
    assert_eq!(raw.row(a_id.as_str()).await, a_row);
    // A key of the same id but other bytes opens nothing either.
    let impostor = engine(raw.store(), Some(sealing(keys("A", 0xc))));
    assert_eq!(
        send(&raw, &impostor, path, "a", &runs).await,
        unauthentic(path)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2, "a and b ran once each");
}

/// The scenarios, as tests of the store `$raw`.
macro_rules! encryption_on_store {
    ($raw:ty) => {
        #[tokio::test]
        async fn sealed_and_replayed() {
            crate::sealed_and_replayed::<$raw>().await;
        }

        #[tokio::test]
        async fn a_flipped_byte_is_refused() {
            crate::tamper_every_path::<$raw>(crate::Tamper::FlipByte, crate::unauthentic).await;
        }

        #[tokio::test]
        async fn swapped_responses_are_both_refused() {
            crate::tamper_every_path::<$raw>(crate::Tamper::Swap, crate::unauthentic).await;
        }

        #[tokio::test]
        async fn a_completed_record_turned_into_a_lapsed_claim_is_refused_not_run() {
            crate::tamper_every_path::<$raw>(crate::Tamper::StatusLapsed, crate::unauthentic).await;
        }

        #[tokio::test]
        async fn a_completed_record_turned_into_a_live_claim_is_in_progress() {
            crate::tamper_every_path::<$raw>(crate::Tamper::StatusLive, crate::in_progress).await;
        }

        #[tokio::test]
        async fn a_moved_expiry_is_refused() {
            crate::tamper_every_path::<$raw>(crate::Tamper::ExpiryLater, crate::unauthentic).await;
            crate::tamper_every_path::<$raw>(crate::Tamper::ExpiryEarlier, crate::unauthentic)
                .await;
        }

        #[tokio::test]
        async fn a_record_of_another_context_is_refused() {
            crate::tamper_every_path::<$raw>(crate::Tamper::OtherContext, crate::unauthentic).await;
        }

        #[tokio::test]
        async fn the_error_log_names_the_record_and_the_key_once() {
            crate::the_error_log_names_the_record_and_the_key_once::<$raw>().await;
        }

        #[tokio::test]
        async fn plaintext_then_on_then_open_only_then_off() {
            crate::plaintext_on_open_only_off::<$raw>().await;
        }

        #[tokio::test]
        async fn rotation() {
            crate::rotation::<$raw>().await;
        }
    };
}

/// DynamoDB Local: a table of its own, and the single-table layout.
mod dynamodb {
    use super::{Answer, Path, Raw, PREFIX};
    use aws_sdk_dynamodb::{
        types::{AttributeValue, Put, TransactWriteItem},
        Client,
    };
    use lambda_idempotency::{
        store::dynamodb::{AttributeNames, SingleTable},
        DynamoDbStore, Engine,
    };
    use std::{collections::BTreeMap, sync::atomic::AtomicUsize};

    /// The key of a record: `id`, or `pk` and `sk` in the single-table layout.
    pub struct Dynamo {
        client: Client,
        table: String,
        single: bool,
    }

    const PARTITION: &str = "idempotency#encryption";

    impl Dynamo {
        async fn create(single: bool) -> Self {
            let client = super::support::client();
            let table = if single {
                let table = super::support::unique_name("enc-single");
                Self::layout(DynamoDbStore::new(client.clone(), table.clone()), true)
                    .create_table()
                    .await
                    .expect("create_table");
                table
            } else {
                super::support::create_idempotency_table(&client).await
            };
            Self {
                client,
                table,
                single,
            }
        }

        fn layout(store: DynamoDbStore, single: bool) -> DynamoDbStore {
            if single {
                store
                    .attribute_names(AttributeNames::default().id("pk"))
                    .single_table(SingleTable::new(PARTITION, "sk"))
            } else {
                store
            }
        }

        fn key(&self, id: &str) -> BTreeMap<String, AttributeValue> {
            let s = |v: &str| AttributeValue::S(v.to_owned());
            if self.single {
                BTreeMap::from([("pk".into(), s(PARTITION)), ("sk".into(), s(id))])
            } else {
                BTreeMap::from([("id".into(), s(id))])
            }
        }

        async fn item(&self, id: &str) -> BTreeMap<String, AttributeValue> {
            let found = self
                .client
                .get_item()
                .table_name(&self.table)
                .set_key(Some(self.key(id).into_iter().collect()))
                .consistent_read(true)
                .send()
                .await
                .expect("GetItem");
            found.item.expect("the item").into_iter().collect()
        }

        /// `SET #a = :a` for each attribute `a` given.
        async fn set(&self, id: &str, values: Vec<(&str, AttributeValue)>) {
            let expression: Vec<String> = (0..values.len())
                .map(|i| format!("#a{i} = :v{i}"))
                .collect();
            let mut update = self
                .client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(self.key(id).into_iter().collect()))
                .update_expression(format!("SET {}", expression.join(", ")));
            for (i, (name, value)) in values.into_iter().enumerate() {
                update = update
                    .expression_attribute_names(format!("#a{i}"), name)
                    .expression_attribute_values(format!(":v{i}"), value);
            }
            update.send().await.expect("UpdateItem");
        }

        /// A business item written with the record.
        fn write(&self, key: &str) -> TransactWriteItem {
            let mut item = self.key(&format!("charge#{key}"));
            if !self.single {
                item.insert("id".into(), AttributeValue::S(format!("charge#{key}")));
            }
            item.insert("amount".into(), AttributeValue::N("1250".into()));
            TransactWriteItem::builder()
                .put(
                    Put::builder()
                        .table_name(&self.table)
                        .set_item(Some(item.into_iter().collect()))
                        .build()
                        .expect("put"),
                )
                .build()
        }
    }

    macro_rules! dynamo_raw {
        ($name:ident, $single:expr) => {
            pub struct $name(Dynamo);

            impl Raw for $name {
                type St = DynamoDbStore;

                async fn fresh() -> Self {
                    Self(Dynamo::create($single).await)
                }

                fn store(&self) -> DynamoDbStore {
                    Dynamo::layout(
                        DynamoDbStore::new(self.0.client.clone(), self.0.table.clone()),
                        $single,
                    )
                }

                async fn ids(&self) -> Vec<String> {
                    let scanned = self
                        .0
                        .client
                        .scan()
                        .table_name(&self.0.table)
                        .consistent_read(true)
                        .send()
                        .await
                        .expect("Scan");
                    let attribute = if $single { "sk" } else { "id" };
                    scanned
                        .items()
                        .iter()
                        .filter_map(|item| item.get(attribute)?.as_s().ok().cloned())
                        .filter(|id| id.starts_with(&format!("{PREFIX}#")))
                        .collect()
                }

                async fn response(&self, id: &str) -> Vec<u8> {
                    let item = self.0.item(id).await;
                    item["response"].as_b().expect("binary").as_ref().to_vec()
                }

                async fn set_response(&self, id: &str, response: &[u8]) {
                    let bytes = AttributeValue::B(response.to_vec().into());
                    self.0.set(id, vec![("response", bytes)]).await;
                }

                async fn set_in_progress(&self, id: &str, lease_until_ms: u64) {
                    self.0
                        .set(
                            id,
                            vec![
                                ("status", AttributeValue::S("IN_PROGRESS".into())),
                                ("lease_until", AttributeValue::N(lease_until_ms.to_string())),
                            ],
                        )
                        .await;
                }

                async fn expiration_s(&self, id: &str) -> u64 {
                    let item = self.0.item(id).await;
                    item["expiration"]
                        .as_n()
                        .expect("number")
                        .parse()
                        .expect("u64")
                }

                async fn set_expiration_s(&self, id: &str, expiration_s: u64) {
                    let value = AttributeValue::N(expiration_s.to_string());
                    self.0.set(id, vec![("expiration", value)]).await;
                }

                async fn row(&self, id: &str) -> String {
                    format!("{:?}", self.0.item(id).await)
                }

                fn transactional_paths() -> &'static [Path] {
                    &[Path::Transactional, Path::SingleWrite]
                }

                async fn send_transactional(
                    &self,
                    engine: &Engine<DynamoDbStore>,
                    path: Path,
                    key: &str,
                    runs: &AtomicUsize,
                ) -> Answer {
                    let write = self.0.write(key);
                    match path {
                        Path::Transactional => super::transactional(engine, key, runs, write).await,
                        Path::SingleWrite => super::single_write(engine, key, runs, write).await,
                        _ => unreachable!("{path:?}"),
                    }
                }
            }
        };
    }

    dynamo_raw!(OwnTable, false);
    dynamo_raw!(SingleTableLayout, true);

    mod own_table {
        encryption_on_store!(super::OwnTable);
    }

    mod single_table {
        encryption_on_store!(super::SingleTableLayout);
    }
}

/// PostgreSQL, through tokio-postgres (`PostgresStore`) and through sqlx
/// (`SqlxPostgresStore`): one table layout, read and changed with
/// tokio-postgres.
mod postgres {
    use super::{Answer, Path, Raw, PREFIX};
    use lambda_idempotency::{
        store::{
            postgres::{tokio_postgres, PgWrite, PostgresStore},
            sqlx::postgres::{sqlx::postgres::PgPoolOptions, SqlxPgWrite, SqlxPostgresStore},
        },
        Engine,
    };
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn url() -> String {
        super::support::variable("IDEMPOTENCY_TEST_POSTGRES_URL")
    }

    static TABLES: AtomicUsize = AtomicUsize::new(0);

    /// A fresh table's name, and a client of the test's own.
    pub struct Pg {
        client: tokio_postgres::Client,
        table: String,
    }

    impl Pg {
        async fn create() -> Self {
            let (client, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(connection);
            let table = format!(
                "enc_{}_{}",
                std::process::id(),
                TABLES.fetch_add(1, Ordering::SeqCst)
            );
            client
                .batch_execute(&format!(
                    "CREATE TABLE {table}_charges (id text PRIMARY KEY)"
                ))
                .await
                .expect("business table");
            Self { client, table }
        }

        async fn set(&self, id: &str, assignment: &str) {
            let changed = self
                .client
                .execute(
                    &format!("UPDATE {} SET {assignment} WHERE id = $1", self.table),
                    &[&id],
                )
                .await
                .expect("UPDATE");
            assert_eq!(changed, 1);
        }

        async fn ids(&self) -> Vec<String> {
            let rows = self
                .client
                .query(
                    &format!("SELECT id FROM {} WHERE id LIKE '{PREFIX}#%'", self.table),
                    &[],
                )
                .await
                .expect("SELECT");
            rows.iter().map(|row| row.get(0)).collect()
        }

        async fn response(&self, id: &str) -> Vec<u8> {
            let sql = format!("SELECT response FROM {} WHERE id = $1", self.table);
            self.client
                .query_one(&sql, &[&id])
                .await
                .expect("row")
                .get(0)
        }

        async fn set_response(&self, id: &str, response: &[u8]) {
            let sql = format!("UPDATE {} SET response = $2 WHERE id = $1", self.table);
            self.client
                .execute(&sql, &[&id, &response])
                .await
                .expect("UPDATE");
        }

        async fn expiration_s(&self, id: &str) -> u64 {
            let sql = format!("SELECT expiration_s FROM {} WHERE id = $1", self.table);
            let value: i64 = self
                .client
                .query_one(&sql, &[&id])
                .await
                .expect("row")
                .get(0);
            value as u64
        }

        async fn row(&self, id: &str) -> String {
            let sql = format!(
                "SELECT row_to_json(t)::text FROM {} t WHERE id = $1",
                self.table
            );
            self.client
                .query_one(&sql, &[&id])
                .await
                .expect("row")
                .get(0)
        }

        fn charge_sql(&self) -> String {
            format!("INSERT INTO {}_charges (id) VALUES ($1)", self.table)
        }
    }

    macro_rules! pg_raw {
        ($name:ident, $store:ty, $write:ident, $open:expr) => {
            pub struct $name(Pg, $store);

            impl Raw for $name {
                type St = $store;

                async fn fresh() -> Self {
                    let pg = Pg::create().await;
                    let open: fn(&str) -> $store = $open;
                    let store = open(&pg.table);
                    store.create_table().await.expect("create table");
                    Self(pg, store)
                }

                fn store(&self) -> $store {
                    self.1.clone()
                }

                async fn ids(&self) -> Vec<String> {
                    self.0.ids().await
                }

                async fn response(&self, id: &str) -> Vec<u8> {
                    self.0.response(id).await
                }

                async fn set_response(&self, id: &str, response: &[u8]) {
                    self.0.set_response(id, response).await
                }

                async fn set_in_progress(&self, id: &str, lease_until_ms: u64) {
                    let assignment =
                        format!("status = 'IN_PROGRESS', lease_until_ms = {lease_until_ms}");
                    self.0.set(id, &assignment).await
                }

                async fn expiration_s(&self, id: &str) -> u64 {
                    self.0.expiration_s(id).await
                }

                async fn set_expiration_s(&self, id: &str, expiration_s: u64) {
                    self.0
                        .set(id, &format!("expiration_s = {expiration_s}"))
                        .await
                }

                async fn row(&self, id: &str) -> String {
                    self.0.row(id).await
                }

                fn transactional_paths() -> &'static [Path] {
                    &[Path::Transactional, Path::SingleWrite, Path::InTransaction]
                }

                async fn send_transactional(
                    &self,
                    engine: &Engine<$store>,
                    path: Path,
                    key: &str,
                    runs: &AtomicUsize,
                ) -> Answer {
                    let write = $write::new(self.0.charge_sql()).bind(key.to_owned());
                    match path {
                        Path::Transactional => super::transactional(engine, key, runs, write).await,
                        Path::SingleWrite => super::single_write(engine, key, runs, write).await,
                        Path::InTransaction => super::in_transaction(engine, key, runs).await,
                        _ => unreachable!("{path:?}"),
                    }
                }
            }
        };
    }

    pg_raw!(TokioPostgres, PostgresStore, PgWrite, |table| {
        PostgresStore::connect(&url(), table, 4).expect("pool")
    });
    pg_raw!(Sqlx, SqlxPostgresStore, SqlxPgWrite, |table| {
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect_lazy(&url())
            .expect("pool");
        SqlxPostgresStore::new(pool, table).expect("store")
    });

    mod tokio_postgres_store {
        encryption_on_store!(super::TokioPostgres);
    }

    // The partitioned layout: the same records, tampered with the same way.
    pg_raw!(TokioPostgresPartitioned, PostgresStore, PgWrite, |table| {
        PostgresStore::connect(&url(), table, 4)
            .expect("pool")
            .partitioned(lambda_idempotency::store::postgres::Partitioning::daily())
    });

    mod tokio_postgres_partitioned_store {
        encryption_on_store!(super::TokioPostgresPartitioned);
    }

    mod sqlx_store {
        encryption_on_store!(super::Sqlx);
    }
}

/// MySQL (MariaDB here) through sqlx, read and changed with sqlx.
mod mysql {
    use super::{Answer, Path, Raw, PREFIX};
    use lambda_idempotency::{
        store::sqlx::mysql::{SqlxMySqlStore, SqlxMySqlWrite},
        Engine,
    };
    use sqlx::{mysql::MySqlPoolOptions, MySqlPool};
    use std::sync::atomic::{AtomicUsize, Ordering};

    static TABLES: AtomicUsize = AtomicUsize::new(0);

    pub struct MySql {
        pool: MySqlPool,
        table: String,
        store: SqlxMySqlStore,
    }

    impl MySql {
        async fn set(&self, id: &str, assignment: &str) {
            let sql = format!("UPDATE `{}` SET {assignment} WHERE id = ?", self.table);
            let done = sqlx::query(&sql)
                .bind(id)
                .execute(&self.pool)
                .await
                .expect("UPDATE");
            assert_eq!(done.rows_affected(), 1);
        }
    }

    impl Raw for MySql {
        type St = SqlxMySqlStore;

        async fn fresh() -> Self {
            let url = super::support::variable("IDEMPOTENCY_TEST_MYSQL_URL");
            let pool = MySqlPoolOptions::new()
                .max_connections(4)
                .connect_lazy(&url)
                .expect("pool");
            let table = format!(
                "enc_{}_{}",
                std::process::id(),
                TABLES.fetch_add(1, Ordering::SeqCst)
            );
            let store = SqlxMySqlStore::new(pool.clone(), table.clone()).expect("store");
            store.create_table().await.expect("create table");
            sqlx::raw_sql(&format!(
                "CREATE TABLE `{table}_charges` (id VARCHAR(200) PRIMARY KEY)"
            ))
            .execute(&pool)
            .await
            .expect("business table");
            Self { pool, table, store }
        }

        fn store(&self) -> SqlxMySqlStore {
            self.store.clone()
        }

        async fn ids(&self) -> Vec<String> {
            let sql = format!(
                "SELECT CAST(id AS CHAR) FROM `{}` WHERE id LIKE '{PREFIX}#%'",
                self.table
            );
            sqlx::query_scalar(&sql)
                .fetch_all(&self.pool)
                .await
                .expect("SELECT")
        }

        async fn response(&self, id: &str) -> Vec<u8> {
            let sql = format!("SELECT response FROM `{}` WHERE id = ?", self.table);
            sqlx::query_scalar(&sql)
                .bind(id)
                .fetch_one(&self.pool)
                .await
                .expect("row")
        }

        async fn set_response(&self, id: &str, response: &[u8]) {
            let sql = format!("UPDATE `{}` SET response = ? WHERE id = ?", self.table);
            sqlx::query(&sql)
                .bind(response)
                .bind(id)
                .execute(&self.pool)
                .await
                .expect("UPDATE");
        }

        async fn set_in_progress(&self, id: &str, lease_until_ms: u64) {
            let assignment = format!("status = 'IN_PROGRESS', lease_until_ms = {lease_until_ms}");
            self.set(id, &assignment).await
        }

        async fn expiration_s(&self, id: &str) -> u64 {
            let sql = format!("SELECT expiration_s FROM `{}` WHERE id = ?", self.table);
            let value: i64 = sqlx::query_scalar(&sql)
                .bind(id)
                .fetch_one(&self.pool)
                .await
                .expect("row");
            value as u64
        }

        async fn set_expiration_s(&self, id: &str, expiration_s: u64) {
            self.set(id, &format!("expiration_s = {expiration_s}"))
                .await
        }

        async fn row(&self, id: &str) -> String {
            let sql = format!(
                "SELECT CAST(CONCAT_WS('|', id, status, owner, fingerprint, expiration_s, \
                 IFNULL(lease_until_ms, '-'), IFNULL(HEX(response), '-'), \
                 IFNULL(created_at_ms, '-'), IFNULL(completed_at_ms, '-'), attempt, \
                 IFNULL(first_started_ms, '-')) AS CHAR) FROM `{}` WHERE id = ?",
                self.table
            );
            sqlx::query_scalar(&sql)
                .bind(id)
                .fetch_one(&self.pool)
                .await
                .expect("row")
        }

        fn transactional_paths() -> &'static [Path] {
            &[Path::Transactional, Path::InTransaction]
        }

        async fn send_transactional(
            &self,
            engine: &Engine<SqlxMySqlStore>,
            path: Path,
            key: &str,
            runs: &AtomicUsize,
        ) -> Answer {
            match path {
                Path::Transactional => {
                    let sql = format!("INSERT INTO `{}_charges` (id) VALUES (?)", self.table);
                    let write = SqlxMySqlWrite::new(sql).bind(key.to_owned());
                    super::transactional(engine, key, runs, write).await
                }
                Path::InTransaction => super::in_transaction(engine, key, runs).await,
                _ => unreachable!("{path:?}"),
            }
        }
    }

    encryption_on_store!(MySql);
}

/// Redis, read and changed with the redis crate.
mod redis_store {
    use super::{Answer, Path, Raw, PREFIX};
    use lambda_idempotency::{store::redis::RedisStore, Engine};
    use redis::AsyncCommands;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static NAMESPACES: AtomicUsize = AtomicUsize::new(0);

    pub struct Redis {
        connection: redis::aio::MultiplexedConnection,
        namespace: String,
        store: RedisStore,
    }

    impl Redis {
        fn key(&self, id: &str) -> String {
            format!("{}{id}", self.namespace)
        }

        async fn field<T: redis::FromRedisValue>(&self, id: &str, field: &str) -> T {
            let mut connection = self.connection.clone();
            connection.hget(self.key(id), field).await.expect("HGET")
        }

        async fn set(&self, id: &str, fields: &[(&str, Vec<u8>)]) {
            let mut connection = self.connection.clone();
            let () = connection
                .hset_multiple(self.key(id), fields)
                .await
                .expect("HSET");
        }
    }

    impl Raw for Redis {
        type St = RedisStore;

        async fn fresh() -> Self {
            let url = super::support::variable("IDEMPOTENCY_TEST_REDIS_URL");
            let namespace = format!(
                "enc-{}-{}:",
                std::process::id(),
                NAMESPACES.fetch_add(1, Ordering::SeqCst)
            );
            let connection = redis::Client::open(url.as_str())
                .expect("url")
                .get_multiplexed_async_connection()
                .await
                .expect("connect");
            let store = RedisStore::open(&url).expect("url").namespace(&namespace);
            Self {
                connection,
                namespace,
                store,
            }
        }

        fn store(&self) -> RedisStore {
            self.store.clone()
        }

        async fn ids(&self) -> Vec<String> {
            let mut connection = self.connection.clone();
            let keys: Vec<String> = connection
                .keys(format!("{}{PREFIX}#*", self.namespace))
                .await
                .expect("KEYS");
            keys.into_iter()
                .map(|key| key[self.namespace.len()..].to_owned())
                .collect()
        }

        async fn response(&self, id: &str) -> Vec<u8> {
            self.field(id, "response").await
        }

        async fn set_response(&self, id: &str, response: &[u8]) {
            self.set(id, &[("response", response.to_vec())]).await
        }

        async fn set_in_progress(&self, id: &str, lease_until_ms: u64) {
            self.set(
                id,
                &[
                    ("status", b"IN_PROGRESS".to_vec()),
                    ("lease_until_ms", lease_until_ms.to_string().into_bytes()),
                ],
            )
            .await
        }

        async fn expiration_s(&self, id: &str) -> u64 {
            self.field(id, "expiration_s").await
        }

        async fn set_expiration_s(&self, id: &str, expiration_s: u64) {
            self.set(
                id,
                &[("expiration_s", expiration_s.to_string().into_bytes())],
            )
            .await
        }

        async fn row(&self, id: &str) -> String {
            let mut connection = self.connection.clone();
            let fields: std::collections::BTreeMap<String, Vec<u8>> =
                connection.hgetall(self.key(id)).await.expect("HGETALL");
            format!("{fields:?}")
        }

        fn transactional_paths() -> &'static [Path] {
            &[]
        }

        async fn send_transactional(
            &self,
            _: &Engine<RedisStore>,
            path: Path,
            _: &str,
            _: &AtomicUsize,
        ) -> Answer {
            unreachable!("{path:?}: Redis has no transactional writes")
        }
    }

    encryption_on_store!(Redis);
}
