//! Stored responses sealed and opened by the engine, on the memory store:
//! every completion path seals, every read that replays opens, and a
//! record that fails to open is never served, never overwritten and never
//! run again.

use super::*;
use crate::{
    encryption::{key_id_of, Encryption, KeyError, KeyErrorKind, KeyLookup, KeyProvider, RawKeys},
    split::{self, SplitAttempt, SplitClaim},
    store::{memory::MemoryWrite, OwnerToken, Record, Status, TransactionLimits},
    testing::ManualClock,
    Clock, Error, ErrorKind, Fingerprint, MemoryStore,
};
use serde::{Deserialize, Serialize};
use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

const CARD: &str = "4242424242424242";
const CONTEXT: &str = "prod/idempotency";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Charge {
    card: String,
    amount: u32,
}

fn charge(amount: u32) -> Charge {
    Charge {
        card: CARD.to_owned(),
        amount,
    }
}

fn fingerprint() -> Fingerprint {
    Fingerprint::of_bytes(b"1250 EUR")
}

fn raw(id: &str, byte: u8) -> RawKeys {
    RawKeys::new(id, &[byte; 32]).unwrap()
}

fn engine(
    store: &MemoryStore,
    clock: &ManualClock,
    encryption: Option<Encryption>,
) -> Engine<MemoryStore> {
    let builder = Engine::builder(store.clone()).clock(clock.clone());
    match encryption {
        Some(encryption) => builder.encryption(encryption).build(),
        None => builder.build(),
    }
}

fn setup() -> (MemoryStore, ManualClock) {
    (MemoryStore::new(), ManualClock::new(1_700_000_000_000))
}

fn sealing(keys: RawKeys) -> Encryption {
    Encryption::new(keys, CONTEXT)
}

/// Every way the engine completes a record.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Path {
    Execute,
    Transactional,
    SingleWrite,
    InTransaction,
    RefusedAnswer,
    Split,
}

/// (A refused write's answer completed inside a transaction is sealed by
/// the same call as the in-transaction completion; the memory store's
/// transactions report a refused write without a `WriteRefusal`, so that
/// path is not reachable here.)
const PATHS: [Path; 6] = [
    Path::Execute,
    Path::Transactional,
    Path::SingleWrite,
    Path::InTransaction,
    Path::RefusedAnswer,
    Path::Split,
];

fn limits() -> TransactionLimits {
    TransactionLimits::new()
        .claim_wait(Duration::from_millis(100))
        .time_limit(Duration::from_secs(5))
}

/// An attempt at `key` by `path`: the charge (run, or replayed), or the
/// error's kind. `runs` counts the operation's runs.
async fn attempt_by(
    engine: &Engine<MemoryStore>,
    path: Path,
    key: &str,
    runs: &AtomicUsize,
) -> Result<(Charge, bool), ErrorKind> {
    let attempt = Attempt::new("s", key, fingerprint());
    let ran = |amount| {
        runs.fetch_add(1, Ordering::SeqCst);
        charge(amount)
    };
    let outcome = match path {
        Path::Execute => {
            engine
                .execute(&attempt, || async { Ok::<_, ()>(ran(1)) })
                .await
        }
        Path::Transactional => {
            engine
                .execute_transactional(&attempt, || async {
                    Ok::<_, ()>((ran(2), vec![MemoryWrite::put(format!("item/{key}"), "1")]))
                })
                .await
        }
        // The single write runs its operation before it learns that the
        // key is taken (by design: its only effects are its writes, which
        // commit with the record or not at all): a run counts when it
        // commits.
        Path::SingleWrite => {
            let outcome = engine
                .run_single_write(&attempt, &Json, |_| async {
                    Ok::<_, ()>((
                        charge(3),
                        vec![MemoryWrite::put(format!("single/{key}"), "1")],
                    ))
                })
                .await;
            if outcome.as_ref().is_ok_and(|outcome| !outcome.is_replay()) {
                runs.fetch_add(1, Ordering::SeqCst);
            }
            outcome
        }
        Path::InTransaction => {
            engine
                .run_in_transaction(&attempt, limits(), |_tx| async { Ok::<_, ()>(ran(4)) })
                .await
        }
        Path::RefusedAnswer => {
            // An item the operation's write is refused on, written first.
            let taken = format!("taken/{key}");
            if engine.store().item(&taken).is_none() {
                engine
                    .execute_transactional(&Attempt::new("setup", key, fingerprint()), || async {
                        Ok::<_, ()>((0u8, vec![MemoryWrite::put(taken.clone(), "other")]))
                    })
                    .await
                    .expect("setup");
            }
            let refusal = |_: &crate::WriteRefusal| Some(Ok(ran(409)));
            engine
                .run_with_refusals(&attempt, Mode::Transactional, &Json, refusal, |_| async {
                    Ok::<_, ()>((
                        charge(201),
                        vec![MemoryWrite::put_if_absent(taken.clone(), "mine")],
                    ))
                })
                .await
        }
        Path::Split => {
            let split_attempt = SplitAttempt::new(
                "s",
                key,
                fingerprint(),
                OwnerToken::from_stored(format!("execution-{key}")),
                Duration::from_secs(30),
            );
            return match split::claim::<_, Charge>(engine, &split_attempt, &Json).await {
                Ok(SplitClaim::Ours) => {
                    let value = ran(5);
                    let response = serde_json::to_vec(&value).unwrap();
                    let completed = split::complete(engine, &split_attempt, response)
                        .await
                        .expect("completed");
                    assert_eq!(completed, OutcomeKind::Fresh);
                    Ok((value, false))
                }
                Ok(SplitClaim::Replay(value)) => Ok((value, true)),
                Ok(other) => panic!("{other:?}"),
                Err(error) => Err(error.kind()),
            };
        }
    };
    outcome
        .map(|outcome| {
            let replay = outcome.is_replay();
            (outcome.into_value(), replay)
        })
        .map_err(|error| error.kind())
}

fn stored(store: &MemoryStore, engine: &Engine<MemoryStore>, key: &str) -> Record {
    store.record(&engine.record_id("s", key)).expect("a record")
}

fn response(record: &Record) -> &[u8] {
    record.response.as_deref().expect("a response")
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

#[tokio::test]
async fn every_completion_path_seals_and_every_read_opens() {
    let (store, clock) = setup();
    let first = engine(&store, &clock, Some(sealing(raw("k1", 1))));
    for path in PATHS {
        let runs = AtomicUsize::new(0);
        let key = format!("{path:?}");
        let (value, replay) = attempt_by(&first, path, &key, &runs).await.expect("ran");
        assert!(!replay, "{path:?}");
        let record = stored(&store, &first, &key);
        assert_eq!(record.status, Status::Completed, "{path:?}");
        let bytes = response(&record);
        assert_eq!(key_id_of(bytes), Some("k1"), "{path:?}: sealed under k1");
        assert!(
            !contains(bytes, CARD),
            "{path:?}: the card is not in the clear"
        );
        // Another engine (none of the first's memory) with the same keys
        // replays it from the store.
        let other = engine(&store, &clock, Some(sealing(raw("k1", 1))));
        let (again, replay) = attempt_by(&other, path, &key, &runs)
            .await
            .expect("replayed");
        assert!(replay, "{path:?}");
        assert_eq!(again, value, "{path:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{path:?}: ran once");
    }
}

/// Completes `key` by `path` under `keys`, and returns the record.
async fn completed(store: &MemoryStore, clock: &ManualClock, path: Path, key: &str) -> Record {
    let engine = engine(store, clock, Some(sealing(raw("k1", 1))));
    let runs = AtomicUsize::new(0);
    attempt_by(&engine, path, key, &runs).await.expect("ran");
    stored(store, &engine, key)
}

/// The record of `key` changed by `change` must fail to open for every
/// path: the documented error, nothing run, the record left as it was,
/// and the same again on the next retry.
async fn refused_after(change: impl Fn(&mut Record, &MemoryStore), expected: ErrorKind) {
    for path in PATHS {
        let (store, clock) = setup();
        let key = format!("{path:?}");
        let mut record = completed(&store, &clock, path, &key).await;
        change(&mut record, &store);
        store.insert_record(record.clone());
        let engine = engine(&store, &clock, Some(sealing(raw("k1", 1))));
        let runs = AtomicUsize::new(0);
        for _ in 0..2 {
            let answer = attempt_by(&engine, path, &key, &runs).await;
            assert_eq!(answer, Err(expected), "{path:?}");
            assert_eq!(runs.load(Ordering::SeqCst), 0, "{path:?}: not run again");
            assert_eq!(
                store.record(&record.id).as_ref(),
                Some(&record),
                "{path:?}: not overwritten"
            );
        }
    }
}

#[tokio::test]
async fn a_byte_changed_in_the_stored_response_is_refused() {
    refused_after(
        |record, _| {
            let response = record.response.as_mut().unwrap();
            let last = response.len() - 1;
            response[last] ^= 0x01;
        },
        ErrorKind::UnauthenticRecord,
    )
    .await;
    refused_after(
        |record, _| {
            let response = record.response.as_mut().unwrap();
            let middle = response.len() / 2;
            response[middle] ^= 0x80;
        },
        ErrorKind::UnauthenticRecord,
    )
    .await;
}

#[tokio::test]
async fn two_records_with_their_responses_swapped_are_both_refused() {
    let (store, clock) = setup();
    let a = completed(&store, &clock, Path::Execute, "a").await;
    let b = completed(&store, &clock, Path::Execute, "b").await;
    store.insert_record(Record {
        response: b.response.clone(),
        ..a.clone()
    });
    store.insert_record(Record {
        response: a.response.clone(),
        ..b.clone()
    });
    let engine = engine(&store, &clock, Some(sealing(raw("k1", 1))));
    let runs = AtomicUsize::new(0);
    for key in ["a", "b"] {
        let answer = attempt_by(&engine, Path::Execute, key, &runs).await;
        assert_eq!(answer, Err(ErrorKind::UnauthenticRecord), "{key}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_moved_expiry_is_refused() {
    refused_after(
        |record, _| record.expiration_s += 3600,
        ErrorKind::UnauthenticRecord,
    )
    .await;
}

#[tokio::test]
async fn a_response_copied_onto_another_payload_is_refused() {
    // The record's fingerprint changed to another request's: that request
    // finds a record of its own payload, whose response is not its own.
    let (store, clock) = setup();
    let mut record = completed(&store, &clock, Path::Execute, "k").await;
    let other = Fingerprint::of_bytes(b"9999 EUR");
    record.fingerprint = other.clone();
    store.insert_record(record.clone());
    let engine = engine(&store, &clock, Some(sealing(raw("k1", 1))));
    let answer = engine
        .execute(&Attempt::new("s", "k", other), || async {
            Ok::<_, ()>(charge(0))
        })
        .await;
    assert_eq!(
        answer.map_err(|e| e.kind()).err(),
        Some(ErrorKind::UnauthenticRecord)
    );
    assert_eq!(store.record(&record.id), Some(record));
}

#[tokio::test]
async fn a_changed_status_is_never_served() {
    // A completed record turned into another attempt's claim under a live
    // lease: never replayed (the response is not opened for a claim), never
    // run while the lease stands, and left as it is. (Once the lease has
    // passed it is refused, not taken over: the next test. A writer who
    // also removes the response, or turns it into a durable execution's own
    // claim, frees the key as deleting the record would: outside what
    // sealing can catch, as the module's threat model says.)
    for path in PATHS {
        let (store, clock) = setup();
        let key = format!("{path:?}");
        let mut record = completed(&store, &clock, path, &key).await;
        record.status = Status::InProgress;
        record.owner = OwnerToken::from_stored("another attempt");
        record.lease_until_ms = Some(clock.now_ms() + 60_000);
        store.insert_record(record.clone());
        let engine = engine(&store, &clock, Some(sealing(raw("k1", 1))));
        let runs = AtomicUsize::new(0);
        let answer = attempt_by(&engine, path, &key, &runs).await;
        assert_eq!(answer, Err(ErrorKind::InProgress), "{path:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{path:?}");
        assert_eq!(store.record(&record.id), Some(record), "{path:?}");
    }
}

#[tokio::test]
async fn a_completed_record_turned_into_a_lapsed_claim_is_refused_not_taken_over() {
    // Its sealed response left in place, the status changed and a lease
    // that passed: taking it over would run an operation that ran. Every
    // path that takes over a claim refuses it, with or without keys (an
    // engine that does not seal still knows the envelope). The single
    // write runs its operation before its commit (its effects are its
    // writes), and the store's commit condition refuses a claim that holds
    // a response: nothing of it commits, the record stays.
    for keys in [Some(sealing(raw("k1", 1))), None] {
        for path in PATHS {
            let (store, clock) = setup();
            let key = format!("{path:?}");
            let mut record = completed(&store, &clock, path, &key).await;
            record.status = Status::InProgress;
            record.lease_until_ms = Some(clock.now_ms() - 1);
            store.insert_record(record.clone());
            let engine = engine(&store, &clock, keys.clone());
            let runs = AtomicUsize::new(0);
            for _ in 0..2 {
                let answer = attempt_by(&engine, path, &key, &runs).await;
                assert_eq!(answer, Err(ErrorKind::UnauthenticRecord), "{path:?}");
            }
            if path != Path::SingleWrite {
                assert_eq!(runs.load(Ordering::SeqCst), 0, "{path:?}: run again");
            }
            assert_eq!(store.record(&record.id), Some(record), "{path:?}");
        }
    }
}

/// A plaintext completed record turned into a lapsed claim: a claim takes
/// it over (without encryption nothing tells it from a claim whose
/// completion was lost), but the single write's commit, which cannot
/// take over, does not replace a claim that holds a response: a corrupt
/// record, left as it is.
#[tokio::test]
async fn a_plaintext_completion_turned_into_a_lapsed_claim_is_not_replaced_by_a_single_write() {
    let (store, clock) = setup();
    let plain = engine(&store, &clock, None);
    let runs = AtomicUsize::new(0);
    attempt_by(&plain, Path::SingleWrite, "plain", &runs)
        .await
        .expect("ran");
    let mut record = stored(&store, &plain, "plain");
    record.status = Status::InProgress;
    record.lease_until_ms = Some(clock.now_ms() - 1);
    store.insert_record(record.clone());
    // Another engine: none of the first's memory.
    let retrying = engine(&store, &clock, None);
    for _ in 0..2 {
        let answer = attempt_by(&retrying, Path::SingleWrite, "plain", &runs).await;
        assert_eq!(answer, Err(ErrorKind::CorruptRecord));
    }
    assert_eq!(store.record(&record.id), Some(record));
}

#[tokio::test]
async fn a_record_sealed_under_another_context_is_refused() {
    let (store, clock) = setup();
    let staging = engine(
        &store,
        &clock,
        Some(Encryption::new(raw("k1", 1), "staging")),
    );
    let runs = AtomicUsize::new(0);
    attempt_by(&staging, Path::Execute, "k", &runs)
        .await
        .expect("ran");
    let prod = engine(&store, &clock, Some(sealing(raw("k1", 1))));
    let before = stored(&store, &prod, "k");
    let answer = attempt_by(&prod, Path::Execute, "k", &runs).await;
    assert_eq!(answer, Err(ErrorKind::UnauthenticRecord));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(stored(&store, &prod, "k"), before);
}

#[tokio::test]
async fn a_malformed_envelope_is_refused_not_a_panic() {
    let (store, clock) = setup();
    let record = completed(&store, &clock, Path::Execute, "k").await;
    let sealed = response(&record).to_vec();
    let engine = engine(&store, &clock, Some(sealing(raw("k1", 1))));
    let runs = AtomicUsize::new(0);
    let mut changes: Vec<Vec<u8>> = (4..sealed.len())
        .map(|len| sealed[..len].to_vec())
        .collect();
    let mut version = sealed.clone();
    version[4] = 9;
    changes.push(version);
    let mut flags = sealed.clone();
    flags[5] = 0x40;
    changes.push(flags);
    let mut key_id = sealed.clone();
    key_id[7] = b'X';
    changes.push(key_id);
    let mut wrapped = sealed.clone();
    wrapped[9] = 1;
    changes.push(wrapped);
    for changed in changes {
        store.insert_record(Record {
            response: Some(changed.clone()),
            ..record.clone()
        });
        let answer = attempt_by(&engine, Path::Execute, "k", &runs).await;
        assert_eq!(answer, Err(ErrorKind::UnauthenticRecord), "{changed:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn another_payload_is_a_mismatch_before_anything_is_opened() {
    let (store, clock) = setup();
    let mut record = completed(&store, &clock, Path::Execute, "k").await;
    record.response.as_mut().unwrap()[20] ^= 1;
    store.insert_record(record);
    let engine = engine(&store, &clock, Some(sealing(raw("k1", 1))));
    let answer = engine
        .execute(
            &Attempt::new("s", "k", Fingerprint::of_bytes(b"other")),
            || async { Ok::<_, ()>(charge(0)) },
        )
        .await;
    assert!(matches!(answer, Err(Error::KeyReused)), "{answer:?}");
}

#[tokio::test]
async fn rotation_keeps_older_records_until_their_key_is_removed() {
    for path in PATHS {
        let (store, clock) = setup();
        let key = format!("{path:?}");
        let runs = AtomicUsize::new(0);
        let old = engine(&store, &clock, Some(sealing(raw("k1", 1))));
        let (value, _) = attempt_by(&old, path, &key, &runs).await.expect("ran");
        // A new primary, the old key kept to open.
        let rotated = engine(
            &store,
            &clock,
            Some(sealing(
                RawKeys::new("k2", &[2; 32])
                    .unwrap()
                    .with_key("k1", &[1; 32])
                    .unwrap(),
            )),
        );
        let (again, replay) = attempt_by(&rotated, path, &key, &runs)
            .await
            .expect("replayed");
        assert!(replay && again == value, "{path:?}");
        let fresh = format!("{path:?}-new");
        attempt_by(&rotated, path, &fresh, &runs)
            .await
            .expect("ran");
        assert_eq!(
            key_id_of(response(&stored(&store, &rotated, &fresh))),
            Some("k2")
        );
        // The old key removed: its record fails to open.
        let removed = engine(&store, &clock, Some(sealing(raw("k2", 2))));
        let before = stored(&store, &removed, &key);
        let answer = attempt_by(&removed, path, &key, &runs).await;
        assert_eq!(answer, Err(ErrorKind::UnauthenticRecord), "{path:?}");
        assert_eq!(stored(&store, &removed, &key), before, "{path:?}");
        let (newer, replay) = attempt_by(&removed, path, &fresh, &runs)
            .await
            .expect("k2's");
        assert!(replay && newer.card == CARD, "{path:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{path:?}");
    }
}

#[tokio::test]
async fn a_key_of_the_same_id_but_other_bytes_does_not_open() {
    let (store, clock) = setup();
    completed(&store, &clock, Path::Execute, "k").await;
    let wrong = engine(&store, &clock, Some(sealing(raw("k1", 9))));
    let runs = AtomicUsize::new(0);
    let answer = attempt_by(&wrong, Path::Execute, "k", &runs).await;
    assert_eq!(answer, Err(ErrorKind::UnauthenticRecord));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn plaintext_then_sealed_then_open_only_then_plaintext() {
    let (store, clock) = setup();
    let runs = AtomicUsize::new(0);
    macro_rules! attempt {
        ($engine:expr, $key:expr) => {
            attempt_by(&$engine, Path::Execute, $key, &runs).await
        };
    }
    // Plaintext: no encryption.
    let plain = engine(&store, &clock, None);
    attempt!(plain, "a").expect("ran");
    assert!(contains(response(&stored(&store, &plain, "a")), CARD));
    // Turned on: the plaintext record replays, new ones are sealed.
    let on = engine(&store, &clock, Some(sealing(raw("k1", 1))));
    assert!(attempt!(on, "a").expect("a").1);
    attempt!(on, "b").expect("ran");
    assert_eq!(key_id_of(response(&stored(&store, &on, "b"))), Some("k1"));
    // Open only: both replay, new ones are plaintext.
    let open_only = engine(&store, &clock, Some(sealing(raw("k1", 1)).open_only()));
    assert!(attempt!(open_only, "a").expect("a").1);
    assert!(attempt!(open_only, "b").expect("b").1);
    attempt!(open_only, "c").expect("ran");
    assert!(contains(response(&stored(&store, &open_only, "c")), CARD));
    // Off: the plaintext ones replay; a sealed one is a corrupt record to
    // an engine without keys: never served, never run again.
    let off = engine(&store, &clock, None);
    assert!(attempt!(off, "a").expect("a").1);
    assert!(attempt!(off, "c").expect("c").1);
    assert_eq!(attempt!(off, "b"), Err(ErrorKind::CorruptRecord));
    // Refusing plaintext: the sealed one replays, the plaintext ones are
    // refused.
    let strict = engine(
        &store,
        &clock,
        Some(sealing(raw("k1", 1)).refuse_plaintext()),
    );
    assert!(attempt!(strict, "b").expect("b").1);
    assert_eq!(attempt!(strict, "a"), Err(ErrorKind::UnauthenticRecord));
    assert_eq!(attempt!(strict, "c"), Err(ErrorKind::UnauthenticRecord));
    assert_eq!(runs.load(Ordering::SeqCst), 3, "a, b and c ran once each");
}

#[test]
fn open_only_and_refuse_plaintext_do_not_build() {
    let error = Engine::builder(MemoryStore::new())
        .encryption(sealing(raw("k1", 1)).open_only().refuse_plaintext())
        .try_build()
        .unwrap_err();
    assert!(error.to_string().contains("refuse_plaintext"), "{error}");
}

#[tokio::test]
async fn the_read_before_the_claim_opens_and_refuses_too() {
    let (store, clock) = setup();
    let record = completed(&store, &clock, Path::Execute, "k").await;
    let reading = Engine::builder(store.clone())
        .clock(clock.clone())
        .read_before_claim(true)
        .encryption(sealing(raw("k1", 1)))
        .build();
    let runs = AtomicUsize::new(0);
    for path in [Path::Execute, Path::SingleWrite] {
        assert!(
            attempt_by(&reading, path, "k", &runs)
                .await
                .expect("replay")
                .1
        );
    }
    let mut tampered = record.clone();
    tampered.response.as_mut().unwrap()[30] ^= 4;
    store.insert_record(tampered.clone());
    for path in [Path::Execute, Path::SingleWrite] {
        let answer = attempt_by(&reading, path, "k", &runs).await;
        assert_eq!(answer, Err(ErrorKind::UnauthenticRecord), "{path:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(store.record(&record.id), Some(tampered));
}

#[tokio::test]
async fn the_process_keeps_plaintext_and_the_store_the_sealed_bytes() {
    let (store, clock) = setup();
    let cached = Engine::builder(store.clone())
        .clock(clock.clone())
        .cache(8)
        .encryption(sealing(raw("k1", 1)))
        .build();
    let runs = AtomicUsize::new(0);
    attempt_by(&cached, Path::Execute, "k", &runs)
        .await
        .expect("ran");
    // The local cache replays without reading the store (a tampered record
    // is not seen by it: the process's memory is outside the threat model).
    let (value, replay) = attempt_by(&cached, Path::Execute, "k", &runs)
        .await
        .expect("cached");
    assert!(replay && value.card == CARD);
    assert!(!contains(response(&stored(&store, &cached, "k")), CARD));
}

/// A key provider that cannot be reached (a KMS outage).
#[derive(Debug)]
struct Unreachable;

impl KeyProvider for Unreachable {
    fn sealing_key(&self) -> KeyLookup<'_> {
        KeyLookup::Pending(Box::pin(async {
            Err(KeyError::new(
                KeyErrorKind::Unavailable,
                "KMS is unreachable",
            ))
        }))
    }

    fn opening_key<'a>(&'a self, _: &'a str, _: &'a [u8]) -> KeyLookup<'a> {
        self.sealing_key()
    }
}

#[tokio::test]
async fn an_unreachable_key_provider_never_runs_a_completed_key() {
    let (store, clock) = setup();
    let record = completed(&store, &clock, Path::Execute, "k").await;
    let engine = Engine::builder(store.clone())
        .clock(clock.clone())
        .fail_open(true)
        .encryption(Encryption::new(Unreachable, CONTEXT))
        .build();
    let runs = AtomicUsize::new(0);
    let answer = attempt_by(&engine, Path::Execute, "k", &runs).await;
    assert_eq!(
        answer,
        Err(ErrorKind::StoreUnavailable),
        "an outage, retried"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "not failed open");
    assert_eq!(store.record(&record.id), Some(record));
    // A completion that cannot be sealed is not stored: the value is
    // returned, and the claim stays until its lease passes.
    let fresh = engine
        .execute(&Attempt::new("s", "new", fingerprint()), || async {
            Ok::<_, ()>(charge(1))
        })
        .await
        .expect("the value");
    assert_eq!(fresh.kind(), OutcomeKind::NotRecorded);
    let claim = store.record(&engine.record_id("s", "new"));
    assert!(
        claim.is_some_and(|claim| claim.status == Status::InProgress && claim.response.is_none())
    );
}

#[tokio::test]
async fn a_transactional_completion_that_cannot_be_sealed_commits_nothing() {
    let (store, clock) = setup();
    let engine = Engine::builder(store.clone())
        .clock(clock.clone())
        .encryption(Encryption::new(Unreachable, CONTEXT))
        .build();
    let runs = AtomicUsize::new(0);
    for path in [Path::Transactional, Path::InTransaction, Path::SingleWrite] {
        let key = format!("{path:?}");
        let answer = attempt_by(&engine, path, &key, &runs).await;
        assert_eq!(answer, Err(ErrorKind::StoreUnavailable), "{path:?}");
        assert!(
            store.record(&engine.record_id("s", &key)).is_none(),
            "{path:?}: key free"
        );
    }
    assert!(store.item("item/Transactional").is_none());
    assert!(store.item("single/SingleWrite").is_none());
}

/// A single write that stays contended reads the record, and a completed
/// one answers: opened too, and refused when it fails to open.
#[tokio::test(start_paused = true)]
async fn the_single_write_s_read_after_contention_opens_and_refuses() {
    let (store, clock) = setup();
    let record = completed(&store, &clock, Path::SingleWrite, "k").await;
    let engine = engine(&store, &clock, Some(sealing(raw("k1", 1))));
    let runs = AtomicUsize::new(0);
    store.fail_next_with(CONFLICT_TRIES as usize, crate::StoreErrorKind::Conflict);
    let (value, replay) = attempt_by(&engine, Path::SingleWrite, "k", &runs)
        .await
        .expect("replayed from the read");
    assert!(replay && value.card == CARD);
    let mut tampered = record.clone();
    tampered.response.as_mut().unwrap()[25] ^= 2;
    store.insert_record(tampered.clone());
    store.fail_next_with(CONFLICT_TRIES as usize, crate::StoreErrorKind::Conflict);
    let answer = attempt_by(&engine, Path::SingleWrite, "k", &runs).await;
    assert_eq!(answer, Err(ErrorKind::UnauthenticRecord));
    assert_eq!(store.record(&record.id), Some(tampered));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A record whose key cannot be had here is refused as one that fails to
/// open, but its error says that nothing shows the record was changed (an
/// operator restores the key rather than forgetting a good record); one
/// that fails authentication under its own key does not say so.
#[tokio::test]
async fn a_missing_key_is_told_apart_from_a_changed_record() {
    let (store, clock) = setup();
    let sealed = engine(&store, &clock, Some(sealing(raw("k1", 1))));
    let attempt = Attempt::new("s", "missing-key", fingerprint());
    sealed
        .execute(&attempt, || async { Ok::<_, ()>(charge(1)) })
        .await
        .expect("ran");
    let attempt = &attempt;
    let error_of = |engine: Engine<MemoryStore>| async move {
        match engine
            .execute(attempt, || async { Ok::<_, ()>(charge(2)) })
            .await
        {
            Err(Error::Store(error)) => error,
            other => panic!("expected a store error, got {other:?}"),
        }
    };
    let missing = error_of(engine(&store, &clock, Some(sealing(raw("k2", 2))))).await;
    assert_eq!(missing.kind(), crate::StoreErrorKind::Unauthentic);
    assert!(
        missing
            .to_string()
            .contains("says nothing of the record itself"),
        "{missing}"
    );
    let mut record = stored(&store, &sealed, "missing-key");
    let last = record.response.as_ref().unwrap().len() - 1;
    record.response.as_mut().unwrap()[last] ^= 1;
    store.insert_record(record);
    let changed = error_of(engine(&store, &clock, Some(sealing(raw("k1", 1))))).await;
    assert_eq!(changed.kind(), crate::StoreErrorKind::Unauthentic);
    assert!(
        !changed
            .to_string()
            .contains("says nothing of the record itself"),
        "{changed}"
    );
}

/// A completion that loses a race (a conflict at SERIALIZABLE) is tried
/// again with its response sealed again, not kept as a copy: the record it
/// stores is sealed, and another process opens it.
#[tokio::test(start_paused = true)]
async fn a_conflicted_completion_is_sealed_again() {
    let (store, clock) = setup();
    let sealer = engine(&store, &clock, Some(sealing(raw("k1", 1))));
    let attempt = Attempt::new("s", "conflicted", fingerprint());
    let outcome = sealer
        .execute(&attempt, || async {
            store.fail_next_with(2, crate::StoreErrorKind::Conflict); // the completion, twice
            Ok::<_, ()>(charge(1))
        })
        .await
        .expect("ran");
    assert_eq!(outcome.kind(), OutcomeKind::Fresh);
    let record = stored(&store, &sealer, "conflicted");
    assert_eq!(record.status, Status::Completed);
    assert_eq!(
        key_id_of(record.response.as_deref().expect("a response")),
        Some("k1"),
        "sealed"
    );
    let other = engine(&store, &clock, Some(sealing(raw("k1", 1))));
    let replay = other
        .execute(&attempt, || async { Ok::<_, ()>(charge(2)) })
        .await
        .expect("replayed");
    assert_eq!(
        (replay.kind(), replay.value().amount),
        (OutcomeKind::Replay, 1)
    );
}
